#include "report/replay_report.h"

#include <algorithm>
#include <sstream>

#include "absl/strings/str_format.h"
#include "allocator/memory_stats.h"
#include "common/text_table.h"
#include "common/units.h"

namespace headroom {
namespace {

nlohmann::json OutOfMemoryToJson(const ReplayOutOfMemory& oom) {
  return {{"location", oom.location},
          {"capacity_bytes", oom.capacity_bytes},
          {"requested_bytes", oom.requested_bytes},
          {"live_bytes", oom.live_bytes},
          {"reserved_bytes", oom.reserved_bytes},
          {"free_cached_bytes", oom.free_cached_bytes},
          {"largest_free_block_bytes", oom.largest_free_block_bytes}};
}

}  // namespace

std::string DescribeOutOfMemory(const ReplayOutOfMemory& oom) {
  std::string out = absl::StrFormat("%s: %s requested with %s live on a %s device; the allocator held %s",
                                    oom.location, FormatBytes(oom.requested_bytes), FormatBytes(oom.live_bytes),
                                    FormatBytes(oom.capacity_bytes), FormatBytes(oom.reserved_bytes));
  if (oom.free_cached_bytes > 0) {
    absl::StrAppendFormat(&out, ", %s of it free in blocks of at most %s", FormatBytes(oom.free_cached_bytes),
                          FormatBytes(oom.largest_free_block_bytes));
  }
  if (oom.live_bytes + oom.requested_bytes > oom.capacity_bytes) out += " (the live bytes alone do not fit)";
  return out;
}

nlohmann::json ReplayRunToJson(const ReplayRun& run) {
  const ReplayResult& r = run.result;
  nlohmann::json anomalies = nlohmann::json::array();
  for (const std::string& example : r.anomaly_examples) anomalies.push_back(example);
  nlohmann::json out = {{"label", run.label},
                        {"conf", run.conf},
                        {"peak_allocated_bytes", r.peak_allocated_bytes},
                        {"peak_reserved_bytes", r.peak_reserved_bytes},
                        {"peak_live_bytes", r.peak_live_bytes},
                        {"reserved_to_allocated", r.reserved_to_allocated},
                        {"reserved_to_live", r.reserved_to_live},
                        {"fragmentation_at_peak", r.fragmentation_at_peak},
                        {"alloc_retries", r.alloc_retries},
                        {"ooms", r.ooms},
                        {"allocations", r.allocations},
                        {"frees", r.frees},
                        {"trace_failures", r.trace_failures},
                        {"anomalies", r.anomalies},
                        {"anomaly_examples", anomalies},
                        {"replay_seconds", run.seconds},
                        {"memory_stats", MemoryStatsToJson(r.final_stats)}};
  if (r.first_oom.has_value()) out["first_oom"] = OutOfMemoryToJson(*r.first_oom);
  if (run.smallest_device_bytes.has_value()) {
    out["smallest_device_bytes"] =
        *run.smallest_device_bytes == 0 ? nlohmann::json(nullptr) : nlohmann::json(*run.smallest_device_bytes);
  }
  if (run.below_smallest.has_value()) out["below_smallest"] = OutOfMemoryToJson(*run.below_smallest);
  if (run.result.final_stats.num_planned_allocs > 0 || !run.result.plan_departure.empty()) {
    out["plan_departure"] = run.result.plan_departure.empty() ? nlohmann::json(nullptr)
                                                              : nlohmann::json(run.result.plan_departure);
  }
  return out;
}

nlohmann::json ReplayReportToJson(const AllocationTrace& trace, uint64_t capacity_bytes,
                                  const std::vector<ReplayRun>& runs, const ReplayReportOptions& options) {
  nlohmann::json all = nlohmann::json::array();
  for (const ReplayRun& run : runs) all.push_back(ReplayRunToJson(run));
  nlohmann::json out = {{"schema_version", 1},
                        {"trace", trace.source},
                        {"format", trace.format},
                        {"events", trace.events.size()},
                        {"capacity_bytes", capacity_bytes},
                        {"runs", all}};
  if (options.planned.has_value()) {
    const absl::StatusOr<TraceLayout>& planned = *options.planned;
    out["planned_layout"] =
        planned.ok() ? nlohmann::json{{"page_bytes", planned->page_bytes},
                                      {"peak_page_bytes", planned->peak_page_bytes},
                                      {"arena_bytes", planned->arena.arena_bytes},
                                      {"live_peak_bytes", planned->arena.lower_bound_bytes}}
                     : nlohmann::json{{"error", std::string(planned.status().message())}};
  }
  if (const auto& written = options.written_plan; written.has_value()) {
    out["layout_plan"] = {{"path", written->path},
                          {"repeating_step", written->steps.repeating_step},
                          {"blocks", written->plan.blocks.size()},
                          {"repeat_from", written->plan.repeat_from},
                          {"peak_page_bytes", written->steps.layout.peak_page_bytes},
                          {"extent_bytes", written->plan.extent_bytes()}};
  }
  return out;
}

std::string RenderReplayReport(const AllocationTrace& trace, uint64_t capacity_bytes,
                               const std::vector<ReplayRun>& runs, const ReplayReportOptions& options) {
  std::ostringstream out;
  const ReplayResult& first = runs.front().result;
  size_t allocations = 0, frees = 0;
  for (const TraceEvent& event : trace.events) {
    allocations += event.op == TraceOp::kAllocate ? 1 : 0;
    frees += event.op == TraceOp::kFree ? 1 : 0;
  }
  out << absl::StrFormat("trace %s (%s): %d events, %d allocations, %d frees, peak live %s; device %s\n",
                         trace.source, trace.format, trace.events.size(), allocations, frees,
                         FormatBytes(first.peak_live_bytes), FormatBytes(capacity_bytes));
  std::vector<std::string> headers = {"configuration", "peak allocated", "peak reserved", "reserved/allocated",
                                      "reserved/live", "fragmentation", "retries", "OOMs"};
  const bool smallest = runs.front().smallest_device_bytes.has_value();
  if (smallest) headers.push_back("smallest device");
  std::vector<Align> aligns(headers.size(), Align::kRight);
  aligns.front() = Align::kLeft;
  TextTable table(headers, aligns);
  for (const ReplayRun& run : runs) {
    const ReplayResult& r = run.result;
    std::vector<std::string> row = {
        run.label, FormatBytes(r.peak_allocated_bytes), FormatBytes(r.peak_reserved_bytes),
        absl::StrFormat("%.3f", r.reserved_to_allocated), absl::StrFormat("%.3f", r.reserved_to_live),
        absl::StrFormat("%.3f", r.fragmentation_at_peak), absl::StrFormat("%d", r.alloc_retries),
        absl::StrFormat("%d", r.ooms)};
    if (smallest) {
      const uint64_t bytes = run.smallest_device_bytes.value_or(0);
      row.push_back(bytes == 0 ? "over " + FormatBytes(capacity_bytes) : FormatBytes(bytes));
    }
    table.AddRow(row);
  }
  out << table.Render();
  out << "fragmentation: 1 - largest free block / free cached bytes, when reserved memory peaked.\n";
  if (smallest) {
    out << "smallest device: the least device memory (in 2 MiB steps) that runs the whole trace with no out-of-memory "
           "error.\n";
  }
  if (options.planned.has_value()) {
    const absl::StatusOr<TraceLayout>& planned = *options.planned;
    if (planned.ok()) {
      const double live = static_cast<double>(std::max<uint64_t>(first.peak_live_bytes, 1));
      out << absl::StrFormat(
          "planned layout (every block's lifetime known in advance, greedy by size): %s of %s pages at most (%.3fx "
          "live), %s as one buffer. No policy knows lifetimes in advance; no layout needs less than the live peak.\n",
          FormatBytes(planned->peak_page_bytes), FormatBytes(planned->page_bytes),
          static_cast<double>(planned->peak_page_bytes) / live, FormatBytes(planned->arena.arena_bytes));
    } else {
      out << "planned layout: not made: " << planned.status().message() << "\n";
    }
  }
  if (const auto& written = options.written_plan; written.has_value()) {
    const double live = static_cast<double>(std::max<uint64_t>(first.peak_live_bytes, 1));
    const TraceLayout& layout = written->steps.layout;
    out << absl::StrFormat(
        "layout plan written to %s: the steps up to step %d, which every later recorded step repeats (%d blocks, "
        "repeating from block %d): %s of %s pages at most (%.3fx live), a range of %s. Follow it with "
        "--conf headroom,layout_plan:%s (or the same HEADROOM_ALLOC_CONF).\n",
        written->path, written->steps.repeating_step, written->plan.blocks.size(), written->plan.repeat_from,
        FormatBytes(layout.peak_page_bytes), FormatBytes(layout.page_bytes),
        static_cast<double>(layout.peak_page_bytes) / live, FormatBytes(written->plan.extent_bytes()),
        written->path);
  }
  for (const ReplayRun& run : runs) {
    const ReplayResult& r = run.result;
    if (r.final_stats.num_planned_allocs > 0 || !r.plan_departure.empty()) {
      out << absl::StrFormat("%s: %d of %d allocations where its layout plan put them%s\n", run.label,
                             r.final_stats.num_planned_allocs, r.allocations,
                             r.plan_departure.empty() ? "" : "; it left the plan: " + r.plan_departure);
    }
    if (run.result.first_oom.has_value()) {
      out << run.label << ", first out of memory: " << DescribeOutOfMemory(*run.result.first_oom) << "\n";
    }
    if (run.below_smallest.has_value()) {
      out << run.label << ", 2 MiB less than its smallest device: " << DescribeOutOfMemory(*run.below_smallest)
          << "\n";
    }
  }
  if (first.trace_failures > 0) {
    out << absl::StrFormat("the trace itself records %d failed allocations (not replayed)\n", first.trace_failures);
  }
  if (options.summary) {
    for (const ReplayRun& run : runs) {
      out << "\n" << run.label << " at the end of the trace:\n" << MemorySummary(run.result.final_stats);
    }
  }
  if (first.anomalies > 0) {
    out << absl::StrFormat("%d trace anomalies skipped (use --strict to fail on them), e.g.:\n", first.anomalies);
    for (const std::string& example : first.anomaly_examples) out << "  " << example << "\n";
  }
  return out.str();
}

}  // namespace headroom

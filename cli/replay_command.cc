// `headroom replay TRACE --capacity 80GiB [--conf CONF] [--compare CONF]...
//  [--strict] [--json] [--device N]`: replays an RMM log or a PyTorch memory
// snapshot through the caching allocator on a simulated device and reports
// what each allocator configuration would reserve.
#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "allocator/alloc_conf.h"
#include "replay/allocation_trace.h"
#include "replay/trace_replay.h"
#include "cli/command.h"
#include "common/json_fields.h"
#include "common/status_macros.h"
#include "common/text_table.h"
#include "common/units.h"

namespace headroom::cli {
namespace {

struct ReplayCommandOptions {
  std::string trace_path;
  std::string capacity = "80GiB";
  std::string conf;
  bool conf_given = false;
  std::vector<std::string> compare;
  bool strict = false;
  bool json = false;
  bool summary = false;
  int device = -1;
};

struct Run {
  std::string label;  // preset name or conf string as given
  std::string conf;   // canonical
  ReplayResult result;
  double seconds = 0;
};

std::string Label(const std::string& text) { return text.empty() ? "pytorch-default" : text; }

nlohmann::json RunToJson(const Run& run) {
  const ReplayResult& r = run.result;
  nlohmann::json anomalies = nlohmann::json::array();
  for (const std::string& example : r.anomaly_examples) anomalies.push_back(example);
  return {{"label", run.label},
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
}

absl::Status RunReplay(const ReplayCommandOptions& options, std::ostream& out) {
  HEADROOM_ASSIGN_OR_RETURN(uint64_t capacity, ParseBytes(options.capacity));
  if (capacity == 0) return absl::InvalidArgumentError("--capacity must be more than 0 bytes");
  HEADROOM_ASSIGN_OR_RETURN(std::string text, ReadTextFile(options.trace_path));
  AllocationTrace trace;
  if (options.device >= 0) {
    const size_t first = text.find_first_not_of(" \t\r\n");
    if (first == std::string::npos || text[first] != '{') {
      return absl::InvalidArgumentError("--device applies to PyTorch snapshots only");
    }
    HEADROOM_ASSIGN_OR_RETURN(trace, ParsePyTorchSnapshot(text, options.trace_path, options.device));
  } else {
    HEADROOM_ASSIGN_OR_RETURN(trace, ParseAllocationTrace(text, options.trace_path));
  }

  std::vector<std::string> labels;
  if (options.conf_given || options.compare.empty()) labels.push_back(options.conf);
  labels.insert(labels.end(), options.compare.begin(), options.compare.end());

  std::vector<Run> runs;
  for (const std::string& label : labels) {
    const std::string conf = ResolveAllocConfPreset(label);
    absl::StatusOr<AllocatorOptions> allocator = ParseAllocConf(conf);
    if (!allocator.ok()) {
      return absl::InvalidArgumentError(absl::StrFormat("configuration '%s': %s (presets: %s)", label,
                                                        std::string(allocator.status().message()),
                                                        absl::StrJoin(AllocConfPresets(), ", ",
                                                                      [](std::string* o, const AllocConfPreset& p) {
                                                                        o->append(p.name);
                                                                      })));
    }
    const auto start = std::chrono::steady_clock::now();
    HEADROOM_ASSIGN_OR_RETURN(ReplayResult result,
                              ReplayTrace(trace, {.capacity_bytes = capacity,
                                                  .allocator = *allocator,
                                                  .strict = options.strict}));
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    runs.push_back({Label(label), FormatAllocConf(*allocator), std::move(result), seconds});
  }

  if (options.json) {
    nlohmann::json all = nlohmann::json::array();
    for (const Run& run : runs) all.push_back(RunToJson(run));
    out << nlohmann::json{{"schema_version", 1},
                          {"trace", trace.source},
                          {"format", trace.format},
                          {"events", trace.events.size()},
                          {"capacity_bytes", capacity},
                          {"runs", all}}
               .dump(2)
        << "\n";
    return absl::OkStatus();
  }
  // The header describes the trace; what each run managed to replay is in
  // its row (an allocation that ran out of memory counts as an OOM there).
  const ReplayResult& first = runs.front().result;
  size_t allocations = 0, frees = 0;
  for (const TraceEvent& event : trace.events) {
    allocations += event.op == TraceOp::kAllocate ? 1 : 0;
    frees += event.op == TraceOp::kFree ? 1 : 0;
  }
  out << absl::StrFormat("trace %s (%s): %d events, %d allocations, %d frees, peak live %s; device %s\n",
                         trace.source, trace.format, trace.events.size(), allocations, frees,
                         FormatBytes(first.peak_live_bytes), FormatBytes(capacity));
  TextTable table({"configuration", "peak allocated", "peak reserved", "reserved/allocated", "reserved/live",
                   "fragmentation", "retries", "OOMs"},
                  {Align::kLeft, Align::kRight, Align::kRight, Align::kRight, Align::kRight, Align::kRight,
                   Align::kRight, Align::kRight});
  for (const Run& run : runs) {
    const ReplayResult& r = run.result;
    table.AddRow({run.label, FormatBytes(r.peak_allocated_bytes), FormatBytes(r.peak_reserved_bytes),
                  absl::StrFormat("%.3f", r.reserved_to_allocated), absl::StrFormat("%.3f", r.reserved_to_live),
                  absl::StrFormat("%.3f", r.fragmentation_at_peak), absl::StrFormat("%d", r.alloc_retries),
                  absl::StrFormat("%d", r.ooms)});
  }
  out << table.Render();
  out << "fragmentation: 1 - largest free block / free cached bytes, when reserved memory peaked.\n";
  if (first.trace_failures > 0) {
    out << absl::StrFormat("the trace itself records %d failed allocations (not replayed)\n", first.trace_failures);
  }
  if (options.summary) {
    for (const Run& run : runs) {
      out << "\n" << run.label << " at the end of the trace:\n" << MemorySummary(run.result.final_stats);
    }
  }
  if (first.anomalies > 0) {
    out << absl::StrFormat("%d trace anomalies skipped (use --strict to fail on them), e.g.:\n", first.anomalies);
    for (const std::string& example : first.anomaly_examples) out << "  " << example << "\n";
  }
  return absl::OkStatus();
}

}  // namespace

Subcommand AddReplayCommand(CLI::App& root) {
  auto options = std::make_shared<ReplayCommandOptions>();
  CLI::App* app = root.add_subcommand(
      "replay", "Replay an allocation trace (RMM CSV log or PyTorch memory snapshot) through the caching allocator");
  app->add_option("trace", options->trace_path, "RMM logging_resource_adaptor CSV or PyTorch _snapshot() JSON")
      ->required();
  app->add_option("--capacity", options->capacity, "Simulated device memory, e.g. 80GiB (default 80GiB)");
  app->add_option("--conf", options->conf, "HEADROOM_ALLOC_CONF string or preset name for the first run")
      ->each([options](const std::string&) { options->conf_given = true; });
  app->add_option("--compare", options->compare,
                  "Another configuration to compare (repeatable): a conf string or a preset: pytorch-default, "
                  "expandable, max-split-512, power2-4, gc-0.8");
  app->add_flag("--strict", options->strict, "Fail on frees of unknown pointers and other trace anomalies");
  app->add_flag("--json", options->json, "Print exact figures as JSON");
  app->add_flag("--summary", options->summary, "Also print each run's memory_summary()-style statistics table");
  app->add_option("--device", options->device, "Which device's trace to take from a PyTorch snapshot");
  return {app, [options](std::ostream& out) { return RunReplay(*options, out); }};
}

}  // namespace headroom::cli

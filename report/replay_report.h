// What `headroom replay` prints: for one allocation trace replayed under one
// or more allocator configurations (replay/trace_replay.h), a table with one
// row per configuration (peak allocated and reserved bytes, their ratios,
// fragmentation when reserved memory peaked, retries, OOMs), or the same as
// JSON with exact byte counts; with --smallest, the device a layout planned
// with the whole trace known would need, beside each run's.
//
//   std::vector<ReplayRun> runs = {{.label = "expandable", .conf = "expandable_segments:True",
//                                   .result = *ReplayTrace(trace, options)}};
//   std::cout << RenderReplayReport(trace, capacity, runs, {.summary = true});
//   std::cout << ReplayReportToJson(trace, capacity, runs).dump(2) << "\n";
//
// The header line describes the trace itself (its events, allocations,
// frees and live peak), so it does not depend on the device; what each run
// managed to replay is in its own row. The first run's anomalies (frees of
// pointers the trace never allocated, ...) are listed once at the end:
// every run sees the same trace, so they are the same for all runs.
#ifndef HEADROOM_REPORT_REPLAY_REPORT_H_
#define HEADROOM_REPORT_REPLAY_REPORT_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "layout/trace_layout.h"
#include "nlohmann/json.hpp"
#include "replay/allocation_trace.h"
#include "replay/trace_replay.h"

namespace headroom {

// One replay of the trace under one allocator configuration.
struct ReplayRun {
  std::string label;  // preset name or conf string as the user gave it
  std::string conf;   // canonical HEADROOM_ALLOC_CONF string
  ReplayResult result;
  double seconds = 0;  // wall time of the replay
  // With `headroom replay --smallest`: the smallest device, in 2 MiB steps,
  // that runs the trace without running out of memory (SmallestDevice); 0 if
  // not even the device replayed on does.
  std::optional<uint64_t> smallest_device_bytes;
  // And why one step (2 MiB) less does not: the first allocation that fails there.
  std::optional<ReplayOutOfMemory> below_smallest;
};

struct ReplayReportOptions {
  // Adds each run's memory_summary()-style statistics table.
  bool summary = false;
  // With `headroom replay --smallest`: the trace laid out with every block's
  // lifetime known in advance (layout/trace_layout.h), the yardstick for the
  // runs' smallest devices, or why it could not be (too many allocations).
  std::optional<absl::StatusOr<TraceLayout>> planned;
  // With `headroom replay --write-plan`: the layout plan of the trace's steps
  // up to the one every later step repeats, and the file it went to.
  struct WrittenPlan {
    std::string path;
    RepeatingStepsLayout steps;
    LayoutPlan plan;
  };
  std::optional<WrittenPlan> written_plan;
};

// "trace.csv:12: 2.25 MiB requested with 309.60 MiB live on a 318.00 MiB device; the allocator held 316.00 MiB,
// 6.29 MiB of it free in blocks of at most 1.50 MiB".
std::string DescribeOutOfMemory(const ReplayOutOfMemory& oom);
// {"label", "conf", "peak_allocated_bytes", ..., "memory_stats"}, and "first_oom" and "below_smallest" when set.
nlohmann::json ReplayRunToJson(const ReplayRun& run);
// {"schema_version": 1, "trace", "format", "events", "capacity_bytes", "runs"}, and "planned_layout" when
// options.planned is set: {"page_bytes", "peak_page_bytes", "arena_bytes", "live_peak_bytes"} or {"error"};
// "layout_plan" when options.written_plan is: {"path", "repeating_step", "blocks", "repeat_from",
// "peak_page_bytes", "extent_bytes"}. A run that followed a plan has "plan_departure" (null if none).
nlohmann::json ReplayReportToJson(const AllocationTrace& trace, uint64_t capacity_bytes,
                                  const std::vector<ReplayRun>& runs, const ReplayReportOptions& options = {});
// The text report; `runs` must not be empty.
std::string RenderReplayReport(const AllocationTrace& trace, uint64_t capacity_bytes,
                               const std::vector<ReplayRun>& runs, const ReplayReportOptions& options);

}  // namespace headroom

#endif  // HEADROOM_REPORT_REPLAY_REPORT_H_

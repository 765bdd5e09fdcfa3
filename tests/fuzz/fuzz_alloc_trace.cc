// Any bytes given to the trace parsers (RMM CSV, PyTorch snapshot, a recorded
// run's steps.json) yield a value or an error, never a crash; a parsed trace
// replays without crashing (anomalies are counted, never fatal without
// --strict), and is laid out with every lifetime known, whole or up to a
// repeating step, or refused by name.
#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

#include "layout/trace_layout.h"
#include "replay/allocation_trace.h"
#include "replay/recorded_run.h"
#include "replay/trace_replay.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view text(reinterpret_cast<const char*>(data), size);
  (void)headroom::ParseRmmLog(text, "fuzz.csv");
  (void)headroom::ParsePyTorchSnapshot(text, "fuzz.json");
  (void)headroom::ParseStepEnds(text, "fuzz.steps.json");
  absl::StatusOr<headroom::AllocationTrace> trace = headroom::ParseAllocationTrace(text, "fuzz");
  if (!trace.ok() || trace->events.size() > 2000) return 0;
  // Small device so that huge recorded sizes exercise the OOM path quickly.
  absl::StatusOr<headroom::ReplayResult> result =
      headroom::ReplayTrace(*trace, {.capacity_bytes = uint64_t{1} << 30});
  if (!result.ok() && result.status().code() != absl::StatusCode::kDataLoss) {
    // Only --strict produces DataLoss; anything else is a replay bug.
    if (result.status().code() != absl::StatusCode::kResourceExhausted) __builtin_trap();
  }
  absl::StatusOr<headroom::TraceLayout> layout = headroom::LayoutTrace(*trace);
  if (!layout.ok() && !absl::IsOutOfRange(layout.status())) __builtin_trap();
  // Steps of four events each, at the trace's own times (unsorted in a fuzzed trace: refused by name).
  std::vector<uint64_t> step_ends;
  for (size_t i = 3; i < trace->events.size(); i += 4) step_ends.push_back(trace->events[i].time_ns);
  absl::StatusOr<headroom::RepeatingStepsLayout> steps = headroom::LayoutRepeatingSteps(*trace, step_ends);
  if (!steps.ok() && !absl::IsOutOfRange(steps.status()) && !absl::IsNotFound(steps.status()) &&
      !absl::IsFailedPrecondition(steps.status()) && !absl::IsInvalidArgument(steps.status())) {
    __builtin_trap();
  }
  return 0;
}

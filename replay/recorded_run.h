// A training run that validation/record-trace recorded: its allocation trace
// (NAME.rmm.csv from a CPU run, NAME.snapshot.json from a CUDA one) and
// NAME.steps.json beside it, which says where each step ends.
//
//   HEADROOM_ASSIGN_OR_RETURN(RecordedRun run, LoadRecordedRun("bench/traces/gpt2-fp32-adamw.6steps.rmm.csv"));
//   ReplayTrace(run.trace, {.step_end_times = run.step_end_times, ...});
//
// Note [Step ends]
// Each step's end is given in the trace's own time. An RMM CSV line's time
// is its event number, so the CPU recorder writes the event count at each
// step's end ("step_end_events"); a snapshot's entries carry time_us, so the
// CUDA recorder writes the time of each step's last entry in nanoseconds
// ("step_end_time_ns"), the unit the snapshot parser gives event times in.
#ifndef HEADROOM_REPLAY_RECORDED_RUN_H_
#define HEADROOM_REPLAY_RECORDED_RUN_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "replay/allocation_trace.h"

namespace headroom {

struct RecordedRun {
  AllocationTrace trace;
  std::vector<uint64_t> step_end_times;  // increasing, in the trace's time
};

// A steps file's bound (Note [Input bounds] in common/input_file.h).
inline constexpr InputFileKind kStepsFile{.noun = "a steps file", .max_bytes = kMaxSmallFileBytes};

// A steps.json document: an object with "step_end_events" or
// "step_end_time_ns", an array of increasing unsigned integers (a repeated
// end would be a step with nothing in it). With `trace`, an end past the
// trace's last event is refused too: the trace and the steps would not be of
// one run. Errors name `source` and the entry, e.g.
// "run.steps.json: step_end_events[2]: 9 repeats the step end before it".
absl::StatusOr<std::vector<uint64_t>> ParseStepEnds(std::string_view text, std::string_view source,
                                                    const AllocationTrace* trace = nullptr);

// `trace_path` is NAME.rmm.csv or NAME.snapshot.json; NAME.steps.json must
// be beside it.
absl::StatusOr<RecordedRun> LoadRecordedRun(const std::string& trace_path);

// The recorded runs' traces in `directory` (the files whose names end in
// .rmm.csv or .snapshot.json), sorted; NotFound when it cannot be listed.
absl::StatusOr<std::vector<std::string>> RecordedRunTraces(const std::string& directory);

// The run with its steps from `first_step` (0-based) to the last played
// `times` times over, then the rest: a longer training loop than was
// recorded, with a step end for every step played. A repeat's allocations
// are new blocks; its frees of blocks allocated before the repeated steps
// are dropped (their first pass freed them).
absl::StatusOr<RecordedRun> RepeatSteps(const RecordedRun& run, size_t first_step, int times);

}  // namespace headroom

#endif  // HEADROOM_REPLAY_RECORDED_RUN_H_

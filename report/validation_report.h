// `headroom validate`: how far the estimate is from what PyTorch measured.
// For each fixture (report/validation_fixture.h) the estimate of the same
// step is compared with the measured peak of allocated bytes; the result
// is a table (text or GitHub Markdown) or JSON with exact figures.
//
//   absl::StatusOr<FixtureCheck> check = CheckFixture(fixture, job, {.allocated = 0.03});
//   ValidationRun run{.tolerance = {.allocated = 0.03}, .checks = {*check}};
//   std::cout << ValidationText(run);        // or ValidationMarkdown(run), ValidationJson(run).dump(2)
//   run.all_within_tolerance();              // the command's exit status
//
// The job comes from the fixture's estimate_args, which only the command
// line can read (cli/job_flags.h); this library takes the parsed JobSpec.
//
// Note [Estimated allocated bytes]
// The estimate replays the step through the caching allocator
// (estimators/step_replay.h), so its peaks are PyTorch's own figures: on a
// CUDA fixture the allocated peak (tensors, the cuBLAS workspace PyTorch
// takes from the allocator, and the 512-byte rounding of every block) is
// compared with torch.cuda.max_memory_allocated(). On a "cpu" fixture the
// measurement counts tensor storage exactly as requested, with no cuBLAS
// workspace and no rounding (those are the CUDA caching allocator's), so
// the estimate's requested bytes less its cuBLAS workspace are compared.
//
// Note [The fixture's GPU]
// A CUDA fixture names the GPU it ran on (torch.cuda.get_device_name, e.g.
// "NVIDIA H100 80GB HBM3"), and the estimate runs on that catalog entry: its
// cuBLAS workspace size is part of the allocated bytes. The capacity stays
// out of reach, since validation compares bytes, not a verdict. A device the
// catalog does not know is an error that names it.
//
// Note [Estimated reserved bytes]
// A CUDA fixture may also carry torch.cuda.max_memory_reserved(); the
// estimate's counterpart is the replay's reserved peak. Both figures are
// read in one function, EstimatedFigures, the single place that knows how
// MemoryEstimate spells them.
#ifndef HEADROOM_REPORT_VALIDATION_REPORT_H_
#define HEADROOM_REPORT_VALIDATION_REPORT_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "estimators/memory_estimate.h"
#include "job/job_spec.h"
#include "nlohmann/json.hpp"
#include "report/validation_fixture.h"

namespace headroom {

// How far an estimate may be from the measurement, as a fraction of the
// measurement (0.03: 3%).
struct ValidationTolerance {
  double allocated = 0.03;
  // Reserved memory also depends on the allocation order and the caching
  // policy; the fragmentation allowance it is compared with is an empirical
  // fraction (estimators/overheads.h), so its default is wider.
  double reserved = 0.10;
};

// The estimate's side of the comparison.
struct EstimatedStep {
  uint64_t allocated_bytes = 0;  // Note [Estimated allocated bytes]
  uint64_t reserved_bytes = 0;   // Note [Estimated reserved bytes]
  std::string peak_op;
  std::string peak_phase;
};

// The only function that reads MemoryEstimate's categories.
EstimatedStep EstimatedFigures(const MemoryEstimate& estimate, bool on_cuda);

// (estimated - measured) / measured; measured must be positive.
double RelativeError(uint64_t estimated, uint64_t measured);

struct PeerCheck {
  std::string tool;
  uint64_t bytes = 0;
  double error = 0;  // RelativeError(bytes, measured peak)
};

// One fixture compared.
struct FixtureCheck {
  std::string path;
  std::string name;
  std::string description;
  std::string device;
  MeasuredStep measured;
  EstimatedStep estimated;
  double error = 0;  // of the allocated peak
  bool within_tolerance = false;
  // CUDA fixtures that measured reserved memory (Note [Estimated reserved bytes]).
  std::optional<double> reserved_error;
  bool reserved_within_tolerance = true;
  // Applied plans that offload: the host memory the plan's offloads hold at
  // most, against what the harness counted (tolerance: allocated's).
  uint64_t estimated_host_bytes = 0;
  std::optional<double> host_error;
  bool host_within_tolerance = true;
  // Applied plans run on smaller inputs (Note [Applied plans checked]):
  // every such step at or below the estimated peak, gradients bitwise equal.
  bool smaller_inputs_within_peak = true;
  std::vector<PeerCheck> peers;  // sorted by tool

  bool passed() const {
    return within_tolerance && reserved_within_tolerance && host_within_tolerance && smaller_inputs_within_peak &&
           measured.gradients_bitwise_equal.value_or(true);
  }
};

// Estimates the fixture's step as `job` describes it (the capacity plays no
// part) and compares. Errors are the estimator's, unprefixed.
absl::StatusOr<FixtureCheck> CheckFixture(const ValidationFixture& fixture, const JobSpec& job,
                                          const ValidationTolerance& tolerance);

// Note [Distributed fixtures checked]
// A fixture with ranks (a step that ran on several processes) gives one
// check per rank, "<fixture> rank R": the estimate of one GPU of the layout
// (the fixture's estimate_args) against that rank's measured peak; peers'
// figures are compared with each rank's. Under --pp (without --pp-stage)
// rank R is checked against the estimate of its own stage, R / (gpus / pp):
// ranks are numbered stage by stage, as torch.distributed.pipelining's
// examples and Megatron's rank order (pipeline outermost) number them.
// Without ranks, CheckFixture's one check.
absl::StatusOr<std::vector<FixtureCheck>> CheckFixtureRanks(const ValidationFixture& fixture, const JobSpec& job,
                                                            const ValidationTolerance& tolerance);

// Note [Applied plans checked]
// An applied-plans fixture (report/validation_fixture.h) gives one check per
// plan that ran, named "<fixture> <budget> <strategy asked>": the plan's
// schedule, as PyTorch ran it, is evaluated on the fixture's step built with
// `job` (the fixture's job_args), and its peak of planned tensors (planner/
// plan.h) is compared with the peak measured above the step's baseline; a
// plan whose gradients were not bitwise equal fails whatever its error. One
// more check, "<fixture> no plan", compares the store-all peak with the step
// measured without a plan. Estimated peak ops are named; measured ones are
// not recorded. Where the harness also ran a plan on smaller inputs within
// its shape envelope (shorter sequences, smaller batches), each of those
// steps' measured peaks must be at or below the plan's estimated peak (no
// tolerance: the printed peak is the promise for every input the plan
// accepts) and their gradients bitwise equal.
absl::StatusOr<std::vector<FixtureCheck>> CheckAppliedPlans(const AppliedPlansFixture& fixture, const JobSpec& job,
                                                            const ValidationTolerance& tolerance);

// A fixture that could not be checked: the file, and the one-line reason
// (which names the file and the field).
struct FixtureError {
  std::string path;
  std::string message;
};

struct ValidationRun {
  ValidationTolerance tolerance;
  std::vector<FixtureCheck> checks;  // in the order the fixtures were given
  std::vector<FixtureError> errors;

  bool all_within_tolerance() const;
  // The check with the largest |error| of the allocated peak; null without checks.
  const FixtureCheck* worst() const;
};

// An aligned table, one row per check, then a summary line: "19 fixtures:
// 17 within 3% of the measured peak, 2 outside; worst gpt2-fp32-inference
// (-6.2%)". Peer tools get a column each (blank where a fixture has no
// figure from that tool); reserved memory gets columns when any check has it.
std::string ValidationText(const ValidationRun& run);

// The same table as GitHub Markdown (for README.md's accuracy section),
// then the summary as a paragraph.
std::string ValidationMarkdown(const ValidationRun& run);

// {"schema_version": 1, "tolerance", "reserved_tolerance", "fixtures": [...],
//  "errors": [{"path", "message"}], "summary": {...}}, bytes exact.
nlohmann::json ValidationJson(const ValidationRun& run);

}  // namespace headroom

#endif  // HEADROOM_REPORT_VALIDATION_REPORT_H_

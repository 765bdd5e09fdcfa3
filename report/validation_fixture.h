// A validation fixture: one PyTorch training or inference step that the
// harness in validation/ ran and measured, with the `headroom estimate`
// flags that describe the same step. `headroom validate` compares the
// estimate with the measurement (report/validation_report.h).
//
//   absl::StatusOr<std::vector<std::string>> files = FixtureFiles({"validation/fixtures"});
//   absl::StatusOr<ValidationFixture> f = LoadValidationFixture((*files)[0]);
//   if (!f.ok()) ...;  // "validation/fixtures/x.json: measured.peak_allocated_bytes: required field is missing"
//   f->model;          // loaded from the fixture's "model" object
//   f->estimate_args;  // {"--micro-batch", "2", "--seq", "256", ...}: the caller parses them
//
// Format, version 1 (written by validation/headroom_validation):
//
//   {"headroom_fixture_version": 1, "name": "...", "description": "...",
//    "device": "cpu" | "<CUDA device name>",
//    "model": {a Hugging Face config.json object, or a torchvision CNN in
//              config form: {"architectures": ["resnet50"], "image_size": 64}},
//    "estimate_args": ["--micro-batch", "2", ...],
//    "measured": {"baseline_bytes", "peak_allocated_bytes", "saved_for_backward_bytes",
//                 "repeat_peak_allocated_bytes",
//                 optional (absent or null): "end_of_forward_bytes", "ops", "peak_op",
//                 "peak_phase" (the harness cannot always attribute ops: PyTorch 1.13
//                 under full checkpointing), and on CUDA "peak_reserved_bytes",
//                 "driver_used_bytes", "driver_used_before_bytes"},
//    optional "peers": {"<tool>": {"bytes": N, "what": "..."}},
//    optional "ranks": [{"baseline_bytes", "peak_allocated_bytes", optional "peak_op",
//                        "peak_phase", "saved_for_backward_bytes"}, ...]}
//
// "ranks" is a step that ran on several processes (torch.distributed,
// validation/headroom_validation/distributed.py): each rank's figures in rank
// order, rank 0's also in "measured"; the estimate_args describe one rank.
//
// "versions", "setup", "trace" and "notes" describe how the measurement was
// made; they are for people and are not read. Every error is
// InvalidArgument (NotFound for a file that is not there) and names the file
// and the field at fault.
//
// Invariants of a parsed fixture: name, description and device are not
// empty; measured.peak_allocated_bytes > 0 (errors are relative to it);
// measured.peak_phase, when present, is a phase name (graph/graph.h
// PhaseName); peers are sorted by tool name.
#ifndef HEADROOM_REPORT_VALIDATION_FIXTURE_H_
#define HEADROOM_REPORT_VALIDATION_FIXTURE_H_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "absl/status/statusor.h"
#include "models/model_source.h"
#include "planner/plan_json.h"

namespace headroom {

inline constexpr int kValidationFixtureVersion = 1;

// What the harness measured over one step, in bytes of tensor storage live
// in PyTorch's allocator: torch.cuda.memory_allocated() and its peak on a
// GPU; on "cpu" the CPU allocator's blocks, counted by the harness's
// allocation hook (validation/alloc_hook.c).
struct MeasuredStep {
  uint64_t baseline_bytes = 0;          // before the step: weights and the state earlier steps left
  uint64_t peak_allocated_bytes = 0;    // what the estimate is compared with
  uint64_t saved_for_backward_bytes = 0;
  uint64_t repeat_peak_allocated_bytes = 0;  // the same step run again
  std::optional<uint64_t> end_of_forward_bytes;
  std::optional<uint64_t> ops;          // aten ops the step ran
  std::string peak_op;                  // the aten op at the peak, e.g. "_log_softmax_backward_data"; may be empty
  std::string peak_phase;               // "forward", "backward", "optimizer"; may be empty
  // CUDA only.
  std::optional<uint64_t> peak_reserved_bytes;
  std::optional<uint64_t> driver_used_bytes;
  std::optional<uint64_t> driver_used_before_bytes;
  // Applied plans only: whether every parameter's gradient equals, bit for
  // bit, the step's without the plan; and the most host memory its
  // offloads held at once (absent where the harness did not count it).
  std::optional<bool> gradients_bitwise_equal;
  std::optional<uint64_t> host_peak_bytes;
  // Applied plans only: the same plan run on smaller inputs within its
  // shape envelope (python/headroom/envelope.py); absent in older fixtures.
  struct SmallerInputs {
    std::string inputs;  // "input_ids 4x192, labels 4x192"
    uint64_t peak_allocated_bytes = 0;
    bool gradients_bitwise_equal = false;
  };
  std::vector<SmallerInputs> smaller_inputs;
};

// What another memory estimator predicted for the same step.
struct PeerFigure {
  std::string tool;
  uint64_t bytes = 0;
  std::string what;  // what the tool's figure counts, in its own words
};

struct ValidationFixture {
  std::string path;  // the file, as given; errors and reports name it
  std::string name;
  std::string description;
  std::string device;  // "cpu" or a CUDA device name
  LoadedModel model;
  std::vector<std::string> estimate_args;
  MeasuredStep measured;
  std::vector<PeerFigure> peers;  // sorted by tool
  std::vector<MeasuredStep> ranks;  // a distributed step's ranks, in order; empty for one process

  bool on_cuda() const { return device != "cpu"; }
};

// An applied-plans fixture: plans that headroom.plan made for one model's
// step, applied op by op in PyTorch by validation/apply-plans, and measured.
// `headroom validate` evaluates each plan's schedule again on the fixture's
// step and compares it with what was measured (report/validation_report.h).
//
//   {"headroom_fixture_version": 1, "kind": "applied_plans",
//    "name", "description", "device",
//    "model": {the traced step: Headroom graph JSON},
//    "job_args": ["--precision", "fp32", "--optimizer", "sgd", ...],  (`headroom plan` setup flags)
//    "measured": {"baseline_bytes", "store_all_peak_allocated_bytes", optional "store_all_seconds"},
//    "plans": [{"budget": "70%", "strategy": "auto", "chosen_strategy": "chain-dp",
//               "plan": {a plan file, planner/plan_json.h},
//               "measured": {"peak_allocated_bytes", "gradients_bitwise_equal", optional "host_peak_bytes",
//                            optional "seconds"}},
//              {"budget": "45%", "strategy": "offload", "error": "why no plan was made"}, ...]}
//
// Peaks are the planned tensors' (inputs, activations, gradients,
// temporaries): bytes above `baseline_bytes`, the tensors live before the
// step (weights; gradients are None), plus the step's inputs. "versions",
// "predicted" and the other keys are for people and are not read.
struct AppliedPlanRun {
  std::string budget;
  std::string strategy;         // as asked: a strategy, or "auto"
  std::string chosen_strategy;  // what ran
  std::string error;            // why no plan was made; then nothing below is set
  PlanFile plan;
  MeasuredStep measured;        // peak_allocated_bytes, gradients_bitwise_equal, host_peak_bytes
};

struct AppliedPlansFixture {
  std::string path;
  std::string name;
  std::string description;
  std::string device;
  LoadedModel model;
  std::vector<std::string> job_args;
  MeasuredStep store_all;  // the step without a plan: baseline_bytes and peak_allocated_bytes
  std::vector<AppliedPlanRun> runs;
};

inline constexpr std::string_view kAppliedPlansKind = "applied_plans";

// Parses an applied-plans fixture's text; errors name `path` and the field.
absl::StatusOr<AppliedPlansFixture> ParseAppliedPlansFixture(std::string_view text, std::string_view path);

// A fixture of either kind, as its "kind" says (kAppliedPlansKind, or none
// for a measured step), its text parsed once; errors name `path` and the
// field, an unknown kind among them.
absl::StatusOr<std::variant<ValidationFixture, AppliedPlansFixture>> ParseFixture(std::string_view text,
                                                                                  std::string_view path);

// Note [Fixture file bound]
// A fixture embeds a model document, which may be as large as a model file
// (Note [Model file bound] in models/model_source.h), so a fixture file has
// the same bound; real fixtures are a few KiB.
inline constexpr uint64_t kMaxFixtureFileBytes = kMaxModelFileBytes;
inline constexpr InputFileKind kFixtureFile{.noun = "a fixture", .max_bytes = kMaxFixtureFileBytes};

// Parses a fixture's text; `path` names it in errors.
absl::StatusOr<ValidationFixture> ParseValidationFixture(std::string_view text, std::string_view path);

// Reads and parses the fixture file at `path`.
absl::StatusOr<ValidationFixture> LoadValidationFixture(const std::string& path);

// The fixture files `paths` name, in order: a file as it is, a folder as its
// *.json files (not its subfolders) sorted by name. NotFound for a path that
// does not exist, InvalidArgument for a folder without fixtures (a check of
// nothing would pass).
absl::StatusOr<std::vector<std::string>> FixtureFiles(const std::vector<std::string>& paths);

}  // namespace headroom

#endif  // HEADROOM_REPORT_VALIDATION_FIXTURE_H_

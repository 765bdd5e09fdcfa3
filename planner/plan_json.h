// The plan file: a schedule with what it was planned for, as JSON that
// `headroom plan --out` writes and `headroom plan --load` reads back.
//
//   nlohmann::json j = PlanFileToJson(file);
//   absl::StatusOr<PlanFile> back = ParsePlanFile(text, "plan.json");
//
// Note [Plan file format]
// {"format": "headroom-plan", "version": 1,
//  "model": "gpt2", "strategy": "chen-greedy", "budget_bytes": 123,
//  "step": {"name": "GPT2LMHeadModel", "ops": 1234, "tensors": 2345,
//           "fingerprint": "9f3c..."},
//  "schedule": [["compute", 0], ["recompute", 12], ["offload", 301], ...],
//  "tensors": [["h.0.attn.out", 3145728, 12, 901, 1048576], ...]}
// Schedule entries are [action, target]: an op id for compute and
// recompute, a tensor id for offload and prefetch (planner/schedule.h).
// "tensors", written by `plan --out` for people and executors and not read
// back, lists every device tensor of the scheduled step (a replay's copy is
// its own tensor, named with "@recompute"): [name, bytes, first, last,
// offset], allocated before schedule entry `first` and freed after entry
// `last`, at `offset` in the plan's static arena (layout/arena_layout.h).
// The step block identifies the step the ids refer to: --load rebuilds the
// step from the same model and flags and refuses a plan whose op count,
// tensor count or fingerprint (a hash of op kinds, names and tensor sizes,
// StepFingerprint) differ. Unknown keys are ignored; a newer version is an
// error.
#ifndef HEADROOM_PLANNER_PLAN_JSON_H_
#define HEADROOM_PLANNER_PLAN_JSON_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "common/input_file.h"
#include "graph/graph.h"
#include "nlohmann/json.hpp"
#include "planner/schedule.h"

namespace headroom {

inline constexpr int kPlanFileVersion = 1;

// A plan file's bound (Note [Input bounds] in common/input_file.h): a plan is
// smaller than the graph file of its step, which is a model file.
inline constexpr InputFileKind kPlanFile{.noun = "a plan file", .max_bytes = kMaxDocumentFileBytes};

// One device tensor of the scheduled step (Note [Plan file format]).
struct PlanTensor {
  std::string name;
  uint64_t bytes = 0;
  int64_t first = 0;  // schedule entries, inclusive
  int64_t last = 0;
  uint64_t offset = 0;  // in the static arena

  friend bool operator==(const PlanTensor&, const PlanTensor&) = default;
};

struct PlanFile {
  std::string model;
  std::string strategy;
  uint64_t budget_bytes = 0;
  std::string step_name;
  uint64_t step_ops = 0;
  uint64_t step_tensors = 0;
  std::string fingerprint;
  Schedule schedule;
  std::vector<PlanTensor> tensors;  // written when present; ParsePlanFile leaves it empty
};

// 16 hex digits identifying the step's ops and tensor sizes.
std::string StepFingerprint(const Graph& step);

nlohmann::json PlanFileToJson(const PlanFile& file);

// Errors (InvalidArgument) name `origin` and the field at fault.
absl::StatusOr<PlanFile> ParsePlanFile(std::string_view text, std::string_view origin);
// The same for a plan already parsed as JSON (one embedded in another document).
absl::StatusOr<PlanFile> ParsePlanDocument(const nlohmann::json& doc, std::string_view origin);

// Checks that `file` was planned for `step` (Note [Plan file format]).
absl::Status CheckPlanMatchesStep(const PlanFile& file, const Graph& step, std::string_view origin);

}  // namespace headroom

#endif  // HEADROOM_PLANNER_PLAN_JSON_H_

// The activation-checkpointing modes a user can ask for by name. The planner
// turns a mode into an explicit plan over the model's graph
// (planner/checkpoint_mode_plan.h); the step builder only ever sees plans.
//
//   ParseCheckpointMode("every-k")          -> CheckpointMode::kEveryK
//   CheckpointModeName(CheckpointMode::kSqrtN) -> "sqrt-n"
#ifndef HEADROOM_JOB_CHECKPOINT_MODE_H_
#define HEADROOM_JOB_CHECKPOINT_MODE_H_

#include <cstdint>
#include <string_view>

#include "absl/status/statusor.h"

namespace headroom {

enum class CheckpointMode : uint8_t {
  kOff,        // every saved tensor stays until its backward ("none";
               // not kNone, which -Wshadow confuses with graph.h's kNone)
  kFull,       // each layer is a segment
  kEveryK,     // groups of k consecutive layers (JobSpec::checkpoint_every)
  kSelective,  // the attention core of each layer (Op::attention_core)
  kSqrtN,      // groups of ceil(sqrt(layers)) layers (Chen et al. 2016)
};
std::string_view CheckpointModeName(CheckpointMode mode);  // "none", "full", "every-k", "selective", "sqrt-n"
// Accepts the names above and "every_k", "per-layer", "sqrt_n"; case is ignored.
absl::StatusOr<CheckpointMode> ParseCheckpointMode(std::string_view name);

}  // namespace headroom

#endif  // HEADROOM_JOB_CHECKPOINT_MODE_H_

#include "job/checkpoint_mode.h"

#include "common/name_table.h"

namespace headroom {
namespace {

constexpr NameTable<CheckpointMode, 11> kCheckpointModeNames("checkpoint mode", {{
    {"none", CheckpointMode::kOff},
    {"full", CheckpointMode::kFull},
    {"every-k", CheckpointMode::kEveryK},
    {"selective", CheckpointMode::kSelective},
    {"sqrt-n", CheckpointMode::kSqrtN},
    {"every_k", CheckpointMode::kEveryK, kAlias},
    {"everyk", CheckpointMode::kEveryK, kAlias},
    {"per-layer", CheckpointMode::kFull, kAlias},
    {"per_layer", CheckpointMode::kFull, kAlias},
    {"sqrt_n", CheckpointMode::kSqrtN, kAlias},
    {"sqrtn", CheckpointMode::kSqrtN, kAlias},
}});

}  // namespace

std::string_view CheckpointModeName(CheckpointMode mode) { return kCheckpointModeNames.Name(mode); }
absl::StatusOr<CheckpointMode> ParseCheckpointMode(std::string_view name) {
  return kCheckpointModeNames.Parse(name);
}

}  // namespace headroom

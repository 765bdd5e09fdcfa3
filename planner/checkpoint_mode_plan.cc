#include "planner/checkpoint_mode_plan.h"

#include <algorithm>
#include <cstdint>
#include <vector>

#include "absl/strings/str_format.h"
#include "common/status_macros.h"
#include "planner/checkpoint_sets.h"

namespace headroom {
namespace {

int NumLayers(const Graph& forward) {
  int layers = 0;
  for (const Op& op : forward.ops()) layers = std::max(layers, op.layer + 1);
  return layers;
}

// For each layer, the index of the segment that starts at or before it.
std::vector<int64_t> GroupOfLayer(int num_layers, const std::vector<int>& segment_starts) {
  std::vector<int64_t> group(static_cast<size_t>(num_layers), 0);
  for (int layer = 0; layer < num_layers; ++layer) {
    const auto after = std::upper_bound(segment_starts.begin(), segment_starts.end(), layer);
    group[static_cast<size_t>(layer)] = after - segment_starts.begin() - 1;
  }
  return group;
}

}  // namespace

absl::StatusOr<CheckpointPlan> PlanForMode(const Graph& forward, CheckpointMode mode, int every) {
  if (mode == CheckpointMode::kEveryK && every < 1) {
    return absl::InvalidArgumentError(absl::StrFormat("checkpoint_every must be at least 1, got %d", every));
  }
  CheckpointPlan plan;
  if (mode == CheckpointMode::kOff) return plan;

  const int num_layers = NumLayers(forward);
  std::vector<int64_t> group;  // kFull, kEveryK, kSqrtN: the segment key of each layer
  if (mode == CheckpointMode::kEveryK) {
    HEADROOM_ASSIGN_OR_RETURN(std::vector<int> starts, EveryKLayers(num_layers, every));
    group = GroupOfLayer(num_layers, starts);
  } else if (mode == CheckpointMode::kSqrtN) {
    group = GroupOfLayer(num_layers, SqrtCheckpoints(num_layers));
  } else if (mode == CheckpointMode::kFull) {
    HEADROOM_ASSIGN_OR_RETURN(std::vector<int> starts, EveryKLayers(num_layers, 1));
    group = GroupOfLayer(num_layers, starts);
  }
  // The key of the segment an op belongs to; kNone when not checkpointed.
  auto key = [&](const Op& op) -> int64_t {
    if (op.phase != Phase::kForward || op.layer < 0) return kNone;
    if (mode == CheckpointMode::kSelective) return op.attention_core ? op.layer : kNone;
    return group[static_cast<size_t>(op.layer)];
  };
  // A new segment opens wherever the key changes, so each is one contiguous run.
  plan.segment_of_op.assign(forward.num_ops(), kNone);
  int32_t next = 0;
  int64_t previous_key = kNone;
  for (const Op& op : forward.ops()) {
    const int64_t k = key(op);
    if (k == kNone) {
      previous_key = kNone;
      continue;
    }
    if (k != previous_key) ++next;
    plan.segment_of_op[static_cast<size_t>(op.id)] = next - 1;
    previous_key = k;
  }
  return plan;
}

}  // namespace headroom

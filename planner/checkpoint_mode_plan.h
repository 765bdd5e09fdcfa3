// The checkpoint plan of each named mode: the planner's translation from
// what a user asks for (`--checkpoint full`) to the explicit plan the step
// builder runs (graph/checkpoint_plan.h).
//
//   absl::StatusOr<CheckpointPlan> plan = PlanForMode(forward, CheckpointMode::kEveryK, /*every=*/4);
//   Graph step = *BuildTrainingStep(forward, {.checkpoint = *plan});
//
// Note [Checkpoint modes]
// Layers are the builders' repeated blocks (Op::layer >= 0); ops outside any
// layer (embeddings, final norm, LM head, loss) are never checkpointed.
//  - kFull: each layer is a segment that keeps only its input and is
//    replayed before its backward: torch.utils.checkpoint around each block
//    (Hugging Face gradient_checkpointing_enable), Megatron-LM's
//    --recompute-granularity full --recompute-method uniform
//    --recompute-num-layers 1.
//  - kEveryK: segments of k consecutive layers starting at the layers
//    EveryKLayers(layers, k) lists (Megatron's --recompute-num-layers k).
//  - kSqrtN: segments of ceil(sqrt(layers)) layers, SqrtCheckpoints(layers):
//    Chen et al. 2016, "Training Deep Nets with Sublinear Memory Cost".
//  - kSelective: the attention core of each layer (Op::attention_core: QK^T,
//    softmax, dropout, probs @ V), Korthikanti et al. 2022, "Reducing
//    Activation Recomputation in Large Transformer Models", sec. 4.2. With
//    flash attention the builders mark no core, so the plan is empty, as
//    the paper observes flash attention makes selective recomputation moot.
#ifndef HEADROOM_PLANNER_CHECKPOINT_MODE_PLAN_H_
#define HEADROOM_PLANNER_CHECKPOINT_MODE_PLAN_H_

#include "absl/status/statusor.h"
#include "graph/checkpoint_plan.h"
#include "graph/graph.h"
#include "job/checkpoint_mode.h"

namespace headroom {

// The plan of `mode` over `forward` (Note [Checkpoint modes]). `every` is
// kEveryK's layers per segment (>= 1) and is ignored by the other modes.
absl::StatusOr<CheckpointPlan> PlanForMode(const Graph& forward, CheckpointMode mode, int every = 1);

}  // namespace headroom

#endif  // HEADROOM_PLANNER_CHECKPOINT_MODE_PLAN_H_

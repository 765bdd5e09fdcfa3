// The full schedule of one training step: forward, loss, backward (with
// activation checkpointing) and the optimizer step, derived from a forward
// graph as the builders emit it (models/builders.h) and an explicit
// checkpoint plan (graph/checkpoint_plan.h; planner/checkpoint_mode_plan.h makes
// the plan of each named mode).
//
//   HEADROOM_ASSIGN_OR_RETURN(Graph forward, BuildModelGraph(config, build));
//   HEADROOM_ASSIGN_OR_RETURN(CheckpointPlan plan, PlanForMode(forward, CheckpointMode::kSelective));
//   HEADROOM_ASSIGN_OR_RETURN(Graph step, BuildTrainingStep(forward, {.checkpoint = plan}));
//   MemoryProfile profile = ProfileMemory(step, {});   // graph/liveness.h
//
// The result is one Graph in program order: the forward ops unchanged (ids
// 0..n-1), then backward ops in reverse forward order, recompute ops placed
// right before the backward of their segment, then one optimizer op per
// trainable parameter. Tensors of the forward keep their ids, and so do its
// ops, except that with StepOptions::gradients_preexist a "gradient_buffers"
// op comes first and shifts them by one.
//
// Note [Checkpoint segments]
// A checkpointed segment is a contiguous run of forward ops (the plan says
// which: a layer, k layers, the attention core of a layer, or anything a
// planner chose). During forward it keeps only what enters it from outside
// (its boundary inputs: the layer's hidden state, or q, k, v for the
// attention core); tensors it produces and saves for its own backward are
// dropped after their last forward use. Right before the first backward op
// of the segment, its forward ops are replayed (Op::recompute, phase
// kBackward, forward_of = the original) into fresh tensors named
// "<name>@recompute", which the segment's backward reads instead. Replayed
// ops whose outputs nobody reads are dropped, as PyTorch's non-reentrant
// checkpoint stops early. This is torch.utils.checkpoint around each segment.
//
// Note [Autocast weight cache]
// torch.autocast casts an fp32 parameter that requires grad (a leaf, not a
// view) once per region and caches the 16-bit copy until the outermost
// autocast region exits (aten/src/ATen/autocast_mode.cpp, cached_cast;
// cache_enabled defaults to True, and Hugging Face's Trainer keeps it).
// The usual loop exits after the loss, before backward. Without
// checkpointing the linear layers save those copies for backward anyway;
// under checkpointing nothing else holds them, yet every layer's copies
// stay until the loss is done. StepOptions::autocast_weight_cache adds an
// op "autocast_exit" after the loss that reads them, so they live that long.
// A checkpoint replay in backward opens a fresh region (torch.utils.checkpoint
// restores the autocast state), whose copies its backward saves anyway.
#ifndef HEADROOM_GRAPH_TRAINING_STEP_H_
#define HEADROOM_GRAPH_TRAINING_STEP_H_

#include <cstdint>
#include <optional>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "graph/checkpoint_plan.h"
#include "graph/graph.h"

namespace headroom {

struct StepOptions {
  // false: inference; the step is the forward graph (loss ops dropped), and
  // nothing is kept for backward.
  bool training = true;
  // Which forward ops are replayed during backward (Note [Checkpoint
  // segments]); empty: none. Training only.
  CheckpointPlan checkpoint;
  // dtype of parameter gradients; default: the parameter's own dtype (PyTorch
  // keeps .grad in the parameter's dtype).
  std::optional<DType> parameter_gradient_dtype;
  // Gradient accumulation after the first micro-batch: parameter gradients
  // exist from the start of the step (one "gradient_buffers" op first), and
  // every contribution adds a temporary into them.
  bool gradients_preexist = false;
  // Append one optimizer op per trainable parameter, after which its gradient
  // is freed (zero_grad(set_to_none=True)). The two figures only price the op
  // (hardware/cost_model.h); optimizer state memory is the estimators' business.
  bool optimizer_step = true;
  // The training loop holds the model's outputs (the tensors the loss reads)
  // until the step ends (Note [Training loop] in job/job_spec.h): a last op,
  // "release_outputs", reads them after the optimizer step.
  bool hold_model_outputs = false;
  // The forward and loss run under torch.autocast with its weight cache
  // (Note [Autocast weight cache]): one op "autocast_exit" after the loss
  // reads every cast of a trainable parameter. Training only.
  bool autocast_weight_cache = false;
  // Softmax's backward holds grad * output in a temporary first, as PyTorch's
  // CUDA kernel does (TorchRuntime::SoftmaxBackwardHoldsProduct).
  bool softmax_backward_holds_product = false;
  double optimizer_flops_per_element = 12;        // AdamW: moments, bias correction, decay
  uint32_t optimizer_state_bytes_per_element = 8;  // AdamW: two fp32 moments
};

// Derives the step. Errors (InvalidArgument, naming the op or option):
// an invalid forward graph, a graph that already has backward ops, training
// without a loss op (phase kLoss), a plan that does not fit the graph
// (CheckpointPlan::Validate) or a plan for inference.
absl::StatusOr<Graph> BuildTrainingStep(const Graph& forward, const StepOptions& options);

}  // namespace headroom

#endif  // HEADROOM_GRAPH_TRAINING_STEP_H_

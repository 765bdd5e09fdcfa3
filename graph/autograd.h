// Reverse-mode derivation: which tensors need a gradient, and what each op's
// backward reads, writes and costs.
//
// graph/training_step.h drives this over a whole forward graph; the rules
// here are exposed so that estimators and the planner can price single ops.
//
//   std::vector<bool> needs = RequiresGrad(forward);   // indexed by TensorId
//   BackwardRule rule = BackwardRuleFor(forward, op);  // kGemm, kPassThrough, ...
//   BackwardCost cost = EstimateBackwardCost(forward, op, needs);
//
// Note [Backward families]
// Kinds are matched exactly unless a prefix is named, with a "_backward"
// suffix ignored. Rules follow PyTorch autograd:
//  - kGemm (linear, matmul, mm, bmm, baddbmm, addmm, einsum, attention_scores,
//    attention_context, and the prefixes conv, lora_): one GEMM of the
//    forward's FLOPs per operand that needs a gradient (grad input = dY W, grad weight = dY^T X). A saved operand is
//    read only if some *other* operand needs a gradient (mm's backward needs
//    mat2 for grad self and self for grad mat2), so a frozen linear does not
//    keep its input alive; bias gradients are a reduction of dY.
//  - kFlashAttention (sdpa_flash, flash_attention, sdpa_efficient,
//    sdpa_cudnn, and the prefix flash_): 2.5x the forward FLOPs
//    (FlashAttention-2, Dao 2023, sec. 3: the backward does 5 matmuls against the forward's 2, recomputing the
//    attention matrix from q, k, v and the logsumexp).
//  - kEmbedding (prefix embedding): scatter-add of dY into the weight
//    gradient; the integer indices get no gradient.
//  - kPassThrough: view ops (every output is a view), `add`, `residual_add`,
//    `contiguous` and `clone`
//    and in-place ops that save nothing (all_reduce, index_add): an input gradient with as many elements as the output
//    gradient aliases its storage (a view) and allocates nothing; a
//    broadcast operand (a bias) gets a reduced, freshly allocated gradient.
//  - kElementwise (everything else: norms, activations, softmax, dropout,
//    losses, pooling, ...): memory-bound; FLOPs are twice the forward's.
//
// Invariants of the derived backward (checked by tests/graph/autograd_test):
// every backward op has phase kBackward and forward_of set; each gradient
// tensor has role kGradient, the dtype of the tensor it differentiates (or
// StepOptions::parameter_gradient_dtype for parameters) and grad_of set; a
// gradient receiving several contributions is made by the first contributor
// and later contributors read it and add a same-sized temporary into it.
#ifndef HEADROOM_GRAPH_AUTOGRAD_H_
#define HEADROOM_GRAPH_AUTOGRAD_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "graph/graph.h"

namespace headroom {

enum class BackwardRule : uint8_t {
  kNoBackward,      // nothing upstream needs a gradient: no backward op
  kGemm,
  kFlashAttention,
  kEmbedding,
  kPassThrough,
  kElementwise,
};
std::string_view BackwardRuleName(BackwardRule rule);

// The rule for `op` by kind and structure (views, in-place). Never kNoBackward:
// whether a backward exists depends on RequiresGrad, not on the kind.
BackwardRule BackwardRuleFor(const Graph& graph, const Op& op);

// true for a trainable parameter and for every tensor computed (through any
// chain of ops) from one. Integer tensors never require a gradient. Indexed by
// TensorId; views share their base's answer.
std::vector<bool> RequiresGrad(const Graph& graph);

// The inputs of `op` that get a gradient (RequiresGrad), each once, in input
// order: the order in which its backward op lists their gradients. A GEMM's
// operands past (x, weight, bias) are read for backward only: the sequence
// shard a sequence-parallel linear saves (graph/ops.h, Note
// [Sequence-parallel linear]) gets its gradient through the all-gather.
std::vector<TensorId> InputsNeedingGrad(const Op& op, const std::vector<bool>& requires_grad);

struct BackwardCost {
  double flops = 0;
  uint64_t bytes_read = 0;     // saved tensors read + output gradients
  uint64_t bytes_written = 0;  // input gradients produced
};

// Cost of `op`'s backward given which tensors need gradients (RequiresGrad).
// Zero when no input of `op` needs a gradient.
BackwardCost EstimateBackwardCost(const Graph& graph, const Op& op,
                                  const std::vector<bool>& requires_grad);

// Kind-only classification (ignores views), for ops of any phase:
// "linear_backward" and a recomputed "linear" are both GEMMs.
bool IsGemmKind(std::string_view kind);
bool IsFlashAttentionKind(std::string_view kind);

// Whether `op`'s backward reads saved tensor `saved` given which tensors need
// gradients (kGemm operands are read only for the other operand's gradient).
bool BackwardReadsSaved(const Graph& graph, const Op& op, TensorId saved,
                        const std::vector<bool>& requires_grad);

namespace internal {

// Marks the loss in BackwardPass::gradient: its gradient is the implicit 1
// and takes no storage.
inline constexpr TensorId kSeedGradient = -2;

// The reverse pass behind BuildTrainingStep (graph/training_step.h).
struct BackwardPass {
  // Step op ids of the forward and loss ops, in forward order; the backward
  // of each is appended to the step in reverse order.
  std::vector<OpId> forward_ops;
  // RequiresGrad of the step (forward part), indexed by TensorId.
  std::vector<bool> requires_grad;
  // The tensor backward reads in place of each tensor (a recomputed copy),
  // or the tensor itself; indexed by TensorId, updated by before_backward.
  std::vector<TensorId> read_as;
  // Gradient of each tensor so far (kNone: none yet); pre-filled for
  // parameters whose gradients exist before the step. Indexed by TensorId.
  std::vector<TensorId> gradient;
  // For a parameter whose gradient exists before the step: its contributions
  // so far, summed, waiting for the next (Note [Gradient accumulation] in
  // autograd.cc). Indexed by TensorId, kNone where none waits.
  std::vector<TensorId> waiting;
  std::optional<DType> parameter_gradient_dtype;
  // Softmax's backward writes grad * output into a temporary first (CUDA).
  bool softmax_backward_holds_product = false;
  // Called right before the backward of a forward op is appended (op id in
  // the step), so that checkpointing can replay the op's segment first.
  std::function<absl::Status(OpId)> before_backward;
};
absl::Status AppendBackward(Graph& step, BackwardPass& pass);

}  // namespace internal
}  // namespace headroom

#endif  // HEADROOM_GRAPH_AUTOGRAD_H_

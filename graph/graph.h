// Operator-level IR of one training or inference step.
//
// A Graph holds tensors and the ops that produce and consume them, in
// program order. Builders (models/builders.h) emit the forward pass of a model;
// graph/training_step.h derives backward, the optimizer step, checkpointing
// and tensor lifetimes from it; estimators and the planner read the result.
//
//   Graph g("mlp");
//   TensorId x = g.AddTensor({.name = "x", .shape = {8, 1024}, .dtype = DType::kBF16,
//                             .role = TensorRole::kInput});
//   TensorId w = g.AddTensor({.name = "fc.weight", .shape = {4096, 1024},
//                             .dtype = DType::kBF16, .role = TensorRole::kParameter});
//   TensorId y = g.AddTensor({.name = "fc.out", .shape = {8, 4096}, .dtype = DType::kBF16,
//                             .role = TensorRole::kActivation});
//   g.AddOp({.kind = "linear", .name = "fc", .inputs = {x, w}, .outputs = {y},
//            .saved = {x}, .flops = 2.0 * 8 * 1024 * 4096});
//
// Invariants (checked by Validate()):
//  - tensor and op ids are dense indices in insertion order;
//  - every op input is a parameter, buffer or input, or was produced by an
//    earlier op; every tensor is produced by at most one op;
//  - saved tensors are inputs or outputs of the op that saves them;
//  - a view (view_of >= 0) aliases an earlier, non-view tensor of at least
//    its size and allocates nothing; in-place ops write into their first input;
//  - sizes stay within Note [Size bounds].
//
// Note [Size bounds]
// Bytes are uint64_t and a sum of wrapped sizes is a confident wrong answer,
// so every graph keeps stated bounds: a tensor holds at most kMaxTensorBytes
// (1 TiB, more than any GPU has) and a graph has at most kMaxGraphTensors
// tensors and kMaxGraphOps ops (2^21 each; a 4096-layer dense transformer's
// training step has about a million). Any sum of a graph's tensor bytes is
// then below 2^61, so liveness sums, per-role sums and per-op byte counts
// cannot wrap and need no checks on the hot path. Tensor::elements() and
// DTypeBytes() saturate at 2^64 - 1 instead of wrapping, so a shape beyond
// the bounds is seen as too large by CheckBounds(), never as small.
// Builders and importers check the inputs that multiply into sizes first
// (config fields, batch, sequence), so their errors name those inputs; the
// bound check here is the backstop that names the tensor.
#ifndef HEADROOM_GRAPH_GRAPH_H_
#define HEADROOM_GRAPH_GRAPH_H_

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace headroom {

enum class DType : uint8_t {
  kF64, kF32, kBF16, kF16, kF8E4M3, kF8E5M2, kI64, kI32, kI8, kU8, kBool,
  kNF4,  // 4-bit NormalFloat (QLoRA), two values per byte
};

std::string_view DTypeName(DType dtype);  // "f32", "bf16", "nf4", ...
// Accepts our names and PyTorch/HF spellings: "float32", "torch.bfloat16", "fp16", "half".
absl::StatusOr<DType> ParseDType(std::string_view name);
// Storage bytes of `elements` values (NF4 rounds up to whole bytes);
// saturates at 2^64 - 1 (Note [Size bounds]).
uint64_t DTypeBytes(DType dtype, uint64_t elements);
// Floating-point dtypes (NF4 is a storage format, not a compute type).
bool IsFloatingPoint(DType dtype);

enum class TensorRole : uint8_t {
  kParameter,       // weights and biases
  kBuffer,          // non-trainable state kept with the model (e.g. rotary tables)
  kInput,           // batch data: token ids, images, labels
  kActivation,      // produced in forward (or recomputed), may be saved for backward
  kGradient,        // gradients of activations and parameters
  kOptimizerState,  // moments, master weights
  kTemporary,       // workspaces that live within one op
};
std::string_view TensorRoleName(TensorRole role);
absl::StatusOr<TensorRole> ParseTensorRole(std::string_view name);

// Note [Size bounds].
inline constexpr uint64_t kMaxTensorBytes = uint64_t{1} << 40;  // 1 TiB
inline constexpr size_t kMaxGraphTensors = size_t{1} << 21;
inline constexpr size_t kMaxGraphOps = size_t{1} << 21;
// Op::measured_cost is finite, non-negative and at most this, in any unit:
// 1e30 is past any physical measure of one op (a frontier model's whole
// training run is ~1e26 FLOPs), and it keeps every sum of costs a plan forms
// (at most 2^21 ops, each replayed at most 2^21 times) near 1e43, far from
// overflowing a double. The LP solvers see costs divided by the largest
// (Note [Remat cost scale] in planner/remat_lp.cc), so their size is no concern.
inline constexpr double kMaxMeasuredCost = 1e30;

using TensorId = int32_t;
using OpId = int32_t;
inline constexpr int32_t kNone = -1;

struct Tensor {
  TensorId id = kNone;  // assigned by Graph::AddTensor
  std::string name;     // "layers.3.self_attn.q_proj.weight", "layers.3.attn.probs"
  std::vector<int64_t> shape;
  DType dtype = DType::kF32;
  TensorRole role = TensorRole::kActivation;
  int layer = -1;          // repeated block index (transformer layer, ResNet stage block); -1 outside
  bool trainable = true;   // parameters only: frozen ones get no gradient or optimizer state
  TensorId view_of = kNone;
  // Gradients made by graph/autograd.h: the tensor (activation or parameter)
  // this is the gradient of; kNone for every other tensor.
  TensorId grad_of = kNone;

  // Product of shape (1 for a scalar), saturating at 2^64 - 1 (Note [Size bounds]).
  uint64_t elements() const;
  uint64_t bytes() const;     // 0 for views
};

enum class Phase : uint8_t { kForward, kLoss, kBackward, kOptimizer };
std::string_view PhaseName(Phase phase);  // "forward", "loss", "backward", "optimizer"
absl::StatusOr<Phase> ParsePhase(std::string_view name);
// Forward or loss: the phases before backward starts.
inline bool IsForwardPhase(Phase phase) { return phase == Phase::kForward || phase == Phase::kLoss; }

struct Op {
  OpId id = kNone;   // assigned by Graph::AddOp
  std::string kind;  // "linear", "layer_norm", "sdpa_flash", "softmax", "dropout", ...
  std::string name;  // "layers.3.self_attn.q_proj"
  std::vector<TensorId> inputs;
  std::vector<TensorId> outputs;
  // What autograd keeps alive for this op's backward, following PyTorch's
  // choices (see graph/autograd.h). Extra saved values an op creates (mean and
  // rstd of layer_norm, a dropout mask, logsumexp) are listed among outputs.
  std::vector<TensorId> saved;
  double flops = 0;
  uint64_t bytes_read = 0;
  uint64_t bytes_written = 0;
  DType compute_dtype = DType::kF32;
  Phase phase = Phase::kForward;
  int layer = -1;
  bool inplace = false;       // writes into inputs[0]; outputs[0] is a view of it
  OpId forward_of = kNone;    // backward/recompute ops: the forward op they derive from
  bool recompute = false;     // a forward op replayed during backward (checkpointing)
  // A cost measured outside Headroom, in the source's own units (node-link
  // graphs' profiled cost_cpu); 0 when unknown. Planners may weigh
  // recomputation by it; the roofline cost model ignores it.
  double measured_cost = 0;
  // Eager attention's core (QK^T, scale/mask, softmax, dropout on the
  // probabilities, probs @ V): what selective activation recomputation
  // replays (planner/checkpoint_mode_plan.h, CheckpointMode::kSelective). Builders set it.
  bool attention_core = false;
};

// An op that computes nothing and stands for a reference the program holds
// until it runs: a Python function's locals ("scope_end"), the training
// loop's outputs ("release_outputs", Note [Training loop] in
// job/job_spec.h) or autocast's weight cache ("autocast_exit", Note
// [Autocast weight cache] in graph/training_step.h). Replaying what it reads
// would only make a second copy.
inline bool IsHoldOp(const Op& op) {
  return op.kind == "scope_end" || op.kind == "release_outputs" || op.kind == "autocast_exit";
}

class Graph {
 public:
  explicit Graph(std::string name = "") : name_(std::move(name)) {}

  TensorId AddTensor(Tensor tensor);
  OpId AddOp(Op op);
  // Room for this many ops and tensors in all, for builders that know.
  void Reserve(size_t ops, size_t tensors) {
    ops_.reserve(ops);
    tensors_.reserve(tensors);
    producer_.reserve(tensors);
  }

  const std::string& name() const { return name_; }
  const Tensor& tensor(TensorId id) const { return tensors_[static_cast<size_t>(id)]; }
  Tensor& mutable_tensor(TensorId id) { return tensors_[static_cast<size_t>(id)]; }
  const Op& op(OpId id) const { return ops_[static_cast<size_t>(id)]; }
  std::span<const Tensor> tensors() const { return tensors_; }
  std::span<const Op> ops() const { return ops_; }
  size_t num_tensors() const { return tensors_.size(); }
  size_t num_ops() const { return ops_.size(); }

  // The tensor whose storage `id` uses: its view base, or `id` itself.
  TensorId storage(TensorId id) const {
    const TensorId base = tensor(id).view_of;
    return base == kNone ? id : base;
  }

  // The op that produces `id`, or kNone for parameters, buffers and inputs.
  OpId producer(TensorId id) const { return producer_[static_cast<size_t>(id)]; }

  // Parameter elements, all or trainable only.
  uint64_t ParameterCount(bool trainable_only = false) const;

  // Checks the invariants in the header comment; the message names the
  // offending op or tensor.
  absl::Status Validate() const;

  // The size part of Validate() alone (Note [Size bounds]): tensor and op
  // counts and every tensor's bytes. O(tensors); OutOfRange names the tensor.
  absl::Status CheckBounds() const;

 private:
  std::string name_;
  std::vector<Tensor> tensors_;
  std::vector<Op> ops_;
  std::vector<OpId> producer_;
};

}  // namespace headroom

#endif  // HEADROOM_GRAPH_GRAPH_H_

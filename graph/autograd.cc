#include "graph/autograd.h"

#include <algorithm>
#include <string>
#include <string_view>
#include <utility>

#include "absl/strings/str_format.h"

namespace headroom {
namespace {

std::string_view StripBackwardSuffix(std::string_view kind) {
  constexpr std::string_view kSuffix = "_backward";
  if (kind.ends_with(kSuffix)) kind.remove_suffix(kSuffix.size());
  return kind;
}

// Bytes a tensor's values occupy whether or not it owns its storage (a view's
// gradient is a full tensor of the view's shape).
uint64_t NominalBytes(const Tensor& t) { return DTypeBytes(t.dtype, t.elements()); }

bool Contains(const std::vector<TensorId>& ids, TensorId id) {
  return std::find(ids.begin(), ids.end(), id) != ids.end();
}

}  // namespace

std::string_view BackwardRuleName(BackwardRule rule) {
  switch (rule) {
    case BackwardRule::kNoBackward: return "none";
    case BackwardRule::kGemm: return "gemm";
    case BackwardRule::kFlashAttention: return "flash_attention";
    case BackwardRule::kEmbedding: return "embedding";
    case BackwardRule::kPassThrough: return "pass_through";
    case BackwardRule::kElementwise: return "elementwise";
  }
  return "unknown";
}

bool IsGemmKind(std::string_view kind) {
  kind = StripBackwardSuffix(kind);
  constexpr std::string_view kExact[] = {"linear", "matmul", "mm", "bmm", "baddbmm", "addmm",
                                         "einsum", "attention_scores", "attention_context"};
  for (std::string_view k : kExact) {
    if (kind == k) return true;
  }
  return kind.starts_with("conv") || kind.starts_with("lora_");
}

std::vector<TensorId> InputsNeedingGrad(const Op& op, const std::vector<bool>& requires_grad) {
  const size_t limit = IsGemmKind(op.kind) ? std::min<size_t>(3, op.inputs.size()) : op.inputs.size();
  std::vector<TensorId> out;
  for (size_t i = 0; i < limit; ++i) {
    const TensorId in = op.inputs[i];
    if (requires_grad[static_cast<size_t>(in)] && !Contains(out, in)) out.push_back(in);
  }
  return out;
}

bool IsFlashAttentionKind(std::string_view kind) {
  kind = StripBackwardSuffix(kind);
  return kind == "sdpa_flash" || kind == "flash_attention" || kind == "sdpa_efficient" ||
         kind == "sdpa_cudnn" || kind.starts_with("flash_");
}

BackwardRule BackwardRuleFor(const Graph& graph, const Op& op) {
  const std::string_view kind = StripBackwardSuffix(op.kind);
  if (IsGemmKind(kind)) return BackwardRule::kGemm;
  if (IsFlashAttentionKind(kind)) return BackwardRule::kFlashAttention;
  if (kind.starts_with("embedding")) return BackwardRule::kEmbedding;
  // contiguous()/clone() hand the output gradient back (CloneBackward).
  // log_softmax under loss_parallel: nll_loss's backward already wrote its input's gradient (Note
  // [loss_parallel's cross-entropy] in graph/ops.cc).
  if (kind == "add" || kind == "add_mask" || kind == "residual_add" || kind == "contiguous" || kind == "clone" ||
      kind == "log_softmax_parallel") {
    return BackwardRule::kPassThrough;
  }
  const bool all_views =
      !op.outputs.empty() && std::all_of(op.outputs.begin(), op.outputs.end(), [&](TensorId t) {
        return graph.tensor(t).view_of != kNone;
      });
  if (all_views && !op.inplace) return BackwardRule::kPassThrough;
  // An in-place op that saves nothing (all_reduce, index_add) hands its
  // output gradient straight back.
  if (op.inplace && op.saved.empty()) return BackwardRule::kPassThrough;
  return BackwardRule::kElementwise;
}

std::vector<bool> RequiresGrad(const Graph& graph) {
  std::vector<bool> needs(graph.num_tensors(), false);
  for (const Tensor& t : graph.tensors()) {
    if (t.role == TensorRole::kParameter && t.trainable && IsFloatingPoint(t.dtype)) needs[t.id] = true;
  }
  for (const Op& op : graph.ops()) {
    if (op.phase == Phase::kBackward || op.phase == Phase::kOptimizer) continue;
    const bool any = std::any_of(op.inputs.begin(), op.inputs.end(),
                                 [&](TensorId in) { return needs[static_cast<size_t>(in)]; });
    if (!any) continue;
    for (TensorId out : op.outputs) {
      if (IsFloatingPoint(graph.tensor(out).dtype)) needs[static_cast<size_t>(out)] = true;
    }
  }
  return needs;
}

bool BackwardReadsSaved(const Graph& graph, const Op& op, TensorId saved,
                        const std::vector<bool>& requires_grad) {
  if (BackwardRuleFor(graph, op) != BackwardRule::kGemm || op.inputs.size() < 2) return true;
  // Note [Backward families]: the gradient of one GEMM operand needs the other.
  const TensorId a = op.inputs[0];
  const TensorId b = op.inputs[1];
  if (saved == a && saved != b) return requires_grad[static_cast<size_t>(b)];
  if (saved == b && saved != a) return requires_grad[static_cast<size_t>(a)];
  return true;
}

BackwardCost EstimateBackwardCost(const Graph& graph, const Op& op,
                                  const std::vector<bool>& requires_grad) {
  BackwardCost cost;
  const std::vector<TensorId> grad_inputs = InputsNeedingGrad(op, requires_grad);
  if (grad_inputs.empty()) return cost;
  const BackwardRule rule = BackwardRuleFor(graph, op);
  if (rule == BackwardRule::kPassThrough) return cost;  // aliases, no kernel of its own
  uint64_t grad_out_elements = 0;
  for (TensorId out : op.outputs) {
    if (!requires_grad[static_cast<size_t>(out)]) continue;
    cost.bytes_read += NominalBytes(graph.tensor(out));
    grad_out_elements += graph.tensor(out).elements();
  }
  for (TensorId s : op.saved) {
    if (BackwardReadsSaved(graph, op, s, requires_grad)) cost.bytes_read += NominalBytes(graph.tensor(s));
  }
  for (TensorId in : grad_inputs) cost.bytes_written += NominalBytes(graph.tensor(in));
  switch (rule) {
    case BackwardRule::kGemm: {
      int operands = 0;
      for (size_t i = 0; i < std::min<size_t>(2, op.inputs.size()); ++i) {
        if (requires_grad[static_cast<size_t>(op.inputs[i])]) ++operands;
      }
      // A lone bias gradient is a reduction over dY.
      cost.flops = operands > 0 ? op.flops * operands : static_cast<double>(grad_out_elements);
      break;
    }
    case BackwardRule::kFlashAttention: cost.flops = 2.5 * op.flops; break;
    case BackwardRule::kEmbedding: cost.flops = static_cast<double>(grad_out_elements); break;
    default:
      cost.flops = op.flops > 0 ? 2 * op.flops : static_cast<double>(grad_out_elements);
      break;
  }
  return cost;
}

namespace internal {

absl::Status AppendBackward(Graph& step, BackwardPass& pass) {
  // Ids of tensors appended here grow `pass.gradient`/`read_as` lazily.
  auto grow = [&pass, &step] {
    pass.gradient.resize(step.num_tensors(), kNone);
    pass.waiting.resize(step.num_tensors(), kNone);
    pass.read_as.resize(step.num_tensors(), kNone);
    pass.requires_grad.resize(step.num_tensors(), false);
  };
  grow();
  for (auto it = pass.forward_ops.rbegin(); it != pass.forward_ops.rend(); ++it) {
    const OpId fwd_id = *it;
    // Copy: AddTensor/AddOp below may reallocate the graph's storage.
    const Op fwd = step.op(fwd_id);
    const std::vector<TensorId> grad_inputs = InputsNeedingGrad(fwd, pass.requires_grad);
    if (grad_inputs.empty()) continue;
    std::vector<TensorId> grad_outputs;  // existing gradients of fwd's outputs
    bool seeded = false;                 // the loss: its gradient is the implicit 1
    for (TensorId out : fwd.outputs) {
      const TensorId g = pass.gradient[static_cast<size_t>(out)];
      if (g == kSeedGradient) seeded = true;
      else if (g != kNone) grad_outputs.push_back(g);
    }
    if (grad_outputs.empty() && !seeded) continue;  // nothing flows back through fwd

    if (pass.before_backward) {
      absl::Status status = pass.before_backward(fwd_id);
      if (!status.ok()) return status;
      grow();
    }
    const BackwardRule rule = BackwardRuleFor(step, fwd);
    const BackwardCost cost = EstimateBackwardCost(step, fwd, pass.requires_grad);
    Op bwd{.kind = absl::StrFormat("%s_backward", fwd.kind),
           .name = absl::StrFormat("%s.backward", fwd.name),
           .flops = cost.flops,
           .bytes_read = cost.bytes_read,
           .bytes_written = cost.bytes_written,
           .compute_dtype = fwd.compute_dtype,
           .phase = Phase::kBackward,
           .layer = fwd.layer,
           .forward_of = fwd_id};
    bwd.inputs = grad_outputs;
    if (rule != BackwardRule::kPassThrough) {
      for (TensorId s : fwd.saved) {
        if (!BackwardReadsSaved(step, fwd, s, pass.requires_grad)) continue;
        const TensorId read = pass.read_as[static_cast<size_t>(s)];
        const TensorId use = read == kNone ? s : read;
        if (!Contains(bwd.inputs, use)) bwd.inputs.push_back(use);
      }
    }
    // Storage a pass-through gradient may alias: the first output gradient's.
    TensorId alias_base = kNone;
    uint64_t alias_elements = 0;
    if (rule == BackwardRule::kPassThrough && !grad_outputs.empty()) {
      const Tensor& g = step.tensor(grad_outputs.front());
      alias_base = g.view_of == kNone ? g.id : g.view_of;
      alias_elements = g.elements();
    }
    for (TensorId in : grad_inputs) {
      const Tensor& x = step.tensor(in);
      const bool parameter = x.role == TensorRole::kParameter;
      const DType dtype = parameter && pass.parameter_gradient_dtype ? *pass.parameter_gradient_dtype
                                                                     : x.dtype;
      const bool alias = alias_base != kNone && x.elements() == alias_elements &&
                         dtype == step.tensor(alias_base).dtype;
      const TensorId grad = pass.gradient[static_cast<size_t>(in)];
      if (grad == kNone) {
        Tensor g{.name = absl::StrFormat("%s.grad", x.name),
                 .shape = x.shape,
                 .dtype = dtype,
                 .role = TensorRole::kGradient,
                 .layer = x.layer >= 0 ? x.layer : fwd.layer,
                 .view_of = alias ? alias_base : kNone,
                 .grad_of = in};
        const TensorId id = step.AddTensor(std::move(g));
        grow();
        pass.gradient[static_cast<size_t>(in)] = id;
        bwd.outputs.push_back(id);
      } else {
        // Note [Gradient accumulation]
        // PyTorch's engine computes each contribution into a fresh tensor
        // and adds it into the buffer already holding the gradient, so the
        // sum and one contribution coexist for the duration of the add. An
        // aliasing contribution adds the output gradient directly. A
        // parameter's contributions (a tied embedding and output layer) wait
        // in its AccumulateGrad node's input buffer until the last arrives,
        // each summed with the next into a third, fresh tensor: every H100
        // and CPU trace of a tied model in validation/fixtures allocates the
        // sum while both contributions are live, then frees them. The sum
        // becomes .grad; into a .grad that exists before the step
        // (gradients_preexist), AccumulateGrad adds it in place once the
        // last contribution is in (the engine runs a node once all its
        // inputs have arrived, torch/csrc/autograd/engine.cpp), so the
        // earlier ones stay live until then; no trace shows that case yet.
        if (!Contains(bwd.inputs, grad)) bwd.inputs.push_back(grad);
        if (!alias) {
          const Tensor existing = step.tensor(grad);
          auto fresh = [&](const char* suffix, TensorRole role, TensorId grad_of) {
            const TensorId id = step.AddTensor({.name = absl::StrFormat("%s.%s", x.name, suffix),
                                                .shape = existing.shape,
                                                .dtype = existing.dtype,
                                                .role = role,
                                                .layer = role == TensorRole::kGradient ? existing.layer : fwd.layer,
                                                .grad_of = grad_of});
            grow();
            bwd.outputs.push_back(id);
            return id;
          };
          const TensorId partial = fresh("grad.partial", TensorRole::kTemporary, kNone);
          const OpId made_by = step.producer(grad);
          const bool preexisting = made_by != kNone && step.op(made_by).kind == "gradient_buffers";
          const TensorId waiting = pass.waiting[static_cast<size_t>(in)];
          if (parameter && !preexisting) {
            const TensorId sum = fresh("grad", TensorRole::kGradient, in);
            pass.gradient[static_cast<size_t>(in)] = sum;
          } else if (parameter && waiting == kNone) {
            pass.waiting[static_cast<size_t>(in)] = partial;
          } else if (parameter) {
            bwd.inputs.push_back(waiting);
            const TensorId sum = fresh("grad.incoming", TensorRole::kTemporary, kNone);
            pass.waiting[static_cast<size_t>(in)] = sum;
          }
        }
      }
    }
    // A temporary of `like`'s shape and dtype, living within the backward op.
    auto add_temporary = [&](std::string_view suffix, TensorId like) {
      const Tensor model = step.tensor(like);  // a copy: AddTensor may move the graph's tensors
      const TensorId t = step.AddTensor({.name = absl::StrFormat("%s.%s", fwd.name, suffix),
                                         .shape = model.shape,
                                         .dtype = model.dtype,
                                         .role = TensorRole::kTemporary,
                                         .layer = fwd.layer});
      grow();
      bwd.outputs.push_back(t);
    };
    // Note [Runtime differences] in graph/torch_runtime.h: CUDA's softmax backward.
    if (fwd.kind == "softmax" && pass.softmax_backward_holds_product && !grad_outputs.empty()) {
      add_temporary("grad_times_output", grad_outputs.front());
    }
    // Note [loss_parallel's cross-entropy] in graph/ops.cc: zeros_like(x) and exp(x) beside the gradient.
    if (fwd.kind == "nll_loss_parallel" && !fwd.inputs.empty()) {
      for (std::string_view temporary : {"zeros", "exp"}) add_temporary(temporary, fwd.inputs.front());
    }
    step.AddOp(std::move(bwd));
  }
  return absl::OkStatus();
}

}  // namespace internal
}  // namespace headroom

// State-space models: Mamba.
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_format.h"
#include "common/status_macros.h"
#include "models/builder.h"

namespace headroom::builders_internal {

// Note [Mamba]
// MambaForCausalLM (transformers 4.46's modeling_mamba.py; Gu and Dao 2023) stacks MambaBlocks: x + mixer(norm(x)),
// the norm an eager RMSNorm (MambaRMSNorm is LlamaRMSNorm) of x cast to the norm weight's dtype, the residual cast
// to f32 when residual_in_fp32, so that from the second block on the stream is f32. Then norm_f, the head (tied to
// backbone.embeddings by default) over the stream cast to its dtype, logits .float(), the shifted cross-entropy.
//
// Without the mamba_ssm and causal_conv1d packages (and on any CPU, the meta device included) MambaMixer runs
// slow_forward, which is what the graph is:
//   in_proj -> [b, s, 2i] viewed as hidden and gate [b, i, s]; conv1d (depthwise, k = conv_kernel, padding
//   k - 1) -> [b, i, s + k - 1], sliced to s; act (SiLU) -> u; x_proj(u) -> [b, s, r + 2n] split into
//   time_step, B, C; softplus(dt_proj(time_step)) -> dt; A = -exp(A_log.float()) [i, n];
//   deltaA = exp(A * dt) and deltaB = dt * B.float(), deltaB_u = deltaB * u.float(), all [b, i, s, n] f32;
//   then a Python loop over the s positions:
//     state = deltaA[:, :, t] * state + deltaB_u[:, :, t]; y_t = state.to(dtype) @ C[:, t]
//   from state = zeros [b, i, n] in the input's dtype; y = stack(y_t) + u * D; y * act(gate); out_proj.
// The loop is one selective_scan op (graph/ops.h), not s ops per layer: what autograd saves over the loop is
// each step's new state (s x [b, i, n] f32, kept as one [b, i, s, n] tensor: the same bytes; when the matmul
// runs 16-bit, a 16-bit copy of each and only s - 1 of the f32 states, the last one read by no later step), the
// zero initial state, and slices of deltaA and C, whose storages deltaA's exp
// and x_proj's consumers keep anyway. deltaA, deltaB and deltaB_u are Python locals, alive until the mixer
// returns (Note [Python references in inference]): each mixer ends with a scope_end reading them. At inference
// the step states are not kept; MambaCache's conv_state and ssm_state are resident per layer (estimators count
// them in place of a KV cache) and the copies in and out of them ([b, i, k] and [b, i, n]) are left out.
// x_proj and out_proj read [b, i, s] tensors transposed to [b, s, i]: PyTorch 1.13 runs such a Linear as a bmm
// over the view, PyTorch 2 folds the view into a contiguous [b * s, i] copy, which the matmul saves (the tracer
// finds both, at 1.13 and 2.15); for x_proj that copy is one more [b, s, i] tensor per layer.
//
// With mamba_ssm and causal_conv1d installed, transformers runs cuda_kernels_forward on a GPU instead, and
// training goes through one autograd Function, mamba_inner_fn (mamba_ssm/ops/selective_scan_interface.py,
// MambaInnerFn.forward, checkpoint_lvl=1): it saves xz (in_proj's output made contiguous, [b, 2i, s]), x_dbl
// ([b*s, r + 2n]), contiguous B and C ([b, 1, n, s]), A, D, the selective_scan_cuda kernel's scan_intermediates
// (x: [b, i, ceil(s / 2048), 2n] f32, csrc/selective_scan/selective_scan.cpp) and its output out [b, i, s], and
// recomputes conv1d's output and delta in backward: nothing of size [b, i, s, n]. That path is NOT modelled:
// --kernels cuda builds the same slow_forward graph, which is what transformers runs on a GPU without those
// packages, and overstates the fused kernels' activations by the [b, i, s, n] tensors above.
TensorId Builder::MambaMixer(const std::string& prefix, TensorId x) {
  const int64_t b = o_.batch, s = o_.seq_len, h = c_.hidden_size, inner = c_.intermediate_size;
  const int64_t n = c_.ssm_state_size, rank = c_.time_step_rank, k = c_.conv_kernel;
  const std::string p = prefix + ".";
  const DType dtype = g_.tensor(x).dtype;  // slow_forward's `dtype`: its input's
  TensorId projected = Proj(p + "in_proj", x, h, 2 * inner, c_.mlp_bias, Parallel::kColumn);
  // .transpose(1, 2).chunk(2, dim=1): two strided views of in_proj's output.
  TensorId hidden = e_.View(p + "hidden_states", projected, {b, inner, s});
  TensorId gate = e_.View(p + "gate", projected, {b, inner, s});
  TensorId conv_weight = Param(p + "conv1d.weight", {inner, 1, k});
  TensorId conv_bias = c_.conv_bias ? Param(p + "conv1d.bias", {inner}) : kNone;
  TensorId conv = e_.Conv1d(p + "conv1d", hidden, conv_weight, conv_bias, 1, k - 1);
  TensorId u = Activation(p + "act", e_.View(p + "conv1d.causal", conv, {b, inner, s}));
  // Note [Mamba]: a Linear over a transposed [b, s, i] view; PyTorch 2 folds it through a contiguous copy.
  auto transposed_input = [&](const std::string& name, TensorId channels_first) {
    TensorId view = e_.View(name, channels_first, {b, s, inner});
    return o_.runtime.major >= 2 ? e_.Contiguous(name + ".fold", view) : view;
  };
  TensorId ssm = Proj(p + "x_proj", transposed_input(p + "x_proj.input", u), inner, rank + 2 * n, false,
                      Parallel::kReplicated);
  TensorId time_step = e_.View(p + "time_step", ssm, {b, s, rank});
  TensorId b_param = e_.View(p + "B", ssm, {b, 1, s, n});
  TensorId c_param = e_.View(p + "C", ssm, {b, s, n});
  TensorId dt = Proj(p + "dt_proj", time_step, rank, inner, true, Parallel::kReplicated);
  // CUDA autocast runs softplus in f32 (its fp32 op list).
  if (e_.options().autocast && o_.runtime.kernels == Kernels::kCuda) {
    dt = e_.Cast(p + "softplus.input_cast", dt, e_.options().autocast_wide_dtype);
  }
  dt = e_.Activation(p + "softplus", ActivationKind::kSoftplus, dt);
  TensorId dt_t = e_.View(p + "dt_transposed", dt, {b, inner, s, 1});
  TensorId a_log = Param(p + "A_log", {inner, n});
  TensorId a = e_.Scale(p + "A_neg", e_.Exp(p + "A_exp", e_.Cast(p + "A_log_float", a_log, DType::kF32)));
  TensorId delta_a = e_.Exp(p + "deltaA", e_.Mul(p + "A_dt", e_.View(p + "A_broadcast", a, {1, inner, 1, n}), dt_t));
  TensorId delta_b = e_.Mul(p + "deltaB", dt_t, e_.Cast(p + "B_float", b_param, DType::kF32));
  TensorId u_wide = e_.Cast(p + "u_float", e_.View(p + "u_broadcast", u, {b, inner, s, 1}), DType::kF32);
  TensorId delta_b_u = e_.Mul(p + "deltaB_u", delta_b, u_wide);
  TensorId state0 = e_.Zeros(p + "ssm_state", {b, inner, n}, dtype);
  // The loop's matmul runs in `dtype`, or autocast's compute dtype.
  const DType matmul_dtype = e_.options().autocast ? o_.compute_dtype : dtype;
  const OpEmitter::Scan scan = e_.SelectiveScan(p + "scan", delta_a, delta_b_u, c_param, state0, matmul_dtype);
  TensorId d = Param(p + "D", {inner});
  TensorId y = e_.Add(p + "add_skip", scan.y, e_.Mul(p + "skip", u, e_.View(p + "D_broadcast", d, {1, inner, 1})));
  y = e_.Mul(p + "gated", y, Activation(p + "gate_act", gate));
  TensorId out = Proj(p + "out_proj", transposed_input(p + "out_proj.input", y), inner, h, c_.mlp_bias,
                      Parallel::kRow);
  std::vector<TensorId> locals = {delta_a, delta_b, delta_b_u};
  if (scan.last_state != kNone) locals.push_back(scan.last_state);
  e_.ScopeEnd(p + "returns", std::move(locals));
  return out;
}

absl::Status Builder::BuildMamba() {
  const int64_t b = o_.batch, s = o_.seq_len, h = c_.hidden_size, vocab = c_.vocab_size;
  e_.set_layer(-1);
  TensorId ids = e_.Input("input_ids", {b, s}, DType::kI64);
  TensorId table = Param("backbone.embeddings.weight", {vocab, h});
  TensorId x = e_.Embedding("backbone.embeddings", ids, table);
  for (int64_t i = 0; i < c_.num_layers; ++i) {
    e_.set_layer(static_cast<int>(i));
    const std::string p = absl::StrFormat("backbone.layers.%d.", i);
    TensorId residual = x;
    TensorId normed = Norm(p + "norm", e_.Cast(p + "norm.input_cast", x, o_.param_dtype));
    if (c_.residual_in_fp32) residual = e_.Cast(p + "residual_float", residual, DType::kF32);
    x = e_.Add(p + "residual", residual, MambaMixer(p + "mixer", normed));
    HEADROOM_RETURN_IF_ERROR(CheckGraphSize(i));
  }
  e_.set_layer(-1);
  TensorId normed = Norm("backbone.norm_f", x);
  TensorId logits = Proj("lm_head", e_.Cast("lm_head.input_cast", normed, o_.param_dtype), h, vocab, false,
                         Parallel::kColumn, false, kNone, c_.tie_word_embeddings ? table : kNone);
  logits = e_.Cast("logits_float", logits, DType::kF32);
  if (o_.training) {
    if (s > 1) CausalLmLoss(logits, vocab);
    else Loss(logits, b * s, vocab);
  }
  return absl::OkStatus();
}

}  // namespace headroom::builders_internal

// Decoder blocks: MLPs, mixtures of experts (Mixtral, Qwen-MoE, DeepSeek, GPT-OSS, Llama 4) and the stack.
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "common/checked_math.h"
#include "common/status_macros.h"
#include "models/builder.h"

namespace headroom::builders_internal {

// Note [Gemma decoders]
// Gemma keeps Llama's block and changes what is computed in it
// (transformers' modeling_gemma.py, modeling_gemma2.py and modeling_gemma3.py):
//  - GemmaRMSNorm normalizes in f32 and scales by (1 + weight) before
//    casting back, so eager autograd keeps the normalized tensor in f32
//    (Llama casts it to the input dtype first) and the f32 (1 + weight);
//  - the embeddings are multiplied by sqrt(hidden_size), a new tensor;
//  - the MLP is GeGLU with the tanh GELU, and the embeddings are tied;
// and Gemma 2 adds
//  - a norm after attention and after the MLP besides the ones before
//    (input, post_attention, pre_feedforward and post_feedforward norms);
//  - soft-capping of the attention scores (eager attention) and of the final
//    logits: x / cap, tanh, * cap, three more score- or logits-sized tensors
//    in flight, and tanh keeps its output for backward;
//  - sliding-window attention in every other layer (even layer indices). The
//    eager kernel still builds s x s scores (the window is in the mask); the
//    window shows in inference, where a sliding layer caches at most
//    sliding_window tokens (Note [Sliding-window KV cache] in
//    estimators/kv_cache.h).
// Gemma 3 (Gemma3ForCausalLM, model_type gemma3_text) keeps Gemma 2's four
// norms per layer and changes
//  - the pattern: five sliding-window layers to one global one (layer i is
//    global when (i + 1) % sliding_window_pattern == 0, or as layer_types
//    lists); the sliding layers rotate q and k with a second rotary table
//    (rope_local_base_freq), both tables built once per forward;
//  - q_norm and k_norm over head_dim, in Gemma's (1 + weight) f32 form;
//  - the scores' scale, query_pre_attn_scalar^-1/2 (a value, not a size);
//  - no soft-capping in the released configs (both caps null).
// Qwen3 is Llama with an RMSNorm over head_dim on q and k before the rotary
// embedding (q_norm, k_norm), which keeps its own tensors in eager mode.
//
// Note [OLMo 2]
// OLMo 2 (transformers' modeling_olmo2.py) is Llama with two changes:
//  - the norms sit on the branches' outputs, not their inputs:
//    x = x + post_attention_layernorm(attn(x)), then
//    x = x + post_feedforward_layernorm(mlp(x)); there is no input_layernorm,
//    so the q/k/v projections save the residual stream itself;
//  - q_norm and k_norm are RMSNorms over the whole q and k projections
//    (num_heads x head_dim and num_key_value_heads x head_dim features), applied
//    before the heads are split and the rotary embedding, where Qwen3's
//    normalize each head. In eager mode they keep Llama's norm tensors at the
//    projections' width.

TensorId Builder::Mlp(const std::string& prefix, TensorId x, TensorId x_shard) {
  // Llama 4 names its dense MLP and its MoE block feed_forward.
  const std::string mlp = c_.model_type == "llama4_text" ? "feed_forward." : "mlp.";
  if (c_.is_moe_layer(e_.layer())) {
    // transformers 4 named Mixtral's MoE block block_sparse_moe; 5 names it mlp, as the other families.
    const bool mixtral4 = c_.model_type == "mixtral" && !o_.runtime.transformers.AtLeast(5, 0);
    return Moe(prefix + (mixtral4 ? "block_sparse_moe." : mlp), x, x_shard);
  }
  const int64_t h = c_.hidden_size, inner = c_.intermediate_size / t_;
  TensorId y;
  std::string down;
  if (c_.gated_mlp && mlp != "mlp.") {
    TensorId gate = Proj(prefix + mlp + "gate_proj", x, h, inner, c_.mlp_bias, Parallel::kColumn, false, x_shard);
    TensorId up = Proj(prefix + mlp + "up_proj", x, h, inner, c_.mlp_bias, Parallel::kColumn, false, x_shard);
    TensorId prod = e_.Mul(prefix + mlp + "gate_mul", Activation(prefix + mlp + "act_fn", gate), up);
    down = prefix + mlp + "down_proj";
    y = Proj(down, prod, inner, h, c_.mlp_bias, Parallel::kRow);
  } else if (c_.gated_mlp) {
    TensorId gate, up;
    if (c_.fused_gate_up) {
      // Phi-3: gate and up are the two chunks of one projection's output.
      TensorId both = Proj(prefix + "mlp.gate_up_proj", x, h, 2 * inner, c_.mlp_bias, Parallel::kColumn, false,
                           x_shard);
      std::vector<int64_t> half = g_.tensor(both).shape;
      half.back() = inner;
      gate = e_.View(prefix + "mlp.gate", both, half);
      up = e_.View(prefix + "mlp.up", both, half);
    } else {
      gate = Proj(prefix + "mlp.gate_proj", x, h, inner, c_.mlp_bias, Parallel::kColumn, false, x_shard);
      up = Proj(prefix + "mlp.up_proj", x, h, inner, c_.mlp_bias, Parallel::kColumn, false, x_shard);
    }
    TensorId act = Activation(prefix + "mlp.act_fn", gate);
    TensorId prod = e_.Mul(prefix + "mlp.gate_mul", act, up);
    down = prefix + "mlp.down_proj";
    y = Proj(down, prod, inner, h, c_.mlp_bias, Parallel::kRow);
  } else {
    std::string up_name, down_name;
    bool conv1d = false;
    if (c_.model_type == "gpt2") {
      up_name = "mlp.c_fc", down_name = "mlp.c_proj", conv1d = true;
    } else if (c_.model_type == "starcoder2" || c_.model_type == "gpt_bigcode") {
      up_name = "mlp.c_fc", down_name = "mlp.c_proj";  // GPT-2's names on nn.Linear
    } else if (c_.model_type == "opt") {
      up_name = "fc1", down_name = "fc2";
    } else if (c_.model_type.starts_with("clip_") || c_.model_type.starts_with("siglip_") ||
               (c_.model_type == "vit" && o_.runtime.transformers.AtLeast(5, 9))) {
      up_name = "mlp.fc1", down_name = "mlp.fc2";  // CLIPMLP, SiglipMLP; ViTMLP (Note [ViT in transformers 5.9])
    } else if (c_.model_type == "gptj") {
      up_name = "mlp.fc_in", down_name = "mlp.fc_out";
    } else if (c_.model_type == "gpt_neox" || c_.model_type == "falcon" || c_.model_type == "bloom") {
      up_name = "mlp.dense_h_to_4h", down_name = "mlp.dense_4h_to_h";
    } else {
      up_name = "intermediate.dense", down_name = "output.dense";
    }
    TensorId up = Proj(prefix + up_name, x, h, inner, c_.mlp_bias, Parallel::kColumn, conv1d,
                       x_shard);
    TensorId act = Activation(prefix + up_name + ".act", up);
    down = prefix + down_name;
    y = Proj(down, act, inner, h, c_.mlp_bias, Parallel::kRow, conv1d);
  }
  return ReduceOutput(down, y);
}

// Note [MoE routing] in builders.h: balanced routing, tokens*top_k/experts
// rows per expert, through stacked experts under grouped_mm at transformers 5
// (Note [Grouped experts]) or transformers 4's loop over nn.Linear experts
// (gather rows, expert MLP, scale by routing weight, index_add into the output).
TensorId Builder::Moe(const std::string& prefix, TensorId x, TensorId x_shard) {
  const int64_t h = c_.hidden_size;
  if (c_.model_type == "gpt_oss" || c_.model_type == "llama4_text") {
    TensorId flat = e_.View(prefix + "flatten", x, {o_.batch * o_.seq_len, h});
    TensorId y = c_.model_type == "gpt_oss" ? GptOssExperts(prefix, flat) : Llama4Moe(prefix, flat);
    return ReduceOutput(prefix + "experts", y);
  }
  const int64_t inner = (c_.moe_intermediate_size > 0 ? c_.moe_intermediate_size : c_.intermediate_size) / t_;
  const int64_t tokens = o_.batch * o_.seq_len;
  TensorId flat = e_.View(prefix + "flatten", x, {tokens, h});
  TensorId logits = Proj(prefix + "gate", flat, h, c_.num_experts, false, Parallel::kReplicated,
                         false, x_shard);
  if (c_.router_bias) {
    // DeepSeek-V3's noaux_tc routing: a per-expert bias added to the scores for choosing experts only.
    TensorId bias = Param(prefix + "gate.e_score_correction_bias", {c_.num_experts});
    logits = e_.Add(prefix + "gate.score_bias", logits, bias);
  }
  OpEmitter::Routing routing =
      e_.RouterTopK(prefix + "router", logits, c_.experts_per_token);
  TensorId acc;
  if (o_.runtime.transformers.AtLeast(5, 0)) {
    acc = StackedExperts(prefix + "experts.", flat, routing.indices, routing.weights, inner);
  } else {
    acc = LoopedExperts(prefix, flat, routing, inner);
  }
  if (c_.shared_expert_intermediate_size > 0) {
    // Every token also goes through the shared expert(s): Qwen2-MoE's one, scaled by
    // sigmoid(shared_expert_gate(x)); DeepSeek's n_shared_experts, fused into one MLP, ungated.
    const std::string sh = prefix + (c_.shared_expert_gated ? "shared_expert." : "shared_experts.");
    const int64_t shared_inner = c_.shared_expert_intermediate_size / t_;
    TensorId g = Proj(sh + "gate_proj", flat, h, shared_inner, false, Parallel::kColumn);
    TensorId u = Proj(sh + "up_proj", flat, h, shared_inner, false, Parallel::kColumn);
    TensorId prod = e_.Mul(sh + "gate_mul", Activation(sh + "act_fn", g), u);
    TensorId out = Proj(sh + "down_proj", prod, shared_inner, h, false, Parallel::kRow);
    if (c_.shared_expert_gated) {
      TensorId gate = Proj(prefix + "shared_expert_gate", flat, h, 1, false, Parallel::kReplicated);
      out = e_.Mul(sh + "gated", e_.Activation(sh + "sigmoid", ActivationKind::kSigmoid, gate), out);
    }
    acc = e_.Add(prefix + "shared_add", acc, out);
  }
  TensorId y = e_.View(prefix + "unflatten", acc, {o_.batch, o_.seq_len, h});
  return ReduceOutput(prefix + "experts", y);
}

// Note [GPT-OSS]
// GptOssForCausalLM (transformers 5's modeling_gpt_oss.py; OpenAI's gpt-oss-20b and gpt-oss-120b) is a
// pre-norm decoder of Llama's shape with these departures:
//  - attention: biased q/k/v/o and a learned sink logit per head (self_attn.sinks). Eager attention
//    concatenates the sinks to the masked scores as one more column ([b, heads, s, s + 1]), subtracts each
//    row's max (max(dim=-1) saves its indices), takes the softmax in the scores' own dtype (not f32) and drops
//    the sink column as a view, so the matmul with v keeps the whole s + 1 wide probabilities. The model
//    declares no SDPA path (_supports_sdpa False); --attention flash models a kernel that takes the sinks
//    (FlashAttention-3's s_aux, the kernels-community/vllm-flash-attn3 path), which saves them beside q, k and
//    v. Even layers attend within sliding_window (128) tokens, odd ones to everything (layer_types); the window
//    shows in inference, where a sliding layer caches at most 128 tokens (Note [Sliding-window KV cache] in
//    estimators/kv_cache.h). YaRN rotary scales cos and sin, which changes no size;
//  - GptOssRMSNorm multiplies by its weight in f32 before casting back, so eager autograd keeps the f32
//    normalized tensor (Llama's casts first);
//  - every layer is MoE: router (a Linear with bias) -> topk -> softmax over the k chosen logits; the experts
//    are three fused parameters per layer, experts.gate_up_proj [E, hidden, 2 x intermediate] with
//    gate_up_proj_bias [E, 2 x intermediate], and experts.down_proj [E, intermediate, hidden] with
//    down_proj_bias [E, hidden]. transformers 5 runs them through grouped_mm (its default experts
//    implementation on CUDA, integrations/moe.py): the token rows sorted by expert (a gather of
//    tokens x top_k rows), the per-row bias gathered and added in place, one grouped GEMM up, the clamped
//    SwiGLU with alpha on the interleaved gate (even) and up (odd) columns
//      gate = clamp(gate, max=limit); up = clamp(up, -limit, limit); out = (up + 1) * gate * sigmoid(alpha * gate)
//    whose clamps keep the up projection's output alive and whose products keep four intermediate-wide tensors,
//    one grouped GEMM down with its gathered bias, the routing weight applied, the rows restored to token
//    order and summed over top_k. Note [MoE routing] sets how many rows each expert gets; a grouped GEMM over
//    [E, rows, hidden] is what the graph holds. The routing's integer tensors are kept for backward too: each
//    row's token, the sorted expert ids, the permutation and its inverse (int64, one per row) and the experts'
//    offsets (int32), as the tracer finds at transformers 5.24 on the meta device (the CPU's experts path, the
//    same grouped_mm). transformers 4.55 to 4.57 looped over the experts in Python instead: refused for
//    --transformers before 5.0.
// Weights: the released checkpoints store the experts in MXFP4 (4.25 bits per weight with the scales), which
// transformers keeps packed only for inference with its MXFP4 Triton kernels and otherwise (training, or
// without the kernels) dequantizes to bf16 at load. Headroom models the latter: every expert weight at
// --param-dtype (bf16 in practice), as HF holds it while training; a server keeping MXFP4 experts holds about
// 0.27 of those bytes. Under autocast (f32 weights) the grouped GEMMs run in f32 (Note [grouped_mm under
// autocast] in graph/ops.cc). A known simplification: there the sink softmax is modelled in f32 where
// transformers keeps the scores' dtype.
TensorId Builder::GptOssExperts(const std::string& prefix, TensorId flat) {
  const int64_t h = c_.hidden_size;
  TensorId logits = Proj(prefix + "router", flat, h, c_.num_experts, /*bias=*/true, Parallel::kReplicated);
  const OpEmitter::Selection top = e_.TopK(prefix + "router.topk", "topk", logits, c_.experts_per_token);
  TensorId scores = e_.Softmax(prefix + "router.softmax", top.values);
  return e_.View(prefix + "unflatten",
                 StackedExperts(prefix + "experts.", flat, top.indices, scores, c_.intermediate_size / t_),
                 {o_.batch, o_.seq_len, h});
}

Builder::ExpertRows Builder::SortRowsByExpert(const std::string& ex, TensorId flat, TensorId indices,
                                              TensorId weights, int64_t experts, int64_t top_k) {
  const int64_t h = c_.hidden_size, tokens = g_.tensor(flat).shape[0];
  // Note [MoE routing]: balanced, `rows` per expert.
  const int64_t rows = CeilDiv(tokens * top_k, experts), routed = rows * experts;
  // The routing's integers, which the gathers and grouped matmuls keep for backward: each routed row's token,
  // the rows sorted by expert (the sorted expert ids and the permutation), its inverse, the experts' offsets.
  TensorId token_of_row = e_.Materialize(ex + "token_index", "floor_divide", {indices}, {routed}, DType::kI64);
  TensorId sorted_experts = e_.Materialize(ex + "sorted_experts", "sort", {indices}, {routed}, DType::kI64);
  TensorId permutation = e_.Materialize(ex + "permutation", "sort", {indices}, {routed}, DType::kI64);
  TensorId offsets = e_.Materialize(ex + "offsets", "cumsum", {sorted_experts}, {experts}, DType::kI32);
  TensorId dispatched = e_.View(ex + "dispatch_rows", e_.GatherRows(ex + "dispatch", flat, routed, token_of_row),
                                {experts, rows, h});
  TensorId sorted_weights = e_.GatherRows(
      ex + "routing_weights", e_.View(ex + "scores_flat", weights, {tokens * top_k, 1}), routed, permutation);
  return {.rows = dispatched, .weights = sorted_weights, .sorted_experts = sorted_experts,
          .permutation = permutation, .offsets = offsets, .experts = experts, .per_expert = rows, .top_k = top_k};
}

TensorId Builder::WeighAndRestoreTokenOrder(const std::string& ex, TensorId out, const ExpertRows& sorted) {
  const int64_t h = c_.hidden_size;
  const int64_t routed = sorted.per_expert * sorted.experts, tokens = routed / sorted.top_k;
  TensorId weighted = e_.Mul(ex + "weighted", e_.View(ex + "out_rows", out, {routed, h}), sorted.weights);
  TensorId inverse =
      e_.Materialize(ex + "inverse_permutation", "index_put", {sorted.permutation}, {routed}, DType::kI64);
  TensorId restored = e_.GatherRows(ex + "unpermute", weighted, routed, inverse);
  return e_.Materialize(ex + "sum_top_k", "sum", {e_.View(ex + "per_token", restored, {tokens, sorted.top_k, h})},
                        {tokens, h}, g_.tensor(restored).dtype);
}

// Note [Grouped experts]
// transformers 5 stacks a MoE layer's experts into two parameters, experts.gate_up_proj [E, 2 x inner, hidden]
// and experts.down_proj [E, hidden, inner] (Mixtral, Qwen2-MoE, Qwen3-MoE, DeepSeek-V2 and V3, each
// decorated @use_experts_implementation), and runs them through grouped_mm unless told otherwise
// (PreTrainedModel.get_correct_experts_implementation; integrations/moe.py, grouped_mm_experts_forward, read
// at 5.24): the rows sorted by expert as GPT-OSS's are (SortRowsByExpert, Note [GPT-OSS]), one grouped GEMM
// up against gate_up_proj transposed (a view), gate and up as chunks of its output (views, so the activation's
// saved input keeps the whole product), act(gate) * up, one grouped GEMM down against down_proj transposed,
// the routing weight applied and the rows restored to token order and summed over top_k. transformers 4 looped
// over the experts in Python with one nn.Linear per projection (LoopedExperts), which the graph also holds when
// --transformers is before 5.0. bitsandbytes quantizes nn.Linear modules only, so under QLoRA the stacked
// experts stay at the parameters' dtype, as they do in transformers 5.
//
// Note [Expert parallelism in the graph]
// Under --ep the graph is one rank's: its 1/ep of the stacked experts (so ParameterShare in
// estimators/model_states.h leaves them whole; transformers 4's per-expert modules are all built and divided
// there), reached as transformers 5's AllToAllEP reaches them (transformers/distributed/expert_parallel.py,
// read at 5.24): the (token, choice) rows sorted by expert and gathered (hidden_states[order // top_k]), sent
// to their experts' ranks by a differentiable all-to-all, run through the rank's experts as top-1 rows of unit
// weight, with the sentinel masks' out-of-place copies of both GEMMs' outputs that the experts forward makes
// under expert parallelism, sent back by a second all-to-all, put back in (token, choice) order (an index_put
// into a new tensor, which the routing weights' product keeps) and summed over the choices. Routing is
// balanced (Note [MoE routing]), so a rank receives as many rows as it sends, tokens x top_k.
TensorId Builder::StackedExperts(const std::string& ex, TensorId flat, TensorId indices, TensorId weights,
                                 int64_t inner) {
  const int64_t ep = o_.expert_parallel;
  const int64_t experts = c_.num_experts / ep, top_k = c_.experts_per_token;
  if (ep == 1) return ExpertsForward(ex, flat, indices, weights, inner, experts, top_k);
  const int64_t h = c_.hidden_size, tokens = g_.tensor(flat).shape[0], routed = tokens * top_k;
  const DType dtype = g_.tensor(flat).dtype;
  TensorId order = e_.Materialize(ex + "ep.order", "argsort", {indices}, {routed}, DType::kI64);
  TensorId token_of_row = e_.Materialize(ex + "ep.token_index", "floor_divide", {order}, {routed}, DType::kI64);
  TensorId send = e_.GatherRows(ex + "ep.send", flat, routed, token_of_row);
  TensorId received = e_.Materialize(ex + "ep.dispatch", "all_to_all", {send}, {routed, h}, dtype);
  TensorId local_ids = e_.Materialize(ex + "ep.local_ids", "repeat_interleave", {order}, {routed, 1}, DType::kI64);
  TensorId ones = e_.Materialize(ex + "ep.unit_weights", "ones_like", {local_ids}, {routed, 1}, dtype);
  TensorId out = ExpertsForward(ex, received, local_ids, ones, inner, experts, /*top_k=*/1);
  TensorId returned = e_.Materialize(ex + "ep.combine", "all_to_all", {out}, {routed, h}, g_.tensor(out).dtype);
  TensorId in_order = e_.Materialize(ex + "ep.token_outputs", "index_put", {returned}, {tokens, top_k, h},
                                     g_.tensor(returned).dtype);
  TensorId weighted = e_.Mul(ex + "ep.weighted", in_order, e_.View(ex + "ep.weights", weights, {tokens, top_k, 1}));
  return e_.Materialize(ex + "ep.sum_top_k", "sum", {weighted}, {tokens, h}, g_.tensor(weighted).dtype);
}

TensorId Builder::ExpertsForward(const std::string& ex, TensorId rows_in, TensorId indices, TensorId weights,
                                 int64_t inner, int64_t experts, int64_t top_k) {
  const bool gpt_oss = c_.model_type == "gpt_oss";
  const bool sentinels = o_.expert_parallel > 1;  // Note [Expert parallelism in the graph]
  const int64_t h = c_.hidden_size;
  const ExpertRows sorted = SortRowsByExpert(ex, rows_in, indices, weights, experts, top_k);
  const int64_t rows = sorted.per_expert, routed = rows * experts;
  auto mask_sentinels = [&](const std::string& name, TensorId x) {
    return sentinels ? e_.Materialize(name, "masked_fill", {x}, g_.tensor(x).shape, g_.tensor(x).dtype) : x;
  };
  if (!gpt_oss) {
    TensorId gate_up_w = Param(ex + "gate_up_proj", {experts, 2 * inner, h});
    TensorId gate_up = mask_sentinels(
        ex + "gate_up_masked",
        e_.GroupedMatMul(ex + "gate_up_grouped_mm", sorted.rows, gate_up_w, sorted.offsets, /*b_transposed=*/true));
    TensorId gate = e_.View(ex + "gate", gate_up, {experts, rows, inner});
    TensorId up = e_.View(ex + "up", gate_up, {experts, rows, inner});
    TensorId prod = e_.Mul(ex + "gate_mul", Activation(ex + "act_fn", gate), up);
    TensorId down_w = Param(ex + "down_proj", {experts, h, inner});
    TensorId out = mask_sentinels(
        ex + "down_masked",
        e_.GroupedMatMul(ex + "down_grouped_mm", prod, down_w, sorted.offsets, /*b_transposed=*/true));
    return WeighAndRestoreTokenOrder(ex, out, sorted);
  }
  // GPT-OSS (Note [GPT-OSS]): weights stored [E, in, out], biases gathered per row, the clamped SwiGLU.
  TensorId gate_up_w = Param(ex + "gate_up_proj", {experts, h, 2 * inner});
  TensorId gate_up_b = Param(ex + "gate_up_proj_bias", {experts, 2 * inner});
  TensorId gate_up = e_.GroupedMatMul(ex + "gate_up_grouped_mm", sorted.rows, gate_up_w, sorted.offsets);
  TensorId bias_rows = e_.GatherRows(ex + "gate_up_proj_bias.gather", gate_up_b, routed, sorted.sorted_experts);
  gate_up = e_.AddInplace(ex + "gate_up_bias_add", gate_up,
                          e_.View(ex + "gate_up_proj_bias.rows", bias_rows, {experts, rows, 2 * inner}));
  gate_up = mask_sentinels(ex + "gate_up_masked", gate_up);
  // gate_up[..., ::2] and gate_up[..., 1::2]: strided views.
  TensorId gate = e_.Clamp(ex + "gate_clamp", e_.View(ex + "gate", gate_up, {experts, rows, inner}));
  TensorId up = e_.Clamp(ex + "up_clamp", e_.View(ex + "up", gate_up, {experts, rows, inner}));
  TensorId sig = e_.Activation(ex + "sigmoid", ActivationKind::kSigmoid, e_.Scale(ex + "alpha", gate));
  TensorId glu = e_.Mul(ex + "glu", gate, sig);
  TensorId gated = e_.Mul(ex + "gated", e_.Scale(ex + "up_plus_one", up), glu);
  TensorId down_w = Param(ex + "down_proj", {experts, inner, h});
  TensorId down_b = Param(ex + "down_proj_bias", {experts, h});
  TensorId out = e_.GroupedMatMul(ex + "down_grouped_mm", gated, down_w, sorted.offsets);
  TensorId down_rows = e_.GatherRows(ex + "down_proj_bias.gather", down_b, routed, sorted.sorted_experts);
  out = e_.AddInplace(ex + "down_bias_add", out, e_.View(ex + "down_proj_bias.rows", down_rows, {experts, rows, h}));
  return WeighAndRestoreTokenOrder(ex, mask_sentinels(ex + "down_masked", out), sorted);
}

TensorId Builder::LoopedExperts(const std::string& prefix, TensorId flat, const OpEmitter::Routing& routing,
                                int64_t inner) {
  const int64_t h = c_.hidden_size, tokens = g_.tensor(flat).shape[0];
  // Expert projections as each family names them: Mixtral's w1 (gate), w3 (up), w2 (down).
  const bool mixtral = c_.model_type == "mixtral";
  const std::string gate_name = mixtral ? "w1" : "gate_proj", up_name = mixtral ? "w3" : "up_proj",
                    down_name = mixtral ? "w2" : "down_proj";
  TensorId acc = e_.Zeros(prefix + "final_hidden_states", {tokens, h}, g_.tensor(flat).dtype);
  const int64_t rows = CeilDiv(tokens * c_.experts_per_token, c_.num_experts);
  for (int64_t j = 0; j < c_.num_experts; ++j) {
    const std::string ex = absl::StrFormat("%sexperts.%d.", prefix, j);
    TensorId in = e_.GatherRows(ex + "dispatch", flat, rows);
    TensorId w1 = Proj(ex + gate_name, in, h, inner, false, Parallel::kColumn);
    TensorId w3 = Proj(ex + up_name, in, h, inner, false, Parallel::kColumn);
    TensorId act = Activation(ex + "act_fn", w1);
    TensorId prod = e_.Mul(ex + "gate_mul", act, w3);
    TensorId out = Proj(ex + down_name, prod, inner, h, false, Parallel::kRow);
    TensorId weight = e_.GatherRows(ex + "routing_weight", routing.weights, rows);
    TensorId weighted = e_.Mul(ex + "weighted", out, weight);
    acc = e_.IndexAdd(ex + "combine", acc, weighted);
  }
  return acc;
}

// Note [Llama 4]
// Llama4ForCausalLM (transformers 5's modeling_llama4.py; the text model of Llama 4 Scout and Maverick) keeps
// Llama's block and module names (feed_forward for the MLP) and changes:
//  - attention: the layers that rotate (no_rope_layers 1, three in four) rotate q and k as complex numbers in
//    f32 (x.float(), view_as_complex, times freqs_cis, type_as), then, with use_qk_norm, L2-normalize each
//    head's q and k without a weight (Llama4TextL2Norm, in f32: keeps the f32 copy and rstd); the other layers
//    (NoPE) rotate nothing and, with attn_temperature_tuning, multiply q by an f32 per-position scale and cast
//    back. Eager attention takes the softmax in the scores' dtype (no f32 upcast, no cast back);
//  - chunked attention: the rotating layers attend within chunks of attention_chunk_size tokens (8192), the
//    NoPE layers to everything. The eager kernel still builds s x s scores (the chunks are in the mask). For
//    the KV cache a chunked layer is a windowed layer of attention_chunk_size tokens: transformers' DynamicCache
//    gives chunked_attention layers a DynamicSlidingWindowLayer of that size, and a token never attends past
//    its chunk, so Headroom holds min(context, attention_chunk_size) tokens for them (ModelConfig's
//    sliding_layers and sliding_window), the full context for the NoPE layers;
//  - the MoE layers (interleave_moe_layer_step, or moe_layers) route top-k (1) by router logits but weigh each
//    token by sigmoid(logit) of its chosen experts only (scatter into -inf, sigmoid in f32) and apply that score
//    to the INPUT: transformers' Llama4TextMoe repeats every token for every expert, multiplies by its score
//    (zero for the experts not chosen) and runs all experts over all tokens with two bmm's over the fused
//    experts.gate_up_proj [E, hidden, 2 x intermediate] and experts.down_proj [E, intermediate, hidden],
//    then sums over experts and adds a shared expert (a plain SwiGLU MLP of intermediate_size). So the HF
//    module's activations and FLOPs are E times a token's, not top_k: Scout's 16 experts keep
//    16 x (2 x hidden + 4 x intermediate) values per token and layer. This is what the HF module runs and what
//    Headroom models; Note [MoE routing]'s balance does not enter. Dense layers are SwiGLU of
//    intermediate_size_mlp.
// The vision tower of Llama4ForConditionalGeneration is not modelled (ParseHfConfig refuses that class and
// asks for its text_config). Known simplification: a chunked layer's SDPA path builds a [b, 1, s, s] boolean
// mask that --attention flash does not hold.
TensorId Builder::Llama4Moe(const std::string& prefix, TensorId flat) {
  const int64_t h = c_.hidden_size, inner = c_.moe_intermediate_size / t_, experts = c_.num_experts;
  // Under --ep this rank's experts run over every token (Note [Expert parallelism in the graph]).
  const int64_t local = experts / o_.expert_parallel;
  const int64_t tokens = o_.batch * o_.seq_len;
  const DType dtype = g_.tensor(flat).dtype;
  TensorId logits = Proj(prefix + "router", flat, h, experts, false, Parallel::kReplicated);
  const OpEmitter::Selection top = e_.TopK(prefix + "router.topk", "topk", logits, c_.experts_per_token);
  // full_like(logits, -inf).scatter_(1, indices, values): an in-place scatter (its i64 index is not modelled).
  TensorId scattered = e_.IndexAdd(prefix + "router.scatter", e_.Zeros(prefix + "router.full_like", {tokens, experts},
                                                                        g_.tensor(logits).dtype),
                                   top.values);
  TensorId probs = e_.Activation(prefix + "router.sigmoid", ActivationKind::kSigmoid,
                                 e_.Cast(prefix + "router.float", scattered, DType::kF32));
  TensorId scores = e_.Cast(prefix + "router.to_dtype", probs, g_.tensor(logits).dtype);
  // hidden_states.repeat(E, 1) * scores.transpose(0, 1).reshape(-1, 1): the reshape of the transpose copies.
  TensorId repeated = e_.Materialize(prefix + "routed_in", "repeat", {flat}, {local * tokens, h}, dtype);
  TensorId column = e_.Contiguous(prefix + "scores_column",
                                  e_.View(prefix + "scores_transposed", scores, {local * tokens, 1}));
  TensorId routed = e_.Mul(prefix + "routed_scale", repeated, column);
  const std::string ex = prefix + "experts.";
  TensorId gate_up = e_.MatMul(ex + "gate_up_bmm", e_.View(ex + "per_expert", routed, {local, tokens, h}),
                               Param(ex + "gate_up_proj", {local, h, 2 * inner}));
  TensorId gate = e_.View(ex + "gate", gate_up, {local, tokens, inner});
  TensorId up = e_.View(ex + "up", gate_up, {local, tokens, inner});
  TensorId prod = e_.Mul(ex + "gate_mul", up, Activation(ex + "act_fn", gate));
  TensorId out = e_.MatMul(ex + "down_bmm", prod, Param(ex + "down_proj", {local, inner, h}));
  TensorId summed = e_.Materialize(ex + "sum_experts", "sum", {out}, {tokens, h}, g_.tensor(out).dtype);
  const std::string sh = prefix + "shared_expert.";
  const int64_t shared_inner = c_.shared_expert_intermediate_size / t_;
  TensorId g = Proj(sh + "gate_proj", flat, h, shared_inner, false, Parallel::kColumn);
  TensorId u = Proj(sh + "up_proj", flat, h, shared_inner, false, Parallel::kColumn);
  TensorId shared = Proj(sh + "down_proj", e_.Mul(sh + "gate_mul", Activation(sh + "act_fn", g), u), shared_inner, h,
                         false, Parallel::kRow);
  TensorId y = e_.AddInplace(prefix + "shared_add", shared, summed);
  return e_.View(prefix + "unflatten", y, {o_.batch, o_.seq_len, h});
}

absl::Status Builder::BuildDecoder(const MergeInputs& merge_inputs) {
  const int64_t b = o_.batch, s = o_.seq_len, h = c_.hidden_size;
  const int64_t s_local = sp_ ? s / t_ : s;
  // Megatron pads the vocabulary so every rank holds the same number of rows.
  const int64_t vocab = CeilDiv<int64_t>(c_.vocab_size, t_);
  const bool gpt2 = c_.model_type == "gpt2", opt = c_.model_type == "opt", falcon = c_.model_type == "falcon";
  const bool bigcode = c_.model_type == "gpt_bigcode";
  const DecoderNames names = DecoderNamesOf(c_);
  const std::string root = prefix_ + names.root;
  const std::string embed_name = root + names.embed + ".weight";
  // OPT's token embeddings (and lm_head) may be narrower than the blocks (Note [OPT]).
  const int64_t embed_dim = c_.word_embed_proj_dim > 0 ? c_.word_embed_proj_dim : h;

  e_.set_layer(-1);
  TensorId ids = e_.Input("input_ids", {b, s}, DType::kI64);
  TensorId table = Param(embed_name, {vocab, embed_dim});
  TensorId x = e_.Embedding(root + "embed", ids, table);
  if (t_ > 1) x = ReduceOutput(root + "embed", x);
  if (merge_inputs) {
    HEADROOM_ASSIGN_OR_RETURN(x, merge_inputs(ids, x));
  }
  if (bigcode) {
    // GPTBigCodeModel's causal mask: one tril(ones(n_positions, n_positions)) bool buffer for all layers.
    const int64_t n = c_.max_position_embeddings;
    e_.Buffer(root + "bias", {n, n}, DType::kBool);
  }
  if (gpt2 || bigcode) {
    TensorId positions = e_.Input("position_ids", {1, s_local}, DType::kI64);
    TensorId wpe = Param(root + "wpe.weight", {c_.max_position_embeddings, h});
    TensorId pos = e_.Embedding(root + "wpe", positions, wpe);
    x = e_.Add(root + "embed_add", x, pos);
  } else if (opt) {
    // Positions come from the attention mask's cumulative sum, one row per sequence.
    TensorId positions = e_.Input("position_ids", {b, s_local}, DType::kI64);
    TensorId table_rows = Param(root + "embed_positions.weight", {c_.max_position_embeddings + c_.position_offset, h});
    TensorId pos = e_.Embedding(root + "embed_positions", positions, table_rows);
    if (embed_dim != h) x = Proj(root + "project_in", x, embed_dim, h, false, Parallel::kReplicated);
    x = e_.Add(root + "embed_add", x, pos);
  }
  if (c_.embedding_norm) x = LayerNormModule(root + "word_embeddings_layernorm", x);  // Bloom
  x = e_.Dropout(root + "drop", x, c_.embedding_dropout);
  if (c_.embedding_scaled) x = e_.Scale(root + "embed_scale", x);  // Note [Gemma decoders]
  if (c_.positions == PositionKind::kAlibi) {
    // Note [Bloom]: built once from the attention mask in the hidden states' dtype, read by every layer.
    alibi_ = e_.Materialize(root + "alibi", "alibi", {}, {b * (c_.num_heads / t_), 1, s}, g_.tensor(x).dtype);
  }
  // GPT-J builds its tables in every layer (Note [GPT-J]).
  if (c_.positions == PositionKind::kRotary && c_.model_type != "gptj") {
    const auto rotary_dims = c_.is_mla() ? c_.qk_rope_head_dim
                                         : static_cast<int64_t>(static_cast<double>(c_.head_dim) * c_.rotary_pct);
    const DType dtype = e_.options().autocast ? o_.param_dtype : o_.compute_dtype;
    cos_ = e_.Buffer(root + "rotary_emb.cos", {s, rotary_dims}, dtype);
    sin_ = e_.Buffer(root + "rotary_emb.sin", {s, rotary_dims}, dtype);
    if (c_.local_rotary) {
      local_cos_ = e_.Buffer(root + "rotary_emb_local.cos", {s, rotary_dims}, dtype);
      local_sin_ = e_.Buffer(root + "rotary_emb_local.sin", {s, rotary_dims}, dtype);
    }
  }

  // Note [Python references in inference]: the eager causal mask, alive through the layers.
  TensorId causal_mask = kNone;
  if (!o_.training && o_.attention == AttentionImpl::kEager) {
    causal_mask = e_.Zeros(prefix_ + "model.causal_mask", {1, 1, s, s + 1}, g_.tensor(x).dtype);
  }
  for (int64_t i = 0; i < c_.num_layers; ++i) {
    e_.set_layer(first_layer_ + static_cast<int>(i));
    const std::string p = absl::StrFormat("%s%s.%d.", root, names.layers, i);
    const std::string n1 = p + names.norm1, n2 = p + names.norm2;
    TensorId residual = x;
    // Note [OLMo 2] and Note [OPT]: their attention reads the residual stream itself.
    const bool branch_output = c_.norm_placement == NormPlacement::kBranchOutput;
    const bool post_residual = c_.norm_placement == NormPlacement::kPostResidual;
    const std::string attn_in_name = branch_output || post_residual ? p + "self_attn" : n1;
    TensorId attn_in = branch_output || post_residual ? x : Norm(n1, x);
    // Falcon's new architecture norms both branches' inputs before attending (Note [Falcon]).
    TensorId mlp_norm = falcon && c_.parallel_residual && c_.branch_norms == 2 ? Norm(n2, residual) : kNone;
    const TensorId attn_full = GatherInput(attn_in_name, attn_in);
    TensorId attn = c_.is_mla() ? LatentAttention(p, attn_in) : Attention(p, attn_full, sp_ ? attn_in : kNone);
    // Note [Falcon]: one dropout after the parallel branches' sum, attention_dropout after a sequential attention.
    const double attn_dropout = !falcon ? c_.hidden_dropout : c_.parallel_residual ? 0.0 : c_.attention_dropout;
    attn = e_.Dropout(p + "attn_dropout", attn, attn_dropout);
    if (c_.parallel_residual) {
      // GPT-NeoX: x + attn(ln1(x)) + mlp(ln2(x)); Falcon-7B: x + attn(ln(x)) + mlp(ln(x)).
      TensorId mlp;
      if (c_.branch_norms == 1) {
        mlp = Mlp(p, attn_full, sp_ ? attn_in : kNone);
      } else {
        if (mlp_norm == kNone) mlp_norm = Norm(n2, residual);
        mlp = Mlp(p, GatherInput(n2, mlp_norm), sp_ ? mlp_norm : kNone);
      }
      if (falcon) {
        // mlp_output += attention_output, then dropout_add(mlp_output, residual, hidden_dropout).
        TensorId sum = e_.Dropout(p + "mlp_dropout", e_.AddInplace(p + "branch_add", mlp, attn), c_.hidden_dropout);
        x = e_.Add(p + "residual", residual, sum);
      } else {
        mlp = e_.Dropout(p + "mlp_dropout", mlp, c_.hidden_dropout);
        x = e_.Add(p + "residual", e_.Add(p + "branch_add", mlp, attn), residual);
      }
    } else if (c_.norm_placement == NormPlacement::kSandwich) {
      // Gemma 2: each branch is normed on the way in and on the way out.
      x = e_.Add(p + "attn_residual", residual, Norm(p + "post_attention_layernorm", attn));
      const std::string pre = p + "pre_feedforward_layernorm";
      TensorId ln2 = Norm(pre, x);
      TensorId mlp = Mlp(p, GatherInput(pre, ln2), sp_ ? ln2 : kNone);
      x = e_.Add(p + "mlp_residual", x, Norm(p + "post_feedforward_layernorm", mlp));
    } else if (branch_output) {
      x = e_.Add(p + "attn_residual", residual, Norm(p + "post_attention_layernorm", attn));
      TensorId mlp = Mlp(p, GatherInput(p + "mlp", x), sp_ ? x : kNone);
      x = e_.Add(p + "mlp_residual", x, Norm(p + "post_feedforward_layernorm", mlp));
    } else if (post_residual) {
      // opt-350m: LayerNorm(x + branch(x)), as BERT.
      x = Norm(n1, e_.Add(p + "attn_residual", residual, attn));
      TensorId mlp = Mlp(p, GatherInput(p + "mlp", x), sp_ ? x : kNone);
      mlp = e_.Dropout(p + "mlp_dropout", mlp, c_.hidden_dropout);
      x = Norm(n2, e_.Add(p + "mlp_residual", x, mlp));
    } else {
      // Bloom's apply_residual_connection_post_layernorm: each branch adds to its norm's output instead.
      x = e_.Add(p + "attn_residual", c_.residual_from_norm ? attn_in : residual, attn);
      TensorId ln2 = Norm(n2, x);
      TensorId mlp = Mlp(p, GatherInput(n2, ln2), sp_ ? ln2 : kNone);
      mlp = e_.Dropout(p + "mlp_dropout", mlp, c_.hidden_dropout);
      x = e_.Add(p + "mlp_residual", c_.residual_from_norm ? ln2 : x, mlp);
    }
    HEADROOM_RETURN_IF_ERROR(CheckGraphSize(i));
  }
  e_.set_layer(-1);
  if (causal_mask != kNone) e_.ScopeEnd(prefix_ + "model.layers_done", {causal_mask});
  const std::string final_norm = root + names.final_norm;
  if (c_.architecture == "GPT2Model") {
    Norm(final_norm, x);
    return absl::OkStatus();
  }
  TensorId normed = c_.final_norm ? Norm(final_norm, x) : x;
  if (embed_dim != h) normed = Proj(root + "project_out", normed, h, embed_dim, false, Parallel::kReplicated);
  TensorId head_in = GatherInput(final_norm, normed);
  TensorId logits = Proj(prefix_ + names.head, head_in, embed_dim, vocab, c_.lm_head_bias, Parallel::kColumn, false,
                         sp_ ? normed : kNone, c_.tie_word_embeddings ? table : kNone);
  if (c_.final_logit_softcap > 0) logits = SoftCap("final_logit_softcap", logits);
  if (o_.training) {
    // A single position has no next token to predict; its loss is taken unshifted.
    if (s > 1) CausalLmLoss(logits, vocab);
    else Loss(logits, b * s, vocab);
  }
  return absl::OkStatus();
}

}  // namespace headroom::builders_internal

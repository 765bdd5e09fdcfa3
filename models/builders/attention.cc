// Self-attention: every decoder family's and the encoders', GPT-J's rotary, DeepSeek's latent attention.
#include <string>
#include <tuple>
#include <vector>

#include "models/builder.h"

namespace headroom::builders_internal {

// Note [Python references in inference]
// A tensor lives until its last reference goes, not until its last reader
// runs: Hugging Face's attention forward keeps its input, q, k and v (the
// repeated copies under eager GQA) in locals until it returns, and its model
// forward keeps the causal mask it built (eager attention, [1, 1, s, s + 1]
// at prefill, in the activations' dtype) until the last layer is done.
// Training saves all of these for backward anyway; in inference they are the
// difference between the liveness rule and what the GPU holds, so inference
// graphs end each attention with a scope_end op reading them and keep the
// mask to the end of the layers.

// Note [Eager attention's scale and mask]
// transformers' shared eager attention (eager_attention_forward, the Llama
// family's) computes `torch.matmul(q, k^T) * scaling` and then `+ mask`: two
// kernels, each writing a new scores-sized tensor, the second in the dtype
// PyTorch promotes to (the mask has the hidden states' dtype, f32 under
// autocast over f32 weights, so bf16 scores become f32 there). The recorded
// H100 traces (validation/fixtures/cuda/traces) show exactly that sequence
// in every layer of the Llama, Qwen2, Mistral and LoRA runs; one fused op in
// its place left the cache's layout different, and the LoRA run's reserved
// bytes 7% low. Other families keep one masked_scale op (no recorded run
// shows them otherwise). The softmax then runs in f32 (dtype=torch.float32,
// a copy first where the scores are bf16: OpEmitter::Softmax) and its result
// is cast back in the same statement, so the masked scores stay referenced
// until the cast is done, as the pure-bf16 trace shows.

// Note [OPT]
// OPTForCausalLM (transformers 4.46's modeling_opt.py) is a GPT-style decoder
// under the names model.decoder.*:
//  - learned positions from the attention mask's cumulative sum, looked up
//    two rows on (embed_positions has max_position_embeddings + 2 rows);
//  - token embeddings of word_embed_proj_dim, brought to hidden_size by
//    project_in and back by project_out before the tied lm_head when the two
//    differ (opt-350m: 512 and 1024);
//  - LayerNorm before each branch (do_layer_norm_before, every size but
//    350m) or after each residual add (350m, which then has no final norm);
//  - q_proj(x) * head_dim^-1/2 as its own tensor, q/k/v/out_proj with bias,
//    fc1, ReLU, fc2, and dropout after attention and after fc2;
//  - eager attention adds the mask, then clamps with torch.max(scores,
//    finfo.min), whose backward keeps the masked scores: one more
//    score-sized tensor per layer than Llama; softmax runs in f32 for f16
//    scores only, with no logits upcast before the loss.

// Note [transformers versions]
// The builders follow transformers' modeling code, which changes between
// releases. Checked against the tracer (python/tests) at 4.46.3 and 5.24.0,
// every family builds alike in both except three, whose changes were found
// by reading each release's modeling file in between:
//  - OPT (4.49): the clamp of the scores and the f16-only upcast are gone;
//    the attention is Llama's (softmax in f32, cast back);
//  - GPTBigCode (4.54): multi-query attention goes through the shared eager
//    attention, which repeats the key and value head for every query head
//    (repeat_kv) instead of folding the heads into one bmm;
//  - T5 (5.0): T5Config forces tie_word_embeddings and the lm_head is the
//    shared embedding even for v1.1 and Flan-T5, whose checkpoints carry an
//    lm_head of their own; the decoder output is still rescaled only when
//    the config.json asks for tied embeddings. The position bias is no longer
//    masked and batch-wide: the mask goes to each block's scores (Note [T5];
//    read at 5.24 and taken to come with 5.0, the releases between unread),
//    which saved bytes per layer do not show (the bias is made once).
// BuildOptions::runtime.transformers (--transformers) picks the release.

// Note [Falcon]
// FalconForCausalLM (transformers 4.46's modeling_falcon.py) keeps GPT-NeoX's
// module names under transformer.* with these departures:
//  - query_key_value holds num_kv_heads groups, each of num_attention_heads /
//    num_kv_heads queries, one key and one value: one group (multi_query,
//    Falcon-7B), num_kv_heads groups (new_decoder_architecture, Falcon-40B
//    and 180B) or one per head. Keys and values are indexed out of it
//    (fused_qkv[..., [-2], :]), copies; the new architecture also broadcasts
//    them to every query head and flattens the groups before the rotary
//    embedding, three more copies. Eager attention then matmuls 4-d tensors,
//    and PyTorch folds batch and heads by copying what is not contiguous: the
//    one-head keys and values broadcast to every head, and the values when
//    they are a transposed view. Either way each layer saves its rotated
//    queries and keys, its probabilities and values at every head's width;
//  - the rotary path's eager attention scales in place, adds the mask, takes
//    the softmax in the hidden states' dtype and applies no dropout to the
//    probabilities;
//  - with parallel_attn both branches read one input_layernorm (Falcon-7B) or
//    their own ln_attn and ln_mlp, both computed before attention (the new
//    architecture); mlp_output += attention_output, then one dropout of
//    hidden_dropout before the residual add. Without parallel_attn the
//    attention branch is dropped out with attention_dropout, the MLP branch
//    with hidden_dropout;
//  - the lm_head is tied to word_embeddings; the loss takes the logits as
//    they are.

// Note [GPTBigCode]
// GPTBigCodeForCausalLM (transformers 4.46's modeling_gpt_bigcode.py;
// StarCoder, SantaCoder) is GPT-2 on nn.Linear with multi-query attention:
//  - c_attn projects to n_embd queries, then one head's key and value
//    (multi_query) or, without it, to [head, (q, k, v)] per head;
//  - the multi-query eager attention folds the heads into the rows of one
//    baddbmm: query.reshape(b, s * heads, d) copies the strided queries, the
//    key and value stay views of c_attn's output, so each layer saves the
//    query copy and c_attn's whole output, and never repeats the key or value
//    per head as Llama's repeat_kv does;
//  - the mask is applied with torch.where, the softmax upcasts 16-bit scores
//    to f32 (attention_softmax_in_fp32) and casts back, and the probabilities
//    drop out with attn_pdrop;
//  - one tril(ones(n_positions, n_positions)) bool buffer for the model, the
//    lm_head tied to wte, the loss over the logits as they are.

// Note [Bloom]
// BloomForCausalLM (transformers 4.46's modeling_bloom.py) has no position
// embeddings; its attention scores carry ALiBi biases (Press et al. 2022):
//  - the model builds them once per forward from the attention mask,
//    [batch x heads, 1, seq] in the hidden states' dtype, alive through the
//    last layer;
//  - each layer's eager attention computes alibi.baddbmm(q, k^T, beta=1,
//    alpha=head_dim^-1/2): one [batch x heads, seq, seq] output with the
//    biases added in the product's kernel and nothing of them saved; q, k and
//    v are strided views of the per-head query_key_value output that the
//    reshape to [batch x heads, seq, head_dim] copies, and each layer saves
//    those copies;
//  - the mask is added as a new tensor, the softmax runs in f32 and is cast
//    back, the probabilities drop out with attention_dropout;
//  - word_embeddings_layernorm normalizes the embeddings; the MLP is
//    4 x hidden_size with Bloom's tanh GELU, an autograd Function that saves
//    its input; dropout_add ends both branches (hidden_dropout); the lm_head
//    is tied and the loss takes the logits as they are.
// transformers' Bloom has only this eager attention; --attention flash models
// a kernel that takes the ALiBi slopes itself (FlashAttention-2's
// alibi_slopes), which adds nothing score-sized.

// Attention runs its stages in this order: the sinks' parameter, the family's
// q, k and v projections, their positions, the core (one flash kernel, or
// eager attention's ops), then the heads merged and the output projection.
TensorId Builder::Attention(const std::string& prefix, TensorId x, TensorId x_shard) {
  const int64_t b = o_.batch, s = seq_, h = c_.hidden_size, d = c_.head_dim;
  const int64_t heads = c_.num_heads / t_;
  const AttentionQuirks quirks{.opt = c_.model_type == "opt",
                               .falcon = c_.model_type == "falcon",
                               .bigcode = c_.model_type == "gpt_bigcode",
                               .bloom = c_.model_type == "bloom",
                               .clip = c_.model_type.starts_with("clip_"),
                               .siglip = c_.model_type.starts_with("siglip_"),
                               .llama4 = c_.model_type == "llama4_text"};
  // Note [GPT-OSS]: one learned sink logit per head, each rank holding its heads' under tensor parallelism.
  const TensorId sinks = c_.attention_sinks ? Param(prefix + "self_attn.sinks", {heads}) : kNone;
  QkvProjection qkv = ProjectQkv(prefix, x, x_shard, quirks);
  PositionQueryAndKey(prefix, quirks, qkv);
  TensorId context;
  const std::string core = prefix + "attn_core";
  if (o_.attention == AttentionImpl::kFlash) {
    // CLIP's text tower masks causally; SigLIP's does not.
    const bool causal = c_.family == ModelFamily::kDecoder || c_.model_type == "clip_text_model";
    // flash_attention_2 reads grouped k/v directly; no repeat_kv copy. For Bloom, a kernel that takes ALiBi slopes
    // (Note [Bloom]).
    // Note [GPT-OSS]: a kernel that takes the sinks (FlashAttention-3's s_aux).
    context = e_.FlashAttention(core + ".sdpa", qkv.q, qkv.k, qkv.v, causal, sinks);
  } else {
    context = EagerAttentionCore(core, x, sinks, quirks, qkv);
  }
  TensorId merged = e_.View(core + ".merge_heads", context, {b, s, heads * d});
  TensorId out = Proj(qkv.out_module, merged, heads * d, h, c_.attn_output_bias, Parallel::kRow,
                      /*conv1d=*/c_.model_type == "gpt2");
  // Note [Python references in inference].
  if (!o_.training) e_.ScopeEnd(prefix + "attention_returns", {x, qkv.q, qkv.k, qkv.v});
  return ReduceOutput(qkv.out_module, out);
}

Builder::QkvProjection Builder::ProjectQkv(const std::string& prefix, TensorId x, TensorId x_shard,
                                           const AttentionQuirks& quirks) {
  QkvProjection qkv;
  if (c_.model_type == "gpt2" || c_.model_type == "gpt_neox" || quirks.bloom) {
    const bool gpt2 = c_.model_type == "gpt2";
    const std::string module = prefix + (gpt2          ? "attn.c_attn"
                                         : quirks.bloom ? "self_attention.query_key_value"
                                                        : "attention.query_key_value");
    if (gpt2 && !o_.runtime.transformers.AtLeast(5, 2)) {
      // GPT2Attention registers its causal mask as a buffer in every layer:
      // tril(ones(n_positions, n_positions)) as bool, 1 MiB per layer at 1024
      // positions. transformers 5.2 dropped it (modeling_gpt2.py of the 5.1.0
      // and 5.2.0 wheels; masks come from masking_utils since).
      const int64_t n = c_.max_position_embeddings;
      e_.Buffer(prefix + "attn.bias", {1, 1, n, n}, DType::kBool);
    }
    std::tie(qkv.q, qkv.k, qkv.v) = FusedQkv(module, x, x_shard, /*conv1d=*/gpt2);
    qkv.out_module =
        prefix + (gpt2 ? "attn.c_proj" : quirks.bloom ? "self_attention.dense" : "attention.dense");
    return qkv;
  }
  if (c_.model_type == "gptj") return GptjQkv(prefix, x, x_shard);
  if (quirks.bigcode) {
    // Note [GPTBigCode]: c_attn's output is all queries, then the keys, then the values.
    std::tie(qkv.q, qkv.k, qkv.v) = FusedQkv(prefix + "attn.c_attn", x, x_shard);
    qkv.out_module = prefix + "attn.c_proj";
    return qkv;
  }
  if (quirks.falcon) return FalconQkv(prefix, x, x_shard);
  return SeparateQkv(prefix, x, x_shard, quirks);
}

Builder::QkvProjection Builder::GptjQkv(const std::string& prefix, TensorId x, TensorId x_shard) {
  const int64_t b = o_.batch, s = seq_, h = c_.hidden_size, d = c_.head_dim;
  const int64_t heads = c_.num_heads / t_;
  // Note [GPT-J]: separate projections; q and k rotate as [b, s, heads, d], then permute.
  QkvProjection qkv;
  const std::string base = prefix + "attn.";
  TensorId qp = Proj(base + "q_proj", x, h, heads * d, false, Parallel::kColumn, false, x_shard);
  TensorId kp = Proj(base + "k_proj", x, h, heads * d, false, Parallel::kColumn, false, x_shard);
  TensorId vp = Proj(base + "v_proj", x, h, heads * d, false, Parallel::kColumn, false, x_shard);
  qkv.v = e_.View(base + "v_proj.heads", vp, {b, heads, s, d});
  const int64_t rd = c_.rotary_dim;
  TensorId table = e_.Buffer(base + "embed_positions", {c_.max_position_embeddings, rd}, DType::kF32);
  // One row of positions (position_ids is arange(s)[None] unless given): tables of batch 1.
  TensorId rows = e_.Materialize(base + "embed_positions.repeat", "repeat", {table},
                                 {1, c_.max_position_embeddings, rd}, DType::kF32);
  TensorId sincos = e_.Materialize(base + "sincos", "gather", {rows}, {1, s, rd}, DType::kF32);
  qkv.k = GptjRotary(prefix + "rotary_k", e_.View(base + "k_proj.heads", kp, {b, s, heads, d}), sincos);
  qkv.q = GptjRotary(prefix + "rotary_q", e_.View(base + "q_proj.heads", qp, {b, s, heads, d}), sincos);
  qkv.k = e_.View(base + "k_permute", qkv.k, {b, heads, s, d});
  qkv.q = e_.View(base + "q_permute", qkv.q, {b, heads, s, d});
  qkv.out_module = base + "out_proj";
  return qkv;
}

Builder::QkvProjection Builder::FalconQkv(const std::string& prefix, TensorId x, TensorId x_shard) {
  const int64_t heads = c_.num_heads / t_, kv = c_.num_kv_heads / t_;
  // Note [Falcon]: query_key_value holds kv groups of (heads / kv queries, a key, a value).
  QkvProjection qkv;
  const std::string module = prefix + "self_attention.query_key_value";
  std::tie(qkv.q, qkv.k, qkv.v) = FusedQkv(module, x, x_shard);
  if (kv < heads || c_.kv_broadcast_early) {
    // fused_qkv[..., [-2], :] is an index: a copy of each key and value head.
    qkv.k = e_.Contiguous(module + ".k_index", qkv.k);
    qkv.v = e_.Contiguous(module + ".v_index", qkv.v);
  }
  if (c_.kv_broadcast_early && kv > 1 && kv < heads) {
    // The new architecture broadcasts k and v to every query head and flattens the groups: copies of all three
    // (views when there is one group, whose keys and values the eager core then repeats).
    qkv.q = e_.Contiguous(module + ".q_flatten", qkv.q);
    qkv.k = e_.RepeatKv(module + ".k_broadcast", qkv.k, heads);
    qkv.v = e_.RepeatKv(module + ".v_broadcast", qkv.v, heads);
  }
  qkv.out_module = prefix + "self_attention.dense";
  return qkv;
}

Builder::QkvProjection Builder::SeparateQkv(const std::string& prefix, TensorId x, TensorId x_shard,
                                            const AttentionQuirks& quirks) {
  const int64_t b = o_.batch, s = seq_, h = c_.hidden_size, d = c_.head_dim;
  const int64_t heads = c_.num_heads / t_, kv = c_.num_kv_heads / t_;
  QkvProjection qkv;
  const bool bert = c_.model_type == "bert" || c_.model_type == "roberta";
  // Note [ViT in transformers 5.9]: q_proj, k_proj, v_proj and o_proj under `attention` from 5.9.
  const bool vit = c_.model_type == "vit" && !o_.runtime.transformers.AtLeast(5, 9);
  const bool vit59 = c_.model_type == "vit" && !vit;
  const std::string base =
      prefix + (bert ? "attention.self." : vit ? "attention.attention." : vit59 ? "attention." : "self_attn.");
  const std::string qn = bert || vit ? "query" : "q_proj", kn = bert || vit ? "key" : "k_proj",
                    vn = bert || vit ? "value" : "v_proj";
  if (c_.fused_qkv) {
    std::tie(qkv.q, qkv.k, qkv.v) = FusedQkv(base + "qkv_proj", x, x_shard);  // Phi-3
  } else {
    TensorId qp = Proj(base + qn, x, h, heads * d, c_.qkv_bias, Parallel::kColumn, false, x_shard);
    // Note [OPT] (and CLIPAttention): q_proj(x) * head_dim^-1/2, its own tensor.
    if (quirks.opt || quirks.clip) qp = e_.Scale(base + "q_proj.scaling", qp);
    TensorId kp = Proj(base + kn, x, h, kv * d, c_.qkv_bias, Parallel::kColumn, false, x_shard);
    TensorId vp = Proj(base + vn, x, h, kv * d, c_.qkv_bias, Parallel::kColumn, false, x_shard);
    if (c_.qk_norm_full) {
      // Note [OLMo 2]: one norm over all heads' features. Under tensor parallelism each rank
      // holds its heads' share of the weight (the statistics' all-reduce is [b, s, 1]).
      qp = RmsNormOver(base + "q_norm", qp, heads * d);
      kp = RmsNormOver(base + "k_norm", kp, kv * d);
    }
    qkv.q = e_.View(base + qn + ".heads", qp, {b, heads, s, d});
    qkv.k = e_.View(base + kn + ".heads", kp, {b, kv, s, d});
    qkv.v = e_.View(base + vn + ".heads", vp, {b, kv, s, d});
  }
  if (c_.qk_norm) {
    qkv.q = RmsNormOver(base + "q_norm", qkv.q, d);
    qkv.k = RmsNormOver(base + "k_norm", qkv.k, d);
  }
  qkv.out_module = bert || vit ? prefix + "attention.output.dense"
                               : base + (quirks.opt || quirks.clip || quirks.siglip ? "out_proj" : "o_proj");
  return qkv;
}

void Builder::PositionQueryAndKey(const std::string& prefix, const AttentionQuirks& quirks, QkvProjection& qkv) {
  const int64_t s = seq_, d = c_.head_dim;
  TensorId& q = qkv.q;
  TensorId& k = qkv.k;
  const bool rope = c_.positions == PositionKind::kRotary && c_.uses_rope(e_.layer());
  if (rope && c_.model_type != "gptj") {  // GPT-J's are rotated already
    const auto rotary_dims = static_cast<int64_t>(static_cast<double>(d) * c_.rotary_pct);
    const bool local = c_.local_rotary && c_.is_sliding_layer(e_.layer());
    const TensorId cos = local ? local_cos_ : cos_, sin = local ? local_sin_ : sin_;
    if (quirks.llama4) {
      // Note [Llama 4]: q and k rotate as complex numbers in f32 and are cast back (type_as).
      const DType dtype = g_.tensor(q).dtype;
      q = e_.Cast(prefix + "rotary_q.cast_back",
                  e_.Rotary(prefix + "rotary_q", e_.Cast(prefix + "rotary_q.float", q, DType::kF32), cos, sin,
                            rotary_dims),
                  dtype);
      k = e_.Cast(prefix + "rotary_k.cast_back",
                  e_.Rotary(prefix + "rotary_k", e_.Cast(prefix + "rotary_k.float", k, DType::kF32), cos, sin,
                            rotary_dims),
                  dtype);
    } else {
      q = e_.Rotary(prefix + "rotary_q", q, cos, sin, rotary_dims);
      k = e_.Rotary(prefix + "rotary_k", k, cos, sin, rotary_dims);
    }
  }
  if (quirks.llama4 && rope && c_.qk_l2_norm) {
    q = L2Norm(prefix + "self_attn.qk_norm.q", q);
    k = L2Norm(prefix + "self_attn.qk_norm.k", k);
  }
  if (quirks.llama4 && !rope && c_.attn_temperature_tuning) {
    // Note [Llama 4]: (q * scales).to(q.dtype) with f32 scales of 1 + attn_scale * log1p(floor((pos + 1) /
    // floor_scale)) per position: the product is f32, then cast back.
    const DType dtype = g_.tensor(q).dtype;
    TensorId scales = e_.Materialize(prefix + "self_attn.attn_scales", "log1p", {}, {1, 1, s, 1}, DType::kF32);
    q = e_.Cast(prefix + "self_attn.attn_scales.cast_back", e_.Mul(prefix + "self_attn.attn_scales.mul", q, scales),
                dtype);
  }
}

TensorId Builder::EagerAttentionCore(const std::string& core, TensorId x, TensorId sinks,
                                     const AttentionQuirks& quirks, QkvProjection& qkv) {
  e_.set_attention_core(true);
  FoldHeadsForTheMatMuls(core, quirks, qkv);
  const TensorId scores = ScaledMaskedScores(core, x, quirks, qkv.q, qkv.k);
  TensorId probs = AttentionProbabilities(core, scores, sinks, qkv.v, quirks);
  // Falcon's rotary attention drops no probabilities (its attention_dropout applies elsewhere, Note [Falcon]).
  probs = e_.Dropout(core + ".dropout", probs, quirks.falcon ? 0.0 : c_.attention_dropout);
  const TensorId context = e_.MatMul(core + ".pv", probs, qkv.v);
  e_.set_attention_core(false);
  return context;
}

void Builder::FoldHeadsForTheMatMuls(const std::string& core, const AttentionQuirks& quirks, QkvProjection& qkv) {
  const int64_t b = o_.batch, s = seq_, d = c_.head_dim;
  const int64_t heads = c_.num_heads / t_, kv = c_.num_kv_heads / t_;
  if (quirks.bigcode && kv == 1 && !o_.runtime.transformers.AtLeast(4, 54)) {
    // Note [GPTBigCode]: the query heads fold into the rows of one bmm (a copy of the strided queries) against
    // the one key and value head, which stay views of c_attn's output. From transformers 4.54 the shared
    // eager attention repeats the key and value head instead (Note [transformers versions]).
    qkv.q = e_.Contiguous(core + ".q_fold", e_.View(core + ".q_rows", qkv.q, {b, s * heads, d}));
    qkv.k = e_.View(core + ".k_rows", qkv.k, {b, s, d});
    qkv.v = e_.View(core + ".v_rows", qkv.v, {b, s, d});
  } else if (g_.tensor(qkv.k).shape[1] < heads) {
    // GPTBigCode's queries are a strided slice of c_attn's output, which the matmul copies to fold batch and
    // heads (Note [transformers versions]); rotated queries are fresh tensors already.
    if (quirks.bigcode) qkv.q = e_.Contiguous(core + ".q_fold", qkv.q);
    // HF eager attention materializes repeated k/v heads (repeat_kv; Falcon's matmul broadcasts and copies).
    qkv.k = e_.RepeatKv(core + ".repeat_k", qkv.k, heads);
    qkv.v = e_.RepeatKv(core + ".repeat_v", qkv.v, heads);
  } else if (quirks.falcon) {
    // Note [Falcon]: v is a transposed view, which the matmul copies to fold batch and heads.
    qkv.v = e_.Contiguous(core + ".v_fold", qkv.v);
  }
}

TensorId Builder::ScaledMaskedScores(const std::string& core, TensorId x, const AttentionQuirks& quirks, TensorId q,
                                     TensorId k) {
  // Note [Bloom]: alibi.baddbmm(q, k^T), the biases added in the product's kernel.
  TensorId scores = quirks.bloom ? e_.BaddBmm(core + ".qk", alibi_, q, k, /*b_transposed=*/true)
                                 : e_.MatMul(core + ".qk", q, k, /*b_transposed=*/true);
  if (c_.attn_logit_softcap > 0) {
    // Gemma 2 scales, caps, then adds the mask (Note [Gemma decoders]).
    return e_.MaskedScale(core + ".scale_mask", SoftCap(core + ".softcap", e_.Scale(core + ".scale", scores)));
  }
  if (IsLlamaLike(c_)) {
    // Note [Eager attention's scale and mask].
    return e_.AddMask(core + ".mask", e_.Scale(core + ".scale", scores), g_.tensor(x).dtype);
  }
  return e_.MaskedScale(core + ".scale_mask", scores);
}

TensorId Builder::AttentionProbabilities(const std::string& core, TensorId scores, TensorId sinks, TensorId v,
                                         const AttentionQuirks& quirks) {
  // Note [OPT]: before transformers 4.49, torch.max(scores, finfo.min) keeps the masked scores for backward
  // and the softmax runs in f32 (and casts back) for f16 scores only; from 4.49 OPT's attention is
  // Llama's (Note [transformers versions]).
  const bool f16_scores = g_.tensor(scores).dtype == DType::kF16;
  const bool opt_clamps = quirks.opt && !o_.runtime.transformers.AtLeast(4, 49);
  TensorId probs;
  if (sinks != kNone) {
    // Note [GPT-OSS]: cat the sinks as one more column, subtract each row's max, softmax in the scores' dtype,
    // drop the sink column (a view of the probabilities, which stay alive).
    std::vector<int64_t> shape = g_.tensor(scores).shape;
    const std::vector<int64_t> score_shape = shape;
    shape.back() += 1;
    TensorId combined = e_.Concat(core + ".sinks_cat", {scores, sinks}, shape);
    const OpEmitter::Selection max = e_.TopK(core + ".row_max", "max", combined, 1);
    probs = e_.View(core + ".drop_sink",
                    e_.Softmax(core + ".softmax", e_.Add(core + ".sub_max", combined, max.values)), score_shape);
  } else {
    if (opt_clamps) scores = e_.Maximum(core + ".clamp", scores);
    // Falcon's softmax takes the dtype of its input hidden states, a LayerNorm output (f32 under autocast).
    probs = e_.Softmax(core + ".softmax", scores,
                       /*force_f32=*/IsLlamaLike(c_) || quirks.siglip || (quirks.opt && (f16_scores || !opt_clamps)) ||
                           (quirks.falcon && e_.options().autocast) || c_.attention_softmax_f32 || quirks.bloom);
  }
  // Decoders and SigLIP cast the probabilities back to v's dtype (HF's
  // `.to(query.dtype)` / `.type(value.dtype)`); BERT, ViT and CLIP leave that to autocast.
  if ((c_.family == ModelFamily::kDecoder && (!opt_clamps || f16_scores)) || quirks.siglip) {
    probs = e_.Cast(core + ".probs_cast", probs, g_.tensor(v).dtype);
    // `attn_weights = softmax(attn_weights, dtype=float32).to(query.dtype)`: the name holds the masked scores
    // until the statement is done (Note [Eager attention's scale and mask]).
    if (IsLlamaLike(c_)) e_.ScopeEnd(core + ".softmax_statement", {scores});
  }
  return probs;
}

// Note [GPT-J]
// GPTJForCausalLM (transformers 4.46's modeling_gptj.py) runs attention and
// the MLP in parallel from one ln_1 (x + attn(ln_1(x)) + mlp(ln_1(x)), each
// branch with its resid_pdrop dropout) and rotates positions its own way:
//  - every layer keeps its own sinusoidal table of n_positions x rotary_dim
//    f32 values (a plain attribute, so it stays f32 whatever the weights'
//    dtype), repeats it for each row of position_ids (one: arange(s)[None]
//    unless the caller passes them) and gathers the positions;
//  - q_proj and k_proj outputs rotate as [b, s, heads, d]: the first
//    rotary_dim features of each head are multiplied by cos and, rotated two
//    by two (stack(-x2, x1)), by sin, then concatenated with the rest. sin and
//    cos are repeat_interleave'd afresh for k and for q, and each
//    multiplication saves its table: four s x rotary_dim f32 tensors per
//    layer, where Llama saves none. In 16-bit the f32 tables promote the
//    rotated q and k to f32, and _attn casts both to f32 anyway;
//  - q, k and v are permuted views, so the eager matmuls copy them when they
//    fold batch and heads; the probabilities are cast back to v's dtype;
//  - the lm_head has a bias and is not tied; its logits are cast to f32
//    before the loss.
TensorId Builder::GptjRotary(const std::string& name, TensorId x, TensorId sincos) {
  const std::vector<int64_t> shape = g_.tensor(x).shape;
  const int64_t b = shape[0], s = shape[1], heads = shape[2], d = shape[3], rd = c_.rotary_dim;
  TensorId sin = e_.Materialize(name + ".sin", "repeat_interleave", {sincos}, {1, s, 1, rd}, DType::kF32);
  TensorId cos = e_.Materialize(name + ".cos", "repeat_interleave", {sincos}, {1, s, 1, rd}, DType::kF32);
  TensorId rot = e_.View(name + ".rot", x, {b, s, heads, rd});
  TensorId odd = e_.Scale(name + ".neg", e_.View(name + ".odd", x, {b, s, heads, rd / 2}));
  TensorId even = e_.View(name + ".even", x, {b, s, heads, rd / 2});
  TensorId rotated = e_.Concat(name + ".rotate_every_two", {odd, even}, {b, s, heads, rd});
  TensorId y = e_.Add(name + ".add", e_.Mul(name + ".mul_cos", rot, cos), e_.Mul(name + ".mul_sin", rotated, sin));
  std::vector<TensorId> parts = {y};
  if (rd < d) parts.push_back(e_.View(name + ".pass", x, {b, s, heads, d - rd}));
  return e_.Concat(name + ".cat", parts, {b, s, heads, d});
}

// Note [Multi-head latent attention]
// DeepSeek-V2 and V3 (DeepSeek-AI 2024, "DeepSeek-V2", sec. 2.1.2-2.1.3; transformers' DeepseekV3Attention)
// compress keys and values into one latent per token, kv_lora_rank wide, beside a qk_rope_head_dim key that
// carries position and is shared by every head:
//   q       = q_b_proj(q_a_layernorm(q_a_proj(x)))   (q_proj(x) when q_lora_rank is null)
//             per head: qk_nope_head_dim | qk_rope_head_dim
//   c | k_r = kv_a_proj_with_mqa(x)                 kv_lora_rank | qk_rope_head_dim
//   k_n | v = kv_b_proj(kv_a_layernorm(c))          per head: qk_nope_head_dim | v_head_dim
//   q = cat(q_n, rope(q_r)), k = cat(k_n, rope(k_r) expanded to every head)
// A training step materializes q and k at qk_nope + qk_rope per head and v at v_head_dim, as transformers
// does, and attends as usual; flash attention pads v to q's head size and slices the output back. What a
// server caches is the latent (Note [MLA KV cache] in estimators/kv_cache.h). Tensor and sequence
// parallelism are not modelled for it (CheckOptions refuses them).
TensorId Builder::LatentAttention(const std::string& prefix, TensorId x) {
  const int64_t b = o_.batch, s = o_.seq_len, h = c_.hidden_size, heads = c_.num_heads;
  const int64_t nope = c_.qk_nope_head_dim, rope = c_.qk_rope_head_dim, qd = nope + rope, vd = c_.v_head_dim;
  const std::string base = prefix + "self_attn.";
  TensorId q;
  if (c_.q_lora_rank > 0) {
    TensorId qa = Proj(base + "q_a_proj", x, h, c_.q_lora_rank, c_.qkv_bias, Parallel::kReplicated);
    qa = RmsNormOver(base + "q_a_layernorm", qa, c_.q_lora_rank);
    q = Proj(base + "q_b_proj", qa, c_.q_lora_rank, heads * qd, false, Parallel::kReplicated);
  } else {
    q = Proj(base + "q_proj", x, h, heads * qd, false, Parallel::kReplicated);
  }
  q = e_.View(base + "q_heads", q, {b, heads, s, qd});
  TensorId q_nope = e_.View(base + "q_nope", q, {b, heads, s, nope});
  TensorId q_rot = e_.Rotary(prefix + "rotary_q", e_.View(base + "q_rope", q, {b, heads, s, rope}), cos_, sin_, rope);

  TensorId ckv = Proj(base + "kv_a_proj_with_mqa", x, h, c_.kv_lora_rank + rope, c_.qkv_bias, Parallel::kReplicated);
  TensorId latent = RmsNormOver(base + "kv_a_layernorm", e_.View(base + "latent", ckv, {b, s, c_.kv_lora_rank}),
                                c_.kv_lora_rank);
  TensorId k_rot = e_.Rotary(prefix + "rotary_k", e_.View(base + "k_rope", ckv, {b, 1, s, rope}), cos_, sin_, rope);
  TensorId kv = Proj(base + "kv_b_proj", latent, c_.kv_lora_rank, heads * (nope + vd), false, Parallel::kReplicated);
  TensorId k_nope = e_.View(base + "k_nope", kv, {b, heads, s, nope});
  TensorId v = e_.View(base + "v_heads", kv, {b, heads, s, vd});
  TensorId query = e_.Concat(base + "query_cat", {q_nope, q_rot}, {b, heads, s, qd});
  TensorId key = e_.Concat(base + "key_cat", {k_nope, e_.View(base + "k_rope_expand", k_rot, {b, heads, s, rope})},
                           {b, heads, s, qd});

  const std::string core = prefix + "attn_core";
  TensorId context;
  if (o_.attention == AttentionImpl::kFlash) {
    TensorId padded = e_.Concat(core + ".v_pad", {v}, {b, heads, s, qd});
    TensorId out = e_.FlashAttention(core + ".sdpa", query, key, padded, /*causal=*/true);
    context = e_.Contiguous(core + ".v_slice", e_.View(core + ".v_slice_view", out, {b, heads, s, vd}));
  } else {
    e_.set_attention_core(true);
    TensorId scores = e_.MaskedScale(core + ".scale_mask", e_.MatMul(core + ".qk", query, key, /*b_transposed=*/true));
    TensorId probs = e_.Softmax(core + ".softmax", scores, /*force_f32=*/true);
    probs = e_.Cast(core + ".probs_cast", probs, g_.tensor(v).dtype);
    probs = e_.Dropout(core + ".dropout", probs, c_.attention_dropout);
    context = e_.MatMul(core + ".pv", probs, v);
    e_.set_attention_core(false);
  }
  TensorId merged = e_.View(core + ".merge_heads", context, {b, s, heads * vd});
  TensorId out = Proj(base + "o_proj", merged, heads * vd, h, c_.attn_output_bias, Parallel::kReplicated);
  if (!o_.training) e_.ScopeEnd(prefix + "attention_returns", {x, query, key, v});
  return out;
}

}  // namespace headroom::builders_internal

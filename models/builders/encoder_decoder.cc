// Encoder-decoders: T5, BART, Whisper.
#include <string>

#include "absl/strings/str_format.h"
#include "common/checked_math.h"
#include "common/status_macros.h"
#include "models/builder.h"

namespace headroom::builders_internal {

// Note [T5]
// T5ForConditionalGeneration (transformers' modeling_t5.py; Raffel et al. 2020) shares one embedding table
// between an encoder and a decoder of pre-norm blocks:
//  - T5LayerNorm is an RMSNorm written out in PyTorch ops (the eager RMSNorm), without bias;
//  - attention is unscaled (T5 folds 1/sqrt(d_kv) into its initialization) and adds a position bias that
//    the first block computes once from relative-position buckets (an embedding of relative_buckets x heads);
//    later blocks reuse it; cross-attention's bias is zeros. Before transformers 5 the padding (encoder) or
//    causal (decoder) mask is folded into the bias, so a [batch, heads, q, k] tensor lives through every
//    block (and its gradient through their backward), the scores take it in place, and softmax runs on
//    scores.float() and comes back in the scores' dtype. From 5.0 (read at 5.24: eager_attention_forward in
//    modeling_t5.py, masks from masking_utils) the bias stays [1, heads, q, k] and the scores are
//    matmul * scaling (1.0, still a kernel and a new tensor), + bias, + mask, each a new tensor, then a plain
//    softmax. masking_utils builds no mask for a batch without padding (an all-ones attention_mask included)
//    but for the decoder's causal one, [batch, 1, t, t]; Headroom models that unpadded batch (padding adds a
//    [batch, 1, q, k] mask, a heads-th of one block's scores). Without this the builder held about two
//    [batch, heads, q, k] tensors more than PyTorch through the encoder's backward (T5's --emit torch rows,
//    validation/fixtures/plans/t5-emit.json, were 5-10% high);
//  - dropout of dropout_rate follows the embeddings, the attention probabilities, the feed-forward's hidden
//    layer and every block's output;
//  - the feed-forward is wi, ReLU, wo or, gated (T5 v1.1, Flan-T5), act(wi_0) * wi_1, wo;
//  - each decoder block attends to itself, then to the encoder's output through EncDecAttention, whose k and
//    v read that output in every block;
//  - with tied embeddings the decoder's output is scaled by d_model^-0.5 before the head.
// Decoder blocks are numbered after the encoder's (blocks num_layers ... num_layers + decoder_layers - 1); the
// decoder reads target_seq_len tokens (seq_len when not set). The loss is cross-entropy over the decoder's
// logits, unshifted (the labels are shifted into the decoder's input instead).
TensorId Builder::T5PositionBias(const std::string& module, int64_t q, int64_t k, TensorId mask, bool buckets,
                                 DType dtype) {
  const int64_t heads = c_.num_heads / t_;
  TensorId bias;
  if (buckets) {
    // relative_position_bucket's integer arithmetic: [q, k] bucket ids, no gradient.
    TensorId ids = e_.Zeros(module + ".relative_position_bucket", {q, k}, DType::kI64);
    TensorId table = Param(module + ".relative_attention_bias.weight", {c_.relative_buckets, heads});
    bias = e_.View(module + ".position_bias", e_.Embedding(module + ".relative_attention_bias", ids, table),
                   {1, heads, q, k});
  } else {
    bias = e_.Zeros(module + ".position_bias", {1, heads, q, k}, dtype);
  }
  return mask == kNone ? bias : e_.Add(module + ".position_bias_masked", bias, mask);
}

TensorId Builder::T5Attention(const std::string& module, TensorId x, TensorId kv_source, TensorId position_bias,
                              TensorId mask) {
  const int64_t b = o_.batch, d = c_.head_dim, heads = c_.num_heads / t_, h = c_.hidden_size;
  const int64_t q_len = g_.tensor(x).shape[1], k_len = g_.tensor(kv_source).shape[1];
  TensorId q = e_.View(module + ".q_heads", Proj(module + ".q", x, h, heads * d, false, Parallel::kColumn),
                       {b, heads, q_len, d});
  TensorId k = e_.View(module + ".k_heads", Proj(module + ".k", kv_source, h, heads * d, false, Parallel::kColumn),
                       {b, heads, k_len, d});
  TensorId v = e_.View(module + ".v_heads", Proj(module + ".v", kv_source, h, heads * d, false, Parallel::kColumn),
                       {b, heads, k_len, d});
  e_.set_attention_core(true);
  TensorId scores = e_.MatMul(module + ".qk", q, k, /*b_transposed=*/true);
  const DType scores_dtype = g_.tensor(scores).dtype;
  TensorId probs;
  if (o_.runtime.transformers.AtLeast(5, 0)) {
    scores = e_.Add(module + ".add_position_bias", e_.Scale(module + ".scale", scores), position_bias);
    if (mask != kNone) scores = e_.Add(module + ".add_mask", scores, mask);
    probs = e_.Softmax(module + ".softmax", scores, /*force_f32=*/false);
  } else {
    scores = e_.AddInplace(module + ".add_position_bias", scores, position_bias);
    probs = e_.Cast(module + ".probs_cast", e_.Softmax(module + ".softmax", scores, /*force_f32=*/true),
                    scores_dtype);
  }
  probs = e_.Dropout(module + ".dropout", probs, c_.attention_dropout);
  TensorId context = e_.MatMul(module + ".pv", probs, v);
  e_.set_attention_core(false);
  TensorId merged = e_.View(module + ".merge_heads", context, {b, q_len, heads * d});
  return ReduceOutput(module + ".o", Proj(module + ".o", merged, heads * d, h, false, Parallel::kRow));
}

TensorId Builder::T5FeedForward(const std::string& prefix, TensorId x) {
  const std::string m = prefix + "DenseReluDense.";
  const int64_t h = c_.hidden_size, inner = c_.intermediate_size / t_;
  TensorId hidden;
  if (c_.gated_mlp) {
    TensorId gate = Activation(m + "act", Proj(m + "wi_0", x, h, inner, false, Parallel::kColumn));
    hidden = e_.Mul(m + "gate_mul", gate, Proj(m + "wi_1", x, h, inner, false, Parallel::kColumn));
  } else {
    hidden = Activation(m + "act", Proj(m + "wi", x, h, inner, false, Parallel::kColumn));
  }
  hidden = e_.Dropout(m + "dropout", hidden, c_.hidden_dropout);
  return ReduceOutput(m + "wo", Proj(m + "wo", hidden, inner, h, false, Parallel::kRow));
}

absl::Status Builder::BuildT5() {
  const int64_t b = o_.batch, s = o_.seq_len, t = o_.target_seq_len > 0 ? o_.target_seq_len : o_.seq_len;
  const int64_t h = c_.hidden_size, vocab = CeilDiv<int64_t>(c_.vocab_size, t_);
  e_.set_layer(-1);
  TensorId shared = Param("shared.weight", {vocab, h});
  // The padding mask a batch comes with; before transformers 5 both attentions over it add it as the additive
  // [b, 1, 1, s] mask (Note [T5]).
  TensorId padding = e_.Input("attention_mask", {b, s}, DType::kI64);
  const DType act_dtype = e_.options().autocast ? o_.param_dtype : o_.compute_dtype;
  const bool masks_in_bias = !o_.runtime.transformers.AtLeast(5, 0);
  const TensorId encoder_mask =
      masks_in_bias
          ? e_.Cast("encoder.extended_attention_mask", e_.View("encoder.mask_view", padding, {b, 1, 1, s}), act_dtype)
          : kNone;
  auto stack = [&](const std::string& root, TensorId ids, int64_t first_layer, int64_t layers, TensorId self_mask,
                   TensorId encoder_out) -> absl::StatusOr<TensorId> {
    e_.set_layer(-1);
    TensorId x = e_.Embedding(root + "embed_tokens", ids, shared);
    if (t_ > 1) x = ReduceOutput(root + "embed_tokens", x);
    x = e_.Dropout(root + "dropout", x, c_.embedding_dropout);
    const int64_t len = g_.tensor(ids).shape[1];
    // The mask goes into the first block's bias, or into every block's scores.
    const TensorId bias_mask = masks_in_bias ? self_mask : kNone, scores_mask = masks_in_bias ? kNone : self_mask;
    TensorId self_bias = kNone, cross_bias = kNone;
    for (int64_t i = 0; i < layers; ++i) {
      e_.set_layer(static_cast<int>(first_layer + i));
      const std::string p = absl::StrFormat("%sblock.%d.layer.", root, i);
      TensorId normed = Norm(p + "0.layer_norm", x);
      if (self_bias == kNone) {
        self_bias = T5PositionBias(p + "0.SelfAttention", len, len, bias_mask, true, act_dtype);
      }
      TensorId attn = T5Attention(p + "0.SelfAttention", normed, normed, self_bias, scores_mask);
      x = e_.Add(p + "0.add", x, e_.Dropout(p + "0.dropout", attn, c_.hidden_dropout));
      int next = 1;
      if (encoder_out != kNone) {
        normed = Norm(p + "1.layer_norm", x);
        const int64_t enc_len = g_.tensor(encoder_out).shape[1];
        if (cross_bias == kNone) {
          // Zeros in the mask's dtype before transformers 5, in the queries' from 5.0.
          cross_bias = T5PositionBias(p + "1.EncDecAttention", len, enc_len, encoder_mask, false,
                                      masks_in_bias ? act_dtype : o_.compute_dtype);
        }
        TensorId cross = T5Attention(p + "1.EncDecAttention", normed, encoder_out, cross_bias, kNone);
        x = e_.Add(p + "1.add", x, e_.Dropout(p + "1.dropout", cross, c_.hidden_dropout));
        next = 2;
      }
      const std::string ff = absl::StrFormat("%s%d.", p, next);
      TensorId mlp = T5FeedForward(ff, Norm(ff + "layer_norm", x));
      x = e_.Add(ff + "add", x, e_.Dropout(ff + "dropout", mlp, c_.hidden_dropout));
      HEADROOM_RETURN_IF_ERROR(CheckGraphSize(first_layer + i));
    }
    e_.set_layer(-1);
    return e_.Dropout(root + "final_dropout", Norm(root + "final_layer_norm", x), c_.hidden_dropout);
  };
  TensorId encoder_ids = e_.Input("input_ids", {b, s}, DType::kI64);
  HEADROOM_ASSIGN_OR_RETURN(TensorId encoded,
                            stack("encoder.", encoder_ids, 0, c_.num_layers, encoder_mask, kNone));
  TensorId decoder_ids = e_.Input("decoder_input_ids", {b, t}, DType::kI64);
  // The causal mask over the decoder's own tokens, [b, 1, t, t].
  TensorId causal = e_.Zeros("decoder.causal_mask", {b, 1, t, t}, act_dtype);
  HEADROOM_ASSIGN_OR_RETURN(TensorId decoded,
                            stack("decoder.", decoder_ids, c_.num_layers, c_.decoder_layers, causal, encoded));
  if (c_.tie_word_embeddings) decoded = e_.Scale("decoder.rescale", decoded);  // d_model^-0.5
  // Note [transformers versions]: from transformers 5 the head is the shared embedding whatever the config says.
  const bool tied_head = c_.tie_word_embeddings || o_.runtime.transformers.AtLeast(5, 0);
  TensorId logits = Proj("lm_head", decoded, h, vocab, false, Parallel::kColumn, false, kNone,
                         tied_head ? shared : kNone);
  if (o_.training) Loss(logits, b * t, vocab);
  return absl::OkStatus();
}

// Note [BART]
// BartForConditionalGeneration (transformers 4.46's modeling_bart.py; Lewis et al. 2020) keeps T5's layout
// (shared embeddings, an encoder, a decoder with cross-attention, blocks numbered encoder first) with a
// post-norm Transformer of its own:
//  - embeddings are scaled by sqrt(d_model) when scale_embedding (a multiply either way), plus learned
//    positions offset by 2 (embed_positions has max_position_embeddings + 2 rows, one table per stack), then
//    layernorm_embedding and dropout;
//  - each block: LayerNorm(x + dropout(attention(x))), for the decoder then the same with encoder_attn, then
//    LayerNorm(x + dropout(fc2(dropout(act(fc1(x)))))); every projection has a bias;
//  - attention scales q by head_dim^-0.5 into a new tensor, adds the [b, 1, q, k] mask out of place (eager),
//    softmax, attention_dropout; flash attention (sdpa or flash_attention_2) takes q, k, v instead;
//  - the head is tied to the shared embeddings and adds the final_logits_bias buffer; the loss is cross-entropy
//    over the decoder's logits.
TensorId Builder::BartAttention(const std::string& module, TensorId x, TensorId kv_source, TensorId mask,
                                bool causal) {
  const int64_t b = o_.batch, h = c_.hidden_size, heads = c_.num_heads, d = h / heads;
  const int64_t q_len = g_.tensor(x).shape[1], k_len = g_.tensor(kv_source).shape[1];
  TensorId q = e_.Scale(module + ".q_scale", Proj(module + ".q_proj", x, h, h, true, Parallel::kColumn));
  q = e_.View(module + ".q_heads", q, {b, heads, q_len, d});
  const bool k_bias = c_.model_type != "whisper";  // Note [Whisper]
  TensorId k = e_.View(module + ".k_heads", Proj(module + ".k_proj", kv_source, h, h, k_bias, Parallel::kColumn),
                       {b, heads, k_len, d});
  TensorId v = e_.View(module + ".v_heads", Proj(module + ".v_proj", kv_source, h, h, true, Parallel::kColumn),
                       {b, heads, k_len, d});
  TensorId context;
  if (o_.attention == AttentionImpl::kFlash) {
    context = e_.FlashAttention(module + ".sdpa", q, k, v, causal);
  } else {
    e_.set_attention_core(true);
    TensorId scores = e_.MatMul(module + ".qk", q, k, /*b_transposed=*/true);
    if (mask != kNone) scores = e_.Add(module + ".add_mask", scores, mask);
    TensorId probs = e_.Dropout(module + ".dropout", e_.Softmax(module + ".softmax", scores), c_.attention_dropout);
    context = e_.MatMul(module + ".pv", probs, v);
    e_.set_attention_core(false);
  }
  TensorId merged = e_.View(module + ".merge_heads", context, {b, q_len, h});
  return Proj(module + ".out_proj", merged, h, h, true, Parallel::kRow);
}

absl::Status Builder::BuildBart() {
  const int64_t b = o_.batch, s = o_.seq_len, t = o_.target_seq_len > 0 ? o_.target_seq_len : o_.seq_len;
  const int64_t h = c_.hidden_size, vocab = c_.vocab_size;
  if (t > c_.max_position_embeddings) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "target_seq_len %d exceeds the model's max_position_embeddings (%d): its learned position embeddings end "
        "there",
        t, c_.max_position_embeddings));
  }
  e_.set_layer(-1);
  TensorId shared = Param("model.shared.weight", {vocab, h});
  const DType act_dtype = e_.options().autocast ? o_.param_dtype : o_.compute_dtype;
  // The additive masks eager attention adds, [b, 1, q, k]: padding for the encoder and cross-attention, causal
  // for the decoder.
  TensorId padding = e_.Input("attention_mask", {b, s}, DType::kI64);
  TensorId encoder_mask = e_.Cast("model.encoder.attention_mask_4d",
                                  e_.View("model.encoder.mask_view", padding, {b, 1, 1, s}), act_dtype);
  auto stack = [&](const std::string& root, TensorId ids, int64_t first_layer, int64_t layers, TensorId encoder_out)
      -> absl::StatusOr<TensorId> {
    e_.set_layer(-1);
    const int64_t len = g_.tensor(ids).shape[1];
    TensorId x = e_.Scale(root + "embed_tokens.scale", e_.Embedding(root + "embed_tokens", ids, shared));
    TensorId positions = e_.Input(root + "position_ids", {b, len}, DType::kI64);
    TensorId table = Param(root + "embed_positions.weight", {c_.max_position_embeddings + 2, h});
    x = e_.Add(root + "add_positions", x, e_.Embedding(root + "embed_positions", positions, table));
    x = e_.Dropout(root + "dropout", LayerNormModule(root + "layernorm_embedding", x), c_.embedding_dropout);
    const bool decoder = encoder_out != kNone;
    TensorId self_mask = kNone, cross_mask = kNone;
    if (o_.attention != AttentionImpl::kFlash) {
      self_mask = decoder ? e_.Zeros(root + "causal_mask", {b, 1, len, len}, act_dtype)
                          : e_.Add(root + "attention_mask_expanded", e_.Zeros(root + "mask_rows", {1, 1, len, 1},
                                                                                act_dtype),
                                   encoder_mask);
      if (decoder) cross_mask = e_.Zeros(root + "encoder_attention_mask", {b, 1, len, s}, act_dtype);
    }
    for (int64_t i = 0; i < layers; ++i) {
      e_.set_layer(static_cast<int>(first_layer + i));
      const std::string p = absl::StrFormat("%slayers.%d.", root, i);
      TensorId attn = BartAttention(p + "self_attn", x, x, self_mask, decoder);
      x = LayerNormModule(p + "self_attn_layer_norm",
                          e_.Add(p + "attn_residual", x, e_.Dropout(p + "attn_dropout", attn, c_.hidden_dropout)));
      if (decoder) {
        TensorId cross = BartAttention(p + "encoder_attn", x, encoder_out, cross_mask, false);
        x = LayerNormModule(p + "encoder_attn_layer_norm",
                            e_.Add(p + "cross_residual", x, e_.Dropout(p + "cross_dropout", cross, c_.hidden_dropout)));
      }
      TensorId hidden = Activation(p + "activation_fn", Proj(p + "fc1", x, h, c_.intermediate_size, true,
                                                            Parallel::kColumn));
      hidden = e_.Dropout(p + "activation_dropout", hidden, c_.activation_dropout);
      TensorId mlp = e_.Dropout(p + "mlp_dropout", Proj(p + "fc2", hidden, c_.intermediate_size, h, true,
                                                        Parallel::kRow), c_.hidden_dropout);
      x = LayerNormModule(p + "final_layer_norm", e_.Add(p + "mlp_residual", x, mlp));
      HEADROOM_RETURN_IF_ERROR(CheckGraphSize(first_layer + i));
    }
    e_.set_layer(-1);
    return x;
  };
  TensorId encoder_ids = e_.Input("input_ids", {b, s}, DType::kI64);
  HEADROOM_ASSIGN_OR_RETURN(TensorId encoded, stack("model.encoder.", encoder_ids, 0, c_.num_layers, kNone));
  TensorId decoder_ids = e_.Input("decoder_input_ids", {b, t}, DType::kI64);
  HEADROOM_ASSIGN_OR_RETURN(TensorId decoded,
                            stack("model.decoder.", decoder_ids, c_.num_layers, c_.decoder_layers, encoded));
  TensorId logits = Proj("lm_head", decoded, h, vocab, false, Parallel::kColumn, false, kNone,
                         c_.tie_word_embeddings ? shared : kNone);
  logits = e_.Add("final_logits_bias", logits, e_.Buffer("final_logits_bias", {1, vocab}, g_.tensor(logits).dtype));
  if (o_.training) Loss(logits, b * t, vocab);
  return absl::OkStatus();
}

// Note [Whisper]
// WhisperForConditionalGeneration (transformers 4.46's modeling_whisper.py; Radford et al. 2022) is BART's
// attention and feed-forward in pre-norm blocks, under an audio encoder:
//  - the encoder reads log-mel frames [b, num_mel_bins, 2 x max_source_positions] (3000 frames, 30 s of audio
//    for every released checkpoint; WhisperEncoder refuses any other length, shorter audio is padded), through
//    conv1 (kernel 3, padding 1), GELU, conv2 (kernel 3, stride 2, padding 1), GELU, a permute to
//    [b, max_source_positions, d_model], plus embed_positions.weight (sinusoids, frozen: requires_grad_(False),
//    so counted as a parameter but given no gradient or optimizer state), dropout;
//  - the decoder embeds its tokens (no embedding scale: WhisperConfig's scale_embedding is never applied) plus
//    learned positions indexed by position (max_target_positions rows), dropout;
//  - each block: x + dropout(attention(LayerNorm(x))), for the decoder then x + dropout(encoder_attn(LayerNorm(x)))
//    over the encoder's output, then x + dropout(fc2(dropout(act(fc1(LayerNorm(x)))))); each stack ends in a
//    layer_norm;
//  - attention is BART's (q scaled by head_dim^-0.5, softmax, attention_dropout) except that k_proj has no bias;
//    eager attention adds no mask to the encoder's or the cross-attention's scores (Whisper masks no frames), and
//    the decoder's causal mask is one [t, t + 1] tensor expanded over the batch;
//  - proj_out is tied to the decoder's embed_tokens; the loss is cross-entropy over the decoder's logits.
// So the encoder's length is fixed by the config, and the decoder's tokens (target_seq_len, or seq_len when not
// set) are what a job chooses, at most max_target_positions (448). Blocks are numbered encoder first, as BART's.
absl::Status Builder::BuildWhisper() {
  const int64_t b = o_.batch, t = o_.target_seq_len > 0 ? o_.target_seq_len : o_.seq_len;
  const int64_t h = c_.hidden_size, vocab = c_.vocab_size, frames = 2 * c_.source_positions;
  if (t > c_.max_position_embeddings) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "target_seq_len %d exceeds the model's max_target_positions (%d): its learned position embeddings end there",
        t, c_.max_position_embeddings));
  }
  const DType act_dtype = e_.options().autocast ? o_.param_dtype : o_.compute_dtype;
  auto block_end = [&](const std::string& p, TensorId x) {
    TensorId hidden = Activation(p + "activation_fn", Proj(p + "fc1", LayerNormModule(p + "final_layer_norm", x), h,
                                                          c_.intermediate_size, true, Parallel::kColumn));
    hidden = e_.Dropout(p + "activation_dropout", hidden, c_.activation_dropout);
    TensorId mlp = Proj(p + "fc2", hidden, c_.intermediate_size, h, true, Parallel::kRow);
    return e_.Add(p + "mlp_residual", x, e_.Dropout(p + "mlp_dropout", mlp, c_.hidden_dropout));
  };
  // The encoder.
  e_.set_layer(-1);
  const std::string enc = "model.encoder.";
  TensorId x = e_.Input("input_features", {b, c_.num_mel_bins, frames}, act_dtype);
  x = e_.Conv1d(enc + "conv1", x, Param(enc + "conv1.weight", {h, c_.num_mel_bins, 3}), Param(enc + "conv1.bias", {h}),
                /*stride=*/1, /*padding=*/1);
  x = e_.Activation(enc + "conv1_gelu", ActivationKind::kGelu, x);
  x = e_.Conv1d(enc + "conv2", x, Param(enc + "conv2.weight", {h, h, 3}), Param(enc + "conv2.bias", {h}),
                /*stride=*/2, /*padding=*/1);
  x = e_.Activation(enc + "conv2_gelu", ActivationKind::kGelu, x);
  x = e_.View(enc + "permute", x, {b, c_.source_positions, h});
  TensorId positions = e_.Parameter(enc + "embed_positions.weight", {c_.source_positions, h}, o_.param_dtype,
                                    /*trainable=*/false);
  x = e_.Dropout(enc + "dropout", e_.Add(enc + "add_positions", x, positions), c_.hidden_dropout);
  for (int64_t i = 0; i < c_.num_layers; ++i) {
    e_.set_layer(static_cast<int>(i));
    const std::string p = absl::StrFormat("%slayers.%d.", enc, i);
    TensorId normed = LayerNormModule(p + "self_attn_layer_norm", x);
    TensorId attn = BartAttention(p + "self_attn", normed, normed, kNone, false);
    x = block_end(p, e_.Add(p + "attn_residual", x, e_.Dropout(p + "attn_dropout", attn, c_.hidden_dropout)));
    HEADROOM_RETURN_IF_ERROR(CheckGraphSize(i));
  }
  e_.set_layer(-1);
  TensorId encoded = LayerNormModule(enc + "layer_norm", x);
  // The decoder.
  const std::string dec = "model.decoder.";
  TensorId embed = Param(dec + "embed_tokens.weight", {vocab, h});
  TensorId ids = e_.Input("decoder_input_ids", {b, t}, DType::kI64);
  TensorId position_ids = e_.Input(dec + "position_ids", {1, t}, DType::kI64);
  TensorId table = Param(dec + "embed_positions.weight", {c_.max_position_embeddings, h});
  x = e_.Add(dec + "add_positions", e_.Embedding(dec + "embed_tokens", ids, embed),
             e_.Embedding(dec + "embed_positions", position_ids, table));
  x = e_.Dropout(dec + "dropout", x, c_.hidden_dropout);
  TensorId causal = kNone;
  if (o_.attention != AttentionImpl::kFlash) {
    causal = e_.View(dec + "causal_mask_view", e_.Zeros(dec + "causal_mask", {t, t + 1}, act_dtype), {1, 1, t, t});
  }
  for (int64_t i = 0; i < c_.decoder_layers; ++i) {
    const int64_t layer = c_.num_layers + i;
    e_.set_layer(static_cast<int>(layer));
    const std::string p = absl::StrFormat("%slayers.%d.", dec, i);
    TensorId normed = LayerNormModule(p + "self_attn_layer_norm", x);
    TensorId attn = BartAttention(p + "self_attn", normed, normed, causal, true);
    x = e_.Add(p + "attn_residual", x, e_.Dropout(p + "attn_dropout", attn, c_.hidden_dropout));
    normed = LayerNormModule(p + "encoder_attn_layer_norm", x);
    TensorId cross = BartAttention(p + "encoder_attn", normed, encoded, kNone, false);
    x = block_end(p, e_.Add(p + "cross_residual", x, e_.Dropout(p + "cross_dropout", cross, c_.hidden_dropout)));
    HEADROOM_RETURN_IF_ERROR(CheckGraphSize(layer));
  }
  e_.set_layer(-1);
  TensorId decoded = LayerNormModule(dec + "layer_norm", x);
  TensorId logits = Proj("proj_out", decoded, h, vocab, false, Parallel::kColumn, false, kNone,
                         c_.tie_word_embeddings ? embed : kNone);
  if (o_.training) Loss(logits, b * t, vocab);
  return absl::OkStatus();
}

}  // namespace headroom::builders_internal

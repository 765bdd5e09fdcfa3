// Vision transformers: ViT, the CLIP and SigLIP towers, LLaVA.
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "common/status_macros.h"
#include "models/builder.h"

namespace headroom::builders_internal {

// Note [Vision transformers]
// ViTModel and ViTForImageClassification (transformers 4.46's modeling_vit.py) run BERT's encoder blocks over
// image patches, with the norms before each branch:
//  - a Conv2d of kernel and stride patch_size embeds each patch (embeddings.patch_embeddings.projection,
//    with bias), flattened and transposed to [b, patches, hidden] (views); the class token (cls_token,
//    [1, 1, hidden]) is expanded over the batch and concatenated ahead, and position_embeddings
//    ([1, patches + 1, hidden], a parameter added whole, not a lookup) added. The sequence is
//    (image_size / patch_size)^2 + 1 tokens, whatever BuildOptions::seq_len says;
//  - each block: x + attention(layernorm_before(x)), then x + output(intermediate(layernorm_after(x))), with
//    BERT's eager attention (scores divided by sqrt(head_dim), softmax, dropout) under attention.attention and
//    attention.output, and dropout (hidden_dropout_prob, 0 in Google's checkpoints) after each branch;
//  - a final layernorm over every token. ViTForImageClassification's classifier reads the class token;
//    ViTModel's pooler (dense, tanh) likewise. Training a ViTModel attaches the classifier as
//    AutoModelForImageClassification does: it builds ViTForImageClassification, whose ViTModel has no pooler,
//    with the config's num_labels.
// The blocks keep one score-sized tensor less than a decoder's (no mask, no f32 upcast) and, at 197 tokens
// for 224-pixel images and 16-pixel patches, the scores are small beside the MLP's activations.
absl::StatusOr<TensorId> Builder::VisionBody(const std::string& root, int first_layer,
                                             std::vector<TensorId>* hidden_states) {
  const int64_t b = o_.batch, h = c_.hidden_size, patch = c_.patch_size, grid = c_.image_size / patch;
  const int64_t s = c_.image_tokens();
  const bool vit = c_.model_type == "vit", clip = c_.model_type == "clip_vision_model";
  e_.set_layer(-1);
  TensorId pixels =
      e_.Input("pixel_values", {b, c_.in_channels, c_.image_size, c_.image_size}, o_.param_dtype);
  const std::string embed = root + "embeddings.";
  const std::string conv = embed + (vit ? "patch_embeddings.projection" : "patch_embedding");
  TensorId weight = Param(conv + ".weight", {h, c_.in_channels, patch, patch});
  TensorId bias = clip ? kNone : Param(conv + ".bias", {h});  // CLIP's patch embedding has none
  TensorId x = e_.Conv2d(conv, pixels, weight, bias, patch, 0);
  x = e_.View(conv + ".flatten", x, {b, h, grid * grid});
  x = e_.View(conv + ".transpose", x, {b, grid * grid, h});
  if (c_.class_token) {
    TensorId token = vit ? Param(embed + "cls_token", {1, 1, h}) : Param(embed + "class_embedding", {h});
    x = e_.Concat(embed + "cat", {token, x}, {b, s, h});
  }
  if (vit) {
    x = e_.Add(embed + "add_position", x, Param(embed + "position_embeddings", {1, s, h}));
  } else {
    // CLIPVisionEmbeddings and SiglipVisionEmbeddings look their positions up by a position_ids buffer.
    TensorId ids = e_.Buffer(embed + "position_ids", {1, s}, DType::kI64);
    TensorId table = Param(embed + "position_embedding.weight", {s, h});
    x = e_.Add(embed + "add_position", x, e_.Embedding(embed + "position_embedding", ids, table));
  }
  x = e_.Dropout(embed + "dropout", x, c_.embedding_dropout);
  if (clip) x = LayerNormModule(root + "pre_layrnorm", x);  // sic, transformers' name
  if (hidden_states != nullptr) hidden_states->push_back(x);
  // Note [ViT in transformers 5.9]
  // transformers 5.9 rewrote ViT's modules (modeling_vit.py of the 5.8.1 and
  // 5.9.0 wheels): the blocks moved from vit.encoder.layer.N to vit.layers.N,
  // the attention's query/key/value and output.dense became q_proj, k_proj,
  // v_proj and o_proj, and intermediate.dense/output.dense became mlp.fc1 and
  // mlp.fc2. The tensors each block keeps are the same (the tracer's check).
  const bool vit59 = vit && o_.runtime.transformers.AtLeast(5, 9);
  for (int64_t i = 0; i < c_.num_layers; ++i) {
    e_.set_layer(first_layer + static_cast<int>(i));
    const std::string p = vit59 ? absl::StrFormat("%slayers.%d.", root, i)
                                : absl::StrFormat("%sencoder.%s.%d.", root, vit ? "layer" : "layers", i);
    TensorId attn = Attention(p, LayerNormModule(p + (vit ? "layernorm_before" : "layer_norm1"), x), kNone);
    attn = e_.Dropout(p + "attention.output.dropout", attn, c_.hidden_dropout);
    x = e_.Add(p + "attention_residual", attn, x);
    TensorId mlp = Mlp(p, LayerNormModule(p + (vit ? "layernorm_after" : "layer_norm2"), x), kNone);
    mlp = e_.Dropout(p + "output.dropout", mlp, c_.hidden_dropout);
    x = e_.Add(p + "mlp_residual", mlp, x);
    if (hidden_states != nullptr) hidden_states->push_back(x);
    HEADROOM_RETURN_IF_ERROR(CheckGraphSize(i));
  }
  e_.set_layer(-1);
  return x;
}

absl::Status Builder::BuildVision() {
  const int64_t b = o_.batch, h = c_.hidden_size;
  const bool model_only = c_.encoder_head == EncoderHead::kBodyOnly;
  const std::string root = model_only ? "" : "vit.";
  HEADROOM_ASSIGN_OR_RETURN(TensorId x, VisionBody(root, 0));
  x = LayerNormModule(root + "layernorm", x);
  TensorId first = e_.View(root + "class_token", x, {b, h});  // sequence_output[:, 0]
  if (model_only && !o_.training) {
    e_.Activation(root + "pooler.activation", ActivationKind::kTanh,
                  Proj(root + "pooler.dense", first, h, h, true, Parallel::kReplicated));
    return absl::OkStatus();
  }
  TensorId logits = Proj("classifier", first, h, c_.num_labels, true, Parallel::kReplicated);
  if (o_.training) Loss(logits, b, c_.num_labels);
  return absl::OkStatus();
}

// Note [Contrastive towers]
// CLIPModel and SiglipModel (transformers 4.46's modeling_clip.py and modeling_siglip.py) embed a batch of
// images and a batch of texts and score every image against every text:
//  - the vision tower is a vision transformer (VisionBody) with q/k/v/out_proj attention and an fc1/fc2 MLP.
//    CLIP's patch convolution has no bias; a class_embedding vector goes ahead of the patches, positions are
//    looked up by a position_ids buffer, pre_layrnorm normalizes the embeddings, and post_layernorm the class
//    token alone. SigLIP has no class token and no pre-norm; post_layernorm covers every patch, and the
//    pooling head attends from a learned probe over them (nn.MultiheadAttention with one packed in_proj
//    weight, then a layernorm and an MLP with a residual);
//  - the text tower: token and position embeddings, the same pre-norm blocks (CLIP's causally masked, SigLIP's
//    not), final_layer_norm; CLIP pools each text at its end-of-text token (a gather of one row per text),
//    SigLIP at its last position through `head` (Linear(hidden, hidden));
//  - CLIP projects both pooled outputs to projection_dim (visual_projection, text_projection, no bias);
//    both models divide the embeddings by their L2 norms and multiply the text-image similarities
//    [texts, images] by logit_scale.exp(); SigLIP adds logit_bias;
//  - training: CLIP's symmetric cross-entropy over the batch (texts against images, images against texts, the
//    i-th of each matching), SigLIP's sigmoid loss over every pair (+1 on the diagonal, -1 off it):
//    -sum(logsigmoid(signs * logits)) / batch.
// Each tower is built by a Builder of its own config over the same graph and emitter. CLIPModel.forward and
// SiglipModel.forward run the vision tower first, so its blocks take layer indices 0 .. V-1 and the text
// blocks V .. V+T-1; the state-dict names keep each tower's own numbering
// (vision_model.encoder.layers.0, text_model.encoder.layers.0).
absl::StatusOr<TensorId> Builder::VisionTower(int first_layer, const std::string& root,
                                              std::vector<TensorId>* hidden_states) {
  const int64_t b = o_.batch, h = c_.hidden_size;
  HEADROOM_ASSIGN_OR_RETURN(TensorId x, VisionBody(root, first_layer, hidden_states));
  if (c_.model_type == "clip_vision_model") {
    // pooled_output = post_layernorm(last_hidden_state[:, 0, :]).
    return LayerNormModule(root + "post_layernorm", e_.View(root + "class_token", x, {b, h}));
  }
  x = LayerNormModule(root + "post_layernorm", x);
  return AttentionPool(root + "head.", x);
}

TensorId Builder::AttentionPool(const std::string& head, TensorId x) {
  const int64_t b = o_.batch, s = seq_, h = c_.hidden_size, heads = c_.num_heads, d = c_.head_dim;
  // probe.repeat(batch, 1, 1): a copy.
  TensorId probe = e_.Concat(head + "probe.repeat", {Param(head + "probe", {1, 1, h})}, {b, 1, h});
  // F.multi_head_attention_forward (PyTorch 1.13+, need_weights): q from the probe and k, v from the patches
  // through slices of in_proj_weight; k and v made contiguous per head; scores and softmax kept for backward.
  const std::string mha = head + "attention.";
  TensorId weight = Param(mha + "in_proj_weight", {3 * h, h});
  TensorId bias = Param(mha + "in_proj_bias", {3 * h});
  TensorId q =
      e_.Linear(mha + "in_proj_q", probe, e_.View(mha + "w_q", weight, {h, h}), e_.View(mha + "b_q", bias, {h}));
  TensorId kv = e_.Linear(mha + "in_proj_kv", x, e_.View(mha + "w_kv", weight, {2 * h, h}),
                          e_.View(mha + "b_kv", bias, {2 * h}));
  TensorId k = e_.Contiguous(mha + "k", e_.View(mha + "k_chunk", kv, {b, s, h}));
  TensorId v = e_.Contiguous(mha + "v", e_.View(mha + "v_chunk", kv, {b, s, h}));
  TensorId q_scaled = e_.Scale(mha + "q_scaled", q);
  TensorId scores = e_.MatMul(mha + "qk", e_.View(mha + "q_heads", q_scaled, {b * heads, 1, d}),
                              e_.View(mha + "k_heads", k, {b * heads, s, d}), /*b_transposed=*/true);
  TensorId probs = e_.Softmax(mha + "softmax", scores);
  TensorId context = e_.MatMul(mha + "pv", probs, e_.View(mha + "v_heads", v, {b * heads, s, d}));
  TensorId merged = e_.Contiguous(mha + "merge_heads", e_.View(mha + "context", context, {b, h}));
  TensorId y = Proj(mha + "out_proj", merged, h, h, true, Parallel::kReplicated);
  y = e_.View(mha + "out", y, {b, 1, h});
  TensorId mlp = Mlp(head, LayerNormModule(head + "layernorm", y), kNone);
  return e_.View(head + "first", e_.Add(head + "residual", y, mlp), {b, h});  // hidden_state[:, 0]
}

absl::StatusOr<TensorId> Builder::TextTower(int first_layer) {
  const int64_t b = o_.batch, s = seq_, h = c_.hidden_size;
  const bool clip = c_.model_type == "clip_text_model";
  const std::string root = "text_model.", embed = root + "embeddings.";
  e_.set_layer(-1);
  TensorId ids = e_.Input("input_ids", {b, s}, DType::kI64);
  TensorId x =
      e_.Embedding(embed + "token_embedding", ids, Param(embed + "token_embedding.weight", {c_.vocab_size, h}));
  TensorId position_ids = e_.Buffer(embed + "position_ids", {1, c_.max_position_embeddings}, DType::kI64);
  TensorId table = Param(embed + "position_embedding.weight", {c_.max_position_embeddings, h});
  x = e_.Add(embed + "add_position", x,
             e_.Embedding(embed + "position_embedding", e_.View(embed + "positions", position_ids, {1, s}), table));
  for (int64_t i = 0; i < c_.num_layers; ++i) {
    e_.set_layer(first_layer + static_cast<int>(i));
    const std::string p = absl::StrFormat("%sencoder.layers.%d.", root, i);
    x = e_.Add(p + "attention_residual", Attention(p, LayerNormModule(p + "layer_norm1", x), kNone), x);
    x = e_.Add(p + "mlp_residual", Mlp(p, LayerNormModule(p + "layer_norm2", x), kNone), x);
    HEADROOM_RETURN_IF_ERROR(CheckGraphSize(i));
  }
  e_.set_layer(-1);
  x = LayerNormModule(root + "final_layer_norm", x);
  if (clip) {
    // last_hidden_state[arange(batch), eos positions]: one row of each text, gathered.
    return e_.GatherRows(root + "pooled", e_.View(root + "flat", x, {b * s, h}), b);
  }
  return Proj(root + "head", e_.View(root + "last_token", x, {b, h}), h, h, true, Parallel::kReplicated);
}

TensorId Builder::Normalize(const std::string& name, TensorId x) {
  // CLIP writes the norm as pow(sum(pow(x, 2)), 0.5), which keeps x and the [rows, 1] sum; Tensor.norm keeps x
  // and the [rows, 1] norm: the same bytes. The division keeps both operands.
  return e_.Mul(name, x, e_.VectorNorm(name + ".norm", x));
}

absl::Status Builder::BuildContrastive() {
  const ModelConfig& text = c_.text_tower();
  const ModelConfig& vision = c_.vision_tower();
  const int64_t b = o_.batch;
  const bool clip = c_.model_type == "clip";
  Builder vision_builder(vision, *this, vision.image_tokens());
  HEADROOM_ASSIGN_OR_RETURN(TensorId image, vision_builder.VisionTower(0));
  MergeTower(vision_builder);
  Builder text_builder(text, *this, o_.seq_len);
  HEADROOM_ASSIGN_OR_RETURN(TensorId words, text_builder.TextTower(static_cast<int>(vision.num_layers)));
  MergeTower(text_builder);
  e_.set_layer(-1);
  if (clip) {
    image = Proj("visual_projection", image, vision.hidden_size, c_.projection_dim, false, Parallel::kReplicated);
    words = Proj("text_projection", words, text.hidden_size, c_.projection_dim, false, Parallel::kReplicated);
  }
  image = Normalize("image_embeds", image);
  words = Normalize("text_embeds", words);
  // CLIP's logit_scale is a 0-dim parameter, SigLIP's logit_scale and logit_bias have one element.
  TensorId scale =
      e_.Exp("logit_scale.exp", Param("logit_scale", clip ? std::vector<int64_t>{} : std::vector<int64_t>{1}));
  TensorId logits = e_.Mul("logits_per_text.scale", e_.MatMul("logits_per_text", words, image, /*b_transposed=*/true),
                           scale);
  if (!clip) logits = e_.Add("logits_per_text.bias", logits, Param("logit_bias", {1}));
  if (!o_.training) return absl::OkStatus();
  e_.set_phase(Phase::kLoss);
  if (clip) {
    // (cross_entropy(logits_per_text, arange) + cross_entropy(logits_per_text.t(), arange)) / 2.
    TensorId targets = e_.Input("labels", {b}, DType::kI64);
    TensorId texts = e_.CrossEntropy("loss.text", logits, targets);
    TensorId images = e_.CrossEntropy("loss.image", e_.View("logits_per_image", logits, {b, b}), targets);
    e_.Scale("loss", e_.Add("loss.sum", texts, images));
  } else {
    // -logsigmoid((2 * eye(batch) - 1) * logits).sum() / batch.
    TensorId signs = e_.Zeros("loss.signs", {b, b}, g_.tensor(logits).dtype);
    TensorId pairs = e_.LogSigmoid("loss.log_sigmoid", e_.Mul("loss.signed_logits", signs, logits));
    e_.Scale("loss", e_.View("loss.sum", pairs, {}));
  }
  e_.set_phase(Phase::kForward);
  return absl::OkStatus();
}

// Note [LLaVA]
// LlavaForConditionalGeneration (transformers 4.46's modeling_llava.py) puts images among a decoder's tokens:
//  - the processor writes image_seq_length image tokens (image_token_index) into input_ids per image, so the
//    language model's sequence holds the text and the image tokens together: BuildOptions::seq_len counts
//    both, and the KV cache of inference covers both (--context likewise). Each image fills
//    image_feature_tokens() positions: its (image_size / patch_size)^2 patches under
//    vision_feature_select_strategy "default" (576 for CLIP ViT-L/14 at 336 pixels), one more under "full";
//  - forward looks the tokens up first (language_model.model.embed_tokens, image tokens included), then
//    get_image_features: the CLIPVisionModel (vision_tower.vision_model.*) over the batch x images images with
//    output_hidden_states=True, so every block runs, the last ones and post_layernorm of the class token too,
//    although only hidden_states[vision_feature_layer] (-2: the penultimate block's output) is read; the
//    tuple of all hidden states, last_hidden_state and the pooled output stay referenced until
//    get_image_features returns, after the projector (a scope end here). "default" slices off the class token
//    ([:, 1:], a strided view that linear_1's matmul copies to fold batch and tokens; under autocast the cast
//    is that copy); multi_modal_projector is linear_1 (vision hidden -> text hidden), projector_hidden_act,
//    linear_2, both with bias;
//  - the features are cast to the embeddings' dtype and masked_scatter'ed into the image-token positions
//    (autograd keeps the bool mask); the language model runs on the merged embeddings as any decoder, its
//    blocks numbered after the vision tower's (vision blocks 0 .. V-1, language blocks V .. V+T-1, as
//    forward runs them); the features stay referenced as the output's image_hidden_states;
//  - training: LLaVA computes its own loss (labels are not passed to the language model): logits[..., :-1, :]
//    made contiguous and cross-entropy against the shifted labels, in the logits' dtype, with no f32 upcast.
// What trains (BuildOptions::vlm_trainable): by default LLaVA-1.5's second stage, visual instruction tuning,
// which trains the projector and the language model with the vision tower frozen (Liu et al. 2023, "Improved
// Baselines with Visual Instruction Tuning", and its training scripts: the CLIP encoder is frozen in both stages);
// "projector" is its first stage, feature alignment, with the language model frozen too (its activations are
// still saved: the projector's gradient flows back through it); "all" is what a plain loop over
// transformers' model trains, every parameter requiring grad. A frozen vision tower saves nothing
// (Note [Saved tensors follow requires_grad]). LoRA adapts the language model's targeted Linears only, the
// projector training fully as in LLaVA-1.5's LoRA recipe, the vision tower frozen without adapters or NF4
// quantization (LLaVA's scripts skip mm_projector and keep the vision tower out of PEFT's targets).
// Tensor parallelism is not modelled (the vision tower has no tensor-parallel builder).
absl::StatusOr<TensorId> Builder::LlavaImageFeatures() {
  const ModelConfig& vision = c_.vision_tower();
  const int64_t n = o_.batch * o_.images, hv = vision.hidden_size, h = c_.hidden_size;
  BuildOptions vision_options = o_;
  vision_options.batch = n;
  Builder tower(vision, *this, vision.image_tokens(), vision_options);
  tower.trainable_ = o_.vlm_trainable == VlmTrainable::kAll;
  tower.lora_scope_ = false;
  std::vector<TensorId> hidden_states;
  HEADROOM_ASSIGN_OR_RETURN(TensorId pooled, tower.VisionTower(0, "vision_tower.vision_model.", &hidden_states));
  e_.set_layer(-1);
  const TensorId selected = hidden_states[static_cast<size_t>(c_.vision_feature_layer)];
  // image_outputs holds the hidden states and the pooled output until get_image_features returns, and with them
  // the autograd nodes of the blocks after the selected one, which no gradient reaches: what those save too.
  std::set<TensorId> locals(hidden_states.begin(), hidden_states.end());
  locals.insert(pooled);
  for (OpId id = g_.producer(selected) + 1; id < static_cast<OpId>(g_.num_ops()); ++id) {
    locals.insert(g_.op(id).saved.begin(), g_.op(id).saved.end());
  }
  TensorId features = selected;
  const int64_t tokens = c_.image_feature_tokens();
  if (!c_.vision_feature_full) {
    features = e_.View("vision_feature_select", features, {n, tokens, hv});  // [:, 1:]
    if (!e_.options().autocast) features = e_.Contiguous("multi_modal_projector.linear_1.fold", features);
  }
  const std::string projector = "multi_modal_projector.";
  TensorId y = Proj(projector + "linear_1", features, hv, h, true, Parallel::kReplicated);
  y = Activation(projector + "act", y);
  y = Proj(projector + "linear_2", y, h, h, true, Parallel::kReplicated);
  e_.ScopeEnd("vision_tower.outputs_released", std::vector<TensorId>(locals.begin(), locals.end()));
  return y;
}

absl::Status Builder::BuildLlava() {
  const int64_t b = o_.batch, s = o_.seq_len;
  Builder language(c_.text_tower(), *this, s);
  language.prefix_ = "language_model.";
  language.first_layer_ = static_cast<int>(c_.vision_tower().num_layers);
  // Before transformers 4.52 LLaVA computed its own loss in the logits' dtype; from 4.52 it calls the causal LM
  // loss, which casts them to f32.
  language.upcast_logits_ = o_.runtime.transformers.AtLeast(4, 52);
  language.for_causal_lm_loss_ = language.upcast_logits_;
  if (o_.vlm_trainable == VlmTrainable::kProjector) language.trainable_ = false;
  HEADROOM_RETURN_IF_ERROR(language.CheckOptions());
  trainable_ = true;  // this builder's own parameters: the projector's
  TensorId image_features = kNone;
  auto merge = [&](TensorId ids, TensorId embeddings) -> absl::StatusOr<TensorId> {
    if (o_.images == 0) return embeddings;  // no pixel_values: the language model alone
    HEADROOM_ASSIGN_OR_RETURN(image_features, LlavaImageFeatures());
    // (input_ids == image_token_index).unsqueeze(-1).expand_as(inputs_embeds): one bool per token.
    TensorId mask = e_.Materialize("image_token_mask", "eq", {ids}, {b, s}, DType::kBool);
    TensorId source = e_.Cast("image_features.to", image_features, g_.tensor(embeddings).dtype);
    return e_.MaskedScatter("inputs_embeds.masked_scatter", embeddings, mask, source);
  };
  HEADROOM_RETURN_IF_ERROR(language.BuildDecoder(merge));
  MergeTower(language);
  if (image_features != kNone) {
    // The output's image_hidden_states: alive until forward returns, after the loss.
    if (o_.training) e_.set_phase(Phase::kLoss);
    e_.ScopeEnd("image_hidden_states", {image_features});
    e_.set_phase(Phase::kForward);
  }
  return absl::OkStatus();
}

}  // namespace headroom::builders_internal

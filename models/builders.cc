#include "models/builders.h"

#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/checked_math.h"
#include "common/name_table.h"
#include "common/quote.h"
#include "common/status_macros.h"
#include "models/builder.h"
#include "models/model_registry.h"

namespace headroom::builders_internal {

bool IsLlamaLike(const ModelConfig& c) {
  const models_internal::ModelFamilyEntry* family = models_internal::FindFamily(c.model_type);
  return family != nullptr && family->llama_like;
}

bool UpcastsLogits(const ModelConfig& c) {
  return IsLlamaLike(c) || c.model_type == "gptj" || c.model_type == "gpt_oss" || c.model_type == "llama4_text";
}

bool UsesForCausalLmLoss(const ModelConfig& c, const TorchRuntime& runtime) {
  return (UpcastsLogits(c) && c.model_type != "gptj") || (c.model_type == "gpt2" && runtime.transformers.AtLeast(5, 0));
}

DecoderNames DecoderNamesOf(const ModelConfig& c) {
  const models_internal::ModelFamilyEntry* family = models_internal::FindFamily(c.model_type);
  return family != nullptr && family->decoder_names != nullptr ? family->decoder_names(c) : DecoderNames{};
}

std::vector<std::string> DefaultLoraTargets(const ModelConfig& c, const TransformersVersion& transformers) {
  const models_internal::ModelFamilyEntry* family = models_internal::FindFamily(c.model_type);
  if (family != nullptr && family->lora_targets != nullptr) return family->lora_targets(c, transformers);
  return {"q_proj", "v_proj"};
}

absl::Status Builder::CheckOptions() const {
  const ConfigFieldNames fields = FieldNamesOf(c_);
  if (o_.batch <= 0) {
    return absl::InvalidArgumentError(absl::StrFormat("batch must be positive, got %d", o_.batch));
  }
  if (c_.model_type == "gpt_oss" && !o_.runtime.transformers.AtLeast(5, 0)) {
    // Note [GPT-OSS]: the experts as transformers 5 runs them.
    return absl::InvalidArgumentError(absl::StrFormat(
        "GPT-OSS is modelled as transformers 5 runs its experts (grouped matmuls); transformers %s loops over "
        "the experts in Python, which is not modelled",
        TransformersVersionName(o_.runtime.transformers)));
  }
  const bool transformer = c_.family == ModelFamily::kDecoder || c_.family == ModelFamily::kEncoder ||
                           c_.family == ModelFamily::kEncoderDecoder;
  if ((transformer || c_.family == ModelFamily::kStateSpace) && o_.seq_len <= 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("seq_len must be positive, got %d", o_.seq_len));
  }
  // Whisper's decoder reads target_seq_len tokens when it is set, seq_len otherwise (Note [Whisper]).
  const bool seq_unused = c_.model_type == "whisper" && o_.target_seq_len > 0;
  if (transformer && c_.positions == PositionKind::kLearned && !seq_unused &&
      o_.seq_len > c_.max_position_embeddings) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "seq_len %d exceeds the model's %s (%d): its learned position embeddings end there",
        o_.seq_len, fields.positions, c_.max_position_embeddings));
  }
  // Vision transformers attend over their image's patches (seq_len is ignored); two-tower models read
  // seq_len as the text tower's tokens.
  const bool vision = c_.family == ModelFamily::kVision || c_.family == ModelFamily::kContrastive ||
                      c_.family == ModelFamily::kVisionLanguage;
  if (c_.family == ModelFamily::kVisionLanguage) {
    // Note [LLaVA]: seq_len counts the text and the image tokens.
    if (o_.seq_len <= 0) {
      return absl::InvalidArgumentError(absl::StrFormat("seq_len must be positive, got %d", o_.seq_len));
    }
    if (o_.images < 0) {
      return absl::InvalidArgumentError(absl::StrFormat("images must not be negative, got %d", o_.images));
    }
    const int64_t per_image = c_.image_feature_tokens();
    if (o_.images > o_.seq_len / per_image) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "seq_len %d is too short for %d image(s) of %d tokens each ((vision_config.image_size %d / patch_size "
          "%d)^2%s); seq_len counts the text and the image tokens",
          o_.seq_len, o_.images, per_image, c_.vision_tower().image_size, c_.vision_tower().patch_size,
          c_.vision_feature_full ? " + 1" : ""));
    }
    if (o_.lora.enabled() && o_.vlm_trainable != VlmTrainable::kProjectorAndLanguage) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "LoRA adapts the language model with the projector trained (vlm_trainable projector+lm), not "
          "vlm_trainable %s",
          VlmTrainableName(o_.vlm_trainable)));
    }
  } else if (own_e_ != nullptr && (o_.images != 1 || o_.vlm_trainable != VlmTrainable::kProjectorAndLanguage)) {
    // (A top-level model: LLaVA's language model is checked as a tower under LLaVA's options.)
    return absl::InvalidArgumentError(absl::StrFormat(
        "images and vlm_trainable apply to vision-language models (LLaVA) only, not %s", c_.architecture));
  }
  if (c_.family == ModelFamily::kContrastive) {
    const int64_t positions = c_.text_tower().max_position_embeddings;
    if (o_.seq_len <= 0 || o_.seq_len > positions) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "seq_len %d: the text tower takes 1 to text_config.max_position_embeddings (%d) tokens", o_.seq_len,
          positions));
    }
  }
  if (c_.model_type == "gptj" && o_.seq_len > c_.max_position_embeddings) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "seq_len %d exceeds the model's %s (%d): its sinusoidal position table ends there", o_.seq_len,
        fields.positions, c_.max_position_embeddings));
  }
  auto floating = [](DType d) {
    return d == DType::kF32 || d == DType::kBF16 || d == DType::kF16 || d == DType::kF64;
  };
  if (!floating(o_.param_dtype)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "param_dtype must be f32, bf16 or f16, got %s", DTypeName(o_.param_dtype)));
  }
  if (!floating(o_.compute_dtype) && o_.compute_dtype != DType::kF8E4M3 &&
      o_.compute_dtype != DType::kF8E5M2) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "compute_dtype must be f32, bf16, f16 or fp8, got %s", DTypeName(o_.compute_dtype)));
  }
  if (DTypeBytes(o_.compute_dtype, 1) > DTypeBytes(o_.param_dtype, 1)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "compute_dtype %s is wider than param_dtype %s; mixed precision keeps weights at least "
        "as wide as the math",
        DTypeName(o_.compute_dtype), DTypeName(o_.param_dtype)));
  }
  if (o_.tensor_parallel < 1) {
    return absl::InvalidArgumentError(
        absl::StrFormat("tensor_parallel must be >= 1, got %d", o_.tensor_parallel));
  }
  if (o_.dtensor && o_.tensor_parallel == 1) {
    return absl::InvalidArgumentError("dtensor needs tensor_parallel > 1");
  }
  if (o_.sequence_parallel && o_.tensor_parallel == 1) {
    return absl::InvalidArgumentError("sequence_parallel needs tensor_parallel > 1");
  }
  if (o_.tensor_parallel > 1) {
    if (c_.is_mla() || c_.family == ModelFamily::kEncoderDecoder) {
      return absl::InvalidArgumentError(
          absl::StrFormat("tensor_parallel %d: %s is not modelled under tensor parallelism", t_,
                          c_.is_mla() ? "latent attention" : c_.architecture));
    }
    if (vision) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "tensor_parallel %d: not modelled for %s's vision transformer; shard it with FSDP or ZeRO instead", t_,
          c_.architecture));
    }
    if (!transformer) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "tensor_parallel is supported for transformers only, not %s", c_.architecture));
    }
    if (c_.num_heads % t_ != 0) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s (%d) is not divisible by tensor_parallel (%d)", fields.heads, c_.num_heads, t_));
    }
    if (c_.num_kv_heads % t_ != 0) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s (%d) is not divisible by tensor_parallel (%d)", fields.kv_heads, c_.num_kv_heads,
          t_));
    }
    if (c_.intermediate_size % t_ != 0) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s (%d) is not divisible by tensor_parallel (%d)", fields.intermediate,
          c_.intermediate_size, t_));
    }
    if (o_.sequence_parallel && o_.seq_len % t_ != 0) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "seq_len (%d) is not divisible by tensor_parallel (%d), which sequence parallelism "
          "needs",
          o_.seq_len, t_));
    }
  }
  const LoraOptions& lora = o_.lora;
  if (lora.rank < 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("lora rank must not be negative, got %d", lora.rank));
  }
  if (lora.quantize_base_nf4 && !lora.enabled()) {
    return absl::InvalidArgumentError("QLoRA (NF4 base weights) needs a lora rank > 0");
  }
  if (lora.enabled()) {
    if (!transformer && !vision) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "LoRA is supported for transformers only, not %s", c_.architecture));
    }
    if (!(lora.alpha > 0)) {
      return absl::InvalidArgumentError(
          absl::StrFormat("lora alpha must be positive, got %g", lora.alpha));
    }
    if (!(lora.dropout >= 0 && lora.dropout < 1)) {
      return absl::InvalidArgumentError(
          absl::StrFormat("lora dropout must be in [0, 1), got %g", lora.dropout));
    }
    if (lora.quant_block_size <= 0 || lora.nested_block_size <= 0) {
      return absl::InvalidArgumentError("QLoRA block sizes must be positive");
    }
  }
  if (!HasFlashAttentionPath(c_) && o_.attention == AttentionImpl::kFlash) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "attention flash: %s adds a position bias to its attention scores and has no flash attention path; use "
        "eager attention",
        c_.architecture));
  }
  if (c_.architecture == "GPT2Model" && o_.training) {
    return absl::InvalidArgumentError(
        "GPT2Model has no language-model head to train; use GPT2LMHeadModel");
  }
  return absl::OkStatus();
}

TensorId Builder::LayerNormModule(const std::string& prefix, TensorId x) {
  TensorId w = Param(prefix + ".weight", {c_.hidden_size});
  TensorId b = c_.norm_bias ? Param(prefix + ".bias", {c_.hidden_size}) : kNone;
  return e_.LayerNorm(prefix, x, w, b);
}

TensorId Builder::Norm(const std::string& prefix, TensorId x) {
  if (c_.norm == NormKind::kRmsNorm) {
    TensorId weight = Param(prefix + ".weight", {c_.hidden_size});
    if (o_.rms_norm == RmsNormImpl::kEager) return EagerRmsNorm(prefix, x, weight);
    return e_.RmsNorm(prefix, x, weight);
  }
  return LayerNormModule(prefix, x);
}

TensorId Builder::RmsNormOver(const std::string& prefix, TensorId x, int64_t width) {
  TensorId weight = Param(prefix + ".weight", {width});
  if (o_.rms_norm == RmsNormImpl::kEager) return EagerRmsNorm(prefix, x, weight);
  return e_.RmsNorm(prefix, x, weight);
}

TensorId Builder::SoftCap(const std::string& name, TensorId x) {
  TensorId scaled = e_.Scale(name + ".div", x);
  return e_.Scale(name + ".mul", e_.Activation(name + ".tanh", ActivationKind::kTanh, scaled));
}

// Note [gelu_new]
// transformers' NewGELUActivation ("gelu_new", GPT-2's default) computes
//   0.5 * x * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 * x^3)))
// in PyTorch ops, so autograd keeps x (for pow), 0.5 * x, the tanh's output
// and 1 + tanh besides the result: four intermediate-sized tensors per layer
// where F.gelu(approximate="tanh") ("gelu_pytorch_tanh") keeps one. Under
// CUDA autocast pow runs in f32 (it is on autocast's f32 list), so x is cast
// to f32 for it and every tensor after it is f32 by type promotion, 0.5 * x
// excepted: three of the four kept tensors are f32 (the GPT-2 CUDA fixtures
// hold four scores- or MLP-sized 2 MiB blocks per layer at the loss, as
// this gives). CPU autocast leaves pow in the input's dtype.
//
// Note [quick_gelu]
// CLIP's QuickGELUActivation computes x * sigmoid(1.702 * x) in PyTorch ops:
// autograd keeps x and the sigmoid's output (the 1.702 * x between them is
// freed), two intermediate-sized tensors where F.gelu keeps one.
TensorId Builder::Activation(const std::string& name, TensorId x) {
  if (c_.activation == ActivationKind::kQuickGelu) {
    TensorId gate = e_.Activation(name + ".sigmoid", ActivationKind::kSigmoid, e_.Scale(name + ".scale", x));
    return e_.Mul(name, x, gate);
  }
  if (c_.activation != ActivationKind::kGeluNew) return e_.Activation(name, c_.activation, x);
  TensorId half = e_.Scale(name + ".half", x);
  const EmitterOptions& o = e_.options();
  TensorId base = o.autocast && o.runtime.kernels == Kernels::kCuda
                      ? e_.Cast(name + ".cube_input_cast", x, o.autocast_wide_dtype)
                      : x;
  TensorId cube = e_.Scale(name + ".cube_scale", e_.Pow(name + ".cube", base));
  TensorId inner = e_.Scale(name + ".inner_scale", e_.Add(name + ".inner", x, cube));
  TensorId one_plus = e_.Scale(name + ".one_plus", e_.Activation(name + ".tanh", ActivationKind::kTanh, inner));
  return e_.Mul(name, half, one_plus);
}

// Note [Eager RMSNorm]
// Hugging Face's LlamaRMSNorm (also Mistral's, Qwen2's and Mixtral's) is
// written in PyTorch ops:
//   x32 = x.to(float32); var = x32.pow(2).mean(-1, keepdim=True)
//   normed = x32 * torch.rsqrt(var + eps); return weight * normed.to(x.dtype)
// so autograd keeps x32 (a copy when x is 16-bit), rstd and the normalized
// tensor (saved by the weight multiplication), besides the output the next
// linear saves: one hidden-sized tensor more than a fused kernel, which keeps
// only x and rstd. Before PyTorch 2.0 the mean also kept x^2 (Note [Runtime
// differences]). The "+ eps" is folded into the rsqrt: its [b, s, 1] result
// is freed at once.
TensorId Builder::EagerRmsNorm(const std::string& prefix, TensorId x, TensorId weight) {
  const DType input_dtype = g_.tensor(x).dtype;
  TensorId wide = e_.Cast(prefix + ".to_float", x, DType::kF32);
  TensorId variance = e_.MeanLastDim(prefix + ".variance", e_.Pow(prefix + ".square", wide));
  TensorId rstd = e_.Rsqrt(prefix + ".rstd", variance);
  if (c_.norm_plus_one) {
    // Note [Gemma decoders]: (x32 * rstd) * (1 + weight.float()), then back to x's dtype.
    TensorId one_plus = e_.Scale(prefix + ".one_plus_weight", e_.Cast(prefix + ".weight_float", weight, DType::kF32));
    TensorId scaled = e_.Mul(prefix + ".scale", e_.Mul(prefix + ".normalize", wide, rstd), one_plus);
    return e_.Cast(prefix, scaled, input_dtype);
  }
  if (c_.model_type == "gpt_oss") {
    // GptOssRMSNorm: (weight * x32 * rstd).to(x.dtype), the weight applied in f32 (Note [GPT-OSS]).
    TensorId scaled = e_.Mul(prefix + ".scale", weight, e_.Mul(prefix + ".normalize", wide, rstd));
    return e_.Cast(prefix, scaled, input_dtype);
  }
  TensorId normed = e_.Cast(prefix + ".to_input_dtype", e_.Mul(prefix + ".normalize", wide, rstd), input_dtype);
  return e_.Mul(prefix, weight, normed);
}

TensorId Builder::L2Norm(const std::string& prefix, TensorId x) {
  const DType input_dtype = g_.tensor(x).dtype;
  TensorId wide = e_.Cast(prefix + ".to_float", x, DType::kF32);
  TensorId variance = e_.MeanLastDim(prefix + ".variance", e_.Pow(prefix + ".square", wide));
  TensorId rstd = e_.Rsqrt(prefix + ".rstd", variance);
  return e_.Cast(prefix, e_.Mul(prefix + ".normalize", wide, rstd), input_dtype);
}

TensorId Builder::Proj(const std::string& module, TensorId x, int64_t in, int64_t out, bool bias,
                       Parallel /*parallel*/, bool conv1d, TensorId x_shard,
                       TensorId tied_weight) {
  if (o_.dtensor) x_shard = kNone;  // BuildOptions::dtensor: the gathered input is what autograd saves
  const std::string leaf = module.substr(module.rfind('.') + 1);
  // Blocks LoRA may adapt and QLoRA quantize: not those of a tower outside lora_scope_.
  const bool in_block = e_.layer() >= 0 && lora_scope_;
  if (in_block) seen_leaves_.insert(leaf);
  const bool lora =
      o_.lora.enabled() && in_block &&
      (lora_targets_.count(leaf) > 0 || lora_targets_.count("all-linear") > 0);
  if (lora) used_targets_.insert(lora_targets_.count(leaf) > 0 ? leaf : "all-linear");

  std::vector<int64_t> weight_shape = conv1d ? std::vector<int64_t>{in, out}
                                             : std::vector<int64_t>{out, in};
  TensorId weight = tied_weight;
  if (weight == kNone && o_.lora.quantize_base_nf4 && in_block) {
    // Note [QLoRA storage]: bitsandbytes quantizes every Linear of the
    // blocks (not the embeddings or the LM head) to NF4 with one absmax per
    // 64 weights; double quantization stores those as 8-bit with one f32
    // constant per 256 of them: 0.127 bits/parameter (Dettmers et al. 2023,
    // Section 3, "Double Quantization").
    const std::string name = module + ".weight";
    weight = e_.Parameter(name, weight_shape, DType::kNF4, /*trainable=*/false);
    const int64_t n = in * out;
    const int64_t blocks = CeilDiv(n, o_.lora.quant_block_size);
    std::vector<TensorId> constants;
    if (o_.lora.double_quant) {
      constants.push_back(e_.Buffer(name + ".absmax", {blocks}, DType::kU8));
      constants.push_back(e_.Buffer(name + ".nested_absmax",
                                    {CeilDiv(blocks, o_.lora.nested_block_size)}, DType::kF32));
      constants.push_back(e_.Buffer(name + ".nested_quant_map", {256}, DType::kF32));
    } else {
      constants.push_back(e_.Buffer(name + ".absmax", {blocks}, DType::kF32));
    }
    constants.push_back(e_.Buffer(name + ".quant_map", {16}, DType::kF32));
    weight = e_.DequantizeNf4(module + ".dequantize", weight, constants, weight_shape);
  } else if (weight == kNone) {
    weight = Param(module + ".weight", weight_shape);
  }
  // Row-parallel biases are replicated and added once after the reduction;
  // counting them with the shard is what Megatron does too.
  TensorId b = bias ? Param(module + ".bias", {out}) : kNone;
  if (b != kNone && o_.lora.quantize_base_nf4 && in_block) {
    g_.mutable_tensor(b).trainable = false;
  }
  TensorId y = e_.Linear(module, x, weight, b, x_shard);
  if (!lora) return y;

  // PEFT's LoRA Linear: result + lora_B(lora_A(dropout(x))) * (alpha / r).
  const int64_t r = o_.lora.rank;
  // Under tensor parallelism A follows the base layer's input split and B
  // its output split, so both are this shard's.
  TensorId a = e_.Parameter(module + ".lora_A.weight", {r, in}, o_.param_dtype, true);
  TensorId bw = e_.Parameter(module + ".lora_B.weight", {out, r}, o_.param_dtype, true);
  TensorId dropped = e_.Dropout(module + ".lora_dropout", x, o_.lora.dropout);
  TensorId down = e_.Linear(module + ".lora_A", dropped, a, kNone,
                            dropped == x ? x_shard : kNone);
  TensorId up = e_.Linear(module + ".lora_B", down, bw);
  TensorId scaled = e_.Scale(module + ".lora_scale", up);
  return e_.Add(module + ".lora_add", y, scaled);
}

TensorId Builder::ReduceOutput(const std::string& name, TensorId x) {
  if (t_ == 1) return x;
  if (sp_) return e_.ReduceScatter(name + ".reduce_scatter", x, 1, t_);
  return e_.AllReduce(name + ".all_reduce", x, t_);
}

std::tuple<TensorId, TensorId, TensorId> Builder::FusedQkv(const std::string& module, TensorId x, TensorId x_shard,
                                                           bool conv1d) {
  const int64_t b = o_.batch, s = seq_, d = c_.head_dim;
  const int64_t heads = c_.num_heads / t_, kv = c_.num_kv_heads / t_;
  TensorId qkv = Proj(module, x, c_.hidden_size, (heads + 2 * kv) * d, c_.qkv_bias, Parallel::kColumn, conv1d,
                      x_shard);
  // Each view a statement of its own: tensor ids follow program order, q then k then v.
  TensorId q = e_.View(module + ".q", qkv, {b, heads, s, d});
  TensorId k = e_.View(module + ".k", qkv, {b, kv, s, d});
  return {q, k, e_.View(module + ".v", qkv, {b, kv, s, d})};
}

TensorId Builder::Loss(TensorId logits, int64_t rows, int64_t classes) {
  e_.set_layer(-1);
  e_.set_phase(Phase::kLoss);
  TensorId labels = e_.Input("labels", {rows}, DType::kI64);
  TensorId flat = e_.View("loss.logits_flat", logits, {rows, classes});
  TensorId loss = e_.CrossEntropy("loss", flat, labels);
  e_.set_phase(Phase::kForward);
  return loss;
}

// Note [Causal LM loss]
// Hugging Face's causal LMs (transformers 4.46, ForCausalLMLoss and GPT-2's
// forward) predict token t+1 from position t:
//   logits = logits.float()                       # Llama-like models only
//   shift_logits = logits[..., :-1, :].contiguous()
//   loss = F.cross_entropy(shift_logits.view(-1, vocab), shift_labels.view(-1))
// The upcast is a copy of the logits when they are 16-bit, the shift another
// copy (of s - 1 positions), and cross-entropy keeps log-softmax's output.
// Backward writes a dense gradient of the log-probabilities (nll_loss), then
// one of the shifted logits (log_softmax) while the first is live, then a
// zero-filled gradient of the whole logits that the slice copies into: at the
// start of backward several logits-sized tensors coexist, more than any one
// layer's activations when the vocabulary is large.
//
// From transformers 4.49 ForCausalLMLoss shifts the labels instead (pad them
// with ignore_index, then labels[..., 1:].contiguous()) and takes the loss
// over all s positions of the logits, with no copy of them (transformers PR
// #35646, "Optimize ForCausalLMLoss by removing unnecessary contiguous()
// call", merged 2025-01-13, after 4.48.0; the boundary is inferred from that
// date, the behaviour measured on 5.17). GPT-2 computes its loss through
// ForCausalLMLoss too by transformers 5, so it upcasts: the CUDA fixtures
// (5.17) hold three full-length f32 logits-sized tensors at the loss's
// backward, where 4.46.3 (the CPU fixtures) held none upcast.
TensorId Builder::CausalLmLoss(TensorId logits, int64_t vocab) {
  const int64_t b = o_.batch, s = o_.seq_len;
  e_.set_layer(-1);
  e_.set_phase(Phase::kLoss);
  const TensorId model_logits = logits;
  if (upcast_logits_ || for_causal_lm_loss_) logits = e_.Cast("loss.logits_float", logits, DType::kF32);
  TensorId labels = e_.Input("labels", {b, s}, DType::kI64);
  TensorId flat;
  TensorId flat_labels;
  if (for_causal_lm_loss_ && o_.runtime.transformers.AtLeast(4, 49)) {
    TensorId padded = e_.Concat("loss.pad_labels", {labels}, {b, s + 1});
    TensorId shifted_labels = e_.Contiguous("loss.shift_labels", e_.View("loss.labels_tail", padded, {b, s}));
    flat = e_.View("loss.logits_flat", logits, {b * s, vocab});
    flat_labels = e_.View("loss.labels_flat", shifted_labels, {b * s});
  } else {
    TensorId shifted_labels = e_.Contiguous("loss.shift_labels", e_.View("loss.labels_tail", labels, {b, s - 1}));
    TensorId shifted = e_.Contiguous("loss.shift_logits", e_.View("loss.logits_head", logits, {b, s - 1, vocab}));
    flat = e_.View("loss.logits_flat", shifted, {b * (s - 1), vocab});
    flat_labels = e_.View("loss.labels_flat", shifted_labels, {b * (s - 1)});
  }
  TensorId loss = o_.dtensor ? e_.LossParallelCrossEntropy("loss", flat, flat_labels)
                                   : e_.CrossEntropy("loss", flat, flat_labels);
  // transformers' ForCausalLMLoss binds the upcast copy to a local, alive
  // until the loss returns.
  if (logits != model_logits) e_.ScopeEnd("loss.returns", {logits});
  e_.set_phase(Phase::kForward);
  return loss;
}

absl::Status Builder::CheckGraphSize(int64_t layer) const {
  if (g_.num_tensors() <= kMaxGraphTensors && g_.num_ops() <= kMaxGraphOps) return absl::OkStatus();
  return absl::OutOfRangeError(absl::StrFormat(
      "%s: after %d of its %d layers the graph already has %d tensors and %d ops, more than the %d a graph may "
      "hold (num_hidden_layers%s too large)",
      c_.origin.empty() ? c_.architecture : c_.origin, layer + 1, c_.num_layers, g_.num_tensors(), g_.num_ops(),
      kMaxGraphTensors, c_.is_moe() ? " x num_local_experts" : ""));
}

absl::Status Builder::CheckLoraTargetsUsed() const {
  if (!o_.lora.enabled()) return absl::OkStatus();
  for (const std::string& target : lora_targets_) {
    if (used_targets_.count(target) == 0) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "lora target module %s matches no Linear of %s (its modules: %s, or all-linear)",
          QuoteForError(target), c_.architecture, absl::StrJoin(seen_leaves_, ", ")));
    }
  }
  return absl::OkStatus();
}

absl::Status Builder::Build() {
  HEADROOM_RETURN_IF_ERROR(CheckOptions());
  const models_internal::ModelFamilyEntry* family = models_internal::FindFamily(c_.model_type);
  if (family == nullptr) {
    // Configs come from ParseHfConfig or CnnConfig, whose model_type is always a family's.
    return absl::InvalidArgumentError(absl::StrFormat("%s: model_type %s is no model family's",
                                                      c_.architecture, QuoteForError(c_.model_type)));
  }
  HEADROOM_RETURN_IF_ERROR(family->build(*this));
  HEADROOM_RETURN_IF_ERROR(CheckLoraTargetsUsed());
  return g_.Validate();
}

}  // namespace headroom::builders_internal

namespace headroom {

using builders_internal::Builder;

namespace {
constexpr NameTable<AttentionImpl, 3> kAttentionNames("attention", {{
    {"flash", AttentionImpl::kFlash},
    {"eager", AttentionImpl::kEager},
    {"sdpa", AttentionImpl::kFlash, kAlias},
}});

constexpr NameTable<VlmTrainable, 3> kVlmTrainableNames("vision-language training", {{
    {"projector+lm", VlmTrainable::kProjectorAndLanguage},
    {"projector", VlmTrainable::kProjector},
    {"all", VlmTrainable::kAll},
}});

constexpr NameTable<RmsNormImpl, 2> kRmsNormNames("RMSNorm implementation", {{
    {"eager", RmsNormImpl::kEager},
    {"fused", RmsNormImpl::kFused},
}});

}  // namespace

std::string_view AttentionImplName(AttentionImpl impl) { return kAttentionNames.Name(impl); }
absl::StatusOr<AttentionImpl> ParseAttentionImpl(std::string_view name) { return kAttentionNames.Parse(name); }
bool HasFlashAttentionPath(const ModelConfig& config) { return config.model_type != "t5"; }

std::string_view VlmTrainableName(VlmTrainable trainable) { return kVlmTrainableNames.Name(trainable); }
absl::StatusOr<VlmTrainable> ParseVlmTrainable(std::string_view name) { return kVlmTrainableNames.Parse(name); }

std::string_view RmsNormImplName(RmsNormImpl impl) { return kRmsNormNames.Name(impl); }
absl::StatusOr<RmsNormImpl> ParseRmsNormImpl(std::string_view name) { return kRmsNormNames.Parse(name); }

absl::StatusOr<Graph> BuildModelGraph(const ModelConfig& config, const BuildOptions& options) {
  Graph graph(config.architecture);
  Builder builder(config, options, graph);
  HEADROOM_RETURN_IF_ERROR(builder.Build());
  return graph;
}

}  // namespace headroom

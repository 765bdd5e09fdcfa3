#include "models/builders.h"

#include <algorithm>
#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/checked_math.h"
#include "common/name_table.h"
#include "common/status_macros.h"
#include "graph/ops.h"

namespace headroom {
namespace {

enum class Parallel : uint8_t { kReplicated, kColumn, kRow };

// Hugging Face's Llama-derived decoders: softmax in f32, the loss over f32 logits.
bool IsLlamaLike(const ModelConfig& c) {
  return c.model_type == "llama" || c.model_type == "mistral" || c.model_type == "qwen2" ||
         c.model_type == "mixtral" || c.model_type == "qwen3" || c.model_type == "gemma" ||
         c.model_type == "gemma2" || c.model_type == "phi3" || c.model_type == "qwen2_moe" ||
         c.model_type == "qwen3_moe" || c.model_type == "olmo2" || c.model_type == "gemma3_text" ||
         c.model_type == "starcoder2";
}

// The causal LMs whose loss reads the logits cast to f32: Llama's ForCausalLMLoss, GPT-J's forward.
// GPT-OSS and Llama 4 compute the loss with ForCausalLMLoss too, though their attention is not Llama's.
bool UpcastsLogits(const ModelConfig& c) {
  return IsLlamaLike(c) || c.model_type == "gptj" || c.model_type == "gpt_oss" || c.model_type == "llama4_text";
}

// A decoder's module names as its family's state dict spells them.
struct DecoderNames {
  std::string root = "model.";            // the body
  std::string embed = "embed_tokens";     // token embeddings, under root
  std::string layers = "layers";          // the blocks, under root
  std::string norm1 = "input_layernorm";  // in each block: before attention
  std::string norm2 = "post_attention_layernorm";
  std::string final_norm = "norm";  // under root
  std::string head = "lm_head";
};

DecoderNames DecoderNamesOf(const ModelConfig& c) {
  const std::string& type = c.model_type;
  if (type == "gpt2" || type == "gpt_bigcode") {
    return {.root = "transformer.", .embed = "wte", .layers = "h", .norm1 = "ln_1", .norm2 = "ln_2",
            .final_norm = "ln_f"};
  }
  if (type == "gpt_neox") {
    return {.root = "gpt_neox.", .embed = "embed_in", .final_norm = "final_layer_norm", .head = "embed_out"};
  }
  if (type == "bloom") return {.root = "transformer.", .embed = "word_embeddings", .layers = "h", .final_norm = "ln_f"};
  if (type == "opt") {
    return {.root = "model.decoder.", .norm1 = "self_attn_layer_norm", .norm2 = "final_layer_norm",
            .final_norm = "final_layer_norm"};
  }
  if (type == "gptj") {
    return {.root = "transformer.", .embed = "wte", .layers = "h", .norm1 = "ln_1", .final_norm = "ln_f"};
  }
  if (type == "falcon") {
    // Note [Falcon]: ln_attn and ln_mlp when each parallel branch has its own norm.
    const bool two = c.parallel_residual && c.branch_norms == 2;
    return {.root = "transformer.", .embed = "word_embeddings", .layers = "h",
            .norm1 = two ? "ln_attn" : "input_layernorm", .norm2 = two ? "ln_mlp" : "post_attention_layernorm",
            .final_norm = "ln_f"};
  }
  return {};
}

// Leaf module names PEFT targets by default (its
// TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING): the attention query
// and value projections.
std::vector<std::string> DefaultLoraTargets(const ModelConfig& c) {
  if (c.model_type == "gpt2" || c.model_type == "gpt_bigcode") return {"c_attn"};
  if (c.model_type == "gpt_neox" || c.model_type == "falcon" || c.model_type == "bloom") return {"query_key_value"};
  if (c.model_type == "phi3") return {"qkv_proj"};
  if (c.model_type == "bert" || c.model_type == "roberta" || c.model_type == "vit") return {"query", "value"};
  if (c.model_type == "t5") return {"q", "v"};
  return {"q_proj", "v_proj"};
}

class Builder {
 public:
  Builder(const ModelConfig& config, const BuildOptions& options, Graph& graph)
      : c_(config),
        o_(options),
        g_(graph),
        own_e_(std::make_unique<OpEmitter>(graph, EmitterOptions{
                                                      .compute_dtype = options.compute_dtype,
                                                      .autocast = options.param_dtype != options.compute_dtype,
                                                      .autocast_wide_dtype = options.param_dtype,
                                                      .training = options.training,
                                                      .runtime = options.runtime})),
        e_(*own_e_),
        t_(options.tensor_parallel),
        sp_(options.sequence_parallel),
        seq_(config.family == ModelFamily::kVision ? config.image_tokens() : options.seq_len),
        upcast_logits_(UpcastsLogits(config)) {
    if (o_.lora.enabled()) {
      const std::vector<std::string> targets =
          o_.lora.target_modules.empty() ? DefaultLoraTargets(c_) : o_.lora.target_modules;
      lora_targets_.insert(targets.begin(), targets.end());
    }
  }
  // One tower of a two-tower model (Note [Contrastive towers]): its own config and sequence, the parent's
  // graph and emitter; the parent merges its LoRA bookkeeping back (MergeTower).
  Builder(const ModelConfig& tower, const Builder& parent, int64_t seq_len)
      : Builder(tower, parent, seq_len, parent.o_) {}
  // A tower run with options of its own (LLaVA's vision tower sees batch x images images); `options` must
  // outlive it.
  Builder(const ModelConfig& tower, const Builder& parent, int64_t seq_len, const BuildOptions& options)
      : c_(tower),
        o_(options),
        g_(parent.g_),
        e_(parent.e_),
        t_(parent.t_),
        sp_(parent.sp_),
        seq_(seq_len),
        upcast_logits_(UpcastsLogits(tower)),
        lora_targets_(parent.lora_targets_) {}

  absl::Status Build();

 private:
  absl::Status CheckOptions() const;
  // `merge_inputs`, when set, runs right after the token embedding lookup and returns the embeddings the
  // blocks take (LLaVA's image features scattered in), given the token ids and the looked-up embeddings.
  using MergeInputs = std::function<absl::StatusOr<TensorId>(TensorId ids, TensorId embeddings)>;
  absl::Status BuildDecoder(const MergeInputs& merge_inputs = nullptr);
  absl::Status BuildEncoder();
  absl::Status BuildT5();
  // One T5 attention module (Note [T5]): keys and values from `kv_source`, scores plus `position_bias`.
  TensorId T5Attention(const std::string& module, TensorId x, TensorId kv_source, TensorId position_bias);
  // T5's first-block position bias, [1, heads, q, k] buckets plus `mask`; zeros plus `mask` without buckets.
  TensorId T5PositionBias(const std::string& module, int64_t q, int64_t k, TensorId mask, bool buckets);
  TensorId T5FeedForward(const std::string& prefix, TensorId x);
  absl::Status BuildBart();
  absl::Status BuildWhisper();
  // One BART or Whisper attention module (Note [BART], Note [Whisper]): q from x, k and v from `kv_source`,
  // `mask` added to the scores (none when kNone).
  TensorId BartAttention(const std::string& module, TensorId x, TensorId kv_source, TensorId mask, bool causal);
  absl::Status BuildVision();
  absl::Status BuildContrastive();
  // A vision transformer over pixel_values up to its last hidden state (Note [Vision transformers]), blocks
  // numbered from `first_layer`, module names under `root` ("vit.", "vision_model.").
  // With `hidden_states`, appends every hidden state as output_hidden_states=True returns them: the embeddings'
  // output, then each block's.
  absl::StatusOr<TensorId> VisionBody(const std::string& root, int first_layer,
                                      std::vector<TensorId>* hidden_states = nullptr);
  // A two-tower model's towers up to their pooled outputs [batch, hidden] (Note [Contrastive towers]).
  absl::StatusOr<TensorId> VisionTower(int first_layer, const std::string& root = "vision_model.",
                                       std::vector<TensorId>* hidden_states = nullptr);
  absl::StatusOr<TensorId> TextTower(int first_layer);
  // SigLIP's vision head: a learned probe attending over the patches (nn.MultiheadAttention), then an MLP.
  TensorId AttentionPool(const std::string& head, TensorId x);
  // x / x.norm(dim=-1, keepdim=True).
  TensorId Normalize(const std::string& name, TensorId x);
  // LLaVA (Note [LLaVA]): the language model with the projected image features among its tokens.
  absl::Status BuildLlava();
  // LLaVA's get_image_features: the vision tower over batch x images images, the selected hidden state, the
  // projector; [batch x images, image_feature_tokens, text hidden].
  absl::StatusOr<TensorId> LlavaImageFeatures();
  // A tower's LoRA bookkeeping, for CheckLoraTargetsUsed.
  void MergeTower(const Builder& tower) {
    seen_leaves_.insert(tower.seen_leaves_.begin(), tower.seen_leaves_.end());
    used_targets_.insert(tower.used_targets_.begin(), tower.used_targets_.end());
  }
  absl::Status BuildMamba();
  // One MambaMixer's slow_forward over its block's normed input (Note [Mamba]).
  TensorId MambaMixer(const std::string& prefix, TensorId x);
  absl::Status BuildCnn();
  absl::Status BuildMlp();
  absl::Status CheckLoraTargetsUsed() const;
  // Stops a build that would outgrow graph/graph.h's Note [Size bounds]
  // after block `layer`, before it takes the memory of the whole model.
  absl::Status CheckGraphSize(int64_t layer) const;

  // Whether this builder's parameters stay frozen: under LoRA (adapters train instead) unless trainable_ says.
  bool Frozen() const { return trainable_.has_value() ? !*trainable_ : o_.lora.enabled(); }
  TensorId Param(const std::string& name, std::vector<int64_t> shape) {
    return e_.Parameter(name, std::move(shape), o_.param_dtype, !Frozen());
  }
  // Norm of the architecture's kind; `prefix` is the module ("model.norm").
  TensorId Norm(const std::string& prefix, TensorId x);
  TensorId LayerNormModule(const std::string& prefix, TensorId x);
  // A Linear module (HF naming `module`.weight/.bias) with LoRA/QLoRA when
  // targeted. `in`/`out` are this shard's features; `conv1d` stores the
  // weight [in, out] as GPT-2 does.
  TensorId Proj(const std::string& module, TensorId x, int64_t in, int64_t out, bool bias,
                Parallel parallel, bool conv1d = false, TensorId x_shard = kNone,
                TensorId tied_weight = kNone);
  // Output of a row-parallel block back to the residual layout.
  TensorId ReduceOutput(const std::string& name, TensorId x);
  // Input of a column-parallel block from the residual layout.
  TensorId GatherInput(const std::string& name, TensorId x) {
    return sp_ ? e_.AllGather(name + ".all_gather", x, 1, t_) : x;
  }
  TensorId Attention(const std::string& prefix, TensorId x, TensorId x_shard);
  // One projection `module` whose output holds this shard's queries, keys and values (GPT-2's c_attn, Phi-3's
  // qkv_proj, Falcon's query_key_value, ...): q, k and v are views of that one storage, so it stays alive while
  // any of them is saved. `conv1d` stores the weight [in, out] as GPT-2 does.
  std::tuple<TensorId, TensorId, TensorId> FusedQkv(const std::string& module, TensorId x, TensorId x_shard,
                                                     bool conv1d = false);
  TensorId LatentAttention(const std::string& prefix, TensorId x);
  // GPT-J's rotary embedding of x [b, s, heads, d] with the layer's sin/cos table (Note [GPT-J]).
  TensorId GptjRotary(const std::string& name, TensorId x, TensorId sincos);
  TensorId Mlp(const std::string& prefix, TensorId x, TensorId x_shard);
  TensorId Moe(const std::string& prefix, TensorId x, TensorId x_shard);
  // GPT-OSS's experts as transformers' grouped_mm runs them (Note [GPT-OSS]); y [b, s, h].
  TensorId GptOssExperts(const std::string& prefix, TensorId flat);
  // Llama 4's MoE block, every expert over every token (Note [Llama 4]); y [b, s, h].
  TensorId Llama4Moe(const std::string& prefix, TensorId flat);
  // Llama4TextL2Norm over the last dimension: x.float() * rsqrt(mean(x^2) + eps), back to x's dtype; no weight.
  TensorId L2Norm(const std::string& prefix, TensorId x);
  // The training loss over logits [rows, classes] (Note [Causal LM loss]).
  TensorId Loss(TensorId logits, int64_t rows, int64_t classes);
  TensorId CausalLmLoss(TensorId logits, int64_t vocab);
  TensorId EagerRmsNorm(const std::string& prefix, TensorId x, TensorId weight);
  // RMSNorm with a weight of `width` over x's last dimension: each head's
  // head_dim features (Qwen3's q_norm and k_norm) or a whole projection (OLMo 2's).
  TensorId RmsNormOver(const std::string& prefix, TensorId x, int64_t width);
  // cap * tanh(x / cap), in PyTorch ops (Note [Gemma decoders]).
  TensorId SoftCap(const std::string& name, TensorId x);
  // The MLP's nonlinearity, gelu_new as Hugging Face writes it (Note [gelu_new]).
  TensorId Activation(const std::string& name, TensorId x);

  const ModelConfig& c_;
  const BuildOptions& o_;
  Graph& g_;
  std::unique_ptr<OpEmitter> own_e_;  // null in a tower, which emits through its parent's
  OpEmitter& e_;
  const int t_;
  const bool sp_;
  // Tokens each attention attends over: o_.seq_len, or a vision transformer's patches (Note [Vision transformers]).
  const int64_t seq_;
  // Module-name prefix and first block index of a tower built inside another model (LLaVA's language_model.).
  std::string prefix_;
  int first_layer_ = 0;
  // Whether the parameters train, whatever LoRA says (Note [LLaVA]); unset: trainable unless LoRA is on.
  std::optional<bool> trainable_;
  // Whether LoRA adapters and QLoRA quantization reach this builder's blocks (not LLaVA's vision tower).
  bool lora_scope_ = true;
  // The causal-LM loss reads the logits cast to f32 (Note [Causal LM loss]); LLaVA's own loss does not.
  bool upcast_logits_ = false;
  TensorId cos_ = kNone;
  TensorId sin_ = kNone;
  TensorId local_cos_ = kNone;  // Gemma 3's sliding layers (Note [Gemma decoders])
  TensorId local_sin_ = kNone;
  TensorId alibi_ = kNone;  // Bloom's [batch x heads, 1, seq] biases (Note [Bloom])
  std::set<std::string> lora_targets_;
  std::set<std::string> seen_leaves_;
  std::set<std::string> used_targets_;
};

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
  if (c_.model_type == "t5" && o_.attention == AttentionImpl::kFlash) {
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
TensorId Builder::SoftCap(const std::string& name, TensorId x) {
  TensorId scaled = e_.Scale(name + ".div", x);
  return e_.Scale(name + ".mul", e_.Activation(name + ".tanh", ActivationKind::kTanh, scaled));
}

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
// releases. Checked against the tracer (tracer/tests) at 4.46.3 and 5.24.0,
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
//    the config.json asks for tied embeddings.
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

// Note [gelu_new]
// transformers' NewGELUActivation ("gelu_new", GPT-2's default) computes
//   0.5 * x * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 * x^3)))
// in PyTorch ops, so autograd keeps x (for pow), 0.5 * x, the tanh's output
// and 1 + tanh besides the result: four intermediate-sized tensors per layer
// where F.gelu(approximate="tanh") ("gelu_pytorch_tanh") keeps one.
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
  TensorId cube = e_.Scale(name + ".cube_scale", e_.Pow(name + ".cube", x));
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

TensorId Builder::Attention(const std::string& prefix, TensorId x, TensorId x_shard) {
  const int64_t b = o_.batch, s = seq_, h = c_.hidden_size, d = c_.head_dim;
  const int64_t heads = c_.num_heads / t_, kv = c_.num_kv_heads / t_;
  // CLIP's text tower masks causally; SigLIP's does not.
  const bool causal = c_.family == ModelFamily::kDecoder || c_.model_type == "clip_text_model";
  const bool opt = c_.model_type == "opt", falcon = c_.model_type == "falcon";
  const bool bigcode = c_.model_type == "gpt_bigcode", bloom = c_.model_type == "bloom";
  const bool clip = c_.model_type.starts_with("clip_"), siglip = c_.model_type.starts_with("siglip_");
  const bool llama4 = c_.model_type == "llama4_text";
  const bool rope = c_.positions == PositionKind::kRotary && c_.uses_rope(e_.layer());
  TensorId q, k, v;
  std::string out_module;
  // Note [GPT-OSS]: one learned sink logit per head, each rank holding its heads' under tensor parallelism.
  const TensorId sinks = c_.attention_sinks ? Param(prefix + "self_attn.sinks", {heads}) : kNone;
  if (c_.model_type == "gpt2" || c_.model_type == "gpt_neox" || bloom) {
    const bool gpt2 = c_.model_type == "gpt2";
    const std::string module =
        prefix + (gpt2 ? "attn.c_attn" : bloom ? "self_attention.query_key_value" : "attention.query_key_value");
    if (gpt2) {
      // GPT2Attention registers its causal mask as a buffer in every layer:
      // tril(ones(n_positions, n_positions)) as bool, 1 MiB per layer at 1024 positions.
      const int64_t n = c_.max_position_embeddings;
      e_.Buffer(prefix + "attn.bias", {1, 1, n, n}, DType::kBool);
    }
    std::tie(q, k, v) = FusedQkv(module, x, x_shard, /*conv1d=*/gpt2);
    out_module = prefix + (gpt2 ? "attn.c_proj" : bloom ? "self_attention.dense" : "attention.dense");
  } else if (c_.model_type == "gptj") {
    // Note [GPT-J]: separate projections; q and k rotate as [b, s, heads, d], then permute.
    const std::string base = prefix + "attn.";
    TensorId qp = Proj(base + "q_proj", x, h, heads * d, false, Parallel::kColumn, false, x_shard);
    TensorId kp = Proj(base + "k_proj", x, h, heads * d, false, Parallel::kColumn, false, x_shard);
    TensorId vp = Proj(base + "v_proj", x, h, heads * d, false, Parallel::kColumn, false, x_shard);
    v = e_.View(base + "v_proj.heads", vp, {b, heads, s, d});
    const int64_t rd = c_.rotary_dim;
    TensorId table = e_.Buffer(base + "embed_positions", {c_.max_position_embeddings, rd}, DType::kF32);
    // One row of positions (position_ids is arange(s)[None] unless given): tables of batch 1.
    TensorId rows = e_.Materialize(base + "embed_positions.repeat", "repeat", {table},
                                   {1, c_.max_position_embeddings, rd}, DType::kF32);
    TensorId sincos = e_.Materialize(base + "sincos", "gather", {rows}, {1, s, rd}, DType::kF32);
    k = GptjRotary(prefix + "rotary_k", e_.View(base + "k_proj.heads", kp, {b, s, heads, d}), sincos);
    q = GptjRotary(prefix + "rotary_q", e_.View(base + "q_proj.heads", qp, {b, s, heads, d}), sincos);
    k = e_.View(base + "k_permute", k, {b, heads, s, d});
    q = e_.View(base + "q_permute", q, {b, heads, s, d});
    out_module = base + "out_proj";
  } else if (bigcode) {
    // Note [GPTBigCode]: c_attn's output is all queries, then the keys, then the values.
    std::tie(q, k, v) = FusedQkv(prefix + "attn.c_attn", x, x_shard);
    out_module = prefix + "attn.c_proj";
  } else if (falcon) {
    // Note [Falcon]: query_key_value holds kv groups of (heads / kv queries, a key, a value).
    const std::string module = prefix + "self_attention.query_key_value";
    std::tie(q, k, v) = FusedQkv(module, x, x_shard);
    if (kv < heads || c_.kv_broadcast_early) {
      // fused_qkv[..., [-2], :] is an index: a copy of each key and value head.
      k = e_.Contiguous(module + ".k_index", k);
      v = e_.Contiguous(module + ".v_index", v);
    }
    if (c_.kv_broadcast_early && kv > 1 && kv < heads) {
      // The new architecture broadcasts k and v to every query head and flattens the groups: copies of all three
      // (views when there is one group, whose keys and values the eager core then repeats).
      q = e_.Contiguous(module + ".q_flatten", q);
      k = e_.RepeatKv(module + ".k_broadcast", k, heads);
      v = e_.RepeatKv(module + ".v_broadcast", v, heads);
    }
    out_module = prefix + "self_attention.dense";
  } else {
    const bool bert = c_.model_type == "bert" || c_.model_type == "roberta", vit = c_.model_type == "vit";
    const std::string base = prefix + (bert ? "attention.self." : vit ? "attention.attention." : "self_attn.");
    const std::string qn = bert || vit ? "query" : "q_proj", kn = bert || vit ? "key" : "k_proj",
                      vn = bert || vit ? "value" : "v_proj";
    if (c_.fused_qkv) {
      std::tie(q, k, v) = FusedQkv(base + "qkv_proj", x, x_shard);  // Phi-3
    } else {
      TensorId qp = Proj(base + qn, x, h, heads * d, c_.qkv_bias, Parallel::kColumn, false, x_shard);
      // Note [OPT] (and CLIPAttention): q_proj(x) * head_dim^-1/2, its own tensor.
      if (opt || clip) qp = e_.Scale(base + "q_proj.scaling", qp);
      TensorId kp = Proj(base + kn, x, h, kv * d, c_.qkv_bias, Parallel::kColumn, false, x_shard);
      TensorId vp = Proj(base + vn, x, h, kv * d, c_.qkv_bias, Parallel::kColumn, false, x_shard);
      if (c_.qk_norm_full) {
        // Note [OLMo 2]: one norm over all heads' features. Under tensor parallelism each rank
        // holds its heads' share of the weight (the statistics' all-reduce is [b, s, 1]).
        qp = RmsNormOver(base + "q_norm", qp, heads * d);
        kp = RmsNormOver(base + "k_norm", kp, kv * d);
      }
      q = e_.View(base + qn + ".heads", qp, {b, heads, s, d});
      k = e_.View(base + kn + ".heads", kp, {b, kv, s, d});
      v = e_.View(base + vn + ".heads", vp, {b, kv, s, d});
    }
    if (c_.qk_norm) {
      q = RmsNormOver(base + "q_norm", q, d);
      k = RmsNormOver(base + "k_norm", k, d);
    }
    out_module = bert || vit ? prefix + "attention.output.dense"
                             : base + (opt || clip || siglip ? "out_proj" : "o_proj");
  }
  if (rope && c_.model_type != "gptj") {  // GPT-J's are rotated already
    const auto rotary_dims = static_cast<int64_t>(static_cast<double>(d) * c_.rotary_pct);
    const bool local = c_.local_rotary && c_.is_sliding_layer(e_.layer());
    const TensorId cos = local ? local_cos_ : cos_, sin = local ? local_sin_ : sin_;
    if (llama4) {
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
  if (llama4 && rope && c_.qk_l2_norm) {
    q = L2Norm(prefix + "self_attn.qk_norm.q", q);
    k = L2Norm(prefix + "self_attn.qk_norm.k", k);
  }
  if (llama4 && !rope && c_.attn_temperature_tuning) {
    // Note [Llama 4]: (q * scales).to(q.dtype) with f32 scales of 1 + attn_scale * log1p(floor((pos + 1) /
    // floor_scale)) per position: the product is f32, then cast back.
    const DType dtype = g_.tensor(q).dtype;
    TensorId scales = e_.Materialize(prefix + "self_attn.attn_scales", "log1p", {}, {1, 1, s, 1}, DType::kF32);
    q = e_.Cast(prefix + "self_attn.attn_scales.cast_back", e_.Mul(prefix + "self_attn.attn_scales.mul", q, scales),
                dtype);
  }
  TensorId context;
  const std::string core = prefix + "attn_core";
  if (o_.attention == AttentionImpl::kFlash) {
    // flash_attention_2 reads grouped k/v directly; no repeat_kv copy. For Bloom, a kernel that takes ALiBi slopes
    // (Note [Bloom]).
    // Note [GPT-OSS]: a kernel that takes the sinks (FlashAttention-3's s_aux).
    context = e_.FlashAttention(core + ".sdpa", q, k, v, causal, sinks);
  } else {
    e_.set_attention_core(true);
    if (bigcode && kv == 1 && !o_.runtime.transformers.AtLeast(4, 54)) {
      // Note [GPTBigCode]: the query heads fold into the rows of one bmm (a copy of the strided queries) against
      // the one key and value head, which stay views of c_attn's output. From transformers 4.54 the shared
      // eager attention repeats the key and value head instead (Note [transformers versions]).
      q = e_.Contiguous(core + ".q_fold", e_.View(core + ".q_rows", q, {b, s * heads, d}));
      k = e_.View(core + ".k_rows", k, {b, s, d});
      v = e_.View(core + ".v_rows", v, {b, s, d});
    } else if (g_.tensor(k).shape[1] < heads) {
      // GPTBigCode's queries are a strided slice of c_attn's output, which the matmul copies to fold batch and
      // heads (Note [transformers versions]); rotated queries are fresh tensors already.
      if (bigcode) q = e_.Contiguous(core + ".q_fold", q);
      // HF eager attention materializes repeated k/v heads (repeat_kv; Falcon's matmul broadcasts and copies).
      k = e_.RepeatKv(core + ".repeat_k", k, heads);
      v = e_.RepeatKv(core + ".repeat_v", v, heads);
    } else if (falcon) {
      // Note [Falcon]: v is a transposed view, which the matmul copies to fold batch and heads.
      v = e_.Contiguous(core + ".v_fold", v);
    }
    // Note [Bloom]: alibi.baddbmm(q, k^T), the biases added in the product's kernel.
    TensorId scores = bloom ? e_.BaddBmm(core + ".qk", alibi_, q, k, /*b_transposed=*/true)
                            : e_.MatMul(core + ".qk", q, k, /*b_transposed=*/true);
    if (c_.attn_logit_softcap > 0) {
      // Gemma 2 scales, caps, then adds the mask (Note [Gemma decoders]).
      scores = SoftCap(core + ".softcap", e_.Scale(core + ".scale", scores));
    }
    scores = e_.MaskedScale(core + ".scale_mask", scores);
    // Note [OPT]: before transformers 4.49, torch.max(scores, finfo.min) keeps the masked scores for backward
    // and the softmax runs in f32 (and casts back) for f16 scores only; from 4.49 OPT's attention is
    // Llama's (Note [transformers versions]).
    const bool f16_scores = g_.tensor(scores).dtype == DType::kF16;
    const bool opt_clamps = opt && !o_.runtime.transformers.AtLeast(4, 49);
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
                         /*force_f32=*/IsLlamaLike(c_) || siglip || (opt && (f16_scores || !opt_clamps)) ||
                             (falcon && e_.options().autocast) || c_.attention_softmax_f32 || bloom);
    }
    // Decoders and SigLIP cast the probabilities back to v's dtype (HF's
    // `.to(query.dtype)` / `.type(value.dtype)`); BERT, ViT and CLIP leave that to autocast.
    if ((c_.family == ModelFamily::kDecoder && (!opt_clamps || f16_scores)) || siglip) {
      probs = e_.Cast(core + ".probs_cast", probs, g_.tensor(v).dtype);
    }
    // Falcon's rotary attention drops no probabilities (its attention_dropout applies elsewhere, Note [Falcon]).
    probs = e_.Dropout(core + ".dropout", probs, falcon ? 0.0 : c_.attention_dropout);
    context = e_.MatMul(core + ".pv", probs, v);
    e_.set_attention_core(false);
  }
  TensorId merged = e_.View(core + ".merge_heads", context, {b, s, heads * d});
  TensorId out = Proj(out_module, merged, heads * d, h, c_.attn_output_bias, Parallel::kRow,
                      /*conv1d=*/c_.model_type == "gpt2");
  // Note [Python references in inference].
  if (!o_.training) e_.ScopeEnd(prefix + "attention_returns", {x, q, k, v});
  return ReduceOutput(out_module, out);
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

TensorId Builder::Mlp(const std::string& prefix, TensorId x, TensorId x_shard) {
  // Llama 4 names its dense MLP and its MoE block feed_forward.
  const std::string mlp = c_.model_type == "llama4_text" ? "feed_forward." : "mlp.";
  if (c_.is_moe_layer(e_.layer())) {
    return Moe(prefix + (c_.model_type == "mixtral" ? "block_sparse_moe." : mlp), x, x_shard);
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
    } else if (c_.model_type.starts_with("clip_") || c_.model_type.starts_with("siglip_")) {
      up_name = "mlp.fc1", down_name = "mlp.fc2";  // CLIPMLP, SiglipMLP
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
// rows per expert, in HF Mixtral's dispatch (gather rows, expert MLP, scale
// by routing weight, index_add into the output).
TensorId Builder::Moe(const std::string& prefix, TensorId x, TensorId x_shard) {
  const int64_t h = c_.hidden_size;
  if (c_.model_type == "gpt_oss" || c_.model_type == "llama4_text") {
    TensorId flat = e_.View(prefix + "flatten", x, {o_.batch * o_.seq_len, h});
    TensorId y = c_.model_type == "gpt_oss" ? GptOssExperts(prefix, flat) : Llama4Moe(prefix, flat);
    return ReduceOutput(prefix + "experts", y);
  }
  const int64_t inner = (c_.moe_intermediate_size > 0 ? c_.moe_intermediate_size : c_.intermediate_size) / t_;
  // Expert projections as each family names them: Mixtral's w1 (gate), w3 (up), w2 (down).
  const bool mixtral = c_.model_type == "mixtral";
  const std::string gate_name = mixtral ? "w1" : "gate_proj", up_name = mixtral ? "w3" : "up_proj",
                    down_name = mixtral ? "w2" : "down_proj";
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
// 0.27 of those bytes. Two known simplifications: under autocast (f32 weights) the sink softmax is modelled in
// f32 where transformers keeps the scores' dtype, and grouped_mm (not autocast-enabled) is modelled at the
// autocast dtype.
TensorId Builder::GptOssExperts(const std::string& prefix, TensorId flat) {
  const int64_t h = c_.hidden_size, inner = c_.intermediate_size / t_, experts = c_.num_experts;
  const int64_t tokens = o_.batch * o_.seq_len, top_k = c_.experts_per_token;
  TensorId logits = Proj(prefix + "router", flat, h, experts, /*bias=*/true, Parallel::kReplicated);
  const OpEmitter::Selection top = e_.TopK(prefix + "router.topk", "topk", logits, top_k);
  TensorId scores = e_.Softmax(prefix + "router.softmax", top.values);
  // Note [MoE routing]: balanced, `rows` per expert.
  const int64_t rows = CeilDiv(tokens * top_k, experts), routed = rows * experts;
  const std::string ex = prefix + "experts.";
  // The routing's integers, which the gathers and grouped matmuls keep for backward: each routed row's token,
  // the rows sorted by expert (the sorted expert ids and the permutation), its inverse, the experts' offsets.
  TensorId token_of_row = e_.Materialize(ex + "token_index", "floor_divide", {top.indices}, {routed}, DType::kI64);
  TensorId sorted_experts = e_.Materialize(ex + "sorted_experts", "sort", {top.indices}, {routed}, DType::kI64);
  TensorId permutation = e_.Materialize(ex + "permutation", "sort", {top.indices}, {routed}, DType::kI64);
  TensorId offsets = e_.Materialize(ex + "offsets", "cumsum", {sorted_experts}, {experts}, DType::kI32);
  TensorId dispatched = e_.View(ex + "dispatch_rows", e_.GatherRows(ex + "dispatch", flat, routed, token_of_row),
                                {experts, rows, h});
  TensorId weights = e_.GatherRows(ex + "routing_weights", e_.View(ex + "scores_flat", scores, {tokens * top_k, 1}),
                                   routed, permutation);
  TensorId gate_up_w = Param(ex + "gate_up_proj", {experts, h, 2 * inner});
  TensorId gate_up_b = Param(ex + "gate_up_proj_bias", {experts, 2 * inner});
  TensorId gate_up = e_.GroupedMatMul(ex + "gate_up_grouped_mm", dispatched, gate_up_w, offsets);
  TensorId bias_rows = e_.GatherRows(ex + "gate_up_proj_bias.gather", gate_up_b, routed, sorted_experts);
  gate_up = e_.AddInplace(ex + "gate_up_bias_add", gate_up,
                          e_.View(ex + "gate_up_proj_bias.rows", bias_rows, {experts, rows, 2 * inner}));
  // gate_up[..., ::2] and gate_up[..., 1::2]: strided views.
  TensorId gate = e_.Clamp(ex + "gate_clamp", e_.View(ex + "gate", gate_up, {experts, rows, inner}));
  TensorId up = e_.Clamp(ex + "up_clamp", e_.View(ex + "up", gate_up, {experts, rows, inner}));
  TensorId sig = e_.Activation(ex + "sigmoid", ActivationKind::kSigmoid, e_.Scale(ex + "alpha", gate));
  TensorId glu = e_.Mul(ex + "glu", gate, sig);
  TensorId gated = e_.Mul(ex + "gated", e_.Scale(ex + "up_plus_one", up), glu);
  TensorId down_w = Param(ex + "down_proj", {experts, inner, h});
  TensorId down_b = Param(ex + "down_proj_bias", {experts, h});
  TensorId out = e_.GroupedMatMul(ex + "down_grouped_mm", gated, down_w, offsets);
  TensorId down_rows = e_.GatherRows(ex + "down_proj_bias.gather", down_b, routed, sorted_experts);
  out = e_.AddInplace(ex + "down_bias_add", out, e_.View(ex + "down_proj_bias.rows", down_rows, {experts, rows, h}));
  TensorId weighted = e_.Mul(ex + "weighted", e_.View(ex + "out_rows", out, {routed, h}), weights);
  TensorId inverse = e_.Materialize(ex + "inverse_permutation", "index_put", {permutation}, {routed}, DType::kI64);
  TensorId restored = e_.GatherRows(ex + "unpermute", weighted, routed, inverse);
  TensorId summed = e_.Materialize(ex + "sum_top_k", "sum",
                                   {e_.View(ex + "per_token", restored, {tokens, top_k, h})}, {tokens, h},
                                   g_.tensor(restored).dtype);
  return e_.View(prefix + "unflatten", summed, {o_.batch, o_.seq_len, h});
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
  TensorId repeated = e_.Materialize(prefix + "routed_in", "repeat", {flat}, {experts * tokens, h}, dtype);
  TensorId column = e_.Contiguous(prefix + "scores_column",
                                  e_.View(prefix + "scores_transposed", scores, {experts * tokens, 1}));
  TensorId routed = e_.Mul(prefix + "routed_scale", repeated, column);
  const std::string ex = prefix + "experts.";
  TensorId gate_up = e_.MatMul(ex + "gate_up_bmm", e_.View(ex + "per_expert", routed, {experts, tokens, h}),
                               Param(ex + "gate_up_proj", {experts, h, 2 * inner}));
  TensorId gate = e_.View(ex + "gate", gate_up, {experts, tokens, inner});
  TensorId up = e_.View(ex + "up", gate_up, {experts, tokens, inner});
  TensorId prod = e_.Mul(ex + "gate_mul", up, Activation(ex + "act_fn", gate));
  TensorId out = e_.MatMul(ex + "down_bmm", prod, Param(ex + "down_proj", {experts, inner, h}));
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
TensorId Builder::CausalLmLoss(TensorId logits, int64_t vocab) {
  const int64_t b = o_.batch, s = o_.seq_len;
  e_.set_layer(-1);
  e_.set_phase(Phase::kLoss);
  const TensorId model_logits = logits;
  if (upcast_logits_) logits = e_.Cast("loss.logits_float", logits, DType::kF32);
  TensorId labels = e_.Input("labels", {b, s}, DType::kI64);
  TensorId shifted_labels = e_.Contiguous("loss.shift_labels", e_.View("loss.labels_tail", labels, {b, s - 1}));
  TensorId shifted = e_.Contiguous("loss.shift_logits", e_.View("loss.logits_head", logits, {b, s - 1, vocab}));
  TensorId flat = e_.View("loss.logits_flat", shifted, {b * (s - 1), vocab});
  TensorId flat_labels = e_.View("loss.labels_flat", shifted_labels, {b * (s - 1)});
  TensorId loss = e_.CrossEntropy("loss", flat, flat_labels);
  // transformers' ForCausalLMLoss binds the upcast copy to a local, alive
  // until the loss returns.
  if (logits != model_logits) e_.ScopeEnd("loss.returns", {logits});
  e_.set_phase(Phase::kForward);
  return loss;
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

absl::Status Builder::BuildEncoder() {
  const int64_t b = o_.batch, s = o_.seq_len, h = c_.hidden_size;
  const int64_t s_local = sp_ ? s / t_ : s;
  const int64_t vocab = CeilDiv<int64_t>(c_.vocab_size, t_);
  const bool roberta = c_.model_type == "roberta";
  const std::string root =
      c_.encoder_head == EncoderHead::kBodyOnly ? "" : (roberta ? "roberta." : "bert.");

  e_.set_layer(-1);
  TensorId ids = e_.Input("input_ids", {b, s}, DType::kI64);
  TensorId word = Param(root + "embeddings.word_embeddings.weight", {vocab, h});
  TensorId x = e_.Embedding(root + "embeddings.word_embeddings", ids, word);
  if (t_ > 1) x = ReduceOutput(root + "embeddings.word_embeddings", x);
  TensorId positions = e_.Input("position_ids", {roberta ? b : 1, s_local}, DType::kI64);
  TensorId pos_table =
      Param(root + "embeddings.position_embeddings.weight", {c_.max_position_embeddings, h});
  x = e_.Add(root + "embeddings.add_position", x,
             e_.Embedding(root + "embeddings.position_embeddings", positions, pos_table));
  if (c_.type_vocab_size > 0) {
    TensorId types = e_.Input("token_type_ids", {b, s_local}, DType::kI64);
    TensorId type_table =
        Param(root + "embeddings.token_type_embeddings.weight", {c_.type_vocab_size, h});
    x = e_.Add(root + "embeddings.add_token_type", x,
               e_.Embedding(root + "embeddings.token_type_embeddings", types, type_table));
  }
  x = LayerNormModule(root + "embeddings.LayerNorm", x);
  x = e_.Dropout(root + "embeddings.dropout", x, c_.embedding_dropout);

  for (int64_t i = 0; i < c_.num_layers; ++i) {
    e_.set_layer(static_cast<int>(i));
    const std::string p = absl::StrFormat("%sencoder.layer.%d.", root, i);
    // BERT is post-norm: LayerNorm(x + sublayer(x)).
    TensorId attn = Attention(p, GatherInput(p + "attention", x), sp_ ? x : kNone);
    attn = e_.Dropout(p + "attention.output.dropout", attn, c_.hidden_dropout);
    x = LayerNormModule(p + "attention.output.LayerNorm",
                        e_.Add(p + "attention.output.residual", attn, x));
    TensorId mlp = Mlp(p, GatherInput(p + "intermediate", x), sp_ ? x : kNone);
    mlp = e_.Dropout(p + "output.dropout", mlp, c_.hidden_dropout);
    x = LayerNormModule(p + "output.LayerNorm", e_.Add(p + "output.residual", mlp, x));
    HEADROOM_RETURN_IF_ERROR(CheckGraphSize(i));
  }
  e_.set_layer(-1);
  if (sp_) x = e_.AllGather(root + "encoder.all_gather", x, 1, t_);
  TensorId pooled = kNone;
  if (c_.encoder_pooler) {
    TensorId first = e_.View(root + "pooler.first_token", x, {b, h});
    pooled = e_.Activation(root + "pooler.activation", ActivationKind::kTanh,
                           Proj(root + "pooler.dense", first, h, h, true, Parallel::kReplicated));
  }
  if (c_.encoder_head == EncoderHead::kMaskedLm) {
    const std::string head = roberta ? "lm_head." : "cls.predictions.";
    const std::string transform = roberta ? head : head + "transform.";
    TensorId y = Proj(transform + "dense", x, h, h, true, Parallel::kReplicated);
    y = Activation(transform + "act", y);
    y = LayerNormModule(transform + (roberta ? "layer_norm" : "LayerNorm"), y);
    TensorId logits = Proj(head + "decoder", y, h, vocab, false, Parallel::kColumn, false, kNone,
                           c_.tie_word_embeddings ? word : kNone);
    TensorId bias = Param(head + "bias", {vocab});
    logits = e_.Add(head + "add_bias", logits, bias);
    if (o_.training) Loss(logits, b * s, vocab);
    return absl::OkStatus();
  }
  const bool classify = c_.encoder_head == EncoderHead::kSequenceClassification || o_.training;
  if (!classify) return absl::OkStatus();
  TensorId logits;
  if (roberta && c_.encoder_head == EncoderHead::kSequenceClassification) {
    // RobertaClassificationHead: dropout, dense, tanh, dropout, out_proj on <s>.
    TensorId first = e_.View("classifier.first_token", x, {b, h});
    TensorId y = e_.Dropout("classifier.dropout_in", first, c_.hidden_dropout);
    y = e_.Activation("classifier.activation", ActivationKind::kTanh,
                      Proj("classifier.dense", y, h, h, true, Parallel::kReplicated));
    y = e_.Dropout("classifier.dropout_out", y, c_.hidden_dropout);
    logits = Proj("classifier.out_proj", y, h, c_.num_labels, true, Parallel::kReplicated);
  } else {
    // Note [Headless encoders]: BertForSequenceClassification's head.
    TensorId y = e_.Dropout("classifier.dropout", pooled, c_.hidden_dropout);
    logits = Proj("classifier", y, h, c_.num_labels, true, Parallel::kReplicated);
  }
  if (o_.training) Loss(logits, b, c_.num_labels);
  return absl::OkStatus();
}

// Note [T5]
// T5ForConditionalGeneration (transformers' modeling_t5.py; Raffel et al. 2020) shares one embedding table
// between an encoder and a decoder of pre-norm blocks:
//  - T5LayerNorm is an RMSNorm written out in PyTorch ops (the eager RMSNorm), without bias;
//  - attention is unscaled (T5 folds 1/sqrt(d_kv) into its initialization) and adds a position bias that
//    the first block computes once from relative-position buckets (an embedding of relative_buckets x heads),
//    with the padding (encoder) or causal (decoder) mask folded in; later blocks reuse it, so a
//    [batch, heads, q, k] tensor lives through every block; cross-attention's bias is zeros plus the mask;
//  - softmax runs on scores.float() and comes back in the scores' dtype; dropout of dropout_rate follows the
//    embeddings, the attention probabilities, the feed-forward's hidden layer and every block's output;
//  - the feed-forward is wi, ReLU, wo or, gated (T5 v1.1, Flan-T5), act(wi_0) * wi_1, wo;
//  - each decoder block attends to itself, then to the encoder's output through EncDecAttention, whose k and
//    v read that output in every block;
//  - with tied embeddings the decoder's output is scaled by d_model^-0.5 before the head.
// Decoder blocks are numbered after the encoder's (blocks num_layers ... num_layers + decoder_layers - 1); the
// decoder reads target_seq_len tokens (seq_len when not set). The loss is cross-entropy over the decoder's
// logits, unshifted (the labels are shifted into the decoder's input instead).
TensorId Builder::T5PositionBias(const std::string& module, int64_t q, int64_t k, TensorId mask, bool buckets) {
  const int64_t heads = c_.num_heads / t_;
  const DType dtype = g_.tensor(mask).dtype;
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
  return e_.Add(module + ".position_bias_masked", bias, mask);
}

TensorId Builder::T5Attention(const std::string& module, TensorId x, TensorId kv_source, TensorId position_bias) {
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
  scores = e_.AddInplace(module + ".add_position_bias", scores, position_bias);
  TensorId probs = e_.Cast(module + ".probs_cast", e_.Softmax(module + ".softmax", scores, /*force_f32=*/true),
                           scores_dtype);
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
  // The padding mask a batch comes with, as the additive [b, 1, 1, s] mask both attentions over it use.
  TensorId padding = e_.Input("attention_mask", {b, s}, DType::kI64);
  const DType act_dtype = e_.options().autocast ? o_.param_dtype : o_.compute_dtype;
  TensorId encoder_mask =
      e_.Cast("encoder.extended_attention_mask", e_.View("encoder.mask_view", padding, {b, 1, 1, s}), act_dtype);
  auto stack = [&](const std::string& root, TensorId ids, int64_t first_layer, int64_t layers, TensorId self_mask,
                   TensorId encoder_out) -> absl::StatusOr<TensorId> {
    e_.set_layer(-1);
    TensorId x = e_.Embedding(root + "embed_tokens", ids, shared);
    if (t_ > 1) x = ReduceOutput(root + "embed_tokens", x);
    x = e_.Dropout(root + "dropout", x, c_.embedding_dropout);
    const int64_t len = g_.tensor(ids).shape[1];
    TensorId self_bias = kNone, cross_bias = kNone;
    for (int64_t i = 0; i < layers; ++i) {
      e_.set_layer(static_cast<int>(first_layer + i));
      const std::string p = absl::StrFormat("%sblock.%d.layer.", root, i);
      TensorId normed = Norm(p + "0.layer_norm", x);
      if (self_bias == kNone) self_bias = T5PositionBias(p + "0.SelfAttention", len, len, self_mask, true);
      TensorId attn = T5Attention(p + "0.SelfAttention", normed, normed, self_bias);
      x = e_.Add(p + "0.add", x, e_.Dropout(p + "0.dropout", attn, c_.hidden_dropout));
      int next = 1;
      if (encoder_out != kNone) {
        normed = Norm(p + "1.layer_norm", x);
        const int64_t enc_len = g_.tensor(encoder_out).shape[1];
        if (cross_bias == kNone) {
          cross_bias = T5PositionBias(p + "1.EncDecAttention", len, enc_len, encoder_mask, false);
        }
        TensorId cross = T5Attention(p + "1.EncDecAttention", normed, encoder_out, cross_bias);
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
  HEADROOM_ASSIGN_OR_RETURN(TensorId encoded, stack("encoder.", encoder_ids, 0, c_.num_layers, encoder_mask, kNone));
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
  for (int64_t i = 0; i < c_.num_layers; ++i) {
    e_.set_layer(first_layer + static_cast<int>(i));
    const std::string p = absl::StrFormat("%sencoder.%s.%d.", root, vit ? "layer" : "layers", i);
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

absl::Status Builder::BuildCnn() {
  const int64_t b = o_.batch;
  e_.set_layer(-1);
  const DType input_dtype = o_.param_dtype;
  TensorId x = e_.Input("pixel_values", {b, c_.in_channels, c_.image_size, c_.image_size},
                        input_dtype);
  auto conv = [&](const std::string& name, TensorId in, int64_t out_c, int64_t kernel,
                  int64_t stride, int64_t padding, bool bias) {
    const int64_t in_c = g_.tensor(in).shape[1];
    TensorId w = Param(name + ".weight", {out_c, in_c, kernel, kernel});
    TensorId bb = bias ? Param(name + ".bias", {out_c}) : kNone;
    return e_.Conv2d(name, in, w, bb, stride, padding);
  };
  auto bn = [&](const std::string& name, TensorId in) {
    const int64_t ch = g_.tensor(in).shape[1];
    TensorId w = Param(name + ".weight", {ch});
    TensorId bias = Param(name + ".bias", {ch});
    e_.Buffer(name + ".running_mean", {ch}, DType::kF32);
    e_.Buffer(name + ".running_var", {ch}, DType::kF32);
    e_.Buffer(name + ".num_batches_tracked", {}, DType::kI64);
    return e_.BatchNorm(name, in, w, bias);
  };
  auto relu = [&](const std::string& name, TensorId in) {
    return e_.Activation(name, ActivationKind::kRelu, in, /*inplace=*/true);
  };
  int64_t features = 0;
  if (c_.architecture == "resnet50") {
    // torchvision resnet50 (ResNet v1.5: stride on the 3x3 conv).
    x = relu("relu", bn("bn1", conv("conv1", x, 64, 7, 2, 3, false)));
    x = e_.MaxPool2d("maxpool", x, 3, 2, 1);
    const int64_t blocks[4] = {3, 4, 6, 3};
    int64_t in_c = 64;
    int block_index = 0;
    for (int stage = 0; stage < 4; ++stage) {
      const int64_t width = int64_t{64} << stage;
      for (int64_t j = 0; j < blocks[stage]; ++j) {
        e_.set_layer(block_index++);
        const std::string p = absl::StrFormat("layer%d.%d.", stage + 1, j);
        const int64_t stride = (j == 0 && stage > 0) ? 2 : 1;
        TensorId identity = x;
        TensorId y = relu(p + "relu1", bn(p + "bn1", conv(p + "conv1", x, width, 1, 1, 0, false)));
        y = relu(p + "relu2", bn(p + "bn2", conv(p + "conv2", y, width, 3, stride, 1, false)));
        y = bn(p + "bn3", conv(p + "conv3", y, width * 4, 1, 1, 0, false));
        if (j == 0) {
          identity = bn(p + "downsample.1",
                        conv(p + "downsample.0", x, width * 4, 1, stride, 0, false));
        }
        y = e_.AddInplace(p + "residual", y, identity);
        x = relu(p + "relu3", y);
        in_c = width * 4;
      }
    }
    e_.set_layer(-1);
    x = e_.AdaptiveAvgPool2d("avgpool", x, 1, 1);
    features = in_c;
    x = e_.View("flatten", x, {b, features});
    x = Proj("fc", x, features, c_.num_classes, true, Parallel::kReplicated);
  } else {
    // torchvision vgg16 (configuration "D"), module indices as in `features`.
    const int64_t plan[] = {64, 64, 0, 128, 128, 0, 256, 256, 256, 0,
                            512, 512, 512, 0, 512, 512, 512, 0};
    int index = 0;
    int conv_index = 0;
    for (int64_t channels : plan) {
      if (channels == 0) {
        x = e_.MaxPool2d(absl::StrFormat("features.%d", index), x, 2, 2, 0);
        index += 1;
        continue;
      }
      e_.set_layer(conv_index++);
      x = conv(absl::StrFormat("features.%d", index), x, channels, 3, 1, 1, true);
      x = relu(absl::StrFormat("features.%d", index + 1), x);
      index += 2;
    }
    e_.set_layer(-1);
    x = e_.AdaptiveAvgPool2d("avgpool", x, 7, 7);
    features = 512 * 7 * 7;
    x = e_.View("flatten", x, {b, features});
    x = relu("classifier.1", Proj("classifier.0", x, features, 4096, true, Parallel::kReplicated));
    x = e_.Dropout("classifier.2", x, 0.5);
    x = relu("classifier.4", Proj("classifier.3", x, 4096, 4096, true, Parallel::kReplicated));
    x = e_.Dropout("classifier.5", x, 0.5);
    x = Proj("classifier.6", x, 4096, c_.num_classes, true, Parallel::kReplicated);
  }
  if (o_.training) Loss(x, b, c_.num_classes);
  return absl::OkStatus();
}

absl::Status Builder::BuildMlp() {
  e_.set_layer(-1);
  TensorId x = e_.Input("x", {o_.batch, c_.mlp_input_size}, o_.param_dtype);
  int64_t in = c_.mlp_input_size;
  const size_t n = c_.mlp_layer_sizes.size();
  for (size_t i = 0; i < n; ++i) {
    e_.set_layer(static_cast<int>(i));
    const std::string name = absl::StrFormat("layers.%d", i);
    const int64_t out = c_.mlp_layer_sizes[i];
    x = Proj(name, x, in, out, c_.mlp_bias, Parallel::kReplicated);
    if (i + 1 < n) {
      x = Activation(name + ".act", x);
      x = e_.Dropout(name + ".dropout", x, c_.mlp_dropout);
    }
    in = out;
  }
  if (o_.training) Loss(x, o_.batch, in);
  return absl::OkStatus();
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
          "lora target module '%s' matches no Linear of %s (its modules: %s, or all-linear)",
          target, c_.architecture, absl::StrJoin(seen_leaves_, ", ")));
    }
  }
  return absl::OkStatus();
}

absl::Status Builder::Build() {
  HEADROOM_RETURN_IF_ERROR(CheckOptions());
  switch (c_.family) {
    case ModelFamily::kDecoder: HEADROOM_RETURN_IF_ERROR(BuildDecoder()); break;
    case ModelFamily::kEncoder: HEADROOM_RETURN_IF_ERROR(BuildEncoder()); break;
    case ModelFamily::kEncoderDecoder:
      HEADROOM_RETURN_IF_ERROR(c_.model_type == "t5"        ? BuildT5()
                               : c_.model_type == "whisper" ? BuildWhisper()
                                                            : BuildBart());
      break;
    case ModelFamily::kVision: HEADROOM_RETURN_IF_ERROR(BuildVision()); break;
    case ModelFamily::kContrastive: HEADROOM_RETURN_IF_ERROR(BuildContrastive()); break;
    case ModelFamily::kVisionLanguage: HEADROOM_RETURN_IF_ERROR(BuildLlava()); break;
    case ModelFamily::kCnn: HEADROOM_RETURN_IF_ERROR(BuildCnn()); break;
    case ModelFamily::kMlp: HEADROOM_RETURN_IF_ERROR(BuildMlp()); break;
    case ModelFamily::kStateSpace: HEADROOM_RETURN_IF_ERROR(BuildMamba()); break;
  }
  HEADROOM_RETURN_IF_ERROR(CheckLoraTargetsUsed());
  return g_.Validate();
}

}  // namespace

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

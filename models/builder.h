// The model builders' shared machinery, internal to models/: the Builder that
// emits one model's forward graph (models/builders.h is the public API). Its
// methods live beside the families they build:
//   builders.cc                  options, norms, projections, activations, losses, dispatch by the config's
//                                family (models/model_registry.h)
//   builders/attention.cc        self-attention of the decoders and encoders, GPT-J, latent attention
//   builders/decoder.cc          decoder blocks, MLPs, mixtures of experts (GPT-OSS, Llama 4)
//   builders/encoder.cc          BERT and RoBERTa
//   builders/encoder_decoder.cc  T5, BART, Whisper
//   builders/vision.cc           ViT, the CLIP and SigLIP towers, LLaVA
//   builders/state_space.cc      Mamba
//   builders/cnn_and_mlp.cc      torchvision CNNs and the MLP chain
#ifndef HEADROOM_MODELS_BUILDER_H_
#define HEADROOM_MODELS_BUILDER_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "graph/graph.h"
#include "graph/ops.h"
#include "models/builders.h"
#include "models/model_config.h"

namespace headroom::builders_internal {

enum class Parallel : uint8_t { kReplicated, kColumn, kRow };

// Hugging Face's Llama-derived decoders: softmax in f32, the loss over f32 logits.
bool IsLlamaLike(const ModelConfig& c);
// The causal LMs whose loss reads the logits cast to f32: Llama's ForCausalLMLoss, GPT-J's forward.
// GPT-OSS and Llama 4 compute the loss with ForCausalLMLoss too, though their attention is not Llama's.
bool UpcastsLogits(const ModelConfig& c);
// The causal LMs whose loss is transformers' ForCausalLMLoss (all of UpcastsLogits but GPT-J, whose forward has
// its own); GPT-2 joins them by transformers 5 (Note [Causal LM loss]).
bool UsesForCausalLmLoss(const ModelConfig& c, const TorchRuntime& runtime);

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
DecoderNames DecoderNamesOf(const ModelConfig& c);

// Leaf module names PEFT targets by default (its
// TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING): the attention query
// and value projections.
std::vector<std::string> DefaultLoraTargets(const ModelConfig& c, const TransformersVersion& transformers);

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
        upcast_logits_(UpcastsLogits(config)),
        for_causal_lm_loss_(UsesForCausalLmLoss(config, options.runtime)) {
    if (o_.lora.enabled()) {
      const std::vector<std::string> targets =
          o_.lora.target_modules.empty() ? DefaultLoraTargets(c_, o_.runtime.transformers) : o_.lora.target_modules;
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
        for_causal_lm_loss_(UsesForCausalLmLoss(tower, options.runtime)),
        lora_targets_(parent.lora_targets_) {}

  // Checks the options, then emits the graph with the builder of the config's family (models/model_registry.h).
  absl::Status Build();

  // The whole model of each kind, as the registry's families name them (ModelFamilyEntry::build).
  // `merge_inputs`, when set, runs right after the token embedding lookup and returns the embeddings the
  // blocks take (LLaVA's image features scattered in), given the token ids and the looked-up embeddings.
  using MergeInputs = std::function<absl::StatusOr<TensorId>(TensorId ids, TensorId embeddings)>;
  absl::Status BuildDecoder(const MergeInputs& merge_inputs = nullptr);
  absl::Status BuildEncoder();
  absl::Status BuildT5();
  absl::Status BuildBart();
  absl::Status BuildWhisper();
  absl::Status BuildVision();
  absl::Status BuildContrastive();
  // LLaVA (Note [LLaVA]): the language model with the projected image features among its tokens.
  absl::Status BuildLlava();
  absl::Status BuildMamba();
  absl::Status BuildCnn();
  absl::Status BuildMlp();

 private:
  absl::Status CheckOptions() const;
  // One T5 attention module (Note [T5]): keys and values from `kv_source`, scores plus `position_bias`, plus
  // `mask` where the release adds it to the scores (kNone: no mask).
  TensorId T5Attention(const std::string& module, TensorId x, TensorId kv_source, TensorId position_bias,
                       TensorId mask);
  // T5's first-block position bias, [1, heads, q, k] buckets, or zeros of `dtype` without buckets; plus `mask`
  // where the release folds the mask into the bias (kNone: it does not).
  TensorId T5PositionBias(const std::string& module, int64_t q, int64_t k, TensorId mask, bool buckets,
                          DType dtype);
  TensorId T5FeedForward(const std::string& prefix, TensorId x);
  // One BART or Whisper attention module (Note [BART], Note [Whisper]): q from x, k and v from `kv_source`,
  // `mask` added to the scores (none when kNone).
  TensorId BartAttention(const std::string& module, TensorId x, TensorId kv_source, TensorId mask, bool causal);
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
  // LLaVA's get_image_features: the vision tower over batch x images images, the selected hidden state, the
  // projector; [batch x images, image_feature_tokens, text hidden].
  absl::StatusOr<TensorId> LlavaImageFeatures();
  // A tower's LoRA bookkeeping, for CheckLoraTargetsUsed.
  void MergeTower(const Builder& tower) {
    seen_leaves_.insert(tower.seen_leaves_.begin(), tower.seen_leaves_.end());
    used_targets_.insert(tower.used_targets_.begin(), tower.used_targets_.end());
  }
  // One MambaMixer's slow_forward over its block's normed input (Note [Mamba]).
  TensorId MambaMixer(const std::string& prefix, TensorId x);
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
  // Attention's stages (builders/attention.cc), in the order it runs them, and what they share.
  // The model types whose attention departs from the shared path.
  struct AttentionQuirks {
    bool opt = false;
    bool falcon = false;
    bool bigcode = false;  // GPTBigCode
    bool bloom = false;
    bool clip = false;    // either CLIP tower
    bool siglip = false;  // either SigLIP tower
    bool llama4 = false;
  };
  // This shard's queries, keys and values, and the module of the output projection.
  struct QkvProjection {
    TensorId q = kNone;
    TensorId k = kNone;
    TensorId v = kNone;
    std::string out_module;
  };
  // The family's projections of x: one fused module (GPT-2, GPT-NeoX, Bloom, GPTBigCode), GPT-J's, Falcon's, or
  // SeparateQkv's.
  QkvProjection ProjectQkv(const std::string& prefix, TensorId x, TensorId x_shard, const AttentionQuirks& quirks);
  QkvProjection GptjQkv(const std::string& prefix, TensorId x, TensorId x_shard);
  QkvProjection FalconQkv(const std::string& prefix, TensorId x, TensorId x_shard);
  // q_proj, k_proj and v_proj or their BERT and ViT names (Phi-3's one qkv_proj), with their norms.
  QkvProjection SeparateQkv(const std::string& prefix, TensorId x, TensorId x_shard, const AttentionQuirks& quirks);
  // Positions on q and k: the rotary embedding (Llama 4's in f32), Llama 4's L2 norm and temperature tuning.
  void PositionQueryAndKey(const std::string& prefix, const AttentionQuirks& quirks, QkvProjection& qkv);
  // Eager attention from the projections to the context, marked as the attention core; q, k and v become the
  // tensors its matmuls read.
  TensorId EagerAttentionCore(const std::string& core, TensorId x, TensorId sinks, const AttentionQuirks& quirks,
                              QkvProjection& qkv);
  // The copies eager attention makes to fold batch and heads: GPTBigCode's query rows, repeat_kv, Falcon's v.
  void FoldHeadsForTheMatMuls(const std::string& core, const AttentionQuirks& quirks, QkvProjection& qkv);
  // q k^T (Bloom's with its ALiBi biases), scaled, soft-capped (Gemma 2) and masked as the family does.
  TensorId ScaledMaskedScores(const std::string& core, TensorId x, const AttentionQuirks& quirks, TensorId q,
                              TensorId k);
  // The softmax (over GPT-OSS's sinks too, after OPT's clamp) and its cast back to v's dtype, before dropout.
  TensorId AttentionProbabilities(const std::string& core, TensorId scores, TensorId sinks, TensorId v,
                                  const AttentionQuirks& quirks);
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
  // The routed rows of flat [tokens, h] sorted over `experts` experts, as transformers 5's grouped_mm experts
  // take them.
  struct ExpertRows {
    TensorId rows;            // [experts, per_expert, h]
    TensorId weights;         // each row's routing weight, [experts x per_expert, 1]
    TensorId sorted_experts;  // i64, one per row
    TensorId permutation;     // i64, one per row
    TensorId offsets;         // i32 [experts]
    int64_t experts = 0;
    int64_t per_expert = 0;   // Note [MoE routing]
    int64_t top_k = 1;
  };
  ExpertRows SortRowsByExpert(const std::string& ex, TensorId flat, TensorId indices, TensorId weights,
                              int64_t experts, int64_t top_k);
  // The experts' output rows [experts, per_expert, h] times their routing weights, back in token order and
  // summed over top_k: [tokens, h].
  TensorId WeighAndRestoreTokenOrder(const std::string& ex, TensorId out, const ExpertRows& sorted);
  // Stacked experts under grouped_mm (Note [Grouped experts]), reached through transformers' AllToAllEP under
  // expert parallelism (Note [Expert parallelism in the graph]); [tokens, h].
  TensorId StackedExperts(const std::string& ex, TensorId flat, TensorId indices, TensorId weights, int64_t inner);
  // `experts` stacked experts over rows_in [rows, h] routed top_k ways: the experts module's forward.
  TensorId ExpertsForward(const std::string& ex, TensorId rows_in, TensorId indices, TensorId weights,
                          int64_t inner, int64_t experts, int64_t top_k);
  // One nn.Linear expert after another, as transformers 4 runs them; [tokens, h].
  TensorId LoopedExperts(const std::string& prefix, TensorId flat, const OpEmitter::Routing& routing, int64_t inner);
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
  bool for_causal_lm_loss_ = false;  // transformers' ForCausalLMLoss computes the loss
  TensorId cos_ = kNone;
  TensorId sin_ = kNone;
  TensorId local_cos_ = kNone;  // Gemma 3's sliding layers (Note [Gemma decoders])
  TensorId local_sin_ = kNone;
  TensorId alibi_ = kNone;  // Bloom's [batch x heads, 1, seq] biases (Note [Bloom])
  std::set<std::string> lora_targets_;
  std::set<std::string> seen_leaves_;
  std::set<std::string> used_targets_;
};

}  // namespace headroom::builders_internal

#endif  // HEADROOM_MODELS_BUILDER_H_

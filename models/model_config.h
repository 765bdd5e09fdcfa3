// What a model is, independent of how it is run: the architecture
// hyper-parameters a builder (models/builders.h) turns into a graph.
//
// Sources: a Hugging Face `config.json` (ParseHfConfig), the built-in
// torchvision CNNs (CnnConfig), and a small JSON form for MLP chains:
//
//   {"architectures": ["MlpChain"], "input_size": 784,
//    "layer_sizes": [1024, 1024, 10], "activation": "relu", "bias": true,
//    "dropout": 0.1, "torch_dtype": "float32"}
//
// (one Linear per entry of layer_sizes, the activation and dropout between
// consecutive Linears, cross-entropy over the last layer when training), and
// the torchvision CNNs in the same form (Note [CNN configs] in
// models/families/cnn.cc):
//
//   {"architectures": ["resnet50"], "image_size": 64, "num_classes": 100}
//
//   absl::StatusOr<ModelConfig> config = ParseHfConfig(text, "llama/config.json");
//   if (!config.ok()) ...;  // "llama/config.json: hidden_size: field is required"
//
// Invariants kept by ParseHfConfig: every size it returns is positive (a
// state-space model has no attention sizes: its heads stay 0), num_heads is
// divisible by num_kv_heads, hidden_size == num_heads * head_dim unless the
// config sets head_dim explicitly, experts_per_token <= num_experts, and the
// model is within Note [Model size bounds]. Errors name
// the document and the field (or fields) at fault.
//
// Note [Model size bounds]
// Each size field is at most 2^31, but their products are what become
// tensors (graph/graph.h, Note [Size bounds]), so the parser also bounds
// what they multiply into: at most kMaxLayers blocks (num_hidden_layers,
// n_layer, MLP layer_sizes entries), kMaxExperts experts, kMaxWeightElements
// elements in any one weight matrix (1 TiB in fp32) and kMaxParameters
// parameters in the model (17.6 trillion, beyond any published model). An
// error names the fields whose product is too large
// ("config.json: hidden_size x intermediate_size (2147483648 x 2147483648) ...").
#ifndef HEADROOM_MODELS_MODEL_CONFIG_H_
#define HEADROOM_MODELS_MODEL_CONFIG_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "graph/graph.h"
#include "graph/ops.h"
#include "models/quantization_config.h"

namespace headroom {

// Note [Model size bounds].
inline constexpr int64_t kMaxLayers = 4096;
inline constexpr int64_t kMaxExperts = 1024;
inline constexpr uint64_t kMaxWeightElements = kMaxTensorBytes / 4;
inline constexpr uint64_t kMaxParameters = uint64_t{1} << 44;

// The kind of model a family of models/model_registry.cc is (ModelFamilyEntry::kind), which
// estimators and builders branch on.
enum class ModelFamily : uint8_t {
  kDecoder,  // causal LM: Llama, Mistral, Qwen2, Qwen3, Gemma 1-3, OLMo 2, StarCoder2, OPT, GPT-2, GPT-NeoX,
             // Falcon, GPT-J, GPTBigCode, Bloom, Mixtral, GPT-OSS, Llama 4 (text)
  kEncoder,  // BERT, RoBERTa
  kEncoderDecoder,  // T5, Flan-T5, BART, Whisper
  kVision,   // ViT: a transformer over image patches (Note [Vision transformers] in builders/vision.cc)
  kContrastive,  // CLIP, SigLIP: a text and a vision tower trained on image-text pairs (`towers`)
  kVisionLanguage,  // LLaVA: a vision tower's projected patch features among a decoder's tokens (`towers`)
  kCnn,      // torchvision resnet50, vgg16
  kMlp,      // MlpChain
  kStateSpace,  // Mamba: selective state-space blocks, no attention (Note [Mamba] in builders/state_space.cc)
};

enum class NormKind : uint8_t { kLayerNorm, kRmsNorm };

// kRelativeBuckets: T5's learned bias per relative-position bucket; kAlibi: no position embeddings, a per-head
// linear bias on the attention scores (Bloom).
enum class PositionKind : uint8_t { kLearned, kRotary, kRelativeBuckets, kAlibi };

// Where a decoder block's norms sit around its attention and MLP branches.
enum class NormPlacement : uint8_t {
  kPre,           // x + f(norm(x)): Llama, GPT-2 and most decoders
  kSandwich,      // x + norm(f(norm(x))): Gemma 2 and 3
  kBranchOutput,  // x + norm(f(x)): OLMo 2 (post_attention_layernorm, post_feedforward_layernorm)
  kPostResidual,  // norm(x + f(x)): OPT with do_layer_norm_before false (opt-350m)
};

// What sits on top of an encoder body. BertModel/RobertaModel have none (kBodyOnly);
// when such a model is trained the builder attaches kSequenceClassification
// (see Note [Headless encoders] in builders.h).
enum class EncoderHead : uint8_t { kBodyOnly, kMaskedLm, kSequenceClassification };
std::string_view EncoderHeadName(EncoderHead head);  // "body-only", "mlm", "classification"
absl::StatusOr<EncoderHead> ParseEncoderHead(std::string_view name);

struct ModelConfig {
  std::string origin;        // where it came from ("preset llama-3-8b", a path)
  std::string architecture;  // "LlamaForCausalLM", "BertModel", "resnet50", "MlpChain"
  // How `architecture` was chosen when the config does not name it first, in words ("architectures[1], ...",
  // "model_type 'RefinedWebModel', ..."); empty otherwise (Note [Choosing the architecture] in the .cc).
  std::string architecture_from;
  std::string model_type;    // HF model_type: "llama", "gpt2", "bert", ...; "cnn", "mlp"
  ModelFamily family = ModelFamily::kDecoder;
  DType torch_dtype = DType::kF32;  // the dtype the checkpoint is stored in

  // --- transformers (decoder and encoder) ---
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t num_layers = 0;
  int64_t num_heads = 0;
  int64_t num_kv_heads = 0;  // == num_heads without GQA/MQA
  int64_t head_dim = 0;      // hidden_size / num_heads unless the config says otherwise
  int64_t intermediate_size = 0;
  int64_t max_position_embeddings = 0;
  int64_t type_vocab_size = 0;  // BERT token-type embeddings; 0 when absent
  NormKind norm = NormKind::kLayerNorm;
  double norm_eps = 1e-5;
  ActivationKind activation = ActivationKind::kGelu;
  bool gated_mlp = false;  // Llama-style gate_proj/up_proj/down_proj (SwiGLU)
  PositionKind positions = PositionKind::kLearned;
  double rotary_pct = 1.0;  // GPT-NeoX partial rotary
  int64_t rotary_dim = 0;   // GPT-J: rotated features at the start of each head; 0: head_dim x rotary_pct
  bool tie_word_embeddings = false;
  bool qkv_bias = false;         // bias on the q/k/v projections
  bool attn_output_bias = false;  // bias on the attention output projection
  bool mlp_bias = false;
  bool norm_bias = true;         // LayerNorm has a bias (RMSNorm never does)
  bool parallel_residual = false;  // GPT-NeoX use_parallel_residual, Falcon parallel_attn
  int64_t branch_norms = 2;        // parallel_residual: 2 when each branch has its own norm (GPT-NeoX,
                                   // Falcon-40B), 1 when one norm feeds both (Falcon-7B, GPT-J)
  bool lm_head_bias = false;       // GPT-J's lm_head has a bias
  bool residual_from_norm = false;  // Bloom's apply_residual_connection_post_layernorm: branches add to their
                                    // norm's output, not to the block's input
  bool embedding_norm = false;      // Bloom: a LayerNorm on the embeddings (word_embeddings_layernorm)
  bool final_norm = true;        // decoders: a norm after the last block
  int64_t word_embed_proj_dim = 0;  // OPT: token embeddings and lm_head this wide, projected into and out of
                                    // hidden_size (project_in, project_out); 0: hidden_size
  int64_t position_offset = 0;      // OPT: learned position rows before position 0 (2)
  double attention_dropout = 0;  // on attention probabilities
  double hidden_dropout = 0;     // after attention output and MLP output
  double embedding_dropout = 0;  // after the embeddings
  EncoderHead encoder_head = EncoderHead::kBodyOnly;
  bool encoder_pooler = true;  // BertModel add_pooling_layer
  int64_t num_labels = 2;      // sequence classification head size

  // --- decoder variants (Qwen3, Gemma 1-3, Phi-3, OLMo 2; Note [Gemma decoders] in builders/decoder.cc) ---
  NormPlacement norm_placement = NormPlacement::kPre;
  bool qk_norm = false;             // Qwen3, Gemma 3: RMSNorm over head_dim on q and k (q_norm, k_norm)
  bool qk_norm_full = false;        // OLMo 2: q_norm/k_norm over the whole projection, before the heads split
  bool norm_plus_one = false;       // Gemma: RMSNorm scales by (1 + weight), in f32
  bool embedding_scaled = false;    // Gemma: embeddings times sqrt(hidden_size)
  double attn_logit_softcap = 0;    // Gemma 2: scores = cap * tanh(scores / cap); 0: none
  double final_logit_softcap = 0;   // Gemma 2: logits = cap * tanh(logits / cap); 0: none
  int64_t sliding_window = 0;       // tokens a sliding-window layer attends to; 0: no such layers
  int64_t global_layer_every = 0;   // with a window: every Nth layer attends to all (Gemma 2: 2, Gemma 3: 6);
                                    // 0: none does
  std::vector<bool> sliding_layers;  // layer_types, one per layer (true: sliding); when set, overrides the above
  bool local_rotary = false;        // Gemma 3: sliding layers read a second rotary table (rope_local_base_freq)
  double query_pre_attn_scalar = 0;  // Gemma 3: scores scale by its -1/2 power (not head_dim's); 0: head_dim
  bool fused_qkv = false;           // Phi-3: one qkv_proj whose output q, k and v are slices of
  bool fused_gate_up = false;       // Phi-3: one gate_up_proj, chunked into gate and up
  bool attention_softmax_f32 = false;  // GPTBigCode's attention_softmax_in_fp32: 16-bit scores upcast for softmax
  bool kv_broadcast_early = false;  // Falcon's new_decoder_architecture: k and v copied out to every query head
                                    // before the rotary embedding (Note [Falcon] in builders/attention.cc)

  // --- mixture of experts (Mixtral, Qwen2-MoE, Qwen3-MoE) ---
  int64_t num_experts = 0;        // 0: dense MLP
  int64_t experts_per_token = 0;  // top-k
  int64_t moe_intermediate_size = 0;     // each routed expert's; 0: intermediate_size (Mixtral)
  int64_t shared_expert_intermediate_size = 0;  // Qwen2-MoE's gated shared expert; 0: none
  int64_t moe_every = 1;                  // decoder_sparse_step: layer i is MoE when (i + 1) % moe_every == 0
  std::vector<int64_t> dense_layers;      // mlp_only_layers: dense whatever moe_every says

  // --- multi-head latent attention (DeepSeek-V2/V3; Note [Multi-head latent attention] in builders/attention.cc) ---
  int64_t q_lora_rank = 0;        // q through a rank-q_lora_rank bottleneck; 0: one q_proj
  int64_t kv_lora_rank = 0;       // the compressed KV latent; > 0 makes the attention MLA
  int64_t qk_nope_head_dim = 0;   // per head: q and k without rotary position
  int64_t qk_rope_head_dim = 0;   // per head: q and k with rotary position (k's is shared by the heads)
  int64_t v_head_dim = 0;
  bool shared_expert_gated = true;  // Qwen2-MoE gates its shared expert by a sigmoid; DeepSeek does not
  bool router_bias = false;         // DeepSeek-V3 (noaux_tc): e_score_correction_bias, one per expert

  // --- GPT-OSS and Llama 4 (Note [GPT-OSS] and Note [Llama 4] in builders/decoder.cc) ---
  bool attention_sinks = false;      // GPT-OSS: a learned sink logit per head (self_attn.sinks)
  // Llama 4: no_rope_layers, one per layer (true: the layer rotates q and k); empty: every layer does.
  std::vector<bool> rope_layers;
  bool qk_l2_norm = false;           // Llama 4 use_qk_norm: a weightless L2 norm of q and k on the rotary layers
  bool attn_temperature_tuning = false;  // Llama 4: the layers without rotary scale q by a per-position factor

  // --- encoder-decoders (T5, BART, Whisper; Notes [T5], [BART], [Whisper] in builders/encoder_decoder.cc) ---
  int64_t decoder_layers = 0;     // blocks in the decoder; num_layers counts the encoder's
  int64_t relative_buckets = 0;   // relative_attention_num_buckets of the first block's position bias
  double activation_dropout = 0;  // BART, Whisper: dropout after the feed-forward's activation
  // Whisper's audio encoder: num_mel_bins log-mel channels in, 2 x source_positions frames (30 s of audio),
  // source_positions (max_source_positions) encoder tokens after its stride-2 convolution. The decoder's
  // learned positions (max_target_positions) are max_position_embeddings.
  int64_t num_mel_bins = 0;
  int64_t source_positions = 0;

  // --- CNNs (torchvision) and vision transformers: square images of image_size pixels ---
  int64_t image_size = 224;
  int64_t in_channels = 3;  // ViT's num_channels
  int64_t num_classes = 1000;

  // --- vision transformers (ViT; CLIP's and SigLIP's vision towers) ---
  int64_t patch_size = 0;    // a patch_size x patch_size convolution of stride patch_size embeds each patch
  bool class_token = false;  // a learned token ahead of the patches (ViT, CLIP; SigLIP has none)

  // --- two-tower models (CLIP, SigLIP; Note [Contrastive towers] in builders/vision.cc) ---
  // The text tower, then the vision tower, each a whole config of its own (model_type "clip_text_model",
  // "clip_vision_model", ...); the top level holds the head and num_layers = both towers' layers.
  std::vector<ModelConfig> towers;
  int64_t projection_dim = 0;  // CLIP: text_projection and visual_projection map both towers to this width

  // --- vision-language models (LLaVA; Note [LLaVA] in builders/vision.cc) ---
  // `towers` holds the language model (a decoder config: text_config) and the vision tower (vision_config);
  // `activation` is the projector's (projector_hidden_act) and num_layers both towers' blocks.
  int64_t vision_feature_layer = 0;   // the hidden state after this many vision blocks feeds the projector
  bool vision_feature_full = false;   // vision_feature_select_strategy "full": the class token too

  // --- state-space models (Mamba; Note [Mamba] in builders/state_space.cc); intermediate_size is the mixer's width ---
  int64_t ssm_state_size = 0;   // state_size: N, the recurrent state per channel
  int64_t conv_kernel = 0;      // the depthwise causal convolution's width
  int64_t time_step_rank = 0;   // dt_proj's input width ("auto": ceil(hidden_size / 16))
  bool conv_bias = true;        // use_conv_bias
  bool residual_in_fp32 = false;  // the residual stream is kept in f32
  bool use_cache = true;        // inference keeps each layer's conv and SSM state (MambaCache)

  // --- what serving engines read from config.json beside the architecture (Note [Serving fields] in
  // model_config.cc); a vision-language model's come from its text_config ---
  std::string rope_scaling_type;  // rope_scaling's (or rope_parameters') rope_type/type; empty: no scaling
  double rope_scaling_factor = 1;  // its factor
  int64_t original_max_position_embeddings = 0;  // its original_max_position_embeddings; 0: not given
  // Each key a serving engine derives the longest sequence from (max_position_embeddings, n_positions,
  // max_seq_len, seq_length, model_max_length, max_target_positions, max_sequence_length, max_seq_length,
  // seq_len), as present in the config, in that order.
  std::vector<std::pair<std::string, int64_t>> length_keys;
  QuantizationConfig quantization;  // quantization_config; method kUnquantized when absent

  // --- MLP chains ---
  int64_t mlp_input_size = 0;
  std::vector<int64_t> mlp_layer_sizes;
  double mlp_dropout = 0;

  bool is_moe() const { return num_experts > 0; }
  // Patches of one image, (image_size / patch_size)^2 as a stride-patch_size convolution cuts them.
  int64_t num_patches() const { return (image_size / patch_size) * (image_size / patch_size); }
  // The sequence a vision transformer attends over: the patches and the class token.
  int64_t image_tokens() const { return num_patches() + (class_token ? 1 : 0); }
  // LLaVA: the language-model tokens each image fills, its patches (and the class token under "full").
  int64_t image_feature_tokens() const {
    return vision_tower().num_patches() + (vision_feature_full ? 1 : 0);
  }
  const ModelConfig& text_tower() const { return towers.front(); }
  const ModelConfig& vision_tower() const { return towers.back(); }
  bool is_mla() const { return kv_lora_rank > 0; }
  // Bytes of the state a state-space model keeps per sequence and layer at inference (HF's MambaCache):
  // conv_state [intermediate, conv_kernel] and ssm_state [intermediate, state_size], both in `dtype`.
  uint64_t RecurrentStateBytesPerLayer(DType dtype) const {
    return DTypeBytes(dtype, static_cast<uint64_t>(intermediate_size) *
                                 static_cast<uint64_t>(conv_kernel + ssm_state_size));
  }
  bool is_moe_layer(int64_t layer) const {
    if (!is_moe() || (layer + 1) % moe_every != 0) return false;
    for (int64_t dense : dense_layers) {
      if (dense == layer) return false;
    }
    return true;
  }
  // Whether block `layer` rotates q and k (Llama 4's NoPE layers do not).
  bool uses_rope(int64_t layer) const {
    return rope_layers.empty() ||
           (layer >= 0 && static_cast<size_t>(layer) < rope_layers.size() && rope_layers[static_cast<size_t>(layer)]);
  }
  // Whether block `layer` (0-based) attends within sliding_window only. Llama 4's chunked layers are such layers
  // with sliding_window = attention_chunk_size (Note [Llama 4] in builders/decoder.cc).
  bool is_sliding_layer(int64_t layer) const {
    if (sliding_window <= 0) return false;
    if (!sliding_layers.empty()) return layer >= 0 && static_cast<size_t>(layer) < sliding_layers.size() &&
                                        sliding_layers[static_cast<size_t>(layer)];
    return global_layer_every == 0 || layer % global_layer_every != global_layer_every - 1;
  }
};

// The config.json keys a transformer's sizes were read from, for errors that
// point at the line to change ("n_head" for GPT-2, "ffn_hidden_size" for Falcon).
struct ConfigFieldNames {
  std::string_view hidden = "hidden_size";
  std::string_view layers = "num_hidden_layers";
  std::string_view heads = "num_attention_heads";
  std::string_view kv_heads = "num_key_value_heads";  // the field that sets num_kv_heads
  std::string_view intermediate = "intermediate_size";
  std::string_view positions = "max_position_embeddings";
};
ConfigFieldNames FieldNamesOf(const ModelConfig& config);

// Parses a Hugging Face config.json (or the MlpChain form above). The
// architecture is the first entry of `architectures` that Headroom models,
// else `model_type`'s main class (RefinedWeb and RefinedWebModel are Falcon);
// architecture_from says which when it is not `architectures[0]`.
// Supported: every class of the model families models/model_registry.cc
// lists (SupportedArchitectures), the torchvision CNNs resnet50 and vgg16
// among them (image_size, num_classes and in_channels optional). Unknown
// architectures are an InvalidArgument error listing the supported ones.
absl::StatusOr<ModelConfig> ParseHfConfig(std::string_view json_text, std::string_view origin);

// "BartForConditionalGeneration, from architectures[1], ..." when the config
// did not name its class first (architecture_from), else empty: the line the
// reports print so that the class estimated is never a guess.
std::string ArchitectureChoice(const ModelConfig& config);

// The torchvision CNNs by name: "resnet50", "vgg16" (num_classes 1000,
// 224x224x3 images). NotFound for other names. Defined with the CNNs' family
// (models/families/cnn.cc).
absl::StatusOr<ModelConfig> CnnConfig(std::string_view name);
// Their names, "resnet50" and "vgg16".
std::vector<std::string> CnnNames();

// The architectures ParseHfConfig accepts, for help texts: every family's
// classes, in the registry's order (models/model_registry.cc).
std::vector<std::string> SupportedArchitectures();

}  // namespace headroom

#endif  // HEADROOM_MODELS_MODEL_CONFIG_H_

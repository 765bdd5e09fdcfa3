// The config.json reading that model families share, internal to models/: optional and bounded fields the way
// Hugging Face's config classes write them, the sizes every transformer has, Llama's block, and the checks a
// parsed config passes (Note [Model size bounds] in model_config.h). Each family's parser
// (models/families/, one per family) is written with these, so that a field reads, defaults and fails the same way in every
// family:
//
//   absl::Status ParseMyDecoder(const json& doc, const JsonPath& path, ModelConfig& c) {
//     HEADROOM_RETURN_IF_ERROR(ParseStandardDims(doc, path, /*default_max_positions=*/4096, c));
//     HEADROOM_ASSIGN_OR_RETURN(c.norm_eps, OptionalNumber(doc, "rms_norm_eps", path, 1e-6));
//     UseLlamaBlock(c);
//     return CheckTransformer(path, c);
//   }
//
// Errors name the field at fault under `path` ("config.json: hidden_size: must be positive, got 0").
#ifndef HEADROOM_MODELS_CONFIG_PARSING_H_
#define HEADROOM_MODELS_CONFIG_PARSING_H_

#include <cstdint>
#include <initializer_list>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/json_fields.h"
#include "graph/ops.h"
#include "models/model_config.h"
#include "nlohmann/json.hpp"

namespace headroom::builders_internal {
struct DecoderNames;
}  // namespace headroom::builders_internal

namespace headroom::models_internal {

using nlohmann::json;

// Any one size field (Note [Model size bounds]): builders multiply sizes together in int64.
inline constexpr int64_t kMaxSize = int64_t{1} << 31;
// Images (CNNs and vision transformers): square, at most this many pixels a side (Note [CNN configs]).
inline constexpr int64_t kMaxImageSize = 16384;
inline constexpr int64_t kMaxInChannels = 4096;

// HF configs write absent optional values as null ("n_inner": null): such a key is not Present.
bool Present(const json& object, std::string_view key);

// The value of an optional field, `fallback` when it is not Present.
absl::StatusOr<int64_t> OptionalInt(const json& object, std::string_view key, const JsonPath& path,
                                    int64_t fallback);
absl::StatusOr<double> OptionalNumber(const json& object, std::string_view key, const JsonPath& path,
                                      double fallback);
absl::StatusOr<bool> OptionalBool(const json& object, std::string_view key, const JsonPath& path, bool fallback);

// A size that must be > 0 (and at most kMaxSize).
absl::StatusOr<int64_t> PositiveInt(const json& object, std::string_view key, const JsonPath& path);
absl::StatusOr<int64_t> OptionalPositiveInt(const json& object, std::string_view key, const JsonPath& path,
                                            int64_t fallback);
// A count of blocks or experts: positive and at most `bound` (Note [Model size bounds]).
absl::StatusOr<int64_t> BoundedCount(const json& object, std::string_view key, const JsonPath& path, int64_t bound);
// A dropout probability in [0, 1), `fallback` when absent.
absl::StatusOr<double> Probability(const json& object, std::string_view key, const JsonPath& path, double fallback);

// A classification head's labels: num_labels, or as many as id2label names; c.num_labels (transformers' 2)
// otherwise.
absl::Status ParseNumLabels(const json& doc, const JsonPath& path, ModelConfig& c);

// Hugging Face's names for activations (transformers/activations.py ACT2FN): "gelu_new", "silu", "swish", ...
absl::StatusOr<ActivationKind> HfActivation(std::string_view name);
// The activation a config names under `key`, `fallback` when absent.
absl::StatusOr<ActivationKind> ParseActivation(const json& object, std::string_view key, const JsonPath& path,
                                               ActivationKind fallback);

// The keys a family names its width, depth and attention heads by.
struct SizeKeys {
  std::string_view hidden = "hidden_size";
  std::string_view layers = "num_hidden_layers";
  std::string_view heads = "num_attention_heads";
};

// vocab_size and the width, depth and heads every transformer config has; heads are not grouped unless the
// architecture's parser reads its key/value heads.
absl::Status ParseCoreDims(const json& doc, const JsonPath& path, const SizeKeys& keys, ModelConfig& c);

// The sizes every config with Hugging Face's standard key names has.
absl::Status ParseStandardDims(const json& doc, const JsonPath& path, int64_t default_max_positions, ModelConfig& c);

// Llama's block, which its successors keep: RMSNorm without a bias, a gated MLP, rotary positions.
void UseLlamaBlock(ModelConfig& c);

// attention_bias: one switch for the q/k/v and output projections alike (LlamaAttention and its descendants).
absl::Status ParseAttentionBias(const json& doc, const JsonPath& path, bool default_value, ModelConfig& c);

// What LlamaConfig's descendants (Mistral, Mixtral, Qwen2 and 3, Gemma 1-3, Phi-3, OLMo 2) read alike: the
// standard sizes (max_position_embeddings 4096 by default), num_key_value_heads, head_dim, rms_norm_eps,
// hidden_act, tie_word_embeddings and attention_dropout, and Llama's block. Each family's parser reads its own
// fields after these.
absl::Status ParseLlamaDecoder(const json& doc, const JsonPath& path, ModelConfig& c);

// A list of num_hidden_layers layer types, each one of the two `allowed` ("sliding_attention", ...); `windowed` is the
// type whose layers attend within a window (or chunk) and go into c.sliding_layers.
absl::Status ParseLayerTypeList(const json& doc, const JsonPath& path, std::initializer_list<std::string_view> allowed,
                                std::string_view windowed, ModelConfig& c);

// Heads that divide evenly (num_kv_heads into num_heads, num_heads into hidden_size when head_dim is not given,
// which it then sets) and experts_per_token within num_experts.
absl::Status CheckAttentionShape(const JsonPath& path, ModelConfig& c);
// One weight matrix of `rows` x `cols` elements, named by the fields that give its sides
// (Note [Model size bounds]).
absl::Status CheckWeight(const JsonPath& path, std::string_view rows_field, int64_t rows, std::string_view cols_field,
                         int64_t cols);
// The model's parameters, `what` naming the fields they come from, within kMaxParameters.
absl::Status CheckParameterCount(const JsonPath& path, std::string_view what, uint64_t parameters);
// Transformers: the largest weights and the whole model's parameter count.
absl::Status CheckTransformerSizes(const JsonPath& path, const ModelConfig& c);
// What a transformer's parse ends with: CheckAttentionShape, then CheckTransformerSizes.
absl::Status CheckTransformer(const JsonPath& path, ModelConfig& c);

// The config.json key names families share (ModelFamilyEntry::field_names in models/model_registry.h).
// GPT-2's, which GPT-J and GPTBigCode keep.
inline constexpr ConfigFieldNames kGpt2FieldNames{.hidden = "n_embd", .layers = "n_layer", .heads = "n_head",
                                                  .kv_heads = "n_head", .intermediate = "n_inner",
                                                  .positions = "n_positions"};
ConfigFieldNames Gpt2FieldNames(const ModelConfig& c);
// GPT-2's module names (transformer.h.N.ln_1, ...), which GPTBigCode keeps (defined in families/gpt2.cc).
builders_internal::DecoderNames Gpt2DecoderNames(const ModelConfig& c);
// Families that read no num_key_value_heads: the heads' own key sets them.
ConfigFieldNames UngroupedHeadNames(const ModelConfig& c);
// Two-tower models (CLIP, SigLIP, LLaVA): both towers' blocks count as the model's layers.
ConfigFieldNames TwoTowerFieldNames(const ModelConfig& c);

// A transformer family's parser (ModelFamilyEntry::parse in models/model_registry.h): `Parse`, then
// CheckTransformer.
template <absl::Status (*Parse)(const json&, const JsonPath&, ModelConfig&)>
absl::Status CheckedTransformer(const json& doc, const JsonPath& path, ModelConfig& c) {
  if (absl::Status status = Parse(doc, path, c); !status.ok()) return status;
  return CheckTransformer(path, c);
}

// ParseHfConfig of a document already parsed, whose errors name fields under `path`: LLaVA reads its
// text_config with it, a whole decoder config of its own (defined in model_config.cc).
absl::StatusOr<ModelConfig> ParseConfigDocument(const json& doc, const JsonPath& path, std::string_view origin);

}  // namespace headroom::models_internal

#endif  // HEADROOM_MODELS_CONFIG_PARSING_H_

#include "models/config_parsing.h"

#include <algorithm>
#include <cstdint>
#include <string>
#include <string_view>

#include "absl/strings/str_format.h"
#include "common/checked_math.h"
#include "common/name_table.h"
#include "common/quote.h"
#include "common/status_macros.h"

namespace headroom::models_internal {
namespace {

// Hugging Face's names for activations (transformers/activations.py ACT2FN).
constexpr NameTable<ActivationKind, 9> kHfActivationNames("activation", {{
    {"gelu", ActivationKind::kGelu},
    {"gelu_new", ActivationKind::kGeluNew},
    {"gelu_pytorch_tanh", ActivationKind::kGeluTanh},
    {"silu", ActivationKind::kSilu},
    {"relu", ActivationKind::kRelu},
    {"tanh", ActivationKind::kTanh},
    {"quick_gelu", ActivationKind::kQuickGelu},
    {"gelu_fast", ActivationKind::kGeluTanh, kAlias},
    {"swish", ActivationKind::kSilu, kAlias},
}});

}  // namespace

// HF configs write absent optional values as null ("n_inner": null).
bool Present(const json& object, std::string_view key) {
  auto it = object.find(std::string(key));
  return it != object.end() && !it->is_null();
}

absl::StatusOr<int64_t> OptionalInt(const json& object, std::string_view key, const JsonPath& path,
                                    int64_t fallback) {
  if (!Present(object, key)) return fallback;
  return RequireInt(object, key, path);
}

absl::StatusOr<double> OptionalNumber(const json& object, std::string_view key,
                                      const JsonPath& path, double fallback) {
  if (!Present(object, key)) return fallback;
  return RequireNumber(object, key, path);
}

absl::StatusOr<bool> OptionalBool(const json& object, std::string_view key, const JsonPath& path,
                                  bool fallback) {
  if (!Present(object, key)) return fallback;
  return RequireBool(object, key, path);
}

// A size that must be > 0.
absl::StatusOr<int64_t> PositiveInt(const json& object, std::string_view key,
                                    const JsonPath& path) {
  HEADROOM_ASSIGN_OR_RETURN(int64_t value, RequireInt(object, key, path));
  if (value <= 0) {
    return (path / key).Error(absl::StrFormat("must be positive, got %d", value));
  }
  // Builders multiply sizes together in int64; no real model comes close.
  if (value > kMaxSize) {
    return (path / key).Error(absl::StrFormat("implausibly large: %d (at most %d)", value, kMaxSize));
  }
  return value;
}

// A count of blocks or experts: positive and at most `bound`
// (Note [Model size bounds]).
absl::StatusOr<int64_t> BoundedCount(const json& object, std::string_view key, const JsonPath& path,
                                     int64_t bound) {
  HEADROOM_ASSIGN_OR_RETURN(int64_t value, RequireInt(object, key, path));
  if (value <= 0 || value > bound) {
    return (path / key).Error(absl::StrFormat("must be between 1 and %d, got %d", bound, value));
  }
  return value;
}

absl::StatusOr<int64_t> OptionalPositiveInt(const json& object, std::string_view key,
                                            const JsonPath& path, int64_t fallback) {
  if (!Present(object, key)) return fallback;
  return PositiveInt(object, key, path);
}

absl::StatusOr<double> Probability(const json& object, std::string_view key, const JsonPath& path,
                                   double fallback) {
  HEADROOM_ASSIGN_OR_RETURN(double p, OptionalNumber(object, key, path, fallback));
  if (!(p >= 0 && p < 1)) {
    return (path / key).Error(absl::StrFormat("must be a probability in [0, 1), got %g", p));
  }
  return p;
}

absl::Status ParseNumLabels(const json& doc, const JsonPath& path, ModelConfig& c) {
  if (Present(doc, "num_labels")) {
    HEADROOM_ASSIGN_OR_RETURN(c.num_labels, PositiveInt(doc, "num_labels", path));
  } else if (Present(doc, "id2label")) {
    const json& labels = doc["id2label"];
    if (!labels.is_object() || labels.empty()) {
      return (path / "id2label").Error("expected a non-empty object");
    }
    c.num_labels = static_cast<int64_t>(labels.size());
  }
  return absl::OkStatus();
}

absl::StatusOr<ActivationKind> ParseActivation(const json& object, std::string_view key,
                                               const JsonPath& path, ActivationKind fallback) {
  if (!Present(object, key)) return fallback;
  HEADROOM_ASSIGN_OR_RETURN(std::string name, RequireString(object, key, path));
  absl::StatusOr<ActivationKind> kind = kHfActivationNames.Parse(name);
  if (!kind.ok()) return (path / key).Error(std::string(kind.status().message()));
  return kind;
}

// vocab_size and the width, depth and heads every transformer config has; heads are not grouped unless the
// architecture's parser reads its key/value heads.
absl::Status ParseCoreDims(const json& doc, const JsonPath& path, const SizeKeys& keys, ModelConfig& c) {
  HEADROOM_ASSIGN_OR_RETURN(c.vocab_size, PositiveInt(doc, "vocab_size", path));
  HEADROOM_ASSIGN_OR_RETURN(c.hidden_size, PositiveInt(doc, keys.hidden, path));
  HEADROOM_ASSIGN_OR_RETURN(c.num_layers, BoundedCount(doc, keys.layers, path, kMaxLayers));
  HEADROOM_ASSIGN_OR_RETURN(c.num_heads, PositiveInt(doc, keys.heads, path));
  c.num_kv_heads = c.num_heads;
  return absl::OkStatus();
}

// The sizes every config with Hugging Face's standard key names has.
absl::Status ParseStandardDims(const json& doc, const JsonPath& path, int64_t default_max_positions,
                               ModelConfig& c) {
  HEADROOM_RETURN_IF_ERROR(ParseCoreDims(doc, path, {}, c));
  HEADROOM_ASSIGN_OR_RETURN(c.intermediate_size, PositiveInt(doc, "intermediate_size", path));
  HEADROOM_ASSIGN_OR_RETURN(c.max_position_embeddings,
                            OptionalPositiveInt(doc, "max_position_embeddings", path, default_max_positions));
  return absl::OkStatus();
}

// Llama's block, which its successors keep: RMSNorm without a bias, a gated MLP, rotary positions.
void UseLlamaBlock(ModelConfig& c) {
  c.norm = NormKind::kRmsNorm;
  c.norm_bias = false;
  c.gated_mlp = true;
  c.positions = PositionKind::kRotary;
}

// attention_bias: one switch for the q/k/v and output projections alike (LlamaAttention and its descendants).
absl::Status ParseAttentionBias(const json& doc, const JsonPath& path, bool default_value, ModelConfig& c) {
  HEADROOM_ASSIGN_OR_RETURN(c.qkv_bias, OptionalBool(doc, "attention_bias", path, default_value));
  c.attn_output_bias = c.qkv_bias;
  return absl::OkStatus();
}

absl::Status ParseLlamaDecoder(const json& doc, const JsonPath& path, ModelConfig& c) {
  HEADROOM_RETURN_IF_ERROR(ParseStandardDims(doc, path, 4096, c));
  HEADROOM_ASSIGN_OR_RETURN(c.num_kv_heads,
                            OptionalPositiveInt(doc, "num_key_value_heads", path, c.num_heads));
  HEADROOM_ASSIGN_OR_RETURN(c.head_dim, OptionalPositiveInt(doc, "head_dim", path, 0));
  HEADROOM_ASSIGN_OR_RETURN(c.norm_eps, OptionalNumber(doc, "rms_norm_eps", path, 1e-6));
  HEADROOM_ASSIGN_OR_RETURN(c.activation,
                            ParseActivation(doc, "hidden_act", path, ActivationKind::kSilu));
  HEADROOM_ASSIGN_OR_RETURN(c.tie_word_embeddings,
                            OptionalBool(doc, "tie_word_embeddings", path, false));
  HEADROOM_ASSIGN_OR_RETURN(c.attention_dropout,
                            Probability(doc, "attention_dropout", path, 0.0));
  UseLlamaBlock(c);
  return absl::OkStatus();
}

// A list of num_hidden_layers layer types, each one of the two `allowed` ("sliding_attention", ...); `windowed` is the
// type whose layers attend within a window (or chunk) and go into c.sliding_layers.
absl::Status ParseLayerTypeList(const json& doc, const JsonPath& path, std::initializer_list<std::string_view> allowed,
                                std::string_view windowed, ModelConfig& c) {
  const json& types = doc["layer_types"];
  if (!types.is_array() || types.size() != static_cast<size_t>(c.num_layers)) {
    return (path / "layer_types")
        .Error(absl::StrFormat("expected an array of num_hidden_layers (%d) layer types", c.num_layers));
  }
  c.sliding_layers.clear();
  for (size_t i = 0; i < types.size(); ++i) {
    HEADROOM_ASSIGN_OR_RETURN(const std::string type, AsString(types[i], path / "layer_types" / i));
    if (std::find(allowed.begin(), allowed.end(), type) == allowed.end()) {
      return (path / "layer_types" / i)
          .Error(absl::StrFormat("%s is neither '%s' nor '%s'", QuoteForError(type), *allowed.begin(),
                                 *(allowed.end() - 1)));
    }
    c.sliding_layers.push_back(type == windowed);
  }
  return absl::OkStatus();
}

absl::Status CheckAttentionShape(const JsonPath& path, ModelConfig& c) {
  const ConfigFieldNames fields = FieldNamesOf(c);
  if (c.num_heads % c.num_kv_heads != 0) {
    return (path / fields.kv_heads)
        .Error(absl::StrFormat("%d does not divide %s (%d)", c.num_kv_heads, fields.heads, c.num_heads));
  }
  if (c.head_dim == 0) {
    if (c.hidden_size % c.num_heads != 0) {
      return (path / fields.heads)
          .Error(absl::StrFormat("%d does not divide %s (%d)", c.num_heads, fields.hidden, c.hidden_size));
    }
    c.head_dim = c.hidden_size / c.num_heads;
  }
  if (c.is_moe() && c.experts_per_token > c.num_experts) {
    return (path / "num_experts_per_tok")
        .Error(absl::StrFormat("%d exceeds the %d experts", c.experts_per_token, c.num_experts));
  }
  return absl::OkStatus();
}

// One weight matrix of `rows` x `cols` elements, named by the fields that
// give its sides (Note [Model size bounds]).
absl::Status CheckWeight(const JsonPath& path, std::string_view rows_field, int64_t rows,
                         std::string_view cols_field, int64_t cols) {
  const uint64_t elements = SaturatingMul(static_cast<uint64_t>(rows), static_cast<uint64_t>(cols));
  if (elements <= kMaxWeightElements) return absl::OkStatus();
  return path.Error(absl::StrFormat(
      "%s x %s (%d x %d) exceeds the %d elements (1 TiB in fp32) a weight matrix may hold",
      rows_field, cols_field, rows, cols, kMaxWeightElements));
}

absl::Status CheckParameterCount(const JsonPath& path, std::string_view what, uint64_t parameters) {
  if (parameters <= kMaxParameters) return absl::OkStatus();
  return path.Error(absl::StrFormat("%s: about %s parameters, more than the %d a model may have", what,
                                    parameters == UINT64_MAX ? std::string("2^64") : std::to_string(parameters),
                                    kMaxParameters));
}

// Transformers: the largest weights and the whole model's parameter count.
absl::Status CheckTransformerSizes(const JsonPath& path, const ModelConfig& c) {
  const ConfigFieldNames fields = FieldNamesOf(c);
  const std::string_view hidden = fields.hidden, inner = fields.intermediate;
  HEADROOM_RETURN_IF_ERROR(CheckWeight(path, "vocab_size", c.vocab_size, hidden, c.hidden_size));
  HEADROOM_RETURN_IF_ERROR(
      CheckWeight(path, "vocab_size", c.vocab_size, "word_embed_proj_dim", c.word_embed_proj_dim));
  HEADROOM_RETURN_IF_ERROR(
      CheckWeight(path, hidden, c.hidden_size, "word_embed_proj_dim", c.word_embed_proj_dim));
  HEADROOM_RETURN_IF_ERROR(CheckWeight(path, hidden, c.hidden_size, inner, c.intermediate_size));
  HEADROOM_RETURN_IF_ERROR(CheckWeight(path, hidden, c.hidden_size, "moe_intermediate_size", c.moe_intermediate_size));
  HEADROOM_RETURN_IF_ERROR(CheckWeight(path, hidden, c.hidden_size, "shared_expert_intermediate_size",
                                       c.shared_expert_intermediate_size));
  HEADROOM_RETURN_IF_ERROR(CheckWeight(path, fields.positions, c.max_position_embeddings, hidden, c.hidden_size));
  // Whisper's encoder: its position table and its first convolution's [d_model, num_mel_bins, 3] weight.
  HEADROOM_RETURN_IF_ERROR(CheckWeight(path, "max_source_positions", c.source_positions, hidden, c.hidden_size));
  HEADROOM_RETURN_IF_ERROR(CheckWeight(path, "num_mel_bins x 3", c.num_mel_bins * 3, hidden, c.hidden_size));
  // T5's position bias table: a row of heads per relative-position bucket.
  HEADROOM_RETURN_IF_ERROR(
      CheckWeight(path, "relative_attention_num_buckets", c.relative_buckets, fields.heads, c.num_heads));
  if (c.is_mla()) {
    // Each size is at most 2^31, a sum of two at most 2^32: their products saturate rather than wrap.
    const auto heads_times = [&](int64_t width) {
      return static_cast<int64_t>(std::min<uint64_t>(
          SaturatingMul(static_cast<uint64_t>(c.num_heads), static_cast<uint64_t>(width)), INT64_MAX));
    };
    HEADROOM_RETURN_IF_ERROR(CheckWeight(path, hidden, c.hidden_size, "q_lora_rank", c.q_lora_rank));
    HEADROOM_RETURN_IF_ERROR(CheckWeight(path, c.q_lora_rank > 0 ? "q_lora_rank" : hidden,
                                         c.q_lora_rank > 0 ? c.q_lora_rank : c.hidden_size,
                                         "num_attention_heads x (qk_nope_head_dim + qk_rope_head_dim)",
                                         heads_times(c.head_dim)));
    HEADROOM_RETURN_IF_ERROR(CheckWeight(path, "kv_lora_rank", c.kv_lora_rank,
                                         "num_attention_heads x (qk_nope_head_dim + v_head_dim)",
                                         heads_times(c.qk_nope_head_dim + c.v_head_dim)));
    HEADROOM_RETURN_IF_ERROR(CheckWeight(path, "num_attention_heads x v_head_dim",
                                         heads_times(c.v_head_dim), hidden, c.hidden_size));
  }
  const uint64_t h = static_cast<uint64_t>(c.hidden_size);
  // Sizes are at most 2^31 each; their products may not fit int64, so all of
  // this is saturating uint64.
  const auto heads = static_cast<uint64_t>(c.num_heads), kv_heads = static_cast<uint64_t>(c.num_kv_heads);
  const uint64_t query_width = SaturatingMul(heads, static_cast<uint64_t>(c.head_dim));
  const uint64_t attention_width = SaturatingMul(heads + 2 * kv_heads, static_cast<uint64_t>(c.head_dim));
  if (SaturatingMul(h, attention_width) > kMaxWeightElements) {
    return path.Error(absl::StrFormat(
        "%s x (%s + 2 x %s) x head_dim (%d x (%d + 2 x %d) x %d) is more than the %d elements (1 TiB in fp32) "
        "the attention projections may hold",
        hidden, fields.heads, fields.kv_heads, c.hidden_size, c.num_heads, c.num_kv_heads, c.head_dim,
        kMaxWeightElements));
  }
  const uint64_t attention = SaturatingMul(h, SaturatingAdd(attention_width, query_width));
  const uint64_t mlp = SaturatingMul(static_cast<uint64_t>(c.gated_mlp || c.is_moe() ? 3 : 2),
                                     SaturatingMul(h, static_cast<uint64_t>(c.intermediate_size)));
  const uint64_t per_layer =
      SaturatingAdd(attention, SaturatingMul(mlp, static_cast<uint64_t>(std::max<int64_t>(1, c.num_experts))));
  // A decoder block of an encoder-decoder adds cross-attention: counted as two blocks, an upper bound.
  const uint64_t blocks = static_cast<uint64_t>(c.num_layers) + 2 * static_cast<uint64_t>(c.decoder_layers);
  uint64_t parameters = SaturatingMul(per_layer, blocks);
  parameters = SaturatingAdd(parameters, SaturatingMul(2 * h, static_cast<uint64_t>(c.vocab_size)));
  return CheckParameterCount(path, absl::StrFormat("%s, %s, %s, %s and %s", fields.layers, hidden, inner, "vocab_size",
                                                   c.is_moe() ? "num_local_experts" : "the heads"),
                             parameters);
}

absl::Status CheckTransformer(const JsonPath& path, ModelConfig& c) {
  HEADROOM_RETURN_IF_ERROR(CheckAttentionShape(path, c));
  return CheckTransformerSizes(path, c);
}

ConfigFieldNames Gpt2FieldNames(const ModelConfig&) { return kGpt2FieldNames; }
ConfigFieldNames UngroupedHeadNames(const ModelConfig&) { return {.kv_heads = "num_attention_heads"}; }
ConfigFieldNames TwoTowerFieldNames(const ModelConfig&) {
  return {.layers = "text_config.num_hidden_layers + vision_config.num_hidden_layers"};
}

absl::StatusOr<ActivationKind> HfActivation(std::string_view name) { return kHfActivationNames.Parse(name); }

}  // namespace headroom::models_internal

// Meta's Llama 4 text model (Llama4ForCausalLM, model_type "llama4_text"; Note [Llama 4] in builders/decoder.cc): the
// text_config of Llama4ForConditionalGeneration, whose vision tower is not modelled. Built by BuildDecoder
// (builders/decoder.cc).
#include <algorithm>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/strings/str_format.h"
#include "common/status_macros.h"
#include "models/builder.h"
#include "models/config_parsing.h"
#include "models/model_registry.h"

namespace headroom::models_internal {
namespace {

using builders_internal::Builder;

// attn_temperature_tuning is a bool in Llama4TextConfig; the released configs write an integer (4).
absl::StatusOr<bool> Truthy(const json& doc, std::string_view key, const JsonPath& path, bool fallback) {
  if (!Present(doc, key)) return fallback;
  const json& value = doc[std::string(key)];
  if (value.is_boolean()) return value.get<bool>();
  if (value.is_number()) return value.get<double>() != 0;
  return (path / key).Error(absl::StrFormat("expected a boolean or a number, got %s", JsonTypeName(value)));
}

// Llama4ForCausalLM (transformers' modeling_llama4.py, Note [Llama 4] in builders/decoder.cc), the text_config of
// Llama4ForConditionalGeneration: Llama's attention with NoPE layers (no_rope_layers, else every
// no_rope_layer_interval-th layer) that attend to everything, the other layers chunked (attention_chunk_size) with
// an L2 q/k norm (use_qk_norm); MoE layers (moe_layers, else every interleave_moe_layer_step-th) of
// num_local_experts fused experts of intermediate_size and a shared expert of the same size, dense layers of
// intermediate_size_mlp.
absl::Status ParseLlama4Text(const json& doc, const JsonPath& path, ModelConfig& c) {
  HEADROOM_RETURN_IF_ERROR(ParseStandardDims(doc, path, 4096 * 32, c));
  HEADROOM_ASSIGN_OR_RETURN(c.num_kv_heads, OptionalPositiveInt(doc, "num_key_value_heads", path, c.num_heads));
  HEADROOM_ASSIGN_OR_RETURN(c.head_dim, OptionalPositiveInt(doc, "head_dim", path, 128));
  HEADROOM_ASSIGN_OR_RETURN(c.norm_eps, OptionalNumber(doc, "rms_norm_eps", path, 1e-5));
  HEADROOM_ASSIGN_OR_RETURN(c.activation, ParseActivation(doc, "hidden_act", path, ActivationKind::kSilu));
  HEADROOM_ASSIGN_OR_RETURN(c.tie_word_embeddings, OptionalBool(doc, "tie_word_embeddings", path, false));
  HEADROOM_ASSIGN_OR_RETURN(c.attention_dropout, Probability(doc, "attention_dropout", path, 0.0));
  HEADROOM_RETURN_IF_ERROR(ParseAttentionBias(doc, path, false, c));
  UseLlamaBlock(c);
  // The experts and the shared expert are intermediate_size wide, the dense layers intermediate_size_mlp.
  c.moe_intermediate_size = c.intermediate_size;
  c.shared_expert_intermediate_size = c.intermediate_size;
  c.shared_expert_gated = false;
  HEADROOM_ASSIGN_OR_RETURN(c.intermediate_size, OptionalPositiveInt(doc, "intermediate_size_mlp", path, 16384));
  HEADROOM_ASSIGN_OR_RETURN(c.num_experts, BoundedCount(doc, "num_local_experts", path, kMaxExperts));
  HEADROOM_ASSIGN_OR_RETURN(c.experts_per_token, OptionalPositiveInt(doc, "num_experts_per_tok", path, 1));
  if (Present(doc, "moe_layers")) {
    const json& layers = doc["moe_layers"];
    if (!layers.is_array()) return (path / "moe_layers").Error("expected an array of layer indices");
    std::vector<bool> moe(static_cast<size_t>(c.num_layers), false);
    for (size_t i = 0; i < layers.size(); ++i) {
      HEADROOM_ASSIGN_OR_RETURN(const int64_t layer, AsInt(layers[i], path / "moe_layers" / i));
      if (layer < 0 || layer >= c.num_layers) {
        return (path / "moe_layers" / i)
            .Error(absl::StrFormat("layer %d is not below num_hidden_layers (%d)", layer, c.num_layers));
      }
      moe[static_cast<size_t>(layer)] = true;
    }
    for (int64_t i = 0; i < c.num_layers; ++i) {
      if (!moe[static_cast<size_t>(i)]) c.dense_layers.push_back(i);
    }
  } else {
    HEADROOM_ASSIGN_OR_RETURN(c.moe_every, OptionalInt(doc, "interleave_moe_layer_step", path, 1));
    if (c.moe_every < 1 || c.moe_every > kMaxLayers) {
      return (path / "interleave_moe_layer_step").Error(absl::StrFormat("must be between 1 and %d", kMaxLayers));
    }
  }
  // no_rope_layers: 1 where the layer rotates; absent or empty, every no_rope_layer_interval-th layer does not.
  const json empty = json::array();
  const json& rope = Present(doc, "no_rope_layers") ? doc["no_rope_layers"] : empty;
  if (!rope.is_array() || (!rope.empty() && rope.size() != static_cast<size_t>(c.num_layers))) {
    return (path / "no_rope_layers")
        .Error(absl::StrFormat("expected an empty array or num_hidden_layers (%d) flags", c.num_layers));
  }
  if (rope.empty()) {
    HEADROOM_ASSIGN_OR_RETURN(const int64_t interval, OptionalPositiveInt(doc, "no_rope_layer_interval", path, 4));
    for (int64_t i = 0; i < c.num_layers; ++i) c.rope_layers.push_back((i + 1) % interval != 0);
  } else {
    for (size_t i = 0; i < rope.size(); ++i) {
      HEADROOM_ASSIGN_OR_RETURN(const int64_t flag, AsInt(rope[i], path / "no_rope_layers" / i));
      if (flag != 0 && flag != 1) return (path / "no_rope_layers" / i).Error("must be 0 or 1");
      c.rope_layers.push_back(flag == 1);
    }
  }
  HEADROOM_ASSIGN_OR_RETURN(c.qk_l2_norm, OptionalBool(doc, "use_qk_norm", path, true));
  HEADROOM_ASSIGN_OR_RETURN(c.attn_temperature_tuning, Truthy(doc, "attn_temperature_tuning", path, true));
  // Chunked layers cache attention_chunk_size tokens, as transformers' DynamicCache does (Note [Llama 4]).
  // null: every layer attends to everything; absent: the class default, 8192.
  HEADROOM_ASSIGN_OR_RETURN(c.sliding_window, OptionalPositiveInt(doc, "attention_chunk_size", path,
                                                                  doc.contains("attention_chunk_size") ? 0 : 8192));
  if (Present(doc, "layer_types")) {
    HEADROOM_RETURN_IF_ERROR(
        ParseLayerTypeList(doc, path, {"chunked_attention", "full_attention"}, "chunked_attention", c));
    if (c.sliding_window == 0 && std::find(c.sliding_layers.begin(), c.sliding_layers.end(), true) !=
                                     c.sliding_layers.end()) {
      return (path / "attention_chunk_size").Error("null, but layer_types lists chunked_attention layers");
    }
    return absl::OkStatus();
  }
  // Llama4TextConfig: the rotary layers are the chunked ones when there is a chunk size.
  if (c.sliding_window > 0) c.sliding_layers = c.rope_layers;
  return absl::OkStatus();
}

ConfigFieldNames Llama4TextFieldNames(const ModelConfig&) { return {.intermediate = "intermediate_size_mlp"}; }

constexpr ArchitectureClass kClasses[] = {{"Llama4ForCausalLM"}};
constexpr RefusedClass kRefusedClasses[] = {
    {"Llama4ForConditionalGeneration",
     "the vision tower is not modelled; give its text_config as a config of its own with \"architectures\": "
     "[\"Llama4ForCausalLM\"] (the preset llama-4-scout-17b-16e is Scout's)"},
};

}  // namespace

extern constexpr ModelFamilyEntry kLlama4TextFamily{
    .model_type = "llama4_text",
    .classes = kClasses,
    .kind = ModelFamily::kDecoder,
    .parse = CheckedTransformer<ParseLlama4Text>,
    .build = [](Builder& b) { return b.BuildDecoder(); },
    .field_names = Llama4TextFieldNames,
    .refused_classes = kRefusedClasses,
};

}  // namespace headroom::models_internal

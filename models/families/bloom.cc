// BigScience's BLOOM (BloomForCausalLM; Note [Bloom] in builders/attention.cc). Built by BuildDecoder
// (builders/decoder.cc).
#include <cstdint>
#include <initializer_list>
#include <string_view>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "common/status_macros.h"
#include "models/builder.h"
#include "models/config_parsing.h"
#include "models/model_registry.h"

namespace headroom::models_internal {
namespace {

using builders_internal::Builder;

// The key a config.json gives a size under: the first of `keys` present (they are in the order the config class
// lets one override another), else the last, the config class's own name, for the error that it is missing.
std::string_view KeyOf(const json& doc, std::initializer_list<std::string_view> keys) {
  for (std::string_view key : keys) {
    if (Present(doc, key)) return key;
  }
  return *(keys.end() - 1);
}

// BloomForCausalLM (transformers 4.46's modeling_bloom.py, Note [Bloom] in builders/attention.cc): ALiBi instead of
// position embeddings, a LayerNorm after the word embeddings, a per-head fused query_key_value, pre-norm blocks whose
// residual is the norm's output under apply_residual_connection_post_layernorm, a 4 x hidden_size MLP with Bloom's
// tanh GELU, biases on every Linear, the tied lm_head. BloomConfig takes n_embed over hidden_size, and
// num_hidden_layers and num_attention_heads (the older hub files' keys) over n_layer and n_head.
absl::Status ParseBloom(const json& doc, const JsonPath& path, ModelConfig& c) {
  const std::string_view hidden = KeyOf(doc, {"n_embed", "hidden_size"});
  const std::string_view layers = KeyOf(doc, {"num_hidden_layers", "n_layer"});
  const std::string_view heads = KeyOf(doc, {"num_attention_heads", "n_head"});
  HEADROOM_RETURN_IF_ERROR(ParseCoreDims(doc, path, {.hidden = hidden, .layers = layers, .heads = heads}, c));
  if (c.hidden_size % c.num_heads != 0) {
    return (path / heads).Error(absl::StrFormat("%d does not divide %s (%d)", c.num_heads, hidden, c.hidden_size));
  }
  c.intermediate_size = 4 * c.hidden_size;
  HEADROOM_ASSIGN_OR_RETURN(c.norm_eps, OptionalNumber(doc, "layer_norm_epsilon", path, 1e-5));
  HEADROOM_ASSIGN_OR_RETURN(c.residual_from_norm,
                            OptionalBool(doc, "apply_residual_connection_post_layernorm", path, false));
  HEADROOM_ASSIGN_OR_RETURN(c.hidden_dropout, Probability(doc, "hidden_dropout", path, 0.0));
  HEADROOM_ASSIGN_OR_RETURN(c.attention_dropout, Probability(doc, "attention_dropout", path, 0.0));
  HEADROOM_ASSIGN_OR_RETURN(c.tie_word_embeddings, OptionalBool(doc, "tie_word_embeddings", path, true));
  HEADROOM_ASSIGN_OR_RETURN(const int64_t tp, OptionalPositiveInt(doc, "pretraining_tp", path, 1));
  HEADROOM_ASSIGN_OR_RETURN(const bool slow_but_exact, OptionalBool(doc, "slow_but_exact", path, false));
  if (slow_but_exact && tp > 1) {
    // BloomAttention and BloomMLP then run dense and dense_4h_to_h as pretraining_tp sliced matmuls.
    return (path / "slow_but_exact").Error(absl::StrFormat("true with pretraining_tp %d is not supported", tp));
  }
  c.activation = ActivationKind::kGeluTanh;  // bloom_gelu_forward: the tanh approximation
  c.norm = NormKind::kLayerNorm;
  c.positions = PositionKind::kAlibi;
  c.embedding_norm = true;
  c.qkv_bias = c.attn_output_bias = c.mlp_bias = true;
  return absl::OkStatus();
}

ConfigFieldNames BloomFieldNames(const ModelConfig&) {
  return {.layers = "n_layer", .heads = "n_head", .kv_heads = "n_head", .intermediate = "4 x hidden_size"};
}

constexpr ArchitectureClass kClasses[] = {{"BloomForCausalLM"}};

std::vector<std::string> LoraTargets(const ModelConfig&, const TransformersVersion&) {
  return {"query_key_value"};
}

builders_internal::DecoderNames ModuleNames(const ModelConfig&) {
  return {.root = "transformer.", .embed = "word_embeddings", .layers = "h", .final_norm = "ln_f"};
}

}  // namespace

extern constexpr ModelFamilyEntry kBloomFamily{
    .model_type = "bloom",
    .classes = kClasses,
    .kind = ModelFamily::kDecoder,
    .parse = CheckedTransformer<ParseBloom>,
    .build = [](Builder& b) { return b.BuildDecoder(); },
    .field_names = BloomFieldNames,
    .lora_targets = LoraTargets,
    .decoder_names = ModuleNames,
};

}  // namespace headroom::models_internal

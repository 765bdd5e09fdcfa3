// TII's Falcon (FalconForCausalLM; Note [Falcon] in builders/attention.cc), and the configs of RWConfig, the remote
// code it was first published with (model_type "RefinedWebModel" or "RefinedWeb"). Built by BuildDecoder
// (builders/decoder.cc).
#include <cstdint>
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

// FalconForCausalLM (transformers 4.46's modeling_falcon.py, Note [Falcon] in builders/attention.cc): one fused
// query_key_value whose key/value heads are one (multi_query, Falcon-7B), num_kv_heads
// (new_decoder_architecture, Falcon-40B and 180B) or num_attention_heads; rotary positions; LayerNorm with bias;
// attention and MLP in parallel from one norm (ln_attn and ln_mlp under the new architecture) or in sequence; a
// GELU MLP of ffn_hidden_size; biases on every Linear when `bias`; the lm_head tied to the embeddings.
absl::Status ParseFalcon(const json& doc, const JsonPath& path, ModelConfig& c) {
  // RWConfig, the remote code Falcon was first published with, names its sizes n_embed, n_layer, n_head and
  // n_head_kv; FalconConfig still takes n_embed, and transformers' converter renames the others.
  auto named = [&](std::string_view key, std::string_view rw_key) {
    return Present(doc, key) || !Present(doc, rw_key) ? key : rw_key;
  };
  HEADROOM_RETURN_IF_ERROR(ParseCoreDims(doc, path,
                                         {.hidden = named("hidden_size", "n_embed"),
                                          .layers = named("num_hidden_layers", "n_layer"),
                                          .heads = named("num_attention_heads", "n_head")},
                                         c));
  HEADROOM_ASSIGN_OR_RETURN(c.intermediate_size,
                            OptionalPositiveInt(doc, "ffn_hidden_size", path, 4 * c.hidden_size));
  HEADROOM_ASSIGN_OR_RETURN(c.max_position_embeddings,
                            OptionalPositiveInt(doc, "max_position_embeddings", path, 2048));
  HEADROOM_ASSIGN_OR_RETURN(c.norm_eps, OptionalNumber(doc, "layer_norm_epsilon", path, 1e-5));
  HEADROOM_ASSIGN_OR_RETURN(c.activation, ParseActivation(doc, "activation", path, ActivationKind::kGelu));
  HEADROOM_ASSIGN_OR_RETURN(const bool alibi, OptionalBool(doc, "alibi", path, false));
  if (alibi) {
    // falcon-rw-1b and -7b: ALiBi scores in f32 with dropout, which the builder does not model for Falcon.
    return (path / "alibi").Error("true (ALiBi position biases) is not supported for Falcon");
  }
  HEADROOM_ASSIGN_OR_RETURN(const bool new_architecture, OptionalBool(doc, "new_decoder_architecture", path, false));
  HEADROOM_ASSIGN_OR_RETURN(const bool multi_query, OptionalBool(doc, "multi_query", path, true));
  HEADROOM_ASSIGN_OR_RETURN(c.parallel_residual, OptionalBool(doc, "parallel_attn", path, true));
  HEADROOM_ASSIGN_OR_RETURN(const int64_t norms, OptionalInt(doc, "num_ln_in_parallel_attn", path, 0));
  if (norms != 0 && norms != 1 && norms != 2) {
    return (path / "num_ln_in_parallel_attn").Error(absl::StrFormat("must be 1, 2 or null, got %d", norms));
  }
  if (new_architecture) {
    // FalconAttention: num_kv_heads groups, each of num_attention_heads / num_kv_heads queries, a key and a value.
    HEADROOM_ASSIGN_OR_RETURN(c.num_kv_heads,
                              OptionalPositiveInt(doc, named("num_kv_heads", "n_head_kv"), path, c.num_heads));
    if (!c.parallel_residual) {
      // FalconDecoderLayer reads ln_attn (or mlp_layernorm_out) that only the parallel layout defines.
      return (path / "parallel_attn").Error("false with new_decoder_architecture: transformers builds no such layer");
    }
    c.branch_norms = norms == 1 ? 1 : 2;
    c.kv_broadcast_early = true;
  } else {
    // multi_query: one key/value head; otherwise num_kv_heads is ignored and every head has its own.
    c.num_kv_heads = multi_query ? 1 : c.num_heads;
    if (c.parallel_residual && norms == 2) {
      return (path / "num_ln_in_parallel_attn")
          .Error("2 needs new_decoder_architecture: the old layout has one input_layernorm");
    }
    c.branch_norms = 1;
  }
  HEADROOM_ASSIGN_OR_RETURN(c.qkv_bias, OptionalBool(doc, "bias", path, false));
  c.attn_output_bias = c.mlp_bias = c.qkv_bias;
  HEADROOM_ASSIGN_OR_RETURN(c.hidden_dropout, Probability(doc, "hidden_dropout", path, 0.0));
  HEADROOM_ASSIGN_OR_RETURN(c.attention_dropout, Probability(doc, "attention_dropout", path, 0.0));
  HEADROOM_ASSIGN_OR_RETURN(c.tie_word_embeddings, OptionalBool(doc, "tie_word_embeddings", path, true));
  c.norm = NormKind::kLayerNorm;
  c.positions = PositionKind::kRotary;
  return absl::OkStatus();
}

ConfigFieldNames FalconFieldNames(const ModelConfig& c) {
  const std::string_view kv = c.kv_broadcast_early      ? "num_kv_heads"
                              : c.num_kv_heads == 1 ? "multi_query"
                                                    : "num_attention_heads";
  return {.kv_heads = kv, .intermediate = "ffn_hidden_size"};
}

constexpr ArchitectureClass kClasses[] = {{"FalconForCausalLM"}};
// RWConfig's, the remote code Falcon was first published with (tiiuae/falcon-7b's first config.json says
// "RefinedWebModel", falcon-40b's "RefinedWeb").
constexpr std::string_view kModelTypeAliases[] = {"RefinedWebModel", "RefinedWeb"};

std::vector<std::string> LoraTargets(const ModelConfig&, const TransformersVersion&) {
  return {"query_key_value"};
}

builders_internal::DecoderNames ModuleNames(const ModelConfig& c) {
  // Note [Falcon]: ln_attn and ln_mlp when each parallel branch has its own norm.
  const bool two = c.parallel_residual && c.branch_norms == 2;
  return {.root = "transformer.", .embed = "word_embeddings", .layers = "h",
          .norm1 = two ? "ln_attn" : "input_layernorm", .norm2 = two ? "ln_mlp" : "post_attention_layernorm",
          .final_norm = "ln_f"};
}

}  // namespace

extern constexpr ModelFamilyEntry kFalconFamily{
    .model_type = "falcon",
    .classes = kClasses,
    .kind = ModelFamily::kDecoder,
    .parse = CheckedTransformer<ParseFalcon>,
    .build = [](Builder& b) { return b.BuildDecoder(); },
    .field_names = FalconFieldNames,
    .model_type_aliases = kModelTypeAliases,
    .lora_targets = LoraTargets,
    .decoder_names = ModuleNames,
};

}  // namespace headroom::models_internal

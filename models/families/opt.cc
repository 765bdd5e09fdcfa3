// Meta's OPT (OPTForCausalLM; Note [OPT] in builders/attention.cc). Built by BuildDecoder (builders/decoder.cc).
#include "common/status_macros.h"
#include "models/builder.h"
#include "models/config_parsing.h"
#include "models/model_registry.h"

namespace headroom::models_internal {
namespace {

using builders_internal::Builder;

// OPTForCausalLM (transformers' modeling_opt.py, Note [OPT] in builders/attention.cc): learned positions offset by 2,
// LayerNorm before (do_layer_norm_before, most sizes) or after (opt-350m) each branch, fc1/fc2 with ReLU,
// embeddings of word_embed_proj_dim projected in and out of hidden_size when it differs.
absl::Status ParseOpt(const json& doc, const JsonPath& path, ModelConfig& c) {
  HEADROOM_RETURN_IF_ERROR(ParseCoreDims(doc, path, {}, c));
  HEADROOM_ASSIGN_OR_RETURN(c.intermediate_size, PositiveInt(doc, "ffn_dim", path));
  HEADROOM_ASSIGN_OR_RETURN(c.max_position_embeddings,
                            OptionalPositiveInt(doc, "max_position_embeddings", path, 2048));
  HEADROOM_ASSIGN_OR_RETURN(c.word_embed_proj_dim,
                            OptionalPositiveInt(doc, "word_embed_proj_dim", path, c.hidden_size));
  HEADROOM_ASSIGN_OR_RETURN(c.activation,
                            ParseActivation(doc, "activation_function", path, ActivationKind::kRelu));
  HEADROOM_ASSIGN_OR_RETURN(const bool norm_before, OptionalBool(doc, "do_layer_norm_before", path, true));
  HEADROOM_ASSIGN_OR_RETURN(const bool remove_final_norm,
                            OptionalBool(doc, "_remove_final_layer_norm", path, false));
  HEADROOM_ASSIGN_OR_RETURN(const bool affine, OptionalBool(doc, "layer_norm_elementwise_affine", path, true));
  if (!affine) {
    // No released OPT checkpoint drops the LayerNorms' weights; Headroom's LayerNorm always has one.
    return (path / "layer_norm_elementwise_affine").Error("false (LayerNorms without weights) is not supported");
  }
  HEADROOM_ASSIGN_OR_RETURN(c.qkv_bias, OptionalBool(doc, "enable_bias", path, true));
  c.attn_output_bias = c.mlp_bias = c.qkv_bias;
  HEADROOM_ASSIGN_OR_RETURN(c.hidden_dropout, Probability(doc, "dropout", path, 0.1));
  HEADROOM_ASSIGN_OR_RETURN(c.attention_dropout, Probability(doc, "attention_dropout", path, 0.0));
  HEADROOM_ASSIGN_OR_RETURN(c.tie_word_embeddings, OptionalBool(doc, "tie_word_embeddings", path, true));
  c.norm_placement = norm_before ? NormPlacement::kPre : NormPlacement::kPostResidual;
  c.final_norm = norm_before && !remove_final_norm;
  c.norm = NormKind::kLayerNorm;
  c.positions = PositionKind::kLearned;
  c.position_offset = 2;
  return absl::OkStatus();
}

ConfigFieldNames OptFieldNames(const ModelConfig&) {
  return {.kv_heads = "num_attention_heads", .intermediate = "ffn_dim"};
}

constexpr ArchitectureClass kClasses[] = {{"OPTForCausalLM"}};

builders_internal::DecoderNames ModuleNames(const ModelConfig&) {
  return {.root = "model.decoder.", .norm1 = "self_attn_layer_norm", .norm2 = "final_layer_norm",
          .final_norm = "final_layer_norm"};
}

}  // namespace

extern constexpr ModelFamilyEntry kOptFamily{
    .model_type = "opt",
    .classes = kClasses,
    .kind = ModelFamily::kDecoder,
    .parse = CheckedTransformer<ParseOpt>,
    .build = [](Builder& b) { return b.BuildDecoder(); },
    .field_names = OptFieldNames,
    .decoder_names = ModuleNames,
};

}  // namespace headroom::models_internal

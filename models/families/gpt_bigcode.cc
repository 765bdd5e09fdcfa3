// BigCode's StarCoder and SantaCoder (GPTBigCodeForCausalLM; Note [GPTBigCode] in builders/attention.cc). Built by
// BuildDecoder (builders/decoder.cc).
#include <string>
#include <vector>

#include "common/status_macros.h"
#include "models/builder.h"
#include "models/config_parsing.h"
#include "models/model_registry.h"

namespace headroom::models_internal {
namespace {

using builders_internal::Builder;

// GPTBigCodeForCausalLM (transformers 4.46's modeling_gpt_bigcode.py, Note [GPTBigCode] in builders/attention.cc),
// StarCoder and SantaCoder: GPT-2's blocks and size names on nn.Linear, one fused c_attn whose keys and values are one
// head (multi_query) or one per head, learned positions, a softmax in f32 (attention_softmax_in_fp32), the tied
// lm_head.
absl::Status ParseGptBigCode(const json& doc, const JsonPath& path, ModelConfig& c) {
  HEADROOM_RETURN_IF_ERROR(ParseCoreDims(doc, path, {.hidden = "n_embd", .layers = "n_layer", .heads = "n_head"}, c));
  HEADROOM_ASSIGN_OR_RETURN(const bool multi_query, OptionalBool(doc, "multi_query", path, true));
  c.num_kv_heads = multi_query ? 1 : c.num_heads;
  HEADROOM_ASSIGN_OR_RETURN(c.intermediate_size, OptionalPositiveInt(doc, "n_inner", path, 4 * c.hidden_size));
  HEADROOM_ASSIGN_OR_RETURN(c.max_position_embeddings, PositiveInt(doc, "n_positions", path));
  HEADROOM_ASSIGN_OR_RETURN(c.norm_eps, OptionalNumber(doc, "layer_norm_epsilon", path, 1e-5));
  HEADROOM_ASSIGN_OR_RETURN(c.activation,
                            ParseActivation(doc, "activation_function", path, ActivationKind::kGeluTanh));
  HEADROOM_ASSIGN_OR_RETURN(c.attention_softmax_f32, OptionalBool(doc, "attention_softmax_in_fp32", path, true));
  HEADROOM_ASSIGN_OR_RETURN(c.hidden_dropout, Probability(doc, "resid_pdrop", path, 0.1));
  HEADROOM_ASSIGN_OR_RETURN(c.embedding_dropout, Probability(doc, "embd_pdrop", path, 0.1));
  HEADROOM_ASSIGN_OR_RETURN(c.attention_dropout, Probability(doc, "attn_pdrop", path, 0.1));
  HEADROOM_ASSIGN_OR_RETURN(c.tie_word_embeddings, OptionalBool(doc, "tie_word_embeddings", path, true));
  c.norm = NormKind::kLayerNorm;
  c.positions = PositionKind::kLearned;
  c.qkv_bias = c.attn_output_bias = c.mlp_bias = true;
  return absl::OkStatus();
}

ConfigFieldNames GptBigCodeFieldNames(const ModelConfig& c) {
  ConfigFieldNames names = kGpt2FieldNames;
  if (c.num_kv_heads == 1 && c.num_heads > 1) names.kv_heads = "multi_query";
  return names;
}

constexpr ArchitectureClass kClasses[] = {{"GPTBigCodeForCausalLM"}};

std::vector<std::string> LoraTargets(const ModelConfig&, const TransformersVersion&) {
  return {"c_attn"};
}

}  // namespace

extern constexpr ModelFamilyEntry kGptBigCodeFamily{
    .model_type = "gpt_bigcode",
    .classes = kClasses,
    .kind = ModelFamily::kDecoder,
    .parse = CheckedTransformer<ParseGptBigCode>,
    .build = [](Builder& b) { return b.BuildDecoder(); },
    .field_names = GptBigCodeFieldNames,
    .lora_targets = LoraTargets,
    .decoder_names = Gpt2DecoderNames,
};

}  // namespace headroom::models_internal

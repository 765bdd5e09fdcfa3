// OpenAI's GPT-2 (GPT2LMHeadModel, and GPT2Model without its head; transformers' modeling_gpt2.py), whose size names
// (n_embd, n_layer, n_head, n_inner, n_positions) GPT-J and GPTBigCode keep. Built by BuildDecoder
// (builders/decoder.cc).
#include <string>
#include <vector>

#include "common/status_macros.h"
#include "models/builder.h"
#include "models/config_parsing.h"
#include "models/model_registry.h"

namespace headroom::models_internal {
namespace {

using builders_internal::Builder;

absl::Status ParseGpt2(const json& doc, const JsonPath& path, ModelConfig& c) {
  HEADROOM_ASSIGN_OR_RETURN(c.vocab_size, PositiveInt(doc, "vocab_size", path));
  HEADROOM_ASSIGN_OR_RETURN(c.hidden_size, PositiveInt(doc, "n_embd", path));
  HEADROOM_ASSIGN_OR_RETURN(c.num_layers, BoundedCount(doc, "n_layer", path, kMaxLayers));
  HEADROOM_ASSIGN_OR_RETURN(c.num_heads, PositiveInt(doc, "n_head", path));
  c.num_kv_heads = c.num_heads;
  HEADROOM_ASSIGN_OR_RETURN(c.intermediate_size,
                            OptionalPositiveInt(doc, "n_inner", path, 4 * c.hidden_size));
  HEADROOM_ASSIGN_OR_RETURN(c.max_position_embeddings, PositiveInt(doc, "n_positions", path));
  HEADROOM_ASSIGN_OR_RETURN(c.norm_eps, OptionalNumber(doc, "layer_norm_epsilon", path, 1e-5));
  HEADROOM_ASSIGN_OR_RETURN(
      c.activation, ParseActivation(doc, "activation_function", path, ActivationKind::kGeluNew));
  HEADROOM_ASSIGN_OR_RETURN(c.tie_word_embeddings,
                            OptionalBool(doc, "tie_word_embeddings", path, true));
  HEADROOM_ASSIGN_OR_RETURN(c.hidden_dropout, Probability(doc, "resid_pdrop", path, 0.1));
  HEADROOM_ASSIGN_OR_RETURN(c.embedding_dropout, Probability(doc, "embd_pdrop", path, 0.1));
  HEADROOM_ASSIGN_OR_RETURN(c.attention_dropout, Probability(doc, "attn_pdrop", path, 0.1));
  c.norm = NormKind::kLayerNorm;
  c.positions = PositionKind::kLearned;
  c.qkv_bias = c.attn_output_bias = c.mlp_bias = true;
  return absl::OkStatus();
}

constexpr ArchitectureClass kClasses[] = {{"GPT2LMHeadModel"}, {"GPT2Model"}};

std::vector<std::string> LoraTargets(const ModelConfig&, const TransformersVersion&) {
  return {"c_attn"};
}

}  // namespace

builders_internal::DecoderNames Gpt2DecoderNames(const ModelConfig&) {
  return {.root = "transformer.", .embed = "wte", .layers = "h", .norm1 = "ln_1", .norm2 = "ln_2",
          .final_norm = "ln_f"};
}

extern constexpr ModelFamilyEntry kGpt2Family{
    .model_type = "gpt2",
    .classes = kClasses,
    .kind = ModelFamily::kDecoder,
    .parse = CheckedTransformer<ParseGpt2>,
    .build = [](Builder& b) { return b.BuildDecoder(); },
    .field_names = Gpt2FieldNames,
    .lora_targets = LoraTargets,
    .decoder_names = Gpt2DecoderNames,
};

}  // namespace headroom::models_internal

// EleutherAI's GPT-NeoX and Pythia (GPTNeoXForCausalLM; transformers' modeling_gpt_neox.py): partial rotary,
// attention and MLP in parallel. Built by BuildDecoder (builders/decoder.cc).
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

absl::Status ParseGptNeox(const json& doc, const JsonPath& path, ModelConfig& c) {
  HEADROOM_RETURN_IF_ERROR(ParseStandardDims(doc, path, 2048, c));
  HEADROOM_ASSIGN_OR_RETURN(c.norm_eps, OptionalNumber(doc, "layer_norm_eps", path, 1e-5));
  HEADROOM_ASSIGN_OR_RETURN(c.activation,
                            ParseActivation(doc, "hidden_act", path, ActivationKind::kGelu));
  HEADROOM_ASSIGN_OR_RETURN(c.rotary_pct, OptionalNumber(doc, "rotary_pct", path, 0.25));
  if (!(c.rotary_pct > 0 && c.rotary_pct <= 1)) {
    return (path / "rotary_pct").Error(absl::StrFormat("must be in (0, 1], got %g", c.rotary_pct));
  }
  HEADROOM_ASSIGN_OR_RETURN(c.parallel_residual,
                            OptionalBool(doc, "use_parallel_residual", path, true));
  HEADROOM_ASSIGN_OR_RETURN(c.tie_word_embeddings,
                            OptionalBool(doc, "tie_word_embeddings", path, false));
  HEADROOM_ASSIGN_OR_RETURN(c.attention_dropout,
                            Probability(doc, "attention_dropout", path, 0.0));
  HEADROOM_ASSIGN_OR_RETURN(c.hidden_dropout, Probability(doc, "hidden_dropout", path, 0.0));
  HEADROOM_RETURN_IF_ERROR(ParseAttentionBias(doc, path, true, c));
  c.mlp_bias = true;
  c.norm = NormKind::kLayerNorm;
  c.positions = PositionKind::kRotary;
  return absl::OkStatus();
}

constexpr ArchitectureClass kClasses[] = {{"GPTNeoXForCausalLM"}};

std::vector<std::string> LoraTargets(const ModelConfig&, const TransformersVersion&) {
  return {"query_key_value"};
}

builders_internal::DecoderNames ModuleNames(const ModelConfig&) {
  return {.root = "gpt_neox.", .embed = "embed_in", .final_norm = "final_layer_norm", .head = "embed_out"};
}

}  // namespace

extern constexpr ModelFamilyEntry kGptNeoxFamily{
    .model_type = "gpt_neox",
    .classes = kClasses,
    .kind = ModelFamily::kDecoder,
    .parse = CheckedTransformer<ParseGptNeox>,
    .build = [](Builder& b) { return b.BuildDecoder(); },
    .field_names = UngroupedHeadNames,
    .lora_targets = LoraTargets,
    .decoder_names = ModuleNames,
};

}  // namespace headroom::models_internal

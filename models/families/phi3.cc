// Microsoft's Phi-3 and Phi-4-mini (Phi3ForCausalLM; transformers' modeling_phi3.py): Llama's block with fused
// projections. Built by BuildDecoder (builders/decoder.cc).
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

// Phi3Attention and Phi3MLP: fused projections without biases, residual dropout, partial rotary
// (Phi-4-mini). Its sliding_window applies to flash attention only and is not modelled.
absl::Status ParsePhi3(const json& doc, const JsonPath& path, ModelConfig& c) {
  HEADROOM_RETURN_IF_ERROR(ParseLlamaDecoder(doc, path, c));
  c.fused_qkv = c.fused_gate_up = true;
  HEADROOM_ASSIGN_OR_RETURN(c.hidden_dropout, Probability(doc, "resid_pdrop", path, 0.0));
  HEADROOM_ASSIGN_OR_RETURN(c.rotary_pct, OptionalNumber(doc, "partial_rotary_factor", path, 1.0));
  if (!(c.rotary_pct > 0 && c.rotary_pct <= 1)) {
    return (path / "partial_rotary_factor").Error(absl::StrFormat("must be in (0, 1], got %g", c.rotary_pct));
  }
  return absl::OkStatus();
}

constexpr ArchitectureClass kClasses[] = {{"Phi3ForCausalLM"}};

std::vector<std::string> LoraTargets(const ModelConfig&, const TransformersVersion&) {
  return {"qkv_proj"};
}

}  // namespace

extern constexpr ModelFamilyEntry kPhi3Family{
    .model_type = "phi3",
    .classes = kClasses,
    .kind = ModelFamily::kDecoder,
    .parse = CheckedTransformer<ParsePhi3>,
    .build = [](Builder& b) { return b.BuildDecoder(); },
    .llama_like = true,
    .lora_targets = LoraTargets,
};

}  // namespace headroom::models_internal

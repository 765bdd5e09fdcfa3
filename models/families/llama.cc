// Llama (LlamaForCausalLM, model_type "llama"; transformers' modeling_llama.py), the decoder the families of
// ParseLlamaDecoder (config_parsing.h) descend from. Built by BuildDecoder (builders/decoder.cc).
#include "common/status_macros.h"
#include "models/builder.h"
#include "models/config_parsing.h"
#include "models/model_registry.h"

namespace headroom::models_internal {
namespace {

using builders_internal::Builder;

// LlamaForCausalLM: attention_bias on q/k/v/o, mlp_bias on the MLP's three projections.
absl::Status ParseLlama(const json& doc, const JsonPath& path, ModelConfig& c) {
  HEADROOM_RETURN_IF_ERROR(ParseLlamaDecoder(doc, path, c));
  HEADROOM_RETURN_IF_ERROR(ParseAttentionBias(doc, path, false, c));
  HEADROOM_ASSIGN_OR_RETURN(c.mlp_bias, OptionalBool(doc, "mlp_bias", path, false));
  return absl::OkStatus();
}

constexpr ArchitectureClass kClasses[] = {{"LlamaForCausalLM"}};

}  // namespace

extern constexpr ModelFamilyEntry kLlamaFamily{
    .model_type = "llama",
    .classes = kClasses,
    .kind = ModelFamily::kDecoder,
    .parse = CheckedTransformer<ParseLlama>,
    .build = [](Builder& b) { return b.BuildDecoder(); },
    .llama_like = true,
};

}  // namespace headroom::models_internal

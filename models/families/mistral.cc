// Mistral AI's decoders on Llama's block (transformers' modeling_mistral.py and modeling_mixtral.py): Mistral
// (MistralForCausalLM, its sliding window) and Mixtral (MixtralForCausalLM, experts in every layer; Note [MoE
// routing] in builders.h). Built by BuildDecoder (builders/decoder.cc).
#include "common/status_macros.h"
#include "models/builder.h"
#include "models/config_parsing.h"
#include "models/model_registry.h"

namespace headroom::models_internal {
namespace {

using builders_internal::Builder;

absl::Status ParseMistral(const json& doc, const JsonPath& path, ModelConfig& c) {
  HEADROOM_RETURN_IF_ERROR(ParseLlamaDecoder(doc, path, c));
  // Mistral v0.1 attends within 4096 tokens in every layer (Note [Sliding-window KV cache]); v0.2 and later
  // write null.
  HEADROOM_ASSIGN_OR_RETURN(c.sliding_window, OptionalPositiveInt(doc, "sliding_window", path, 0));
  return absl::OkStatus();
}

absl::Status ParseMixtral(const json& doc, const JsonPath& path, ModelConfig& c) {
  HEADROOM_RETURN_IF_ERROR(ParseLlamaDecoder(doc, path, c));
  HEADROOM_ASSIGN_OR_RETURN(c.num_experts, BoundedCount(doc, "num_local_experts", path, kMaxExperts));
  HEADROOM_ASSIGN_OR_RETURN(c.experts_per_token, PositiveInt(doc, "num_experts_per_tok", path));
  return absl::OkStatus();
}

constexpr ArchitectureClass kMistralClasses[] = {{"MistralForCausalLM"}};
constexpr ArchitectureClass kMixtralClasses[] = {{"MixtralForCausalLM"}};

}  // namespace

extern constexpr ModelFamilyEntry kMistralFamily{
    .model_type = "mistral",
    .classes = kMistralClasses,
    .kind = ModelFamily::kDecoder,
    .parse = CheckedTransformer<ParseMistral>,
    .build = [](Builder& b) { return b.BuildDecoder(); },
    .llama_like = true,
};

extern constexpr ModelFamilyEntry kMixtralFamily{
    .model_type = "mixtral",
    .classes = kMixtralClasses,
    .kind = ModelFamily::kDecoder,
    .parse = CheckedTransformer<ParseMixtral>,
    .build = [](Builder& b) { return b.BuildDecoder(); },
    .llama_like = true,
};

}  // namespace headroom::models_internal

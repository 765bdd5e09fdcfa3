// AI2's OLMo 2 (Olmo2ForCausalLM; transformers' modeling_olmo2.py, Note [OLMo 2] in builders/decoder.cc): Llama's
// block with its norms on each branch's output. Built by BuildDecoder (builders/decoder.cc).
#include "common/status_macros.h"
#include "models/builder.h"
#include "models/config_parsing.h"
#include "models/model_registry.h"

namespace headroom::models_internal {
namespace {

using builders_internal::Builder;

// Olmo2Attention: attention_bias on q/k/v/o, q_norm and k_norm over the whole q and k projections;
// Olmo2DecoderLayer norms each branch's output instead of its input (Note [OLMo 2] in builders/decoder.cc).
absl::Status ParseOlmo2(const json& doc, const JsonPath& path, ModelConfig& c) {
  HEADROOM_RETURN_IF_ERROR(ParseLlamaDecoder(doc, path, c));
  HEADROOM_RETURN_IF_ERROR(ParseAttentionBias(doc, path, false, c));
  c.qk_norm_full = true;
  c.norm_placement = NormPlacement::kBranchOutput;
  return absl::OkStatus();
}

constexpr ArchitectureClass kClasses[] = {{"Olmo2ForCausalLM"}};

}  // namespace

extern constexpr ModelFamilyEntry kOlmo2Family{
    .model_type = "olmo2",
    .classes = kClasses,
    .kind = ModelFamily::kDecoder,
    .parse = CheckedTransformer<ParseOlmo2>,
    .build = [](Builder& b) { return b.BuildDecoder(); },
    .llama_like = true,
};

}  // namespace headroom::models_internal

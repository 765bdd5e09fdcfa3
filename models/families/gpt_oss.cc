// OpenAI's GPT-OSS (GptOssForCausalLM; Note [GPT-OSS] in builders/decoder.cc). Built by BuildDecoder
// (builders/decoder.cc).
#include "common/status_macros.h"
#include "models/builder.h"
#include "models/config_parsing.h"
#include "models/model_registry.h"

namespace headroom::models_internal {
namespace {

using builders_internal::Builder;

// GptOssForCausalLM (transformers' modeling_gpt_oss.py, Note [GPT-OSS] in builders/decoder.cc): Llama's block with
// biased q/k/v/o, a learned sink logit per head, sliding-window layers (layer_types; every even layer when it is
// absent) of sliding_window tokens, and in every layer num_local_experts experts of intermediate_size behind a
// biased top-k router, stored fused with biases. GptOssConfig's defaults are gpt-oss-120b's sizes; the parser
// requires the sizes that tell the two releases apart.
absl::Status ParseGptOss(const json& doc, const JsonPath& path, ModelConfig& c) {
  HEADROOM_RETURN_IF_ERROR(ParseStandardDims(doc, path, 131072, c));
  HEADROOM_ASSIGN_OR_RETURN(c.num_kv_heads, OptionalPositiveInt(doc, "num_key_value_heads", path, c.num_heads));
  HEADROOM_ASSIGN_OR_RETURN(c.head_dim, OptionalPositiveInt(doc, "head_dim", path, 64));
  HEADROOM_ASSIGN_OR_RETURN(c.norm_eps, OptionalNumber(doc, "rms_norm_eps", path, 1e-5));
  HEADROOM_ASSIGN_OR_RETURN(c.tie_word_embeddings, OptionalBool(doc, "tie_word_embeddings", path, false));
  HEADROOM_ASSIGN_OR_RETURN(c.attention_dropout, Probability(doc, "attention_dropout", path, 0.0));
  HEADROOM_RETURN_IF_ERROR(ParseAttentionBias(doc, path, true, c));
  HEADROOM_ASSIGN_OR_RETURN(c.num_experts, BoundedCount(doc, "num_local_experts", path, kMaxExperts));
  HEADROOM_ASSIGN_OR_RETURN(c.experts_per_token, OptionalPositiveInt(doc, "num_experts_per_tok", path, 4));
  // null: no layer slides (GptOssAttention's sliding_window is then None); absent: the class default, 128.
  HEADROOM_ASSIGN_OR_RETURN(c.sliding_window,
                            OptionalPositiveInt(doc, "sliding_window", path, doc.contains("sliding_window") ? 0 : 128));
  UseLlamaBlock(c);
  c.mlp_bias = true;  // the experts' gate_up_proj_bias and down_proj_bias
  c.activation = ActivationKind::kSilu;  // the clamped SwiGLU of Note [GPT-OSS], written out by the builder
  c.attention_sinks = true;
  if (Present(doc, "layer_types")) {
    return ParseLayerTypeList(doc, path, {"sliding_attention", "full_attention"}, "sliding_attention", c);
  }
  c.global_layer_every = 2;  // GptOssConfig: layer i slides when (i + 1) % 2 != 0
  return absl::OkStatus();
}

constexpr ArchitectureClass kClasses[] = {{"GptOssForCausalLM"}};

}  // namespace

extern constexpr ModelFamilyEntry kGptOssFamily{
    .model_type = "gpt_oss",
    .classes = kClasses,
    .kind = ModelFamily::kDecoder,
    .parse = CheckedTransformer<ParseGptOss>,
    .build = [](Builder& b) { return b.BuildDecoder(); },
};

}  // namespace headroom::models_internal

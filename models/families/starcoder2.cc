// BigCode's StarCoder2 (Starcoder2ForCausalLM; transformers' modeling_starcoder2.py). Built by BuildDecoder
// (builders/decoder.cc).
#include "common/status_macros.h"
#include "models/builder.h"
#include "models/config_parsing.h"
#include "models/model_registry.h"

namespace headroom::models_internal {
namespace {

using builders_internal::Builder;

// Starcoder2ForCausalLM: Mistral's attention (GQA, rotary, a sliding window in every layer) with
// GPT-style blocks: LayerNorm with bias, a c_fc/c_proj GELU MLP, use_bias on every Linear, and dropout on
// the embeddings, on the attention probabilities and after each branch (residual_dropout).
absl::Status ParseStarcoder2(const json& doc, const JsonPath& path, ModelConfig& c) {
  HEADROOM_RETURN_IF_ERROR(ParseStandardDims(doc, path, 4096, c));
  // Starcoder2Config's defaults are starcoder2-3b's, two key/value heads among them.
  HEADROOM_ASSIGN_OR_RETURN(c.num_kv_heads, OptionalPositiveInt(doc, "num_key_value_heads", path, 2));
  HEADROOM_ASSIGN_OR_RETURN(c.norm_eps, OptionalNumber(doc, "norm_epsilon", path, 1e-5));
  HEADROOM_ASSIGN_OR_RETURN(c.activation,
                            ParseActivation(doc, "hidden_act", path, ActivationKind::kGeluTanh));
  HEADROOM_ASSIGN_OR_RETURN(c.tie_word_embeddings, OptionalBool(doc, "tie_word_embeddings", path, true));
  HEADROOM_ASSIGN_OR_RETURN(c.qkv_bias, OptionalBool(doc, "use_bias", path, true));
  c.attn_output_bias = c.mlp_bias = c.qkv_bias;
  HEADROOM_ASSIGN_OR_RETURN(c.attention_dropout, Probability(doc, "attention_dropout", path, 0.0));
  HEADROOM_ASSIGN_OR_RETURN(c.hidden_dropout, Probability(doc, "residual_dropout", path, 0.0));
  HEADROOM_ASSIGN_OR_RETURN(c.embedding_dropout, Probability(doc, "embedding_dropout", path, 0.0));
  // null (the class default) or absent: every layer attends to the whole context.
  HEADROOM_ASSIGN_OR_RETURN(c.sliding_window, OptionalPositiveInt(doc, "sliding_window", path, 0));
  c.norm = NormKind::kLayerNorm;
  c.positions = PositionKind::kRotary;
  return absl::OkStatus();
}

constexpr ArchitectureClass kClasses[] = {{"Starcoder2ForCausalLM"}};

}  // namespace

extern constexpr ModelFamilyEntry kStarcoder2Family{
    .model_type = "starcoder2",
    .classes = kClasses,
    .kind = ModelFamily::kDecoder,
    .parse = CheckedTransformer<ParseStarcoder2>,
    .build = [](Builder& b) { return b.BuildDecoder(); },
    .llama_like = true,
};

}  // namespace headroom::models_internal

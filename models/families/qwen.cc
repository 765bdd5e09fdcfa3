// Alibaba's Qwen decoders on Llama's block (transformers' modeling_qwen2.py, modeling_qwen3.py and their MoE
// variants): Qwen2 (Qwen2ForCausalLM), Qwen3 (Qwen3ForCausalLM), Qwen2-MoE (Qwen2MoeForCausalLM, Qwen1.5-MoE's
// class) and Qwen3-MoE (Qwen3MoeForCausalLM). Built by BuildDecoder (builders/decoder.cc).
#include <cstdint>

#include "absl/strings/str_format.h"
#include "common/status_macros.h"
#include "models/builder.h"
#include "models/config_parsing.h"
#include "models/model_registry.h"

namespace headroom::models_internal {
namespace {

using builders_internal::Builder;

// Qwen2MoeSparseMoeBlock: num_experts routed experts of moe_intermediate_size, top-k of them per token, and
// a shared expert behind a sigmoid gate (Qwen3MoeSparseMoeBlock has none); layers listed in mlp_only_layers,
// or not a multiple of decoder_sparse_step, keep a dense MLP of intermediate_size.
absl::Status ParseQwenMoe(const json& doc, const JsonPath& path, ModelConfig& c) {
  HEADROOM_ASSIGN_OR_RETURN(c.num_experts, BoundedCount(doc, "num_experts", path, kMaxExperts));
  HEADROOM_ASSIGN_OR_RETURN(c.experts_per_token, PositiveInt(doc, "num_experts_per_tok", path));
  HEADROOM_ASSIGN_OR_RETURN(c.moe_intermediate_size, PositiveInt(doc, "moe_intermediate_size", path));
  HEADROOM_ASSIGN_OR_RETURN(c.shared_expert_intermediate_size,
                            OptionalInt(doc, "shared_expert_intermediate_size", path, 0));
  if (c.shared_expert_intermediate_size < 0 || c.shared_expert_intermediate_size > kMaxSize) {
    return (path / "shared_expert_intermediate_size").Error("must be between 0 and 2^31");
  }
  HEADROOM_ASSIGN_OR_RETURN(c.moe_every, OptionalInt(doc, "decoder_sparse_step", path, 1));
  if (c.moe_every < 1 || c.moe_every > kMaxLayers) {
    return (path / "decoder_sparse_step").Error(absl::StrFormat("must be between 1 and %d", kMaxLayers));
  }
  if (Present(doc, "mlp_only_layers")) {
    const json& layers = doc["mlp_only_layers"];
    if (!layers.is_array()) return (path / "mlp_only_layers").Error("expected an array of layer indices");
    for (size_t i = 0; i < layers.size(); ++i) {
      HEADROOM_ASSIGN_OR_RETURN(const int64_t layer, AsInt(layers[i], path / "mlp_only_layers" / i));
      c.dense_layers.push_back(layer);
    }
  }
  return absl::OkStatus();
}

// Qwen2Attention: q/k/v with bias, o_proj without.
absl::Status ParseQwen2(const json& doc, const JsonPath& path, ModelConfig& c) {
  HEADROOM_RETURN_IF_ERROR(ParseLlamaDecoder(doc, path, c));
  c.qkv_bias = true;
  return absl::OkStatus();
}

// Qwen3Attention: q_norm and k_norm over head_dim; attention_bias on q/k/v/o, off in the releases.
absl::Status ParseQwen3(const json& doc, const JsonPath& path, ModelConfig& c) {
  HEADROOM_RETURN_IF_ERROR(ParseLlamaDecoder(doc, path, c));
  HEADROOM_RETURN_IF_ERROR(ParseAttentionBias(doc, path, false, c));
  c.qk_norm = true;
  return absl::OkStatus();
}

// Qwen2-MoE: Qwen2's attention, Qwen2MoeSparseMoeBlock's experts.
absl::Status ParseQwen2Moe(const json& doc, const JsonPath& path, ModelConfig& c) {
  HEADROOM_RETURN_IF_ERROR(ParseQwen2(doc, path, c));
  return ParseQwenMoe(doc, path, c);
}

// Qwen3-MoE: Qwen3's attention, Qwen3MoeSparseMoeBlock's experts.
absl::Status ParseQwen3Moe(const json& doc, const JsonPath& path, ModelConfig& c) {
  HEADROOM_RETURN_IF_ERROR(ParseQwen3(doc, path, c));
  return ParseQwenMoe(doc, path, c);
}

constexpr ArchitectureClass kQwen2Classes[] = {{"Qwen2ForCausalLM"}};
constexpr ArchitectureClass kQwen3Classes[] = {{"Qwen3ForCausalLM"}};
constexpr ArchitectureClass kQwen2MoeClasses[] = {{"Qwen2MoeForCausalLM"}};
constexpr ArchitectureClass kQwen3MoeClasses[] = {{"Qwen3MoeForCausalLM"}};

}  // namespace

extern constexpr ModelFamilyEntry kQwen2Family{
    .model_type = "qwen2",
    .classes = kQwen2Classes,
    .kind = ModelFamily::kDecoder,
    .parse = CheckedTransformer<ParseQwen2>,
    .build = [](Builder& b) { return b.BuildDecoder(); },
    .llama_like = true,
};

extern constexpr ModelFamilyEntry kQwen3Family{
    .model_type = "qwen3",
    .classes = kQwen3Classes,
    .kind = ModelFamily::kDecoder,
    .parse = CheckedTransformer<ParseQwen3>,
    .build = [](Builder& b) { return b.BuildDecoder(); },
    .llama_like = true,
};

extern constexpr ModelFamilyEntry kQwen2MoeFamily{
    .model_type = "qwen2_moe",
    .classes = kQwen2MoeClasses,
    .kind = ModelFamily::kDecoder,
    .parse = CheckedTransformer<ParseQwen2Moe>,
    .build = [](Builder& b) { return b.BuildDecoder(); },
    .llama_like = true,
};

extern constexpr ModelFamilyEntry kQwen3MoeFamily{
    .model_type = "qwen3_moe",
    .classes = kQwen3MoeClasses,
    .kind = ModelFamily::kDecoder,
    .parse = CheckedTransformer<ParseQwen3Moe>,
    .build = [](Builder& b) { return b.BuildDecoder(); },
    .llama_like = true,
};

}  // namespace headroom::models_internal

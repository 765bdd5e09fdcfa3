// DeepSeek-V2 and V3 (DeepseekV2ForCausalLM, DeepseekV3ForCausalLM): latent attention (Note [Multi-head latent
// attention] in builders/attention.cc) and shared experts. Built by BuildDecoder (builders/decoder.cc).
#include <cstdint>
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

// DeepSeek-V2 and V3 (DeepseekV2ForCausalLM, DeepseekV3ForCausalLM; Note [Multi-head latent attention] in
// builders.cc): RMSNorm, SwiGLU, rotary, latent attention, and from layer first_k_dense_replace on (every
// moe_layer_freq-th layer) n_routed_experts experts of moe_intermediate_size with n_shared_experts always-on
// experts fused into one MLP. V3's noaux_tc routing adds a per-expert score bias to the gate.
absl::Status ParseDeepseek(const json& doc, const JsonPath& path, ModelConfig& c) {
  HEADROOM_RETURN_IF_ERROR(ParseStandardDims(doc, path, 4096, c));
  HEADROOM_ASSIGN_OR_RETURN(c.num_kv_heads, OptionalPositiveInt(doc, "num_key_value_heads", path, c.num_heads));
  HEADROOM_ASSIGN_OR_RETURN(c.norm_eps, OptionalNumber(doc, "rms_norm_eps", path, 1e-6));
  HEADROOM_ASSIGN_OR_RETURN(c.activation, ParseActivation(doc, "hidden_act", path, ActivationKind::kSilu));
  HEADROOM_ASSIGN_OR_RETURN(c.tie_word_embeddings, OptionalBool(doc, "tie_word_embeddings", path, false));
  HEADROOM_ASSIGN_OR_RETURN(c.attention_dropout, Probability(doc, "attention_dropout", path, 0.0));
  HEADROOM_RETURN_IF_ERROR(ParseAttentionBias(doc, path, false, c));
  UseLlamaBlock(c);
  HEADROOM_ASSIGN_OR_RETURN(c.q_lora_rank, OptionalPositiveInt(doc, "q_lora_rank", path, 0));
  HEADROOM_ASSIGN_OR_RETURN(c.kv_lora_rank, PositiveInt(doc, "kv_lora_rank", path));
  HEADROOM_ASSIGN_OR_RETURN(c.qk_nope_head_dim, PositiveInt(doc, "qk_nope_head_dim", path));
  HEADROOM_ASSIGN_OR_RETURN(c.qk_rope_head_dim, PositiveInt(doc, "qk_rope_head_dim", path));
  HEADROOM_ASSIGN_OR_RETURN(c.v_head_dim, PositiveInt(doc, "v_head_dim", path));
  if (c.num_kv_heads != c.num_heads) {
    return (path / "num_key_value_heads")
        .Error(absl::StrFormat("%d: latent attention expands k and v to every head (%d)", c.num_kv_heads,
                               c.num_heads));
  }
  c.head_dim = c.qk_nope_head_dim + c.qk_rope_head_dim;  // q's and k's; v's is v_head_dim
  if (!Present(doc, "n_routed_experts")) return absl::OkStatus();  // a dense model
  HEADROOM_ASSIGN_OR_RETURN(c.num_experts, BoundedCount(doc, "n_routed_experts", path, kMaxExperts));
  HEADROOM_ASSIGN_OR_RETURN(c.experts_per_token, PositiveInt(doc, "num_experts_per_tok", path));
  HEADROOM_ASSIGN_OR_RETURN(c.moe_intermediate_size, PositiveInt(doc, "moe_intermediate_size", path));
  HEADROOM_ASSIGN_OR_RETURN(const int64_t shared, OptionalInt(doc, "n_shared_experts", path, 0));
  if (shared < 0 || shared > kMaxExperts) {
    return (path / "n_shared_experts").Error(absl::StrFormat("must be between 0 and %d, got %d", kMaxExperts, shared));
  }
  c.shared_expert_intermediate_size = shared * c.moe_intermediate_size;
  c.shared_expert_gated = false;
  HEADROOM_ASSIGN_OR_RETURN(const int64_t first_dense, OptionalInt(doc, "first_k_dense_replace", path, 0));
  if (first_dense < 0 || first_dense > c.num_layers) {
    return (path / "first_k_dense_replace")
        .Error(absl::StrFormat("must be between 0 and num_hidden_layers (%d), got %d", c.num_layers, first_dense));
  }
  HEADROOM_ASSIGN_OR_RETURN(const int64_t every, OptionalPositiveInt(doc, "moe_layer_freq", path, 1));
  for (int64_t i = 0; i < c.num_layers; ++i) {
    if (i < first_dense || i % every != 0) c.dense_layers.push_back(i);
  }
  std::string topk_method = "greedy";
  if (Present(doc, "topk_method")) {
    HEADROOM_ASSIGN_OR_RETURN(topk_method, RequireString(doc, "topk_method", path));
  }
  c.router_bias = topk_method == "noaux_tc";
  return absl::OkStatus();
}

constexpr ArchitectureClass kDeepseekV2Classes[] = {{"DeepseekV2ForCausalLM"}};
constexpr ArchitectureClass kDeepseekV3Classes[] = {{"DeepseekV3ForCausalLM"}};

std::vector<std::string> LoraTargets(const ModelConfig& c, const TransformersVersion&) {
  // Multi-head latent attention (Note [Multi-head latent attention]) has no v_proj: the values come out of
  // kv_b_proj, and the queries out of q_b_proj when they pass a low-rank bottleneck.
  if (c.is_mla()) return {c.q_lora_rank > 0 ? "q_b_proj" : "q_proj", "kv_b_proj"};
  return {"q_proj", "v_proj"};
}

}  // namespace

extern constexpr ModelFamilyEntry kDeepseekV2Family{
    .model_type = "deepseek_v2",
    .classes = kDeepseekV2Classes,
    .kind = ModelFamily::kDecoder,
    .parse = CheckedTransformer<ParseDeepseek>,
    .build = [](Builder& b) { return b.BuildDecoder(); },
    .field_names = UngroupedHeadNames,
    .lora_targets = LoraTargets,
};

extern constexpr ModelFamilyEntry kDeepseekV3Family{
    .model_type = "deepseek_v3",
    .classes = kDeepseekV3Classes,
    .kind = ModelFamily::kDecoder,
    .parse = CheckedTransformer<ParseDeepseek>,
    .build = [](Builder& b) { return b.BuildDecoder(); },
    .field_names = UngroupedHeadNames,
    .lora_targets = LoraTargets,
};

}  // namespace headroom::models_internal

// The decoder families beyond Llama: Qwen3, Gemma and Gemma 2 (Note [Gemma
// decoders] in models/builders.cc), from their real config.json presets.
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "models/builders.h"
#include "models/model_config.h"
#include "models/model_source.h"

namespace headroom {
namespace {

using ::testing::HasSubstr;

ModelConfig Preset(std::string_view name) {
  absl::StatusOr<ModelConfig> c = LoadPresetConfig(name);
  EXPECT_TRUE(c.ok()) << c.status();
  return c.ok() ? *c : ModelConfig{};
}

Graph Build(const ModelConfig& c, BuildOptions o = {.batch = 1, .seq_len = 8}) {
  absl::StatusOr<Graph> g = BuildModelGraph(c, o);
  EXPECT_TRUE(g.ok()) << g.status();
  return g.ok() ? *std::move(g) : Graph{};
}

int CountOps(const Graph& g, std::string_view prefix, std::string_view kind) {
  int n = 0;
  for (const Op& op : g.ops()) n += op.name.starts_with(prefix) && op.kind == kind ? 1 : 0;
  return n;
}

// The expected counts come from the reference implementation, not from Headroom:
//  - gemma-7b and gemma-2-9b: transformers 4.46.3's GemmaForCausalLM and Gemma2ForCausalLM built from these
//    config files under accelerate's init_empty_weights, summing p.numel() over the parameters with the tied
//    lm_head counted once (8.54 B and 9.24 B on the model cards);
//  - phi-3-mini-4k (Phi-3-mini-4k-instruct): transformers 4.46.3's Phi3ForCausalLM the same way (3.8 B);
//  - qwen1.5-moe-a2.7b (Qwen/Qwen1.5-MoE-A2.7B): transformers 4.46.3's Qwen2MoeForCausalLM (14.3 B in all);
//  - qwen3-8b: transformers 4.46 has no Qwen3, so the sum of the shapes its Qwen3 modules declare
//    (q/k/v/o projections, q_norm and k_norm over head_dim 128, SwiGLU MLP, two norms per layer, the final
//    norm, untied 151936 x 4096 embeddings and lm_head); the model card gives 8.2 B;
//  - qwen3-30b-a3b: likewise from Qwen3-MoE's module shapes (48 layers of 128 experts of 768, q/k norms, no
//    shared expert); the model card gives 30.5 B.
//  - deepseek-v3 and deepseek-v2-lite: the sum of the shapes DeepSeek's modeling_deepseek.py declares (latent
//    attention's q_a/q_b or q_proj, kv_a_proj_with_mqa, kv_b_proj, o_proj and two norms; dense MLPs in the first
//    first_k_dense_replace layers, then the gate, V3's e_score_correction_bias, the routed experts and the
//    fused shared experts; untied head): 671.0 B and 15.7 B, the totals on the model cards (V3's 685 B there
//    adds its multi-token-prediction module, which the modeling code does not build).
TEST(DecoderFamilies, ParameterCountsMatchTheRealModels) {
  EXPECT_EQ(Build(Preset("gemma-7b")).ParameterCount(), 8'537'680'896u);
  EXPECT_EQ(Build(Preset("gemma-2-9b")).ParameterCount(), 9'241'705'984u);
  EXPECT_EQ(Build(Preset("qwen3-8b")).ParameterCount(), 8'190'735'360u);
  EXPECT_EQ(Build(Preset("phi-3-mini-4k")).ParameterCount(), 3'821'079'552u);
  EXPECT_EQ(Build(Preset("qwen1.5-moe-a2.7b")).ParameterCount(), 14'315'784'192u);
  EXPECT_EQ(Build(Preset("qwen3-30b-a3b")).ParameterCount(), 30'532'122'624u);
  EXPECT_EQ(Build(Preset("deepseek-v3")).ParameterCount(), 671'026'419'200u);
  EXPECT_EQ(Build(Preset("deepseek-v2-lite")).ParameterCount(), 15'706'484'224u);
}

std::set<std::string> TensorNames(const Graph& g) {
  std::set<std::string> names;
  for (const Tensor& t : g.tensors()) names.insert(t.name);
  return names;
}

// Note [Multi-head latent attention]: V3 has the q bottleneck and score-biased routing, V2-Lite a full q_proj;
// both keep dense MLPs in their first layers and fuse their shared experts into one MLP.
TEST(DecoderFamilies, DeepseekAttendsThroughALatentAndSharesExperts) {
  ModelConfig v3 = Preset("deepseek-v3");
  EXPECT_TRUE(v3.is_mla());
  EXPECT_EQ(v3.head_dim, 192);
  EXPECT_FALSE(v3.is_moe_layer(2));
  EXPECT_TRUE(v3.is_moe_layer(3));
  v3.num_layers = 4;
  const std::set<std::string> names = TensorNames(Build(v3, {.batch = 1, .seq_len = 16}));
  for (const char* name : {"model.layers.0.self_attn.q_a_proj.weight", "model.layers.0.self_attn.q_a_layernorm.weight",
                           "model.layers.0.self_attn.q_b_proj.weight",
                           "model.layers.0.self_attn.kv_a_proj_with_mqa.weight",
                           "model.layers.0.self_attn.kv_a_layernorm.weight", "model.layers.0.self_attn.kv_b_proj.weight",
                           "model.layers.2.mlp.gate_proj.weight", "model.layers.3.mlp.gate.weight",
                           "model.layers.3.mlp.gate.e_score_correction_bias", "model.layers.3.mlp.experts.255.up_proj.weight",
                           "model.layers.3.mlp.shared_experts.down_proj.weight"}) {
    EXPECT_TRUE(names.contains(name)) << name;
  }
  EXPECT_FALSE(names.contains("model.layers.3.mlp.shared_expert_gate.weight"));
  EXPECT_FALSE(names.contains("model.layers.2.mlp.experts.0.up_proj.weight"));

  ModelConfig lite = Preset("deepseek-v2-lite");
  EXPECT_EQ(lite.q_lora_rank, 0);
  EXPECT_FALSE(lite.router_bias);
  lite.num_layers = 2;
  const Graph g = Build(lite, {.batch = 2, .seq_len = 32, .attention = AttentionImpl::kEager});
  const std::set<std::string> lite_names = TensorNames(g);
  EXPECT_TRUE(lite_names.contains("model.layers.0.self_attn.q_proj.weight"));
  EXPECT_FALSE(lite_names.contains("model.layers.0.self_attn.q_a_proj.weight"));
  // Queries and keys are assembled at 192 per head from the no-position and rotary parts: [2, 16, 32, 192].
  for (const Op& op : g.ops()) {
    if (op.name == "model.layers.1.self_attn.key_cat") {
      EXPECT_EQ(g.tensor(op.outputs[0]).shape, (std::vector<int64_t>{2, 16, 32, 192}));
    }
  }
  EXPECT_EQ(CountOps(g, "model.layers.1.self_attn.", "cat"), 2);
}

TEST(DecoderFamilies, BadDeepseekFieldsAreNamed) {
  const std::string base =
      R"({"architectures": ["DeepseekV2ForCausalLM"], "hidden_size": 64, "intermediate_size": 128,
          "num_attention_heads": 4, "num_hidden_layers": 2, "vocab_size": 256)";
  const std::string mla = R"(, "kv_lora_rank": 32, "qk_nope_head_dim": 16, "qk_rope_head_dim": 8, "v_head_dim": 16)";
  for (const auto& [extra, field] : std::vector<std::pair<std::string, std::string>>{
           {"}", "kv_lora_rank"},
           {R"(, "kv_lora_rank": 32, "qk_rope_head_dim": 8, "v_head_dim": 16})", "qk_nope_head_dim"},
           {mla + R"(, "num_key_value_heads": 2})", "num_key_value_heads"},
           {mla + R"(, "q_lora_rank": -1})", "q_lora_rank"},
           {mla + R"(, "n_routed_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
               "first_k_dense_replace": 3})",
            "first_k_dense_replace"},
           {mla + R"(, "n_routed_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
               "n_shared_experts": -1})",
            "n_shared_experts"},
           {mla + R"(, "n_routed_experts": 4, "moe_intermediate_size": 32})", "num_experts_per_tok"}}) {
    absl::StatusOr<ModelConfig> c = ParseHfConfig(base + extra, "deepseek.json");
    ASSERT_FALSE(c.ok()) << extra;
    EXPECT_THAT(c.status().message(), HasSubstr(field)) << extra;
  }
  absl::StatusOr<ModelConfig> ok = ParseHfConfig(base + mla + "}", "deepseek.json");
  ASSERT_TRUE(ok.ok()) << ok.status();
  absl::StatusOr<Graph> tp = BuildModelGraph(*ok, {.batch = 1, .seq_len = 8, .tensor_parallel = 2});
  ASSERT_FALSE(tp.ok());
  EXPECT_THAT(tp.status().message(), HasSubstr("latent attention"));
}

// Qwen2-MoE: 60 routed experts of 1408 and a shared expert of 5632 behind a sigmoid gate; layers in
// mlp_only_layers (or off decoder_sparse_step) keep a dense MLP of intermediate_size.
TEST(DecoderFamilies, Qwen2MoeRoutesAndSharesExperts) {
  ModelConfig c = Preset("qwen1.5-moe-a2.7b");
  EXPECT_TRUE(c.is_moe_layer(0) && c.is_moe_layer(23));
  c.num_layers = 2;
  c.dense_layers = {1};
  const Graph g = Build(c, {.batch = 1, .seq_len = 16});
  const std::set<std::string> names = TensorNames(g);
  EXPECT_TRUE(names.contains("model.layers.0.mlp.experts.59.down_proj.weight"));
  EXPECT_TRUE(names.contains("model.layers.0.mlp.shared_expert.up_proj.weight"));
  EXPECT_TRUE(names.contains("model.layers.0.mlp.shared_expert_gate.weight"));
  EXPECT_FALSE(names.contains("model.layers.1.mlp.experts.0.up_proj.weight"));
  EXPECT_TRUE(names.contains("model.layers.1.mlp.up_proj.weight"));
  EXPECT_EQ(CountOps(g, "model.layers.0.mlp.shared_expert.sigmoid", "sigmoid"), 1);
  c.moe_every = 2;  // decoder_sparse_step 2: layers 1, 3, ... are the sparse ones
  EXPECT_FALSE(c.is_moe_layer(0));
  EXPECT_FALSE(c.is_moe_layer(1));  // listed in mlp_only_layers
  EXPECT_TRUE(c.is_moe_layer(3));
}

// Qwen3-MoE: Qwen3's attention (q/k norms) over routed experts without a shared one.
TEST(DecoderFamilies, Qwen3MoeHasQkNormsAndNoSharedExpert) {
  ModelConfig c = Preset("qwen3-30b-a3b");
  EXPECT_TRUE(c.qk_norm);
  EXPECT_EQ(c.shared_expert_intermediate_size, 0);
  c.num_layers = 1;
  const Graph g = Build(c, {.batch = 1, .seq_len = 16});
  const std::set<std::string> names = TensorNames(g);
  EXPECT_TRUE(names.contains("model.layers.0.self_attn.k_norm.weight"));
  EXPECT_TRUE(names.contains("model.layers.0.mlp.experts.127.gate_proj.weight"));
  EXPECT_FALSE(names.contains("model.layers.0.mlp.shared_expert_gate.weight"));
}

TEST(DecoderFamilies, BadQwen2MoeFieldsAreNamed) {
  const std::string base =
      R"({"architectures": ["Qwen2MoeForCausalLM"], "hidden_size": 64, "intermediate_size": 128,
          "num_attention_heads": 4, "num_hidden_layers": 2, "vocab_size": 256, "moe_intermediate_size": 32)";
  for (const auto& [extra, field] : std::vector<std::pair<std::string, std::string>>{
           {R"(, "num_experts_per_tok": 2})", "num_experts"},
           {R"(, "num_experts": 4, "num_experts_per_tok": 8})", "num_experts_per_tok"},
           {R"(, "num_experts": 4, "num_experts_per_tok": 2, "decoder_sparse_step": 0})", "decoder_sparse_step"},
           {R"(, "num_experts": 4, "num_experts_per_tok": 2, "mlp_only_layers": "1"})", "mlp_only_layers"},
           {R"(, "num_experts": 4, "num_experts_per_tok": 2, "shared_expert_intermediate_size": 2147483647,
               "hidden_size": 65536, "num_attention_heads": 4})",
            "shared_expert_intermediate_size"}}) {
    absl::StatusOr<ModelConfig> c = ParseHfConfig(base + extra, "moe.json");
    ASSERT_FALSE(c.ok()) << extra;
    EXPECT_THAT(c.status().message(), HasSubstr(field)) << extra;
  }
}

// Phi-3's q, k and v are slices of one qkv_proj output, gate and up the chunks of one gate_up_proj output.
TEST(DecoderFamilies, Phi3SlicesFusedProjections) {
  ModelConfig c = Preset("phi-3-mini-4k");
  c.num_layers = 1;
  const Graph g = Build(c, {.batch = 1, .seq_len = 16});
  std::set<std::string> views;
  for (const Tensor& t : g.tensors()) {
    if (t.view_of != kNone) views.insert(g.tensor(t.view_of).name);
  }
  EXPECT_TRUE(views.contains("model.layers.0.self_attn.qkv_proj.out"));
  EXPECT_TRUE(views.contains("model.layers.0.mlp.gate_up_proj.out"));
  for (const Tensor& t : g.tensors()) {
    EXPECT_NE(t.name, "model.layers.0.self_attn.q_proj.weight");
    if (t.name == "model.layers.0.mlp.gate_up_proj.weight") {
      EXPECT_EQ(t.shape, (std::vector<int64_t>{16384, 3072}));
    }
  }
}

TEST(DecoderFamilies, ConfigsParseTheFamilyFields) {
  const ModelConfig gemma2 = Preset("gemma-2-9b");
  EXPECT_EQ(gemma2.head_dim, 256);  // decoupled: 16 heads x 256 != 3584
  EXPECT_TRUE(gemma2.tie_word_embeddings && gemma2.norm_plus_one && gemma2.embedding_scaled);
  EXPECT_TRUE(gemma2.sandwich_norms);
  EXPECT_DOUBLE_EQ(gemma2.attn_logit_softcap, 50.0);
  EXPECT_DOUBLE_EQ(gemma2.final_logit_softcap, 30.0);
  EXPECT_EQ(gemma2.activation, ActivationKind::kGeluTanh);
  EXPECT_TRUE(gemma2.is_sliding_layer(0));
  EXPECT_FALSE(gemma2.is_sliding_layer(1));
  EXPECT_TRUE(gemma2.is_sliding_layer(40));
  const ModelConfig gemma = Preset("gemma-7b");
  EXPECT_EQ(gemma.activation, ActivationKind::kGeluTanh);  // hidden_act "gelu" is ignored, as transformers does
  EXPECT_FALSE(gemma.sandwich_norms);
  EXPECT_FALSE(gemma.is_sliding_layer(0));
  const ModelConfig qwen3 = Preset("qwen3-8b");
  EXPECT_TRUE(qwen3.qk_norm);
  EXPECT_FALSE(qwen3.qkv_bias);
  EXPECT_FALSE(qwen3.tie_word_embeddings);
}

TEST(DecoderFamilies, Gemma2LayersHaveFourNormsAndSoftCaps) {
  ModelConfig c = Preset("gemma-2-9b");
  c.num_layers = 2;
  const Graph g = Build(c, {.batch = 1, .seq_len = 16, .attention = AttentionImpl::kEager});
  for (const char* norm : {"input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
                           "post_feedforward_layernorm"}) {
    bool found = false;
    for (const Tensor& t : g.tensors()) found = found || t.name == absl::StrCat("model.layers.1.", norm, ".weight");
    EXPECT_TRUE(found) << norm;
  }
  // Eager attention caps its scores; the final logits are capped too; tanh keeps its output for backward.
  EXPECT_EQ(CountOps(g, "model.layers.0.attn_core.softcap.tanh", "tanh"), 1);
  EXPECT_EQ(CountOps(g, "final_logit_softcap.tanh", "tanh"), 1);
  for (const Op& op : g.ops()) {
    if (op.kind == "tanh") {
      EXPECT_EQ(op.saved, op.outputs) << op.name;
    }
  }
  EXPECT_EQ(CountOps(g, "model.embed_scale", "scale"), 1);
  // Flash attention takes the cap inside its kernel: no score-sized ops.
  const Graph flash = Build(c, {.batch = 1, .seq_len = 16, .attention = AttentionImpl::kFlash});
  EXPECT_EQ(CountOps(flash, "model.layers.0.attn_core.softcap", "tanh"), 0);
}

// GemmaRMSNorm keeps its normalized tensor in f32 where Llama's keeps it in the input dtype.
TEST(DecoderFamilies, GemmaNormKeepsTheNormalizedTensorInF32) {
  ModelConfig c = Preset("gemma-7b");
  c.num_layers = 1;
  const Graph g = Build(c, {.batch = 1, .seq_len = 16, .param_dtype = DType::kBF16, .compute_dtype = DType::kBF16});
  const Op* scale = nullptr;
  for (const Op& op : g.ops()) {
    if (op.name == "model.layers.0.input_layernorm.scale") scale = &op;
  }
  ASSERT_NE(scale, nullptr);
  EXPECT_EQ(g.tensor(scale->inputs[0]).dtype, DType::kF32);
  EXPECT_THAT(scale->saved, ::testing::Contains(scale->inputs[0]));
}

TEST(DecoderFamilies, Qwen3NormsEachHeadsQueriesAndKeys) {
  ModelConfig c = Preset("qwen3-8b");
  c.num_layers = 1;
  const Graph g = Build(c, {.batch = 1, .seq_len = 16});
  const Tensor* q_norm = nullptr;
  for (const Tensor& t : g.tensors()) {
    if (t.name == "model.layers.0.self_attn.q_norm.weight") q_norm = &t;
  }
  ASSERT_NE(q_norm, nullptr);
  EXPECT_EQ(q_norm->shape, std::vector<int64_t>{128});
  // The eager norm keeps rstd of each of the 32 query heads of each token (f32).
  bool rstd = false;
  for (const Tensor& t : g.tensors()) {
    if (t.name == "model.layers.0.self_attn.q_norm.rstd.out") rstd = t.elements() == 16u * 32;
  }
  EXPECT_TRUE(rstd);
}

TEST(DecoderFamilies, BadGemma2FieldsAreNamed) {
  const std::string base =
      R"({"architectures": ["Gemma2ForCausalLM"], "hidden_size": 64, "intermediate_size": 128,
          "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32, "num_hidden_layers": 2,
          "vocab_size": 256)";
  absl::StatusOr<ModelConfig> no_window = ParseHfConfig(base + "}", "g2.json");
  ASSERT_FALSE(no_window.ok());
  EXPECT_THAT(no_window.status().message(), HasSubstr("sliding_window"));
  absl::StatusOr<ModelConfig> negative =
      ParseHfConfig(base + R"(, "sliding_window": 16, "attn_logit_softcapping": -1})", "g2.json");
  ASSERT_FALSE(negative.ok());
  EXPECT_THAT(negative.status().message(), HasSubstr("attn_logit_softcapping"));
  absl::StatusOr<ModelConfig> ok =
      ParseHfConfig(base + R"(, "sliding_window": 16, "final_logit_softcapping": null})", "g2.json");
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(ok->final_logit_softcap, 0);
}

}  // namespace
}  // namespace headroom

// GPT-OSS (Note [GPT-OSS] in models/builders/decoder.cc) and Llama 4's text model (Note [Llama 4]): attention sinks,
// sliding and chunked layers, NoPE layers, fused experts, from their real config.json presets.
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "models/builders.h"
#include "models/model_config.h"
#include "tests/models/model_test_util.h"

namespace headroom {
namespace {

using ::testing::HasSubstr;

using ::headroom::testing::Build;
using ::headroom::testing::CountOps;
using ::headroom::testing::FindOp;
using ::headroom::testing::FindTensor;
using ::headroom::testing::Preset;
using ::headroom::testing::ShapeOf;
using ::headroom::testing::TensorNames;

TEST(GptOss, ConfigAlternatesSlidingLayersAndRoutesToFusedExperts) {
  const ModelConfig c = Preset("gpt-oss-20b");
  EXPECT_TRUE(c.attention_sinks);
  EXPECT_EQ(c.num_experts, 32);
  EXPECT_EQ(c.experts_per_token, 4);
  EXPECT_EQ(c.head_dim, 64);
  EXPECT_EQ(c.sliding_window, 128);
  EXPECT_TRUE(c.is_sliding_layer(0));
  EXPECT_FALSE(c.is_sliding_layer(1));
  EXPECT_TRUE(c.is_sliding_layer(22));
  EXPECT_FALSE(c.is_sliding_layer(23));
  EXPECT_TRUE(c.is_moe_layer(0) && c.is_moe_layer(23));
}

TEST(GptOss, LayersHoldSinksBiasesAndFusedExperts) {
  ModelConfig c = Preset("gpt-oss-20b");
  c.num_layers = 2;
  const Graph g = Build(c, {.batch = 1, .seq_len = 64, .param_dtype = DType::kBF16, .compute_dtype = DType::kBF16,
                            .attention = AttentionImpl::kFlash});
  const std::set<std::string> names = TensorNames(g);
  for (const char* name :
       {"model.layers.0.self_attn.sinks", "model.layers.0.self_attn.q_proj.bias",
        "model.layers.0.self_attn.o_proj.bias",
        "model.layers.1.mlp.router.weight", "model.layers.1.mlp.router.bias", "model.layers.1.mlp.experts.gate_up_proj",
        "model.layers.1.mlp.experts.gate_up_proj_bias", "model.layers.1.mlp.experts.down_proj",
        "model.layers.1.mlp.experts.down_proj_bias", "lm_head.weight"}) {
    EXPECT_TRUE(names.contains(name)) << name;
  }
  EXPECT_FALSE(names.contains("model.layers.0.mlp.experts.0.gate_proj.weight"));
  EXPECT_EQ(ShapeOf(g, "model.layers.0.self_attn.sinks"), (std::vector<int64_t>{64}));
  EXPECT_EQ(ShapeOf(g, "model.layers.0.mlp.experts.gate_up_proj"), (std::vector<int64_t>{32, 2880, 5760}));
  EXPECT_EQ(ShapeOf(g, "model.layers.0.mlp.experts.down_proj"), (std::vector<int64_t>{32, 2880, 2880}));
  EXPECT_EQ(ShapeOf(g, "model.layers.0.mlp.experts.gate_up_proj_bias"), (std::vector<int64_t>{32, 5760}));
  // 64 tokens x top 4 over 32 experts: 8 rows each, one grouped GEMM over [32, 8, hidden].
  EXPECT_EQ(ShapeOf(g, "model.layers.0.mlp.experts.gate_up_grouped_mm.out"), (std::vector<int64_t>{32, 8, 5760}));
  // The clamped SwiGLU: two clamps, each saving its view of the up projection's output.
  EXPECT_EQ(CountOps(g, "model.layers.0.mlp.experts.", "clamp"), 2);
  const Op* gate_clamp = FindOp(g, "model.layers.0.mlp.experts.gate_clamp");
  ASSERT_NE(gate_clamp, nullptr);
  ASSERT_EQ(gate_clamp->saved.size(), 1u);
  const Tensor* gate_up = FindTensor(g, "model.layers.0.mlp.experts.gate_up_grouped_mm.out");
  ASSERT_NE(gate_up, nullptr);
  EXPECT_EQ(g.tensor(gate_clamp->saved[0]).view_of, gate_up->id);
  // The router's softmax is over the k chosen logits only.
  EXPECT_EQ(ShapeOf(g, "model.layers.0.mlp.router.softmax.out"), (std::vector<int64_t>{64, 4}));
  // Flash attention takes the sinks and saves them.
  const Op* sdpa = FindOp(g, "model.layers.0.attn_core.sdpa");
  ASSERT_NE(sdpa, nullptr);
  EXPECT_EQ(sdpa->inputs.back(), FindTensor(g, "model.layers.0.self_attn.sinks")->id);
  EXPECT_EQ(sdpa->saved.size(), 6u);
  // The routing's integers are kept: 256 rows' tokens, sorted experts, permutation and inverse, 32 offsets.
  std::set<std::string> saved_ints;
  for (const Op& op : g.ops()) {
    if (op.layer != 0) continue;
    for (TensorId t : op.saved) {
      const Tensor& tensor = g.tensor(t);
      if (tensor.dtype == DType::kI64 || tensor.dtype == DType::kI32) saved_ints.insert(tensor.name);
    }
  }
  EXPECT_EQ(saved_ints, (std::set<std::string>{
                            "model.layers.0.mlp.router.topk.indices", "model.layers.0.mlp.experts.token_index.out",
                            "model.layers.0.mlp.experts.sorted_experts.out",
                            "model.layers.0.mlp.experts.permutation.out", "model.layers.0.mlp.experts.offsets.out",
                            "model.layers.0.mlp.experts.inverse_permutation.out"}));
  EXPECT_EQ(ShapeOf(g, "model.layers.0.mlp.experts.offsets.out"), std::vector<int64_t>{32});
  EXPECT_EQ(ShapeOf(g, "model.layers.0.mlp.experts.permutation.out"), std::vector<int64_t>{256});
  // transformers before 5 looped over the experts in Python: not modelled, and said so.
  BuildOptions older{.batch = 1, .seq_len = 64};
  older.runtime.transformers = {.major = 4, .minor = 57};
  absl::StatusOr<Graph> refused = BuildModelGraph(c, older);
  ASSERT_FALSE(refused.ok());
  EXPECT_THAT(refused.status().message(), HasSubstr("transformers 4.57"));
}

TEST(GptOss, EagerAttentionAppendsTheSinkColumnAndKeepsTheScoresDtype) {
  ModelConfig c = Preset("gpt-oss-20b");
  c.num_layers = 1;
  const Graph g = Build(c, {.batch = 2, .seq_len = 32, .param_dtype = DType::kBF16, .compute_dtype = DType::kBF16,
                            .attention = AttentionImpl::kEager});
  EXPECT_EQ(ShapeOf(g, "model.layers.0.attn_core.sinks_cat.out"), (std::vector<int64_t>{2, 64, 32, 33}));
  const Tensor* probs = FindTensor(g, "model.layers.0.attn_core.softmax.out");
  ASSERT_NE(probs, nullptr);
  EXPECT_EQ(probs->dtype, DType::kBF16);  // softmax(dtype=combined.dtype), not Llama's f32
  EXPECT_EQ(probs->shape, (std::vector<int64_t>{2, 64, 32, 33}));
  // The matmul with v reads the probabilities without the sink column, a view that keeps all of them alive.
  const Op* pv = FindOp(g, "model.layers.0.attn_core.pv");
  ASSERT_NE(pv, nullptr);
  EXPECT_EQ(g.tensor(pv->inputs[0]).view_of, probs->id);
  const Op* row_max = FindOp(g, "model.layers.0.attn_core.row_max");
  ASSERT_NE(row_max, nullptr);
  ASSERT_EQ(row_max->saved.size(), 1u);
  EXPECT_EQ(g.tensor(row_max->saved[0]).dtype, DType::kI64);
  // GptOssRMSNorm applies its weight in f32 and saves the f32 normalized tensor for it.
  const Op* norm_scale = FindOp(g, "model.layers.0.input_layernorm.scale");
  ASSERT_NE(norm_scale, nullptr);
  EXPECT_EQ(g.tensor(norm_scale->outputs[0]).dtype, DType::kF32);
}

TEST(GptOss, BadFieldsAreNamed) {
  const std::string base =
      R"({"architectures": ["GptOssForCausalLM"], "hidden_size": 64, "intermediate_size": 64, "vocab_size": 256,
          "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "num_hidden_layers": 2)";
  for (const auto& [extra, field] : std::vector<std::pair<std::string, std::string>>{
           {"}", "num_local_experts"},
           {R"(, "num_local_experts": 4, "num_experts_per_tok": 8})", "num_experts_per_tok"},
           {R"(, "num_local_experts": 4, "layer_types": ["sliding_attention"]})", "layer_types"},
           {R"(, "num_local_experts": 4, "layer_types": ["sliding_attention", "chunked_attention"]})",
            "layer_types[1]"},
           {R"(, "num_local_experts": 4, "sliding_window": -1})", "sliding_window"}}) {
    absl::StatusOr<ModelConfig> c = ParseHfConfig(base + extra, "gpt-oss.json");
    ASSERT_FALSE(c.ok()) << extra;
    EXPECT_THAT(c.status().message(), HasSubstr(field)) << extra;
  }
  absl::StatusOr<ModelConfig> no_window =
      ParseHfConfig(base + R"(, "num_local_experts": 4, "sliding_window": null})", "gpt-oss.json");
  ASSERT_TRUE(no_window.ok()) << no_window.status();
  EXPECT_FALSE(no_window->is_sliding_layer(0));
  // Without layer_types, even layers slide as GptOssConfig's default has it.
  absl::StatusOr<ModelConfig> defaults = ParseHfConfig(base + R"(, "num_local_experts": 4})", "gpt-oss.json");
  ASSERT_TRUE(defaults.ok()) << defaults.status();
  EXPECT_TRUE(defaults->is_sliding_layer(0));
  EXPECT_FALSE(defaults->is_sliding_layer(1));
}

TEST(Llama4, ConfigHasNopeLayersChunkedLayersAndMoeEverywhere) {
  const ModelConfig c = Preset("llama-4-scout-17b-16e");
  EXPECT_EQ(c.num_experts, 16);
  EXPECT_EQ(c.experts_per_token, 1);
  EXPECT_EQ(c.intermediate_size, 16384);      // intermediate_size_mlp, the dense layers'
  EXPECT_EQ(c.moe_intermediate_size, 8192);   // the experts'
  EXPECT_EQ(c.shared_expert_intermediate_size, 8192);
  EXPECT_TRUE(c.qk_l2_norm);
  EXPECT_TRUE(c.attn_temperature_tuning);
  // no_rope_layers is empty: every fourth layer is NoPE and attends to everything; the others are chunked.
  EXPECT_TRUE(c.uses_rope(0) && c.uses_rope(2) && !c.uses_rope(3) && !c.uses_rope(47));
  EXPECT_EQ(c.sliding_window, 8192);
  EXPECT_TRUE(c.is_sliding_layer(0));
  EXPECT_FALSE(c.is_sliding_layer(3));
  for (int64_t i = 0; i < c.num_layers; ++i) EXPECT_TRUE(c.is_moe_layer(i)) << i;
}

TEST(Llama4, MoeRunsEveryExpertOverEveryTokenBesideASharedExpert) {
  ModelConfig c = Preset("llama-4-scout-17b-16e");
  c.num_layers = 4;
  const Graph g = Build(c, {.batch = 1, .seq_len = 32, .param_dtype = DType::kBF16, .compute_dtype = DType::kBF16});
  const std::set<std::string> names = TensorNames(g);
  for (const char* name :
       {"model.layers.0.feed_forward.router.weight", "model.layers.0.feed_forward.experts.gate_up_proj",
        "model.layers.0.feed_forward.experts.down_proj", "model.layers.0.feed_forward.shared_expert.gate_proj.weight",
        "model.layers.0.feed_forward.shared_expert.down_proj.weight"}) {
    EXPECT_TRUE(names.contains(name)) << name;
  }
  EXPECT_FALSE(names.contains("model.layers.0.feed_forward.router.bias"));
  EXPECT_EQ(ShapeOf(g, "model.layers.0.feed_forward.experts.gate_up_proj"), (std::vector<int64_t>{16, 5120, 16384}));
  // Every token repeated for each of the 16 experts, scaled by its sigmoid score, through both bmm's.
  EXPECT_EQ(ShapeOf(g, "model.layers.0.feed_forward.routed_in.out"), (std::vector<int64_t>{16 * 32, 5120}));
  EXPECT_EQ(ShapeOf(g, "model.layers.0.feed_forward.experts.gate_up_bmm.out"), (std::vector<int64_t>{16, 32, 16384}));
  const Op* sigmoid = FindOp(g, "model.layers.0.feed_forward.router.sigmoid");
  ASSERT_NE(sigmoid, nullptr);
  EXPECT_EQ(g.tensor(sigmoid->outputs[0]).dtype, DType::kF32);
  // Rotary layers rotate in f32 and L2-normalize q and k; the NoPE layer (3) scales q by its temperature instead.
  EXPECT_NE(FindOp(g, "model.layers.0.rotary_q"), nullptr);
  EXPECT_NE(FindOp(g, "model.layers.0.self_attn.qk_norm.q"), nullptr);
  EXPECT_EQ(FindOp(g, "model.layers.0.self_attn.attn_scales.mul"), nullptr);
  EXPECT_EQ(FindOp(g, "model.layers.3.rotary_q"), nullptr);
  EXPECT_EQ(FindOp(g, "model.layers.3.self_attn.qk_norm.q"), nullptr);
  EXPECT_NE(FindOp(g, "model.layers.3.self_attn.attn_scales.mul"), nullptr);
  // Llama 4's eager softmax stays in the scores' dtype.
  const Graph eager = Build(c, {.batch = 1, .seq_len = 16, .param_dtype = DType::kBF16,
                                .compute_dtype = DType::kBF16, .attention = AttentionImpl::kEager});
  const Tensor* probs = FindTensor(eager, "model.layers.0.attn_core.softmax.out");
  ASSERT_NE(probs, nullptr);
  EXPECT_EQ(probs->dtype, DType::kBF16);
}

TEST(Llama4, DenseLayersUseIntermediateSizeMlp) {
  ModelConfig c = Preset("llama-4-scout-17b-16e");
  c.num_layers = 2;
  c.moe_every = 2;  // interleave_moe_layer_step 2, as Maverick: layer 1 routed, layer 0 dense
  const Graph g = Build(c);
  EXPECT_EQ(ShapeOf(g, "model.layers.0.feed_forward.gate_proj.weight"), (std::vector<int64_t>{16384, 5120}));
  EXPECT_EQ(ShapeOf(g, "model.layers.0.feed_forward.down_proj.weight"), (std::vector<int64_t>{5120, 16384}));
  EXPECT_FALSE(TensorNames(g).contains("model.layers.0.feed_forward.experts.gate_up_proj"));
  EXPECT_TRUE(TensorNames(g).contains("model.layers.1.feed_forward.experts.gate_up_proj"));
}

TEST(Llama4, LayerListsAndBadFieldsAreNamed) {
  const std::string base =
      R"({"architectures": ["Llama4ForCausalLM"], "hidden_size": 64, "intermediate_size": 32, "vocab_size": 256,
          "intermediate_size_mlp": 128, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
          "num_hidden_layers": 4)";
  for (const auto& [extra, field] : std::vector<std::pair<std::string, std::string>>{
           {"}", "num_local_experts"},
           {R"(, "num_local_experts": 4, "no_rope_layers": [1, 0]})", "no_rope_layers"},
           {R"(, "num_local_experts": 4, "no_rope_layers": [1, 1, 2, 0]})", "no_rope_layers[2]"},
           {R"(, "num_local_experts": 4, "moe_layers": [1, 4]})", "moe_layers[1]"},
           {R"(, "num_local_experts": 4, "interleave_moe_layer_step": 0})", "interleave_moe_layer_step"},
           {R"(, "num_local_experts": 4, "attn_temperature_tuning": "yes"})", "attn_temperature_tuning"},
           {R"(, "num_local_experts": 4, "attention_chunk_size": null,
               "layer_types": ["chunked_attention", "full_attention", "full_attention", "full_attention"]})",
            "attention_chunk_size"}}) {
    absl::StatusOr<ModelConfig> c = ParseHfConfig(base + extra, "llama4.json");
    ASSERT_FALSE(c.ok()) << extra;
    EXPECT_THAT(c.status().message(), HasSubstr(field)) << extra;
  }
  absl::StatusOr<ModelConfig> listed = ParseHfConfig(
      base + R"(, "num_local_experts": 4, "moe_layers": [1, 3], "no_rope_layers": [1, 0, 1, 0],
                 "attention_chunk_size": null})",
      "llama4.json");
  ASSERT_TRUE(listed.ok()) << listed.status();
  EXPECT_FALSE(listed->is_moe_layer(0));
  EXPECT_TRUE(listed->is_moe_layer(1));
  EXPECT_FALSE(listed->is_moe_layer(2));
  EXPECT_TRUE(listed->uses_rope(0) && !listed->uses_rope(1));
  EXPECT_FALSE(listed->is_sliding_layer(0));  // no chunk size: every layer attends to everything
  // The multimodal class is refused with the way out.
  absl::StatusOr<ModelConfig> multimodal = ParseHfConfig(
      R"({"architectures": ["Llama4ForConditionalGeneration"], "text_config": {}})", "scout.json");
  ASSERT_FALSE(multimodal.ok());
  EXPECT_THAT(multimodal.status().message(), HasSubstr("text_config"));
}

}  // namespace
}  // namespace headroom

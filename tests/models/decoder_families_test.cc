// The decoder families beyond Llama: Qwen3, Gemma 1-3 (Note [Gemma decoders] in
// models/builders.cc), Phi-3, the Qwen MoEs, OLMo 2 (Note [OLMo 2]), StarCoder2,
// OPT (Note [OPT]), Falcon (Note [Falcon]), GPT-J (Note [GPT-J]), GPTBigCode (Note [GPTBigCode]) and Bloom
// (Note [Bloom]), from their real config.json presets.
#include <map>
#include <set>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "models/builders.h"
#include "models/model_config.h"
#include "models/model_source.h"
#include "tests/models/model_test_util.h"

namespace headroom {
namespace {

using ::testing::HasSubstr;

using ::headroom::testing::Build;
using ::headroom::testing::CountOps;
using ::headroom::testing::FindOp;
using ::headroom::testing::Preset;
using ::headroom::testing::TensorNames;

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
//    shared expert); the model card gives 30.5 B;
//  - deepseek-v3 and deepseek-v2-lite: the sum of the shapes DeepSeek's modeling_deepseek.py declares (latent
//    attention's q_a/q_b or q_proj, kv_a_proj_with_mqa, kv_b_proj, o_proj and two norms; dense MLPs in the first
//    first_k_dense_replace layers, then the gate, V3's e_score_correction_bias, the routed experts and the
//    fused shared experts; untied head): 671.0 B and 15.7 B, the totals on the model cards (V3's 685 B there
//    adds its multi-token-prediction module, which the modeling code does not build);
//  - olmo-2-13b (allenai/OLMo-2-1124-13B): transformers 4.46 has no OLMo 2, so transformers 4.50.3's
//    Olmo2ForCausalLM built from this config the same way (q/k/v/o projections, q_norm and k_norm over the whole
//    5120-wide projections, SwiGLU MLP, two norms per layer, the final norm, untied 100352 x 5120 embeddings and
//    lm_head); the checkpoint's model.safetensors.index.json gives total_size 54,864,793,600 bytes of f32, the
//    same count;
//  - gemma-3-1b (google/gemma-3-1b-it): transformers 4.50.3's Gemma3ForCausalLM the same way (26 layers of
//    q/k/v/o with q_norm and k_norm over head_dim 256, GeGLU MLP, four norms each, the tied 262144 x 1152
//    embeddings); the model card gives 1 B;
//  - starcoder2-15b (bigcode/starcoder2-15b): transformers 4.46.3's Starcoder2ForCausalLM the same way (16 B on
//    the Hub: 40 layers with biased GQA projections, a biased c_fc/c_proj MLP, two LayerNorms with bias,
//    untied 49152 x 6144 embeddings and lm_head);
//  - opt-1.3b (facebook/opt-1.3b) and opt-350m (its config in Opt350mConfig below): transformers 4.46.3's
//    OPTForCausalLM the same way (1.3 B and 350 M on the model cards; 2050 learned position rows, biased
//    projections and fc1/fc2, LayerNorms with bias, the tied lm_head; opt-350m adds project_in and project_out
//    and drops the final LayerNorm);
//  - falcon-7b (tiiuae/falcon-7b) and falcon-40b (its config in kFalcon40bConfig below): transformers 4.46.3's
//    FalconForCausalLM the same way (7 B and 40 B on the model cards; a multi-query or 8-group fused
//    query_key_value, no biases, one LayerNorm per layer for 7B and two for 40B, the tied lm_head);
//  - gpt-j-6b (EleutherAI/gpt-j-6b): transformers 4.46.3's GPTJForCausalLM the same way (6 B on the model card;
//    unbiased q/k/v/out projections, a biased fc_in/fc_out MLP, one ln_1 per layer, an untied lm_head with a bias);
//  - santacoder (bigcode/gpt_bigcode-santacoder): transformers 4.46.3's GPTBigCodeForCausalLM the same way (1.1 B on
//    the model card; a biased multi-query c_attn and c_proj, a biased c_fc/c_proj MLP, ln_1 and ln_2, 2048 learned
//    positions, the tied lm_head);
//  - bloom-560m (bigscience/bloom-560m): transformers 4.46.3's BloomForCausalLM the same way (560 M on the model
//    card; the 250880 x 1024 tied embeddings and their LayerNorm, biased query_key_value, dense and 4096-wide MLP,
//    two LayerNorms per layer, no position embeddings);
//  - gpt-oss-20b and gpt-oss-120b, llama-4-scout-17b-16e: transformers 5.24.0's GptOssForCausalLM and
//    Llama4ForCausalLM built from these config files on the meta device, summing p.numel() (Note [GPT-OSS] and
//    Note [Llama 4] in models/builders/decoder.cc). OpenAI's model card gives 21 B and 117 B; Meta's gives Scout 109 B
//    with its vision tower, which the text model (107.8 B) leaves out.
TEST(DecoderFamilies, ParameterCountsMatchTheRealModels) {
  EXPECT_EQ(Build(Preset("gemma-7b")).ParameterCount(), 8'537'680'896u);
  EXPECT_EQ(Build(Preset("gemma-2-9b")).ParameterCount(), 9'241'705'984u);
  EXPECT_EQ(Build(Preset("qwen3-8b")).ParameterCount(), 8'190'735'360u);
  EXPECT_EQ(Build(Preset("phi-3-mini-4k")).ParameterCount(), 3'821'079'552u);
  EXPECT_EQ(Build(Preset("qwen1.5-moe-a2.7b")).ParameterCount(), 14'315'784'192u);
  EXPECT_EQ(Build(Preset("qwen3-30b-a3b")).ParameterCount(), 30'532'122'624u);
  EXPECT_EQ(Build(Preset("olmo-2-13b")).ParameterCount(), 13'716'198'400u);
  EXPECT_EQ(Build(Preset("gemma-3-1b")).ParameterCount(), 999'885'952u);
  EXPECT_EQ(Build(Preset("starcoder2-15b")).ParameterCount(), 15'957'889'024u);
  EXPECT_EQ(Build(Preset("opt-1.3b")).ParameterCount(), 1'315'758'080u);
  EXPECT_EQ(Build(Preset("deepseek-v3")).ParameterCount(), 671'026'419'200u);
  EXPECT_EQ(Build(Preset("deepseek-v2-lite")).ParameterCount(), 15'706'484'224u);
  EXPECT_EQ(Build(Preset("falcon-7b")).ParameterCount(), 6'921'720'704u);
  EXPECT_EQ(Build(Preset("gpt-j-6b")).ParameterCount(), 6'050'882'784u);
  EXPECT_EQ(Build(Preset("santacoder")).ParameterCount(), 1'124'886'528u);
  EXPECT_EQ(Build(Preset("bloom-560m")).ParameterCount(), 559'214'592u);
  EXPECT_EQ(Build(Preset("gpt-oss-20b")).ParameterCount(), 20'914'757'184u);
  EXPECT_EQ(Build(Preset("gpt-oss-120b")).ParameterCount(), 116'829'156'672u);
  EXPECT_EQ(Build(Preset("llama-4-scout-17b-16e")).ParameterCount(), 107'769'861'120u);
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
  for (const char* name :
       {"model.layers.0.self_attn.q_a_proj.weight", "model.layers.0.self_attn.q_a_layernorm.weight",
        "model.layers.0.self_attn.q_b_proj.weight", "model.layers.0.self_attn.kv_a_proj_with_mqa.weight",
        "model.layers.0.self_attn.kv_a_layernorm.weight", "model.layers.0.self_attn.kv_b_proj.weight",
        "model.layers.2.mlp.gate_proj.weight", "model.layers.3.mlp.gate.weight",
        "model.layers.3.mlp.gate.e_score_correction_bias", "model.layers.3.mlp.experts.gate_up_proj",
        "model.layers.3.mlp.experts.down_proj",
        "model.layers.3.mlp.shared_experts.down_proj.weight"}) {
    EXPECT_TRUE(names.contains(name)) << name;
  }
  EXPECT_FALSE(names.contains("model.layers.3.mlp.shared_expert_gate.weight"));
  EXPECT_FALSE(names.contains("model.layers.2.mlp.experts.gate_up_proj"));

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

// Mistral v0.1 attends within 4096 tokens in every layer, so its KV cache holds the window as Gemma 2's
// sliding layers do; a config with "sliding_window": null (v0.2 and later) attends to everything.
TEST(DecoderFamilies, MistralWindowsEveryLayer) {
  const ModelConfig v01 = Preset("mistral-7b");
  EXPECT_EQ(v01.sliding_window, 4096);
  EXPECT_TRUE(v01.is_sliding_layer(0) && v01.is_sliding_layer(31));
  absl::StatusOr<ModelConfig> v02 = ParseHfConfig(
      R"({"architectures": ["MistralForCausalLM"], "hidden_size": 64, "intermediate_size": 128,
          "num_attention_heads": 4, "num_hidden_layers": 2, "vocab_size": 256, "sliding_window": null})",
      "mistral.json");
  ASSERT_TRUE(v02.ok()) << v02.status();
  EXPECT_FALSE(v02->is_sliding_layer(0));
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
  EXPECT_TRUE(names.contains("model.layers.0.mlp.experts.down_proj"));
  EXPECT_TRUE(names.contains("model.layers.0.mlp.shared_expert.up_proj.weight"));
  EXPECT_TRUE(names.contains("model.layers.0.mlp.shared_expert_gate.weight"));
  EXPECT_FALSE(names.contains("model.layers.1.mlp.experts.down_proj"));
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
  EXPECT_TRUE(names.contains("model.layers.0.mlp.experts.gate_up_proj"));
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
  EXPECT_EQ(gemma2.norm_placement, NormPlacement::kSandwich);
  EXPECT_DOUBLE_EQ(gemma2.attn_logit_softcap, 50.0);
  EXPECT_DOUBLE_EQ(gemma2.final_logit_softcap, 30.0);
  EXPECT_EQ(gemma2.activation, ActivationKind::kGeluTanh);
  EXPECT_TRUE(gemma2.is_sliding_layer(0));
  EXPECT_FALSE(gemma2.is_sliding_layer(1));
  EXPECT_TRUE(gemma2.is_sliding_layer(40));
  const ModelConfig gemma = Preset("gemma-7b");
  EXPECT_EQ(gemma.activation, ActivationKind::kGeluTanh);  // hidden_act "gelu" is ignored, as transformers does
  EXPECT_EQ(gemma.norm_placement, NormPlacement::kPre);
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

// OLMo 2 norms the branches' outputs, not their inputs, and its q_norm and k_norm span the whole projections.
TEST(DecoderFamilies, Olmo2NormsBranchOutputsAndWholeProjections) {
  ModelConfig c = Preset("olmo-2-13b");
  EXPECT_EQ(c.norm_placement, NormPlacement::kBranchOutput);
  EXPECT_TRUE(c.qk_norm_full);
  EXPECT_FALSE(c.qk_norm);
  EXPECT_FALSE(c.qkv_bias || c.tie_word_embeddings);
  c.num_layers = 2;
  const Graph g = Build(c, {.batch = 1, .seq_len = 16});
  std::map<std::string, std::vector<int64_t>> params;
  for (const Tensor& t : g.tensors()) {
    if (t.role == TensorRole::kParameter) params[t.name] = t.shape;
  }
  EXPECT_EQ(params["model.layers.1.self_attn.q_norm.weight"], std::vector<int64_t>{40 * 128});
  EXPECT_EQ(params["model.layers.1.self_attn.k_norm.weight"], std::vector<int64_t>{40 * 128});
  EXPECT_TRUE(params.contains("model.layers.1.post_attention_layernorm.weight"));
  EXPECT_TRUE(params.contains("model.layers.1.post_feedforward_layernorm.weight"));
  EXPECT_FALSE(params.contains("model.layers.1.input_layernorm.weight"));
  EXPECT_FALSE(params.contains("model.layers.1.pre_feedforward_layernorm.weight"));
  // The first q projection reads the embeddings themselves, and the eager q_norm keeps one rstd per token
  // (Qwen3's keeps one per head).
  const Op* q_proj = nullptr;
  for (const Op& op : g.ops()) {
    if (op.name == "model.layers.0.self_attn.q_proj") q_proj = &op;
  }
  ASSERT_NE(q_proj, nullptr);
  EXPECT_EQ(g.tensor(q_proj->inputs[0]).name, "model.embed.out");
  bool rstd = false;
  for (const Tensor& t : g.tensors()) {
    if (t.name == "model.layers.0.self_attn.q_norm.rstd.out") rstd = t.elements() == 16u;
  }
  EXPECT_TRUE(rstd);
  // Under tensor parallelism each rank holds its heads' share of the norm.
  const Graph tp = Build(c, {.batch = 1, .seq_len = 16, .tensor_parallel = 2});
  std::vector<int64_t> shard;
  for (const Tensor& t : tp.tensors()) {
    if (t.name == "model.layers.0.self_attn.q_norm.weight") shard = t.shape;
  }
  EXPECT_EQ(shard, std::vector<int64_t>{20 * 128});
}

TEST(DecoderFamilies, BadOlmo2FieldsAreNamed) {
  const std::string base =
      R"({"architectures": ["Olmo2ForCausalLM"], "hidden_size": 64, "intermediate_size": 128,
          "num_attention_heads": 4, "num_hidden_layers": 2, "vocab_size": 256)";
  for (const auto& [extra, field] : std::vector<std::pair<std::string, std::string>>{
           {R"(, "attention_bias": "no"})", "attention_bias"},
           {R"(, "num_key_value_heads": 3})", "num_key_value_heads"},
           {R"(, "rms_norm_eps": "1e-6"})", "rms_norm_eps"}}) {
    absl::StatusOr<ModelConfig> c = ParseHfConfig(base + extra, "olmo2.json");
    ASSERT_FALSE(c.ok()) << extra;
    EXPECT_THAT(c.status().message(), HasSubstr("olmo2.json: " + field)) << extra;
  }
  absl::StatusOr<ModelConfig> by_type =
      ParseHfConfig(R"({"model_type": "olmo2", "hidden_size": 64, "intermediate_size": 128,
                        "num_attention_heads": 4, "num_hidden_layers": 2, "vocab_size": 256})", "olmo2.json");
  ASSERT_TRUE(by_type.ok()) << by_type.status();
  EXPECT_EQ(by_type->architecture, "Olmo2ForCausalLM");
}

// Gemma 3: five sliding-window layers to one global one, Gemma 2's four norms, q/k norms over head_dim, and a
// second rotary table for the sliding layers.
TEST(DecoderFamilies, Gemma3InterleavesLocalAndGlobalLayers) {
  ModelConfig c = Preset("gemma-3-1b");
  EXPECT_EQ(c.norm_placement, NormPlacement::kSandwich);
  EXPECT_TRUE(c.qk_norm && c.norm_plus_one && c.embedding_scaled && c.tie_word_embeddings);
  EXPECT_EQ(c.head_dim, 256);  // 4 heads x 256 != 1152
  EXPECT_EQ(c.num_kv_heads, 1);
  EXPECT_DOUBLE_EQ(c.query_pre_attn_scalar, 256.0);
  EXPECT_EQ(c.attn_logit_softcap, 0);
  EXPECT_EQ(c.final_logit_softcap, 0);
  EXPECT_EQ(c.sliding_window, 512);
  std::string pattern;
  for (int64_t i = 0; i < c.num_layers; ++i) pattern += c.is_sliding_layer(i) ? 'L' : 'G';
  EXPECT_EQ(pattern, "LLLLLGLLLLLGLLLLLGLLLLLGLL");
  c.num_layers = 6;
  const Graph g = Build(c, {.batch = 1, .seq_len = 16, .attention = AttentionImpl::kEager});
  std::map<std::string, std::vector<int64_t>> params;
  for (const Tensor& t : g.tensors()) {
    if (t.role == TensorRole::kParameter) params[t.name] = t.shape;
  }
  EXPECT_EQ(params["model.layers.5.self_attn.q_norm.weight"], std::vector<int64_t>{256});
  for (const char* norm : {"input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
                           "post_feedforward_layernorm"}) {
    EXPECT_TRUE(params.contains(absl::StrCat("model.layers.5.", norm, ".weight"))) << norm;
  }
  // Layer 4 rotates with the local table, layer 5 with the global one; nothing is soft-capped.
  std::map<std::string, std::string> rotary_table;
  for (const Op& op : g.ops()) {
    if (op.kind == "rotary") rotary_table[op.name] = g.tensor(op.inputs[1]).name;
  }
  EXPECT_EQ(rotary_table["model.layers.4.rotary_q"], "model.rotary_emb_local.cos");
  EXPECT_EQ(rotary_table["model.layers.5.rotary_k"], "model.rotary_emb.cos");
  EXPECT_EQ(CountOps(g, "", "tanh"), 0);
  EXPECT_EQ(CountOps(g, "model.embed_scale", "scale"), 1);
}

// Newer Gemma 3 configs list each layer's attention in layer_types.
TEST(DecoderFamilies, Gemma3LayerTypesOverrideThePattern) {
  const std::string base =
      R"({"architectures": ["Gemma3ForCausalLM"], "model_type": "gemma3_text", "hidden_size": 64,
          "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 32,
          "num_hidden_layers": 3, "vocab_size": 256, "sliding_window": 16)";
  absl::StatusOr<ModelConfig> listed = ParseHfConfig(
      base + R"(, "sliding_window_pattern": 6,
                  "layer_types": ["full_attention", "sliding_attention", "full_attention"]})", "g3.json");
  ASSERT_TRUE(listed.ok()) << listed.status();
  EXPECT_FALSE(listed->is_sliding_layer(0));
  EXPECT_TRUE(listed->is_sliding_layer(1));
  EXPECT_FALSE(listed->is_sliding_layer(2));
  absl::StatusOr<ModelConfig> defaults = ParseHfConfig(base + "}", "g3.json");
  ASSERT_TRUE(defaults.ok()) << defaults.status();
  EXPECT_EQ(defaults->global_layer_every, 6);  // Gemma3TextConfig's default
  EXPECT_DOUBLE_EQ(defaults->query_pre_attn_scalar, 256.0);
}

TEST(DecoderFamilies, BadGemma3FieldsAreNamed) {
  const std::string base =
      R"({"architectures": ["Gemma3ForCausalLM"], "hidden_size": 64, "intermediate_size": 128,
          "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 32, "num_hidden_layers": 2,
          "vocab_size": 256)";
  for (const auto& [extra, field] : std::vector<std::pair<std::string, std::string>>{
           {R"(})", "sliding_window"},
           {R"(, "sliding_window": 16, "sliding_window_pattern": 0})", "sliding_window_pattern"},
           {R"(, "sliding_window": 16, "query_pre_attn_scalar": -1})", "query_pre_attn_scalar"},
           {R"(, "sliding_window": 16, "layer_types": ["full_attention"]})", "layer_types"},
           {R"(, "sliding_window": 16, "layer_types": ["full_attention", "local"]})", "layer_types[1]"},
           {R"(, "sliding_window": 16, "final_logit_softcapping": -30})", "final_logit_softcapping"}}) {
    absl::StatusOr<ModelConfig> c = ParseHfConfig(base + extra, "g3.json");
    ASSERT_FALSE(c.ok()) << extra;
    EXPECT_THAT(c.status().message(), HasSubstr("g3.json: " + field)) << extra;
  }
}

// StarCoder2: grouped-query rotary attention as Mistral's, in GPT-style blocks (LayerNorm with bias, a biased
// c_fc/c_proj GELU MLP), a sliding window in every layer, and dropout where its config asks for it.
TEST(DecoderFamilies, Starcoder2HasBiasedLayerNormBlocksAndAWindowEverywhere) {
  ModelConfig c = Preset("starcoder2-15b");
  EXPECT_EQ(c.norm, NormKind::kLayerNorm);
  EXPECT_TRUE(c.norm_bias && c.qkv_bias && c.attn_output_bias && c.mlp_bias);
  EXPECT_FALSE(c.gated_mlp || c.tie_word_embeddings);
  EXPECT_EQ(c.activation, ActivationKind::kGeluTanh);
  EXPECT_EQ(c.num_kv_heads, 4);
  EXPECT_EQ(c.sliding_window, 4096);
  EXPECT_TRUE(c.is_sliding_layer(0) && c.is_sliding_layer(5) && c.is_sliding_layer(39));
  c.num_layers = 1;
  const Graph g = Build(c, {.batch = 1, .seq_len = 16});
  std::map<std::string, std::vector<int64_t>> params;
  for (const Tensor& t : g.tensors()) {
    if (t.role == TensorRole::kParameter) params[t.name] = t.shape;
  }
  EXPECT_EQ(params["model.layers.0.self_attn.k_proj.weight"], (std::vector<int64_t>{4 * 128, 6144}));
  EXPECT_EQ(params["model.layers.0.self_attn.k_proj.bias"], std::vector<int64_t>{4 * 128});
  EXPECT_EQ(params["model.layers.0.self_attn.o_proj.bias"], std::vector<int64_t>{6144});
  EXPECT_EQ(params["model.layers.0.mlp.c_fc.weight"], (std::vector<int64_t>{24576, 6144}));
  EXPECT_EQ(params["model.layers.0.mlp.c_proj.bias"], std::vector<int64_t>{6144});
  for (const char* name : {"model.layers.0.input_layernorm.bias", "model.layers.0.post_attention_layernorm.bias",
                           "model.norm.bias", "lm_head.weight"}) {
    EXPECT_TRUE(params.contains(name)) << name;
  }
  EXPECT_FALSE(params.contains("model.layers.0.mlp.gate_proj.weight"));
  EXPECT_EQ(CountOps(g, "model.layers.0.input_layernorm", "layer_norm"), 1);
  EXPECT_EQ(CountOps(g, "model.layers.0.mlp.c_fc.act", "gelu_tanh"), 1);
  EXPECT_EQ(CountOps(g, "", "dropout"), 0);  // the 15B's config has none

  // embedding_dropout, residual_dropout (after each branch) and attention_dropout, as starcoder2-7b's config
  // sets them; with no tie_word_embeddings the lm_head is the embedding (the config class's default).
  absl::StatusOr<ModelConfig> dropped = ParseHfConfig(
      R"({"architectures": ["Starcoder2ForCausalLM"], "hidden_size": 64, "intermediate_size": 256,
          "num_attention_heads": 4, "num_hidden_layers": 1, "vocab_size": 128, "embedding_dropout": 0.1,
          "residual_dropout": 0.1, "attention_dropout": 0.1})",
      "sc2.json");
  ASSERT_TRUE(dropped.ok()) << dropped.status();
  EXPECT_EQ(dropped->num_kv_heads, 2);  // Starcoder2Config's default
  EXPECT_EQ(dropped->sliding_window, 0);
  const Graph d = Build(*dropped, {.batch = 1, .seq_len = 16, .attention = AttentionImpl::kEager});
  EXPECT_EQ(CountOps(d, "model.drop", "dropout"), 1);
  EXPECT_EQ(CountOps(d, "model.layers.0.attn_dropout", "dropout"), 1);
  EXPECT_EQ(CountOps(d, "model.layers.0.mlp_dropout", "dropout"), 1);
  EXPECT_EQ(CountOps(d, "model.layers.0.attn_core.dropout", "dropout"), 1);
  for (const Tensor& t : d.tensors()) EXPECT_NE(t.name, "lm_head.weight");
}

TEST(DecoderFamilies, BadStarcoder2FieldsAreNamed) {
  const std::string base =
      R"({"architectures": ["Starcoder2ForCausalLM"], "hidden_size": 64, "intermediate_size": 256,
          "num_attention_heads": 4, "num_hidden_layers": 2, "vocab_size": 128)";
  for (const auto& [extra, field] : std::vector<std::pair<std::string, std::string>>{
           {R"(, "use_bias": "yes"})", "use_bias"},
           {R"(, "residual_dropout": 1.5})", "residual_dropout"},
           {R"(, "sliding_window": 0})", "sliding_window"},
           {R"(, "norm_epsilon": "1e-5"})", "norm_epsilon"},
           {R"(, "num_key_value_heads": 3})", "num_key_value_heads"},
           {R"(, "hidden_act": "swiglu"})", "hidden_act"}}) {
    absl::StatusOr<ModelConfig> c = ParseHfConfig(base + extra, "sc2.json");
    ASSERT_FALSE(c.ok()) << extra;
    EXPECT_THAT(c.status().message(), HasSubstr("sc2.json: " + field)) << extra;
  }
}

// facebook/opt-350m's config.json: LayerNorm after each residual add and 512-wide embeddings.
constexpr std::string_view kOpt350mConfig = R"({
  "_name_or_path": "facebook/opt-350m", "activation_dropout": 0.0, "activation_function": "relu",
  "architectures": ["OPTForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 2, "do_layer_norm_before": false,
  "dropout": 0.1, "eos_token_id": 2, "ffn_dim": 4096, "hidden_size": 1024, "init_std": 0.02, "layerdrop": 0.0,
  "max_position_embeddings": 2048, "model_type": "opt", "num_attention_heads": 16, "num_hidden_layers": 24,
  "pad_token_id": 1, "prefix": "</s>", "torch_dtype": "float16", "transformers_version": "4.19.2", "use_cache": true,
  "vocab_size": 50272, "word_embed_proj_dim": 512})";

std::map<std::string, std::vector<int64_t>> Params(const Graph& g) {
  std::map<std::string, std::vector<int64_t>> params;
  for (const Tensor& t : g.tensors()) {
    if (t.role == TensorRole::kParameter) params[t.name] = t.shape;
  }
  return params;
}

// OPT: learned positions two rows on, q_proj scaled as its own tensor, out_proj, fc1/ReLU/fc2, LayerNorm with
// bias before each branch, the tied lm_head.
TEST(DecoderFamilies, OptHasOffsetPositionsAndGptStyleBlocks) {
  ModelConfig c = Preset("opt-1.3b");
  EXPECT_EQ(c.norm_placement, NormPlacement::kPre);
  EXPECT_TRUE(c.final_norm && c.tie_word_embeddings && c.qkv_bias && c.mlp_bias);
  EXPECT_EQ(c.activation, ActivationKind::kRelu);
  EXPECT_EQ(c.positions, PositionKind::kLearned);
  EXPECT_EQ(c.word_embed_proj_dim, 2048);
  EXPECT_DOUBLE_EQ(c.hidden_dropout, 0.1);
  c.num_layers = 1;
  // transformers before 4.49 (Note [transformers versions]).
  const TorchRuntime hf446{.transformers = {.major = 4, .minor = 46}};
  const Graph g = Build(c, {.batch = 1, .seq_len = 16, .attention = AttentionImpl::kEager, .runtime = hf446});
  auto params = Params(g);
  EXPECT_EQ(params["model.decoder.embed_positions.weight"], (std::vector<int64_t>{2048 + 2, 2048}));
  EXPECT_EQ(params["model.decoder.embed_tokens.weight"], (std::vector<int64_t>{50272, 2048}));
  for (const char* name : {"model.decoder.layers.0.self_attn.out_proj.bias", "model.decoder.layers.0.fc1.bias",
                           "model.decoder.layers.0.fc2.weight", "model.decoder.layers.0.self_attn_layer_norm.bias",
                           "model.decoder.layers.0.final_layer_norm.bias", "model.decoder.final_layer_norm.weight"}) {
    EXPECT_TRUE(params.contains(name)) << name;
  }
  EXPECT_FALSE(params.contains("lm_head.weight"));
  EXPECT_FALSE(params.contains("model.decoder.project_in.weight"));
  EXPECT_EQ(CountOps(g, "model.decoder.layers.0.self_attn.q_proj.scaling", "scale"), 1);
  EXPECT_EQ(CountOps(g, "model.decoder.layers.0.fc1.act", "relu"), 1);
  EXPECT_EQ(CountOps(g, "", "rotary"), 0);
  EXPECT_EQ(CountOps(g, "model.decoder.layers.0.attn_dropout", "dropout"), 1);
  EXPECT_EQ(CountOps(g, "model.decoder.layers.0.mlp_dropout", "dropout"), 1);
  EXPECT_EQ(CountOps(g, "loss.logits_float", "cast"), 0);  // OPT's loss takes the logits as they are
  // The clamp keeps the masked scores for backward.
  const Op* clamp = FindOp(g, "model.decoder.layers.0.attn_core.clamp");
  ASSERT_NE(clamp, nullptr);
  EXPECT_EQ(clamp->saved, clamp->inputs);
  EXPECT_EQ(g.tensor(clamp->inputs[0]).elements(), 32u * 16 * 16);
  // Softmax in f32 (and a cast back) for f16 scores only.
  for (const auto& [dtype, softmax_dtype, casts] : std::vector<std::tuple<DType, DType, int>>{
           {DType::kF16, DType::kF32, 1}, {DType::kBF16, DType::kBF16, 0}}) {
    const Graph h = Build(c, {.batch = 1, .seq_len = 16, .param_dtype = dtype, .compute_dtype = dtype,
                              .attention = AttentionImpl::kEager, .runtime = hf446});
    const Op* softmax = FindOp(h, "model.decoder.layers.0.attn_core.softmax");
    ASSERT_NE(softmax, nullptr);
    EXPECT_EQ(h.tensor(softmax->outputs[0]).dtype, softmax_dtype) << DTypeName(dtype);
    EXPECT_EQ(CountOps(h, "model.decoder.layers.0.attn_core.probs_cast", "cast"), casts) << DTypeName(dtype);
  }
  // From transformers 4.49 (the default) there is no clamp, and the softmax runs in f32 and is cast back in
  // bf16 too, as Llama's.
  const Graph now = Build(c, {.batch = 1, .seq_len = 16, .param_dtype = DType::kBF16, .compute_dtype = DType::kBF16,
                              .attention = AttentionImpl::kEager});
  EXPECT_EQ(FindOp(now, "model.decoder.layers.0.attn_core.clamp"), nullptr);
  const Op* softmax = FindOp(now, "model.decoder.layers.0.attn_core.softmax");
  ASSERT_NE(softmax, nullptr);
  EXPECT_EQ(now.tensor(softmax->outputs[0]).dtype, DType::kF32);
  EXPECT_EQ(CountOps(now, "model.decoder.layers.0.attn_core.probs_cast", "cast"), 1);
  // Learned positions end at max_position_embeddings.
  absl::StatusOr<Graph> too_long = BuildModelGraph(c, {.batch = 1, .seq_len = 4096});
  ASSERT_FALSE(too_long.ok());
  EXPECT_THAT(too_long.status().message(), HasSubstr("max_position_embeddings (2048)"));
}

// opt-350m: 512-wide embeddings projected in and out, LayerNorm after each residual add, no final LayerNorm.
TEST(DecoderFamilies, Opt350mProjectsItsEmbeddingsAndNormsAfterTheResidual) {
  absl::StatusOr<ModelConfig> c = ParseHfConfig(kOpt350mConfig, "opt-350m/config.json");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->norm_placement, NormPlacement::kPostResidual);
  EXPECT_FALSE(c->final_norm);
  EXPECT_EQ(Build(*c).ParameterCount(), 331'196'416u);  // transformers 4.46.3's OPTForCausalLM
  c->num_layers = 1;
  const Graph g = Build(*c, {.batch = 1, .seq_len = 16});
  auto params = Params(g);
  EXPECT_EQ(params["model.decoder.embed_tokens.weight"], (std::vector<int64_t>{50272, 512}));
  EXPECT_EQ(params["model.decoder.project_in.weight"], (std::vector<int64_t>{1024, 512}));
  EXPECT_EQ(params["model.decoder.project_out.weight"], (std::vector<int64_t>{512, 1024}));
  EXPECT_FALSE(params.contains("model.decoder.final_layer_norm.weight"));
  // The first q projection reads the projected embeddings plus positions; the attention's LayerNorm reads the
  // residual sum.
  const Op* q_proj = FindOp(g, "model.decoder.layers.0.self_attn.q_proj");
  ASSERT_NE(q_proj, nullptr);
  EXPECT_EQ(g.tensor(q_proj->inputs[0]).name, "model.decoder.embed_add.out");
  const Op* norm = FindOp(g, "model.decoder.layers.0.self_attn_layer_norm");
  ASSERT_NE(norm, nullptr);
  EXPECT_EQ(g.tensor(norm->inputs[0]).name, "model.decoder.layers.0.attn_residual.out");
  const Op* head = FindOp(g, "lm_head");
  ASSERT_NE(head, nullptr);
  EXPECT_EQ(g.tensor(head->inputs[0]).name, "model.decoder.project_out.out");
}

TEST(DecoderFamilies, BadOptFieldsAreNamed) {
  const std::string base =
      R"({"architectures": ["OPTForCausalLM"], "hidden_size": 64, "num_attention_heads": 4, "num_hidden_layers": 2,
          "vocab_size": 128)";
  for (const auto& [extra, field] : std::vector<std::pair<std::string, std::string>>{
           {R"(})", "ffn_dim"},
           {R"(, "ffn_dim": 256, "word_embed_proj_dim": 0})", "word_embed_proj_dim"},
           {R"(, "ffn_dim": 256, "do_layer_norm_before": "yes"})", "do_layer_norm_before"},
           {R"(, "ffn_dim": 256, "layer_norm_elementwise_affine": false})", "layer_norm_elementwise_affine"},
           {R"(, "ffn_dim": 256, "dropout": 2})", "dropout"},
           {R"(, "ffn_dim": 256, "activation_function": "swish2"})", "activation_function"},
           {R"(, "ffn_dim": 256, "num_attention_heads": 5})", "num_attention_heads"}}) {
    absl::StatusOr<ModelConfig> c = ParseHfConfig(base + extra, "opt.json");
    ASSERT_FALSE(c.ok()) << extra;
    EXPECT_THAT(c.status().message(), HasSubstr("opt.json: " + field)) << extra;
  }
  // Tensor parallelism names OPT's own field.
  absl::StatusOr<ModelConfig> c = ParseHfConfig(base + R"(, "ffn_dim": 250})", "opt.json");
  ASSERT_TRUE(c.ok()) << c.status();
  absl::StatusOr<Graph> split = BuildModelGraph(*c, {.batch = 1, .seq_len = 8, .tensor_parallel = 4});
  ASSERT_FALSE(split.ok());
  EXPECT_THAT(split.status().message(), HasSubstr("ffn_dim (250)"));
}

// tiiuae/falcon-40b's config.json: new_decoder_architecture with 8 key/value groups.
constexpr std::string_view kFalcon40bConfig = R"({
  "alibi": false, "apply_residual_connection_post_layernorm": false, "architectures": ["FalconForCausalLM"],
  "attention_dropout": 0.0, "bias": false, "bos_token_id": 11, "eos_token_id": 11, "hidden_dropout": 0.0,
  "hidden_size": 8192, "initializer_range": 0.02, "layer_norm_epsilon": 1e-05, "model_type": "falcon",
  "multi_query": true, "new_decoder_architecture": true, "num_attention_heads": 128, "num_hidden_layers": 60,
  "num_kv_heads": 8, "parallel_attn": true, "torch_dtype": "bfloat16", "transformers_version": "4.27.4",
  "use_cache": true, "vocab_size": 65024})";

// Falcon-7B (Note [Falcon]): one key/value head in a fused query_key_value, parallel attention and MLP reading one
// LayerNorm, no biases, the tied lm_head.
TEST(DecoderFamilies, FalconSharesOneKeyValueHeadAndOneNorm) {
  ModelConfig c = Preset("falcon-7b");
  EXPECT_EQ(c.num_kv_heads, 1);
  EXPECT_EQ(c.head_dim, 64);
  EXPECT_EQ(c.intermediate_size, 4 * 4544);
  EXPECT_TRUE(c.parallel_residual && c.tie_word_embeddings);
  EXPECT_EQ(c.branch_norms, 1);
  EXPECT_FALSE(c.qkv_bias || c.mlp_bias || c.kv_broadcast_early);
  EXPECT_EQ(c.positions, PositionKind::kRotary);
  c.num_layers = 1;
  const Graph g = Build(c, {.batch = 2, .seq_len = 16, .attention = AttentionImpl::kEager});
  auto params = Params(g);
  EXPECT_EQ(params["transformer.word_embeddings.weight"], (std::vector<int64_t>{65024, 4544}));
  EXPECT_EQ(params["transformer.h.0.self_attention.query_key_value.weight"], (std::vector<int64_t>{73 * 64, 4544}));
  EXPECT_EQ(params["transformer.h.0.self_attention.dense.weight"], (std::vector<int64_t>{4544, 4544}));
  EXPECT_EQ(params["transformer.h.0.mlp.dense_h_to_4h.weight"], (std::vector<int64_t>{18176, 4544}));
  for (const char* name : {"transformer.h.0.input_layernorm.bias", "transformer.ln_f.bias"}) {
    EXPECT_TRUE(params.contains(name)) << name;
  }
  for (const char* name : {"transformer.h.0.post_attention_layernorm.weight", "transformer.h.0.ln_mlp.weight",
                           "transformer.h.0.self_attention.query_key_value.bias", "lm_head.weight"}) {
    EXPECT_FALSE(params.contains(name)) << name;
  }
  // Both branches read the one LayerNorm's output.
  const Op* qkv = FindOp(g, "transformer.h.0.self_attention.query_key_value");
  const Op* up = FindOp(g, "transformer.h.0.mlp.dense_h_to_4h");
  ASSERT_NE(qkv, nullptr);
  ASSERT_NE(up, nullptr);
  EXPECT_EQ(qkv->inputs[0], up->inputs[0]);
  EXPECT_EQ(g.tensor(up->inputs[0]).name, "transformer.h.0.input_layernorm.out");
  // The key and value heads are indexed out (copies) and broadcast to the 71 query heads for the eager matmuls.
  EXPECT_EQ(CountOps(g, "transformer.h.0.self_attention.query_key_value.k_index", "contiguous"), 1);
  EXPECT_EQ(CountOps(g, "transformer.h.0.attn_core.repeat_k", "repeat_kv"), 1);
  const Op* pv = FindOp(g, "transformer.h.0.attn_core.pv");
  ASSERT_NE(pv, nullptr);
  EXPECT_EQ(g.tensor(pv->inputs[1]).shape, (std::vector<int64_t>{2, 71, 16, 64}));
  // mlp_output += attention_output in place; no dropout anywhere at the config's zeros; the loss reads the logits.
  const Op* sum = FindOp(g, "transformer.h.0.branch_add");
  ASSERT_NE(sum, nullptr);
  EXPECT_TRUE(sum->inplace);
  EXPECT_EQ(CountOps(g, "", "dropout"), 0);
  EXPECT_EQ(CountOps(g, "loss.logits_float", "cast"), 0);
}

// Falcon-40B's new_decoder_architecture: 8 groups of 16 queries, a key and a value, broadcast to every head before
// the rotary embedding; ln_attn and ln_mlp, both before attention.
TEST(DecoderFamilies, FalconNewArchitectureGroupsHeadsAndNormsEachBranch) {
  absl::StatusOr<ModelConfig> c = ParseHfConfig(kFalcon40bConfig, "falcon-40b/config.json");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->num_kv_heads, 8);
  EXPECT_EQ(c->branch_norms, 2);
  EXPECT_TRUE(c->kv_broadcast_early);
  // transformers 4.46.3's FalconForCausalLM from this config (41.3 B), the lm_head tied.
  EXPECT_EQ(Build(*c).ParameterCount(), 41'303'293'952u);
  c->num_layers = 1;
  const Graph g = Build(*c, {.batch = 1, .seq_len = 16, .attention = AttentionImpl::kEager});
  auto params = Params(g);
  EXPECT_EQ(params["transformer.h.0.self_attention.query_key_value.weight"],
            (std::vector<int64_t>{(128 + 2 * 8) * 64, 8192}));
  EXPECT_TRUE(params.contains("transformer.h.0.ln_attn.weight"));
  EXPECT_TRUE(params.contains("transformer.h.0.ln_mlp.bias"));
  EXPECT_FALSE(params.contains("transformer.h.0.input_layernorm.weight"));
  int ln_mlp = -1, qkv = -1, broadcast = -1, rotary_k = -1;
  for (size_t i = 0; i < g.ops().size(); ++i) {
    const std::string& name = g.ops()[i].name;
    if (name == "transformer.h.0.ln_mlp") ln_mlp = static_cast<int>(i);
    if (name == "transformer.h.0.self_attention.query_key_value") qkv = static_cast<int>(i);
    if (name == "transformer.h.0.self_attention.query_key_value.k_broadcast") broadcast = static_cast<int>(i);
    if (name == "transformer.h.0.rotary_k") rotary_k = static_cast<int>(i);
  }
  EXPECT_TRUE(ln_mlp >= 0 && ln_mlp < qkv);
  EXPECT_TRUE(broadcast > qkv && broadcast < rotary_k);
  EXPECT_EQ(CountOps(g, "transformer.h.0.attn_core.repeat_k", "repeat_kv"), 0);  // already at every head
  const Op* up = FindOp(g, "transformer.h.0.mlp.dense_h_to_4h");
  ASSERT_NE(up, nullptr);
  EXPECT_EQ(g.tensor(up->inputs[0]).name, "transformer.h.0.ln_mlp.out");
  // Falcon2-11B's layout: the new architecture with one norm for both branches (num_ln_in_parallel_attn 1),
  // an ffn_hidden_size and an untied head: 78,208 parameters in transformers 4.46.3 at this size.
  absl::StatusOr<ModelConfig> one_norm = ParseHfConfig(
      R"({"architectures": ["FalconForCausalLM"], "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 8,
          "num_kv_heads": 2, "vocab_size": 256, "new_decoder_architecture": true, "num_ln_in_parallel_attn": 1,
          "ffn_hidden_size": 96, "tie_word_embeddings": false})",
      "falcon2.json");
  ASSERT_TRUE(one_norm.ok()) << one_norm.status();
  EXPECT_EQ(one_norm->branch_norms, 1);
  const Graph small = Build(*one_norm);
  EXPECT_EQ(small.ParameterCount(), 78'208u);
  EXPECT_TRUE(Params(small).contains("transformer.h.1.input_layernorm.weight"));
}

// Without parallel_attn Falcon is a sequential pre-norm block whose attention branch drops out with
// attention_dropout (the probabilities do not); without multi_query every head has its own key and value.
TEST(DecoderFamilies, FalconSequentialBlocksDropTheAttentionBranch) {
  absl::StatusOr<ModelConfig> c = ParseHfConfig(
      R"({"architectures": ["FalconForCausalLM"], "model_type": "falcon", "hidden_size": 64, "num_hidden_layers": 2,
          "num_attention_heads": 4, "vocab_size": 256, "multi_query": false, "parallel_attn": false, "bias": true,
          "attention_dropout": 0.1, "hidden_dropout": 0.2})",
      "falcon-seq.json");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->num_kv_heads, 4);
  EXPECT_FALSE(c->parallel_residual);
  const Graph g = Build(*c, {.batch = 1, .seq_len = 16, .attention = AttentionImpl::kEager});
  EXPECT_EQ(g.ParameterCount(), 116'480u);  // transformers 4.46.3's FalconForCausalLM at this size
  auto params = Params(g);
  EXPECT_TRUE(params.contains("transformer.h.0.post_attention_layernorm.weight"));
  EXPECT_TRUE(params.contains("transformer.h.0.self_attention.query_key_value.bias"));
  EXPECT_TRUE(params.contains("transformer.h.0.mlp.dense_4h_to_h.bias"));
  EXPECT_EQ(CountOps(g, "transformer.h.0.attn_core.dropout", "dropout"), 0);
  EXPECT_EQ(CountOps(g, "transformer.h.0.attn_core.repeat_k", "repeat_kv"), 0);
  EXPECT_EQ(CountOps(g, "transformer.h.0.attn_core.v_fold", "contiguous"), 1);
  const Op* attn_dropout = FindOp(g, "transformer.h.0.attn_dropout");
  const Op* mlp_dropout = FindOp(g, "transformer.h.0.mlp_dropout");
  ASSERT_NE(attn_dropout, nullptr);
  ASSERT_NE(mlp_dropout, nullptr);
  const Op* norm = FindOp(g, "transformer.h.0.post_attention_layernorm");
  ASSERT_NE(norm, nullptr);
  EXPECT_EQ(g.tensor(norm->inputs[0]).name, "transformer.h.0.attn_residual.out");
}

TEST(DecoderFamilies, BadFalconFieldsAreNamed) {
  const std::string base =
      R"({"architectures": ["FalconForCausalLM"], "num_hidden_layers": 2, "num_attention_heads": 4,
          "vocab_size": 128)";
  for (const auto& [extra, field] : std::vector<std::pair<std::string, std::string>>{
           {R"(})", "hidden_size"},
           {R"(, "hidden_size": 64, "alibi": true})", "alibi"},
           {R"(, "hidden_size": 64, "new_decoder_architecture": true, "num_kv_heads": 3})", "num_kv_heads"},
           {R"(, "hidden_size": 64, "new_decoder_architecture": true, "parallel_attn": false})", "parallel_attn"},
           {R"(, "hidden_size": 64, "num_ln_in_parallel_attn": 3})", "num_ln_in_parallel_attn"},
           {R"(, "hidden_size": 64, "num_ln_in_parallel_attn": 2})", "num_ln_in_parallel_attn"},
           {R"(, "hidden_size": 64, "ffn_hidden_size": 0})", "ffn_hidden_size"},
           {R"(, "hidden_size": 64, "bias": "no"})", "bias"},
           {R"(, "hidden_size": 64, "hidden_dropout": 1})", "hidden_dropout"},
           {R"(, "hidden_size": 66})", "num_attention_heads"}}) {
    absl::StatusOr<ModelConfig> c = ParseHfConfig(base + extra, "falcon.json");
    ASSERT_FALSE(c.ok()) << extra;
    EXPECT_THAT(c.status().message(), HasSubstr("falcon.json: " + field)) << extra;
  }
  // Tensor parallelism cannot split Falcon-7B's one key/value head.
  absl::StatusOr<ModelConfig> c = ParseHfConfig(base + R"(, "hidden_size": 64})", "falcon.json");
  ASSERT_TRUE(c.ok()) << c.status();
  absl::StatusOr<Graph> split = BuildModelGraph(*c, {.batch = 1, .seq_len = 8, .tensor_parallel = 2});
  ASSERT_FALSE(split.ok());
  EXPECT_THAT(split.status().message(), HasSubstr("multi_query (1)"));
}

// GPT-J (Note [GPT-J]): parallel attention and MLP from one ln_1, rotary over the first 64 of each head's 256
// features with a sin/cos table in every layer, whose copies the rotations save; an untied, biased lm_head.
TEST(DecoderFamilies, GptjRotatesPartOfEachHeadWithTablesInEveryLayer) {
  ModelConfig c = Preset("gpt-j-6b");
  EXPECT_EQ(c.rotary_dim, 64);
  EXPECT_EQ(c.head_dim, 256);
  EXPECT_EQ(c.max_position_embeddings, 2048);
  EXPECT_TRUE(c.parallel_residual && c.lm_head_bias && c.mlp_bias);
  EXPECT_EQ(c.branch_norms, 1);
  EXPECT_FALSE(c.tie_word_embeddings || c.qkv_bias || c.attn_output_bias);
  EXPECT_EQ(c.activation, ActivationKind::kGeluNew);
  c.num_layers = 1;
  const Graph g = Build(c, {.batch = 2, .seq_len = 16, .attention = AttentionImpl::kEager});
  auto params = Params(g);
  EXPECT_EQ(params["transformer.h.0.attn.q_proj.weight"], (std::vector<int64_t>{4096, 4096}));
  EXPECT_EQ(params["transformer.h.0.mlp.fc_in.weight"], (std::vector<int64_t>{16384, 4096}));
  EXPECT_EQ(params["lm_head.bias"], std::vector<int64_t>{50400});
  for (const char* name : {"transformer.wte.weight", "transformer.h.0.ln_1.bias", "transformer.h.0.mlp.fc_out.bias",
                           "transformer.ln_f.weight", "lm_head.weight"}) {
    EXPECT_TRUE(params.contains(name)) << name;
  }
  for (const char* name : {"transformer.h.0.ln_2.weight", "transformer.h.0.attn.q_proj.bias",
                           "transformer.h.0.attn.out_proj.bias", "transformer.wpe.weight"}) {
    EXPECT_FALSE(params.contains(name)) << name;
  }
  // Each layer keeps its own f32 table; each rotation multiplies by fresh [1, s, 1, 64] f32 copies and saves them.
  const Tensor* table = nullptr;
  for (const Tensor& t : g.tensors()) {
    if (t.name == "transformer.h.0.attn.embed_positions") table = &t;
  }
  ASSERT_NE(table, nullptr);
  EXPECT_EQ(table->role, TensorRole::kBuffer);
  EXPECT_EQ(table->shape, (std::vector<int64_t>{2048, 64}));
  for (const char* name : {"transformer.h.0.rotary_q.mul_cos", "transformer.h.0.rotary_q.mul_sin",
                           "transformer.h.0.rotary_k.mul_cos", "transformer.h.0.rotary_k.mul_sin"}) {
    const Op* mul = FindOp(g, name);
    ASSERT_NE(mul, nullptr) << name;
    ASSERT_EQ(mul->saved.size(), 1u) << name;
    EXPECT_EQ(g.tensor(mul->saved[0]).shape, (std::vector<int64_t>{1, 16, 1, 64})) << name;
    EXPECT_EQ(g.tensor(mul->saved[0]).dtype, DType::kF32) << name;
  }
  EXPECT_EQ(CountOps(g, "", "rotary"), 0);
  // Both branches read ln_1; the loss reads the logits cast to f32.
  const Op* q = FindOp(g, "transformer.h.0.attn.q_proj");
  const Op* up = FindOp(g, "transformer.h.0.mlp.fc_in");
  ASSERT_NE(q, nullptr);
  ASSERT_NE(up, nullptr);
  EXPECT_EQ(q->inputs[0], up->inputs[0]);
  // In bf16 the f32 tables promote the rotated queries and keys to f32, and the loss reads f32 logits.
  const Graph half = Build(c, {.batch = 2, .seq_len = 16, .param_dtype = DType::kBF16, .compute_dtype = DType::kBF16,
                               .attention = AttentionImpl::kEager});
  const Op* qk = FindOp(half, "transformer.h.0.attn_core.qk");
  ASSERT_NE(qk, nullptr);
  EXPECT_EQ(half.tensor(qk->inputs[0]).dtype, DType::kF32);
  EXPECT_EQ(half.tensor(qk->inputs[1]).dtype, DType::kF32);
  EXPECT_EQ(CountOps(half, "loss.logits_float", "cast"), 1);
  // Positions past n_positions have no row in the table.
  absl::StatusOr<Graph> too_long = BuildModelGraph(c, {.batch = 1, .seq_len = 4096});
  ASSERT_FALSE(too_long.ok());
  EXPECT_THAT(too_long.status().message(), HasSubstr("n_positions (2048)"));
}

TEST(DecoderFamilies, BadGptjFieldsAreNamed) {
  const std::string base = R"({"architectures": ["GPTJForCausalLM"], "n_layer": 2, "vocab_size": 128)";
  for (const auto& [extra, field] : std::vector<std::pair<std::string, std::string>>{
           {R"(, "n_head": 4})", "n_embd"},
           {R"(, "n_embd": 64, "n_head": 4, "rotary_dim": null})", "rotary_dim"},
           {R"(, "n_embd": 64, "n_head": 4, "rotary_dim": 32})", "rotary_dim"},
           {R"(, "n_embd": 64, "n_head": 4, "rotary_dim": 7})", "rotary_dim"},
           {R"(, "n_embd": 64, "n_head": 4})", "rotary_dim"},  // GPTJConfig's 64 exceeds the head size, 16
           {R"(, "n_embd": 64, "n_head": 5, "rotary_dim": 8})", "n_head"},
           {R"(, "n_embd": 64, "n_head": 4, "rotary_dim": 8, "resid_pdrop": 1})", "resid_pdrop"},
           {R"(, "n_embd": 64, "n_head": 4, "rotary_dim": 8, "activation_function": "swiglu"})",
            "activation_function"}}) {
    absl::StatusOr<ModelConfig> c = ParseHfConfig(base + extra, "gptj.json");
    ASSERT_FALSE(c.ok()) << extra;
    EXPECT_THAT(c.status().message(), HasSubstr("gptj.json: " + field)) << extra;
  }
  absl::StatusOr<ModelConfig> defaults =
      ParseHfConfig(R"({"model_type": "gptj", "n_embd": 64, "n_head": 4, "n_layer": 2, "vocab_size": 128,
                        "rotary_dim": 8})", "gptj.json");
  ASSERT_TRUE(defaults.ok()) << defaults.status();
  EXPECT_EQ(defaults->architecture, "GPTJForCausalLM");
  EXPECT_EQ(defaults->intermediate_size, 256);  // n_inner absent: 4 x n_embd
  EXPECT_EQ(defaults->max_position_embeddings, 2048);
}

// GPTBigCode (Note [GPTBigCode]): SantaCoder's multi-query c_attn; before transformers 4.54 the eager attention
// folds the 16 query heads into the rows of one matmul against the single key, saving a copy of the queries and
// c_attn's output, no repeated keys. From 4.54 it repeats the key (Note [transformers versions]).
TEST(DecoderFamilies, GptBigCodeFoldsQueryHeadsAgainstOneKey) {
  ModelConfig c = Preset("santacoder");
  EXPECT_EQ(c.num_kv_heads, 1);
  EXPECT_EQ(c.head_dim, 128);
  EXPECT_EQ(c.intermediate_size, 8192);
  EXPECT_EQ(c.activation, ActivationKind::kGeluTanh);
  EXPECT_TRUE(c.tie_word_embeddings && c.attention_softmax_f32 && c.qkv_bias && c.mlp_bias);
  EXPECT_DOUBLE_EQ(c.attention_dropout, 0.1);
  c.num_layers = 1;
  const TorchRuntime hf446{.transformers = {.major = 4, .minor = 46}};
  const Graph g = Build(c, {.batch = 2, .seq_len = 16, .attention = AttentionImpl::kEager, .runtime = hf446});
  auto params = Params(g);
  EXPECT_EQ(params["transformer.h.0.attn.c_attn.weight"], (std::vector<int64_t>{2048 + 2 * 128, 2048}));
  EXPECT_EQ(params["transformer.h.0.attn.c_attn.bias"], std::vector<int64_t>{2048 + 2 * 128});
  EXPECT_EQ(params["transformer.wpe.weight"], (std::vector<int64_t>{2048, 2048}));
  for (const char* name : {"transformer.h.0.ln_2.bias", "transformer.h.0.mlp.c_fc.bias",
                           "transformer.h.0.attn.c_proj.weight", "transformer.ln_f.weight"}) {
    EXPECT_TRUE(params.contains(name)) << name;
  }
  EXPECT_FALSE(params.contains("lm_head.weight"));
  bool mask = false;
  for (const Tensor& t : g.tensors()) {
    mask = mask || (t.name == "transformer.bias" && t.role == TensorRole::kBuffer && t.dtype == DType::kBool);
  }
  EXPECT_TRUE(mask);
  EXPECT_EQ(CountOps(g, "", "repeat_kv"), 0);
  const Op* qk = FindOp(g, "transformer.h.0.attn_core.qk");
  ASSERT_NE(qk, nullptr);
  EXPECT_EQ(g.tensor(qk->outputs[0]).shape, (std::vector<int64_t>{2, 16 * 16, 16}));
  std::set<std::string> saved;
  for (TensorId t : qk->saved) {
    const Tensor& tensor = g.tensor(t);
    saved.insert(g.tensor(tensor.view_of == kNone ? t : tensor.view_of).name);
  }
  EXPECT_EQ(saved, (std::set<std::string>{"transformer.h.0.attn_core.q_fold.out", "transformer.h.0.attn.c_attn.out"}));
  EXPECT_EQ(CountOps(g, "transformer.h.0.attn_core.dropout", "dropout"), 1);
  {
    // transformers 4.54 on (the default): a copy of the queries against the key repeated for every head.
    const Graph now = Build(c, {.batch = 2, .seq_len = 16, .attention = AttentionImpl::kEager});
    const Op* now_qk = FindOp(now, "transformer.h.0.attn_core.qk");
    ASSERT_NE(now_qk, nullptr);
    std::set<std::string> now_saved;
    for (TensorId t : now_qk->saved) now_saved.insert(now.tensor(t).name);
    EXPECT_EQ(now_saved, (std::set<std::string>{"transformer.h.0.attn_core.q_fold.out",
                                                "transformer.h.0.attn_core.repeat_k.out"}));
    EXPECT_EQ(now.tensor(now_qk->outputs[0]).shape, (std::vector<int64_t>{2, 16, 16, 16}));
  }
  EXPECT_EQ(CountOps(g, "loss.logits_float", "cast"), 0);
  // In bf16 the softmax runs in f32 and its probabilities are cast back.
  const Graph half = Build(c, {.batch = 2, .seq_len = 16, .param_dtype = DType::kBF16, .compute_dtype = DType::kBF16,
                               .attention = AttentionImpl::kEager});
  const Op* softmax = FindOp(half, "transformer.h.0.attn_core.softmax");
  ASSERT_NE(softmax, nullptr);
  EXPECT_EQ(half.tensor(softmax->outputs[0]).dtype, DType::kF32);
  EXPECT_EQ(CountOps(half, "transformer.h.0.attn_core.probs_cast", "cast"), 1);
  // Without multi_query every head has its own key and value.
  absl::StatusOr<ModelConfig> mha = ParseHfConfig(
      R"({"architectures": ["GPTBigCodeForCausalLM"], "n_embd": 64, "n_head": 4, "n_layer": 1, "n_positions": 64,
          "vocab_size": 128, "multi_query": false})",
      "bigcode.json");
  ASSERT_TRUE(mha.ok()) << mha.status();
  const Graph h = Build(*mha, {.batch = 1, .seq_len = 8, .attention = AttentionImpl::kEager});
  EXPECT_EQ(Params(h)["transformer.h.0.attn.c_attn.weight"], (std::vector<int64_t>{3 * 64, 64}));
  EXPECT_EQ(CountOps(h, "transformer.h.0.attn_core.q_fold", "contiguous"), 0);
}

TEST(DecoderFamilies, BadGptBigCodeFieldsAreNamed) {
  const std::string base = R"({"architectures": ["GPTBigCodeForCausalLM"], "n_embd": 64, "n_layer": 2,
                               "vocab_size": 128)";
  for (const auto& [extra, field] : std::vector<std::pair<std::string, std::string>>{
           {R"(, "n_head": 4})", "n_positions"},
           {R"(, "n_head": 4, "n_positions": 64, "multi_query": "yes"})", "multi_query"},
           {R"(, "n_head": 4, "n_positions": 64, "attn_pdrop": 1.5})", "attn_pdrop"},
           {R"(, "n_head": 4, "n_positions": 64, "attention_softmax_in_fp32": 1})", "attention_softmax_in_fp32"},
           {R"(, "n_head": 5, "n_positions": 64})", "n_head"}}) {
    absl::StatusOr<ModelConfig> c = ParseHfConfig(base + extra, "bigcode.json");
    ASSERT_FALSE(c.ok()) << extra;
    EXPECT_THAT(c.status().message(), HasSubstr("bigcode.json: " + field)) << extra;
  }
  absl::StatusOr<ModelConfig> c = ParseHfConfig(base + R"(, "n_head": 4, "n_positions": 64})", "bigcode.json");
  ASSERT_TRUE(c.ok()) << c.status();
  absl::StatusOr<Graph> split = BuildModelGraph(*c, {.batch = 1, .seq_len = 8, .tensor_parallel = 2});
  ASSERT_FALSE(split.ok());
  EXPECT_THAT(split.status().message(), HasSubstr("multi_query (1)"));
  absl::StatusOr<Graph> too_long = BuildModelGraph(*c, {.batch = 1, .seq_len = 128});
  ASSERT_FALSE(too_long.ok());
  EXPECT_THAT(too_long.status().message(), HasSubstr("n_positions (64)"));
}

// Bloom (Note [Bloom]): no position embeddings, ALiBi biases built once and added inside each layer's baddbmm, a
// LayerNorm on the embeddings, the softmax in f32.
TEST(DecoderFamilies, BloomBiasesItsScoresWithAlibi) {
  ModelConfig c = Preset("bloom-560m");
  EXPECT_EQ(c.positions, PositionKind::kAlibi);
  EXPECT_TRUE(c.embedding_norm && c.tie_word_embeddings && c.qkv_bias && c.attn_output_bias && c.mlp_bias);
  EXPECT_FALSE(c.residual_from_norm);
  EXPECT_EQ(c.intermediate_size, 4096);
  EXPECT_EQ(c.head_dim, 64);
  EXPECT_EQ(c.activation, ActivationKind::kGeluTanh);
  c.num_layers = 1;
  const Graph g = Build(c, {.batch = 2, .seq_len = 16, .attention = AttentionImpl::kEager});
  auto params = Params(g);
  EXPECT_EQ(params["transformer.word_embeddings.weight"], (std::vector<int64_t>{250880, 1024}));
  EXPECT_EQ(params["transformer.h.0.self_attention.query_key_value.weight"], (std::vector<int64_t>{3072, 1024}));
  EXPECT_EQ(params["transformer.h.0.mlp.dense_h_to_4h.weight"], (std::vector<int64_t>{4096, 1024}));
  for (const char* name : {"transformer.word_embeddings_layernorm.bias", "transformer.h.0.input_layernorm.weight",
                           "transformer.h.0.post_attention_layernorm.bias",
                           "transformer.h.0.self_attention.query_key_value.bias",
                           "transformer.h.0.self_attention.dense.bias", "transformer.ln_f.weight"}) {
    EXPECT_TRUE(params.contains(name)) << name;
  }
  EXPECT_FALSE(params.contains("lm_head.weight"));
  for (const auto& [name, shape] : params) EXPECT_EQ(name.find("position"), std::string::npos) << name;
  // The biases: [batch x heads, 1, seq], made before the layers, an input of the layer's baddbmm, never saved.
  const Op* alibi = FindOp(g, "transformer.alibi");
  ASSERT_NE(alibi, nullptr);
  EXPECT_EQ(alibi->layer, -1);
  EXPECT_EQ(g.tensor(alibi->outputs[0]).shape, (std::vector<int64_t>{2 * 16, 1, 16}));
  const Op* qk = FindOp(g, "transformer.h.0.attn_core.qk");
  ASSERT_NE(qk, nullptr);
  EXPECT_EQ(qk->kind, "baddbmm");
  EXPECT_THAT(qk->inputs, ::testing::Contains(alibi->outputs[0]));
  EXPECT_THAT(qk->saved, ::testing::Not(::testing::Contains(alibi->outputs[0])));
  EXPECT_EQ(g.tensor(qk->outputs[0]).shape, (std::vector<int64_t>{2, 16, 16, 16}));
  EXPECT_EQ(CountOps(g, "", "rotary"), 0);
  const Op* embed_norm = FindOp(g, "transformer.word_embeddings_layernorm");
  ASSERT_NE(embed_norm, nullptr);
  EXPECT_EQ(g.tensor(embed_norm->inputs[0]).name, "transformer.embed.out");
  // The softmax runs in f32 and is cast back to bf16.
  const Graph half = Build(c, {.batch = 2, .seq_len = 16, .param_dtype = DType::kBF16, .compute_dtype = DType::kBF16,
                               .attention = AttentionImpl::kEager});
  const Op* softmax = FindOp(half, "transformer.h.0.attn_core.softmax");
  ASSERT_NE(softmax, nullptr);
  EXPECT_EQ(half.tensor(softmax->outputs[0]).dtype, DType::kF32);
  EXPECT_EQ(CountOps(half, "transformer.h.0.attn_core.probs_cast", "cast"), 1);
  // No position table ends the sequence.
  EXPECT_TRUE(BuildModelGraph(c, {.batch = 1, .seq_len = 8192}).ok());
}

// Older Bloom configs name the sizes n_embed and num_attention_heads (BloomConfig maps both); with
// apply_residual_connection_post_layernorm each branch adds to its norm's output.
TEST(DecoderFamilies, BloomReadsEitherSpellingAndResidualsFromTheNorm) {
  absl::StatusOr<ModelConfig> old = ParseHfConfig(
      R"({"architectures": ["BloomForCausalLM"], "model_type": "bloom", "n_embed": 1024, "n_layer": 24,
          "num_attention_heads": 16, "vocab_size": 250880, "apply_residual_connection_post_layernorm": false})",
      "bloom-old.json");
  ASSERT_TRUE(old.ok()) << old.status();
  EXPECT_EQ(Build(*old).ParameterCount(), 559'214'592u);  // bloom-560m's count
  absl::StatusOr<ModelConfig> c = ParseHfConfig(
      R"({"model_type": "bloom", "hidden_size": 64, "n_layer": 1, "n_head": 4, "vocab_size": 128,
          "apply_residual_connection_post_layernorm": true, "hidden_dropout": 0.1, "attention_dropout": 0.1})",
      "bloom.json");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->architecture, "BloomForCausalLM");
  EXPECT_TRUE(c->residual_from_norm);
  const Graph g = Build(*c, {.batch = 1, .seq_len = 8, .attention = AttentionImpl::kEager});
  const Op* attn_residual = FindOp(g, "transformer.h.0.attn_residual");
  const Op* mlp_residual = FindOp(g, "transformer.h.0.mlp_residual");
  ASSERT_NE(attn_residual, nullptr);
  ASSERT_NE(mlp_residual, nullptr);
  EXPECT_EQ(g.tensor(attn_residual->inputs[0]).name, "transformer.h.0.input_layernorm.out");
  EXPECT_EQ(g.tensor(mlp_residual->inputs[0]).name, "transformer.h.0.post_attention_layernorm.out");
  EXPECT_EQ(CountOps(g, "transformer.h.0.attn_core.dropout", "dropout"), 1);
  EXPECT_EQ(CountOps(g, "transformer.h.0.mlp_dropout", "dropout"), 1);
}

TEST(DecoderFamilies, BadBloomFieldsAreNamed) {
  const std::string base = R"({"architectures": ["BloomForCausalLM"], "n_layer": 2)";
  for (const auto& [extra, field] : std::vector<std::pair<std::string, std::string>>{
           {R"(, "hidden_size": 64, "n_head": 4})", "vocab_size"},
           {R"(, "vocab_size": 128, "n_head": 4})", "hidden_size"},
           {R"(, "vocab_size": 128, "hidden_size": 64, "n_head": 5})", "n_head: 5 does not divide hidden_size"},
           {R"(, "vocab_size": 128, "n_embed": 64, "num_attention_heads": 5})",
            "num_attention_heads: 5 does not divide n_embed"},
           {R"(, "vocab_size": 128, "hidden_size": 64, "n_head": 4, "slow_but_exact": true, "pretraining_tp": 4})",
            "slow_but_exact"},
           {R"(, "vocab_size": 128, "hidden_size": 64, "n_head": 4, "hidden_dropout": 2})", "hidden_dropout"},
           {R"(, "vocab_size": 128, "hidden_size": 64, "n_head": 4, "apply_residual_connection_post_layernorm": 1})",
            "apply_residual_connection_post_layernorm"}}) {
    absl::StatusOr<ModelConfig> c = ParseHfConfig(base + extra, "bloom.json");
    ASSERT_FALSE(c.ok()) << extra;
    EXPECT_THAT(c.status().message(), HasSubstr("bloom.json: " + field)) << extra;
  }
}

}  // namespace
}  // namespace headroom

// Mamba (Note [Mamba] in models/builders/state_space.cc): the preset's parameter count, the config's defaults
// and errors, what one step of the sequential scan keeps for backward, and what inference does not.
#include <string>
#include <utility>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "models/builders.h"
#include "models/model_config.h"
#include "models/model_source.h"
#include "tests/models/model_test_util.h"

namespace headroom {
namespace {

using ::headroom::testing::Build;
using ::headroom::testing::CountOps;
using ::headroom::testing::FindOp;
using ::headroom::testing::FindTensor;
using ::headroom::testing::Preset;
using ::testing::HasSubstr;

constexpr char kTiny[] = R"({"architectures": ["MambaForCausalLM"], "model_type": "mamba", "hidden_size": 64,
    "num_hidden_layers": 2, "vocab_size": 512, "state_size": 16, "expand": 2, "conv_kernel": 4})";

ModelConfig Tiny() {
  absl::StatusOr<ModelConfig> c = ParseHfConfig(kTiny, "mamba.json");
  EXPECT_TRUE(c.ok()) << c.status();
  return c.ok() ? *c : ModelConfig{};
}

// transformers 4.46.3's MambaForCausalLM built from data/models/mamba-2.8b.json (state-spaces/mamba-2.8b-hf's
// config.json) on the meta device, summing p.numel() over model.parameters(): the head is tied to the
// embeddings and counted once. 64 layers of 41,244,160 plus 50280 x 2560 embeddings and norm_f.
TEST(StateSpace, Mamba28bCountsAsTransformers) {
  const ModelConfig c = Preset("mamba-2.8b");
  EXPECT_EQ(c.family, ModelFamily::kStateSpace);
  EXPECT_EQ(c.intermediate_size, 5120);
  EXPECT_EQ(c.time_step_rank, 160);
  EXPECT_TRUE(c.tie_word_embeddings);
  const Graph g = Build(c, {.batch = 1, .seq_len = 4});
  EXPECT_EQ(g.ParameterCount(), 2'768'345'600u);
  const Tensor* a_log = FindTensor(g, "backbone.layers.63.mixer.A_log");
  ASSERT_NE(a_log, nullptr);
  EXPECT_EQ(a_log->shape, (std::vector<int64_t>{5120, 16}));
  const Tensor* conv = FindTensor(g, "backbone.layers.0.mixer.conv1d.weight");
  ASSERT_NE(conv, nullptr);
  EXPECT_EQ(conv->shape, (std::vector<int64_t>{5120, 1, 4}));
  EXPECT_EQ(FindTensor(g, "lm_head.weight"), nullptr);  // tied
  EXPECT_EQ(FindTensor(g, "backbone.layers.0.mixer.in_proj.bias"), nullptr);  // use_bias false
}

// MambaConfig's defaults: intermediate_size = int(expand x hidden_size), time_step_rank "auto" =
// ceil(hidden_size / 16), state_size 16, conv_kernel 4, a tied head, residual_in_fp32.
TEST(StateSpace, DefaultsFollowMambaConfig) {
  absl::StatusOr<ModelConfig> c = ParseHfConfig(
      R"({"model_type": "mamba", "hidden_size": 100, "num_hidden_layers": 3, "vocab_size": 256, "expand": 1.5,
          "time_step_rank": "auto"})",
      "mamba.json");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->architecture, "MambaForCausalLM");
  EXPECT_EQ(c->intermediate_size, 150);
  EXPECT_EQ(c->time_step_rank, 7);
  EXPECT_EQ(c->ssm_state_size, 16);
  EXPECT_EQ(c->conv_kernel, 4);
  EXPECT_TRUE(c->tie_word_embeddings);
  EXPECT_TRUE(c->residual_in_fp32);
  EXPECT_TRUE(c->conv_bias);
}

TEST(StateSpace, MalformedConfigsNameTheField) {
  const std::string base = R"({"architectures": ["MambaForCausalLM"], "num_hidden_layers": 2, "vocab_size": 128)";
  for (const auto& [extra, field] : std::vector<std::pair<std::string, std::string>>{
           {"}", "hidden_size"},
           {R"(, "hidden_size": 32, "state_size": 0})", "state_size"},
           {R"(, "hidden_size": 32, "conv_kernel": -1})", "conv_kernel"},
           {R"(, "hidden_size": 32, "expand": -2})", "expand"},
           {R"(, "hidden_size": 32, "time_step_rank": "fast"})", "time_step_rank"},
           {R"(, "hidden_size": 32, "time_step_rank": 0})", "time_step_rank"},
           {R"(, "hidden_size": 32, "hidden_act": "swoosh"})", "hidden_act"},
           {R"(, "hidden_size": 32, "use_mambapy": true})", "use_mambapy"},
           {R"(, "hidden_size": 32, "residual_in_fp32": "yes"})", "residual_in_fp32"},
           {R"(, "hidden_size": 32, "intermediate_size": 0})", "intermediate_size"},
           // in_proj would hold 2^48 elements (Note [Model size bounds]).
           {R"(, "hidden_size": 65536, "intermediate_size": 2147483648})", "hidden_size x 2 x intermediate_size"}}) {
    absl::StatusOr<ModelConfig> c = ParseHfConfig(base + extra, "mamba.json");
    ASSERT_FALSE(c.ok()) << extra;
    EXPECT_THAT(c.status().message(), HasSubstr("mamba.json: " + field)) << extra << ": " << c.status();
  }
  absl::StatusOr<ModelConfig> layers = ParseHfConfig(R"({"architectures": ["MambaForCausalLM"], "hidden_size": 32,
      "vocab_size": 128})", "mamba.json");
  ASSERT_FALSE(layers.ok());
  EXPECT_THAT(layers.status().message(), HasSubstr("num_hidden_layers"));
}

// Note [Mamba]: one selective_scan op per layer whose saved states have the bytes of the Python loop's
// seq_len states [b, i, n] f32; deltaA and deltaB [b, i, s, n] f32 are saved too.
TEST(StateSpace, TrainingSavesEveryStepsStateInOneOp) {
  const ModelConfig c = Tiny();
  const Graph g = Build(c, {.batch = 2, .seq_len = 32});
  EXPECT_EQ(CountOps(g, "backbone.layers.0.", "selective_scan"), 1);
  EXPECT_EQ(CountOps(g, "backbone.layers.1.", "selective_scan"), 1);
  const Op* scan = FindOp(g, "backbone.layers.0.mixer.scan");
  ASSERT_NE(scan, nullptr);
  std::vector<std::vector<int64_t>> saved;
  for (TensorId t : scan->saved) saved.push_back(g.tensor(t).shape);
  EXPECT_THAT(saved, ::testing::Contains(std::vector<int64_t>{2, 128, 32, 16}));  // the states and deltaA
  EXPECT_THAT(saved, ::testing::Contains(std::vector<int64_t>{2, 128, 16}));      // the zero initial state
  const Op* delta_b_u = FindOp(g, "backbone.layers.0.mixer.deltaB_u");
  ASSERT_NE(delta_b_u, nullptr);
  ASSERT_EQ(delta_b_u->saved.size(), 2u);  // deltaB, and u's f32 view
  const Op* conv = FindOp(g, "backbone.layers.0.mixer.conv1d");
  ASSERT_NE(conv, nullptr);
  EXPECT_EQ(g.tensor(conv->outputs[0]).shape, (std::vector<int64_t>{2, 128, 35}));  // s + conv_kernel - 1
  // Pure bf16: the loop's matmul reads a bf16 copy of each state, which autograd keeps as well.
  const Graph bf16 = Build(c, {.batch = 2, .seq_len = 32, .param_dtype = DType::kBF16,
                               .compute_dtype = DType::kBF16});
  const Op* scan16 = FindOp(bf16, "backbone.layers.1.mixer.scan");
  ASSERT_NE(scan16, nullptr);
  int copies = 0;
  for (TensorId t : scan16->saved) copies += bf16.tensor(t).dtype == DType::kBF16 && bf16.tensor(t).shape.size() == 4;
  EXPECT_EQ(copies, 1);
  // ... and not the last f32 state, which no later step's multiply reads.
  std::vector<std::vector<int64_t>> f32_saved;
  for (TensorId t : scan16->saved) {
    if (bf16.tensor(t).dtype == DType::kF32) f32_saved.push_back(bf16.tensor(t).shape);
  }
  EXPECT_THAT(f32_saved, ::testing::Contains(std::vector<int64_t>{2, 128, 31, 16}));
}

// Inference keeps no step states: the last state comes out of the scan for the cache.
TEST(StateSpace, InferenceKeepsOnlyTheLastState) {
  const Graph g = Build(Tiny(), {.batch = 2, .seq_len = 32, .training = false});
  const Op* scan = FindOp(g, "backbone.layers.0.mixer.scan");
  ASSERT_NE(scan, nullptr);
  ASSERT_EQ(scan->outputs.size(), 2u);
  EXPECT_EQ(g.tensor(scan->outputs[1]).shape, (std::vector<int64_t>{2, 128, 16}));
  EXPECT_EQ(FindOp(g, "loss"), nullptr);
}

TEST(StateSpace, UnmodelledOptionsAreRefused) {
  const ModelConfig c = Tiny();
  absl::StatusOr<Graph> tp = BuildModelGraph(c, {.batch = 1, .seq_len = 8, .tensor_parallel = 2});
  ASSERT_FALSE(tp.ok());
  EXPECT_THAT(tp.status().message(), HasSubstr("tensor_parallel"));
  absl::StatusOr<Graph> lora = BuildModelGraph(c, {.batch = 1, .seq_len = 8, .lora = {.rank = 8}});
  ASSERT_FALSE(lora.ok());
  EXPECT_THAT(lora.status().message(), HasSubstr("LoRA"));
  absl::StatusOr<Graph> empty = BuildModelGraph(c, {.batch = 1, .seq_len = 0});
  ASSERT_FALSE(empty.ok());
  EXPECT_THAT(empty.status().message(), HasSubstr("seq_len"));
}

}  // namespace
}  // namespace headroom

// The chain the chain-dp strategy plans over: its invariants, the synthetic
// generator, and the chain measured from a GPT-2 forward graph against the
// step the step builder derives (Note [Chain memory model]).
#include "planner/chain.h"

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "common/units.h"
#include "gmock/gmock.h"
#include "graph/liveness.h"
#include "graph/training_step.h"
#include "gtest/gtest.h"
#include "models/builders.h"
#include "models/model_source.h"
#include "planner/chain_dp.h"
#include "planner/checkpoint_mode_plan.h"

namespace headroom {
namespace {

using ::testing::HasSubstr;

constexpr int64_t kSeq = 256;
constexpr int64_t kBatch = 2;

Graph Gpt2(AttentionImpl attention = AttentionImpl::kEager) {
  absl::StatusOr<ModelConfig> config = LoadPresetConfig("gpt2");
  EXPECT_TRUE(config.ok()) << config.status();
  // Korthikanti et al. count one GeLU kernel saving its input (Megatron's); Hugging Face's
  // gelu_new keeps four tensors more (Note [gelu_new] in models/builders.cc).
  config->activation = ActivationKind::kGeluTanh;
  absl::StatusOr<Graph> forward = BuildModelGraph(
      *config, {.batch = kBatch, .seq_len = kSeq, .param_dtype = DType::kBF16, .compute_dtype = DType::kBF16,
                .attention = attention});
  EXPECT_TRUE(forward.ok()) << forward.status();
  return *std::move(forward);
}

// FLOPs as the cost: any non-negative figure per op will do here.
std::vector<double> FlopCosts(const Graph& g) {
  std::vector<double> cost;
  for (const Op& op : g.ops()) cost.push_back(op.flops);
  return cost;
}

uint64_t MeasuredPeak(const Graph& forward, const CheckpointPlan& plan) {
  absl::StatusOr<Graph> step = BuildTrainingStep(forward, {.checkpoint = plan});
  EXPECT_TRUE(step.ok()) << step.status();
  return ProfileMemory(*step).peak_bytes;
}

TEST(Chain, ValidateNamesTheStageAndField) {
  auto error = [](Chain chain) { return std::string(chain.Validate().message()); };
  EXPECT_THAT(error({}), HasSubstr("no stages"));
  const ChainStage ok{.forward_cost = 1, .input_bytes = 2, .all_bytes = 10, .backward_bytes = 1};
  EXPECT_TRUE(Chain{.stages = {ok}}.Validate().ok());
  ChainStage s = ok;
  s.forward_cost = -1;
  EXPECT_THAT(error({.stages = {ok, s}}), HasSubstr("chain stage 1: forward_cost -1"));
  s = ok;
  s.selective_cost = std::numeric_limits<double>::quiet_NaN();
  EXPECT_THAT(error({.stages = {s}}), HasSubstr("selective_cost nan"));
  s = ok;
  s.input_bytes = 11;
  EXPECT_THAT(error({.stages = {s}}), HasSubstr("input_bytes 11 exceeds all_bytes 10"));
  s = ok;
  s.has_attention_core = true;
  s.selective_bytes = 12;
  EXPECT_THAT(error({.stages = {s}}), HasSubstr("selective_bytes 12 exceeds all_bytes 10"));
  // Without a core the selective figures are ignored.
  s.has_attention_core = false;
  EXPECT_TRUE(Chain{.stages = {s}}.Validate().ok());
  s = ok;
  s.backward_bytes = uint64_t{1} << 61;
  EXPECT_THAT(error({.stages = {s, s}}), HasSubstr("chain stage 1: the chain's byte figures"));
}

TEST(Chain, RandomChainIsValidHeterogeneousAndReproducible) {
  const Chain chain = RandomChain(200, 3);
  ASSERT_TRUE(chain.Validate().ok()) << chain.Validate();
  EXPECT_EQ(chain.num_stages(), 200);
  EXPECT_EQ(chain, RandomChain(200, 3));
  EXPECT_NE(chain, RandomChain(200, 4));
  int cores = 0;
  for (const ChainStage& s : chain.stages) {
    cores += s.has_attention_core ? 1 : 0;
    for (uint64_t bytes : {s.input_bytes, s.all_bytes, s.selective_bytes, s.backward_bytes}) {
      EXPECT_EQ(bytes % kMiB, 0u);
    }
    EXPECT_EQ(s.forward_cost, std::floor(s.forward_cost));
    EXPECT_EQ(s.selective_cost, std::floor(s.selective_cost));
    EXPECT_EQ(s.boundary_cost, std::floor(s.boundary_cost));
  }
  EXPECT_GT(cores, 50);
  EXPECT_LT(cores, 150);
  EXPECT_EQ(RandomChain(0, 1).num_stages(), 1);
}

// Korthikanti et al. 2022's per-layer figures (tests/graph/activation_memory_test.cc)
// come out as the stages' bytes, and the model's peak of keeping everything
// is the measured one.
TEST(Chain, ExtractGpt2Layers) {
  const Graph forward = Gpt2();
  absl::StatusOr<Chain> chain = ExtractLayerChain(forward, FlopCosts(forward));
  ASSERT_TRUE(chain.ok()) << chain.status();
  ASSERT_EQ(chain->num_stages(), 12);
  constexpr double s = kSeq, b = kBatch, h = 768, a = 12;
  constexpr double kNormStats = 16 * s * b;
  for (const ChainStage& stage : chain->stages) {
    EXPECT_TRUE(stage.has_attention_core);
    EXPECT_EQ(static_cast<double>(stage.input_bytes), 2 * s * b * h);
    EXPECT_EQ(static_cast<double>(stage.all_bytes), s * b * h * (34 + 5 * a * s / h) + kNormStats);
    EXPECT_EQ(static_cast<double>(stage.selective_bytes), s * b * h * 34 + kNormStats);
    EXPECT_GT(stage.selective_cost, 0);
    EXPECT_LT(stage.selective_cost, stage.forward_cost);
  }
  // The costs are the layer's op costs: a layer replayed alone skips the
  // residual add making its output (the boundary), and the attention core's
  // replay skips probs @ V, whose output the projection after the core saves.
  double layer0 = 0, last = 0, core = 0, pv = 0;
  for (const Op& op : forward.ops()) {
    if (op.layer != 0) continue;
    layer0 += op.flops;
    last = op.flops;
    core += op.attention_core ? op.flops : 0;
    if (op.attention_core && op.name.ends_with(".pv")) pv = op.flops;
  }
  EXPECT_DOUBLE_EQ(chain->stages[0].forward_cost + chain->stages[0].boundary_cost, layer0);
  EXPECT_DOUBLE_EQ(chain->stages[0].boundary_cost, last);
  EXPECT_GT(pv, 0);
  EXPECT_DOUBLE_EQ(chain->stages[0].selective_cost, core - pv);

  const uint64_t all = MeasuredPeak(forward, *PlanForMode(forward, CheckpointMode::kOff));
  EXPECT_EQ(UniformChainPlan(*chain, StageChoice::kKeepAll).predicted_peak, all);
  // So are those of the other uniform plans: GPT-2's identical layers peak
  // where the model puts them (see also chain_dp_test.cc).
  EXPECT_EQ(UniformChainPlan(*chain, StageChoice::kCheckpoint).predicted_peak,
            MeasuredPeak(forward, *PlanForMode(forward, CheckpointMode::kFull)));
  EXPECT_EQ(UniformChainPlan(*chain, StageChoice::kSelective).predicted_peak,
            MeasuredPeak(forward, *PlanForMode(forward, CheckpointMode::kSelective)));
}

TEST(Chain, ExtractFlashAttentionHasNoCore) {
  const Graph forward = Gpt2(AttentionImpl::kFlash);
  absl::StatusOr<Chain> chain = ExtractLayerChain(forward, FlopCosts(forward));
  ASSERT_TRUE(chain.ok()) << chain.status();
  for (const ChainStage& stage : chain->stages) {
    EXPECT_FALSE(stage.has_attention_core);
    EXPECT_EQ(stage.selective_cost, 0);
  }
}

TEST(Chain, ExtractRefusesWhatIsNotALayerChain) {
  const Graph forward = Gpt2();
  std::vector<double> cost = FlopCosts(forward);
  EXPECT_THAT(ExtractLayerChain(forward, std::span(cost).first(3)).status().message(),
              HasSubstr("op_cost has 3 entries"));
  cost[5] = -1;
  EXPECT_THAT(ExtractLayerChain(forward, cost).status().message(),
              HasSubstr(absl::StrFormat("op_cost of op '%s' is -1", forward.op(5).name)));

  // Layers out of program order, and a graph without layers.
  Graph g("two");
  TensorId x = g.AddTensor({.name = "x", .shape = {4}, .role = TensorRole::kInput});
  TensorId w = g.AddTensor({.name = "w", .shape = {4}, .role = TensorRole::kParameter});
  TensorId y = g.AddTensor({.name = "y", .shape = {4}});
  TensorId z = g.AddTensor({.name = "z", .shape = {4}});
  TensorId loss = g.AddTensor({.name = "loss", .shape = {}});
  g.AddOp({.kind = "mul", .name = "second", .inputs = {x, w}, .outputs = {y}, .saved = {x, w}, .layer = 1});
  g.AddOp({.kind = "mul", .name = "first", .inputs = {y, w}, .outputs = {z}, .saved = {y, w}, .layer = 0});
  g.AddOp({.kind = "sum", .name = "loss", .inputs = {z}, .outputs = {loss}, .phase = Phase::kLoss});
  const std::vector<double> three(3, 1.0);
  EXPECT_THAT(ExtractLayerChain(g, three).status().message(), HasSubstr("op 'first' of layer 0 runs after layer 1"));
  Graph flat("flat");
  x = flat.AddTensor({.name = "x", .shape = {4}, .role = TensorRole::kInput});
  loss = flat.AddTensor({.name = "loss", .shape = {}});
  flat.AddOp({.kind = "sum", .name = "loss", .inputs = {x}, .outputs = {loss}, .phase = Phase::kLoss});
  EXPECT_THAT(ExtractLayerChain(flat, std::vector<double>{1.0}).status().message(), HasSubstr("has no layers"));

  // A step that replays already has a plan; its chain would count replays as layers.
  absl::StatusOr<Graph> checkpointed =
      BuildTrainingStep(forward, {.checkpoint = *PlanForMode(forward, CheckpointMode::kFull)});
  ASSERT_TRUE(checkpointed.ok()) << checkpointed.status();
  EXPECT_THAT(ExtractLayerChain(*checkpointed, std::vector<double>(checkpointed->num_ops(), 1.0)).status().message(),
              HasSubstr("is a replay; ExtractLayerChain expects a step with nothing checkpointed"));
}

// The planner's problems hold a step (PlanProblem::step): its chain is its
// forward graph's, and with gradient accumulation (a "gradient_buffers" op
// first, shifting every op id) the costs still land on their layers.
TEST(Chain, ExtractFromAStep) {
  const Graph forward = Gpt2();
  absl::StatusOr<Chain> from_forward = ExtractLayerChain(forward, FlopCosts(forward));
  ASSERT_TRUE(from_forward.ok()) << from_forward.status();
  absl::StatusOr<Graph> step = BuildTrainingStep(forward, {});
  ASSERT_TRUE(step.ok()) << step.status();
  absl::StatusOr<Chain> from_step = ExtractLayerChain(*step, FlopCosts(*step));
  ASSERT_TRUE(from_step.ok()) << from_step.status();
  EXPECT_EQ(*from_step, *from_forward);

  absl::StatusOr<Graph> accumulating = BuildTrainingStep(forward, {.gradients_preexist = true});
  ASSERT_TRUE(accumulating.ok()) << accumulating.status();
  ASSERT_EQ(accumulating->op(0).kind, "gradient_buffers");
  absl::StatusOr<Chain> chain = ExtractLayerChain(*accumulating, FlopCosts(*accumulating));
  ASSERT_TRUE(chain.ok()) << chain.status();
  for (size_t i = 0; i < chain->stages.size(); ++i) {
    EXPECT_EQ(chain->stages[i].forward_cost, from_forward->stages[i].forward_cost);
    EXPECT_EQ(chain->stages[i].all_bytes, from_forward->stages[i].all_bytes);
  }
  // Every parameter gradient lives from the start, so the model's peak of
  // keeping everything is still the measured one.
  EXPECT_EQ(UniformChainPlan(*chain, StageChoice::kKeepAll).predicted_peak, ProfileMemory(*accumulating).peak_bytes);
}

}  // namespace
}  // namespace headroom

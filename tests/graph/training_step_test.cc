// Backward derivation, the step schedule and checkpointing on hand-built
// graphs whose peaks are worked out by hand in the comments.
#include "graph/training_step.h"

#include <algorithm>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "graph/autograd.h"
#include "graph/liveness.h"
#include "graph/ops.h"
#include "planner/checkpoint_mode_plan.h"
#include "gtest/gtest.h"

namespace headroom {
namespace {

using ::testing::HasSubstr;

TensorId Find(const Graph& g, const std::string& name) {
  for (const Tensor& t : g.tensors()) {
    if (t.name == name) return t.id;
  }
  ADD_FAILURE() << "no tensor " << name;
  return kNone;
}

// x[4,8] -> linear1(W1[16,8]) -> h[4,16] -> relu -> a -> linear2(W2[4,16]) -> y[4,4]
// -> mse_loss(y, target) -> loss. All f32.
struct Mlp {
  Graph g{"mlp"};
  TensorId x, target, w1, w2, h, a, y, loss;
  Mlp() {
    x = g.AddTensor({.name = "x", .shape = {4, 8}, .role = TensorRole::kInput});
    target = g.AddTensor({.name = "target", .shape = {4, 4}, .role = TensorRole::kInput});
    w1 = g.AddTensor({.name = "w1", .shape = {16, 8}, .role = TensorRole::kParameter, .layer = 0});
    w2 = g.AddTensor({.name = "w2", .shape = {4, 16}, .role = TensorRole::kParameter, .layer = 0});
    h = g.AddTensor({.name = "h", .shape = {4, 16}, .layer = 0});
    a = g.AddTensor({.name = "a", .shape = {4, 16}, .layer = 0});
    y = g.AddTensor({.name = "y", .shape = {4, 4}, .layer = 0});
    loss = g.AddTensor({.name = "loss", .shape = {}});
    g.AddOp({.kind = "linear", .name = "fc1", .inputs = {x, w1}, .outputs = {h}, .saved = {x},
              .flops = 2.0 * 4 * 8 * 16, .layer = 0});
    g.AddOp({.kind = "relu", .name = "relu", .inputs = {h}, .outputs = {a}, .saved = {a},
              .flops = 64, .layer = 0});
    g.AddOp({.kind = "linear", .name = "fc2", .inputs = {a, w2}, .outputs = {y}, .saved = {a},
              .flops = 2.0 * 4 * 16 * 4, .layer = 0});
    g.AddOp({.kind = "mse_loss", .name = "loss", .inputs = {y, target}, .outputs = {loss},
              .saved = {y, target}, .flops = 48, .phase = Phase::kLoss});
  }
};

TEST(TrainingStep, MlpScheduleAndExactPeak) {
  Mlp m;
  absl::StatusOr<Graph> step = BuildTrainingStep(m.g, {});
  ASSERT_TRUE(step.ok()) << step.status();
  ASSERT_TRUE(step->Validate().ok()) << step->Validate();
  // 4 forward/loss ops, 4 backward ops, 2 optimizer ops.
  ASSERT_EQ(step->num_ops(), 10u);
  EXPECT_EQ(step->op(4).kind, "mse_loss_backward");
  EXPECT_EQ(step->op(5).kind, "linear_backward");
  EXPECT_EQ(step->op(6).kind, "relu_backward");
  EXPECT_EQ(step->op(7).kind, "linear_backward");
  EXPECT_EQ(step->op(8).phase, Phase::kOptimizer);
  EXPECT_EQ(step->op(5).forward_of, 2);
  // fc1 has a trainable weight but x needs no gradient: one GEMM (grad W1).
  EXPECT_DOUBLE_EQ(step->op(7).flops, 2.0 * 4 * 8 * 16);
  // fc2: grad a and grad W2, two GEMMs.
  EXPECT_DOUBLE_EQ(step->op(5).flops, 2 * 2.0 * 4 * 16 * 4);
  const TensorId w1_grad = Find(*step, "w1.grad");
  EXPECT_EQ(step->tensor(w1_grad).grad_of, m.w1);
  EXPECT_EQ(step->tensor(w1_grad).role, TensorRole::kGradient);

  // Lifetimes (op index ranges), bytes: x 128 + target 64 live throughout;
  // h 256 [0,1]; a 256 [1,6]; y 64 [2,4]; loss 4 [3,3]; y.grad 64 [4,5];
  // a.grad 256 [5,6]; w2.grad 256 [5,9]; h.grad 256 [6,7]; w1.grad 512 [7,8].
  // Live per op: 448 704 512 516 576 1024 1216 1216 960 448.
  const MemoryProfile p = ProfileMemory(*step);
  const std::vector<uint64_t> expected = {448, 704, 512, 516, 576, 1024, 1216, 1216, 960, 448};
  EXPECT_EQ(p.live_bytes, expected);
  EXPECT_EQ(p.peak_bytes, 1216u);
  EXPECT_EQ(p.peak_op, 6);
  EXPECT_EQ(p.bytes_by_role_at_peak.at(TensorRole::kInput), 192u);
  EXPECT_EQ(p.bytes_by_role_at_peak.at(TensorRole::kActivation), 256u);
  EXPECT_EQ(p.bytes_by_role_at_peak.at(TensorRole::kGradient), 768u);
  EXPECT_EQ(p.parameter_gradient_bytes_at_peak, 256u);
  EXPECT_EQ(p.activation_gradient_bytes_at_peak, 512u);
  ASSERT_GE(p.live_at_peak.size(), 2u);
  EXPECT_EQ(step->tensor(p.live_at_peak[0]).name, "a");  // 256 B ties break by id
  EXPECT_EQ(p.bytes_at_end_of_forward, 192u + 256 + 64);
  ASSERT_EQ(p.saved_bytes_by_layer.size(), 1u);
  EXPECT_EQ(p.saved_bytes_by_layer[0], 256u);  // a, freed by relu_backward
  EXPECT_EQ(p.saved_bytes_outside_layers, 64u);  // y, freed by the loss backward
  EXPECT_EQ(p.peak_bytes_by_phase.at(Phase::kForward), 704u);

  // Without parameter gradients in the count the peak moves.
  const MemoryProfile q = ProfileMemory(*step, {.count_parameter_gradients = false});
  EXPECT_EQ(q.peak_bytes, 960u);  // op 6: 192 + a + a.grad + h.grad
  EXPECT_EQ(q.parameter_gradient_bytes_at_peak, 0u);
}

// Note [Training loop]: a loop that holds the model's output keeps y alive through
// backward and the optimizer step; one that drops it frees y after its last backward reader.
TEST(TrainingStep, AHeldOutputLivesUntilTheStepEnds) {
  Mlp m;
  absl::StatusOr<Graph> dropped = BuildTrainingStep(m.g, {});
  absl::StatusOr<Graph> held = BuildTrainingStep(m.g, {.hold_model_outputs = true});
  ASSERT_TRUE(dropped.ok() && held.ok());
  ASSERT_EQ(held->num_ops(), dropped->num_ops() + 1);
  const Op& release = held->ops().back();
  EXPECT_EQ(release.kind, "release_outputs");
  EXPECT_EQ(release.phase, Phase::kOptimizer);
  EXPECT_EQ(release.inputs, std::vector<TensorId>{m.y});
  const std::vector<TensorLifetime> held_life = ComputeLifetimes(*held);
  const std::vector<TensorLifetime> dropped_life = ComputeLifetimes(*dropped);
  EXPECT_EQ(held_life[static_cast<size_t>(m.y)].last, static_cast<OpId>(held->num_ops() - 1));
  EXPECT_LT(dropped_life[static_cast<size_t>(m.y)].last, 6);  // freed by the loss's backward
}

// Note [Autocast weight cache]: x[4,8] bf16 -> fc1(cast(w1)) -> h -> fc2(cast(w2)) -> y -> loss,
// the whole layer one checkpoint segment, w2 frozen. The 16-bit copy of the trainable w1 lives
// until "autocast_exit" after the loss; the frozen w2's copy is not cached and dies at fc2.
TEST(TrainingStep, AutocastCacheHoldsTrainableWeightCopiesUntilTheLossIsDone) {
  Graph g("autocast");
  const TensorId x = g.AddTensor({.name = "x", .shape = {4, 8}, .dtype = DType::kBF16, .role = TensorRole::kInput});
  const TensorId target =
      g.AddTensor({.name = "target", .shape = {4, 4}, .dtype = DType::kBF16, .role = TensorRole::kInput});
  const TensorId w1 = g.AddTensor({.name = "w1", .shape = {16, 8}, .role = TensorRole::kParameter, .layer = 0});
  const TensorId w2 = g.AddTensor(
      {.name = "w2", .shape = {4, 16}, .role = TensorRole::kParameter, .layer = 0, .trainable = false});
  const TensorId c1 = g.AddTensor({.name = "w1_cast", .shape = {16, 8}, .dtype = DType::kBF16, .layer = 0});
  const TensorId c2 = g.AddTensor({.name = "w2_cast", .shape = {4, 16}, .dtype = DType::kBF16, .layer = 0});
  const TensorId h = g.AddTensor({.name = "h", .shape = {4, 16}, .dtype = DType::kBF16, .layer = 0});
  const TensorId y = g.AddTensor({.name = "y", .shape = {4, 4}, .dtype = DType::kBF16, .layer = 0});
  const TensorId loss = g.AddTensor({.name = "loss", .shape = {}});
  g.AddOp({.kind = "cast", .name = "w1_cast", .inputs = {w1}, .outputs = {c1}, .layer = 0});
  g.AddOp({.kind = "linear", .name = "fc1", .inputs = {x, c1}, .outputs = {h}, .saved = {x}, .layer = 0});
  g.AddOp({.kind = "cast", .name = "w2_cast", .inputs = {w2}, .outputs = {c2}, .layer = 0});
  g.AddOp({.kind = "linear", .name = "fc2", .inputs = {h, c2}, .outputs = {y}, .saved = {c2}, .layer = 0});
  g.AddOp({.kind = "mse_loss", .name = "loss", .inputs = {y, target}, .outputs = {loss}, .saved = {y, target},
           .phase = Phase::kLoss});
  const CheckpointPlan whole_layer{.segment_of_op = {0, 0, 0, 0, kNone}};

  absl::StatusOr<Graph> uncached = BuildTrainingStep(g, {.checkpoint = whole_layer});
  absl::StatusOr<Graph> cached = BuildTrainingStep(g, {.checkpoint = whole_layer, .autocast_weight_cache = true});
  ASSERT_TRUE(uncached.ok()) << uncached.status();
  ASSERT_TRUE(cached.ok()) << cached.status();
  ASSERT_EQ(cached->num_ops(), uncached->num_ops() + 1);
  const Op& exit = cached->op(5);  // right after the loss, before any backward op
  EXPECT_EQ(exit.kind, "autocast_exit");
  EXPECT_EQ(exit.phase, Phase::kLoss);
  EXPECT_EQ(exit.inputs, std::vector<TensorId>{c1});
  EXPECT_EQ(cached->op(6).phase, Phase::kBackward);
  EXPECT_TRUE(IsHoldOp(exit));

  const std::vector<TensorLifetime> with = ComputeLifetimes(*cached);
  const std::vector<TensorLifetime> without = ComputeLifetimes(*uncached);
  EXPECT_EQ(without[static_cast<size_t>(c1)].last, 1);  // fc1; the replay makes its own copy
  EXPECT_EQ(with[static_cast<size_t>(c1)].last, 5);
  EXPECT_EQ(with[static_cast<size_t>(c2)].last, without[static_cast<size_t>(c2)].last);
  // The copy is no saved tensor: the checkpointed layer still keeps only its input.
  EXPECT_EQ(ProfileMemory(*cached).saved_bytes_by_layer, ProfileMemory(*uncached).saved_bytes_by_layer);
}

TEST(TrainingStep, FrozenWeightsNeitherGetGradientsNorKeepInputs) {
  Mlp m;
  m.g.mutable_tensor(m.w1).trainable = false;
  absl::StatusOr<Graph> step = BuildTrainingStep(m.g, {});
  ASSERT_TRUE(step.ok()) << step.status();
  // fc1: nothing upstream needs a gradient, so no backward op reads x or makes w1.grad.
  for (const Op& op : step->ops()) EXPECT_NE(op.name, "fc1.backward");
  for (const Tensor& t : step->tensors()) EXPECT_NE(t.name, "w1.grad");
  // h.grad is not needed either: relu's backward is skipped as well.
  for (const Tensor& t : step->tensors()) EXPECT_NE(t.name, "h.grad");
  // Freeze w2 instead: fc2 still backpropagates to a but does not read a for
  // it (mm's backward needs only w2 for grad a); relu still saves a.
  Mlp n;
  n.g.mutable_tensor(n.w2).trainable = false;
  std::vector<bool> rg = RequiresGrad(n.g);
  EXPECT_FALSE(BackwardReadsSaved(n.g, n.g.op(2), n.a, rg));
  EXPECT_TRUE(BackwardReadsSaved(n.g, n.g.op(0), n.x, rg));
}

// x -> linear(w) twice (two consumers of x and of w).
Graph SharedWeight() {
  Graph g("shared");
  TensorId x = g.AddTensor({.name = "x", .shape = {4}, .role = TensorRole::kInput});
  TensorId w = g.AddTensor({.name = "w", .shape = {4, 4}, .role = TensorRole::kParameter});
  TensorId y1 = g.AddTensor({.name = "y1", .shape = {4}});
  TensorId y2 = g.AddTensor({.name = "y2", .shape = {4}});
  TensorId s = g.AddTensor({.name = "s", .shape = {4}});
  TensorId loss = g.AddTensor({.name = "loss", .shape = {}});
  g.AddOp({.kind = "linear", .name = "l1", .inputs = {x, w}, .outputs = {y1}, .saved = {x}});
  g.AddOp({.kind = "linear", .name = "l2", .inputs = {y1, w}, .outputs = {y2}, .saved = {y1, w}});
  g.AddOp({.kind = "add", .name = "res", .inputs = {y1, y2}, .outputs = {s}});
  g.AddOp({.kind = "sum", .name = "loss", .inputs = {s}, .outputs = {loss}, .phase = Phase::kLoss});
  return g;
}

TEST(TrainingStep, GradientsOfSharedInputsAccumulate) {
  absl::StatusOr<Graph> step = BuildTrainingStep(SharedWeight(), {.optimizer_step = false});
  ASSERT_TRUE(step.ok()) << step.status();
  ASSERT_TRUE(step->Validate().ok()) << step->Validate();
  // Backward: loss, add (aliases s.grad for both y1 and y2), l2, l1.
  const TensorId s_grad = Find(*step, "s.grad");
  const TensorId y1_grad = Find(*step, "y1.grad");
  const TensorId y2_grad = Find(*step, "y2.grad");
  EXPECT_EQ(step->tensor(y1_grad).view_of, s_grad);
  EXPECT_EQ(step->tensor(y2_grad).view_of, s_grad);
  EXPECT_EQ(step->tensor(y1_grad).bytes(), 0u);
  const Op& l2_back = step->op(6);
  EXPECT_EQ(l2_back.name, "l2.backward");
  // l2 contributes to y1.grad (existing): reads it, writes a temporary.
  EXPECT_THAT(l2_back.inputs, ::testing::Contains(y1_grad));
  EXPECT_EQ(step->tensor(l2_back.outputs.front()).role, TensorRole::kTemporary);
  const Op& l1_back = step->op(7);
  EXPECT_EQ(l1_back.name, "l1.backward");
  EXPECT_THAT(l1_back.inputs, ::testing::Contains(Find(*step, "w.grad")));
}

// Note [Gradient accumulation]: a parameter's second contribution and the sum
// are fresh tensors, and the first sum dies at the add; into a .grad that
// exists before the step, the first contribution waits for the second and
// their sum is added in place.
TEST(TrainingStep, AParametersContributionsSumIntoAFreshGradient) {
  absl::StatusOr<Graph> step = BuildTrainingStep(SharedWeight(), {});
  ASSERT_TRUE(step.ok()) << step.status();
  ASSERT_TRUE(step->Validate().ok()) << step->Validate();
  const TensorId w = Find(*step, "w");
  const TensorId first = Find(*step, "w.grad");
  const Op& l1_back = step->op(7);
  ASSERT_EQ(l1_back.name, "l1.backward");
  std::vector<TensorRole> roles;
  for (TensorId out : l1_back.outputs) roles.push_back(step->tensor(out).role);
  EXPECT_THAT(roles, ::testing::ElementsAre(TensorRole::kTemporary, TensorRole::kGradient));
  const TensorId sum = l1_back.outputs.back();
  EXPECT_NE(sum, first);
  EXPECT_EQ(step->tensor(sum).grad_of, w);
  const std::vector<TensorLifetime> life = ComputeLifetimes(*step);
  EXPECT_EQ(life[static_cast<size_t>(first)].last, l1_back.id);
  // The optimizer reads the sum, not the first contribution.
  bool optimizer_reads_sum = false;
  for (const Op& op : step->ops()) {
    if (op.phase != Phase::kOptimizer) continue;
    EXPECT_THAT(op.inputs, ::testing::Not(::testing::Contains(first)));
    optimizer_reads_sum = optimizer_reads_sum || std::ranges::count(op.inputs, sum) > 0;
  }
  EXPECT_TRUE(optimizer_reads_sum);

  absl::StatusOr<Graph> accumulating = BuildTrainingStep(SharedWeight(), {.gradients_preexist = true});
  ASSERT_TRUE(accumulating.ok()) << accumulating.status();
  ASSERT_TRUE(accumulating->Validate().ok()) << accumulating->Validate();
  const Op* first_use = nullptr;  // l2.backward: the first contribution to w's gradient
  const Op* second_use = nullptr;
  for (const Op& op : accumulating->ops()) {
    if (op.phase != Phase::kBackward) continue;
    for (TensorId out : op.outputs) EXPECT_NE(accumulating->tensor(out).grad_of, w) << op.name;
    if (op.name == "l2.backward") first_use = &op;
    if (op.name == "l1.backward") second_use = &op;
  }
  ASSERT_NE(first_use, nullptr);
  ASSERT_NE(second_use, nullptr);
  const TensorId waiting = Find(*accumulating, "w.grad.partial");
  EXPECT_THAT(first_use->outputs, ::testing::Contains(waiting));
  EXPECT_THAT(second_use->inputs, ::testing::Contains(waiting));
  EXPECT_THAT(second_use->outputs, ::testing::Contains(Find(*accumulating, "w.grad.incoming")));
  const std::vector<TensorLifetime> held = ComputeLifetimes(*accumulating);
  EXPECT_EQ(held[static_cast<size_t>(waiting)].first, first_use->id);
  EXPECT_EQ(held[static_cast<size_t>(waiting)].last, second_use->id);
}

TEST(TrainingStep, GradientsPreexistLiveFromTheStart) {
  Mlp m;
  absl::StatusOr<Graph> step = BuildTrainingStep(m.g, {.gradients_preexist = true});
  ASSERT_TRUE(step.ok()) << step.status();
  ASSERT_TRUE(step->Validate().ok()) << step->Validate();
  EXPECT_EQ(step->op(0).kind, "gradient_buffers");
  const MemoryProfile p = ProfileMemory(*step);
  // w1.grad 512 + w2.grad 256 live from op 0 on.
  EXPECT_EQ(p.live_bytes[0], 192u + 768);
}

// Note [Runtime differences]: CUDA's softmax backward writes grad * output
// into a temporary before the gradient; the CPU's writes the gradient only.
TEST(TrainingStep, CudaSoftmaxBackwardHoldsTheProductOfGradientAndOutput) {
  Graph g("softmax");
  OpEmitter e(g, {.compute_dtype = DType::kF32});
  const TensorId w = e.Parameter("w", {8, 16}, DType::kF32);
  const TensorId x = e.Input("x", {4, 8}, DType::kF32);
  const TensorId labels = e.Input("labels", {4}, DType::kI64);
  e.set_phase(Phase::kForward);
  const TensorId probs = e.Softmax("sm", e.Linear("fc", x, w));
  e.set_phase(Phase::kLoss);
  e.CrossEntropy("loss", probs, labels);
  for (bool cuda : {false, true}) {
    absl::StatusOr<Graph> step =
        BuildTrainingStep(g, {.optimizer_step = false, .softmax_backward_holds_product = cuda});
    ASSERT_TRUE(step.ok()) << step.status();
    const auto backward = std::find_if(step->ops().begin(), step->ops().end(),
                                       [](const Op& op) { return op.name == "sm.backward"; });
    ASSERT_NE(backward, step->ops().end());
    std::vector<uint64_t> temporaries;
    for (TensorId out : backward->outputs) {
      if (step->tensor(out).role == TensorRole::kTemporary) temporaries.push_back(step->tensor(out).bytes());
    }
    EXPECT_EQ(temporaries, cuda ? std::vector<uint64_t>{step->tensor(probs).bytes()} : std::vector<uint64_t>{});
  }
}

// transformers' additive mask (OpEmitter::AddMask): its backward hands the
// gradient back, a view of it where the dtypes agree and a cast where the
// sum promoted bf16 scores to f32.
TEST(TrainingStep, AMaskAddHandsItsGradientBack) {
  for (DType scores_dtype : {DType::kF32, DType::kBF16}) {
    SCOPED_TRACE(std::string(DTypeName(scores_dtype)));
    Graph g("mask");
    OpEmitter e(g, {.compute_dtype = scores_dtype});
    const TensorId w = e.Parameter("w", {8, 16}, scores_dtype);
    const TensorId x = e.Input("x", {4, 8}, scores_dtype);
    const TensorId labels = e.Input("labels", {4}, DType::kI64);
    e.set_phase(Phase::kForward);
    const TensorId masked = e.AddMask("mask", e.Linear("fc", x, w), DType::kF32);
    EXPECT_EQ(g.tensor(masked).dtype, DType::kF32);
    e.set_phase(Phase::kLoss);
    e.CrossEntropy("loss", masked, labels);
    absl::StatusOr<Graph> step = BuildTrainingStep(g, {.optimizer_step = false});
    ASSERT_TRUE(step.ok()) << step.status();
    const auto backward = std::find_if(step->ops().begin(), step->ops().end(),
                                       [](const Op& op) { return op.name == "mask.backward"; });
    ASSERT_NE(backward, step->ops().end());
    ASSERT_EQ(backward->outputs.size(), 1u);
    const Tensor& grad = step->tensor(backward->outputs[0]);
    EXPECT_EQ(grad.dtype, scores_dtype);
    EXPECT_EQ(grad.view_of != kNone, scores_dtype == DType::kF32);
  }
}

TEST(TrainingStep, InferenceDropsLossAndKeepsNothing) {
  Mlp m;
  absl::StatusOr<Graph> step = BuildTrainingStep(m.g, {.training = false});
  ASSERT_TRUE(step.ok());
  EXPECT_EQ(step->num_ops(), 3u);
  const MemoryProfile p = ProfileMemory(*step);
  EXPECT_EQ(p.peak_bytes, 192u + 256 + 256);  // x, target, h, a during relu
}

TEST(TrainingStep, RejectsBadInput) {
  Mlp m;
  EXPECT_THAT(PlanForMode(m.g, CheckpointMode::kEveryK, /*every=*/0)
                  .status()
                  .message(),
              HasSubstr("checkpoint_every must be at least 1"));
  Graph no_loss("noloss");
  TensorId x = no_loss.AddTensor({.name = "x", .shape = {4}, .role = TensorRole::kInput});
  TensorId w = no_loss.AddTensor({.name = "w", .shape = {4}, .role = TensorRole::kParameter});
  TensorId y = no_loss.AddTensor({.name = "y", .shape = {4}});
  no_loss.AddOp({.kind = "mul", .name = "m", .inputs = {x, w}, .outputs = {y}});
  EXPECT_THAT(BuildTrainingStep(no_loss, {}).status().message(), HasSubstr("has no loss op"));
  absl::StatusOr<Graph> step = BuildTrainingStep(m.g, {});
  ASSERT_TRUE(step.ok());
  EXPECT_THAT(BuildTrainingStep(*step, {}).status().message(), HasSubstr("expects a forward graph"));
  EXPECT_EQ(*ParseCheckpointMode("Every_K"), CheckpointMode::kEveryK);
  EXPECT_THAT(ParseCheckpointMode("sometimes").status().message(),
              HasSubstr("unknown checkpoint mode 'sometimes'"));
}

// `layers` blocks of: h = linear(x, w) [saves x]; a = gelu(h) [saves h];
// q,k,v projections and an eager attention core when `attention`; output a.
// Dimensions: tokens 8, width 16, f32 (x, h, a: 512 B each).
struct Stack {
  Graph g{"stack"};
  std::vector<TensorId> layer_inputs;
  explicit Stack(int layers, bool attention = false) {
    TensorId x = g.AddTensor({.name = "x", .shape = {8, 16}, .role = TensorRole::kInput});
    for (int l = 0; l < layers; ++l) {
      const std::string p = "l" + std::to_string(l) + ".";
      layer_inputs.push_back(x);
      TensorId w = g.AddTensor({.name = p + "w", .shape = {16, 16}, .role = TensorRole::kParameter, .layer = l});
      TensorId h = g.AddTensor({.name = p + "h", .shape = {8, 16}, .layer = l});
      TensorId a = g.AddTensor({.name = p + "a", .shape = {8, 16}, .layer = l});
      g.AddOp({.kind = "linear", .name = p + "fc", .inputs = {x, w}, .outputs = {h}, .saved = {x},
               .flops = 2.0 * 8 * 16 * 16, .layer = l});
      g.AddOp({.kind = "gelu", .name = p + "gelu", .inputs = {h}, .outputs = {a}, .saved = {h},
               .flops = 8.0 * 128, .layer = l});
      if (attention) {
        TensorId wq = g.AddTensor({.name = p + "wq", .shape = {16, 16}, .role = TensorRole::kParameter, .layer = l});
        TensorId q = g.AddTensor({.name = p + "q", .shape = {8, 16}, .layer = l});
        TensorId scores = g.AddTensor({.name = p + "scores", .shape = {8, 8}, .layer = l});
        TensorId probs = g.AddTensor({.name = p + "probs", .shape = {8, 8}, .layer = l});
        TensorId mask = g.AddTensor({.name = p + "mask", .shape = {8, 8}, .dtype = DType::kU8, .layer = l});
        TensorId dropped = g.AddTensor({.name = p + "dropped", .shape = {8, 8}, .layer = l});
        TensorId ctx = g.AddTensor({.name = p + "ctx", .shape = {8, 16}, .layer = l});
        g.AddOp({.kind = "linear", .name = p + "q_proj", .inputs = {a, wq}, .outputs = {q}, .saved = {a},
                 .flops = 2.0 * 8 * 16 * 16, .layer = l});
        g.AddOp({.kind = "matmul", .name = p + "qk", .inputs = {q, q}, .outputs = {scores},
                 .saved = {q}, .flops = 2.0 * 8 * 8 * 16, .layer = l, .attention_core = true});
        g.AddOp({.kind = "softmax", .name = p + "softmax", .inputs = {scores}, .outputs = {probs},
                 .saved = {probs}, .flops = 5.0 * 64, .layer = l, .attention_core = true});
        g.AddOp({.kind = "dropout", .name = p + "dropout", .inputs = {probs}, .outputs = {dropped, mask},
                 .saved = {mask}, .flops = 64, .layer = l, .attention_core = true});
        g.AddOp({.kind = "matmul", .name = p + "pv", .inputs = {dropped, q}, .outputs = {ctx},
                 .saved = {dropped, q}, .flops = 2.0 * 8 * 8 * 16, .layer = l, .attention_core = true});
        a = ctx;
      }
      x = a;
    }
    TensorId loss = g.AddTensor({.name = "loss", .shape = {}});
    g.AddOp({.kind = "sum", .name = "loss", .inputs = {x}, .outputs = {loss}, .phase = Phase::kLoss});
  }
};

// A named checkpoint mode, planned by the planner (planner/checkpoint_mode_plan.h).
struct ModeOptions {
  CheckpointMode checkpoint = CheckpointMode::kOff;
  int checkpoint_every = 1;
};

StepOptions StepFor(const Graph& forward, ModeOptions mode) {
  absl::StatusOr<CheckpointPlan> plan = PlanForMode(forward, mode.checkpoint, mode.checkpoint_every);
  EXPECT_TRUE(plan.ok()) << plan.status();
  return {.checkpoint = plan.ok() ? *std::move(plan) : CheckpointPlan{}};
}

MemoryProfile Profile(const Graph& forward, ModeOptions mode) {
  absl::StatusOr<Graph> step = BuildTrainingStep(forward, StepFor(forward, mode));
  EXPECT_TRUE(step.ok()) << step.status();
  EXPECT_TRUE(step->Validate().ok()) << step->Validate();
  return ProfileMemory(*step);
}

TEST(Checkpointing, FullKeepsOnlyEachLayersInput) {
  Stack s(4);
  const MemoryProfile none = Profile(s.g, {});
  const MemoryProfile full = Profile(s.g, {.checkpoint = CheckpointMode::kFull});
  // No checkpointing: layer l keeps its input (512 B; layer 0's is the batch,
  // an input) and h (512 B).
  EXPECT_EQ(none.saved_bytes_by_layer, (std::vector<uint64_t>{512, 1024, 1024, 1024}));
  // Full: only the layer input survives forward.
  EXPECT_EQ(full.saved_bytes_by_layer, (std::vector<uint64_t>{0, 512, 512, 512}));
  EXPECT_LT(full.bytes_at_end_of_forward, none.bytes_at_end_of_forward);
  EXPECT_EQ(none.bytes_at_end_of_forward - full.bytes_at_end_of_forward, 4u * 512);

  absl::StatusOr<Graph> step = BuildTrainingStep(s.g, StepFor(s.g, {.checkpoint = CheckpointMode::kFull}));
  ASSERT_TRUE(step.ok());
  int recomputed = 0;
  double recompute_flops = 0;
  for (const Op& op : step->ops()) {
    if (!op.recompute) continue;
    ++recomputed;
    recompute_flops += op.flops;
    EXPECT_EQ(op.phase, Phase::kBackward);
  }
  // gelu's output a is nobody's saved tensor, so only fc is replayed per layer.
  EXPECT_EQ(recomputed, 4);
  EXPECT_DOUBLE_EQ(recompute_flops, 4 * 2.0 * 8 * 16 * 16);
  // Backward of gelu reads the replayed h.
  for (const Op& op : step->ops()) {
    if (op.name == "l2.gelu.backward") {
      EXPECT_THAT(op.inputs, ::testing::Contains(Find(*step, "l2.h@recompute")));
    }
  }
}

TEST(Checkpointing, EveryKKeepsOneInputPerGroup) {
  Stack s(4);
  const MemoryProfile k2 = Profile(s.g, {.checkpoint = CheckpointMode::kEveryK, .checkpoint_every = 2});
  // Groups {0,1} and {2,3}: kept inputs are the batch (uncounted) and layer
  // 2's input, charged to layer 2 whose replay frees it; layer 1's input is
  // recomputed inside group {0,1} and charged to no forward.
  EXPECT_EQ(k2.saved_bytes_by_layer, (std::vector<uint64_t>{0, 0, 512}));
  const MemoryProfile k1 = Profile(s.g, {.checkpoint = CheckpointMode::kEveryK, .checkpoint_every = 1});
  const MemoryProfile full = Profile(s.g, {.checkpoint = CheckpointMode::kFull});
  EXPECT_EQ(k1.live_bytes, full.live_bytes);
}

TEST(Checkpointing, SelectiveDropsOnlyTheAttentionCore) {
  Stack s(2, /*attention=*/true);
  const MemoryProfile none = Profile(s.g, {});
  const MemoryProfile selective = Profile(s.g, {.checkpoint = CheckpointMode::kSelective});
  // Core tensors saved only for the core's own backward: probs (256 B),
  // mask (64 B), dropped (256 B) per layer; q stays (the core's input).
  ASSERT_EQ(none.saved_bytes_by_layer.size(), 2u);
  ASSERT_EQ(selective.saved_bytes_by_layer.size(), 2u);
  for (size_t l = 0; l < 2; ++l) {
    EXPECT_EQ(none.saved_bytes_by_layer[l] - selective.saved_bytes_by_layer[l], 256u + 64 + 256)
        << "layer " << l;
  }
  absl::StatusOr<Graph> step = BuildTrainingStep(s.g, StepFor(s.g, {.checkpoint = CheckpointMode::kSelective}));
  ASSERT_TRUE(step.ok());
  std::vector<std::string> replayed;
  for (const Op& op : step->ops()) {
    if (op.recompute) replayed.push_back(op.name);
  }
  // pv's output (ctx) is saved by nobody inside the core: not replayed.
  EXPECT_EQ(replayed, (std::vector<std::string>{"l1.qk", "l1.softmax", "l1.dropout", "l0.qk",
                                                "l0.softmax", "l0.dropout"}));
  std::vector<int32_t> seg = StepFor(s.g, {.checkpoint = CheckpointMode::kSelective}).checkpoint.segment_of_op;
  EXPECT_EQ(seg[0], kNone);  // l0.fc
  EXPECT_EQ(seg[3], 0);      // l0.qk
  EXPECT_EQ(seg[6], 0);      // l0.pv
}

}  // namespace
}  // namespace headroom

// Stored activations per transformer layer, from G's GPT builder through the
// training step and liveness, against the closed forms of Korthikanti et al.
// 2022, "Reducing Activation Recomputation in Large Transformer Models"
// (arXiv:2205.05198), Section 4 and Table 2. For a GPT-style layer in 16-bit
// with dropout, s tokens, micro-batch b, hidden h, a heads, t-way tensor
// parallelism, the bytes stored per layer are
//   no parallelism              s*b*h*(34 + 5*a*s/h)
//   tensor parallel             s*b*h*(10 + 24/t + 5*a*s/(h*t))
//   tensor + sequence parallel  s*b*h*(34 + 5*a*s/h) / t
//   selective recomputation     s*b*h*34 / t  (t = 1 without parallelism)
//   full recomputation          2*s*b*h       (the layer input only)
// The paper ignores the layer norms' mean and rstd (f32, one value per token
// each, two norms per layer: 16 bytes per token, divided by t under sequence
// parallelism); we add them exactly, since PyTorch saves them.
#include <cstdint>

#include "gtest/gtest.h"
#include "models/builders.h"
#include "graph/liveness.h"
#include "models/model_source.h"
#include "graph/training_step.h"
#include "planner/checkpoint_mode_plan.h"

namespace headroom {
namespace {

constexpr int64_t kSeq = 512;
constexpr int64_t kBatch = 2;

// Saved bytes per layer of a GPT-2 small (h 768, 12 heads, 12 layers) step.
// A named checkpoint mode, planned by the planner (planner/checkpoint_mode_plan.h).
struct ModeOptions {
  CheckpointMode checkpoint = CheckpointMode::kOff;
};

std::vector<uint64_t> SavedPerLayer(ModeOptions mode, int tp = 1, bool sp = false,
                                    AttentionImpl attention = AttentionImpl::kEager) {
  absl::StatusOr<ModelConfig> config = LoadPresetConfig("gpt2");
  EXPECT_TRUE(config.ok()) << config.status();
  // Korthikanti et al. count one GeLU kernel saving its input (Megatron's); Hugging Face's
  // gelu_new keeps four tensors more (Note [gelu_new] in models/builders.cc).
  config->activation = ActivationKind::kGeluTanh;
  absl::StatusOr<Graph> forward = BuildModelGraph(
      *config, {.batch = kBatch, .seq_len = kSeq, .param_dtype = DType::kBF16,
                .compute_dtype = DType::kBF16, .attention = attention, .training = true,
                .tensor_parallel = tp, .sequence_parallel = sp});
  EXPECT_TRUE(forward.ok()) << forward.status();
  absl::StatusOr<CheckpointPlan> plan = PlanForMode(*forward, mode.checkpoint);
  EXPECT_TRUE(plan.ok()) << plan.status();
  absl::StatusOr<Graph> step = BuildTrainingStep(*forward, {.checkpoint = *std::move(plan)});
  EXPECT_TRUE(step.ok()) << step.status();
  EXPECT_TRUE(step->Validate().ok()) << step->Validate();
  const MemoryProfile profile = ProfileMemory(*step);
  EXPECT_EQ(profile.saved_bytes_by_layer.size(), 12u);
  return profile.saved_bytes_by_layer;
}

constexpr double s = kSeq, b = kBatch, h = 768, a = 12;
constexpr double kNormStats = 16 * s * b;  // two norms x (mean + rstd) x f32 per token

TEST(ActivationMemory, KorthikantiNoParallelism) {
  const double expected = s * b * h * (34 + 5 * a * s / h) + kNormStats;
  for (uint64_t bytes : SavedPerLayer({})) EXPECT_EQ(static_cast<double>(bytes), expected);
}

TEST(ActivationMemory, KorthikantiFullRecomputation) {
  const double expected = 2 * s * b * h;
  for (uint64_t bytes : SavedPerLayer({.checkpoint = CheckpointMode::kFull})) {
    EXPECT_EQ(static_cast<double>(bytes), expected);
  }
}

TEST(ActivationMemory, KorthikantiSelectiveRecomputation) {
  const double expected = s * b * h * 34 + kNormStats;
  for (uint64_t bytes : SavedPerLayer({.checkpoint = CheckpointMode::kSelective})) {
    EXPECT_EQ(static_cast<double>(bytes), expected);
  }
}

TEST(ActivationMemory, KorthikantiTensorParallel) {
  for (int t : {2, 4}) {
    const double expected = s * b * h * (10 + 24.0 / t + 5 * a * s / (h * t)) + kNormStats;
    for (uint64_t bytes : SavedPerLayer({}, t)) EXPECT_EQ(static_cast<double>(bytes), expected) << t;
  }
}

TEST(ActivationMemory, KorthikantiTensorAndSequenceParallel) {
  for (int t : {2, 4}) {
    const double expected = s * b * h * (34 + 5 * a * s / h) / t + kNormStats / t;
    for (uint64_t bytes : SavedPerLayer({}, t, /*sp=*/true)) {
      EXPECT_EQ(static_cast<double>(bytes), expected) << t;
    }
  }
}

// Flash attention keeps q, k, v, the output and the f32 logsumexp instead of
// the s x s matrices (FlashAttention-2, Dao 2023): 34sbh + 4*a*s*b bytes of
// logsumexp, and the output (2sbh) is the out-projection's input already.
TEST(ActivationMemory, FlashAttentionDropsTheQuadraticTerm) {
  const double expected = s * b * h * 34 + 4 * a * s * b + kNormStats;
  for (uint64_t bytes : SavedPerLayer({}, 1, false, AttentionImpl::kFlash)) {
    EXPECT_EQ(static_cast<double>(bytes), expected);
  }
  // Nothing is marked as an attention core, so selective changes nothing.
  EXPECT_EQ(SavedPerLayer({.checkpoint = CheckpointMode::kSelective}, 1, false, AttentionImpl::kFlash),
            SavedPerLayer({}, 1, false, AttentionImpl::kFlash));
}

}  // namespace
}  // namespace headroom

// Roofline step time of a real model against the usual FLOP accounting:
// training costs about 6 FLOPs per parameter per token (forward 2, backward
// 4; Kaplan et al. 2020, "Scaling Laws for Neural Language Models", sec.
// 2.1), and full recomputation adds at most one more forward (a third).
// PyTorch's checkpoint stops replaying once every saved tensor is back
// (Note [Checkpoint segments]), so a Llama block's down projection and last
// residual add are not replayed: a bit less than a third.
#include <string>

#include "models/builders.h"
#include "hardware/cost_model.h"
#include "planner/checkpoint_mode_plan.h"
#include "models/model_source.h"
#include "graph/training_step.h"
#include "gtest/gtest.h"

namespace headroom {
namespace {

TEST(StepTime, Llama7BMatchesSixFlopsPerParameterPerToken) {
  absl::StatusOr<ModelConfig> config = LoadPresetConfig("llama-2-7b");
  ASSERT_TRUE(config.ok()) << config.status();
  const int64_t tokens = 4096;
  absl::StatusOr<Graph> forward = BuildModelGraph(
      *config, {.batch = 1, .seq_len = tokens, .param_dtype = DType::kBF16,
                .compute_dtype = DType::kBF16, .attention = AttentionImpl::kFlash});
  ASSERT_TRUE(forward.ok()) << forward.status();
  absl::StatusOr<Graph> plain = BuildTrainingStep(*forward, {});
  absl::StatusOr<Graph> full = BuildTrainingStep(*forward, {.checkpoint = *PlanForMode(*forward, CheckpointMode::kFull)});
  ASSERT_TRUE(plain.ok() && full.ok());

  double flops = 0;
  for (const Op& op : plain->ops()) flops += op.flops;
  const double six_nt = 6.0 * static_cast<double>(forward->ParameterCount()) * tokens;
  // Attention scores and the optimizer add a few percent on top of 6NT.
  EXPECT_GT(flops, six_nt * 0.95);
  EXPECT_LT(flops, six_nt * 1.25);

  const GpuSpec& h100 = **GpuCatalog::Builtin().Find("H100-80GB");
  const CostModelOptions options;
  const double ideal = six_nt / (989.4e12 * options.compute_efficiency);
  const double seconds = EstimateStepTime(*plain, h100, options);
  EXPECT_GT(seconds, ideal);
  EXPECT_LT(seconds, ideal * 1.6);  // memory-bound elementwise ops and launches on top

  const double overhead = RecomputeSeconds(*full, h100, options) / seconds;
  EXPECT_GT(overhead, 0.2);
  EXPECT_LT(overhead, 1.0 / 3);
  RecordProperty("flops_over_6nt", std::to_string(flops / six_nt));
  RecordProperty("seconds_over_ideal", std::to_string(seconds / ideal));
  RecordProperty("recompute_overhead", std::to_string(overhead));
}

}  // namespace
}  // namespace headroom

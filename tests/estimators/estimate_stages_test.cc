// The stages of an estimate (estimators/estimate_stages.h) and the
// regressions fuzz_estimate found in how EstimateMemory combines them.
#include "estimators/estimate_stages.h"

#include "common/status_macros.h"
#include "estimators/memory_estimate.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace headroom {
namespace {

// fuzz_estimate: a one-layer bert-large-shaped masked LM, fp16 autocast,
// 8-bit AdamW, two GPUs, gradient accumulation 2. At micro-batch 1 the
// forward/backward peak was kept; at micro-batch 2 the optimizer step was
// taken as the peak because it was compared without the autocast copies and
// the fragmentation allowance, and the total went down by 62 MB.
TEST(EstimateMemory, OneMoreSampleNeverNeedsFewerBytes) {
  absl::StatusOr<ModelConfig> config = ParseHfConfig(
      R"({"architectures": ["BertForMaskedLM"], "hidden_size": 1024, "intermediate_size": 4096,
          "max_position_embeddings": 512, "num_attention_heads": 16, "num_hidden_layers": 1,
          "type_vocab_size": 2, "vocab_size": 30522})",
      "bert.json");
  ASSERT_TRUE(config.ok()) << config.status();
  const LoadedModel model{.name = "bert.json", .kind = ModelSourceKind::kConfigFile, .config = *config};
  JobSpec job;
  job.seq_len = 256;
  job.grad_accum = 2;
  job.precision = Precision::kFp16Mixed;
  job.optimizer = Optimizer::kAdam8bit;
  job.attention = AttentionImpl::kEager;
  job.layout.gpus = 2;
  const Machine machine{.budget = uint64_t{80} << 30};
  uint64_t previous = 0;
  for (int64_t batch = 1; batch <= 4; ++batch) {
    job.micro_batch = batch;
    absl::StatusOr<MemoryEstimate> e = EstimateMemory(model, job, machine);
    ASSERT_TRUE(e.ok()) << e.status();
    EXPECT_GE(e->total_bytes(), previous) << "micro-batch " << batch;
    previous = e->total_bytes();
  }
}

// The optimizer step is reported as the peak only when it is: its bytes,
// allowance included, above the forward/backward peak's. GPT-2 peaks in
// the loss's backward (Note [Causal LM loss]), above its optimizer step.
TEST(EstimateMemory, TheReportedPeakIsTheLargerOfForwardBackwardAndTheOptimizerStep) {
  absl::StatusOr<LoadedModel> gpt2 = LoadModel("gpt2");
  ASSERT_TRUE(gpt2.ok());
  const JobSpec job;
  const Machine machine{.budget = uint64_t{16} << 30};
  absl::StatusOr<MemoryEstimate> e = EstimateMemory(*gpt2, job, machine);
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_EQ(e->peak_op, "loss.log_softmax.backward");

  // The stages, run by hand, agree with EstimateMemory.
  const EstimateSetup setup = ResolveSetup(*gpt2, job);
  absl::StatusOr<Graph> forward = BuildForwardGraph(*gpt2, job, setup);
  ASSERT_TRUE(forward.ok()) << forward.status();
  absl::StatusOr<Graph> step = BuildStep(*forward, job, setup);
  ASSERT_TRUE(step.ok()) << step.status();
  const PeakAttribution peak = AttributePeak(*step, setup);
  absl::StatusOr<WorstStage> stage = FindWorstPipelineStage(*forward, peak, job, setup);
  ASSERT_TRUE(stage.ok()) << stage.status();
  EXPECT_EQ(e->activations, stage->activations);
  const uint64_t dynamic = stage->activations + peak.activation_gradients + peak.temporaries;
  const uint64_t forward_backward = dynamic + FragmentationAllowance(job, dynamic) + peak.parameter_gradients +
                                    peak.autocast_copies + peak.rounding;
  const std::optional<OptimizerStepPeak> optimizer = FindOptimizerStepPeak(*forward, *step, job, setup, forward_backward);
  EXPECT_FALSE(optimizer.has_value());
  // Without the forward/backward bytes the step's own transient would be the peak.
  EXPECT_TRUE(FindOptimizerStepPeak(*forward, *step, job, setup, 0).has_value());
}

}  // namespace
}  // namespace headroom

// ValidateJob: every field's range and the fields against each other; errors
// begin with the field's name so the command line can name its flag.
#include "job/job_spec.h"

#include <cmath>
#include <limits>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace headroom {
namespace {

using ::testing::StartsWith;

std::string Error(const JobSpec& job) { return std::string(ValidateJob(job).message()); }

TEST(ValidateJob, DefaultsAreValid) { EXPECT_TRUE(ValidateJob({}).ok()); }

TEST(ValidateJob, RangesNameTheField) {
  EXPECT_THAT(Error({.micro_batch = 0}), StartsWith("micro_batch: must be at least 1, got 0"));
  EXPECT_THAT(Error({.micro_batch = kMaxMicroBatch + 1}), StartsWith("micro_batch: must be at most"));
  EXPECT_THAT(Error({.seq_len = -1}), StartsWith("seq_len: must be at least 0"));
  EXPECT_THAT(Error({.seq_len = kMaxSeqLen + 1}), StartsWith("seq_len: must be at most"));
  EXPECT_THAT(Error({.grad_accum = 0}), StartsWith("grad_accum:"));
  EXPECT_THAT(Error({.checkpoint_every = 0}), StartsWith("checkpoint_every:"));
  JobSpec job;
  job.overheads.streams = 0;
  EXPECT_THAT(Error(job), StartsWith("overheads.streams:"));
  job = {};
  job.layout.gpus = 0;
  EXPECT_THAT(Error(job), StartsWith("gpus: must be at least 1"));
}

TEST(ValidateJob, LoraNeedsAFiniteAlpha) {
  JobSpec job;
  job.lora.rank = 16;
  job.lora.alpha = std::numeric_limits<double>::quiet_NaN();
  EXPECT_THAT(Error(job), StartsWith("lora.alpha: must be a positive number"));
  job.lora.alpha = 32;
  EXPECT_TRUE(ValidateJob(job).ok());
  job.lora.rank = 0;
  job.lora.quantize_base_nf4 = true;
  EXPECT_THAT(Error(job), StartsWith("lora.quantize_base_nf4: QLoRA needs a LoRA rank"));
}

TEST(ValidateJob, TrainingAndInferenceOptionsDoNotMix) {
  EXPECT_THAT(Error({.training = false, .checkpoint = CheckpointMode::kFull}), StartsWith("checkpoint:"));
  EXPECT_THAT(Error({.training = false, .grad_accum = 2}), StartsWith("grad_accum:"));
  EXPECT_THAT(Error({.training = true, .context = 128}), StartsWith("context: a KV cache is for inference"));
  EXPECT_TRUE(ValidateJob({.training = false, .context = 128}).ok());
}

// Stage s of p holds min(p - s, m) micro-batches under 1F1B and all m under GPipe; the stage asked for must
// exist; GPipe's micro-batches are bounded, since the estimate replays each.
TEST(ParallelLayout, PipelineSchedulesAndStages) {
  ParallelLayout layout{.gpus = 4, .pipeline_parallel = 4};
  EXPECT_EQ(layout.MicroBatchesInFlight(0, 8), 4);
  EXPECT_EQ(layout.MicroBatchesInFlight(3, 8), 1);
  EXPECT_EQ(layout.MicroBatchesInFlight(0, 2), 2);
  layout.pipeline_schedule = PipelineSchedule::kGPipe;
  EXPECT_EQ(layout.MicroBatchesInFlight(3, 8), 8);
  EXPECT_EQ(ParallelLayout{}.MicroBatchesInFlight(0, 8), 1);

  EXPECT_EQ(*ParsePipelineSchedule("gpipe"), PipelineSchedule::kGPipe);
  EXPECT_EQ(*ParsePipelineSchedule("1f1b"), PipelineSchedule::k1F1B);
  EXPECT_EQ(PipelineScheduleName(PipelineSchedule::kGPipe), "gpipe");
  EXPECT_FALSE(ParsePipelineSchedule("zero-bubble").ok());

  layout.pipeline_stage = 4;
  EXPECT_THAT(std::string(layout.Validate().message()), StartsWith("pipeline_stage: stage 4 does not exist"));
  layout.pipeline_stage = 3;
  EXPECT_TRUE(layout.Validate().ok());

  JobSpec job;
  job.layout = layout;
  job.grad_accum = kMaxGpipeMicroBatches + 1;
  EXPECT_THAT(Error(job), StartsWith("grad_accum: GPipe holds every micro-batch's activations"));
  job.layout.pipeline_schedule = PipelineSchedule::k1F1B;
  EXPECT_TRUE(ValidateJob(job).ok());
}

}  // namespace
}  // namespace headroom

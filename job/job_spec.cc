#include "job/job_spec.h"

#include <cmath>

#include "absl/strings/str_format.h"
#include "common/name_table.h"
#include "common/status_macros.h"

namespace headroom {
namespace {

constexpr NameTable<TrainingLoop, 2> kTrainingLoopNames("training loop", {{
    {"hand", TrainingLoop::kHand},
    {"trainer", TrainingLoop::kTrainer},
}});

absl::Status InRange(int64_t value, int64_t low, int64_t high, std::string_view field) {
  if (value < low) {
    return absl::InvalidArgumentError(absl::StrFormat("%s: must be at least %d, got %d", field, low, value));
  }
  if (value > high) {
    return absl::InvalidArgumentError(absl::StrFormat("%s: must be at most %d, got %d", field, high, value));
  }
  return absl::OkStatus();
}

}  // namespace

std::string_view TrainingLoopName(TrainingLoop loop) { return kTrainingLoopNames.Name(loop); }
absl::StatusOr<TrainingLoop> ParseTrainingLoop(std::string_view name) { return kTrainingLoopNames.Parse(name); }

absl::Status ValidateJob(const JobSpec& job) {
  HEADROOM_RETURN_IF_ERROR(InRange(job.micro_batch, 1, kMaxMicroBatch, "micro_batch"));
  HEADROOM_RETURN_IF_ERROR(InRange(job.grad_accum, 1, kMaxGradAccum, "grad_accum"));
  // 0 stands for the model's default length.
  HEADROOM_RETURN_IF_ERROR(InRange(job.seq_len, 0, kMaxSeqLen, "seq_len"));
  HEADROOM_RETURN_IF_ERROR(InRange(job.target_seq_len, 0, kMaxSeqLen, "target_seq_len"));
  // Each image fills at least one of seq_len's tokens (Note [LLaVA] in models/builders/vision.cc).
  HEADROOM_RETURN_IF_ERROR(InRange(job.images, 0, kMaxSeqLen, "images"));
  HEADROOM_RETURN_IF_ERROR(InRange(job.context, 0, kMaxSeqLen, "context"));
  HEADROOM_RETURN_IF_ERROR(InRange(job.kv_block_size, 0, kMaxSeqLen, "kv_block_size"));
  HEADROOM_RETURN_IF_ERROR(InRange(job.checkpoint_every, 1, kMaxSeqLen, "checkpoint_every"));
  HEADROOM_RETURN_IF_ERROR(InRange(job.overheads.streams, 1, kMaxStreams, "overheads.streams"));
  if (job.lora.rank < 0 || job.lora.rank > kMaxSeqLen) {
    return absl::InvalidArgumentError(
        absl::StrFormat("lora.rank: must be between 0 and %d, got %d", kMaxSeqLen, job.lora.rank));
  }
  if (job.lora.enabled() && !(std::isfinite(job.lora.alpha) && job.lora.alpha > 0)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("lora.alpha: must be a positive number, got %g", job.lora.alpha));
  }
  if (job.lora.quantize_base_nf4 && !job.lora.enabled()) {
    return absl::InvalidArgumentError("lora.quantize_base_nf4: QLoRA needs a LoRA rank");
  }
  if (!job.training) {
    if (job.checkpoint != CheckpointMode::kOff) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "checkpoint: activation checkpointing ('%s') applies to training; inference keeps no activations "
          "for backward",
          CheckpointModeName(job.checkpoint)));
    }
    if (job.grad_accum > 1) {
      return absl::InvalidArgumentError("grad_accum: gradient accumulation applies to training");
    }
    if (job.ema != EmaPlacement::kOff) {
      return absl::InvalidArgumentError("ema: an EMA of the weights is kept while training");
    }
  } else if (job.context > 0) {
    return absl::InvalidArgumentError("context: a KV cache is for inference");
  }
  if (job.layout.pipeline_parallel > 1 && job.layout.pipeline_schedule == PipelineSchedule::kGPipe &&
      job.grad_accum > kMaxGpipeMicroBatches) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "grad_accum: GPipe holds every micro-batch's activations and the estimate replays each; %d micro-batches "
        "is beyond the %d it replays",
        job.grad_accum, kMaxGpipeMicroBatches));
  }
  return job.layout.Validate();
}

}  // namespace headroom

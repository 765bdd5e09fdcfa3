// The job a user describes, apart from the model: what runs (training or
// inference, batch and sequence, precision, optimizer, checkpointing, LoRA),
// how it spreads over GPUs (job/parallel_layout.h), and the machine it must
// fit on. The estimators, the planner and the executor all take these, so a
// job can be described without including any of them.
//
//   JobSpec job{.micro_batch = 4, .seq_len = 8192, .precision = Precision::kBf16Mixed};
//   job.layout = {.gpus = 8, .sharding = Sharding::kZero3};
//   Machine machine{.gpu = *GpuCatalog::Builtin().Find("h100")};
#ifndef HEADROOM_JOB_JOB_SPEC_H_
#define HEADROOM_JOB_JOB_SPEC_H_

#include <cstdint>
#include <optional>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#include "allocator/allocator_options.h"
#include "graph/graph.h"
#include "graph/torch_runtime.h"
#include "hardware/gpu_catalog.h"
#include "job/checkpoint_mode.h"
#include "job/optimizer.h"
#include "job/parallel_layout.h"
#include "job/precision.h"
#include "models/builders.h"
#include "models/model_config.h"

namespace headroom {

// Overheads beyond the tensors that the user may set (estimators/overheads.h).
struct OverheadOptions {
  std::optional<uint64_t> cuda_context;  // override (--cuda-context)
  int streams = 1;                       // compute streams, each with a cuBLAS workspace
};

// Note [Training loop]
// What the loop keeps referenced decides how long the model's outputs live.
// A hand-written loop, `out = model(**batch); out.loss.backward();
// optimizer.step()`, holds `out` (the logits) through backward and the
// optimizer step; Hugging Face's Trainer computes the loss in compute_loss
// and drops the outputs before backward. kHand is the default: it is what
// most scripts, and PyTorch's and Hugging Face's examples, do, and it is the
// safe side of the two.
enum class TrainingLoop : uint8_t { kHand, kTrainer };
std::string_view TrainingLoopName(TrainingLoop loop);  // "hand", "trainer"
absl::StatusOr<TrainingLoop> ParseTrainingLoop(std::string_view name);

// What the user runs: everything but the model and the machine.
struct JobSpec {
  bool training = true;
  int64_t micro_batch = 1;      // per GPU, per forward/backward
  int64_t seq_len = 0;          // 0: the model's max_position_embeddings capped at 4096
  int64_t target_seq_len = 0;   // encoder-decoders: the decoder's tokens; 0: seq_len
  int64_t grad_accum = 1;       // micro-batches per optimizer step
  Precision precision = Precision::kBf16Mixed;
  Optimizer optimizer = Optimizer::kAdamW;
  // How the optimizer step runs, which sets its transient memory (Note
  // [Optimizer step transients]).
  OptimizerImpl optimizer_impl = OptimizerImpl::kForeach;
  // An EMA copy of the trainable weights, and where (Note [EMA weights]).
  EmaPlacement ema = EmaPlacement::kOff;
  AttentionImpl attention = AttentionImpl::kFlash;
  CheckpointMode checkpoint = CheckpointMode::kOff;
  int checkpoint_every = 1;
  LoraOptions lora;
  ParallelLayout layout;
  // Gradients stay allocated between steps: zero_grad(set_to_none=False),
  // PyTorch's default before 2.0 (Note [Gradients: resident or by liveness]).
  bool keep_gradients = false;
  // Vision-language models (LLaVA) only: images per sequence, whose tokens seq_len counts, and what trains
  // (Note [LLaVA] in models/builders/vision.cc).
  int64_t images = 1;
  VlmTrainable vlm_trainable = VlmTrainable::kProjectorAndLanguage;
  // Encoders only: the task head to train (default: the config's).
  std::optional<EncoderHead> encoder_head;
  // Inference: KV cache for `context` tokens per sequence (0: no cache).
  int64_t context = 0;
  int64_t kv_block_size = 16;
  std::optional<DType> kv_dtype;  // default: the compute dtype
  OverheadOptions overheads;
  TrainingLoop loop = TrainingLoop::kHand;
  // Note [Eager RMSNorm] in models/builders.cc. Unset: fused under Megatron (its layers use fused
  // norm kernels), eager under any other framework (Hugging Face's modules).
  std::optional<RmsNormImpl> rms_norm;
  TorchRuntime runtime;                        // graph/torch_runtime.h
  // The caching allocator's configuration the job runs with
  // (PYTORCH_CUDA_ALLOC_CONF; allocator/alloc_conf.h): the estimate replays
  // its step through the allocator with it (estimators/step_replay.h).
  // Default: PyTorch's own policy.
  AllocatorOptions allocator;
};

// Upper bounds on the sizes a job may name: far above any real job, low
// enough that products of them stay far from 2^64 bytes.
inline constexpr int64_t kMaxMicroBatch = int64_t{1} << 20;
inline constexpr int64_t kMaxSeqLen = int64_t{1} << 24;        // tokens, also the KV context
inline constexpr int64_t kMaxGradAccum = int64_t{1} << 20;
// Micro-batches per step under a GPipe pipeline schedule, where all of them are in flight at once.
inline constexpr int64_t kMaxGpipeMicroBatches = 256;
inline constexpr int kMaxStreams = 1024;

// Checks every field against its range and the fields against each other
// (LoRA alpha with a rank, no checkpointing or gradient accumulation in
// inference, a KV cache only in inference, the layout's own invariants).
// Errors are InvalidArgument and begin with the field's name as written in
// JobSpec ("micro_batch: ...", "lora.alpha: ...", "gpus: ..." for the
// layout); the command line maps those names to its flags.
absl::Status ValidateJob(const JobSpec& job);

struct Machine {
  const GpuSpec* gpu = nullptr;          // catalog entry; may be null with a budget
  std::optional<uint64_t> budget;        // overrides gpu->memory_bytes
  uint64_t capacity() const { return budget ? *budget : gpu != nullptr ? gpu->memory_bytes : 0; }
};

}  // namespace headroom

#endif  // HEADROOM_JOB_JOB_SPEC_H_

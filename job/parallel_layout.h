// How a job spreads over GPUs: data parallel with optional ZeRO / FSDP
// sharding, tensor (and sequence) parallel, pipeline parallel and expert
// parallel, and what is offloaded to host memory.
//
//   ParallelLayout layout{.gpus = 8, .sharding = Sharding::kZero3};
//   HEADROOM_RETURN_IF_ERROR(layout.Validate());
//   layout.data_parallel()   -> 8
//   layout.shard_group()     -> 8   (ranks a ZeRO/FSDP shard is split across)
//
// Invariants (Validate(), whose errors name the field): every degree in
// [1, kMaxGpus]; pipeline_stage -1 or below pipeline_parallel; gpus is a multiple of
// tensor_parallel * pipeline_parallel; expert_parallel divides the data
// parallel degree; FSDP's hybrid shard group divides the data parallel
// degree; offload needs ZeRO (DeepSpeed's ZeRO-Offload, stages 1-3) or FSDP
// (CPUOffload, which moves parameters and optimizer state together).
#ifndef HEADROOM_JOB_PARALLEL_LAYOUT_H_
#define HEADROOM_JOB_PARALLEL_LAYOUT_H_

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace headroom {

enum class Sharding {
  kReplicated, // plain data parallel (DDP): every rank holds everything
  kZero1,      // DeepSpeed ZeRO stage 1: optimizer state partitioned
  kZero2,      // + gradients partitioned
  kZero3,      // + parameters partitioned, gathered layer by layer
  kFsdpFull,   // PyTorch FSDP FULL_SHARD
  kFsdpHybrid, // FSDP HYBRID_SHARD: FULL_SHARD inside a group, replicated across groups
  kFsdpGradOp, // FSDP SHARD_GRAD_OP (FSDP2: reshard_after_forward=False): gathered units stay until backward
};

std::string_view ShardingName(Sharding sharding);  // "none", "zero1", ..., "fsdp-hybrid"
// Accepts "none", "ddp", "zero0".."zero3", "zero-1", "fsdp", "fsdp-full", "fsdp-hybrid".
absl::StatusOr<Sharding> ParseSharding(std::string_view name);
bool IsDeepSpeed(Sharding sharding);
bool IsFsdp(Sharding sharding);
// Whether FSDP frees a unit's gathered parameters after its forward (and gathers them again for backward):
// FULL_SHARD and HYBRID_SHARD do, SHARD_GRAD_OP does not.
bool ReshardsAfterForward(Sharding sharding);
// FSDP's strategies by their short names: "full" (FULL_SHARD), "hybrid" (HYBRID_SHARD), "grad-op"
// (SHARD_GRAD_OP).
absl::StatusOr<Sharding> ParseFsdpStrategy(std::string_view name);
std::string_view FsdpStrategyName(Sharding sharding);  // "unknown" unless IsFsdp(sharding)
// DeepSpeed's ZeRO stage 0-3 as a sharding (stage 0 partitions nothing), and back.
absl::StatusOr<Sharding> ZeroStageSharding(int stage);
int ZeroStage(Sharding sharding);

// The order a pipeline stage runs its micro-batches in: 1F1B (PipeDream-Flush; torch.distributed.pipelining's
// Schedule1F1B, Megatron's default) starts a backward as soon as the last stage can, so stage s of p holds
// min(p - s, m) micro-batches' activations; GPipe (ScheduleGPipe) runs every forward before any backward, so
// every stage holds all m.
enum class PipelineSchedule { k1F1B, kGPipe };
std::string_view PipelineScheduleName(PipelineSchedule schedule);  // "1f1b", "gpipe"
absl::StatusOr<PipelineSchedule> ParsePipelineSchedule(std::string_view name);

// What is offloaded to host memory: nothing, the optimizer state (with the
// fp32 masters and gradients), or the parameters too.
enum class Offload { kOff, kOptimizer, kAll };
std::string_view OffloadName(Offload offload);  // "none", "optimizer", "all"
absl::StatusOr<Offload> ParseOffload(std::string_view name);

// Parallel degrees and GPU counts are at most this (2^20).
inline constexpr int kMaxGpus = 1 << 20;

struct ParallelLayout {
  int gpus = 1;
  int tensor_parallel = 1;
  bool sequence_parallel = false;
  int pipeline_parallel = 1;
  PipelineSchedule pipeline_schedule = PipelineSchedule::k1F1B;
  // The stage whose GPU is estimated (0 first); -1: the fullest.
  int pipeline_stage = -1;
  int expert_parallel = 1;
  // The layout as torch.distributed runs it rather than Megatron-LM or DeepSpeed: tensor and pipeline
  // parallelism by DTensor's parallelize_module and pipelining (as torchtitan runs them), ZeRO-1 by
  // ZeroRedundancyOptimizer over DDP. The model's own modules and PyTorch's gradients, not Megatron's fused
  // kernels and contiguous gradient buffer or DeepSpeed's flat partitions (Note [Which framework a setup
  // means] in estimators/memory_estimate.h). ZeRO stages 2-3 are FSDP's in torch.distributed.
  bool torch_parallel = false;
  Sharding sharding = Sharding::kReplicated;
  // Ranks per FSDP hybrid shard group (usually the GPUs of one node).
  int hybrid_shard_group = 8;
  bool offload_optimizer = false;  // optimizer state (and fp32 masters/grads) in host memory
  bool offload_params = false;     // ZeRO-3 / FSDP parameters in host memory too
  // True when the user asked for the DeepSpeed optimizer without ZeRO
  // partitioning (zero stage 0): it still keeps a 16-bit gradient buffer.
  bool deepspeed_stage0 = false;

  Offload offload() const;
  void set_offload(Offload offload);

  int data_parallel() const {
    return static_cast<int>(gpus / (static_cast<int64_t>(tensor_parallel) * pipeline_parallel));
  }
  // Whether DeepSpeed runs the job (a ZeRO stage without torch_parallel).
  bool deepspeed() const { return (IsDeepSpeed(sharding) || deepspeed_stage0) && !torch_parallel; }
  // Micro-batches whose activations pipeline stage `stage` holds at once when a step runs `micro_batches`.
  int MicroBatchesInFlight(int stage, int64_t micro_batches) const;
  // Ranks that together hold one copy of the sharded model states.
  int shard_group() const;
  absl::Status Validate() const;
  // "8 GPUs: data 8 (ZeRO-3), tensor 1, pipeline 1" style summary.
  std::string Describe() const;
};

}  // namespace headroom

#endif  // HEADROOM_JOB_PARALLEL_LAYOUT_H_

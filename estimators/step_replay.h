// The allocator replay stage of an estimate: the step's allocation sequence
// replayed through the caching allocator (allocator/caching_allocator.h) on
// a simulated device with the job's allocator configuration, for the bytes
// the allocator hands out at the peak (allocated) and what it holds from the
// device (reserved), which with the CUDA context is what nvidia-smi shows.
//
//   std::vector<ResidentBlock> resident = ResidentBlocks(forward, states, job, setup, {.kv_cache = kv});
//   HEADROOM_ASSIGN_OR_RETURN(StepAllocations sequence, BuildStepAllocations(step, resident, {...}));
//   sequence.peak_bytes;                                          // requested bytes at the peak
//   sequence.bytes_at_peak[CategoryIndex(BudgetCategory::kActivations)];
//   HEADROOM_ASSIGN_OR_RETURN(AllocatorReplay r, ReplayAllocations(sequence, job.allocator, gpu_bytes));
//   r.peak_allocated_bytes >= sequence.peak_bytes; r.peak_reserved_bytes >= r.peak_allocated_bytes
//
// Note [Allocator replay]
// An estimate's allocated and reserved bytes come from one allocation
// sequence, which stands for a warm training step (the second or a later
// one: whatever the first step creates lazily already exists):
//  1. the resident state, allocated once before the step and never freed
//     (Note [Resident blocks]), then the cuBLAS workspaces (Note [cuBLAS
//     workspace in the replay]); the optimizer state appears in a first step
//     run before the measured one (Note [The first step in the replay]);
//  2. under pipeline parallelism, the forwards of the other micro-batches in
//     flight (Note [Pipeline warm-up in the replay]);
//  3. the step's counted tensors (inputs, activations, autocast copies,
//     gradients, temporaries) in liveness order (Note [Plan trace order] in
//     replay/graph_trace.h);
//  4. the optimizer's temporaries (Note [Optimizer step transients] in
//     job/optimizer.h), allocated right before the first optimizer op, while
//     every gradient is still live: all at once for foreach, one parameter
//     at a time for the for-loop (nothing for fused kernels).
// The most requested bytes live at once over the sequence, and what each
// budget category holds then, is the estimate's breakdown: leaving out the
// resident state and the optimizer's temporaries it is ProfileMemory's peak
// of the step, and the larger of the forward/backward peak and the optimizer
// step wins by construction. Replaying the sequence gives the allocated
// peak (each request rounded up to the allocator's blocks; the estimate's
// "allocator rounding" is that peak less the requested one) and the reserved
// peak (the estimate's "allocator cache": bytes the allocator keeps in its
// segments beyond the blocks in use). Both come from PyTorch's policy with
// the job's configuration (PYTORCH_CUDA_ALLOC_CONF syntax, --alloc-conf),
// not from an allowance.
//
// Note [Resident blocks]
// How a framework holds its state decides which blocks the allocator sees.
// PyTorch (autocast, DDP) and Megatron keep one tensor per parameter for
// weights, master weights, optimizer state and an EMA copy, so each of these
// categories is split over the parameters this GPU holds in proportion to
// their size (each tensor's own bytes when a category has one dtype). The
// optimizer state of a parameter is two tensors for the Adam family
// (exp_avg and exp_avg_sq, created per parameter by torch.optim at the first
// step) and one otherwise. DeepSpeed flattens its 16-bit parameters, fp32
// partitions, gradients and moments into contiguous buffers and FSDP keeps
// one flat parameter per unit, so there each category is one block.
// Resident gradients are per parameter under PyTorch and one block under
// Megatron (its contiguous main_grad buffer) as under DeepSpeed and FSDP.
// DDP's gradient buckets are blocks of 25 MiB (bucket_cap_mb); the gathered
// ZeRO-3/FSDP units one block (each unit's gather reuses the block the
// previous one freed); the KV cache one block per layer (vLLM keeps one
// cache tensor per layer; Note [KV cache in the forward]). Buffers are one
// block per buffer tensor.
//
// Note [FSDP units in the step]
// FSDP wraps each transformer block as a unit and the remaining parameters
// (embeddings, final norm, head) as the root unit, and all-gathers a unit's
// parameters only while it runs (torch/distributed/fsdp/_fully_shard/
// _fsdp_state.py and _fsdp_param_group.py for FSDP2, _runtime_utils.py for
// FSDP1), so the gathered bytes follow the step:
//  - the root unit is gathered at the first op and kept until backward ends:
//    neither FSDP reshards the root after forward, whose parameters backward
//    needs first (FSDP1: "_post_forward_reshard", free only if not root;
//    FSDP2: the root's post_forward_mesh_info is None);
//  - a block is gathered at its first forward op and, under FULL_SHARD and
//    HYBRID_SHARD, freed after its last; for backward it is gathered again
//    when the unit before it in backward order starts its backward (the
//    default backward prefetch: BACKWARD_PRE in FSDP1, FSDP2's implicit
//    prefetch of the next unit in reverse post-forward order), the last
//    block when backward starts, and freed after its last backward op.
//    Under SHARD_GRAD_OP (FSDP2: reshard_after_forward=False) it stays
//    gathered from its first forward op to its last backward op;
//  - its gradients exist unsharded from the first op that makes a gradient
//    of its parameters to its last backward op, where the reduce-scatter
//    leaves this rank's shard, which lives until zero_grad(set_to_none=True)
//    after the optimizer step. With gradient accumulation or kept gradients
//    the shards are resident instead (Note [Gradients: resident or by
//    liveness] in memory_estimate.h).
// Measured with gloo on two CPU ranks (validation/fixtures/distributed):
// FSDP2 and FSDP1 FULL_SHARD peak at the start of backward holding the root
// and the prefetched last block; FSDP2 without resharding and SHARD_GRAD_OP
// hold the root and every block there.
//
// Note [KV cache in the forward]
// A paged server (vLLM) allocates its cache before it serves, so a paged KV
// cache is resident from the start. transformers' DynamicCache has no
// storage of its own: each attention layer's update() keeps the keys and
// values that layer just computed (cache_utils.py, DynamicLayer.update), so
// during a prefill the cache grows layer by layer as the forward runs. With
// a contiguous cache (--kv-block-size 0) each layer's block is therefore
// allocated at that layer's first attention op, when the forward has one
// per cached layer (else before the step, as paged). Seen on an H100: the
// GPT-2 prefill fixture (validation/fixtures/cuda) reserved 146 MiB, and
// its replay 158 MiB with the cache allocated before the step, 146 with it
// allocated in the forward.
//
// Note [cuBLAS workspace in the replay]
// PyTorch allocates each cuBLAS handle's workspace through the caching
// allocator: aten/src/ATen/cuda/CublasHandlePool.cpp, getNewWorkspace()
// returns c10::cuda::CUDACachingAllocator::get()->allocate(
// getChosenWorkspaceSize()), kept per (handle, stream) in
// cublas_handle_stream_to_workspace until clearCublasWorkspaces(); the
// cuBLASLt workspace shares it by default (TORCH_CUBLASLT_UNIFIED_WORKSPACE,
// same file). So the workspace is a block of the replay, allocated at the
// first matmul (after the weights) and held, one per compute stream, each on
// its own stream; it is part of the allocated and reserved bytes, not added
// on top of them.
//
// Note [The first step in the replay]
// torch.optim creates a parameter's state (Adam's exp_avg and exp_avg_sq,
// SGD's momentum buffer) inside its first step() call, when backward has
// freed the activations and every gradient is live; the state's blocks then
// sit in segments the activations used. The steady step runs around them,
// and its reserved peak is set by that layout: replaying recorded CUDA runs
// (validation/record-trace on an H100) shows reserved memory reaching its
// final value in the second step, from the first step's segments. So when
// the resident state has blocks the first step creates (from_first_step:
// per-parameter optimizer state, unless DeepSpeed or FSDP allocate it flat
// at start-up, or gradients stay between steps: the first backward then
// creates those too, one by one, which the replay does not model), the
// sequence first runs the step once without them and
// creates them at its first optimizer op, before the optimizer's
// temporaries; then the step of Note [Allocator replay] follows, and once
// more after it: in 8 of the 33 CUDA fixtures the cache still grew in the
// third step, and in none after it (their reserved_after_steps, over six
// steps). Neither extra step's requested bytes exceed the measured step's
// (the first holds the same tensors less the state, the last the same), so
// the breakdown and the peak op are the measured step's: the others only
// shape the segments, and the replay's reserved peak is that of
// kStepsUntilSettled steps.
//
// Note [cuBLAS handle per thread]
// Each thread takes its own cuBLAS handle (CublasHandlePool.cpp keeps a
// thread_local PoolWindow of handles), and the workspace map above is keyed
// by (handle, stream). A training step runs its forward on the Python thread
// and its backward on the autograd engine's thread for the device
// (torch/csrc/autograd/engine.cpp starts one per device), so it holds two
// workspaces per stream; inference holds one. Seen on an H100 with PyTorch
// 2.11: every training fixture in validation/fixtures/cuda holds two 32 MiB
// blocks after its warm-up step, the inference fixtures one.
//
// Note [Pipeline warm-up in the replay]
// Under 1F1B, stage s runs the forwards of min(p - s, m) micro-batches
// before its first backward (Note [Pipeline 1F1B] in memory_estimate.h).
// The replay runs the stage's own step (PipelineStageForward in
// estimate_stages.h), preceded by the forward part (forward and loss ops) of
// each other micro-batch in flight. Each allocates and frees its transient
// tensors as the step does and keeps every tensor the step keeps past its
// forward (what backward reads, and the micro-batch's inputs): those held
// blocks are the in-flight micro-batches' saved activations. They stay
// through the step's forward and backward and are freed before the
// optimizer step, as the cool-down backwards of 1F1B free them. Beyond the
// first 8 warm-ups (kWarmUpsReplayedWhole) (GPipe holds every micro-batch of the
// step, thousands at most) only the held tensors are allocated: a forward's
// transients peak on fewer held blocks than the step's own forward's, so
// they never make the peak, and replaying each would make the estimate's
// time grow with the micro-batches.
//
// Note [Replay capacity]
// The sequence is replayed on a device of the size the GPU leaves the
// allocator (its memory less the CUDA context) with the configuration as
// given, so that garbage_collection_threshold, memory_fraction and
// hard_limit_mb act as they would on the GPU. If the allocator never fails
// to get memory from that device, the replay's figures are the answer. If it
// fails once, even where it would then succeed after freeing its unused
// cached segments (PyTorch's alloc retry: a device synchronization and a
// sign of memory pressure that PyTorch warns about), the job is counted as
// not fitting with that configuration, and the sequence is replayed again on
// a device with room for anything (64 PiB) without the configuration's
// limits, for what the step would need. With PyTorch's default
// configuration the figures therefore never depend on the GPU's size (the
// two replays differ only after a request has failed), and they grow with
// the job as the requests do.
#ifndef HEADROOM_ESTIMATORS_STEP_REPLAY_H_
#define HEADROOM_ESTIMATORS_STEP_REPLAY_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "absl/status/statusor.h"
#include "allocator/allocator_options.h"
#include "estimators/estimate_stages.h"
#include "estimators/model_states.h"
#include "graph/graph.h"
#include "graph/liveness.h"
#include "job/job_spec.h"
#include "replay/allocation_trace.h"

namespace headroom {

// What an allocation is for, as the estimate's budget rows name it.
enum class BudgetCategory : uint8_t {
  kWeights,  // weights, buffers and autocast's 16-bit copies
  kMasterWeights,
  kGradients,  // parameter gradients
  kOptimizerState,
  kGatheredParameters,
  kCommunicationBuffers,
  kFp8WeightCache,
  kEmaWeights,
  kActivations,  // activations and inputs
  kActivationGradients,
  kTemporaries,  // op workspaces and the optimizer's temporaries
  kKvCache,
  kRecurrentState,  // a state-space model's inference state (Note [Recurrent state] in memory_estimate.h)
  kCublasWorkspace,
};
inline constexpr size_t kNumBudgetCategories = 14;
constexpr size_t CategoryIndex(BudgetCategory category) { return static_cast<size_t>(category); }
using CategoryBytes = std::array<uint64_t, kNumBudgetCategories>;

// What an FSDP unit's block holds (Note [FSDP units in the step]).
enum class FsdpBlock : uint8_t {
  kResident,               // not a unit's
  kParameters,             // the gathered parameters, freed after forward and gathered again for backward
  kParametersUntilBackward,  // the same, kept from forward through backward (SHARD_GRAD_OP)
  kUnshardedGradients,     // the unit's gradients before the reduce-scatter
  kShardedGradients,       // this rank's shard of them, from the reduce-scatter to zero_grad
};

// One allocation of the resident state (Note [Resident blocks]).
// The steps the sequence covers when the first step creates state (Note [The
// first step in the replay]): the first, the measured one, one more.
inline constexpr int kStepsUntilSettled = 3;

struct ResidentBlock {
  uint64_t bytes = 0;
  BudgetCategory category = BudgetCategory::kWeights;
  uint64_t stream = 0;  // as recorded in a trace; 0 is the default stream
  // Created by the first optimizer step rather than before the first step
  // (Note [The first step in the replay]).
  bool from_first_step = false;
  // A KV cache block that the forward fills (Note [KV cache in the forward]):
  // allocated at the first attention op of the step's n-th attention layer,
  // this n (counted from 0); -1: before the step.
  int attention_layer = -1;
  // An FSDP unit's block (Note [FSDP units in the step]): what it holds, and
  // the unit (a block's layer, -1 the root).
  FsdpBlock fsdp = FsdpBlock::kResident;
  int fsdp_unit = -1;
};

// The resident state beyond the model states.
struct ResidentExtras {
  uint64_t kv_cache = 0;
  int kv_cache_layers = 1;        // one block each
  bool kv_cache_in_forward = false;  // contiguous (DynamicCache): Note [KV cache in the forward]
  std::vector<uint64_t> recurrent_state;  // one block each (MambaCache's conv_states, ssm_states)
  uint64_t cublas_workspace = 0;  // per cuBLAS handle and stream; 0 without a GPU
  int streams = 1;
  int cublas_handles = 1;  // Note [cuBLAS handle per thread]
};

// The resident state of one GPU as blocks, in the order a run creates them
// (Note [Resident blocks]): weights and buffers, fp8 weight copies, an EMA
// copy, DDP buckets, master weights, gradients, optimizer state, gathered
// units, the KV cache or recurrent state, then the cuBLAS workspaces. `forward` is the forward
// graph of the parameters this GPU holds (one pipeline stage's under
// --pp); `states` its model states. The blocks of each category sum to the
// category's bytes in `states`, but under FSDP, whose gathered parameters
// and gradients are each unit's (Note [FSDP units in the step]).
std::vector<ResidentBlock> ResidentBlocks(const Graph& forward, const ModelStates& states, const JobSpec& job,
                                          const EstimateSetup& setup, const ResidentExtras& extras);

struct StepSequenceOptions {
  // Which step tensors are allocated: as ProfileMemory counts them.
  ProfileOptions profile;
  // autocast's 16-bit copies of parameters count as weights.
  bool autocast = false;
  // Micro-batches in flight under 1F1B (Note [Pipeline warm-up in the replay]).
  int in_flight = 1;
  // The optimizer's temporaries (OptimizerStepTemporaries); none by default.
  OptimizerTemporaries optimizer_temporaries;
};

struct StepAllocations {
  AllocationTrace trace;  // format "rmm-csv", source the step's name
  // The most requested bytes live at once, and each category's share then.
  uint64_t peak_bytes = 0;
  CategoryBytes bytes_at_peak{};
  // Where that is: an op of the step (of an in-flight micro-batch's forward
  // when peak_in_warm_up), the optimizer's temporaries, or, when nothing
  // but the resident state is ever live, neither.
  OpId peak_op = kNone;
  bool peak_in_warm_up = false;
  bool peak_at_optimizer_temporaries = false;
  // The step's largest tensors live at peak_op (at most 16, largest first;
  // ties: lower id), when the peak is at an op of the step itself.
  std::vector<TensorId> largest_live;
};

// The allocation sequence of Note [Allocator replay] for `step`, resident
// state first. Errors: the step's CheckBounds(), and OutOfRange when more
// than kMaxSimulatedCapacity (64 PiB) would be live at once, which no
// replay can simulate.
absl::StatusOr<StepAllocations> BuildStepAllocations(const Graph& step, std::span<const ResidentBlock> resident,
                                                     const StepSequenceOptions& options);

struct AllocatorReplay {
  uint64_t peak_allocated_bytes = 0;
  uint64_t peak_reserved_bytes = 0;
  // The sequence could not be served within `device_bytes` with this
  // configuration (Note [Replay capacity]): the job does not fit, and the
  // peaks are those of the unconstrained replay.
  bool out_of_memory = false;
};

// Replays `sequence` (Note [Replay capacity]); `device_bytes` is what the
// GPU leaves the allocator (0: nothing). The peaks satisfy
// peak_reserved_bytes >= peak_allocated_bytes >= sequence.peak_bytes.
absl::StatusOr<AllocatorReplay> ReplayAllocations(const StepAllocations& sequence, const AllocatorOptions& allocator,
                                                  uint64_t device_bytes);

}  // namespace headroom

#endif  // HEADROOM_ESTIMATORS_STEP_REPLAY_H_

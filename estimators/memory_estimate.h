// The per-GPU memory budget of a training or inference job: model states,
// activations by liveness over the step's schedule, KV cache and overheads,
// at the step's peak, and what the caching allocator reserves for them.
//
//   absl::StatusOr<LoadedModel> model = LoadModel("llama-3-8b");
//   JobSpec job{.micro_batch = 1, .seq_len = 4096, .precision = Precision::kBf16Mixed};
//   absl::StatusOr<MemoryEstimate> e = EstimateMemory(*model, job, {.gpu = h100});
//   e->allocated_bytes(); e->reserved_bytes();
//   e->total_bytes(); e->fits(); e->rows();   // category, bytes; total = what nvidia-smi shows
//
// Pipeline: BuildModelGraph (models/builders.h) for one micro-batch on one
// tensor-parallel shard -> PlanForMode (planner/checkpoint_mode_plan.h) for the
// checkpoint mode -> BuildTrainingStep (graph/training_step.h) with that plan
// -> EstimateModelStates for the resident bytes -> the step's allocation
// sequence, resident state first, replayed through the caching allocator
// (estimators/step_replay.h, Note [Allocator replay]) for the bytes at the
// peak by category, the allocated and the reserved peak -> the CUDA
// context. Each step is a named stage in estimators/estimate_stages.h and
// estimators/step_replay.h that planners can reuse.
//
// Absurd input is an error, never a wrapped byte count: sizes are bounded
// (job/job_spec.h, graph/graph.h Note [Size bounds], models/model_config.h
// Note [Model size bounds], estimators/kv_cache.h Note [KV cache bound]) and
// the total and the capacity are at most 2^62 bytes (Note [Checked totals]).
//
// Note [Recurrent state]
// A state-space model (Mamba) keeps no KV cache: at inference transformers' MambaCache holds, for every layer, a
// conv_state [batch, intermediate_size, conv_kernel] and an ssm_state [batch, intermediate_size, state_size], in
// the dtype of the embeddings (the model's), allocated as two tensors over all layers when a forward runs with
// use_cache (the config's default). Their size does not grow with the context, so --context does not change it;
// a config with use_cache false keeps none.
//
// Note [Which framework a setup means]
// Mixed precision on one data-parallel group without ZeRO/FSDP/Megatron is
// PyTorch autocast (Hugging Face Trainer, Accelerate, Lightning): fp32
// parameters, 16-bit copies made by autocast and saved for backward (they
// appear among the live tensors; the estimate reports them as "weights"),
// fp32 gradients. ZeRO (DeepSpeed), FSDP MixedPrecision and Megatron
// (tensor/pipeline parallel) keep 16-bit parameters and fp32 masters; the
// graph is then built in pure 16-bit and the masters/gradients come from
// estimators/model_states.h. Both come to 18 bytes per parameter with AdamW.
// Tensor or pipeline parallelism is Megatron's unless --torch-parallel says
// torch.distributed runs it (DTensor, pipelining): then the model's own
// modules run (transformers' eager RMSNorm, not Megatron's fused one) and
// PyTorch makes the gradients, as on one GPU.
//
// Note [Gradients: resident or by liveness]
// A single micro-batch on plain PyTorch >= 2.0 frees .grad at zero_grad()
// (set_to_none=True) and re-creates gradients during backward, so they are
// counted by liveness (only those live at the peak). With gradient
// accumulation, ZeRO, FSDP, Megatron or zero_grad(set_to_none=False)
// (JobSpec::keep_gradients) they are a persistent buffer: counted whole.
//
// Note [Gradients in the first backward]
// With accumulation and zero_grad(set_to_none=True), a step's first
// micro-batch makes the gradients during its backward; the later ones add
// into them. On one GPU every micro-batch holds the same activations, so the
// later ones' peak (gradients resident) is the step's. A pipeline stage
// holds more micro-batches in its first backward than in any later one when
// all its forwards come first (GPipe; a 1F1B stage with no more
// micro-batches than the stages after it): there, the first backward, with
// every micro-batch in flight and the gradients made as it runs, can be the
// peak (llama-gqa-pp-gpipe-2 in validation/fixtures/distributed: both
// ranks peak in it). Such a stage is therefore replayed at both moments,
// its first backward (gradients by liveness, StepOptions::gradients_preexist
// off) and the later ones (gradients resident, one micro-batch fewer in
// flight), and the larger is the stage's. A stage with more micro-batches
// than it holds at once, or whose gradients outlive the step (a framework's
// gradient buffers, --keep-grads), holds as many micro-batches in its later
// backwards as in its first, and the gradients besides: one replay, of the
// later ones, is the stage's.
//
// Note [Pipeline 1F1B]
// Under 1F1B (Narayanan et al. 2021, PipeDream-Flush) stage s of p holds
// min(p - s, m) micro-batches in flight (m micro-batches per step): the
// first stage stores p micro-batches of its layers' activations
// (Korthikanti et al. 2022, Section 4.2.3). Under GPipe (Huang et al. 2019)
// every stage holds all m (ParallelLayout::MicroBatchesInFlight). Each
// stage's bytes are those of its own step (Note [Pipeline stage step] in
// estimate_stages.cc) replayed after the forwards of its other micro-batches
// in flight (Note [Pipeline warm-up in the replay] in
// estimators/step_replay.h), with its own model states; the estimate is the
// stage with the most total bytes, every stage's peaks beside it. Which
// stage that is cannot be told without the replay: the first holds the most
// micro-batches and the embedding, the last the head and the loss's logits,
// which on a small vocabulary-heavy model outweigh the first's extra
// micro-batch (llama-gqa-pp-1f1b-2 in validation/fixtures/distributed).
// The planner plans one stage: the one named by --pp-stage, else the one
// the estimate finds fullest.
#ifndef HEADROOM_ESTIMATORS_MEMORY_ESTIMATE_H_
#define HEADROOM_ESTIMATORS_MEMORY_ESTIMATE_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "estimators/overheads.h"
#include "job/job_spec.h"
#include "models/model_source.h"
#include "replay/allocation_trace.h"

namespace headroom {

struct LiveTensorInfo {
  std::string name;
  std::string role;
  std::string dtype;
  std::vector<int64_t> shape;
  uint64_t bytes = 0;
};

// One row of the budget table.
struct BudgetRow {
  std::string key;    // JSON key: "weights", "activations", ...
  std::string label;  // table label
  uint64_t bytes = 0;
  std::string note;
};

// One pipeline stage's peaks (Note [Pipeline 1F1B]).
struct StagePeak {
  int stage = 0;
  int in_flight = 1;  // micro-batches whose activations it holds at once
  uint64_t allocated_bytes = 0;
  uint64_t reserved_bytes = 0;
  std::string peak_op;
  std::string peak_phase;
};

struct MemoryEstimate {
  // Model states (per GPU).
  uint64_t weights = 0;          // incl. buffers and autocast's 16-bit copies
  uint64_t master_weights = 0;
  uint64_t gradients = 0;
  uint64_t optimizer_state = 0;
  uint64_t gathered_parameters = 0;
  uint64_t communication_buffers = 0;
  uint64_t fp8_weight_cache = 0;
  uint64_t ema_weights = 0;  // on the GPU (--ema gpu); in host_bytes with --ema cpu
  // Dynamic bytes at the peak.
  uint64_t activations = 0;           // forward outputs and saved tensors (inputs included)
  uint64_t activation_gradients = 0;
  uint64_t temporaries = 0;  // incl. the optimizer step's, when it is the peak
  uint64_t kv_cache = 0;
  uint64_t recurrent_state = 0;  // Note [Recurrent state]
  // The CUDA context, cuBLAS workspaces, and the allocator's rounding and
  // cache from the replay (Note [Allocator rounding and cache]).
  Overheads overheads;
  // The allocator configuration replayed (FormatAllocConf; empty: PyTorch's
  // default), and whether the allocator ran short of the GPU's memory with it
  // (Note [Replay capacity] in estimators/step_replay.h; with the default
  // configuration only when total_bytes() is more than the capacity).
  std::string alloc_conf;
  bool allocator_out_of_memory = false;

  uint64_t capacity = 0;
  uint64_t host_bytes = 0;  // per rank, offloaded states
  int pipeline_stage = 0;  // the stage estimated: --pp-stage, or the fullest (the most total bytes)
  // Under --pp, every stage replayed (one with --pp-stage), first to last.
  std::vector<StagePeak> pipeline_stages;
  uint64_t parameters = 0;            // whole model (one TP shard)
  uint64_t trainable_parameters = 0;  // on this GPU's stage
  int64_t seq_len = 0;
  std::string framework;  // "pytorch-autocast", "deepspeed", "fsdp", "megatron", "pytorch"

  // The peak.
  std::string peak_op;
  std::string peak_phase;
  std::vector<LiveTensorInfo> largest_live;
  // Roofline time of one optimizer step (all micro-batches), 0 without a GPU.
  double step_seconds = 0;
  double recompute_seconds = 0;

  // The allocator's peaks: the blocks handed out (tensors, workspaces and
  // the allocator's rounding) and what it holds from the device (plus its
  // cache of unused blocks).
  uint64_t allocated_bytes() const;
  // The bytes requested at the peak (tensors and workspaces): allocated
  // less the allocator's rounding. Unlike the allocator's figures, it never
  // shrinks when the job grows.
  uint64_t requested_bytes() const { return allocated_bytes() - overheads.allocator_rounding; }
  uint64_t reserved_bytes() const { return allocated_bytes() + overheads.allocator_cached; }
  // What nvidia-smi would show: the reserved peak plus the CUDA context.
  uint64_t total_bytes() const { return reserved_bytes() + overheads.cuda_context; }
  bool fits() const { return total_bytes() <= capacity && !allocator_out_of_memory; }
  // Signed spare bytes (negative: short by).
  int64_t spare_bytes() const {
    return static_cast<int64_t>(capacity) - static_cast<int64_t>(total_bytes());
  }
  // Table rows in display order; zero rows are left out except the core ones.
  std::vector<BudgetRow> rows() const;
};

// seq_len a job resolves to for `model` (JobSpec::seq_len or the default).
int64_t ResolveSeqLen(const LoadedModel& model, const JobSpec& job);

// Estimates one job. Errors name the field or flag at fault:
// InvalidArgument for a layout or option the model cannot take (heads not
// divisible by TP, --pp beyond the layers or on a graph file with its own
// backward, ...), OutOfRange for sizes beyond the stated bounds. With
// `replayed`, it also receives the allocation sequence the allocator
// replayed (Note [Allocator replay]), for `headroom replay`.
absl::StatusOr<MemoryEstimate> EstimateMemory(const LoadedModel& model, const JobSpec& job,
                                              const Machine& machine, AllocationTrace* replayed = nullptr);

}  // namespace headroom

#endif  // HEADROOM_ESTIMATORS_MEMORY_ESTIMATE_H_

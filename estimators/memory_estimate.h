// The per-GPU memory budget of a training or inference job: model states,
// activations by liveness over the step's schedule, KV cache and overheads,
// at the step's peak.
//
//   absl::StatusOr<LoadedModel> model = LoadModel("llama-3-8b");
//   JobSpec job{.micro_batch = 1, .seq_len = 4096, .precision = Precision::kBf16Mixed};
//   absl::StatusOr<MemoryEstimate> e = EstimateMemory(*model, job, {.gpu = h100});
//   e->total_bytes(); e->fits(); e->rows();   // category, bytes
//
// Pipeline: BuildModelGraph (models/builders.h) for one micro-batch on one
// tensor-parallel shard -> PlanForMode (planner/checkpoint_plan.h) for the
// checkpoint mode -> BuildTrainingStep (graph/training_step.h) with that plan
// -> ProfileMemory (graph/liveness.h) for the dynamic bytes
// -> EstimateModelStates for the resident ones -> overheads. Each step is a
// named stage in estimators/estimate_stages.h that planners can reuse.
//
// Absurd input is an error, never a wrapped byte count: sizes are bounded
// (job/job_spec.h, graph/graph.h Note [Size bounds], models/model_config.h
// Note [Model size bounds], estimators/kv_cache.h Note [KV cache bound]) and
// the total and the capacity are at most 2^62 bytes (Note [Checked totals]).
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
//
// Note [Gradients: resident or by liveness]
// A single micro-batch on plain PyTorch >= 2.0 frees .grad at zero_grad()
// (set_to_none=True) and re-creates gradients during backward, so they are
// counted by liveness (only those live at the peak). With gradient
// accumulation, ZeRO, FSDP, Megatron or zero_grad(set_to_none=False)
// (JobSpec::keep_gradients) they are a persistent buffer: counted whole.
//
// Note [Pipeline 1F1B]
// Under 1F1B (Narayanan et al. 2021, PipeDream-Flush) stage s of p holds
// min(p - s, m) micro-batches in flight (m micro-batches per step): the
// first stage stores p micro-batches of its layers' activations
// (Korthikanti et al. 2022, Section 4.2.3). The estimate charges each stage
// its layers' saved-for-backward bytes (ProfileMemory's saved_bytes_by_layer)
// times its in-flight count, plus the step's transient working set, and
// reports the worst stage.
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
  uint64_t temporaries = 0;
  uint64_t kv_cache = 0;
  Overheads overheads;

  uint64_t capacity = 0;
  uint64_t host_bytes = 0;  // per rank, offloaded states
  int pipeline_stage = 0;
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

  uint64_t total_bytes() const;
  bool fits() const { return total_bytes() <= capacity; }
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
// divisible by TP, --pp beyond the layers, ...), OutOfRange for sizes beyond
// the stated bounds.
absl::StatusOr<MemoryEstimate> EstimateMemory(const LoadedModel& model, const JobSpec& job,
                                              const Machine& machine);

}  // namespace headroom

#endif  // HEADROOM_ESTIMATORS_MEMORY_ESTIMATE_H_

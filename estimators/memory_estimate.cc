#include "estimators/memory_estimate.h"

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_format.h"
#include "common/checked_math.h"
#include "common/status_macros.h"
#include "common/units.h"
#include "estimators/estimate_stages.h"
#include "estimators/kv_cache.h"
#include "estimators/model_states.h"
#include "estimators/optimizer_state.h"
#include "graph/liveness.h"
#include "hardware/cost_model.h"

namespace headroom {
namespace {

// KV cache for inference of decoders; 0 otherwise.
absl::StatusOr<uint64_t> KvCacheFor(const LoadedModel& model, const JobSpec& job, const EstimateSetup& setup) {
  if (job.training || job.context <= 0 || !model.config || model.config->family != ModelFamily::kDecoder) {
    return 0;
  }
  const ModelConfig& c = *model.config;
  KvCacheOptions kv{.num_layers = c.num_layers,
                    .num_kv_heads = std::max<int64_t>(1, c.num_kv_heads / job.layout.tensor_parallel),
                    .head_dim = c.head_dim,
                    .dtype = job.kv_dtype.value_or(setup.precision.compute_dtype),
                    .context_tokens = job.context,
                    .batch = job.micro_batch,
                    .block_size = job.kv_block_size};
  HEADROOM_RETURN_IF_ERROR(ValidateKvCache(kv));
  return KvCacheBytes(kv);
}

// Note [Checked totals]
// Every category is below 2^62 (estimate_stages.h), but user flags add their
// own terms (--cuda-context, the pipeline's in-flight count), so the total is
// summed once with overflow checks; MemoryEstimate::total_bytes() can then
// add without them. The total and the capacity are also bounded by
// kMaxEstimateBytes (2^62 bytes, 4 EiB), so spare_bytes() is exact in int64.
constexpr uint64_t kMaxEstimateBytes = uint64_t{1} << 62;

absl::Status CheckTotal(const MemoryEstimate& e) {
  uint64_t total = 0;
  const std::vector<BudgetRow> rows = e.rows();
  const BudgetRow* largest = nullptr;
  for (const BudgetRow& row : rows) {
    HEADROOM_ASSIGN_OR_RETURN(total, CheckedAdd(total, row.bytes, absl::StrFormat("total bytes (%s)", row.key)));
    if (largest == nullptr || row.bytes > largest->bytes) largest = &row;
  }
  if (total > kMaxEstimateBytes) {
    return absl::OutOfRangeError(absl::StrFormat(
        "the estimate totals %d bytes (%s: %d), more than the %d (4 EiB) an estimate may reach", total,
        // A user-set context names its JobSpec field (the command line shows its flag).
        largest->key == "cuda_context" && e.overheads.cuda_context_source == "--cuda-context"
            ? "overheads.cuda_context"
            : largest->key,
        largest->bytes, kMaxEstimateBytes));
  }
  if (e.capacity > kMaxEstimateBytes) {
    return absl::OutOfRangeError(absl::StrFormat(
        "capacity (--budget or the GPU's memory) of %d bytes is more than the %d (4 EiB) an estimate may compare with",
        e.capacity, kMaxEstimateBytes));
  }
  return absl::OkStatus();
}

}  // namespace

uint64_t MemoryEstimate::total_bytes() const {
  // Note [Checked totals]: EstimateMemory has checked that this cannot wrap.
  return weights + master_weights + gradients + optimizer_state + gathered_parameters +
         communication_buffers + fp8_weight_cache + ema_weights + activations + activation_gradients +
         temporaries + kv_cache + overheads.total();
}

std::vector<BudgetRow> MemoryEstimate::rows() const {
  std::vector<BudgetRow> all = {
      {"weights", "weights", weights, ""},
      {"master_weights", "master weights (fp32)", master_weights, ""},
      {"gradients", "gradients", gradients, ""},
      {"optimizer_state", "optimizer state", optimizer_state, ""},
      {"gathered_parameters", "gathered layer (ZeRO-3/FSDP)", gathered_parameters, ""},
      {"communication_buffers", "DDP gradient buckets", communication_buffers, ""},
      {"fp8_weight_cache", "fp8 weight copies", fp8_weight_cache, ""},
      {"ema_weights", "EMA weights", ema_weights, ""},
      {"activations", "activations", activations, ""},
      {"activation_gradients", "activation gradients", activation_gradients, ""},
      {"temporaries", "temporaries", temporaries, ""},
      {"kv_cache", "KV cache", kv_cache, ""},
      {"cuda_context", "CUDA context", overheads.cuda_context, overheads.cuda_context_source},
      {"cublas_workspace", "cuBLAS workspace", overheads.cublas_workspace, ""},
      {"allocator_rounding", "allocator rounding (512 B)", overheads.allocator_rounding, ""},
      {"fragmentation_allowance", "fragmentation allowance", overheads.fragmentation_allowance, ""},
  };
  std::vector<BudgetRow> out;
  for (BudgetRow& row : all) {
    const bool core = row.key == "weights" || row.key == "activations" || row.key == "cuda_context";
    if (row.bytes > 0 || core) out.push_back(std::move(row));
  }
  return out;
}

int64_t ResolveSeqLen(const LoadedModel& model, const JobSpec& job) {
  if (job.seq_len > 0) return job.seq_len;
  if (!model.config) return 0;
  const ModelConfig& c = *model.config;
  if (c.family != ModelFamily::kDecoder && c.family != ModelFamily::kEncoder) return 0;
  const int64_t max_pos = c.max_position_embeddings > 0 ? c.max_position_embeddings : 4096;
  return std::min<int64_t>(max_pos, 4096);
}

absl::StatusOr<MemoryEstimate> EstimateMemory(const LoadedModel& model, const JobSpec& job,
                                              const Machine& machine) {
  HEADROOM_RETURN_IF_ERROR(ValidateJob(job));
  HEADROOM_RETURN_IF_ERROR(CheckJobAgainstModel(model, job));
  const EstimateSetup setup = ResolveSetup(model, job);

  HEADROOM_ASSIGN_OR_RETURN(const Graph forward, BuildForwardGraph(model, job, setup));
  Graph step;
  if (model.graph && HasBackward(forward)) {
    step = forward;  // a graph file of a whole step is taken as given
  } else {
    HEADROOM_ASSIGN_OR_RETURN(step, BuildStep(forward, job, setup));
  }

  const PeakAttribution peak = AttributePeak(step, setup);
  HEADROOM_ASSIGN_OR_RETURN(const WorstStage stage, FindWorstPipelineStage(forward, peak, job, setup));
  uint64_t activations = stage.activations;
  uint64_t parameter_grads = peak.parameter_gradients;
  uint64_t activation_grads = peak.activation_gradients;
  uint64_t temporaries = peak.temporaries;
  uint64_t autocast_copies = peak.autocast_copies;
  uint64_t rounding = peak.rounding;
  // Each term is below 2^62 but the in-flight activations, which
  // FindWorstPipelineStage checks: saturating sums suffice (Note [Checked totals]).
  const uint64_t dynamic = SaturatingAdd(activations, activation_grads + temporaries);
  const uint64_t forward_backward =
      SaturatingAdd(SaturatingAdd(dynamic, FragmentationAllowance(job, dynamic)),
                    parameter_grads + autocast_copies + rounding);
  const std::optional<OptimizerStepPeak> optimizer_peak =
      FindOptimizerStepPeak(forward, step, job, setup, forward_backward);
  if (optimizer_peak) {
    activations = optimizer_peak->activations;
    activation_grads = 0;
    parameter_grads = optimizer_peak->gradients;
    temporaries = optimizer_peak->temporaries;
    autocast_copies = 0;
    rounding = 0;
  }

  MemoryEstimate out;
  out.framework = std::string(FrameworkName(setup.framework));
  out.seq_len = setup.seq_len;
  out.pipeline_stage = stage.stage;
  const ModelStates& states = stage.states;
  out.weights = states.weights + states.buffers + autocast_copies;
  out.master_weights = states.master_weights;
  out.gradients = setup.persistent_gradients ? states.gradients : parameter_grads;
  out.optimizer_state = states.optimizer_state;
  out.gathered_parameters = states.gathered_parameters;
  out.communication_buffers = states.communication_buffers;
  out.fp8_weight_cache = states.fp8_weight_cache;
  out.ema_weights = states.ema_weights;
  out.activations = activations;
  out.activation_gradients = activation_grads;
  out.temporaries = temporaries;
  out.host_bytes = states.host_bytes;
  out.parameters = states.model_parameters;
  out.trainable_parameters = states.trainable_parameters;
  HEADROOM_ASSIGN_OR_RETURN(out.kv_cache, KvCacheFor(model, job, setup));

  out.overheads = EstimateJobOverheads(machine, job, rounding,
                                       SaturatingAdd(out.activations, out.activation_gradients + out.temporaries));
  out.capacity = machine.capacity();
  HEADROOM_RETURN_IF_ERROR(CheckTotal(out));

  if (optimizer_peak) {
    out.peak_op = absl::StrFormat("optimizer step (%s %s)", OptimizerName(job.optimizer),
                                  OptimizerImplName(job.optimizer_impl));
    out.peak_phase = "optimizer";
  } else if (peak.profile.peak_op != kNone) {
    const Op& op = step.op(peak.profile.peak_op);
    out.peak_op = op.name.empty() ? op.kind : op.name;
    out.peak_phase = std::string(PhaseName(op.phase));
    for (TensorId id : peak.profile.live_at_peak) {
      const Tensor& t = step.tensor(id);
      out.largest_live.push_back({.name = t.name,
                                  .role = std::string(TensorRoleName(t.role)),
                                  .dtype = std::string(DTypeName(t.dtype)),
                                  .shape = t.shape,
                                  .bytes = t.bytes()});
    }
  }

  const StepSeconds time = EstimateJobStepTime(step, machine, job, setup);
  out.step_seconds = time.step;
  out.recompute_seconds = time.recompute;
  return out;
}

}  // namespace headroom

#include "estimators/memory_estimate.h"

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_format.h"
#include "common/status_macros.h"
#include "common/units.h"
#include "estimators/kv_cache.h"
#include "estimators/model_states.h"
#include "estimators/optimizer_state.h"
#include "graph/training_step.h"
#include "planner/checkpoint_plan.h"
#include "hardware/cost_model.h"
#include "graph/liveness.h"

namespace headroom {
namespace {

enum class Framework { kAutocast, kPytorch, kDeepSpeed, kFsdp, kMegatron };

std::string_view FrameworkName(Framework f) {
  switch (f) {
    case Framework::kAutocast: return "pytorch-autocast";
    case Framework::kPytorch: return "pytorch";
    case Framework::kDeepSpeed: return "deepspeed";
    case Framework::kFsdp: return "fsdp";
    case Framework::kMegatron: return "megatron";
  }
  return "pytorch";
}

// Note [Which framework a setup means].
Framework FrameworkFor(const JobSpec& job) {
  const ParallelLayout& layout = job.layout;
  if (IsDeepSpeed(layout.sharding) || layout.deepspeed_stage0) return Framework::kDeepSpeed;
  if (IsFsdp(layout.sharding)) return Framework::kFsdp;
  if (layout.tensor_parallel > 1 || layout.pipeline_parallel > 1) return Framework::kMegatron;
  const bool amp = job.precision == Precision::kBf16Mixed || job.precision == Precision::kFp16Mixed;
  if (amp && !job.lora.enabled()) return Framework::kAutocast;
  return Framework::kPytorch;
}

bool HasBackward(const Graph& graph) {
  for (const Op& op : graph.ops()) {
    if (op.phase == Phase::kBackward) return true;
  }
  return false;
}

}  // namespace

uint64_t MemoryEstimate::total_bytes() const {
  return weights + master_weights + gradients + optimizer_state + gathered_parameters +
         communication_buffers + fp8_weight_cache + activations + activation_gradients +
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
  const Framework framework = FrameworkFor(job);
  PrecisionSetup precision = SetupFor(job.precision);
  const bool autocast = framework == Framework::kAutocast;
  if (autocast) {
    // fp32 parameters are the masters; autocast's 16-bit copies are graph tensors.
    precision.weight_dtype = DType::kF32;
    precision.master_weights = false;
  }
  const ParallelLayout& layout = job.layout;
  const bool persistent_grads = job.grad_accum > 1 || job.keep_gradients || framework == Framework::kDeepSpeed ||
                                framework == Framework::kFsdp || framework == Framework::kMegatron;

  MemoryEstimate out;
  out.framework = std::string(FrameworkName(framework));
  out.seq_len = ResolveSeqLen(model, job);

  // The forward graph of one micro-batch on one tensor-parallel shard.
  Graph forward;
  bool is_step = false;
  if (model.config) {
    BuildOptions build{.batch = job.micro_batch,
                       .seq_len = out.seq_len > 0 ? out.seq_len : 1,
                       .param_dtype = autocast ? DType::kF32 : precision.weight_dtype,
                       .compute_dtype = precision.compute_dtype,
                       .attention = job.attention,
                       .training = job.training,
                       .tensor_parallel = layout.tensor_parallel,
                       .sequence_parallel = layout.sequence_parallel,
                       .lora = job.lora};
    ModelConfig config = *model.config;
    if (job.encoder_head && config.family == ModelFamily::kEncoder) {
      config.encoder_head = *job.encoder_head;
      // BertForSequenceClassification pools; the masked-LM model does not.
      config.encoder_pooler = config.encoder_head != EncoderHead::kMaskedLm && config.model_type == "bert";
    }
    HEADROOM_ASSIGN_OR_RETURN(forward, BuildModelGraph(config, build));
  } else if (model.graph) {
    forward = *model.graph;
    is_step = HasBackward(forward);
  } else {
    return absl::InvalidArgumentError(absl::StrFormat("model '%s' has neither a config nor a graph", model.name));
  }

  Graph step;
  if (is_step) {
    step = forward;
  } else {
    // The planner owns what a checkpoint mode means (planner/checkpoint_plan.h).
    CheckpointPlan plan;
    if (job.training) {
      HEADROOM_ASSIGN_OR_RETURN(plan, PlanForMode(forward, job.checkpoint, job.checkpoint_every));
    }
    StepOptions step_options{.training = job.training,
                             .checkpoint = std::move(plan),
                             .gradients_preexist = job.training && job.grad_accum > 1,
                             .optimizer_step = job.training,
                             .optimizer_state_bytes_per_element =
                                 static_cast<uint32_t>(OptimizerStateBytesPerParam(job.optimizer))};
    if (!autocast && job.training) step_options.parameter_gradient_dtype = precision.grad_dtype;
    HEADROOM_ASSIGN_OR_RETURN(step, BuildTrainingStep(forward, step_options));
  }

  // Dynamic bytes by liveness (Note [Gradients: resident or by liveness]).
  const ProfileOptions profile_options{.count_parameter_gradients = !persistent_grads,
                                       .max_live_at_peak = 16};
  const MemoryProfile profile = ProfileMemory(step, profile_options);
  const std::vector<TensorLifetime> lifetimes = ComputeLifetimes(step, profile_options);

  auto role_bytes = [&](TensorRole role) {
    auto it = profile.bytes_by_role_at_peak.find(role);
    return it == profile.bytes_by_role_at_peak.end() ? uint64_t{0} : it->second;
  };
  uint64_t activations = role_bytes(TensorRole::kActivation) + role_bytes(TensorRole::kInput);
  uint64_t parameter_grads = profile.parameter_gradient_bytes_at_peak;
  uint64_t activation_grads = profile.activation_gradient_bytes_at_peak;
  uint64_t temporaries = role_bytes(TensorRole::kTemporary);
  uint64_t autocast_copies = 0;
  uint64_t rounding = 0;
  bool optimizer_peak = false;
  const OpId peak = profile.peak_op;
  if (peak != kNone) {
    for (const Tensor& t : step.tensors()) {
      const TensorLifetime& life = lifetimes[static_cast<size_t>(t.id)];
      if (life.first > life.last || life.first > peak || life.last < peak) continue;
      rounding += RoundingWaste(t.bytes());
      if (!autocast) continue;
      const OpId producer = step.producer(t.id);
      if (producer == kNone) continue;
      const Op& op = step.op(producer);
      if (op.kind == "cast" && !op.inputs.empty() &&
          step.tensor(op.inputs[0]).role == TensorRole::kParameter) {
        autocast_copies += t.bytes();
      }
    }
  }
  autocast_copies = std::min(autocast_copies, activations);
  activations -= autocast_copies;

  // Model states, per pipeline stage (Note [Pipeline 1F1B]).
  ModelStateOptions state_options{.precision = precision,
                                  .optimizer = job.optimizer,
                                  .layout = layout,
                                  .training = job.training};
  const int stages = layout.pipeline_parallel;
  int num_layers = 0;
  for (const Tensor& t : forward.tensors()) {
    if (t.role == TensorRole::kParameter) num_layers = std::max(num_layers, t.layer + 1);
  }
  uint64_t saved_total = profile.saved_bytes_outside_layers;
  for (uint64_t b : profile.saved_bytes_by_layer) saved_total += b;
  const uint64_t dynamic_activations = activations;
  const uint64_t transient = dynamic_activations > saved_total ? dynamic_activations - saved_total : 0;

  ModelStates states;
  uint64_t best_total = 0;
  for (int s = 0; s < stages; ++s) {
    state_options.pipeline_stage = s;
    HEADROOM_ASSIGN_OR_RETURN(ModelStates candidate, EstimateModelStates(forward, state_options));
    uint64_t stage_activations = dynamic_activations;
    if (stages > 1) {
      uint64_t saved = s == stages - 1 ? profile.saved_bytes_outside_layers : 0;
      for (size_t layer = 0; layer < profile.saved_bytes_by_layer.size(); ++layer) {
        if (PipelineStageOf(static_cast<int>(layer), false, num_layers, stages) == s) {
          saved += profile.saved_bytes_by_layer[layer];
        }
      }
      const auto in_flight = static_cast<uint64_t>(std::min<int64_t>(stages - s, job.grad_accum));
      stage_activations = in_flight * saved + transient;
    }
    const uint64_t total = candidate.gpu_bytes() + stage_activations;
    if (s == 0 || total > best_total) {
      best_total = total;
      states = candidate;
      activations = stage_activations;
      out.pipeline_stage = s;
    }
  }

  // Note [Optimizer step transients]: the optimizer step may be the peak.
  if (job.training && job.optimizer != Optimizer::kSgd && job.optimizer_impl != OptimizerImpl::kFused &&
      !layout.offload_optimizer && framework != Framework::kDeepSpeed) {
    const DType state_dtype = precision.master_weights ? DType::kF32 : precision.optimizer_state_dtype;
    uint64_t step_transient = 0;
    for (const Tensor& t : forward.tensors()) {
      if (t.role != TensorRole::kParameter || !t.trainable) continue;
      const uint64_t bytes = DTypeBytes(state_dtype, t.elements());
      step_transient = job.optimizer_impl == OptimizerImpl::kForeach ? step_transient + bytes
                                                                     : std::max(step_transient, bytes);
    }
    if (job.optimizer_impl == OptimizerImpl::kForeach) {
      step_transient /= static_cast<uint64_t>(layout.shard_group()) * static_cast<uint64_t>(stages);
    }
    // All gradients are live during the step; persistent ones are in the states already.
    uint64_t grads_all = 0;
    if (!persistent_grads) {
      for (const Tensor& t : forward.tensors()) {
        if (t.role == TensorRole::kParameter && t.trainable) grads_all += DTypeBytes(t.dtype, t.elements());
      }
    }
    const uint64_t fwd_bwd = activations + parameter_grads + activation_grads + temporaries;
    if (grads_all + step_transient > fwd_bwd) {
      activations = 0;
      activation_grads = 0;
      parameter_grads = grads_all;
      temporaries = step_transient;
      autocast_copies = 0;
      rounding = 0;
      optimizer_peak = true;
    }
  }

  out.weights = states.weights + states.buffers + autocast_copies;
  out.master_weights = states.master_weights;
  out.gradients = persistent_grads ? states.gradients : parameter_grads;
  out.optimizer_state = states.optimizer_state;
  out.gathered_parameters = states.gathered_parameters;
  out.communication_buffers = states.communication_buffers;
  out.fp8_weight_cache = states.fp8_weight_cache;
  out.activations = activations;
  out.activation_gradients = activation_grads;
  out.temporaries = temporaries;
  out.host_bytes = states.host_bytes;
  out.parameters = states.model_parameters;
  out.trainable_parameters = states.trainable_parameters;

  // KV cache for inference of decoders.
  if (!job.training && job.context > 0 && model.config && model.config->family == ModelFamily::kDecoder) {
    const ModelConfig& c = *model.config;
    KvCacheOptions kv{.num_layers = c.num_layers,
                      .num_kv_heads = std::max<int64_t>(1, c.num_kv_heads / layout.tensor_parallel),
                      .head_dim = c.head_dim,
                      .dtype = job.kv_dtype.value_or(precision.compute_dtype),
                      .context_tokens = job.context,
                      .batch = job.micro_batch,
                      .block_size = job.kv_block_size};
    HEADROOM_RETURN_IF_ERROR(ValidateKvCache(kv));
    out.kv_cache = KvCacheBytes(kv);
  }

  // Overheads (Note [CUDA context], Note [Allocator rounding]).
  if (machine.gpu != nullptr) {
    out.overheads = EstimateOverheads(*machine.gpu, job.overheads);
  } else {
    out.overheads.cuda_context = job.overheads.cuda_context.value_or(CudaContextFor("").bytes);
    out.overheads.cuda_context_source =
        job.overheads.cuda_context ? "--cuda-context" : CudaContextFor("").source;
  }
  out.overheads.allocator_rounding = rounding;
  const uint64_t dynamic = out.activations + out.activation_gradients + out.temporaries;
  out.overheads.fragmentation_allowance =
      static_cast<uint64_t>(static_cast<double>(dynamic) * job.overheads.fragmentation_fraction);
  out.capacity = machine.capacity();

  if (optimizer_peak) {
    out.peak_op = absl::StrFormat("optimizer step (%s %s)", OptimizerName(job.optimizer),
                                  OptimizerImplName(job.optimizer_impl));
    out.peak_phase = "optimizer";
  } else if (peak != kNone) {
    const Op& op = step.op(peak);
    out.peak_op = op.name.empty() ? op.kind : op.name;
    out.peak_phase = std::string(PhaseName(op.phase));
  }
  for (TensorId id : optimizer_peak ? std::vector<TensorId>{} : profile.live_at_peak) {
    const Tensor& t = step.tensor(id);
    out.largest_live.push_back({.name = t.name,
                                .role = std::string(TensorRoleName(t.role)),
                                .dtype = std::string(DTypeName(t.dtype)),
                                .shape = t.shape,
                                .bytes = t.bytes()});
  }

  if (machine.gpu != nullptr) {
    const CostModelOptions cost{.allow_tf32 = precision.allow_tf32};
    const StepTime time = EstimateStepTimeBreakdown(step, *machine.gpu, cost);
    double optimizer = 0;
    if (auto it = time.seconds_by_phase.find(Phase::kOptimizer); it != time.seconds_by_phase.end()) {
      optimizer = it->second;
    }
    const double micro = time.seconds - optimizer;
    const auto m = static_cast<double>(job.grad_accum);
    const auto p = static_cast<double>(stages);
    // 1F1B: m micro-batches through p stages take (m + p - 1) stage slots.
    out.step_seconds = micro * (m + p - 1) / p + optimizer / p;
    out.recompute_seconds = time.recompute_seconds * m / p;
  }
  return out;
}

}  // namespace headroom

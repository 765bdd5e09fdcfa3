#include "estimators/model_states.h"

#include <algorithm>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_format.h"
#include "common/status_macros.h"

namespace headroom {
namespace {

bool IsQuantized(DType dtype) {
  return dtype == DType::kNF4 || dtype == DType::kI8 || dtype == DType::kU8 ||
         dtype == DType::kF8E4M3 || dtype == DType::kF8E5M2;
}

bool IsFloatWeight(DType dtype) {
  return dtype == DType::kF32 || dtype == DType::kBF16 || dtype == DType::kF16 || dtype == DType::kF64;
}

std::string ModuleName(const std::string& parameter) {
  const size_t dot = parameter.rfind('.');
  return dot == std::string::npos ? parameter : parameter.substr(0, dot);
}

// Unsharded bytes one parameter tensor contributes to each model state.
struct TensorStates {
  uint64_t weights = 0;
  uint64_t master = 0;
  uint64_t grad = 0;     // the accumulation buffer (fp32 under mixed precision)
  uint64_t grad16 = 0;   // DeepSpeed's 16-bit gradient (Note [DeepSpeed gradient buffers])
  uint64_t optimizer = 0;
  uint64_t fp8 = 0;
  uint64_t ema = 0;
};

// Per-stage sums before sharding; experts already divided by the EP degree.
struct StageSums {
  double dense[7] = {};   // weights, master, grad, grad16, optimizer, fp8, ema
  double expert[7] = {};
  uint64_t buffers = 0;
  double parameters = 0;
  double trainable = 0;
  std::map<std::string, uint64_t> modules;  // module name -> elements
  std::map<int, uint64_t> units;            // FSDP unit (layer, -1 root) -> elements
};

// An MoE expert parameter by its name: one of transformers 4's per-expert modules (".experts.<n>."), all of
// which the graph holds, or transformers 5's stacked experts, which the graph holds at a rank's share (Note
// [Expert parallelism in the graph] in models/builders/decoder.cc).
enum class ExpertParameter : uint8_t { kNone, kPerExpertModule, kStacked };

ExpertParameter ExpertParameterOf(std::string_view name) {
  constexpr std::string_view kExperts = ".experts.";
  const size_t at = name.find(kExperts);
  if (at == std::string_view::npos) return ExpertParameter::kNone;
  const size_t next = at + kExperts.size();
  return next < name.size() && absl::ascii_isdigit(name[next]) ? ExpertParameter::kPerExpertModule
                                                                 : ExpertParameter::kStacked;
}

}  // namespace

int PipelineStageOf(int layer, bool before_first_block, int num_layers, int stages) {
  if (stages <= 1) return 0;
  if (layer < 0 || num_layers <= 0) return before_first_block ? 0 : stages - 1;
  return static_cast<int>(static_cast<int64_t>(std::min(layer, num_layers - 1)) * stages / num_layers);
}

uint64_t LargestModuleParameters(const Graph& forward, std::string* name) {
  std::map<std::string, uint64_t> modules;
  for (const Tensor& t : forward.tensors()) {
    if (t.role == TensorRole::kParameter) modules[ModuleName(t.name)] += t.elements();
  }
  uint64_t best = 0;
  for (const auto& [module, elements] : modules) {
    if (elements > best) {
      best = elements;
      if (name != nullptr) *name = module;
    }
  }
  return best;
}

absl::StatusOr<ModelStates> EstimateModelStates(const Graph& forward,
                                                const ModelStateOptions& options) {
  const ParallelLayout& layout = options.layout;
  HEADROOM_RETURN_IF_ERROR(layout.Validate());
  const PrecisionSetup& precision = options.precision;
  const int stages = layout.pipeline_parallel;

  int num_layers = 0;
  OpId first_block_op = static_cast<OpId>(forward.num_ops());
  for (const Op& op : forward.ops()) {
    if (op.layer >= 0 && op.id < first_block_op) first_block_op = op.id;
  }
  std::vector<OpId> first_use(forward.num_tensors(), kNone);
  std::vector<bool> feeds_linear(forward.num_tensors(), false);
  for (const Op& op : forward.ops()) {
    for (TensorId in : op.inputs) {
      if (first_use[in] == kNone) first_use[in] = op.id;
      if (op.kind == "linear" || op.kind == "matmul") feeds_linear[in] = true;
    }
  }
  for (const Tensor& t : forward.tensors()) {
    if (t.role == TensorRole::kParameter) num_layers = std::max(num_layers, t.layer + 1);
  }

  const bool deepspeed = layout.deepspeed();
  const DType state_dtype = precision.master_weights ? DType::kF32 : precision.optimizer_state_dtype;
  std::vector<StageSums> sums(static_cast<size_t>(stages));
  uint64_t model_parameters = 0;
  for (const Tensor& t : forward.tensors()) {
    if (t.role != TensorRole::kParameter && t.role != TensorRole::kBuffer) continue;
    const bool before_first_block = first_use[t.id] == kNone || first_use[t.id] < first_block_op;
    StageSums& stage =
        sums[static_cast<size_t>(PipelineStageOf(t.layer, before_first_block, num_layers, stages))];
    if (t.role == TensorRole::kBuffer) {
      stage.buffers += t.bytes();
      continue;
    }
    const uint64_t n = t.elements();
    // The model's whole count: a rank's stacked experts stand for expert_parallel times as many.
    const ExpertParameter expert_kind = ExpertParameterOf(t.name);
    model_parameters +=
        expert_kind == ExpertParameter::kStacked ? n * static_cast<uint64_t>(layout.expert_parallel) : n;
    const bool quantized = IsQuantized(t.dtype);
    TensorStates s;
    s.weights = quantized || !IsFloatWeight(t.dtype) ? t.bytes() : DTypeBytes(precision.weight_dtype, n);
    const bool trains = options.training && t.trainable && !quantized;
    if (trains) {
      if (precision.master_weights) s.master = DTypeBytes(DType::kF32, n);
      s.grad = DTypeBytes(precision.grad_dtype, n);
      // ZeRO-3 reduce-scatters each layer's 16-bit gradients straight into the
      // fp32 partition: no resident 16-bit gradient buffer (DeepSpeed's stage-3
      // estimate counts 18 = 2 + 4 + 4 + 8 bytes/param, the 16-bit parameters included).
      if (deepspeed && precision.master_weights && layout.sharding != Sharding::kZero3) {
        s.grad16 = DTypeBytes(precision.weight_dtype, n);
      }
      s.optimizer = OptimizerStateBytes(options.optimizer, t.shape, state_dtype);
      if (options.ema != EmaPlacement::kOff) {
        s.ema = precision.master_weights ? DTypeBytes(DType::kF32, n) : DTypeBytes(precision.weight_dtype, n);
      }
    }
    if (precision.fp8_weight_cache_bytes_per_param > 0 && feeds_linear[t.id] && t.shape.size() == 2) {
      s.fp8 = n * precision.fp8_weight_cache_bytes_per_param;
    }
    const bool expert = expert_kind != ExpertParameter::kNone;
    const double share = ParameterShare(t, layout);
    double* into = expert ? stage.expert : stage.dense;
    const uint64_t parts[7] = {s.weights, s.master, s.grad, s.grad16, s.optimizer, s.fp8, s.ema};
    for (int i = 0; i < 7; ++i) into[i] += static_cast<double>(parts[i]) * share;
    stage.parameters += static_cast<double>(n) * share;
    if (trains) stage.trainable += static_cast<double>(n) * share;
    stage.modules[ModuleName(t.name)] += n;
    stage.units[t.layer] += n;
  }

  // Note [ZeroRedundancyOptimizer]
  // torch.distributed.optim.ZeroRedundancyOptimizer (--zero 1 --torch-parallel) wraps a local optimizer of
  // the parameters its rank owns (torch/distributed/optim/zero_redundancy_optimizer.py: a sorted-greedy
  // partition by size, so each rank owns close to 1/N of them) and broadcasts each updated parameter from
  // its owner in place. DDP still all-reduces every gradient through its buckets, so the gradients and the
  // buckets are whole on every rank; only the optimizer state (and its step's temporaries) is divided.
  // Measured on gpt2-zero1-2 (validation/fixtures/distributed).
  //
  // Sharding divisors: dense states split over the shard group; expert states
  // over the expert-data-parallel ranks that hold the same experts.
  const Sharding sharding = layout.sharding;
  const double dense_group = layout.shard_group();
  const double expert_group = std::max(1.0, dense_group / layout.expert_parallel);
  const bool shard_optimizer = sharding != Sharding::kReplicated;
  // Note [ZeroRedundancyOptimizer].
  const bool zero_redundancy = sharding == Sharding::kZero1 && !deepspeed;
  const bool shard_grad16 = sharding == Sharding::kZero2 || sharding == Sharding::kZero3 || IsFsdp(sharding);
  const bool shard_weights = sharding == Sharding::kZero3 || IsFsdp(sharding);
  const bool fsdp = IsFsdp(sharding);
  const bool offload_optimizer = layout.offload_optimizer || (fsdp && layout.offload_params);
  const bool offload_params = layout.offload_params;
  const uint64_t w_per = DTypeBytes(precision.weight_dtype, 1);

  auto build = [&](int index) {
    const StageSums& st = sums[static_cast<size_t>(index)];
    ModelStates out;
    out.pipeline_stage = index;
    out.model_parameters = model_parameters;
    out.parameters = static_cast<uint64_t>(st.parameters);
    out.trainable_parameters = static_cast<uint64_t>(st.trainable);
    out.buffers = st.buffers;
    auto part = [&](int i, bool sharded, bool experts = true) {
      const double d = sharded ? dense_group : 1.0;
      const double e = sharded ? expert_group : 1.0;
      return static_cast<uint64_t>(st.dense[i] / d + (experts ? st.expert[i] / e : 0.0));
    };
    uint64_t weights = part(0, shard_weights);
    uint64_t master = part(1, shard_optimizer);
    uint64_t grad = part(2, shard_optimizer && !zero_redundancy);
    uint64_t grad16 = part(3, shard_grad16);
    uint64_t optimizer = part(4, shard_optimizer);
    uint64_t ema = part(6, shard_optimizer);
    // FSDP with mixed precision keeps only the sharded fp32 flat parameters;
    // the 16-bit copies exist while a unit is gathered.
    if (fsdp && precision.master_weights) weights = 0;
    if (fsdp && !precision.master_weights) grad = part(2, true);
    uint64_t host = 0;
    if (offload_optimizer && sharding != Sharding::kReplicated) {
      host += master + grad + grad16 + optimizer;
      master = grad = grad16 = optimizer = 0;
    }
    if (offload_params && shard_weights) {
      host += fsdp && precision.master_weights ? 0 : weights;
      weights = 0;
    }
    out.weights = weights;
    out.master_weights = master;
    out.gradients = grad + grad16;
    out.optimizer_state = optimizer;
    out.fp8_weight_cache = part(5, false);
    if (options.ema == EmaPlacement::kCpu) {
      host += ema;
      ema = 0;
    }
    out.ema_weights = ema;
    out.host_bytes = host;
    // Megatron (tensor/pipeline parallel) reduces from its contiguous
    // main_grad buffer: no second copy.
    if ((sharding == Sharding::kReplicated || zero_redundancy) && layout.data_parallel() > 1 && options.training &&
        !layout.deepspeed_stage0 && layout.tensor_parallel == 1 && layout.pipeline_parallel == 1) {
      // Note [Expert gradients outside DDP's buckets]: an expert's gradient is reduced only over the ranks that
      // hold the same expert (its expert-data-parallel group, data_parallel / expert_parallel ranks), as
      // DeepSpeed-MoE does; where each expert lives on one rank, DDP is told to leave the experts out (as the
      // mixtral-ep-2 fixture runs transformers' expert parallelism) and buckets the dense gradients only.
      // (Here the gradients are whole on every rank.)
      const bool experts_reduced = layout.data_parallel() / layout.expert_parallel > 1;
      out.communication_buffers = part(2, /*sharded=*/false, /*experts=*/experts_reduced);
    }
    for (const auto& [module, elements] : st.modules) {
      if (elements > out.largest_module_parameters) {
        out.largest_module_parameters = elements;
        out.largest_module = module;
      }
    }
    if (sharding == Sharding::kZero3) {
      // DeepSpeed: the largest module's gathered 16-bit parameters and its
      // full gradient before the reduce-scatter (4 bytes/param in 16-bit).
      const uint64_t grad_per = precision.master_weights ? w_per : DTypeBytes(precision.grad_dtype, 1);
      out.gathered_parameters =
          out.largest_module_parameters * (w_per + (options.training ? grad_per : 0));
    } else if (fsdp) {
      uint64_t unit = 0;
      for (const auto& [layer, elements] : st.units) unit = std::max(unit, elements);
      out.gathered_parameters = unit * w_per * (options.training ? 3 : 2);
    }
    return out;
  };

  if (options.pipeline_stage >= stages) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "pipeline stage %d does not exist (pipeline parallel degree %d)", options.pipeline_stage, stages));
  }
  if (options.pipeline_stage >= 0) return build(options.pipeline_stage);
  ModelStates worst = build(0);
  for (int s = 1; s < stages; ++s) {
    ModelStates candidate = build(s);
    if (candidate.gpu_bytes() > worst.gpu_bytes()) worst = candidate;
  }
  return worst;
}

double ParameterShare(const Tensor& t, const ParallelLayout& layout) {
  return ExpertParameterOf(t.name) == ExpertParameter::kPerExpertModule ? 1.0 / layout.expert_parallel : 1.0;
}

}  // namespace headroom

#include "estimators/step_replay.h"

#include <algorithm>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_format.h"
#include "allocator/simulated/simulated_backend.h"
#include "common/checked_math.h"
#include "common/status_macros.h"
#include "estimators/optimizer_state.h"
#include "graph/autograd.h"
#include "graph/liveness.h"
#include "replay/graph_trace.h"
#include "replay/trace_replay.h"

namespace headroom {
namespace {

// PyTorch DDP's default bucket_cap_mb (Note [Resident blocks]).
constexpr uint64_t kDdpBucketBytes = uint64_t{25} << 20;
constexpr size_t kLargestLiveListed = 16;
// Note [Pipeline warm-up in the replay]: warm-up forwards replayed with their transients.
constexpr int kWarmUpsReplayedWhole = 8;

bool IsQuantized(DType dtype) {
  return dtype == DType::kNF4 || dtype == DType::kI8 || dtype == DType::kU8 || dtype == DType::kF8E4M3 ||
         dtype == DType::kF8E5M2;
}

std::string_view CategoryName(BudgetCategory category) {
  switch (category) {
    case BudgetCategory::kWeights: return "weights";
    case BudgetCategory::kMasterWeights: return "master_weights";
    case BudgetCategory::kGradients: return "gradients";
    case BudgetCategory::kOptimizerState: return "optimizer_state";
    case BudgetCategory::kGatheredParameters: return "gathered_parameters";
    case BudgetCategory::kCommunicationBuffers: return "communication_buffers";
    case BudgetCategory::kFp8WeightCache: return "fp8_weight_cache";
    case BudgetCategory::kEmaWeights: return "ema_weights";
    case BudgetCategory::kActivations: return "activations";
    case BudgetCategory::kActivationGradients: return "activation_gradients";
    case BudgetCategory::kTemporaries: return "temporaries";
    case BudgetCategory::kKvCache: return "kv_cache";
    case BudgetCategory::kRecurrentState: return "recurrent_state";
    case BudgetCategory::kCublasWorkspace: return "cublas_workspace";
  }
  return "weights";
}

// Appends `total` bytes as blocks in proportion to `weights`, each weight's
// share cut into `pieces` blocks; one block when `one_block` or when no
// weight is positive. The blocks sum to `total` (the last positive weight
// takes what the rounding down left).
void AppendSplit(uint64_t total, std::span<const uint64_t> weights, BudgetCategory category, bool one_block,
                 int pieces, std::vector<ResidentBlock>& out) {
  if (total == 0) return;
  uint64_t sum = 0;  // parameters are at most 2^44 elements (Note [Model size bounds]): no wrap
  size_t last = weights.size();
  for (size_t i = 0; i < weights.size(); ++i) {
    sum += weights[i];
    if (weights[i] > 0) last = i;
  }
  if (one_block || sum == 0) {
    out.push_back({.bytes = total, .category = category});
    return;
  }
  // Exact per-tensor sizes when the category has one bytes-per-unit figure.
  const bool exact = total % sum == 0;
  uint64_t given = 0;
  for (size_t i = 0; i <= last; ++i) {
    if (weights[i] == 0) continue;
    uint64_t share = total - given;
    if (i != last) {
      share = exact ? total / sum * weights[i]
                    : static_cast<uint64_t>(static_cast<long double>(total) * static_cast<long double>(weights[i]) /
                                            static_cast<long double>(sum));
      share = std::min(share, total - given);
    }
    given += share;
    const auto n = static_cast<uint64_t>(pieces);
    for (uint64_t p = 0; p < n; ++p) {
      const uint64_t piece = p + 1 == n ? share - share / n * (n - 1) : share / n;
      if (piece > 0) out.push_back({.bytes = piece, .category = category});
    }
  }
}

// Note [FSDP units in the step]: each unit's gathered parameters, unsharded
// gradients and, when they come and go with the step, its gradient shard
// (states.gradients split over the units by their trainable elements).
void AppendFsdpUnits(const Graph& forward, const ModelStates& states, const JobSpec& job, const EstimateSetup& setup,
                     bool gradients_by_unit, std::vector<ResidentBlock>& out) {
  std::map<int, uint64_t> elements, trained;  // unit -> parameter elements this rank gathers (its experts')
  for (const Tensor& t : forward.tensors()) {
    if (t.role != TensorRole::kParameter) continue;
    const int unit = std::max(t.layer, -1);
    const auto n = static_cast<uint64_t>(static_cast<double>(t.elements()) * ParameterShare(t, job.layout));
    elements[unit] += n;
    trained[unit] += job.training && t.trainable && !IsQuantized(t.dtype) ? n : 0;
  }
  uint64_t all_trained = 0;
  for (const auto& [unit, n] : trained) all_trained += n;
  const uint64_t gathered_per = DTypeBytes(setup.precision.weight_dtype, 1);
  const FsdpBlock parameters = ReshardsAfterForward(job.layout.sharding) ? FsdpBlock::kParameters
                                                                          : FsdpBlock::kParametersUntilBackward;
  uint64_t shards_left = gradients_by_unit ? states.gradients : 0;
  uint64_t trained_left = all_trained;
  for (const auto& [unit, n] : elements) {
    out.push_back({.bytes = n * gathered_per, .category = BudgetCategory::kGatheredParameters, .fsdp = parameters,
                   .fsdp_unit = unit});
    const uint64_t t = trained[unit];
    if (t == 0) continue;
    out.push_back({.bytes = t * gathered_per, .category = BudgetCategory::kGradients,
                   .fsdp = FsdpBlock::kUnshardedGradients, .fsdp_unit = unit});
    if (shards_left == 0) continue;
    // The last unit takes what rounding left, so the shards sum to the category's bytes.
    const double share = static_cast<double>(t) / static_cast<double>(all_trained);
    const uint64_t shard =
        t == trained_left ? shards_left
                          : std::min(shards_left, static_cast<uint64_t>(static_cast<double>(states.gradients) * share));
    out.push_back({.bytes = shard, .category = BudgetCategory::kGradients, .fsdp = FsdpBlock::kShardedGradients,
                   .fsdp_unit = unit});
    shards_left -= shard;
    trained_left -= t;
  }
}

// Appends `total` bytes as blocks of `chunk` bytes, the last one smaller.
void AppendChunks(uint64_t total, uint64_t chunk, BudgetCategory category, std::vector<ResidentBlock>& out) {
  for (uint64_t given = 0; given < total; given += chunk) {
    out.push_back({.bytes = std::min(chunk, total - given), .category = category});
  }
}

BudgetCategory CategoryOf(const Graph& step, const Tensor& t, bool autocast) {
  if (t.role == TensorRole::kGradient) {
    return IsParameterGradient(step, t) ? BudgetCategory::kGradients : BudgetCategory::kActivationGradients;
  }
  if (t.role == TensorRole::kTemporary) return BudgetCategory::kTemporaries;
  if (autocast) {
    // autocast's 16-bit copy of a parameter (Note [Which framework a setup means]).
    const OpId producer = step.producer(t.id);
    if (producer != kNone) {
      const Op& op = step.op(producer);
      if (op.kind == "cast" && !op.inputs.empty() && step.tensor(op.inputs[0]).role == TensorRole::kParameter) {
        return BudgetCategory::kWeights;
      }
    }
  }
  return BudgetCategory::kActivations;
}

// Where in the sequence an allocation happens, for naming the peak.
enum class Site : uint8_t { kResident, kWarmUp, kStep, kOptimizer };

// Writes the sequence's events and follows its requested bytes by category.
class SequenceWriter {
 public:
  explicit SequenceWriter(StepAllocations& out) : out_(out) {}

  // The allocation's trace pointer (0 when nothing was allocated: 0 bytes,
  // or an error is pending).
  uint64_t Allocate(uint64_t bytes, BudgetCategory category, uint64_t stream, uint64_t time, Site site, OpId op) {
    if (bytes == 0 || !status_.ok()) return 0;
    if (bytes > kMaxSimulatedCapacity - live_total_) {
      const auto largest = std::max_element(live_.begin(), live_.end());
      status_ = absl::OutOfRangeError(absl::StrFormat(
          "the step would hold more than the %d bytes (64 PiB) an allocator replay can simulate at once "
          "(%s: %d bytes live, and %d more of %s)",
          kMaxSimulatedCapacity, CategoryName(static_cast<BudgetCategory>(largest - live_.begin())), *largest, bytes,
          CategoryName(category)));
      return 0;
    }
    const uint64_t pointer = next_pointer_;
    next_pointer_ += 512;
    Add(TraceOp::kAllocate, pointer, bytes, stream, time);
    live_[CategoryIndex(category)] += bytes;
    live_total_ += bytes;
    if (counting_peak_ && live_total_ > out_.peak_bytes) {
      out_.peak_bytes = live_total_;
      out_.bytes_at_peak = live_;
      out_.peak_op = site == Site::kResident || site == Site::kOptimizer ? kNone : op;
      out_.peak_in_warm_up = site == Site::kWarmUp;
      out_.peak_at_optimizer_temporaries = site == Site::kOptimizer;
    }
    return pointer;
  }

  void Free(uint64_t pointer, uint64_t bytes, BudgetCategory category, uint64_t stream, uint64_t time) {
    if (pointer == 0) return;
    Add(TraceOp::kFree, pointer, bytes, stream, time);
    live_[CategoryIndex(category)] -= bytes;
    live_total_ -= bytes;
  }

  const absl::Status& status() const { return status_; }
  // Off while the first step runs (Note [The first step in the replay]).
  void set_counting_peak(bool counting) { counting_peak_ = counting; }

 private:
  void Add(TraceOp op, uint64_t pointer, uint64_t bytes, uint64_t stream, uint64_t time) {
    out_.trace.events.push_back({.op = op, .pointer = pointer, .size = bytes, .stream = stream, .time_ns = time,
                                 .line = out_.trace.events.size() + 2});  // the CSV line, after the header
  }

  StepAllocations& out_;
  CategoryBytes live_{};
  uint64_t live_total_ = 0;
  uint64_t next_pointer_ = kPlanTraceBaseAddress;
  absl::Status status_;
  bool counting_peak_ = true;
};

// A tensor of an in-flight micro-batch kept past its forward.
struct HeldBlock {
  uint64_t pointer;
  uint64_t bytes;
  BudgetCategory category;
};

// Note [FSDP units in the step]: when each unit block is allocated and freed,
// by op. At an op: `before` blocks are allocated ahead of its tensors; after
// its frees, `after` blocks are allocated, then `release` blocks freed.
// Indices are into the step's unit blocks.
struct FsdpSchedule {
  std::map<OpId, std::vector<size_t>> before, after, release;
};

FsdpSchedule ScheduleFsdpUnits(const Graph& step, std::span<const ResidentBlock> units) {
  struct UnitOps {
    OpId first_forward = kNone, last_forward = kNone, first_backward = kNone, last_backward = kNone;
    OpId first_gradient = kNone;  // the first op that makes a gradient of the unit's parameters
  };
  std::map<int, UnitOps> ops;
  OpId backward_end = kNone;
  auto first = [](OpId& at, OpId op) { at = at == kNone ? op : at; };
  for (const Op& op : step.ops()) {
    if (op.phase == Phase::kOptimizer) continue;
    UnitOps& u = ops[std::max(op.layer, -1)];
    // A replayed forward op runs in backward, after the gradients of the units behind it.
    if (op.phase == Phase::kBackward || op.recompute) {
      first(u.first_backward, op.id);
      u.last_backward = op.id;
      backward_end = op.id;
      for (TensorId out : op.outputs) {
        if (IsParameterGradient(step, step.tensor(out))) first(u.first_gradient, op.id);
      }
    } else {
      first(u.first_forward, op.id);
      u.last_forward = op.id;
    }
  }
  const OpId last_op = static_cast<OpId>(step.num_ops()) - 1;
  // The root is gathered from the first op until backward ends (the whole step without one).
  UnitOps& root = ops[-1];
  root.first_forward = 0;
  root.last_backward = backward_end != kNone ? backward_end : last_op;
  // Backward order: the unit whose backward starts just before a block's prefetches it; the first one (the
  // root's, which runs the loss's backward) prefetches the last block.
  std::vector<std::pair<OpId, int>> backward_order;
  for (const auto& [unit, u] : ops) {
    if (u.first_backward != kNone) backward_order.emplace_back(u.first_backward, unit);
  }
  std::sort(backward_order.begin(), backward_order.end());
  std::map<int, OpId> prefetch;
  for (size_t i = 0; i < backward_order.size(); ++i) {
    prefetch[backward_order[i].second] = i == 0 ? backward_order[0].first : backward_order[i - 1].first;
  }

  FsdpSchedule out;
  for (size_t i = 0; i < units.size(); ++i) {
    const ResidentBlock& block = units[i];
    const UnitOps& u = ops[block.fsdp_unit];
    const OpId end = u.last_backward != kNone ? u.last_backward : u.last_forward;
    // A unit none of whose ops say its layer (a graph file's) is held as the root is.
    const bool as_root = block.fsdp_unit < 0 || (u.first_forward == kNone && u.first_backward == kNone);
    switch (block.fsdp) {
      case FsdpBlock::kParameters:
        if (as_root) {
          out.before[0].push_back(i);
          out.release[root.last_backward].push_back(i);
          break;
        }
        if (u.first_forward != kNone) {
          out.before[u.first_forward].push_back(i);
          out.release[u.last_forward].push_back(i);
        }
        if (u.first_backward != kNone) {
          out.before[prefetch[block.fsdp_unit]].push_back(i);
          out.release[u.last_backward].push_back(i);
        }
        break;
      case FsdpBlock::kParametersUntilBackward: {
        out.before[as_root ? 0 : u.first_forward != kNone ? u.first_forward : u.first_backward].push_back(i);
        out.release[as_root ? root.last_backward : end].push_back(i);
        break;
      }
      case FsdpBlock::kUnshardedGradients:
        if (u.first_gradient == kNone) break;
        out.before[u.first_gradient].push_back(i);
        out.release[block.fsdp_unit < 0 ? root.last_backward : end].push_back(i);
        break;
      case FsdpBlock::kShardedGradients:  // the reduce-scatter's output, kept until the step ends
        if (u.first_gradient == kNone) break;
        out.after[block.fsdp_unit < 0 ? root.last_backward : end].push_back(i);
        break;
      case FsdpBlock::kResident:
        break;
    }
  }
  return out;
}

// The first attention op (eager attention's core, or a fused attention
// kernel) of each layer that has one, in op order.
std::vector<OpId> FirstAttentionOps(const Graph& step) {
  std::vector<OpId> first;
  std::vector<int> seen;
  for (const Op& op : step.ops()) {
    if (op.phase != Phase::kForward || op.recompute || op.layer < 0) continue;
    if (!op.attention_core && BackwardRuleFor(step, op) != BackwardRule::kFlashAttention) continue;
    if (std::find(seen.begin(), seen.end(), op.layer) != seen.end()) continue;
    seen.push_back(op.layer);
    first.push_back(op.id);
  }
  return first;
}

}  // namespace

std::vector<ResidentBlock> ResidentBlocks(const Graph& forward, const ModelStates& states, const JobSpec& job,
                                          const EstimateSetup& setup, const ResidentExtras& extras) {
  // Note [Resident blocks].
  const bool flat = setup.framework == Framework::kDeepSpeed || setup.framework == Framework::kFsdp;
  const bool flat_gradients = flat || setup.framework == Framework::kMegatron;
  const DType state_dtype = setup.precision.master_weights ? DType::kF32 : setup.precision.optimizer_state_dtype;
  std::vector<uint64_t> weight_bytes, buffer_bytes, matrix_elements, trained_elements, state_bytes;
  for (const Tensor& t : forward.tensors()) {
    if (t.role == TensorRole::kBuffer) buffer_bytes.push_back(t.bytes());
    if (t.role != TensorRole::kParameter) continue;
    weight_bytes.push_back(t.bytes());
    matrix_elements.push_back(t.shape.size() == 2 ? t.elements() : 0);
    const bool trains = job.training && t.trainable && !IsQuantized(t.dtype);
    trained_elements.push_back(trains ? t.elements() : 0);
    state_bytes.push_back(trains ? OptimizerStateBytes(job.optimizer, t.shape, state_dtype) : 0);
  }
  const int moments = job.optimizer == Optimizer::kAdamW || job.optimizer == Optimizer::kAdam8bit ? 2 : 1;
  std::vector<ResidentBlock> out;
  AppendSplit(states.weights, weight_bytes, BudgetCategory::kWeights, flat, 1, out);
  AppendSplit(states.buffers, buffer_bytes, BudgetCategory::kWeights, false, 1, out);
  AppendSplit(states.fp8_weight_cache, matrix_elements, BudgetCategory::kFp8WeightCache, false, 1, out);
  AppendSplit(states.ema_weights, trained_elements, BudgetCategory::kEmaWeights, flat, 1, out);
  AppendChunks(states.communication_buffers, kDdpBucketBytes, BudgetCategory::kCommunicationBuffers, out);
  AppendSplit(states.master_weights, trained_elements, BudgetCategory::kMasterWeights, flat, 1, out);
  // Note [FSDP units in the step]: a single micro-batch's gradient shards come and go with the step.
  const bool fsdp_units = IsFsdp(job.layout.sharding);
  const bool gradients_by_unit = fsdp_units && job.training && job.grad_accum == 1 && !job.keep_gradients;
  // Note [Gradients: resident or by liveness]: the others are step tensors.
  if (setup.persistent_gradients && !gradients_by_unit) {
    AppendSplit(states.gradients, trained_elements, BudgetCategory::kGradients, flat_gradients, 1, out);
  }
  const size_t first_state = out.size();
  AppendSplit(states.optimizer_state, state_bytes, BudgetCategory::kOptimizerState, flat, moments, out);
  // Note [The first step in the replay]: torch.optim's state appears in the first step() call.
  for (size_t i = first_state; i < out.size(); ++i) out[i].from_first_step = !flat && !setup.persistent_gradients;
  if (fsdp_units) {
    AppendFsdpUnits(forward, states, job, setup, gradients_by_unit, out);
  } else {
    AppendSplit(states.gathered_parameters, {}, BudgetCategory::kGatheredParameters, true, 1, out);
  }
  if (extras.kv_cache > 0) {
    const auto layers = static_cast<uint64_t>(std::max(1, extras.kv_cache_layers));
    if (extras.kv_cache_in_forward) {
      // Note [KV cache in the forward]: each layer's keys and values, two tensors.
      const size_t first_kv = out.size();
      AppendChunks(extras.kv_cache, CeilDiv(extras.kv_cache, 2 * layers), BudgetCategory::kKvCache, out);
      for (size_t i = first_kv; i < out.size(); ++i) out[i].attention_layer = static_cast<int>((i - first_kv) / 2);
    } else {
      AppendChunks(extras.kv_cache, CeilDiv(extras.kv_cache, layers), BudgetCategory::kKvCache, out);
    }
  }
  for (uint64_t bytes : extras.recurrent_state) {
    out.push_back({.bytes = bytes, .category = BudgetCategory::kRecurrentState});
  }
  // Note [cuBLAS workspace in the replay]: one per handle and stream, on its stream.
  for (int s = 0; s < extras.streams && extras.cublas_workspace > 0; ++s) {
    for (int h = 0; h < extras.cublas_handles; ++h) {
      out.push_back({.bytes = extras.cublas_workspace, .category = BudgetCategory::kCublasWorkspace,
                     .stream = static_cast<uint64_t>(s)});
    }
  }
  return out;
}

namespace {

// BuildStepAllocations's work, one object per call: the stages Build() runs,
// in order, over the state they share (the writer, each tensor's pointer,
// the clock, the blocks still to place).
class StepSequenceBuilder {
 public:
  // `step` has passed CheckBounds().
  StepSequenceBuilder(const Graph& step, std::span<const ResidentBlock> resident, const StepSequenceOptions& options)
      : step_(step),
        resident_(resident),
        temporaries_(options.optimizer_temporaries),
        life_(ComputeLifetimes(step, options.profile)),
        order_(step, life_),
        num_ops_(static_cast<OpId>(step.num_ops())),
        category_(CategorizeTensors(step, life_, options.autocast)),
        forward_end_(ForwardEnd(step)),
        first_optimizer_op_(FirstOptimizerOp(step)),
        in_flight_(std::max(1, options.in_flight)),
        temporary_tensors_(static_cast<uint64_t>(std::max(1, temporaries_.tensors))) {
    out_.trace = {.source = step.name(), .format = "rmm-csv", .events = {}};
  }

  absl::StatusOr<StepAllocations> Build() && {
    ReserveEvents();
    PlaceResidentBlocks();
    unit_schedule_ = ScheduleFsdpUnits(step_, units_);
    unit_pointer_.assign(units_.size(), 0);
    pointer_.assign(step_.num_tensors(), 0);
    // Note [The first step in the replay]: the first and the last steps' peaks are never the sequence's.
    const int steps = from_first_step_.empty() ? 1 : kStepsUntilSettled;
    if (steps > 1) {
      writer_.set_counting_peak(false);
      RunStep();
      writer_.set_counting_peak(true);
    }
    ReplayWarmUpForwards();
    RunStep();
    writer_.set_counting_peak(false);
    for (int settling = 2; settling < steps; ++settling) RunStep();
    writer_.set_counting_peak(true);
    HEADROOM_RETURN_IF_ERROR(writer_.status());
    ListLargestLiveAtThePeak();
    return std::move(out_);
  }

 private:
  static std::vector<BudgetCategory> CategorizeTensors(const Graph& step, const std::vector<TensorLifetime>& life,
                                                       bool autocast) {
    std::vector<BudgetCategory> category(step.num_tensors(), BudgetCategory::kActivations);
    for (const Tensor& t : step.tensors()) {
      const TensorLifetime& l = life[static_cast<size_t>(t.id)];
      if (l.first <= l.last) category[static_cast<size_t>(t.id)] = CategoryOf(step, t, autocast);
    }
    return category;
  }

  // The last op of the forward part (forward and loss ops before the first
  // backward or optimizer op); -1 when there is none.
  static OpId ForwardEnd(const Graph& step) {
    const auto num_ops = static_cast<OpId>(step.num_ops());
    OpId forward_end = -1;
    while (forward_end + 1 < num_ops && (step.op(forward_end + 1).phase == Phase::kForward ||
                                         step.op(forward_end + 1).phase == Phase::kLoss)) {
      ++forward_end;
    }
    return forward_end;
  }

  // The first optimizer op; the number of ops when there is none.
  static OpId FirstOptimizerOp(const Graph& step) {
    for (const Op& op : step.ops()) {
      if (op.phase == Phase::kOptimizer) return op.id;
    }
    return static_cast<OpId>(step.num_ops());
  }

  void ReserveEvents() {
    out_.trace.events.reserve(resident_.size() + 2 * order_.num_allocations() * static_cast<size_t>(in_flight_) +
                              2 * temporaries_.bytes.size() * temporary_tensors_);
  }

  // Sorts the resident blocks by when they are allocated and allocates those
  // held from the start: FSDP units follow their schedule, the optimizer
  // state waits for the first step, a KV cache the forward fills waits for
  // its layer's first attention op.
  void PlaceResidentBlocks() {
    // Note [KV cache in the forward]: blocks the forward fills, where it has an attention layer for each.
    int filled_layers = 0;
    for (const ResidentBlock& block : resident_) filled_layers = std::max(filled_layers, block.attention_layer + 1);
    const std::vector<OpId> attention_ops = filled_layers > 0 ? FirstAttentionOps(step_) : std::vector<OpId>{};
    const bool fill_in_forward = filled_layers > 0 && static_cast<size_t>(filled_layers) == attention_ops.size();
    for (const ResidentBlock& block : resident_) {
      if (block.fsdp != FsdpBlock::kResident) {
        units_.push_back(block);  // Note [FSDP units in the step]
      } else if (block.from_first_step) {
        from_first_step_.push_back(block);
      } else if (fill_in_forward && block.attention_layer >= 0) {
        filled_at_[attention_ops[static_cast<size_t>(block.attention_layer)]].push_back(block);
      } else {
        writer_.Allocate(block.bytes, block.category, block.stream, 0, Site::kResident, kNone);
      }
    }
  }

  void AllocateUnits(const std::map<OpId, std::vector<size_t>>& at, OpId op, uint64_t now) {
    if (auto it = at.find(op); it != at.end()) {
      for (size_t i : it->second) {
        unit_pointer_[i] = writer_.Allocate(units_[i].bytes, units_[i].category, 0, now, Site::kStep, op);
      }
    }
  }

  void FreeUnit(size_t i, uint64_t now) {
    writer_.Free(unit_pointer_[i], units_[i].bytes, units_[i].category, 0, now);
    unit_pointer_[i] = 0;
  }

  void FreeTensor(TensorId id, uint64_t now) {
    uint64_t& p = pointer_[static_cast<size_t>(id)];
    writer_.Free(p, step_.tensor(id).bytes(), category_[static_cast<size_t>(id)], 0, now);
    p = 0;
  }

  // Backward is over: 1F1B's cool-down frees the held blocks, then the first
  // step creates the optimizer state and the optimizer allocates its
  // temporaries while every gradient is live.
  void RunOptimizerStep(OpId at) {
    const uint64_t now = time_ + static_cast<uint64_t>(at);
    for (const HeldBlock& h : held_) writer_.Free(h.pointer, h.bytes, h.category, 0, now);
    held_.clear();
    for (const ResidentBlock& block : from_first_step_) {
      writer_.Allocate(block.bytes, block.category, block.stream, now, Site::kResident, kNone);
    }
    from_first_step_.clear();
    // Each parameter's temporaries are `temporary_tensors_` blocks, live together (Note [Optimizer step
    // transients]).
    std::vector<std::pair<uint64_t, uint64_t>> live;  // pointer, bytes
    auto free_live = [&] {
      for (const auto& [p, bytes] : live) writer_.Free(p, bytes, BudgetCategory::kTemporaries, 0, now);
      live.clear();
    };
    for (uint64_t bytes : temporaries_.bytes) {
      const uint64_t share = bytes / temporary_tensors_;
      for (uint64_t i = 0; i < temporary_tensors_; ++i) {
        const uint64_t piece = i + 1 == temporary_tensors_ ? bytes - share * (temporary_tensors_ - 1) : share;
        live.emplace_back(writer_.Allocate(piece, BudgetCategory::kTemporaries, 0, now, Site::kOptimizer, at), piece);
      }
      if (!temporaries_.together) free_live();
    }
    free_live();
  }

  // The step itself (Note [Plan trace order]).
  void RunStep() {
    for (OpId op = 0; op < num_ops_; ++op) {
      const uint64_t now = time_ + static_cast<uint64_t>(op);
      if (op == first_optimizer_op_) RunOptimizerStep(op);
      // Resident from then on: the first step fills the cache, later ones find it.
      if (auto filled = filled_at_.find(op); filled != filled_at_.end()) {
        for (const ResidentBlock& block : filled->second) {
          writer_.Allocate(block.bytes, block.category, block.stream, now, Site::kStep, op);
        }
        filled_at_.erase(filled);
      }
      AllocateUnits(unit_schedule_.before, op, now);
      for (TensorId id : order_.Beginning(op)) {
        pointer_[static_cast<size_t>(id)] =
            writer_.Allocate(step_.tensor(id).bytes(), category_[static_cast<size_t>(id)], 0, now, Site::kStep, op);
      }
      // A step without optimizer ops (a graph file's): at its last op, before its frees.
      if (op + 1 == num_ops_ && first_optimizer_op_ == num_ops_) RunOptimizerStep(op);
      for (TensorId id : order_.Ending(op)) FreeTensor(id, now);
      AllocateUnits(unit_schedule_.after, op, now);
      if (auto it = unit_schedule_.release.find(op); it != unit_schedule_.release.end()) {
        for (size_t i : it->second) FreeUnit(i, now);
      }
    }
    if (num_ops_ == 0) RunOptimizerStep(0);
    time_ += static_cast<uint64_t>(num_ops_) + 1;
    // What outlives the step's last op (its outputs, gradient shards) is dropped before the next step.
    for (TensorId id = 0; id < static_cast<TensorId>(pointer_.size()); ++id) FreeTensor(id, time_);
    for (size_t i = 0; i < units_.size(); ++i) FreeUnit(i, time_);
  }

  // Note [Pipeline warm-up in the replay]: the other micro-batches' forwards, later ones' held tensors only.
  void ReplayWarmUpForwards() {
    for (int micro_batch = 1; micro_batch < in_flight_; ++micro_batch) {
      const bool whole = micro_batch <= kWarmUpsReplayedWhole;
      for (OpId op = 0; op <= forward_end_; ++op) {
        const uint64_t now = time_ + static_cast<uint64_t>(op);
        for (TensorId id : order_.Beginning(op)) {
          const Tensor& t = step_.tensor(id);
          if (t.role == TensorRole::kGradient) continue;  // gradient buffers are shared by the micro-batches
          if (!whole && life_[static_cast<size_t>(id)].last <= forward_end_) continue;
          const BudgetCategory c = category_[static_cast<size_t>(id)];
          const uint64_t p = writer_.Allocate(t.bytes(), c, 0, now, Site::kWarmUp, op);
          if (life_[static_cast<size_t>(id)].last > forward_end_) {
            held_.push_back({.pointer = p, .bytes = t.bytes(), .category = c});
          } else {
            pointer_[static_cast<size_t>(id)] = p;
          }
        }
        if (!whole) continue;  // a later warm-up's transients were not allocated
        for (TensorId id : order_.Ending(op)) FreeTensor(id, now);
      }
      time_ += static_cast<uint64_t>(forward_end_ + 1);
    }
  }

  // The step's largest tensors live at the peak, when it is at an op of the step itself.
  void ListLargestLiveAtThePeak() {
    if (out_.peak_op == kNone || out_.peak_in_warm_up) return;
    for (const Tensor& t : step_.tensors()) {
      const TensorLifetime& l = life_[static_cast<size_t>(t.id)];
      if (l.first <= out_.peak_op && out_.peak_op <= l.last && t.bytes() > 0) out_.largest_live.push_back(t.id);
    }
    auto larger = [&](TensorId a, TensorId b) {
      const uint64_t x = step_.tensor(a).bytes(), y = step_.tensor(b).bytes();
      return x != y ? x > y : a < b;
    };
    const size_t listed = std::min(kLargestLiveListed, out_.largest_live.size());
    std::partial_sort(out_.largest_live.begin(), out_.largest_live.begin() + static_cast<ptrdiff_t>(listed),
                      out_.largest_live.end(), larger);
    out_.largest_live.resize(listed);
  }

  const Graph& step_;
  const std::span<const ResidentBlock> resident_;
  const OptimizerTemporaries& temporaries_;
  const std::vector<TensorLifetime> life_;
  const GraphEventOrder order_;
  const OpId num_ops_;
  const std::vector<BudgetCategory> category_;  // by tensor id
  const OpId forward_end_;
  const OpId first_optimizer_op_;
  const int in_flight_;
  const uint64_t temporary_tensors_;

  StepAllocations out_;
  SequenceWriter writer_{out_};
  std::vector<ResidentBlock> from_first_step_;             // allocated by the first step's optimizer
  std::vector<ResidentBlock> units_;                       // Note [FSDP units in the step]
  std::map<OpId, std::vector<ResidentBlock>> filled_at_;  // by the op that allocates them (once)
  FsdpSchedule unit_schedule_;
  std::vector<uint64_t> unit_pointer_;  // by index into units_; 0 when not allocated
  std::vector<uint64_t> pointer_;       // by tensor id; 0 when not allocated
  std::vector<HeldBlock> held_;         // in-flight micro-batches' tensors kept past their forward
  uint64_t time_ = 0;
};

}  // namespace

absl::StatusOr<StepAllocations> BuildStepAllocations(const Graph& step, std::span<const ResidentBlock> resident,
                                                     const StepSequenceOptions& options) {
  HEADROOM_RETURN_IF_ERROR(step.CheckBounds());
  return StepSequenceBuilder(step, resident, options).Build();
}

absl::StatusOr<AllocatorReplay> ReplayAllocations(const StepAllocations& sequence, const AllocatorOptions& allocator,
                                                  uint64_t device_bytes) {
  AllocatorReplay out;
  auto take = [&](const ReplayResult& r) -> absl::Status {
    // The replay walks the sequence the estimate was read from: same peak.
    if (r.peak_live_bytes != sequence.peak_bytes) {
      return absl::InternalError(absl::StrFormat(
          "allocator replay of '%s': %d bytes live at the peak, where the sequence has %d", sequence.trace.source,
          r.peak_live_bytes, sequence.peak_bytes));
    }
    out.peak_allocated_bytes = r.peak_allocated_bytes;
    out.peak_reserved_bytes = r.peak_reserved_bytes;
    return absl::OkStatus();
  };
  if (sequence.peak_bytes == 0) return out;  // nothing to allocate, on any device
  // Note [Replay capacity]: at the GPU's size first.
  const uint64_t device = std::min(device_bytes, kMaxSimulatedCapacity);
  if (device > 0 && sequence.peak_bytes <= device) {
    HEADROOM_ASSIGN_OR_RETURN(const ReplayResult r,
                              ReplayTrace(sequence.trace, {.capacity_bytes = device,
                                                           .allocator = allocator,
                                                           .strict = true,
                                                           .stop_at_first_oom = true}));
    if (r.ooms == 0 && r.alloc_retries == 0) {
      HEADROOM_RETURN_IF_ERROR(take(r));
      return out;
    }
  }
  AllocatorOptions unlimited = allocator;
  unlimited.memory_fraction = 1.0;
  unlimited.hard_limit_bytes = 0;
  HEADROOM_ASSIGN_OR_RETURN(const ReplayResult r, ReplayTrace(sequence.trace, {.capacity_bytes = kMaxSimulatedCapacity,
                                                                               .allocator = unlimited,
                                                                               .strict = true}));
  if (r.ooms > 0) {
    return absl::OutOfRangeError(absl::StrFormat(
        "the step's %d bytes at its peak need more than the %d bytes (64 PiB) an allocator replay can simulate",
        sequence.peak_bytes, kMaxSimulatedCapacity));
  }
  HEADROOM_RETURN_IF_ERROR(take(r));
  out.out_of_memory = true;
  return out;
}

}  // namespace headroom

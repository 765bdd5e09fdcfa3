#include "planner/chain.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <utility>

#include "absl/strings/str_format.h"
#include "common/checked_math.h"
#include "common/quote.h"
#include "common/status_macros.h"
#include "common/units.h"
#include "graph/training_step.h"
#include "planner/checkpoint_mode_plan.h"
#include "planner/schedule.h"

namespace headroom {
namespace {

// Note [Chain memory model]: every sum the DP and the evaluators form is a
// sum of some of the chain's byte figures, so bounding their total keeps all
// of them exact in uint64_t (with room for a budget beside them).
constexpr uint64_t kMaxChainBytes = uint64_t{1} << 62;

bool ValidCost(double cost) { return std::isfinite(cost) && cost >= 0; }

}  // namespace

absl::Status Chain::Validate() const {
  if (stages.empty()) return absl::InvalidArgumentError("chain has no stages");
  uint64_t total = SaturatingAdd(SaturatingAdd(fixed_bytes, tail_bytes), outside_peak_bytes);
  for (size_t i = 0; i < stages.size(); ++i) {
    const ChainStage& s = stages[i];
    if (!ValidCost(s.forward_cost)) {
      return absl::InvalidArgumentError(
          absl::StrFormat("chain stage %d: forward_cost %g is not a finite non-negative cost", i, s.forward_cost));
    }
    if (!ValidCost(s.boundary_cost)) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "chain stage %d: boundary_cost %g is not a finite non-negative cost", i, s.boundary_cost));
    }
    if (!ValidCost(s.selective_cost)) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "chain stage %d: selective_cost %g is not a finite non-negative cost", i, s.selective_cost));
    }
    if (s.input_bytes > s.all_bytes) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "chain stage %d: input_bytes %d exceeds all_bytes %d; a stage kept whole holds its input "
          "(Note [Chain memory model])",
          i, s.input_bytes, s.all_bytes));
    }
    if (s.has_attention_core && s.selective_bytes > s.all_bytes) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "chain stage %d: selective_bytes %d exceeds all_bytes %d; selective recomputation holds a subset",
          i, s.selective_bytes, s.all_bytes));
    }
    for (uint64_t bytes : {s.input_bytes, s.all_bytes, s.selective_bytes, s.backward_bytes}) {
      total = SaturatingAdd(total, bytes);
    }
    if (total >= kMaxChainBytes) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "chain stage %d: the chain's byte figures up to this stage sum to 2^62 or more; no plan's sums "
          "could be kept exact",
          i));
    }
  }
  return absl::OkStatus();
}

namespace {

// Which part of the step an op of the store-all step belongs to, for
// ExtractLayerChain: a stage (its layer), the tail, or outside the chain.
struct Regions {
  static constexpr int kOutside = -1;
  static constexpr int kTail = -2;
  std::vector<int> of_op;  // indexed by step OpId
};

// Forward and backward ops of a layer belong to its stage; the other ops
// between the first layer op and the last layer backward op belong to the
// next layer op's stage, or to the tail when between the last layer's forward
// and the first layer's backward. The rest (embeddings, their backward, the
// optimizer, whose ops carry their parameter's layer) is outside the chain.
bool IsLayerOp(const Op& op) { return op.layer >= 0 && (op.phase == Phase::kForward || op.phase == Phase::kBackward); }

Regions RegionsOf(const Graph& step) {
  Regions r;
  const auto n = static_cast<OpId>(step.num_ops());
  r.of_op.assign(static_cast<size_t>(n), Regions::kOutside);
  OpId first_layer_op = kNone, last_layer_forward = kNone, first_layer_backward = kNone,
       last_layer_backward = kNone;
  for (const Op& op : step.ops()) {
    if (!IsLayerOp(op)) continue;
    if (first_layer_op == kNone) first_layer_op = op.id;
    if (op.phase == Phase::kBackward) {
      if (first_layer_backward == kNone) first_layer_backward = op.id;
      last_layer_backward = op.id;
    } else {
      last_layer_forward = op.id;
    }
  }
  int next_layer = Regions::kOutside;
  for (OpId id = n - 1; id >= 0; --id) {
    const Op& op = step.op(id);
    if (IsLayerOp(op)) {
      next_layer = op.layer;
      r.of_op[static_cast<size_t>(id)] = op.layer;
    } else if (id > last_layer_forward && id < first_layer_backward) {
      r.of_op[static_cast<size_t>(id)] = Regions::kTail;
    } else if (id > first_layer_op && id < last_layer_backward) {
      r.of_op[static_cast<size_t>(id)] = next_layer;
    }
  }
  return r;
}

// The step under PlanForMode's `mode`, replayed as torch.utils.checkpoint
// does (SegmentSchedule): its profile, and per layer what the replays cost.
struct Replayed {
  MemoryProfile profile;
  std::vector<double> cost_by_layer;
};

absl::StatusOr<Replayed> ReplayWith(const Graph& step, std::span<const double> op_cost, CheckpointMode mode,
                                    const ProfileOptions& profile, int num_layers) {
  HEADROOM_ASSIGN_OR_RETURN(CheckpointPlan plan, PlanForMode(step, mode));
  HEADROOM_ASSIGN_OR_RETURN(Schedule schedule, SegmentSchedule(step, plan));
  HEADROOM_ASSIGN_OR_RETURN(Graph scheduled, MaterializeSchedule(step, schedule));
  Replayed r{.profile = ProfileMemory(scheduled, profile),
             .cost_by_layer = std::vector<double>(static_cast<size_t>(num_layers), 0)};
  for (const ScheduleEntry& e : schedule.entries) {
    const int layer = step.op(e.target).layer;
    if (e.action == ScheduleAction::kRecompute && layer >= 0) {
      r.cost_by_layer[static_cast<size_t>(layer)] += op_cost[static_cast<size_t>(e.target)];
    }
  }
  return r;
}

uint64_t LayerBytes(const MemoryProfile& p, int layer) {
  const auto i = static_cast<size_t>(layer);
  return i < p.saved_bytes_by_layer.size() ? p.saved_bytes_by_layer[i] : 0;
}

}  // namespace

absl::StatusOr<Chain> ExtractLayerChain(const Graph& forward_or_step, std::span<const double> op_cost,
                                        const ProfileOptions& profile) {
  const Graph& graph = forward_or_step;
  HEADROOM_RETURN_IF_ERROR(graph.Validate());
  if (op_cost.size() != graph.num_ops()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "op_cost has %d entries, graph %s has %d ops", op_cost.size(), QuoteForError(graph.name()),
        graph.num_ops()));
  }
  int num_layers = 0;
  int last_layer = -1;
  bool has_backward = false;
  for (const Op& op : graph.ops()) {
    if (!ValidCost(op_cost[static_cast<size_t>(op.id)])) {
      return absl::InvalidArgumentError(absl::StrFormat("op_cost of op %s is %g, not a finite non-negative cost",
                                                        QuoteForError(op.name), op_cost[static_cast<size_t>(op.id)]));
    }
    has_backward = has_backward || op.phase == Phase::kBackward;
    if (op.recompute) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "graph %s: op %s is a replay; ExtractLayerChain expects a step with nothing checkpointed",
          QuoteForError(graph.name()), QuoteForError(op.name)));
    }
    if (op.layer < 0 || op.phase != Phase::kForward) continue;
    // A stage is one contiguous stretch of the forward (PlanForMode's
    // segments assume the same), so layers must come in program order.
    if (op.layer < last_layer) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "graph %s: op %s of layer %d runs after layer %d; a chain needs layers in program order",
          QuoteForError(graph.name()), QuoteForError(op.name), op.layer, last_layer));
    }
    last_layer = op.layer;
    num_layers = std::max(num_layers, op.layer + 1);
  }
  if (num_layers == 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "graph %s has no layers (no forward op with layer >= 0): there is no chain to plan",
        QuoteForError(graph.name())));
  }

  Chain chain;
  chain.stages.resize(static_cast<size_t>(num_layers));
  std::vector<bool> has_op(static_cast<size_t>(num_layers), false);
  for (const Op& op : graph.ops()) {
    if (op.layer < 0 || op.phase != Phase::kForward) continue;
    ChainStage& s = chain.stages[static_cast<size_t>(op.layer)];
    has_op[static_cast<size_t>(op.layer)] = true;
    s.boundary_cost += op_cost[static_cast<size_t>(op.id)];  // the whole forward, for now
    s.has_attention_core = s.has_attention_core || op.attention_core;
  }
  for (int layer = 0; layer < num_layers; ++layer) {
    if (!has_op[static_cast<size_t>(layer)]) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "graph %s: layer %d has no forward op; a chain's stages are layers 0..%d", QuoteForError(graph.name()),
          layer, num_layers - 1));
    }
  }

  // A forward graph gets the step the step builder derives with nothing
  // checkpointed, whose forward ops keep their ids (and so their costs).
  Graph built;
  if (!has_backward) {
    HEADROOM_ASSIGN_OR_RETURN(built, BuildTrainingStep(graph, {}));
  }
  const Graph& step = has_backward ? graph : built;
  // A forward graph's op_cost indexes the step's forward ops too.
  const MemoryProfile all = ProfileMemory(step, profile);
  HEADROOM_ASSIGN_OR_RETURN(const Replayed full_replay,
                            ReplayWith(step, op_cost, CheckpointMode::kFull, profile, num_layers));
  HEADROOM_ASSIGN_OR_RETURN(const Replayed selective_replay,
                            ReplayWith(step, op_cost, CheckpointMode::kSelective, profile, num_layers));
  const MemoryProfile& full = full_replay.profile;
  const MemoryProfile& selective = selective_replay.profile;
  for (int layer = 0; layer < num_layers; ++layer) {
    ChainStage& s = chain.stages[static_cast<size_t>(layer)];
    s.forward_cost = full_replay.cost_by_layer[static_cast<size_t>(layer)];
    s.boundary_cost = std::max(0.0, s.boundary_cost - s.forward_cost);
    s.selective_cost = s.has_attention_core ? selective_replay.cost_by_layer[static_cast<size_t>(layer)] : 0;
  }

  // held[i]: what stages 0..i hold in the step that keeps everything.
  std::vector<uint64_t> held(static_cast<size_t>(num_layers));
  uint64_t sum = 0;
  for (int layer = 0; layer < num_layers; ++layer) {
    ChainStage& s = chain.stages[static_cast<size_t>(layer)];
    const uint64_t kept = LayerBytes(all, layer);
    sum += kept;
    held[static_cast<size_t>(layer)] = sum;
    s.input_bytes = LayerBytes(full, layer);
    s.selective_bytes = s.has_attention_core ? std::max(LayerBytes(selective, layer), s.input_bytes) : 0;
    // Note [Chain memory model] needs all_bytes to cover what the stage's
    // segment or selective plan holds; only a stage that saves less than its
    // input (nothing of it needs a gradient yet) can break that.
    s.all_bytes = std::max({kept, s.input_bytes, s.selective_bytes});
  }

  // The requirement of each region on top of what the stages hold there.
  const Regions regions = RegionsOf(step);
  std::vector<uint64_t> need(static_cast<size_t>(num_layers), 0);
  uint64_t tail_need = 0;
  for (const Op& op : step.ops()) {
    const int region = regions.of_op[static_cast<size_t>(op.id)];
    const uint64_t live = all.live_bytes[static_cast<size_t>(op.id)];
    if (region == Regions::kOutside) {
      chain.outside_peak_bytes = std::max(chain.outside_peak_bytes, live);
    } else if (region == Regions::kTail) {
      tail_need = std::max(tail_need, live > sum ? live - sum : 0);
    } else {
      const uint64_t h = held[static_cast<size_t>(region)];
      uint64_t& n = need[static_cast<size_t>(region)];
      n = std::max(n, live > h ? live - h : 0);
    }
  }
  chain.fixed_bytes = std::min(tail_need, *std::min_element(need.begin(), need.end()));
  chain.tail_bytes = tail_need - chain.fixed_bytes;
  for (int layer = 0; layer < num_layers; ++layer) {
    chain.stages[static_cast<size_t>(layer)].backward_bytes = need[static_cast<size_t>(layer)] - chain.fixed_bytes;
  }
  HEADROOM_RETURN_IF_ERROR(chain.Validate());
  return chain;
}

namespace {

// std::mt19937_64's output is fixed by the standard, its distributions are
// not: these keep RandomChain the same on every standard library.
uint64_t Uniform(std::mt19937_64& rng, uint64_t lo, uint64_t hi) { return lo + rng() % (hi - lo + 1); }

}  // namespace

Chain RandomChain(int num_stages, uint64_t seed) {
  std::mt19937_64 rng(seed);
  Chain chain;
  // Integer microseconds: sums of costs are exact, so plans of equal cost
  // compare equal whatever order they are summed in.
  chain.cost_unit = "us";
  chain.stages.resize(static_cast<size_t>(std::max(num_stages, 1)));
  uint64_t widest = 0;
  for (ChainStage& s : chain.stages) {
    const uint64_t input = Uniform(rng, 1, 8);  // MiB
    widest = std::max(widest, input);
    switch (rng() % 4) {
      case 0:
      case 1: {  // attention layer: the core's probabilities grow with the sequence
        const uint64_t selective = input * Uniform(rng, 8, 17);
        const uint64_t core = input * Uniform(rng, 1, 30);
        s.has_attention_core = true;
        s.selective_bytes = selective * kMiB;
        s.all_bytes = (selective + core) * kMiB;
        s.forward_cost = static_cast<double>(input * Uniform(rng, 40, 120));
        s.selective_cost = std::floor(s.forward_cost * static_cast<double>(Uniform(rng, 5, 30)) / 100);
        break;
      }
      case 2:  // MLP block
        s.all_bytes = input * Uniform(rng, 4, 10) * kMiB;
        s.forward_cost = static_cast<double>(input * Uniform(rng, 30, 90));
        break;
      default:  // convolution-like: wide inputs, few saved tensors per input byte
        s.all_bytes = input * Uniform(rng, 2, 6) * kMiB;
        s.forward_cost = static_cast<double>(input * Uniform(rng, 5, 40));
        break;
    }
    s.input_bytes = input * kMiB;
    s.backward_bytes = input * Uniform(rng, 1, 4) * kMiB;
    s.boundary_cost = static_cast<double>(input * Uniform(rng, 0, 3));  // a residual add, a pooling
  }
  chain.fixed_bytes = Uniform(rng, 64, 512) * kMiB;
  chain.tail_bytes = widest * Uniform(rng, 4, 40) * kMiB;
  chain.outside_peak_bytes = chain.fixed_bytes + Uniform(rng, 0, 256) * kMiB;
  return chain;
}

}  // namespace headroom

#include "planner/chain_dp.h"

#include <algorithm>
#include <limits>
#include <memory>
#include <string>
#include <utility>

#include "absl/strings/str_format.h"
#include "common/checked_math.h"
#include "common/status_macros.h"
#include "common/units.h"

namespace headroom {

std::string_view StageChoiceName(StageChoice choice) {
  switch (choice) {
    case StageChoice::kKeepAll: return "all";
    case StageChoice::kSelective: return "selective";
    case StageChoice::kCheckpoint: return "checkpoint";
  }
  return "?";
}

namespace {

// The plan's shape against a chain of `num_stages` stages (without the
// chain's attention cores, which ChainPlanToCheckpointPlan does not know).
absl::Status ValidateShape(const ChainPlan& plan, int num_stages) {
  if (plan.choice.size() != static_cast<size_t>(num_stages)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("chain plan has %d stage choices, the chain has %d stages", plan.choice.size(), num_stages));
  }
  int next = 0;  // the first stage the next segment may start at
  for (size_t s = 0; s < plan.segments.size(); ++s) {
    const ChainSegment& seg = plan.segments[s];
    if (seg.first < next || seg.last < seg.first || seg.last >= num_stages) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "chain plan segment %d is stages %d..%d; segments are ordered, disjoint and within stages 0..%d", s,
          seg.first, seg.last, num_stages - 1));
    }
    for (int i = next; i < seg.first; ++i) {
      if (plan.choice[static_cast<size_t>(i)] == StageChoice::kCheckpoint) {
        return absl::InvalidArgumentError(
            absl::StrFormat("chain plan: stage %d is checkpointed but in no segment", i));
      }
    }
    for (int i = seg.first; i <= seg.last; ++i) {
      if (plan.choice[static_cast<size_t>(i)] != StageChoice::kCheckpoint) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "chain plan: stage %d is in segment %d (stages %d..%d) but its choice is %s", i, s, seg.first, seg.last,
            StageChoiceName(plan.choice[static_cast<size_t>(i)])));
      }
    }
    next = seg.last + 1;
  }
  for (int i = next; i < num_stages; ++i) {
    if (plan.choice[static_cast<size_t>(i)] == StageChoice::kCheckpoint) {
      return absl::InvalidArgumentError(absl::StrFormat("chain plan: stage %d is checkpointed but in no segment", i));
    }
  }
  return absl::OkStatus();
}

// The chain's byte figures in whole units, rounded up (Note [Chain DP]).
// With unit 1 these are the bytes themselves.
struct Units {
  std::vector<uint64_t> all, selective, input, backward;
  uint64_t tail = 0;
};

Units ToUnits(const Chain& chain, uint64_t unit) {
  Units u;
  const size_t n = chain.stages.size();
  u.all.resize(n);
  u.selective.resize(n);
  u.input.resize(n);
  u.backward.resize(n);
  for (size_t i = 0; i < n; ++i) {
    const ChainStage& s = chain.stages[i];
    u.all[i] = CeilDiv(s.all_bytes, unit);
    u.selective[i] = s.has_attention_core ? CeilDiv(s.selective_bytes, unit) : u.all[i];
    u.input[i] = CeilDiv(s.input_bytes, unit);
    u.backward[i] = CeilDiv(s.backward_bytes, unit);
  }
  u.tail = CeilDiv(chain.tail_bytes, unit);
  return u;
}

// Units above fixed_bytes to bytes, with outside_peak_bytes as the floor.
// Saturates: with a huge unit the product may pass 2^64, and it is then
// compared with a budget that cannot reach it.
uint64_t PeakBytes(const Chain& chain, uint64_t units, uint64_t unit) {
  return std::max(chain.outside_peak_bytes, SaturatingAdd(chain.fixed_bytes, SaturatingMul(units, unit)));
}

// Note [Chain memory model] for a plan of valid shape: the peak in units
// above fixed_bytes and the replay cost, summed in stage order.
std::pair<uint64_t, double> EvaluateInUnits(const Chain& chain, const Units& u, const ChainPlan& plan) {
  uint64_t held = 0;   // the stored prefix P(i)
  uint64_t worst = 0;  // the highest requirement so far
  double cost = 0;
  size_t next_segment = 0;
  const int n = chain.num_stages();
  for (int i = 0; i < n; ++i) {
    const auto s = static_cast<size_t>(i);
    switch (plan.choice[s]) {
      case StageChoice::kKeepAll:
        worst = std::max(worst, held + u.all[s] + u.backward[s]);
        held += u.all[s];
        break;
      case StageChoice::kSelective:
        worst = std::max(worst, held + u.all[s] + u.backward[s]);
        held += u.selective[s];
        cost += chain.stages[s].selective_cost;
        break;
      case StageChoice::kCheckpoint: {
        const ChainSegment& seg = plan.segments[next_segment++];
        uint64_t replayed = 0;
        for (int m = seg.first; m <= seg.last; ++m) {
          const auto sm = static_cast<size_t>(m);
          replayed += u.all[sm];
          worst = std::max(worst, held + replayed + u.backward[sm]);
          cost += chain.stages[sm].forward_cost + (m < seg.last ? chain.stages[sm].boundary_cost : 0);
        }
        held += u.input[s];
        i = seg.last;
        break;
      }
    }
  }
  worst = std::max(worst, held + u.tail);
  return {worst, cost};
}

// The least peak over all plans in units above fixed_bytes (Note [Chain DP]
// with max in place of +): what stages i.. need on top of what 0..i-1 hold
// does not depend on that prefix, so one value per stage suffices.
uint64_t MinimumUnits(const Chain& chain, const Units& u) {
  const int n = chain.num_stages();
  std::vector<uint64_t> rest(static_cast<size_t>(n) + 1);
  rest[static_cast<size_t>(n)] = u.tail;
  for (int i = n - 1; i >= 0; --i) {
    const auto s = static_cast<size_t>(i);
    const uint64_t own = u.all[s] + u.backward[s];
    uint64_t best = std::max(own, u.all[s] + rest[s + 1]);
    if (chain.stages[s].has_attention_core) best = std::min(best, std::max(own, u.selective[s] + rest[s + 1]));
    uint64_t replayed = 0, need = 0;
    for (int k = i; k < n; ++k) {
      const auto sk = static_cast<size_t>(k);
      replayed += u.all[sk];
      need = std::max(need, replayed + u.backward[sk]);
      if (need >= best) break;  // a longer segment only needs more
      best = std::min(best, std::max(need, u.input[s] + rest[sk + 1]));
    }
    rest[s] = best;
  }
  return rest[0];
}

// The unit and slot count `options` resolve to for a feasible-looking budget.
struct Discretization {
  uint64_t unit = 1;
  uint64_t slots = 0;  // M: whole units of the budget above fixed_bytes
};

absl::StatusOr<Discretization> Resolve(const Chain& chain, const ChainDpOptions& options) {
  if (options.memory_unit == 0 && options.memory_slots < 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "memory_slots must be at least 1 (0: AutoMemorySlots), got %d", options.memory_slots));
  }
  const int64_t slots = options.memory_slots != 0 ? options.memory_slots : AutoMemorySlots(chain.num_stages());
  // Callers check budget >= fixed_bytes first.
  const uint64_t room = options.budget - chain.fixed_bytes;
  Discretization d;
  d.unit = options.memory_unit != 0 ? options.memory_unit
                                    : std::max<uint64_t>(1, CeilDiv(room, static_cast<uint64_t>(slots)));
  d.slots = room / d.unit;
  return d;
}

// Why no plan fits options.budget: below the model's own minimum, or only
// after rounding to `unit` (0: the unit was never resolved).
absl::Status NoPlanFits(const Chain& chain, uint64_t budget, uint64_t unit) {
  const uint64_t exact = PeakBytes(chain, MinimumUnits(chain, ToUnits(chain, 1)), 1);
  if (budget < exact || unit <= 1) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "budget %d bytes (%s) is below %d bytes (%s), the smallest peak any plan of the %d-stage chain reaches "
        "under its memory model",
        budget, FormatBytes(budget), exact, FormatBytes(exact), chain.num_stages()));
  }
  const uint64_t rounded = PeakBytes(chain, MinimumUnits(chain, ToUnits(chain, unit)), unit);
  return absl::InvalidArgumentError(absl::StrFormat(
      "budget %d bytes (%s) fits the chain model's smallest peak, %d bytes, but not at memory unit %d bytes, "
      "where every figure rounds up and the smallest peak is %d bytes (%s); raise memory_slots or lower "
      "memory_unit",
      budget, FormatBytes(budget), exact, unit, rounded, FormatBytes(rounded)));
}

// Checks shared by the solvers; a budget below fixed_bytes or the plan-free
// outside peak needs no discretization to refuse.
absl::StatusOr<Discretization> Prepare(const Chain& chain, const ChainDpOptions& options) {
  HEADROOM_RETURN_IF_ERROR(chain.Validate());
  if (options.budget < chain.fixed_bytes || options.budget < chain.outside_peak_bytes) {
    return NoPlanFits(chain, options.budget, /*unit=*/0);
  }
  return Resolve(chain, options);
}

// Fills the plan's exact figures and the discretization it was planned at.
void Finish(const Chain& chain, const Discretization& d, ChainPlan& plan) {
  const auto [units, cost] = EvaluateInUnits(chain, ToUnits(chain, 1), plan);
  plan.predicted_peak = PeakBytes(chain, units, 1);
  plan.extra_cost = cost;
  plan.memory_unit = d.unit;
  plan.memory_slots = static_cast<int64_t>(d.slots);
}

// Decision codes of the DP table besides a segment's last stage (>= 0).
constexpr int32_t kDecideKeep = -1;
constexpr int32_t kDecideSelective = -2;
constexpr int32_t kDecideNothing = -3;

// One candidate of a column's range-minimum stack (Note [Chain DP]).
struct Candidate {
  int32_t row;  // k': the stage after the segment
  double g;     // D[k'][v] + replay cost of stages 0..k'-1 less stage k'-1's boundary
};

// The candidate of the highest row <= last_row in a column's stack (rows
// descend from the front; the back, row i+1, always qualifies). Galloping
// from the back: short affordable segments, the common case under a tight
// budget, find their answer among the few entries pushed last, which are
// also the ones in cache.
const Candidate* LatestWithin(const std::vector<Candidate>& stack, int32_t last_row) {
  const Candidate* back = stack.data() + stack.size() - 1;
  size_t ok = 0;  // back[-ok] qualifies
  size_t step = 1;
  while (step < stack.size() && back[-static_cast<ptrdiff_t>(step)].row <= last_row) {
    ok = step;
    step *= 2;
  }
  // The answer is back[-x] with ok <= x < min(step, size), the largest such x
  // that qualifies.
  size_t bad = std::min(step, stack.size());  // back[-bad] fails or is past the front
  while (bad - ok > 1) {
    const size_t mid = ok + (bad - ok) / 2;
    if (back[-static_cast<ptrdiff_t>(mid)].row <= last_row) {
      ok = mid;
    } else {
      bad = mid;
    }
  }
  return back - ok;
}

}  // namespace

int64_t AutoMemorySlots(int num_stages) {
  const auto stages = static_cast<int64_t>(std::max(num_stages, 1));
  const auto bound = static_cast<int64_t>(kMaxChainDpCells) / stages - 1;
  return std::max<int64_t>(1, std::min(std::max<int64_t>(4096, 8 * stages), bound));
}

absl::Status ChainPlan::Validate(const Chain& chain) const {
  HEADROOM_RETURN_IF_ERROR(ValidateShape(*this, chain.num_stages()));
  for (size_t i = 0; i < choice.size(); ++i) {
    if (choice[i] == StageChoice::kSelective && !chain.stages[i].has_attention_core) {
      return absl::InvalidArgumentError(
          absl::StrFormat("chain plan: stage %d is selective but has no attention core to replay", i));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<ChainPlanCost> EvaluateChainPlan(const Chain& chain, const ChainPlan& plan, uint64_t memory_unit) {
  HEADROOM_RETURN_IF_ERROR(chain.Validate());
  HEADROOM_RETURN_IF_ERROR(plan.Validate(chain));
  if (memory_unit == 0) return absl::InvalidArgumentError("memory_unit must be at least 1 byte");
  const auto [units, cost] = EvaluateInUnits(chain, ToUnits(chain, memory_unit), plan);
  return ChainPlanCost{.extra_cost = cost, .peak_bytes = PeakBytes(chain, units, memory_unit)};
}

absl::StatusOr<uint64_t> MinimumChainPeak(const Chain& chain, uint64_t memory_unit) {
  HEADROOM_RETURN_IF_ERROR(chain.Validate());
  if (memory_unit == 0) return absl::InvalidArgumentError("memory_unit must be at least 1 byte");
  return PeakBytes(chain, MinimumUnits(chain, ToUnits(chain, memory_unit)), memory_unit);
}

absl::StatusOr<ChainPlan> SolveChainDp(const Chain& chain, const ChainDpOptions& options) {
  HEADROOM_ASSIGN_OR_RETURN(const Discretization d, Prepare(chain, options));
  const int n = chain.num_stages();
  const uint64_t cells = SaturatingMul(static_cast<uint64_t>(n), SaturatingAdd(d.slots, 1));
  if (cells > kMaxChainDpCells) {
    const std::string why =
        options.memory_unit != 0
            ? absl::StrFormat("memory_unit %d bytes gives %d units", options.memory_unit, d.slots)
            : absl::StrFormat("memory_slots %d", options.memory_slots);
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: %d stages x %d memory columns exceed the DP's %d cells; %s", why, n, d.slots + 1, kMaxChainDpCells,
        options.memory_unit != 0 ? "raise memory_unit" : "lower memory_slots"));
  }
  const Units u = ToUnits(chain, d.unit);
  const uint64_t m = d.slots;
  const size_t columns = static_cast<size_t>(m) + 1;
  constexpr double kInf = std::numeric_limits<double>::infinity();

  // Replay cost of stages 0..i-1 with their boundaries, so that a segment
  // i..k costs prefix[k+1] - boundary(k) - prefix[i] (Note [Chain DP]).
  std::vector<double> prefix(static_cast<size_t>(n) + 1, 0);
  for (size_t i = 0; i < chain.stages.size(); ++i) {
    prefix[i + 1] = prefix[i] + chain.stages[i].forward_cost + chain.stages[i].boundary_cost;
  }

  // Every cell is written before it is read: no need to fill 4 x cells bytes first.
  const std::unique_ptr<int32_t[]> decision = std::make_unique_for_overwrite<int32_t[]>(static_cast<size_t>(cells));
  std::vector<double> next(columns), current(columns);
  std::vector<std::vector<Candidate>> stacks(columns);
  auto push_row = [&](int row, const std::vector<double>& d_row) {
    // Row k' ends segments at stage k'-1, whose boundary is kept, not replayed.
    const double offset =
        prefix[static_cast<size_t>(row)] - (row > 0 ? chain.stages[static_cast<size_t>(row) - 1].boundary_cost : 0);
    for (size_t v = 0; v < columns; ++v) {
      const double g = d_row[v] + offset;
      std::vector<Candidate>& stack = stacks[v];
      // Equal costs pop too, so that ties go to the shorter segment.
      while (!stack.empty() && stack.back().g >= g) stack.pop_back();
      stack.push_back({.row = row, .g = g});
    }
  };
  for (size_t v = 0; v < columns; ++v) next[v] = u.tail <= m - v ? 0 : kInf;
  push_row(n, next);

  std::vector<uint64_t> segment_need;  // need(i, k) for k = i, i+1, ... while <= M
  for (int i = n - 1; i >= 0; --i) {
    const auto s = static_cast<size_t>(i);
    const ChainStage& stage = chain.stages[s];
    segment_need.clear();
    uint64_t replayed = 0, need = 0;
    for (int k = i; k < n; ++k) {
      replayed += u.all[static_cast<size_t>(k)];
      need = std::max(need, replayed + u.backward[static_cast<size_t>(k)]);
      if (need > m) break;  // and so are all longer segments
      segment_need.push_back(need);
    }
    const uint64_t own = u.all[s] + u.backward[s];
    size_t affordable = segment_need.size();  // segments i..i+affordable-1 fit; shrinks as u grows
    int32_t* row_decision = decision.get() + s * columns;
    for (size_t col = 0; col < columns; ++col) {
      const uint64_t room = m - col;
      while (affordable > 0 && segment_need[affordable - 1] > room) --affordable;
      double best = kInf;
      int32_t decide = kDecideNothing;
      if (own <= room) {
        if (next[col + u.all[s]] < best) {
          best = next[col + u.all[s]];
          decide = kDecideKeep;
        }
        if (stage.has_attention_core) {
          const double c = stage.selective_cost + next[col + u.selective[s]];
          if (c < best) {
            best = c;
            decide = kDecideSelective;
          }
        }
      }
      if (affordable > 0 && u.input[s] <= room) {
        // Rows i+1 .. i+affordable: segments ending at i .. i+affordable-1.
        const std::vector<Candidate>& stack = stacks[col + u.input[s]];
        const auto last_row = static_cast<int32_t>(static_cast<size_t>(i) + affordable);
        const Candidate* it = LatestWithin(stack, last_row);
        const double c = it->g - prefix[s];
        if (c < best) {
          best = c;
          decide = it->row - 1;
        }
      }
      current[col] = best;
      row_decision[col] = decide;
    }
    push_row(i, current);
    std::swap(current, next);
  }
  if (next[0] == kInf) return NoPlanFits(chain, options.budget, d.unit);

  ChainPlan plan;
  plan.choice.resize(static_cast<size_t>(n));
  size_t col = 0;
  for (int i = 0; i < n;) {
    const auto s = static_cast<size_t>(i);
    const int32_t decide = decision[s * columns + col];
    if (decide == kDecideKeep) {
      plan.choice[s] = StageChoice::kKeepAll;
      col += u.all[s];
      ++i;
    } else if (decide == kDecideSelective) {
      plan.choice[s] = StageChoice::kSelective;
      col += u.selective[s];
      ++i;
    } else {
      // kDecideNothing cannot lie on the path of a finite D[0][0].
      plan.segments.push_back({.first = i, .last = decide});
      for (int k = i; k <= decide; ++k) plan.choice[static_cast<size_t>(k)] = StageChoice::kCheckpoint;
      col += u.input[s];
      i = decide + 1;
    }
  }
  Finish(chain, d, plan);
  return plan;
}

absl::StatusOr<ChainPlan> BruteForceChainPlan(const Chain& chain, const ChainDpOptions& options) {
  const int n = chain.num_stages();
  if (n > kMaxBruteForceStages) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "BruteForceChainPlan enumerates up to 4^L plans; the chain has %d stages (at most %d)", n,
        kMaxBruteForceStages));
  }
  HEADROOM_ASSIGN_OR_RETURN(const Discretization d, Prepare(chain, options));
  const Units u = ToUnits(chain, d.unit);
  // Each stage: kept, selective, a new segment, or the previous segment
  // continued; every plan of Note [Single-replay plans] exactly once.
  ChainPlan candidate, best;
  double best_cost = std::numeric_limits<double>::infinity();
  candidate.choice.resize(static_cast<size_t>(n));
  auto visit = [&](auto&& self, int i) -> void {
    if (i == n) {
      const auto [units, cost] = EvaluateInUnits(chain, u, candidate);
      if (units <= d.slots && cost < best_cost) {
        best_cost = cost;
        best = candidate;
      }
      return;
    }
    const auto s = static_cast<size_t>(i);
    candidate.choice[s] = StageChoice::kKeepAll;
    self(self, i + 1);
    if (chain.stages[s].has_attention_core) {
      candidate.choice[s] = StageChoice::kSelective;
      self(self, i + 1);
    }
    candidate.choice[s] = StageChoice::kCheckpoint;
    candidate.segments.push_back({.first = i, .last = i});
    self(self, i + 1);
    candidate.segments.pop_back();
    if (i > 0 && candidate.choice[s - 1] == StageChoice::kCheckpoint) {
      ++candidate.segments.back().last;
      self(self, i + 1);
      --candidate.segments.back().last;
    }
  };
  visit(visit, 0);
  if (best.choice.empty()) return NoPlanFits(chain, options.budget, d.unit);
  Finish(chain, d, best);
  return best;
}

ChainPlan UniformChainPlan(const Chain& chain, StageChoice choice) {
  ChainPlan plan;
  for (int i = 0; i < chain.num_stages(); ++i) {
    StageChoice c = choice;
    if (c == StageChoice::kSelective && !chain.stages[static_cast<size_t>(i)].has_attention_core) {
      c = StageChoice::kKeepAll;
    }
    plan.choice.push_back(c);
    if (c == StageChoice::kCheckpoint) plan.segments.push_back({.first = i, .last = i});
  }
  Finish(chain, {.unit = 1, .slots = 0}, plan);
  plan.memory_slots = 0;
  return plan;
}

absl::StatusOr<CheckpointPlan> ChainPlanToCheckpointPlan(const Graph& forward_or_step, const ChainPlan& plan) {
  const Graph& forward = forward_or_step;  // only its forward ops get segments
  int num_layers = 0;
  for (const Op& op : forward.ops()) num_layers = std::max(num_layers, op.layer + 1);
  HEADROOM_RETURN_IF_ERROR(ValidateShape(plan, num_layers));
  std::vector<int64_t> segment_of_layer(static_cast<size_t>(num_layers), kNone);
  for (size_t s = 0; s < plan.segments.size(); ++s) {
    for (int l = plan.segments[s].first; l <= plan.segments[s].last; ++l) {
      segment_of_layer[static_cast<size_t>(l)] = static_cast<int64_t>(s);
    }
  }
  const auto num_segments = static_cast<int64_t>(plan.segments.size());
  // As in PlanForMode: the key of the run an op belongs to, a new segment
  // wherever it changes; selective keys (past the segments') are per layer.
  auto key = [&](const Op& op) -> int64_t {
    if (op.phase != Phase::kForward || op.layer < 0) return kNone;
    const auto l = static_cast<size_t>(op.layer);
    switch (plan.choice[l]) {
      case StageChoice::kKeepAll: return kNone;
      case StageChoice::kSelective: return op.attention_core ? num_segments + op.layer : kNone;
      case StageChoice::kCheckpoint: return segment_of_layer[l];
    }
    return kNone;
  };
  CheckpointPlan out;
  out.segment_of_op.assign(forward.num_ops(), kNone);
  int32_t next = 0;
  int64_t previous = kNone;
  for (const Op& op : forward.ops()) {
    const int64_t k = key(op);
    if (k == kNone) {
      previous = kNone;
      continue;
    }
    if (k != previous) ++next;
    out.segment_of_op[static_cast<size_t>(op.id)] = next - 1;
    previous = k;
  }
  HEADROOM_RETURN_IF_ERROR(out.Validate(forward));
  return out;
}

}  // namespace headroom

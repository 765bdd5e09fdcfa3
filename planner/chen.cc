#include "planner/chen.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <optional>
#include <vector>

#include "absl/strings/str_format.h"
#include "common/quote.h"
#include "common/status_macros.h"
#include "common/units.h"
#include "planner/plan_memo.h"

namespace headroom {
namespace {

// A plan with segment s starting at forward position starts[s] (starts[0] = 0).
CheckpointPlan PlanFromStarts(const Graph& step, const ForwardCuts& cuts, const std::vector<size_t>& starts) {
  CheckpointPlan plan;
  if (cuts.forward_ops.empty()) return plan;
  plan.segment_of_op.assign(step.num_ops(), kNone);
  int32_t segment = -1;
  size_t next = 0;
  for (size_t i = 0; i < cuts.forward_ops.size(); ++i) {
    if (next < starts.size() && starts[next] == i) {
      ++segment;
      ++next;
    }
    plan.segment_of_op[static_cast<size_t>(cuts.forward_ops[i])] = segment;
  }
  return plan;
}

// Bytes each forward op makes that are read after the forward pass: what
// it keeps for backward when nothing is checkpointed.
std::vector<uint64_t> SavedBytes(const PlanProblem& problem, const ForwardCuts& cuts) {
  const Graph& step = *problem.step;
  std::vector<bool> read_later(step.num_tensors(), false);
  for (const Op& op : step.ops()) {
    if (IsForwardPhase(op.phase)) continue;
    for (TensorId in : op.inputs) read_later[static_cast<size_t>(step.storage(in))] = true;
  }
  std::vector<uint64_t> saved(cuts.forward_ops.size(), 0);
  for (size_t i = 0; i < cuts.forward_ops.size(); ++i) {
    for (TensorId out : step.op(cuts.forward_ops[i]).outputs) {
      if (step.tensor(out).view_of == kNone && read_later[static_cast<size_t>(out)]) saved[i] += step.tensor(out).bytes();
    }
  }
  return saved;
}

}  // namespace

ForwardCuts FindForwardCuts(const Graph& step, bool linearized) {
  ForwardCuts cuts;
  std::vector<int64_t> position(step.num_ops(), -1);
  for (const Op& op : step.ops()) {
    if (op.phase != Phase::kForward || op.recompute) continue;
    position[static_cast<size_t>(op.id)] = static_cast<int64_t>(cuts.forward_ops.size());
    cuts.forward_ops.push_back(op.id);
  }
  const auto n = static_cast<int64_t>(cuts.forward_ops.size());
  if (n < 2) return cuts;
  // Last forward-side reader of each storage, as a position (the loss: n).
  // A hold (IsHoldOp) keeps its tensors whatever the cuts, so it is no reader.
  std::vector<int64_t> last_reader(step.num_tensors(), -1);
  for (const Op& op : step.ops()) {
    if (IsHoldOp(op)) continue;
    const int64_t at = op.phase == Phase::kLoss ? n : position[static_cast<size_t>(op.id)];
    if (at < 0) continue;
    for (TensorId in : op.inputs) {
      int64_t& last = last_reader[static_cast<size_t>(step.storage(in))];
      last = std::max(last, at);
    }
  }
  // Tensors that depend on the batch (reachable from an input tensor); when
  // no forward op reads an input tensor (node-link graphs), every tensor.
  std::vector<bool> data(step.num_tensors(), false);
  bool reads_input = false;
  int64_t first_data_op = 0;  // cuts before it would separate nothing from the batch
  for (const Tensor& t : step.tensors()) data[static_cast<size_t>(t.id)] = t.role == TensorRole::kInput;
  for (OpId o : cuts.forward_ops) {
    const Op& op = step.op(o);
    const bool from_data =
        std::any_of(op.inputs.begin(), op.inputs.end(), [&data](TensorId in) { return data[static_cast<size_t>(in)]; });
    if (from_data && !reads_input) first_data_op = position[static_cast<size_t>(o)];
    reads_input = reads_input || from_data;
    for (TensorId out : op.outputs) data[static_cast<size_t>(out)] = from_data;
  }
  std::vector<int64_t> crossing(static_cast<size_t>(n) + 2, 0);  // difference array over cuts 1..n-1
  for (const Tensor& t : step.tensors()) {
    const OpId producer = step.producer(t.id);
    if (t.view_of != kNone || producer == kNone || (reads_input && !data[static_cast<size_t>(t.id)])) continue;
    const int64_t made = position[static_cast<size_t>(producer)];
    const int64_t last = std::min(last_reader[static_cast<size_t>(t.id)], n - 1);
    if (made < 0 || last <= made) continue;
    ++crossing[static_cast<size_t>(made) + 1];
    --crossing[static_cast<size_t>(last) + 1];
  }
  std::vector<int64_t> count(static_cast<size_t>(n), 0);
  int64_t running = 0;
  int64_t fewest = std::numeric_limits<int64_t>::max();
  for (int64_t p = 1; p < n; ++p) {
    running += crossing[static_cast<size_t>(p)];
    count[static_cast<size_t>(p)] = running;
    if (p > first_data_op) fewest = std::min(fewest, running);
  }
  if (first_data_op + 1 >= n) return cuts;
  cuts.min_crossing = static_cast<size_t>(fewest);
  for (int64_t p = first_data_op + 1; p < n; ++p) {
    if (linearized || count[static_cast<size_t>(p)] == fewest) cuts.positions.push_back(static_cast<size_t>(p));
  }
  return cuts;
}

CheckpointPlan SqrtNPlan(const Graph& step, const ForwardCuts& cuts) {
  const size_t n = cuts.forward_ops.size();
  const auto pieces = static_cast<size_t>(cuts.positions.size() + 1);
  const auto segments = static_cast<size_t>(std::ceil(std::sqrt(static_cast<double>(pieces))));
  std::vector<size_t> starts = {0};
  size_t from = 0;  // cuts before this index are taken or passed
  for (size_t j = 1; j < segments && from < cuts.positions.size(); ++j) {
    const double target = static_cast<double>(j * n) / static_cast<double>(segments);
    // The cut nearest to the target among those after the last start.
    auto it = std::lower_bound(cuts.positions.begin() + static_cast<ptrdiff_t>(from), cuts.positions.end(),
                               static_cast<size_t>(target));
    if (it != cuts.positions.begin() + static_cast<ptrdiff_t>(from) &&
        (it == cuts.positions.end() || target - static_cast<double>(*(it - 1)) < static_cast<double>(*it) - target)) {
      --it;
    }
    if (it == cuts.positions.end()) break;
    starts.push_back(*it);
    from = static_cast<size_t>(it - cuts.positions.begin()) + 1;
  }
  return PlanFromStarts(step, cuts, starts);
}

namespace {

// Chen's greedy for a geometric range of thresholds b, from "a segment at
// every cut" to "one segment", each distinct plan evaluated once, or kept
// from the last time (Note [Plan memo]).
using Sweep = std::shared_ptr<const std::vector<ThresholdPlan>>;
absl::StatusOr<Sweep> GreedyOverThresholds(const PlanProblem& problem, const ForwardCuts& cuts) {
  HEADROOM_RETURN_IF_ERROR(ValidateProblem(problem));
  if (problem.memo != nullptr) {
    if (Sweep kept = problem.memo->FindChenSweep(problem, cuts.positions)) return kept;
  }
  const Graph& step = *problem.step;
  const std::vector<uint64_t> saved = SavedBytes(problem, cuts);
  uint64_t total = 0;
  uint64_t smallest = std::numeric_limits<uint64_t>::max();
  for (uint64_t b : saved) {
    total += b;
    if (b > 0) smallest = std::min(smallest, b);
  }
  std::vector<double> thresholds = {0};
  if (total > 0) {
    constexpr int kSteps = 24;
    const double lo = static_cast<double>(smallest);
    const double ratio = std::pow(static_cast<double>(total) / lo, 1.0 / kSteps);
    for (int i = 0; i <= kSteps; ++i) thresholds.push_back(lo * std::pow(ratio, i));
  }
  std::vector<bool> is_cut(cuts.forward_ops.size() + 1, false);
  for (size_t p : cuts.positions) is_cut[p] = true;

  std::vector<ThresholdPlan> plans;
  std::vector<size_t> previous;
  for (double b : thresholds) {
    std::vector<size_t> starts = {0};
    double running = 0;
    for (size_t i = 0; i < cuts.forward_ops.size(); ++i) {
      if (i > 0 && is_cut[i] && running >= b) {
        starts.push_back(i);
        running = 0;
      }
      running += static_cast<double>(saved[i]);
    }
    if (starts == previous) continue;
    previous = starts;
    HEADROOM_ASSIGN_OR_RETURN(Schedule s, SegmentSchedule(step, PlanFromStarts(step, cuts, starts)));
    HEADROOM_ASSIGN_OR_RETURN(PlanEvaluation e, EvaluateSchedule(problem, s));
    plans.push_back({std::move(s), std::move(e)});
  }
  auto sweep = std::make_shared<const std::vector<ThresholdPlan>>(std::move(plans));
  if (problem.memo != nullptr) problem.memo->KeepChenSweep(problem, cuts.positions, sweep);
  return sweep;
}

uint64_t LowestPeak(const std::vector<ThresholdPlan>& plans) {
  uint64_t lowest = std::numeric_limits<uint64_t>::max();
  for (const ThresholdPlan& p : plans) lowest = std::min(lowest, p.evaluation.peak_bytes);
  return lowest;
}

}  // namespace

absl::StatusOr<Schedule> ChenGreedySchedule(const PlanProblem& problem, const ForwardCuts& cuts) {
  HEADROOM_ASSIGN_OR_RETURN(const Sweep plans, GreedyOverThresholds(problem, cuts));
  const ThresholdPlan* best = nullptr;
  for (const ThresholdPlan& p : *plans) {
    const PlanEvaluation& e = p.evaluation;
    if (e.peak_bytes > problem.budget) continue;
    if (best == nullptr || e.extra_cost < best->evaluation.extra_cost ||
        (e.extra_cost == best->evaluation.extra_cost && e.peak_bytes < best->evaluation.peak_bytes)) {
      best = &p;
    }
  }
  if (best == nullptr) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "chen-greedy: no threshold fits %s in a budget of %s; its smallest peak is %s",
        QuoteForError(problem.step->name()), FormatBytes(problem.budget), FormatBytes(LowestPeak(*plans))));
  }
  return best->schedule;
}

absl::StatusOr<uint64_t> ChenGreedyLowestPeak(const PlanProblem& problem, const ForwardCuts& cuts) {
  HEADROOM_ASSIGN_OR_RETURN(const Sweep plans, GreedyOverThresholds(problem, cuts));
  return LowestPeak(*plans);
}

}  // namespace headroom

#include "planner/planner.h"

#include <algorithm>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/name_table.h"
#include "common/quote.h"
#include "common/status_macros.h"
#include "common/units.h"
#include "planner/chain.h"
#include "planner/chain_dp.h"
#include "planner/chen.h"
#include "planner/offload.h"
#include "planner/remat_solver.h"

namespace headroom {
namespace {

constexpr NameTable<Strategy, 8> kStrategyNames("strategy", {{
    {"store-all", Strategy::kStoreAll},
    {"sqrt-n", Strategy::kSqrtN},
    {"sqrt-n-linear", Strategy::kSqrtNLinear},
    {"chen-greedy", Strategy::kChenGreedy},
    {"chain-dp", Strategy::kChainDp},
    {"optimal", Strategy::kOptimal},
    {"offload", Strategy::kOffload},
    {"hybrid", Strategy::kHybrid},
}});

// What a chain-dp plan chose, per stage, and the DP's memory unit.
std::string DescribeChainPlan(const ChainPlan& plan) {
  int kept = 0;
  int selective = 0;
  int checkpointed = 0;
  for (StageChoice c : plan.choice) {
    kept += c == StageChoice::kKeepAll;
    selective += c == StageChoice::kSelective;
    checkpointed += c == StageChoice::kCheckpoint;
  }
  return absl::StrFormat("%d layers: %d kept, %d selective, %d in %d checkpointed segment(s); memory unit %s",
                         plan.choice.size(), kept, selective, checkpointed, plan.segments.size(),
                         FormatBytes(plan.memory_unit));
}

// Megatron's --recompute-method block: the first `n` layers checkpointed,
// each on its own, the rest kept.
ChainPlan LeadingBlock(int num_stages, int n) {
  ChainPlan plan;
  plan.choice.assign(static_cast<size_t>(num_stages), StageChoice::kKeepAll);
  for (int i = 0; i < n; ++i) {
    plan.choice[static_cast<size_t>(i)] = StageChoice::kCheckpoint;
    plan.segments.push_back({i, i});
  }
  return plan;
}

// Note [Chain-dp budget]
// The DP's peak is the step's measured peak for the plans it makes (its
// byte figures are measured on the step, ExtractLayerChain), and rounding
// only overestimates it, so its plan fits at the first try. Should a step
// break that model, the DP is asked again with the budget lowered by the
// excess measured, a few times, before the strategy gives up.
constexpr int kChainDpAttempts = 4;

// A chain plan as the step runs it: its segments' schedule, evaluated.
struct MeasuredChainPlan {
  Schedule schedule;
  PlanEvaluation evaluation;
};
absl::StatusOr<MeasuredChainPlan> Measure(const PlanProblem& problem, const ChainPlan& plan) {
  HEADROOM_ASSIGN_OR_RETURN(const CheckpointPlan cp, ChainPlanToCheckpointPlan(*problem.step, plan));
  MeasuredChainPlan out;
  HEADROOM_ASSIGN_OR_RETURN(out.schedule, SegmentSchedule(*problem.step, cp));
  HEADROOM_ASSIGN_OR_RETURN(out.evaluation, EvaluateSchedule(problem, out.schedule));
  return out;
}

absl::StatusOr<std::pair<Schedule, std::string>> PlanChainDp(const PlanProblem& problem) {
  const Graph& step = *problem.step;
  HEADROOM_ASSIGN_OR_RETURN(const Chain chain, ExtractLayerChain(step, problem.op_cost, problem.profile));
  uint64_t dp_budget = problem.budget;
  uint64_t measured = 0;
  for (int attempt = 0; attempt < kChainDpAttempts; ++attempt) {
    absl::StatusOr<ChainPlan> plan = SolveChainDp(chain, {.budget = dp_budget});
    if (!plan.ok()) {
      // The chain is valid and the table sized by default: the budget is
      // what the DP could not meet.
      return absl::ResourceExhaustedError(absl::StrCat("chain-dp: ", plan.status().message()));
    }
    HEADROOM_ASSIGN_OR_RETURN(MeasuredChainPlan dp, Measure(problem, *plan));
    measured = dp.evaluation.peak_bytes;
    if (measured <= problem.budget) {
      // Note [Block-shaped plans]
      // Where layers are alike, many sets of checkpointed layers cost the
      // same, and the DP's choice among them follows its memory rounding
      // (layers 0-1, 3, 5-6, ...). The same number of leading layers is
      // what Megatron's block method and most hand-written loops run; it is
      // taken when it fits and replays no more.
      const auto n = static_cast<int>(std::count(plan->choice.begin(), plan->choice.end(), StageChoice::kCheckpoint));
      const bool selective = std::count(plan->choice.begin(), plan->choice.end(), StageChoice::kSelective) > 0;
      if (n > 0 && !selective) {
        ChainPlan block = LeadingBlock(chain.num_stages(), n);
        block.memory_unit = plan->memory_unit;
        absl::StatusOr<MeasuredChainPlan> leading = Measure(problem, block);
        if (leading.ok() && leading->evaluation.peak_bytes <= problem.budget &&
            leading->evaluation.extra_cost <= dp.evaluation.extra_cost * (1 + 1e-12)) {
          return std::pair{std::move(leading->schedule),
                           DescribeChainPlan(block) + "; leading layers (Megatron's block method)"};
        }
      }
      return std::pair{std::move(dp.schedule), DescribeChainPlan(*plan)};
    }
    const uint64_t excess = measured - problem.budget;
    if (excess >= dp_budget) break;
    dp_budget -= excess;
  }
  return absl::ResourceExhaustedError(absl::StrFormat(
      "chain-dp: the plans the DP made for step %s measure over the budget of %s (last: %s)",
      QuoteForError(step.name()), FormatBytes(problem.budget), FormatBytes(measured)));
}

struct Planned {
  Schedule schedule;
  std::string detail;
  std::optional<double> lower_bound;
};

// Work limits that the plans of one RunStrategy call share when it plans
// again for lowered budgets (Note [Pipeline budgets]); null: each plan has
// its own.
struct SharedWork {
  int64_t lp_iterations = RematOptions{}.lp_iterations;  // Note [Remat work limits]
  int64_t hybrid_entries = kHybridWork;                  // Note [Hybrid work] in offload.cc
};

absl::StatusOr<Planned> Plan(const PlanProblem& problem, Strategy strategy, SharedWork* work = nullptr);

// The other replay strategies' plans, as starts for the optimal strategy's
// search (RematOptions::starts), so that it is never costlier than any of
// them and, where one reaches the op floor, finds the smallest budget at
// once.
RematOptions StartsFrom(const PlanProblem& problem) {
  RematOptions options;
  for (Strategy start : {Strategy::kChenGreedy, Strategy::kChainDp, Strategy::kSqrtN}) {
    absl::StatusOr<Planned> other = Plan(problem, start);
    if (other.ok()) options.starts.emplace_back(StrategyName(start), std::move(other->schedule));
  }
  return options;
}

// Note [Optimal beyond the solvers]
// Up to kMaxRematOps ops the optimal strategy is PlanRemat, started from the
// other replay strategies' plans, with the better of its LP bound and the
// knapsack bound (Note [Replay knapsack bound]). Beyond that the search and
// the LP grow too large for seconds, so it returns the cheapest of those
// starts that fits, and the knapsack bound, which takes one sweep, so
// that the plan still states how far from optimal it can be.
absl::StatusOr<Planned> PlanOptimal(const PlanProblem& problem, SharedWork* work) {
  absl::StatusOr<RematBound> knapsack = ReplayKnapsackBound(problem);
  if (problem.step->num_ops() <= kMaxRematOps) {
    RematOptions options = StartsFrom(problem);
    if (work != nullptr) options.shared_lp_iterations_left = &work->lp_iterations;
    HEADROOM_ASSIGN_OR_RETURN(RematPlan plan, PlanRemat(problem, options));
    std::optional<double> bound;
    if (plan.lower_bound_solved) bound = plan.lower_bound;
    if (knapsack.ok()) {
      bound = std::max(bound.value_or(0), std::min(knapsack->extra_cost, plan.evaluation.extra_cost));
      // Note [Remat work limits]: without the LP, the knapsack bound is the one stated.
      if (!plan.lower_bound_solved) absl::StrAppend(&plan.detail, "; knapsack bound");
    }
    return Planned{std::move(plan.schedule), std::move(plan.detail), bound};
  }
  std::optional<std::pair<std::string, PlanEvaluation>> best;
  Schedule schedule;
  for (auto& [name, start] : StartsFrom(problem).starts) {
    absl::StatusOr<PlanEvaluation> e = EvaluateSchedule(problem, start);
    if (!e.ok() || e->peak_bytes > problem.budget) continue;
    if (best && best->second.extra_cost <= e->extra_cost) continue;
    best = std::pair{name, *std::move(e)};
    schedule = std::move(start);
  }
  if (!best) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "optimal: step %s has %d ops, more than the %d the rematerialization search takes, and none of "
        "chen-greedy, chain-dp and sqrt-n fits its budget of %s",
        QuoteForError(problem.step->name()), problem.step->num_ops(), kMaxRematOps, FormatBytes(problem.budget)));
  }
  std::optional<double> bound;
  if (knapsack.ok()) bound = std::min(knapsack->extra_cost, best->second.extra_cost);
  return Planned{std::move(schedule),
                 absl::StrFormat("%d ops, over the search's %d: %s's plan, the cheapest that fits; knapsack bound",
                                 problem.step->num_ops(), kMaxRematOps, best->first),
                 bound};
}

absl::StatusOr<Planned> Plan(const PlanProblem& problem, Strategy strategy, SharedWork* work) {
  const Graph& step = *problem.step;
  switch (strategy) {
    case Strategy::kStoreAll:
      return Planned{StoreAllSchedule(step), "nothing replayed"};
    case Strategy::kSqrtN:
    case Strategy::kSqrtNLinear: {
      const ForwardCuts cuts = FindForwardCuts(step, strategy == Strategy::kSqrtNLinear);
      const CheckpointPlan plan = SqrtNPlan(step, cuts);
      HEADROOM_ASSIGN_OR_RETURN(Schedule s, SegmentSchedule(step, plan));
      return Planned{std::move(s), absl::StrFormat("%d segments over %d cuts crossed by %d tensor(s)",
                                                   plan.num_segments(), cuts.positions.size(), cuts.min_crossing)};
    }
    case Strategy::kChenGreedy: {
      const ForwardCuts cuts = FindForwardCuts(step);
      HEADROOM_ASSIGN_OR_RETURN(Schedule s, ChenGreedySchedule(problem, cuts));
      return Planned{std::move(s), absl::StrFormat("cuts crossed by %d tensor(s)", cuts.min_crossing)};
    }
    case Strategy::kChainDp: {
      HEADROOM_ASSIGN_OR_RETURN(auto planned, PlanChainDp(problem));
      return Planned{std::move(planned.first), std::move(planned.second)};
    }
    case Strategy::kOptimal:
      return PlanOptimal(problem, work);
    case Strategy::kOffload: {
      HEADROOM_ASSIGN_OR_RETURN(Schedule s, PlanOffload(problem));
      return Planned{std::move(s), "saved activations to pinned host memory and back"};
    }
    case Strategy::kHybrid: {
      HEADROOM_ASSIGN_OR_RETURN(HybridPlan plan,
                                PlanHybridWithNote(problem, work != nullptr ? &work->hybrid_entries : nullptr));
      std::string detail = "keep, replay or offload, per saved tensor";
      if (!plan.note.empty()) absl::StrAppend(&detail, "; ", plan.note);
      return Planned{std::move(plan.schedule), std::move(detail)};
    }
  }
  return absl::InternalError("unknown strategy");
}

}  // namespace

std::string_view StrategyName(Strategy strategy) { return kStrategyNames.Name(strategy); }

absl::StatusOr<Strategy> ParseStrategy(std::string_view name) { return kStrategyNames.Parse(name); }

std::vector<Strategy> AllStrategies() {
  return {Strategy::kStoreAll, Strategy::kSqrtN,   Strategy::kSqrtNLinear, Strategy::kChenGreedy,
          Strategy::kChainDp,  Strategy::kOptimal, Strategy::kOffload,     Strategy::kHybrid};
}

namespace {

// `strategy` planned on `one` (one micro-batch, perhaps for a lower budget)
// and evaluated on `problem` as its runner runs it (Note [Plan runners]).
absl::StatusOr<PlanResult> PlanAndEvaluate(const PlanProblem& problem, const PlanProblem& one, Strategy strategy,
                                           SharedWork* work = nullptr) {
  HEADROOM_ASSIGN_OR_RETURN(Planned planned, Plan(one, strategy, work));
  std::vector<CheckpointRegion> regions;
  std::vector<HookedOffload> offloads;
  if (problem.runner == PlanRunner::kTorchSelectiveCheckpoint) {
    HEADROOM_ASSIGN_OR_RETURN(SelectiveCheckpoint realized,
                              RealizeSelectiveCheckpoint(*problem.step, planned.schedule));
    planned.schedule = std::move(realized.schedule);
    regions = std::move(realized.regions);
    offloads = std::move(realized.offloads);
    absl::StrAppend(&planned.detail, absl::StrFormat("; as selective checkpointing of %d block(s)", regions.size()));
    if (!offloads.empty()) {
      absl::StrAppend(&planned.detail, absl::StrFormat(" and %d offload(s) by saved-tensor hooks", offloads.size()));
    }
  }
  HEADROOM_ASSIGN_OR_RETURN(PlanEvaluation e, EvaluateSchedule(problem, planned.schedule));
  PlanResult result{.strategy = strategy, .schedule = std::move(planned.schedule), .evaluation = std::move(e),
                    .lower_bound_extra_cost = planned.lower_bound, .detail = std::move(planned.detail),
                    .regions = std::move(regions), .offloads = std::move(offloads)};
  result.fits = result.evaluation.peak_bytes <= problem.budget;
  return result;
}

bool IgnoresBudget(Strategy strategy) {
  return strategy == Strategy::kStoreAll || strategy == Strategy::kSqrtN || strategy == Strategy::kSqrtNLinear;
}

// Note [Pipeline budgets]
// The strategies plan one micro-batch. Under 1F1B the others in flight hold
// what its forward leaves (Note [Pipeline in-flight] in plan.h), and that
// depends on the plan. So a budget-driven strategy plans again for a lower
// budget: the previous plan's own peak, less the measured excess divided
// among the micro-batches in flight, until the pipelined peak fits or a
// dozen tries have not. Its lower bounds are for one micro-batch at the
// lowered budget, not for the pipelined problem, so none is reported.
// A runner that realizes the plan its own way (Note [Plan runners]) is
// handled the same way: what it runs may peak above what was planned, so
// the strategy plans again for a budget lowered by the excess; a bound
// found for a lowered budget is not one for the problem's, so it is dropped.
// The plans of one such run share their work limits (SharedWork: the
// optimal strategy's simplex iterations, Note [Remat work limits], and
// hybrid's simulated schedule entries, Note [Hybrid work]), so a dozen
// replans cost about what one plan may; a plan made past them says so.
constexpr int kReplanAttempts = 12;

// Note [Pipeline budgets]'s replanning for `strategy`: the first plan that
// fits, or ResourceExhausted naming the last one's peak.
absl::StatusOr<PlanResult> ReplanUntilItFits(const PlanProblem& problem, Strategy strategy) {
  const bool pipelined = problem.in_flight > 1;
  PlanProblem one = problem;
  one.in_flight = 1;
  uint64_t measured = 0;
  // Budgets between `failed` (the strategy found nothing) and `over` (what
  // ran peaked over) are left to try; a step that lands at or below a
  // failure bisects instead.
  uint64_t failed = 0;
  uint64_t over = problem.budget;
  // The plans share their work limits: a dozen plans each under its own
  // took the optimal strategy 25 s on a pipelined GPT-2 (issue [13]).
  SharedWork work;
  for (int attempt = 0; attempt < kReplanAttempts; ++attempt) {
    absl::StatusOr<PlanResult> planned = PlanAndEvaluate(problem, one, strategy, &work);
    if (attempt > 0 && planned.status().code() == absl::StatusCode::kResourceExhausted) {
      failed = one.budget;
      if (over - failed <= 1) break;
      one.budget = failed + (over - failed) / 2;
      continue;
    }
    HEADROOM_ASSIGN_OR_RETURN(PlanResult result, std::move(planned));
    if (result.lower_bound_extra_cost && (pipelined || one.budget != problem.budget)) {
      result.lower_bound_extra_cost.reset();
      absl::StrAppend(&result.detail, pipelined ? " (for one micro-batch; no bound in flight)"
                                                : " (planned for a lower budget; no bound)");
    }
    measured = result.evaluation.peak_bytes;
    if (result.fits || result.evaluation.live_bytes.empty()) return result;
    over = std::min(over, one.budget);
    // The plan's own peak, lowered by the excess shared among the micro-
    // batches: a peak at the end of forward falls in_flight times as fast.
    const std::vector<uint64_t>& live = result.evaluation.live_bytes;
    const uint64_t single = *std::max_element(live.begin(), live.end()) -
                            static_cast<uint64_t>(problem.in_flight - 1) * result.evaluation.held_after_forward;
    const uint64_t step_down = std::max<uint64_t>(1, (measured - problem.budget) / problem.in_flight);
    const uint64_t next = std::min(one.budget, single);
    one.budget = next > failed + step_down ? next - step_down : failed + (over - failed) / 2;
    if (one.budget <= failed) break;
  }
  if (!pipelined) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "%s: what selective checkpointing runs of its plans for %s peaks over the budget of %s (its last plan: %s)",
        StrategyName(strategy), QuoteForError(problem.step->name()), FormatBytes(problem.budget),
        FormatBytes(measured)));
  }
  return absl::ResourceExhaustedError(absl::StrFormat(
      "%s: with %d micro-batches in flight, its plans for one micro-batch of %s still peak over the budget of "
      "%s (last: %s)",
      StrategyName(strategy), problem.in_flight, QuoteForError(problem.step->name()), FormatBytes(problem.budget),
      FormatBytes(measured)));
}

// Note [Never worse than its starts]
// The optimal strategy searches from chen-greedy's, chain-dp's and sqrt-n's
// plans, so on one micro-batch as planned it is never costlier than they
// are. Replanned at lowered budgets (Note [Pipeline budgets]), its search
// runs on problems those starts were not made for, and the first plan that
// fits there can be far costlier (replay-all where chen-greedy fits at
// +23%). So each start is also run on the problem itself, and the cheapest
// plan that fits is the one returned, saying whose it is.
absl::StatusOr<PlanResult> NoWorseThanItsStarts(const PlanProblem& problem, absl::StatusOr<PlanResult> searched) {
  for (Strategy start : {Strategy::kChenGreedy, Strategy::kChainDp, Strategy::kSqrtN}) {
    absl::StatusOr<PlanResult> other = RunStrategy(problem, start);
    if (!other.ok() || !other->fits) continue;
    const bool better = !searched.ok() || !searched->fits ||
                        other->evaluation.step_cost < searched->evaluation.step_cost;
    if (!better) continue;
    other->detail = absl::StrFormat("%s's plan, cheaper than what the search found at lowered budgets: %s",
                                    StrategyName(start), other->detail);
    other->strategy = Strategy::kOptimal;
    other->lower_bound_extra_cost.reset();
    searched = *std::move(other);
  }
  return searched;
}

}  // namespace

absl::StatusOr<PlanResult> RunStrategy(const PlanProblem& problem, Strategy strategy) {
  HEADROOM_RETURN_IF_ERROR(ValidateProblem(problem));
  const bool pipelined = problem.in_flight > 1;
  if ((!pipelined && problem.runner == PlanRunner::kAnySchedule) || IgnoresBudget(strategy)) {
    HEADROOM_ASSIGN_OR_RETURN(PlanResult result, PlanAndEvaluate(problem, problem, strategy));
    if (pipelined) result.lower_bound_extra_cost.reset();
    return result;
  }
  absl::StatusOr<PlanResult> result = ReplanUntilItFits(problem, strategy);
  if (strategy == Strategy::kOptimal) return NoWorseThanItsStarts(problem, std::move(result));
  return result;
}

namespace {

// SmallestPeak's results on one problem with the runner's and the
// pipeline's wrapping taken off (runner kAnySchedule, one micro-batch in
// flight), by strategy: SmallestPeaks shares them.
using SmallestPeakMemo = std::map<Strategy, absl::StatusOr<uint64_t>>;

absl::StatusOr<uint64_t> SmallestPeakWith(const PlanProblem& problem, Strategy strategy, SmallestPeakMemo* memo);

// SmallestPeakWith on the unwrapped problem, through `memo` when given.
absl::StatusOr<uint64_t> Memoized(const PlanProblem& problem, Strategy strategy, SmallestPeakMemo* memo) {
  if (memo == nullptr) return SmallestPeakWith(problem, strategy, nullptr);
  auto it = memo->find(strategy);
  if (it == memo->end()) it = memo->emplace(strategy, SmallestPeakWith(problem, strategy, memo)).first;
  return it->second;
}

absl::StatusOr<uint64_t> SmallestPeakWith(const PlanProblem& problem, Strategy strategy, SmallestPeakMemo* memo) {
  HEADROOM_RETURN_IF_ERROR(ValidateProblem(problem));
  if (problem.runner != PlanRunner::kAnySchedule) {
    // What the runner runs of the plan with the least peak it was given.
    PlanProblem ideal = problem;
    ideal.runner = PlanRunner::kAnySchedule;
    ideal.in_flight = 1;
    HEADROOM_ASSIGN_OR_RETURN(ideal.budget, Memoized(ideal, strategy, memo));
    HEADROOM_ASSIGN_OR_RETURN(const PlanResult least, PlanAndEvaluate(problem, ideal, strategy));
    return least.evaluation.peak_bytes;
  }
  if (problem.in_flight > 1) {
    // The pipelined peak of the plan with the least peak for one micro-batch.
    PlanProblem one = problem;
    one.in_flight = 1;
    HEADROOM_ASSIGN_OR_RETURN(one.budget, Memoized(one, strategy, memo));
    HEADROOM_ASSIGN_OR_RETURN(const PlanResult least, PlanAndEvaluate(problem, one, strategy));
    return least.evaluation.peak_bytes;
  }
  switch (strategy) {
    case Strategy::kChenGreedy:
      return ChenGreedyLowestPeak(problem, FindForwardCuts(*problem.step));
    case Strategy::kChainDp: {
      HEADROOM_ASSIGN_OR_RETURN(const Chain chain, ExtractLayerChain(*problem.step, problem.op_cost, problem.profile));
      return MinimumChainPeak(chain);
    }
    case Strategy::kOptimal: {
      if (problem.step->num_ops() <= kMaxRematOps) {
        HEADROOM_ASSIGN_OR_RETURN(const ReachableBudget reachable,
                                  SmallestReachableBudget(problem, StartsFrom(problem)));
        return reachable.reached;
      }
      // Note [Optimal beyond the solvers]: the least of its starts'.
      uint64_t least = std::numeric_limits<uint64_t>::max();
      for (Strategy start : {Strategy::kChenGreedy, Strategy::kChainDp, Strategy::kSqrtN}) {
        absl::StatusOr<uint64_t> peak = Memoized(problem, start, memo);
        if (peak.ok()) least = std::min(least, *peak);
      }
      if (least == std::numeric_limits<uint64_t>::max()) return absl::InternalError("no start plans the step");
      return least;
    }
    case Strategy::kOffload:
    case Strategy::kHybrid:
      return SmallestOffloadPeak(problem, strategy == Strategy::kHybrid);
    default:
      break;
  }
  HEADROOM_ASSIGN_OR_RETURN(Planned planned, Plan(problem, strategy));
  HEADROOM_ASSIGN_OR_RETURN(PlanEvaluation e, EvaluateSchedule(problem, planned.schedule));
  return e.peak_bytes;
}

}  // namespace

absl::StatusOr<uint64_t> SmallestPeak(const PlanProblem& problem, Strategy strategy) {
  return SmallestPeakWith(problem, strategy, nullptr);
}

std::vector<absl::StatusOr<uint64_t>> SmallestPeaks(const PlanProblem& problem,
                                                    const std::vector<Strategy>& strategies) {
  SmallestPeakMemo memo;
  std::vector<absl::StatusOr<uint64_t>> peaks;
  for (Strategy s : strategies) {
    // The wrapped problem's own figure (runner, pipeline) is not memoized:
    // only the unwrapped searches beneath it are shared.
    const bool wrapped = problem.runner != PlanRunner::kAnySchedule || problem.in_flight > 1;
    peaks.push_back(wrapped ? SmallestPeakWith(problem, s, &memo) : Memoized(problem, s, &memo));
  }
  return peaks;
}

namespace {

// CompareStrategies, with hybrid's result given when it was already run.
std::vector<absl::StatusOr<PlanResult>> CompareStrategiesWith(const PlanProblem& problem,
                                                              std::optional<absl::StatusOr<PlanResult>> hybrid);

}  // namespace

absl::StatusOr<PlanResult> RunAutomaticStrategy(const PlanProblem& problem) {
  std::optional<absl::StatusOr<PlanResult>> hybrid;
  if (problem.runner == PlanRunner::kAnySchedule) {
    hybrid = RunStrategy(problem, Strategy::kHybrid);
    if (hybrid->ok() && (*hybrid)->fits) return *std::move(hybrid);
  }
  // Hybrid's run is not repeated (a pipelined one replans up to a dozen times).
  std::vector<absl::StatusOr<PlanResult>> all = CompareStrategiesWith(problem, std::move(hybrid));
  absl::StatusOr<PlanResult>* best = nullptr;
  size_t fitting = 0;
  for (absl::StatusOr<PlanResult>& r : all) {
    if (!r.ok() || !r->fits) continue;
    ++fitting;
    if (best == nullptr || std::pair(r->evaluation.step_cost, r->evaluation.peak_bytes) <
                               std::pair((*best)->evaluation.step_cost, (*best)->evaluation.peak_bytes)) {
      best = &r;
    }
  }
  if (best == nullptr) {
    return absl::ResourceExhaustedError(absl::StrFormat("no strategy's plan for %s fits the budget of %s",
                                                        QuoteForError(problem.step->name()),
                                                        FormatBytes(problem.budget)));
  }
  PlanResult chosen = **std::move(best);
  chosen.detail = absl::StrFormat("the fastest of %d strategies whose plans fit%s: %s", fitting,
                                  problem.runner == PlanRunner::kAnySchedule ? " (hybrid's does not)" : "",
                                  chosen.detail);
  return chosen;
}

bool IsReplayOnly(Strategy strategy) {
  return strategy != Strategy::kOffload && strategy != Strategy::kHybrid;
}

std::vector<absl::StatusOr<PlanResult>> CompareStrategies(const PlanProblem& problem) {
  return CompareStrategiesWith(problem, std::nullopt);
}

namespace {

std::vector<absl::StatusOr<PlanResult>> CompareStrategiesWith(const PlanProblem& problem,
                                                              std::optional<absl::StatusOr<PlanResult>> hybrid) {
  std::vector<absl::StatusOr<PlanResult>> results;
  for (Strategy s : AllStrategies()) {
    results.push_back(s == Strategy::kHybrid && hybrid ? *std::move(hybrid) : RunStrategy(problem, s));
  }
  // The optimal strategy's LP bound holds for every schedule that only
  // replays in program order, so every such plan that fits states its gap.
  std::optional<double> bound;
  for (const absl::StatusOr<PlanResult>& r : results) {
    if (r.ok() && r->strategy == Strategy::kOptimal) bound = r->lower_bound_extra_cost;
  }
  for (absl::StatusOr<PlanResult>& r : results) {
    if (bound && r.ok() && r->fits && IsReplayOnly(r->strategy) && !r->lower_bound_extra_cost) {
      r->lower_bound_extra_cost = bound;
    }
  }
  return results;
}

}  // namespace

}  // namespace headroom

#include "planner/planner.h"

#include <optional>
#include <utility>

#include "absl/strings/str_format.h"
#include "common/name_table.h"
#include "common/status_macros.h"
#include "planner/chen.h"
#include "planner/remat_solver.h"

namespace headroom {
namespace {

constexpr NameTable<Strategy, 5> kStrategyNames("strategy", {{
    {"store-all", Strategy::kStoreAll},
    {"sqrt-n", Strategy::kSqrtN},
    {"sqrt-n-linear", Strategy::kSqrtNLinear},
    {"chen-greedy", Strategy::kChenGreedy},
    {"optimal", Strategy::kOptimal},
}});

struct Planned {
  Schedule schedule;
  std::string detail;
  std::optional<double> lower_bound;
};

absl::StatusOr<Planned> Plan(const PlanProblem& problem, Strategy strategy) {
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
    case Strategy::kOptimal: {
      HEADROOM_ASSIGN_OR_RETURN(RematPlan plan, PlanRemat(problem));
      std::optional<double> bound;
      if (plan.lower_bound_solved) bound = plan.lower_bound;
      return Planned{std::move(plan.schedule), std::move(plan.detail), bound};
    }
  }
  return absl::InternalError("unknown strategy");
}

}  // namespace

std::string_view StrategyName(Strategy strategy) { return kStrategyNames.Name(strategy); }

absl::StatusOr<Strategy> ParseStrategy(std::string_view name) { return kStrategyNames.Parse(name); }

std::vector<Strategy> AllStrategies() {
  return {Strategy::kStoreAll, Strategy::kSqrtN, Strategy::kSqrtNLinear, Strategy::kChenGreedy, Strategy::kOptimal};
}

absl::StatusOr<PlanResult> RunStrategy(const PlanProblem& problem, Strategy strategy) {
  HEADROOM_RETURN_IF_ERROR(ValidateProblem(problem));
  HEADROOM_ASSIGN_OR_RETURN(Planned planned, Plan(problem, strategy));
  HEADROOM_ASSIGN_OR_RETURN(PlanEvaluation e, EvaluateSchedule(problem, planned.schedule));
  PlanResult result{.strategy = strategy, .schedule = std::move(planned.schedule), .evaluation = std::move(e),
                    .lower_bound_extra_cost = planned.lower_bound, .detail = std::move(planned.detail)};
  result.fits = result.evaluation.peak_bytes <= problem.budget;
  return result;
}

absl::StatusOr<uint64_t> SmallestPeak(const PlanProblem& problem, Strategy strategy) {
  HEADROOM_RETURN_IF_ERROR(ValidateProblem(problem));
  if (strategy == Strategy::kChenGreedy) return ChenGreedyLowestPeak(problem, FindForwardCuts(*problem.step));
  HEADROOM_ASSIGN_OR_RETURN(Planned planned, Plan(problem, strategy));
  HEADROOM_ASSIGN_OR_RETURN(PlanEvaluation e, EvaluateSchedule(problem, planned.schedule));
  return e.peak_bytes;
}

std::vector<absl::StatusOr<PlanResult>> CompareStrategies(const PlanProblem& problem) {
  std::vector<absl::StatusOr<PlanResult>> results;
  for (Strategy s : AllStrategies()) results.push_back(RunStrategy(problem, s));
  return results;
}

}  // namespace headroom

// Rematerialization over any DAG in program order: which forward ops to
// replay, and when, so that a training step fits a memory budget at the
// least extra compute. Strategy::kOptimal (planner/planner.h) is PlanRemat.
//
//   PlanProblem problem = {.step = &step, .op_cost = costs, .budget = 20 * kGiB};
//   absl::StatusOr<RematPlan> plan = PlanRemat(problem);       // seconds
//   plan->evaluation.extra_cost;  plan->lower_bound;  plan->gap();
//   absl::StatusOr<RematPlan> exact = SolveRematMilp(problem); // Checkmate's MILP, minutes
//
// The schedule space is that of planner/schedule.h: every op computed once
// in program order, forward ops replayed anywhere after their compute, each
// op reading the latest copy of its inputs (so replays are how copies are
// dropped early). No offloading.
//
// Note [Remat strategies]
//  - SolveRematMilp: the mixed-integer program of Checkmate (Jain et al.,
//    "Checkmate: Breaking the Memory Wall with Optimal Tensor
//    Rematerialization", MLSys 2020, sec. 4), with the stage order fixed to
//    program order, solved by COIN-OR CBC under a time limit. Optimal over
//    schedules whose replays within a stage run in program order.
//  - RematLowerBound: an LP relaxation solved by COIN-OR CLP whose optimum
//    no schedule in program order can beat, Checkmate's or not (Note [Remat
//    LP bound] in remat_lp.cc). Every plan reports it, so every plan states
//    its optimality gap.
//  - PlanRemat: the fast strategy. It solves the bound LP, rounds its
//    solution at several thresholds into retention patterns (which copies
//    to hold from one stage into the next; replays follow lazily where a
//    copy is missing), and adds the patterns that hold everything and hold
//    nothing. From each, a local search (Note [Remat search] in the .cc)
//    repairs a peak over budget by dropping copies held across it, then
//    cuts compute by holding copies that are replayed while the peak stays
//    within budget, and by swaps (a drop and then fills, or a fill and then
//    a repair); a seeded iterated local search kicks the best and repeats.
//    The result is measured with EvaluateSchedule, and the search budget
//    is tightened and the search rerun if that disagrees with the solver's
//    model (views; Note [Remat model]). On the Checkmate graphs it matches
//    the MILP's optimum in about a second (bench/remat_bench.cc).
//  - SmallestReachableBudget: the least peak a schedule in program order
//    reaches, bracketed: a schedule that reaches `reached`, and a proof
//    (per-op operand floors, LP infeasibility) that none goes below `floor`.
// Budget errors (ResourceExhausted) say which of these applies and name
// both figures, so a user knows the budget to ask for.
#ifndef HEADROOM_PLANNER_REMAT_SOLVER_H_
#define HEADROOM_PLANNER_REMAT_SOLVER_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "planner/plan.h"
#include "planner/schedule.h"

namespace headroom {

// Note [Remat work limits]
// The bound LP has O(ops^2) columns: 139,422 on ResNet-50's 632-op step,
// whose LP CLP solves in about 17,000 iterations (3-4 s of CPU), and
// 393,308 on GPT-2's 1,019-op step, where presolve alone takes seconds and
// the solve 84,270 iterations (30 s of CPU). So that every strategy answers
// in seconds (issue [13]), the LPs run under work limits, not only clocks:
// an LP with more than lp_max_columns columns is not solved, and all the LPs
// of one call (the bound, the one at the op floor, the bisection of
// SmallestReachableBudget) share lp_iterations simplex iterations. Both
// count work, not time, so a plan is the same on every machine; the time
// limit stays as a backstop. Where the LP was not solved the search starts
// from the other seeds (store-all, replay-all, the starts), the plan has no
// LP bound (the optimal strategy then states the knapsack bound, Note
// [Replay knapsack bound]), and RematPlan::detail says which limit ended it.
struct RematOptions {
  // Wall-clock limit of SolveRematMilp; CBC returns its best schedule so far.
  double milp_time_limit_s = 120;
  // Wall-clock limit of each LP solve, a backstop behind the work limits.
  double lp_time_limit_s = 60;
  // Note [Remat work limits]: simplex iterations for all the LPs of one
  // call together, and the most columns an LP may have to be solved.
  int64_t lp_iterations = 20000;
  int64_t lp_max_columns = 200000;
  // When set, the iterations left to the LPs of several calls together (the
  // replans of one RunStrategy, Note [Pipeline budgets] in planner.cc):
  // they draw from and write back to it, and lp_iterations only names the
  // limit in the detail.
  int64_t* shared_lp_iterations_left = nullptr;
  // PlanRemat's local search effort, in schedules simulated (one with more
  // than twice as many steps as ops counts as several), and the kicks of
  // its iterated local search. Both fix the work, so results repeat.
  int search_evaluations = 30000;
  int search_kicks = 200;
  // Other plans of the same problem (compute and recompute entries), named:
  // the search starts from each as well, PlanRemat returns the cheapest of
  // them that fits when its search finds nothing cheaper, and one that
  // peaks at the op floor ends SmallestReachableBudget's search at once.
  std::vector<std::pair<std::string, Schedule>> starts;
};

struct RematPlan {
  Schedule schedule;
  PlanEvaluation evaluation;  // EvaluateSchedule(problem, schedule); peak_bytes <= budget
  // No schedule in program order that meets the budget replays less than
  // this (Note [Remat LP bound]); 0 when the LP did not finish within its
  // limits (Note [Remat work limits]).
  double lower_bound = 0;
  bool lower_bound_solved = false;  // the LP reached its optimum
  // SolveRematMilp only: CBC proved the schedule optimal among Checkmate's
  // schedules, or stopped at milp_time_limit_s; its own bound on the extra
  // cost within Checkmate's schedule space.
  bool proven_optimal = false;
  bool hit_time_limit = false;
  double milp_bound = 0;
  double seconds = 0;  // wall time to plan, bound included
  std::string detail;  // how the plan was found, in a few words

  // Extra cost above the bound: how far from optimal the plan can be.
  double gap() const { return evaluation.extra_cost - lower_bound; }
};

// The fast strategy (Note [Remat strategies]). Errors: the problem's own
// (ValidateProblem), InvalidArgument for a graph over kMaxRematOps ops, and
// ResourceExhausted when no schedule was found within the budget, naming
// the smallest budget reachable (SmallestReachableBudget).
absl::StatusOr<RematPlan> PlanRemat(const PlanProblem& problem, const RematOptions& options = {});

// Checkmate's MILP (Note [Remat strategies]); the same errors, and
// ResourceExhausted also when CBC found no schedule within its time limit.
absl::StatusOr<RematPlan> SolveRematMilp(const PlanProblem& problem, const RematOptions& options = {});

struct RematBound {
  bool feasible = true;    // false: the LP proves no schedule meets the budget
  bool solved = false;     // the LP reached its optimum (else extra_cost is 0)
  double extra_cost = 0;   // lower bound on replay cost
  double seconds = 0;
};
absl::StatusOr<RematBound> RematLowerBound(const PlanProblem& problem, const RematOptions& options = {});

// Note [Replay knapsack bound]
// A bound without an LP, for steps of any size. While op t runs, any
// schedule in program order holds t's inputs and outputs; a copy that
// store-all holds across t and that is read after t is either held too or
// dropped before t and made again after it, by a replay of its op. So where
// store-all holds `need` bytes over budget at t, some ops whose copies span
// t must each replay at least once, and the cheapest such set costs at
// least the fractional knapsack: ops by cost per byte spanning t, cheapest
// first, until `need` bytes are covered. Memory is counted per value (Note
// [Remat LP bound] in remat_lp.cc), so what counts is really live. The
// largest over ops is the bound; `feasible` is false when at some op even
// dropping everything droppable leaves too much (a budget below the floor).
// Weaker than the LP (one op at a time, replays free of memory), it is
// fast on any step: one sweep keeps each producer's droppable bytes as
// values come and go, and a Fenwick tree over those (producer, bytes)
// states, ranked cheapest per byte first by a first sweep that lists
// them, answers each op's knapsack in log time: O((values + reads) log)
// in all, where a pass over the held values per op was quadratic on long
// chains (issue [13]: 15.5 s of a 40,001-op chain's `optimal`, now 1.6 s).
// RematBound::solved is true.
absl::StatusOr<RematBound> ReplayKnapsackBound(const PlanProblem& problem);

struct ReachableBudget {
  uint64_t reached = 0;  // the peak of `schedule`, the least found
  uint64_t floor = 0;    // proven: no schedule in program order peaks below it
  Schedule schedule;
};
// The budget in the problem is ignored.
absl::StatusOr<ReachableBudget> SmallestReachableBudget(const PlanProblem& problem,
                                                        const RematOptions& options = {});

// The solvers keep O(ops^2) variables and retention flags: a 646-op GPT-2
// step takes PlanRemat about 10 s, and time grows faster than the square.
// Beyond this many ops they refuse rather than run for many minutes; the
// Checkmate benchmark graphs have at most a few hundred.
inline constexpr size_t kMaxRematOps = 1024;

}  // namespace headroom

#endif  // HEADROOM_PLANNER_REMAT_SOLVER_H_

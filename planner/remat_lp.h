// The rematerialization MILP and LPs over a remat::Model, solved with
// COIN-OR CBC (branch and cut) and CLP (simplex). Internal to the planner;
// planner/remat_solver.h is the interface. The COIN-OR headers stay in the
// .cc, so the library links them privately.
//
// CBC's command-line driver keeps some global state, so MILP solves take a
// process-wide lock; the LPs (CLP alone) run concurrently.
#ifndef HEADROOM_PLANNER_REMAT_LP_H_
#define HEADROOM_PLANNER_REMAT_LP_H_

#include <cstdint>
#include <limits>
#include <span>
#include <vector>

#include "absl/status/statusor.h"
#include "planner/remat_model.h"

namespace headroom::remat {

// Checkmate's MILP (Note [Checkmate MILP] in the .cc) at `budget` bytes.
struct MilpOutcome {
  bool has_solution = false;    // an incumbent was found
  std::vector<Step> steps;      // the incumbent decoded (Note [Checkmate decoding])
  double objective = 0;         // its extra cost
  double best_bound = 0;        // CBC's lower bound on the extra cost (Checkmate's schedule space)
  bool proven_optimal = false;
  bool proven_infeasible = false;
  bool hit_time_limit = false;
  double seconds = 0;
  int columns = 0;
  int rows = 0;
};
absl::StatusOr<MilpOutcome> SolveCheckmateMilp(const Model& model, uint64_t budget, double time_limit_s);

// How much work an LP may take (Note [Remat work limits] in
// remat_solver.h). The iteration and column limits fix the work, so the
// outcome repeats on any machine; the time limit is a backstop.
struct LpLimits {
  double time_limit_s = 60;
  int64_t max_iterations = std::numeric_limits<int64_t>::max();  // CLP's simplex iterations
  int64_t max_columns = std::numeric_limits<int64_t>::max();     // larger LPs are not solved
};

// An LP solution: per op and stage, how much of a copy is held or replayed.
struct LpOutcome {
  // kStopped: a limit of LpLimits ended the solve (too_large: the column
  // limit, before any iteration).
  enum class Status { kOptimal, kInfeasible, kStopped };
  Status status = Status::kStopped;
  bool too_large = false;
  double objective = 0;  // extra cost; a lower bound only when kOptimal
  double seconds = 0;
  int64_t iterations = 0;  // simplex iterations spent
  int columns = 0;
  int rows = 0;
  // carry[i][t]: the fraction of op i's output held from stage t into
  // stage t + 1 (by the LP's own definition), for t >= i; 0 elsewhere.
  std::vector<std::vector<double>> carry;
};

// Note [Remat LP bound]: a relaxation valid for every schedule in program
// order, so its optimum bounds the extra cost of any of them from below,
// and its infeasibility proves that no schedule meets `budget`.
absl::StatusOr<LpOutcome> SolveBoundLp(const Model& model, uint64_t budget, const LpLimits& limits);

// The LP relaxation of Checkmate's MILP, for comparison with ours
// (bench/remat_bench.cc): a bound within Checkmate's schedule space only
// (replays of a stage in program order). Its carry is S, the fractional
// retention that Checkmate's two-phase rounding starts from.
absl::StatusOr<LpOutcome> SolveCheckmateLp(const Model& model, uint64_t budget, double time_limit_s);

}  // namespace headroom::remat

#endif  // HEADROOM_PLANNER_REMAT_LP_H_

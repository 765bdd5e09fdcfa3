#include "planner/remat_lp.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <utility>

#include "CbcModel.hpp"
#include "CbcSolver.hpp"
#include "ClpSimplex.hpp"
#include "CoinPackedMatrix.hpp"
#include "OsiClpSolverInterface.hpp"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace headroom::remat {
namespace {

// Note [Checkmate MILP]
// Jain et al., "Checkmate: Breaking the Memory Wall with Optimal Tensor
// Rematerialization" (MLSys 2020), sec. 4, with the schedule in stages:
// stage t ends with the first (and only) compute of op t, and before it may
// replay earlier forward ops, in program order. Binary R[t][k]: op k runs in
// stage t (R[t][t] = 1: the frontier advances one op per stage). Binary
// S[t][i]: a copy of op i made before stage t is still held when it starts.
//   minimize   sum over k < t of cost[k] R[t][k]            (the replays)
//   R[t][k] <= R[t][d] + S[t][d]        each dep d of k     (inputs exist)
//   S[t][i] <= R[t-1][i] + S[t-1][i]                        (held or just made)
//   U[t][a_1] = fixed + sum_i bytes[i] S[t][i] + bytes[a_1] R[t][a_1]
//   U[t][a_l] = U[t][a_{l-1}] + bytes[a_l] R[t][a_l]
//               - sum over i in deps(a_{l-1}) + {a_{l-1}} of bytes[i] FREE[t][i][a_{l-1}]
//   U[t][k] <= budget
// where a_1 < a_2 < ... are the ops stage t may run. FREE[t][i][k] frees op
// i's copy right after k runs in stage t, allowed only when k ran, i is not
// held into stage t + 1 and no later op of the stage reads i:
//   FREE <= R[t][k],  FREE <= 1 - S[t+1][i],  FREE <= 1 - R[t][j]  (j > k reads i).
// U[t][k] is then the memory while k runs: what is held, what the stage
// made and has not freed, k's inputs (their frees come after k) and k's
// output, which is our liveness rule (graph/liveness.h) exactly.
//
// Differences from the paper, none of which changes the optimum:
//  - Checkmate writes FREE's product with one aggregated big-M pair; here
//    each factor is its own inequality (a tighter LP relaxation), and FREE
//    is continuous with no lower bound: with R and S integral its upper
//    bounds are 0 or 1, and freeing less only raises U, so an optimum frees
//    all it may. Decoding reads R alone.
//  - Variables that cannot matter are left out: R[t][k] and S[t][i] past
//    the last stage at which a copy could still be read (ReachLast), and
//    replays of non-recomputable ops.
//  - Bytes are in units of the budget (so the budget row reads 1). The
//    solver's feasibility tolerance can let U exceed it by ~1e-7 of the
//    budget; SolveRematMilp measures the decoded schedule and solves again
//    under a budget lowered by any overshoot.
//  - Views (and in-place outputs): a held view keeps the copy of the base
//    it views alive, which the paper's model, without views, does not
//    know. S[t][view] <= S[t][base] counts that copy, and
//    R[t][base] + S[t][view] <= 1 + R[t][view] replays a held view with its
//    base, so that the old base copy has no reader after the stage.
// A MILP-feasible schedule is then ProfileMemory-feasible for the graphs
// Checkmate models (single-output ops, no views): the decoded schedule
// frees every copy right after its last reader (latest-copy rule), never
// later than FREE does, and holds at most one copy of an op where the MILP
// may count two (S and R both set). It frees a multi-output op's outputs
// separately where the model frees them together, which only helps. With
// views the argument above is ours, not the paper's, and SolveRematMilp
// checks the decoded schedule with EvaluateSchedule regardless.
//
// Note [Checkmate decoding]
// Stage by stage, the ops with R[t][k] > 1/2 run in program order: k < t as
// a recompute entry, t as its compute entry. The latest-copy rule then frees
// what S drops: a copy not held into the next stage has no reader after its
// stage, since every later reader reads a newer replay.

constexpr double kInf = 1e30;

// Note [Remat cost scale]
// CLP asserts that every objective coefficient is below 1e25 (ClpSimplex.cpp)
// and its tolerances are absolute (1e-7), while costs come in any unit: a
// node-link graph's profiled cost_cpu up to kMaxMeasuredCost (graph/graph.h),
// roofline seconds near 1e-6. So the LPs and the MILP see each cost divided
// by the power of two just above the largest: coefficients in [0, 1), the
// largest at least 1/2, and the division and the scaling back of objectives
// and bounds exact.
double CostScale(const Model& m) {
  double largest = 0;
  for (double c : m.cost) largest = std::max(largest, c);
  if (!(largest > 0)) return 1.0;
  int exponent = 0;
  std::frexp(largest, &exponent);  // largest = f * 2^exponent, f in [1/2, 1)
  return std::ldexp(1.0, exponent);
}

double Seconds(absl::Time start) { return absl::ToDoubleSeconds(absl::Now() - start); }

// The last stage at which a copy of each op can be read: its last reader,
// or the last stage a recomputable reader could itself be replayed in.
std::vector<int32_t> ReachLast(const Model& m) {
  std::vector<int32_t> reach(static_cast<size_t>(m.n));
  for (int32_t i = m.n; i-- > 0;) {
    int32_t r = i;
    for (int32_t u : m.users[static_cast<size_t>(i)]) {
      r = std::max(r, m.recomputable[static_cast<size_t>(u)] ? reach[static_cast<size_t>(u)] : u);
    }
    reach[static_cast<size_t>(i)] = r;
  }
  return reach;
}

constexpr int kAbsent = -1;
constexpr int kOne = -2;

// Columns and rows of an LP/MILP, gathered as triplets.
struct LpBuilder {
  std::vector<double> col_lb, col_ub, obj;
  std::vector<int> integer_cols;
  std::vector<double> row_lb, row_ub;
  std::vector<int> row_index, col_index;
  std::vector<double> elements;

  int AddCol(double lb, double ub, double cost, bool integer) {
    const int c = static_cast<int>(obj.size());
    col_lb.push_back(lb);
    col_ub.push_back(ub);
    obj.push_back(cost);
    if (integer) integer_cols.push_back(c);
    return c;
  }
  int AddRow(double lb, double ub) {
    row_lb.push_back(lb);
    row_ub.push_back(ub);
    return static_cast<int>(row_lb.size()) - 1;
  }
  // `col` may be kAbsent (a variable fixed at 0: nothing to add) or kOne
  // (fixed at 1: the term moves into the row's bounds).
  void Add(int row, int col, double value) {
    if (col == kOne) {
      row_lb[static_cast<size_t>(row)] -= value;
      row_ub[static_cast<size_t>(row)] -= value;
      return;
    }
    if (col < 0) return;
    row_index.push_back(row);
    col_index.push_back(col);
    elements.push_back(value);
  }
  CoinPackedMatrix Matrix() const {
    CoinPackedMatrix m(/*colordered=*/true, row_index.data(), col_index.data(), elements.data(),
                       static_cast<CoinBigIndex>(elements.size()));
    // Trailing empty rows/columns are not implied by the triplets.
    m.setDimensions(static_cast<int>(row_lb.size()), static_cast<int>(obj.size()));
    return m;
  }
};


struct CheckmateColumns {
  std::vector<std::vector<int>> r;  // r[t][k], k <= t; -1 where fixed at 0
  std::vector<std::vector<int>> s;  // s[t][i], i < t; -1 where fixed at 0
};

// Note [Checkmate MILP]. Returns false when the budget is below the fixed bytes.
bool BuildCheckmate(const Model& m, uint64_t budget, bool integer, LpBuilder& b, CheckmateColumns& cols) {
  if (budget < m.fixed_bytes) return false;
  const auto n = static_cast<size_t>(m.n);
  const double scale = static_cast<double>(budget);
  const double capacity = 1.0;
  auto mem = [&](int32_t op) { return static_cast<double>(m.bytes[static_cast<size_t>(op)]) / scale; };
  const std::vector<int32_t> reach = ReachLast(m);
  const double cost_scale = CostScale(m);  // Note [Remat cost scale]

  cols.r.assign(n, {});
  cols.s.assign(n, {});
  for (size_t t = 0; t < n; ++t) {
    cols.r[t].assign(t + 1, -1);
    cols.s[t].assign(t, -1);
    for (size_t k = 0; k < t; ++k) {
      if (m.recomputable[k] && static_cast<int32_t>(t) <= reach[k]) {
        cols.r[t][k] = b.AddCol(0, 1, m.cost[k] / cost_scale, integer);
      }
      if (static_cast<int32_t>(t) <= reach[k]) cols.s[t][k] = b.AddCol(0, 1, 0, integer);
    }
    cols.r[t][t] = b.AddCol(1, 1, 0, false);
  }
  auto S = [&](size_t t, int32_t i) {
    return t < n && static_cast<size_t>(i) < t ? cols.s[t][static_cast<size_t>(i)] : -1;
  };

  std::vector<int32_t> active;
  for (size_t t = 0; t < n; ++t) {
    active.clear();
    for (size_t k = 0; k <= t; ++k) {
      if (cols.r[t][k] >= 0) active.push_back(static_cast<int32_t>(k));
    }
    // Inputs exist: computed in this stage or held into it.
    for (int32_t k : active) {
      for (int32_t d : m.deps[static_cast<size_t>(k)]) {
        const int row = b.AddRow(-kInf, 0);
        b.Add(row, cols.r[t][static_cast<size_t>(k)], 1);
        b.Add(row, cols.r[t][static_cast<size_t>(d)], -1);
        b.Add(row, S(t, d), -1);
      }
    }
    // Held copies were held or made in the stage before.
    if (t >= 1) {
      for (size_t i = 0; i + 1 < t; ++i) {
        if (cols.s[t][i] < 0) continue;
        const int row = b.AddRow(-kInf, 0);
        b.Add(row, cols.s[t][i], 1);
        b.Add(row, cols.r[t - 1][i], -1);
        b.Add(row, cols.s[t - 1][i], -1);
      }
    }
    // Views (Note [Remat model]): a held view keeps the copy it views
    // alive, so its base counts as held; and a base replayed while a view
    // of its old copy is held replays the view too, so that no reader
    // after it keeps the old copy alive.
    for (size_t v = 0; v < t; ++v) {
      const int s_view = cols.s[t][v];
      if (s_view < 0) continue;
      for (int32_t base : m.aliases[v]) {
        const int row = b.AddRow(-kInf, 0);
        b.Add(row, s_view, 1);
        b.Add(row, S(t, base), -1);
        if (const int r_base = cols.r[t][static_cast<size_t>(base)]; r_base >= 0) {
          const int r2 = b.AddRow(-kInf, 1);
          b.Add(r2, r_base, 1);
          b.Add(r2, s_view, 1);
          b.Add(r2, cols.r[t][v], -1);
        }
      }
    }
    // Memory while each op of the stage runs.
    int prev_u = -1;
    int32_t prev_k = -1;
    for (int32_t k : active) {
      const int u = b.AddCol(0, capacity, 0, false);
      const int row = b.AddRow(0, 0);
      b.Add(row, u, 1);
      b.Add(row, cols.r[t][static_cast<size_t>(k)], -mem(k));
      if (prev_u < 0) {
        b.row_lb[static_cast<size_t>(row)] = b.row_ub[static_cast<size_t>(row)] =
            static_cast<double>(m.fixed_bytes) / scale;
        for (size_t i = 0; i < t; ++i) b.Add(row, cols.s[t][i], -mem(static_cast<int32_t>(i)));
      } else {
        b.Add(row, prev_u, -1);
        // Frees right after prev_k.
        auto add_free = [&](int32_t i) {
          if (m.bytes[static_cast<size_t>(i)] == 0) return;
          const int f = b.AddCol(0, 1, 0, false);
          b.Add(row, f, mem(i));
          int r1 = b.AddRow(-kInf, 0);
          b.Add(r1, f, 1);
          b.Add(r1, cols.r[t][static_cast<size_t>(prev_k)], -1);
          if (const int s_next = S(t + 1, i); s_next >= 0) {
            const int r2 = b.AddRow(-kInf, 1);
            b.Add(r2, f, 1);
            b.Add(r2, s_next, 1);
          }
          for (int32_t j : m.users[static_cast<size_t>(i)]) {
            if (j <= prev_k || static_cast<size_t>(j) > t || cols.r[t][static_cast<size_t>(j)] < 0) continue;
            const int r3 = b.AddRow(-kInf, 1);
            b.Add(r3, f, 1);
            b.Add(r3, cols.r[t][static_cast<size_t>(j)], 1);
          }
        };
        for (int32_t d : m.deps[static_cast<size_t>(prev_k)]) add_free(d);
        add_free(prev_k);
      }
      prev_u = u;
      prev_k = k;
    }
  }
  return true;
}

std::vector<Step> DecodeCheckmate(const Model& m, const CheckmateColumns& cols, const double* x) {
  std::vector<Step> steps;
  for (size_t t = 0; t < static_cast<size_t>(m.n); ++t) {
    for (size_t k = 0; k < t; ++k) {
      if (cols.r[t][k] >= 0 && x[cols.r[t][k]] > 0.5) steps.push_back({static_cast<int32_t>(k), true});
    }
    steps.push_back({static_cast<int32_t>(t), false});
  }
  return steps;
}

// Solves an LP with CLP's default (presolve, dual simplex).
LpOutcome::Status SolveLp(const LpBuilder& b, const LpLimits& limits, ClpSimplex& lp) {
  lp.setLogLevel(0);
  lp.loadProblem(b.Matrix(), b.col_lb.data(), b.col_ub.data(), b.obj.data(), b.row_lb.data(), b.row_ub.data());
  lp.setMaximumSeconds(limits.time_limit_s);
  lp.setMaximumIterations(static_cast<int>(
      std::clamp<int64_t>(limits.max_iterations, 0, std::numeric_limits<int>::max())));
  lp.initialSolve();
  if (lp.isProvenOptimal()) return LpOutcome::Status::kOptimal;
  if (lp.isProvenPrimalInfeasible()) return LpOutcome::Status::kInfeasible;
  return LpOutcome::Status::kStopped;
}

int NoCallback(CbcModel* /*model*/, int /*where_from*/) { return 0; }

}  // namespace

absl::StatusOr<MilpOutcome> SolveCheckmateMilp(const Model& model, uint64_t budget, double time_limit_s) {
  const absl::Time start = absl::Now();
  MilpOutcome out;
  LpBuilder b;
  CheckmateColumns cols;
  if (!BuildCheckmate(model, budget, /*integer=*/true, b, cols)) {
    out.proven_infeasible = true;
    return out;
  }
  out.columns = static_cast<int>(b.obj.size());
  out.rows = static_cast<int>(b.row_lb.size());

  OsiClpSolverInterface solver;
  solver.messageHandler()->setLogLevel(0);
  solver.getModelPtr()->setLogLevel(0);
  solver.loadProblem(b.Matrix(), b.col_lb.data(), b.col_ub.data(), b.obj.data(), b.row_lb.data(),
                     b.row_ub.data());
  for (int c : b.integer_cols) solver.setInteger(c);

  // CBC's driver keeps parameters and messages in globals: one solve at a
  // time in this process.
  static absl::Mutex cbc_mutex(absl::kConstInit);
  absl::MutexLock lock(&cbc_mutex);
  CbcModel cbc(solver);
  cbc.setLogLevel(0);
  CbcSolverUsefulData data;
  data.noPrinting_ = true;
  data.useSignalHandler_ = false;  // a library does not own SIGINT
  CbcMain0(cbc, data);
  const std::string seconds = absl::StrFormat("%.3f", std::max(0.01, time_limit_s));
  const char* argv[] = {"headroom-remat", "-log", "0", "-timeMode", "elapsed", "-sec", seconds.c_str(),
                        "-solve", "-quit"};
  CbcMain1(static_cast<int>(std::size(argv)), argv, cbc, NoCallback, data);

  out.seconds = Seconds(start);
  out.proven_optimal = cbc.isProvenOptimal();
  out.proven_infeasible = cbc.isProvenInfeasible();
  out.hit_time_limit = cbc.isSecondsLimitReached();
  out.best_bound = std::max(0.0, cbc.getBestPossibleObjValue()) * CostScale(model);
  if (const double* x = cbc.bestSolution(); x != nullptr && cbc.getSolutionCount() > 0) {
    out.has_solution = true;
    out.steps = DecodeCheckmate(model, cols, x);
    out.objective = 0;
    for (const Step& s : out.steps) {
      if (s.recompute) out.objective += model.cost[static_cast<size_t>(s.op)];
    }
    if (out.proven_optimal) out.best_bound = out.objective;
    out.best_bound = std::min(out.best_bound, out.objective);
  }
  return out;
}

absl::StatusOr<LpOutcome> SolveCheckmateLp(const Model& model, uint64_t budget, double time_limit_s) {
  const absl::Time start = absl::Now();
  LpOutcome out;
  LpBuilder b;
  CheckmateColumns cols;
  const auto n = static_cast<size_t>(model.n);
  out.carry.assign(n, std::vector<double>(n, 0.0));
  if (!BuildCheckmate(model, budget, /*integer=*/false, b, cols)) {
    out.status = LpOutcome::Status::kInfeasible;
    return out;
  }
  out.columns = static_cast<int>(b.obj.size());
  out.rows = static_cast<int>(b.row_lb.size());
  ClpSimplex lp;
  out.status = SolveLp(b, {.time_limit_s = time_limit_s}, lp);
  out.seconds = Seconds(start);
  if (out.status != LpOutcome::Status::kOptimal) return out;
  out.objective = lp.objectiveValue() * CostScale(model);
  const double* x = lp.getColSolution();
  for (size_t t = 0; t + 1 < n; ++t) {
    for (size_t i = 0; i <= t; ++i) {
      if (const int c = cols.s[t + 1][i]; c >= 0) out.carry[i][t] = x[c];
    }
  }
  return out;
}

// Note [Remat LP bound]
// Checkmate's LP relaxation bounds only schedules whose stages replay ops in
// program order; ours may replay in any order, and a different order can
// lower a stage's peak, so its optimum is no bound for them. This relaxation
// drops order within a stage altogether. Stage t is, as above, the entries
// after op t-1's compute up to op t's. For each counted value v (a storage
// tensor, Note [Remat model]) and stage t:
//   P[t][v] = 1 if some copy of v is live while op t computes,
//   R[t][k] = 1 if stage t replays op k at least once.
// Every schedule in program order gives a point of the LP, with the
// constraints holding because:
//   P[t][v] = 1 for v that op t reads or writes (its operands are live);
//   P[t][v] <= P[t-1][v] + R[t][p(v)]   a copy live at op t was live at op
//             t-1 or was made in stage t (only p(v)'s runs make copies);
//   R[t][k] <= R[t][p(v)] + P[t-1][v]   for v that k reads: the copy k
//             reads existed at op t-1's compute or was made in stage t;
//   fixed + sum_v bytes(v) P[t][v] <= budget   each live value has at least
//             one copy, and ProfileMemory's live bytes during op t count it.
// The objective sum cost[k] R[t][k] is at most the schedule's replay cost
// (a stage replaying k twice pays twice). Replays that no one reads only
// add cost and memory, so it suffices that pruned schedules map into the
// LP, which lets variables past ReachLast be left out. Hence the LP optimum
// is a lower bound on the extra cost of every schedule in program order
// that meets the budget, Checkmate's included, and an infeasible LP proves
// that none does. It ignores memory while replays run, so it is weaker than
// Checkmate's relaxation where within-stage peaks bind.
absl::StatusOr<LpOutcome> SolveBoundLp(const Model& model, uint64_t budget, const LpLimits& limits) {
  const absl::Time start = absl::Now();
  LpOutcome out;
  const auto n = static_cast<size_t>(model.n);
  out.carry.assign(n, std::vector<double>(n, 0.0));
  if (budget < model.fixed_bytes) {
    out.status = LpOutcome::Status::kInfeasible;
    return out;
  }
  const double scale = static_cast<double>(budget);
  const double cost_scale = CostScale(model);  // Note [Remat cost scale]
  const std::vector<int32_t> reach = ReachLast(model);
  const size_t num_values = model.value_producer.size();
  // The last stage at which a copy of each value can be live.
  std::vector<int32_t> value_reach(num_values);
  for (size_t v = 0; v < num_values; ++v) value_reach[v] = model.value_producer[v];
  for (size_t k = 0; k < n; ++k) {
    const int32_t last = model.recomputable[k] ? reach[k] : static_cast<int32_t>(k);
    for (int32_t v : model.reads[k]) {
      value_reach[static_cast<size_t>(v)] = std::max(value_reach[static_cast<size_t>(v)], last);
    }
  }

  LpBuilder b;
  // p[v][t - producer]: P[t][v]; r[t][k]: R[t][k].
  // Operands of op t are live while it runs: P[t][v] = 1, a constant
  // rather than a fixed column (CLP's presolve spends long removing those).
  std::vector<std::vector<int>> p(num_values);
  for (size_t v = 0; v < num_values; ++v) {
    p[v].assign(static_cast<size_t>(value_reach[v] - model.value_producer[v] + 1), kAbsent);
  }
  for (size_t t = 0; t < n; ++t) {
    for (const std::vector<int32_t>* vs : {&model.reads[t], &model.writes[t]}) {
      for (int32_t v : *vs) {
        p[static_cast<size_t>(v)][t - static_cast<size_t>(model.value_producer[static_cast<size_t>(v)])] = kOne;
      }
    }
  }
  for (size_t v = 0; v < num_values; ++v) {
    for (int& c : p[v]) {
      if (c == kAbsent) c = b.AddCol(0, 1, 0, false);
    }
  }
  auto P = [&](int32_t t, int32_t v) {
    const int32_t first = model.value_producer[static_cast<size_t>(v)];
    if (t < first || t > value_reach[static_cast<size_t>(v)]) return kAbsent;
    return p[static_cast<size_t>(v)][static_cast<size_t>(t - first)];
  };
  std::vector<std::vector<int>> r(n);
  for (size_t t = 0; t < n; ++t) {
    r[t].assign(t, -1);
    for (size_t k = 0; k < t; ++k) {
      if (model.recomputable[k] && static_cast<int32_t>(t) <= reach[k]) {
        r[t][k] = b.AddCol(0, 1, model.cost[k] / cost_scale, false);
      }
    }
  }
  auto R = [&](int32_t t, int32_t k) {
    return k < t ? r[static_cast<size_t>(t)][static_cast<size_t>(k)] : -1;
  };

  for (size_t t = 0; t < n; ++t) {
    const auto st = static_cast<int32_t>(t);
    // Memory during op t.
    // No margin under the budget here: a schedule peaking at the budget
    // itself must stay feasible for the bound to hold.
    const int mem_row = b.AddRow(-kInf, 1.0 - static_cast<double>(model.fixed_bytes) / scale);
    for (size_t v = 0; v < num_values; ++v) {
      b.Add(mem_row, P(st, static_cast<int32_t>(v)), static_cast<double>(model.value_bytes[v]) / scale);
    }
    // Replays read copies that existed or were replayed.
    for (size_t k = 0; k < t; ++k) {
      if (r[t][k] < 0) continue;
      for (int32_t v : model.reads[k]) {
        const int row = b.AddRow(-kInf, 0);
        b.Add(row, r[t][k], 1);
        b.Add(row, R(st, model.value_producer[static_cast<size_t>(v)]), -1);
        b.Add(row, P(st - 1, v), -1);
      }
    }
  }
  // Copies live at op t were live at op t-1 or made in stage t.
  for (size_t v = 0; v < num_values; ++v) {
    const int32_t first = model.value_producer[v];
    for (int32_t t = first + 1; t <= value_reach[v]; ++t) {
      const int row = b.AddRow(-kInf, 0);
      b.Add(row, P(t, static_cast<int32_t>(v)), 1);
      b.Add(row, P(t - 1, static_cast<int32_t>(v)), -1);
      b.Add(row, R(t, first), -1);
    }
  }
  out.columns = static_cast<int>(b.obj.size());
  out.rows = static_cast<int>(b.row_lb.size());
  if (static_cast<int64_t>(out.columns) > limits.max_columns) {
    out.too_large = true;  // status kStopped
    out.seconds = Seconds(start);
    return out;
  }

  ClpSimplex lp;
  out.status = SolveLp(b, limits, lp);
  out.iterations = lp.numberIterations();
  out.seconds = Seconds(start);
  if (out.status != LpOutcome::Status::kOptimal) return out;
  out.objective = std::max(0.0, lp.objectiveValue()) * cost_scale;
  const double* x = lp.getColSolution();
  // Carry of op i from stage t to t + 1: the part of its values live at op
  // t + 1 not replayed in stage t + 1 (the largest over its values); an op
  // without counted outputs costs nothing to hold.
  for (size_t i = 0; i < n; ++i) {
    for (size_t t = i; t + 1 < n; ++t) {
      const int rc = R(static_cast<int32_t>(t + 1), static_cast<int32_t>(i));
      const double replayed = rc >= 0 ? x[rc] : 0.0;
      double carry = model.writes[i].empty() ? 1.0 : 0.0;
      for (int32_t v : model.writes[i]) {
        const int c = P(static_cast<int32_t>(t + 1), v);
        if (c == kOne) carry = std::max(carry, 1.0 - replayed);
        if (c >= 0) carry = std::max(carry, x[c] - replayed);
      }
      out.carry[i][t] = std::clamp(carry, 0.0, 1.0);
    }
  }
  return out;
}

}  // namespace headroom::remat

// Rematerialization on the Checkmate training graphs (../shared/data, or
// $HEADROOM_SHARED_DATA): the fast `optimal` strategy (PlanRemat) against
// Checkmate's MILP solved by CBC (SolveRematMilp) as the baseline in the same
// run, at 90/80/70% of each graph's store-all peak.
//
//   build/bench/remat_bench                                  # all cases
//   build/bench/remat_bench --benchmark_filter=mobilenet/80  # one graph and budget
//   HEADROOM_REMAT_MILP_SECONDS=600 build/bench/remat_bench  # a longer MILP limit
//
// Counters (costs in the graphs' own cost_cpu units):
//   extra         replay cost of the plan
//   overhead_pct  extra as % of the base (store-all) cost
//   lp_bound      the LP lower bound on extra (any schedule in program order)
//   gap_pct       (extra - lp_bound) / extra, %: how far from optimal it can be
//   milp_extra    the MILP's extra cost (its incumbent when it hit the limit)
//   vs_milp_pct   (extra - milp_extra) / milp_extra, % (fast only)
//   milp_optimal  1 when CBC proved optimality, 0 when it stopped at the limit
//   milp_bound    CBC's own bound (Checkmate's schedule space)
//   checkmate_lp  Checkmate's LP relaxation (MILP case; not a bound outside
//                 Checkmate's program-order stages)
//   min_budget_pct where no schedule fits: the smallest budget reachable
// The MILP case runs once (its time is the solve); the fast case three times.
#include <benchmark/benchmark.h>

#include <cstdlib>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_format.h"
#include "graph/liveness.h"
#include "models/node_link.h"
#include "planner/plan.h"
#include "planner/remat_lp.h"
#include "planner/remat_model.h"
#include "planner/remat_solver.h"

namespace headroom {
namespace {

std::string DataDir() {
  const char* env = std::getenv("HEADROOM_SHARED_DATA");
  return env != nullptr ? env : HEADROOM_SHARED_DATA_DIR;
}

double MilpSeconds() {
  const char* env = std::getenv("HEADROOM_REMAT_MILP_SECONDS");
  return env != nullptr ? std::atof(env) : 120.0;
}

struct Case {
  Graph graph;
  std::vector<double> cost;
  uint64_t store_all = 0;
  double base = 0;
};

// Loaded once per file; nullptr when the file is absent.
const Case* Load(const std::string& file) {
  static std::map<std::string, std::unique_ptr<Case>> cache;
  auto it = cache.find(file);
  if (it != cache.end()) return it->second.get();
  std::unique_ptr<Case>& c = cache[file];
  std::ifstream in(DataDir() + "/" + file);
  if (!in) return nullptr;
  std::stringstream text;
  text << in.rdbuf();
  absl::StatusOr<Graph> g = ImportNodeLink(text.str(), file);
  if (!g.ok()) return nullptr;
  c = std::make_unique<Case>();
  c->graph = *std::move(g);
  for (const Op& op : c->graph.ops()) {
    c->cost.push_back(op.measured_cost);
    c->base += op.measured_cost;
  }
  c->store_all = ProfileMemory(c->graph).peak_bytes;
  return c.get();
}

PlanProblem ProblemFor(const Case& c, double fraction) {
  return {.step = &c.graph, .op_cost = c.cost,
          .budget = static_cast<uint64_t>(fraction * static_cast<double>(c.store_all))};
}

// The MILP's result per (file, fraction), for the fast case's vs_milp_pct.
std::map<std::tuple<std::string, double>, absl::StatusOr<RematPlan>>& MilpResults() {
  static std::map<std::tuple<std::string, double>, absl::StatusOr<RematPlan>> results;
  return results;
}

const absl::StatusOr<RematPlan>& Milp(const std::string& file, double fraction) {
  auto& results = MilpResults();
  auto it = results.find({file, fraction});
  if (it == results.end()) {
    const Case* c = Load(file);
    it = results.emplace(std::make_tuple(file, fraction),
                         SolveRematMilp(ProblemFor(*c, fraction), {.milp_time_limit_s = MilpSeconds()}))
             .first;
  }
  return it->second;
}

// Where no schedule fits: the smallest budget reachable, as a counter.
void ReportOverBudget(benchmark::State& state, const Case& c, double fraction) {
  absl::StatusOr<ReachableBudget> r = SmallestReachableBudget(ProblemFor(c, fraction));
  state.counters["feasible"] = 0;
  if (r.ok()) {
    state.counters["min_budget_pct"] =
        100.0 * static_cast<double>(r->reached) / static_cast<double>(c.store_all);
  }
  state.SetLabel("no schedule in program order fits");
}

void SetPlanCounters(benchmark::State& state, const Case& c, const RematPlan& plan) {
  state.counters["feasible"] = 1;
  state.counters["extra"] = plan.evaluation.extra_cost;
  state.counters["overhead_pct"] = 100.0 * plan.evaluation.extra_cost / c.base;
  state.counters["lp_bound"] = plan.lower_bound;
  state.counters["gap_pct"] =
      plan.evaluation.extra_cost > 0 ? 100.0 * plan.gap() / plan.evaluation.extra_cost : 0.0;
  state.counters["peak_pct"] =
      100.0 * static_cast<double>(plan.evaluation.peak_bytes) / static_cast<double>(c.store_all);
}

void BM_RematMilp(benchmark::State& state, const std::string& file, double fraction) {
  const Case* c = Load(file);
  if (c == nullptr) {
    state.SkipWithError(("shared data not present: " + file).c_str());
    return;
  }
  // Checkmate's own relaxation, for comparison with our bound (not timed).
  absl::StatusOr<remat::Model> model = remat::BuildModel(ProblemFor(*c, fraction));
  absl::StatusOr<remat::LpOutcome> checkmate_lp =
      remat::SolveCheckmateLp(*model, ProblemFor(*c, fraction).budget, 600);
  for (auto _ : state) {
    MilpResults().erase({file, fraction});
    benchmark::DoNotOptimize(Milp(file, fraction).ok());
  }
  const absl::StatusOr<RematPlan>& milp = Milp(file, fraction);
  if (!milp.ok()) {
    if (milp.status().code() != absl::StatusCode::kResourceExhausted) {
      state.SkipWithError(std::string(milp.status().message()).c_str());
      return;
    }
    ReportOverBudget(state, *c, fraction);
    return;
  }
  SetPlanCounters(state, *c, *milp);
  state.counters["milp_optimal"] = milp->proven_optimal ? 1 : 0;
  state.counters["milp_bound"] = milp->milp_bound;
  if (checkmate_lp.ok() && checkmate_lp->status == remat::LpOutcome::Status::kOptimal) {
    state.counters["checkmate_lp"] = checkmate_lp->objective;
  }
  state.SetLabel(milp->proven_optimal ? "optimal"
                                      : absl::StrFormat("stopped at the %.0f s limit", MilpSeconds()));
}

void BM_RematFast(benchmark::State& state, const std::string& file, double fraction) {
  const Case* c = Load(file);
  if (c == nullptr) {
    state.SkipWithError(("shared data not present: " + file).c_str());
    return;
  }
  const PlanProblem problem = ProblemFor(*c, fraction);
  absl::StatusOr<RematPlan> plan;
  for (auto _ : state) {
    plan = PlanRemat(problem);
    benchmark::DoNotOptimize(plan.ok());
  }
  if (!plan.ok()) {
    if (plan.status().code() != absl::StatusCode::kResourceExhausted) {
      state.SkipWithError(std::string(plan.status().message()).c_str());
      return;
    }
    ReportOverBudget(state, *c, fraction);
    return;
  }
  SetPlanCounters(state, *c, *plan);
  const absl::StatusOr<RematPlan>& milp = Milp(file, fraction);  // the baseline, solved once
  if (milp.ok()) {
    state.counters["milp_extra"] = milp->evaluation.extra_cost;
    state.counters["milp_optimal"] = milp->proven_optimal ? 1 : 0;
    state.counters["vs_milp_pct"] =
        milp->evaluation.extra_cost > 0
            ? 100.0 * (plan->evaluation.extra_cost - milp->evaluation.extra_cost) / milp->evaluation.extra_cost
            : 0.0;
  }
}

void Register() {
  const std::pair<const char*, const char*> graphs[] = {
      {"vgg16", "checkmate_vgg16_b256_train.nx.json"},
      {"mobilenet", "checkmate_mobilenet_b512_train.nx.json"},
  };
  for (const auto& [name, file] : graphs) {
    for (int pct : {90, 80, 70}) {
      const double fraction = pct / 100.0;
      const std::string f = file;
      benchmark::RegisterBenchmark(absl::StrFormat("remat/%s/%d/milp", name, pct).c_str(),
                                   [f, fraction](benchmark::State& s) { BM_RematMilp(s, f, fraction); })
          ->Iterations(1)
          ->UseRealTime()
          ->Unit(benchmark::kSecond);
      benchmark::RegisterBenchmark(absl::StrFormat("remat/%s/%d/fast", name, pct).c_str(),
                                   [f, fraction](benchmark::State& s) { BM_RematFast(s, f, fraction); })
          ->Iterations(3)
          ->UseRealTime()
          ->Unit(benchmark::kMillisecond);
    }
  }
}

// Registered before benchmark_main's main() runs; the MILP case of each
// graph and budget comes first, so its result is there for the fast one.
const bool kRegistered = (Register(), true);

}  // namespace
}  // namespace headroom

// Note [Plan memo]
// One `headroom plan` asks for the same budget-independent search more than
// once: chen-greedy's sweep over thresholds (planner/chen.h) runs for
// hybrid's stand-ins (Note [Hybrid work]), for chen-greedy itself, for
// optimal's starts, and for each strategy's smallest peak when nothing fits:
// five sweeps of up to 26 evaluated schedules, about 3 s of a 50,001-op
// chain's failing plan (issue [13]). A PlanProblem may carry a memo that
// keeps them. Copies of a problem share it (the planner lowers budgets and
// takes micro-batches out of flight on copies), so an entry is kept with
// all it was computed from but the budget; the step itself only by its
// address and size, as the memo's owner keeps it fixed (PlanInput::memo,
// one per step). A problem without a memo recomputes.
#ifndef HEADROOM_PLANNER_PLAN_MEMO_H_
#define HEADROOM_PLANNER_PLAN_MEMO_H_

#include <cstddef>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include "graph/graph.h"
#include "graph/liveness.h"
#include "planner/plan.h"
#include "planner/schedule.h"

namespace headroom {

// One threshold's plan of chen-greedy's sweep, evaluated.
struct ThresholdPlan {
  Schedule schedule;
  PlanEvaluation evaluation;
};

class PlanMemo {
 public:
  // The sweep of `problem` with forward cuts at `cut_positions`, if kept.
  std::shared_ptr<const std::vector<ThresholdPlan>> FindChenSweep(const PlanProblem& problem,
                                                                  const std::vector<size_t>& cut_positions) const;
  void KeepChenSweep(const PlanProblem& problem, const std::vector<size_t>& cut_positions,
                     std::shared_ptr<const std::vector<ThresholdPlan>> plans);
  size_t chen_sweeps_kept() const;

 private:
  // What a sweep reads of its problem, but the budget.
  struct SweepKey {
    const Graph* step = nullptr;
    size_t ops = 0;
    size_t tensors = 0;
    std::vector<double> op_cost;
    std::vector<TensorRole> counted_roles;
    bool count_parameter_gradients = true;
    double copy_bytes_per_cost = 0;
    int in_flight = 1;
    PlanRunner runner = PlanRunner::kAnySchedule;
    std::vector<size_t> cut_positions;
    friend bool operator==(const SweepKey&, const SweepKey&) = default;
  };
  static SweepKey KeyOf(const PlanProblem& problem, const std::vector<size_t>& cut_positions);

  mutable std::mutex mu_;
  std::vector<std::pair<SweepKey, std::shared_ptr<const std::vector<ThresholdPlan>>>> chen_sweeps_;
};

}  // namespace headroom

#endif  // HEADROOM_PLANNER_PLAN_MEMO_H_

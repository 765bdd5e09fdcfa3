#include "planner/plan_memo.h"

#include <utility>

namespace headroom {

PlanMemo::SweepKey PlanMemo::KeyOf(const PlanProblem& problem, const std::vector<size_t>& cut_positions) {
  return {.step = problem.step,
          .ops = problem.step->num_ops(),
          .tensors = problem.step->num_tensors(),
          .op_cost = problem.op_cost,
          .counted_roles = problem.profile.counted_roles,
          .count_parameter_gradients = problem.profile.count_parameter_gradients,
          .copy_bytes_per_cost = problem.copy_bytes_per_cost,
          .in_flight = problem.in_flight,
          .runner = problem.runner,
          .cut_positions = cut_positions};
}

std::shared_ptr<const std::vector<ThresholdPlan>> PlanMemo::FindChenSweep(
    const PlanProblem& problem, const std::vector<size_t>& cut_positions) const {
  const SweepKey key = KeyOf(problem, cut_positions);
  std::lock_guard lock(mu_);
  for (const auto& [kept, plans] : chen_sweeps_) {
    if (kept == key) return plans;
  }
  return nullptr;
}

void PlanMemo::KeepChenSweep(const PlanProblem& problem, const std::vector<size_t>& cut_positions,
                             std::shared_ptr<const std::vector<ThresholdPlan>> plans) {
  SweepKey key = KeyOf(problem, cut_positions);
  std::lock_guard lock(mu_);
  chen_sweeps_.emplace_back(std::move(key), std::move(plans));
}

size_t PlanMemo::chen_sweeps_kept() const {
  std::lock_guard lock(mu_);
  return chen_sweeps_.size();
}

}  // namespace headroom

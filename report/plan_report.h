// What `headroom plan` prints: for one strategy, the plan's peak against the
// budget, its step time and overhead over store-all, host memory and what it
// replays; for --compare, one row per strategy. Text, or JSON with exact
// bytes and the schedule.
//
//   PlanReport report{.model = "gpt2", .input = &input, .budget = b, ...};
//   std::cout << PlanText(report);
#ifndef HEADROOM_REPORT_PLAN_REPORT_H_
#define HEADROOM_REPORT_PLAN_REPORT_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "estimators/plan_input.h"
#include "layout/arena_layout.h"
#include "nlohmann/json.hpp"
#include "planner/planner.h"

namespace headroom {

struct PlanReport {
  std::string model;
  std::string model_class;  // ArchitectureChoice (models/model_config.h): empty unless the class was resolved
  const PlanInput* input = nullptr;
  uint64_t budget = 0;
  std::string budget_source;  // how the budget was set, in words
  PlanEvaluation store_all;   // the baseline
  // One result, or every strategy's for --compare (errors become rows);
  // strategies[i] is the strategy of results[i].
  std::vector<Strategy> strategies;
  std::vector<absl::StatusOr<PlanResult>> results;
  // The single plan's activation arena laid out statically
  // (layout/arena_layout.h); absent for --compare.
  std::optional<ArenaLayout> arena;
  // The single plan replayed through the caching allocator after the fixed
  // state (Note [Plan budget] in estimators/plan_input.h); absent for --compare.
  std::optional<PlanReplay> replay;
};

std::string PlanText(const PlanReport& report);
nlohmann::json PlanJson(const PlanReport& report);

}  // namespace headroom

#endif  // HEADROOM_REPORT_PLAN_REPORT_H_

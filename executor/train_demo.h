// `headroom train-demo`: train a demo model for a few steps under a plan that
// a memory budget forces, beside the same steps without a plan, and report
// the loss, what the plan predicted against what the allocator measured, and
// the time the plan costs.
//
//   HEADROOM_ASSIGN_OR_RETURN(DemoModel gpt, BuildDemoGpt({}));
//   HEADROOM_ASSIGN_OR_RETURN(TrainDemoReport r, RunTrainDemo(gpt, {.steps = 20}));
//   std::cout << FormatTrainDemo(r);
#ifndef HEADROOM_EXECUTOR_TRAIN_DEMO_H_
#define HEADROOM_EXECUTOR_TRAIN_DEMO_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "executor/demo_models.h"
#include "executor/executor.h"
#include "nlohmann/json.hpp"
#include "planner/plan_json.h"
#include "planner/planner.h"

namespace headroom {

struct TrainDemoOptions {
  JobSpec job = DemoJob();
  Strategy strategy = Strategy::kHybrid;
  // The budget for planned tensors (as `headroom plan --budget`): bytes, or
  // this share of the store-all peak.
  std::optional<uint64_t> budget_bytes;
  double budget_fraction = 0.6;
  // A plan file to run instead of planning (`headroom plan --out` for the
  // model's graph JSON with the same job flags); `plan_source` names it.
  std::optional<PlanFile> plan_file;
  std::string plan_source;
  int steps = 20;
  ExecutorOptions executor;
};

// One run's memory as predicted (ReplayPlan, the plan's evaluation) and measured (the executor).
struct MemoryCheck {
  uint64_t requested_bytes = 0;
  uint64_t allocated_bytes = 0;
  uint64_t reserved_bytes = 0;
  uint64_t host_bytes = 0;
};

struct TrainDemoReport {
  std::string model;
  std::string description;  // layers, sizes, parameters
  std::string strategy;     // or the plan file's
  std::string plan_detail;
  uint64_t budget_bytes = 0;
  uint64_t store_all_peak_bytes = 0;  // planned tensors, unplanned
  uint64_t plan_peak_bytes = 0;       // planned tensors under the plan (predicted = measured)
  size_t replays = 0, offloads = 0;
  uint64_t resident_bytes = 0;
  MemoryCheck predicted, measured;
  double predicted_overhead = 0;  // the plan's step cost over store-all's, from the cost model
  std::vector<float> losses;
  std::vector<double> seconds;            // per step under the plan
  std::vector<double> store_all_seconds;  // per step without one
  bool losses_match_store_all = false;    // bitwise, step by step
};

// The CPU reference keeps a demo's device memory in host memory: a step
// whose store-all peak and resident state exceed this is refused.
inline constexpr uint64_t kMaxDemoStepBytes = uint64_t{4} << 30;

absl::StatusOr<TrainDemoReport> RunTrainDemo(const DemoModel& model, const TrainDemoOptions& options);

std::string FormatTrainDemo(const TrainDemoReport& report);
nlohmann::json TrainDemoJson(const TrainDemoReport& report);

}  // namespace headroom

#endif  // HEADROOM_EXECUTOR_TRAIN_DEMO_H_

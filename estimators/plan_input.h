// The plan problem of a job: the step the planner schedules, what each op
// costs, which bytes the plan's budget covers, and the budget a GPU leaves
// for them once the step's fixed state is placed.
//
//   HEADROOM_ASSIGN_OR_RETURN(PlanInput in, BuildPlanInput(model, job, machine));
//   PlanProblem problem = in.Problem(in.gpu_budget.value_or(budget));
//   absl::StatusOr<PlanResult> r = RunStrategy(problem, Strategy::kChenGreedy);
//
// Note [Plan budget]
// A model's step is built without checkpointing (the planner decides what to
// replay). The planned bytes are the ones the step's liveness counts: inputs,
// activations, their gradients, temporaries, and parameter gradients unless
// they are a resident buffer (Note [Gradients: resident or by liveness]).
// Everything else is fixed state, placed before the plan: resident model
// states (weights, buffers, master weights, resident gradients, optimizer
// state, gathered parameters, communication buffers, fp8 caches), the CUDA
// context and cuBLAS workspaces, as the estimators compute them. With a GPU,
// the budget is (capacity - fixed state) / (1 + the job's fragmentation
// fraction), so the plan leaves the allocator the same headroom the
// estimate allows. A node-link or whole-step graph file is its own step: all
// of its bytes are planned, its fixed state is zero, and op costs are its
// measured costs when it has them.
// Op costs are roofline seconds on the job's GPU (hardware/cost_model.h), or
// on the H100-80GB when only a byte budget names none; copies move at the
// GPU's host-link bandwidth times the cost model's efficiency.
#ifndef HEADROOM_ESTIMATORS_PLAN_INPUT_H_
#define HEADROOM_ESTIMATORS_PLAN_INPUT_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "graph/graph.h"
#include "graph/liveness.h"
#include "job/job_spec.h"
#include "models/model_source.h"
#include "planner/plan.h"

namespace headroom {

// The fixed state by what it is, for reports and the memory timeline.
struct FixedState {
  uint64_t weights = 0;          // weights, buffers, gathered parameters, fp8 caches
  uint64_t gradients = 0;        // resident gradient buffers
  uint64_t optimizer_state = 0;  // moments, master weights, an EMA copy (--ema gpu)
  uint64_t other = 0;            // CUDA context, cuBLAS workspaces, communication buffers
  uint64_t total() const { return weights + gradients + optimizer_state + other; }
};

struct PlanInput {
  Graph step;
  std::vector<double> op_cost;
  std::string cost_unit;          // "s" or "units" (a graph's measured costs)
  std::string cost_source;        // "roofline on H100-80GB", "measured cost_cpu"
  ProfileOptions profile;
  FixedState fixed;
  double copy_bytes_per_cost = 0; // 0 when costs are not seconds
  uint64_t capacity = 0;          // the machine's bytes
  std::optional<uint64_t> gpu_budget;  // Note [Plan budget]; unset when fixed state fills the GPU
  double fragmentation_fraction = 0;
  // States this rank keeps in host memory (--offload, --ema cpu), beside any
  // activations a plan offloads.
  uint64_t host_bytes = 0;
  // With --pp: the stage `step` is (Note [Pipeline stage step] in the .cc)
  // and the micro-batches it holds at once (PlanProblem::in_flight).
  int pipeline_stage = 0;
  int in_flight = 1;

  // The problem for `budget` bytes of planned tensors; points into `step`.
  PlanProblem Problem(uint64_t budget) const;
};

// Errors name the flag or file at fault: an inference job (nothing to
// replay), --checkpoint (the planner decides), a graph file holding only a
// forward pass without a loss, or --pp on a graph file with its own backward
// or with fewer layers than stages.
absl::StatusOr<PlanInput> BuildPlanInput(const LoadedModel& model, const JobSpec& job, const Machine& machine);

}  // namespace headroom

#endif  // HEADROOM_ESTIMATORS_PLAN_INPUT_H_

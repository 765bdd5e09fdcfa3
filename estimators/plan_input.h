// The plan problem of a job: the step the planner schedules, what each op
// costs, which bytes the plan's budget covers, and the budget a GPU leaves
// for them once the step's fixed state is placed.
//
//   HEADROOM_ASSIGN_OR_RETURN(PlanInput in, BuildPlanInput(model, job, machine));
//   PlanProblem problem = in.Problem(in.gpu_budget.value_or(budget));
//   absl::StatusOr<PlanResult> r = RunStrategy(problem, Strategy::kChenGreedy);
//   HEADROOM_ASSIGN_OR_RETURN(Graph scheduled, MaterializeSchedule(in.step, r->schedule));
//   HEADROOM_ASSIGN_OR_RETURN(PlanReplay replay, ReplayPlan(in, scheduled));   // what nvidia-smi would show
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
// gpu_budget is capacity - fixed state: the most the planned tensors may
// request. The caching allocator needs more than the bytes requested (its
// rounding and its cache of unused blocks, Note [Allocator rounding and
// cache]), which depends on the plan, so `headroom plan --gpu` lowers the
// budget until the plan fits as the allocator serves it
// (BudgetThatReplaysWithinTheGpu): it plans for
// gpu_budget, replays the plan through the allocator after the fixed state
// with the job's --alloc-conf (ReplayPlan; estimators/step_replay.h, Note
// [Allocator replay]), asks for a plan whose peak is lower by what the
// replay's reserved peak plus the CUDA context overflows the GPU by, and
// plans again, for a few rounds at most (with --compare and --load, the default strategy's plans
// set the budget). The plan it reports is replayed too, and its reserved
// peak plus the CUDA context (what nvidia-smi would show) is reported
// against the GPU's memory, so a plan that still overflows says so rather
// than being called a fit. A node-link or whole-step graph file is its own step: all
// of its bytes are planned, its fixed state is zero, and op costs are its
// measured costs when it has them.
// Op costs are roofline seconds on the job's GPU (hardware/cost_model.h), or
// on the H100-80GB when only a byte budget names none; copies move at the
// GPU's host-link bandwidth times the cost model's efficiency.
#ifndef HEADROOM_ESTIMATORS_PLAN_INPUT_H_
#define HEADROOM_ESTIMATORS_PLAN_INPUT_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "allocator/allocator_options.h"
#include "estimators/step_replay.h"
#include "replay/allocation_trace.h"
#include "graph/graph.h"
#include "graph/liveness.h"
#include "job/parallel_layout.h"
#include "job/job_spec.h"
#include "models/model_source.h"
#include "planner/plan.h"
#include "planner/plan_memo.h"
#include "planner/planner.h"

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
  // What ReplayPlan replays besides a schedule (Note [Allocator replay]):
  // the fixed state as blocks, the optimizer's temporaries, whether
  // autocast's copies are weights, and the job's allocator configuration;
  // and the CUDA context, which the allocator does not hold.
  std::vector<ResidentBlock> resident;
  OptimizerTemporaries optimizer_temporaries;
  bool autocast = false;
  AllocatorOptions allocator;
  uint64_t cuda_context = 0;
  // States this rank keeps in host memory (--offload, --ema cpu), beside any
  // activations a plan offloads.
  uint64_t host_bytes = 0;
  // With --pp: the stage `step` is (Note [Pipeline stage step] in the .cc)
  // and the micro-batches it holds at once (PlanProblem::in_flight).
  int pipeline_stage = 0;
  bool pipeline_stage_asked = false;  // --pp-stage named it (else the estimate's fullest)
  PipelineSchedule pipeline_schedule = PipelineSchedule::k1F1B;
  int in_flight = 1;
  PlanRunner runner = PlanRunner::kAnySchedule;  // who carries the plan out (Note [Plan runners])
  // Searches the problems of `step` share (Note [Plan memo]).
  std::shared_ptr<PlanMemo> memo = std::make_shared<PlanMemo>();

  // The problem for `budget` bytes of planned tensors; points into `step`.
  PlanProblem Problem(uint64_t budget) const;
};

// Errors name the flag or file at fault: an inference job (nothing to
// replay), --checkpoint (the planner decides), a graph file holding only a
// forward pass without a loss, or --pp on a graph file with its own backward
// or with fewer layers than stages.
absl::StatusOr<PlanInput> BuildPlanInput(const LoadedModel& model, const JobSpec& job, const Machine& machine);

// A plan's step (`scheduled`, MaterializeSchedule of a schedule over
// in.step) replayed through the caching allocator after the fixed state
// (Note [Plan budget]).
struct PlanReplay {
  uint64_t requested_bytes = 0;  // the sequence's peak: fixed state (no CUDA context) and planned tensors
  AllocatorReplay allocator;
  uint64_t cuda_context = 0;
  // What the allocator reserves beyond the bytes requested: its rounding and cache.
  uint64_t overhead_bytes() const { return allocator.peak_reserved_bytes - requested_bytes; }
  // What nvidia-smi would show.
  uint64_t total_bytes() const { return allocator.peak_reserved_bytes + cuda_context; }
};
// `sequence`, when given, receives the allocation sequence replayed (what
// `headroom plan --trace-out` writes): the resident state, then the plan's
// tensors and the optimizer's temporaries.
absl::StatusOr<PlanReplay> ReplayPlan(const PlanInput& in, const Graph& scheduled,
                                      AllocationTrace* sequence = nullptr);

// The loop of Note [Plan budget]: from in.gpu_budget down, the budget for
// which the plan `strategy` makes, replayed through the allocator with the
// fixed state, fits the GPU: each round asks for a plan whose peak is lower than
// the last one's by what its replay overflowed the GPU by. Stops after a few
// rounds, and where no plan fits the budget (planning then says so); 0 when
// the overflow takes all of it. A FailedPrecondition error when
// in.gpu_budget is unset (the fixed state fills the GPU: the caller says so
// in its own words).
absl::StatusOr<uint64_t> BudgetThatReplaysWithinTheGpu(const PlanInput& in, Strategy strategy);

}  // namespace headroom

#endif  // HEADROOM_ESTIMATORS_PLAN_INPUT_H_

#include "estimators/plan_input.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/strings/str_format.h"
#include "common/status_macros.h"
#include "estimators/estimate_stages.h"
#include "estimators/memory_estimate.h"
#include "estimators/model_states.h"
#include "hardware/cost_model.h"
#include "hardware/gpu_catalog.h"
#include "planner/planner.h"
#include "planner/schedule.h"

namespace headroom {
namespace {

// The GPU whose roofline prices ops when only a byte budget was given.
constexpr std::string_view kReferenceGpu = "H100-80GB";

}  // namespace

PlanProblem PlanInput::Problem(uint64_t budget) const {
  return {.step = &step, .op_cost = op_cost, .cost_unit = cost_unit, .profile = profile, .budget = budget,
          .copy_bytes_per_cost = copy_bytes_per_cost, .in_flight = in_flight, .runner = runner, .memo = memo};
}

absl::StatusOr<PlanInput> BuildPlanInput(const LoadedModel& model, const JobSpec& job, const Machine& machine) {
  HEADROOM_RETURN_IF_ERROR(ValidateJob(job));
  if (!job.training) {
    return absl::InvalidArgumentError(
        "--inference: an inference step keeps nothing for backward, so there is nothing to plan");
  }
  if (job.checkpoint != CheckpointMode::kOff) {
    return absl::InvalidArgumentError(
        "--checkpoint: the planner chooses what to replay; drop --checkpoint (compare its modes with --compare)");
  }
  HEADROOM_RETURN_IF_ERROR(CheckJobAgainstModel(model, job));
  const JobSpec& unplanned = job;  // no checkpoint mode: the planner decides what to replay
  const EstimateSetup setup = ResolveSetup(model, unplanned);
  HEADROOM_ASSIGN_OR_RETURN(Graph forward, BuildForwardGraph(model, unplanned, setup));

  PlanInput in;
  in.capacity = machine.capacity();
  in.allocator = job.allocator;
  const bool whole_step = IsWholeStep(model, forward);
  const int stages = job.layout.pipeline_parallel;
  if (whole_step && stages > 1) {
    return absl::InvalidArgumentError(
        "--pp: a graph file with its own backward, or a node-link graph, cannot be cut into pipeline stages");
  }
  if (whole_step) {
    in.step = std::move(forward);
    in.profile = {};
  } else {
    HEADROOM_ASSIGN_OR_RETURN(in.step, BuildStep(forward, unplanned, setup));
    in.profile.count_parameter_gradients = !setup.persistent_gradients;
    // Under --pp without --pp-stage, the stage the estimate's replays find fullest (Note [Pipeline 1F1B]).
    int stage = std::max(0, job.layout.pipeline_stage);
    if (stages > 1 && job.layout.pipeline_stage < 0) {
      HEADROOM_ASSIGN_OR_RETURN(const MemoryEstimate estimate, EstimateMemory(model, unplanned, machine));
      stage = estimate.pipeline_stage;
    }
    HEADROOM_ASSIGN_OR_RETURN(const ModelStates s, StageModelStates(forward, unplanned, setup, stage));
    in.fixed.weights = s.weights + s.buffers + s.gathered_parameters + s.fp8_weight_cache;
    in.fixed.gradients = setup.persistent_gradients ? s.gradients : 0;
    in.fixed.optimizer_state = s.optimizer_state + s.master_weights + s.ema_weights;
    in.host_bytes = s.host_bytes;
    Graph stage_forward;
    if (stages > 1) {
      HEADROOM_ASSIGN_OR_RETURN(stage_forward, PipelineStageForward(forward, stage, stages));
      HEADROOM_ASSIGN_OR_RETURN(in.step, BuildStep(stage_forward, unplanned, setup));
      in.pipeline_stage = stage;
      in.pipeline_stage_asked = job.layout.pipeline_stage >= 0;
      in.pipeline_schedule = job.layout.pipeline_schedule;
      in.in_flight = job.layout.MicroBatchesInFlight(stage, job.grad_accum);
    }
    const Overheads overheads = EstimateJobOverheads(machine, unplanned);
    in.fixed.other = overheads.cuda_context + overheads.cublas_workspace + s.communication_buffers;
    in.cuda_context = overheads.cuda_context;
    const Graph& held = stages > 1 ? stage_forward : forward;
    in.resident = ResidentBlocks(held, s, unplanned, setup,
                                 {.cublas_workspace = machine.gpu != nullptr ? machine.gpu->cublas_workspace_bytes : 0,
                                  .streams = job.overheads.streams,
                                  .cublas_handles = CublasHandles(unplanned)});
    in.optimizer_temporaries = OptimizerStepTemporaries(held, unplanned, setup);
    in.autocast = setup.autocast;
  }

  bool measured = false;
  for (const Op& op : in.step.ops()) measured = measured || op.measured_cost > 0;
  const GpuSpec* gpu = machine.gpu;
  if (gpu == nullptr) {
    HEADROOM_ASSIGN_OR_RETURN(gpu, GpuCatalog::Builtin().Find(kReferenceGpu));
  }
  in.op_cost.reserve(in.step.num_ops());
  if (measured) {
    for (const Op& op : in.step.ops()) in.op_cost.push_back(op.measured_cost);
    in.cost_unit = "units";
    in.cost_source = "the graph's measured costs";
  } else {
    const CostModelOptions cost{.allow_tf32 = setup.precision.allow_tf32};
    for (const Op& op : in.step.ops()) in.op_cost.push_back(EstimateOpTime(op, *gpu, cost).seconds);
    in.cost_unit = "s";
    in.cost_source = absl::StrFormat("roofline on %s", gpu->name);
    // With CPU kernels the device memory is host memory: there is nowhere to
    // offload to, unless host memory is kept apart (TorchRuntime::emulated_host).
    if (job.runtime.kernels == Kernels::kCuda || job.runtime.emulated_host) {
      in.copy_bytes_per_cost = gpu->host_link.bandwidth_bytes_per_s * cost.host_link_efficiency;
    }
  }

  if (in.capacity > in.fixed.total()) in.gpu_budget = in.capacity - in.fixed.total();
  return in;
}

absl::StatusOr<PlanReplay> ReplayPlan(const PlanInput& in, const Graph& scheduled, AllocationTrace* sequence) {
  HEADROOM_ASSIGN_OR_RETURN(
      StepAllocations steps,
      BuildStepAllocations(scheduled, in.resident,
                           {.profile = in.profile,
                            .autocast = in.autocast,
                            .in_flight = in.in_flight,
                            .optimizer_temporaries = in.optimizer_temporaries}));
  PlanReplay out{.requested_bytes = steps.peak_bytes, .cuda_context = in.cuda_context};
  const uint64_t device_bytes = in.capacity > in.cuda_context ? in.capacity - in.cuda_context : 0;
  HEADROOM_ASSIGN_OR_RETURN(out.allocator, ReplayAllocations(steps, in.allocator, device_bytes));
  if (sequence != nullptr) *sequence = std::move(steps.trace);
  return out;
}

absl::StatusOr<uint64_t> BudgetThatReplaysWithinTheGpu(const PlanInput& in, Strategy strategy) {
  if (!in.gpu_budget) {
    return absl::FailedPreconditionError("the step's fixed state fills the GPU: no budget is left to lower");
  }
  constexpr int kRounds = 8;
  uint64_t budget = *in.gpu_budget;
  for (int round = 0; round < kRounds; ++round) {
    absl::StatusOr<PlanResult> plan = RunStrategy(in.Problem(budget), strategy);
    if (!plan.ok()) {
      if (plan.status().code() == absl::StatusCode::kResourceExhausted) return budget;
      return plan.status();
    }
    HEADROOM_ASSIGN_OR_RETURN(const Graph scheduled, MaterializeSchedule(in.step, plan->schedule));
    HEADROOM_ASSIGN_OR_RETURN(const PlanReplay replay, ReplayPlan(in, scheduled));
    if (replay.total_bytes() <= in.capacity && !replay.allocator.out_of_memory) return budget;
    const uint64_t over = replay.total_bytes() > in.capacity ? replay.total_bytes() - in.capacity : 1;
    const uint64_t peak = std::min(budget, plan->evaluation.peak_bytes);
    if (over >= peak) return 0;
    budget = peak - over;
  }
  return budget;
}

}  // namespace headroom

#include "estimators/plan_input.h"

#include <algorithm>
#include <functional>
#include <utility>
#include <vector>

#include "absl/strings/str_format.h"
#include "common/status_macros.h"
#include "estimators/estimate_stages.h"
#include "estimators/model_states.h"
#include "hardware/cost_model.h"
#include "hardware/gpu_catalog.h"

namespace headroom {
namespace {

// The GPU whose roofline prices ops when only a byte budget was given.
constexpr std::string_view kReferenceGpu = "H100-80GB";

// Note [Pipeline stage step]
// With --pp P the planner plans the stage the estimator finds fullest
// (FindWorstPipelineStage), as that GPU runs it:
//  - its ops are those of its layers (PipelineStageOf), plus, on the first
//    stage, the ops before the first layer (embeddings, masks) and, on the
//    last, those after the last layer (final norm, head, loss);
//  - a tensor it reads that another stage made arrives from it: an input of
//    the stage (so, like the batch, live throughout; the gradient sent back
//    for it is not modelled), and so is a constant made once on the first
//    stage (a causal mask, rotary tables), which each stage makes itself;
//  - a stage before the last ends in a stand-in loss ("pipeline.send", a sum
//    over its outputs that later stages read), whose backward allocates the
//    gradient the next stage sends back, the size of those outputs;
//  - layers are renumbered from 0, so layer-wise strategies see the stage's
//    own stack; op names (module paths) stay.
// The micro-batches in flight (1F1B: min(P - stage, --grad-accum)) are
// PlanProblem::in_flight (Note [Pipeline in-flight] in planner/plan.h).
absl::StatusOr<Graph> PipelineStageForward(const Graph& forward, int stage, int stages) {
  int num_layers = 0;
  OpId first_block_op = kNone;
  for (const Op& op : forward.ops()) {
    num_layers = std::max(num_layers, op.layer + 1);
    if (op.layer >= 0 && first_block_op == kNone) first_block_op = op.id;
  }
  if (num_layers < stages) {
    return absl::InvalidArgumentError(
        absl::StrFormat("--pp: %d pipeline stages for %d layers; a stage needs a layer", stages, num_layers));
  }
  auto stage_of = [&](const Op& op) {
    return PipelineStageOf(op.layer, first_block_op == kNone || op.id < first_block_op, num_layers, stages);
  };
  int first_layer = num_layers;
  for (const Op& op : forward.ops()) {
    if (op.layer >= 0 && stage_of(op) == stage) first_layer = std::min(first_layer, op.layer);
  }
  Graph out(absl::StrFormat("%s (pipeline stage %d of %d)", forward.name(), stage, stages));
  std::vector<TensorId> mapped(forward.num_tensors(), kNone);
  std::vector<bool> made_here(forward.num_tensors(), false);
  for (const Op& op : forward.ops()) {
    if (stage_of(op) != stage) continue;
    for (TensorId t : op.outputs) made_here[static_cast<size_t>(t)] = true;
  }
  auto renumber = [&](int layer) { return layer >= 0 ? layer - first_layer : layer; };
  std::function<TensorId(TensorId)> map = [&](TensorId id) {
    if (mapped[static_cast<size_t>(id)] != kNone) return mapped[static_cast<size_t>(id)];
    Tensor t = forward.tensor(id);
    t.layer = renumber(t.layer);
    if (!made_here[static_cast<size_t>(id)] && forward.producer(id) != kNone) {
      // Made by another stage: it arrives as an input, whole.
      if (t.view_of != kNone) {  // the base arrives, not the view
        t.shape = forward.tensor(t.view_of).shape;
        t.dtype = forward.tensor(t.view_of).dtype;
      }
      t.view_of = kNone;
      t.role = TensorRole::kInput;
    } else if (t.view_of != kNone) {
      t.view_of = map(t.view_of);
    }
    const TensorId added = out.AddTensor(std::move(t));
    mapped[static_cast<size_t>(id)] = added;
    return added;
  };
  std::vector<TensorId> sent;  // outputs of layer ops that a later stage reads
  for (const Op& op : forward.ops()) {
    const int s = stage_of(op);
    if (s > stage) {
      for (TensorId in : op.inputs) {
        const OpId p = forward.producer(in);
        if (p != kNone && stage_of(forward.op(p)) == stage && forward.op(p).layer >= 0 &&
            std::find(sent.begin(), sent.end(), in) == sent.end()) {
          sent.push_back(in);
        }
      }
      continue;
    }
    if (s != stage) continue;
    Op copy = op;
    for (TensorId& t : copy.inputs) t = map(t);
    for (TensorId& t : copy.outputs) t = map(t);
    for (TensorId& t : copy.saved) t = map(t);
    copy.layer = renumber(copy.layer);
    out.AddOp(std::move(copy));
  }
  if (stage < stages - 1) {
    if (sent.empty()) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "--pp: stage %d of '%s' sends nothing to the next stage; its layers do not form a pipeline", stage,
          forward.name()));
    }
    Op send{.kind = "sum", .name = "pipeline.send", .phase = Phase::kLoss};
    for (TensorId t : sent) send.inputs.push_back(mapped[static_cast<size_t>(t)]);
    send.outputs.push_back(out.AddTensor({.name = "pipeline.send.out", .shape = {}, .dtype = DType::kF32}));
    out.AddOp(std::move(send));
  }
  return out;
}

}  // namespace

PlanProblem PlanInput::Problem(uint64_t budget) const {
  return {.step = &step, .op_cost = op_cost, .cost_unit = cost_unit, .profile = profile, .budget = budget,
          .copy_bytes_per_cost = copy_bytes_per_cost, .in_flight = in_flight};
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
  in.fragmentation_fraction = job.overheads.fragmentation_fraction;
  const bool whole_step = model.graph && HasBackward(forward);
  const int stages = job.layout.pipeline_parallel;
  if (whole_step && stages > 1) {
    return absl::InvalidArgumentError("--pp: a graph file with its own backward cannot be cut into pipeline stages");
  }
  if (whole_step) {
    in.step = std::move(forward);
    in.profile = {};
  } else {
    HEADROOM_ASSIGN_OR_RETURN(in.step, BuildStep(forward, unplanned, setup));
    in.profile.count_parameter_gradients = !setup.persistent_gradients;
    const PeakAttribution peak = AttributePeak(in.step, setup);
    HEADROOM_ASSIGN_OR_RETURN(const WorstStage stage, FindWorstPipelineStage(forward, peak, unplanned, setup));
    const ModelStates& s = stage.states;
    in.fixed.weights = s.weights + s.buffers + s.gathered_parameters + s.fp8_weight_cache;
    in.fixed.gradients = setup.persistent_gradients ? s.gradients : 0;
    in.fixed.optimizer_state = s.optimizer_state + s.master_weights + s.ema_weights;
    in.host_bytes = s.host_bytes;
    if (stages > 1) {
      HEADROOM_ASSIGN_OR_RETURN(const Graph stage_forward, PipelineStageForward(forward, stage.stage, stages));
      HEADROOM_ASSIGN_OR_RETURN(in.step, BuildStep(stage_forward, unplanned, setup));
      in.pipeline_stage = stage.stage;
      in.in_flight = static_cast<int>(std::min<int64_t>(stages - stage.stage, job.grad_accum));
    }
    const Overheads overheads = EstimateJobOverheads(machine, unplanned, 0, 0);
    in.fixed.other = overheads.cuda_context + overheads.cublas_workspace + s.communication_buffers;
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
    in.copy_bytes_per_cost = gpu->host_link.bandwidth_bytes_per_s * cost.host_link_efficiency;
  }

  if (in.capacity > in.fixed.total()) {
    in.gpu_budget = static_cast<uint64_t>(static_cast<double>(in.capacity - in.fixed.total()) /
                                          (1 + in.fragmentation_fraction));
  }
  return in;
}

}  // namespace headroom

// The stages of one memory estimate, in the order EstimateMemory
// (estimators/memory_estimate.h) runs them. Each is a function of its inputs
// only, so a planner that tries many candidate plans for one job can rerun
// just the stages a candidate changes:
//
//   HEADROOM_RETURN_IF_ERROR(CheckJobAgainstModel(model, job));
//   const EstimateSetup setup = ResolveSetup(model, job);
//   HEADROOM_ASSIGN_OR_RETURN(Graph forward, BuildForwardGraph(model, job, setup));
//   HEADROOM_ASSIGN_OR_RETURN(Graph step, BuildStep(forward, job, setup));      // or the fixed graph
//   const PeakAttribution peak = AttributePeak(step, setup);
//   HEADROOM_ASSIGN_OR_RETURN(ModelStates states, StageModelStates(forward, job, setup, stage));
//   OptimizerTemporaries temporaries = OptimizerStepTemporaries(forward, job, setup);
//   Overheads overheads = EstimateJobOverheads(machine, job);
//   ... the allocator replay of the step (estimators/step_replay.h) ...
//   StepSeconds time = EstimateJobStepTime(step, machine, job, setup);
//
// Invariant: every byte count a stage returns is below 2^62 (graph/graph.h,
// Note [Size bounds]; models/model_config.h, Note [Model size bounds]), so
// the few sums EstimateMemory forms from them are checked once, at the end
// (Note [Checked totals] in memory_estimate.cc).
#ifndef HEADROOM_ESTIMATORS_ESTIMATE_STAGES_H_
#define HEADROOM_ESTIMATORS_ESTIMATE_STAGES_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "estimators/model_states.h"
#include "estimators/overheads.h"
#include "graph/graph.h"
#include "graph/liveness.h"
#include "job/job_spec.h"
#include "models/model_source.h"

namespace headroom {

// Note [Which framework a setup means] in memory_estimate.h.
enum class Framework { kAutocast, kPytorch, kDeepSpeed, kFsdp, kMegatron };
std::string_view FrameworkName(Framework framework);  // "pytorch-autocast", "deepspeed", ...

// What a job means before any graph is built.
struct EstimateSetup {
  Framework framework = Framework::kPytorch;
  // The job's precision; under autocast the weights are the fp32 masters.
  PrecisionSetup precision;
  bool autocast = false;
  // Note [Gradients: resident or by liveness] in memory_estimate.h.
  bool persistent_gradients = false;
  // Whether the gradients exist before the step starts (zero_grad(set_to_none=False), or a framework's own
  // gradient buffers); without, a step with accumulation makes them in its first micro-batch's backward.
  bool gradients_outlive_step = false;
  int64_t seq_len = 0;  // ResolveSeqLen; 0 for models without sequences
};

EstimateSetup ResolveSetup(const LoadedModel& model, const JobSpec& job);

// The checks of a job that need the model (the job's own field ranges are
// ValidateJob's, job/job_spec.h): pipeline stages at most the model's layers, experts divisible
// by the expert-parallel degree, and the products of batch, sequence and the
// model's widths within the bounds of graph/graph.h Note [Size bounds]
// (InvalidArgument for a layout the model cannot take, OutOfRange for a size
// beyond a bound; both name the flags and config fields at fault).
absl::Status CheckJobAgainstModel(const LoadedModel& model, const JobSpec& job);

// The forward graph of one micro-batch on one tensor-parallel shard (a copy
// of the model's graph for graph files).
absl::StatusOr<Graph> BuildForwardGraph(const LoadedModel& model, const JobSpec& job,
                                        const EstimateSetup& setup);

// Whether `graph` already holds a backward pass (a graph file of a whole step).
bool HasBackward(const Graph& graph);
// Whether `forward`, the graph `model` gives, is taken as a whole step rather
// than a forward pass to build a training step from: a graph file with its own
// backward, or any node-link graph (Note [Node-link graphs without backward]
// in models/node_link.h).
bool IsWholeStep(const LoadedModel& model, const Graph& forward);

// The training (or inference) step derived from `forward`: the job's
// checkpoint mode, gradient accumulation and optimizer, by BuildTrainingStep.
absl::StatusOr<Graph> BuildStep(const Graph& forward, const JobSpec& job, const EstimateSetup& setup);

// The step's dynamic bytes at its peak op, by the role the report shows them under.
struct PeakAttribution {
  MemoryProfile profile;
  uint64_t activations = 0;  // activations and inputs, autocast copies taken out
  uint64_t parameter_gradients = 0;
  uint64_t activation_gradients = 0;
  uint64_t temporaries = 0;
  uint64_t autocast_copies = 0;  // autocast's 16-bit weight copies (reported as weights)
};
PeakAttribution AttributePeak(const Graph& step, const EstimateSetup& setup);

// The model states pipeline stage `stage` of `forward` (the whole model's graph) holds; the whole model's
// without --pp.
absl::StatusOr<ModelStates> StageModelStates(const Graph& forward, const JobSpec& job, const EstimateSetup& setup,
                                             int stage);

// The forward graph of pipeline stage `stage` of `stages` as its GPU runs it
// (Note [Pipeline stage step] in the .cc): what the planner plans and the
// allocator replay replays under --pp. InvalidArgument (naming --pp) when
// the graph has fewer layers than stages or a stage sends nothing on.
absl::StatusOr<Graph> PipelineStageForward(const Graph& forward, int stage, int stages);

// Note [Optimizer step transients] (job/optimizer.h): the temporaries the
// optimizer step allocates, one per trainable parameter of `forward` (the
// parameters this GPU updates), in the state dtype and divided over the
// ZeRO/FSDP shard group; none for fused kernels, SGD without momentum,
// DeepSpeed (its own fused or CPU Adam) and an offloaded optimizer. The
// allocator replay allocates them while every gradient is live
// (estimators/step_replay.h, Note [Allocator replay]), so the step's peak is
// the larger of the forward/backward peak and the optimizer step.
struct OptimizerTemporaries {
  std::vector<uint64_t> bytes;  // per parameter
  bool together = true;  // foreach: all live at once; the for-loop: one parameter at a time
  // Each parameter's bytes are this many tensors of equal size (sqrt(v) and its quotient, separate blocks).
  int tensors = 1;
};
OptimizerTemporaries OptimizerStepTemporaries(const Graph& forward, const JobSpec& job, const EstimateSetup& setup);

// CUDA context and cuBLAS workspaces (Note [CUDA context]); the allocator's
// rounding and cache come from the replay.
Overheads EstimateJobOverheads(const Machine& machine, const JobSpec& job);
// The cuBLAS handles a step holds a workspace for on each stream: 2 in training (the Python thread's and the
// autograd engine's), 1 in inference (Note [cuBLAS handle per thread] in estimators/step_replay.h).
inline int CublasHandles(const JobSpec& job) { return job.training ? 2 : 1; }

// Roofline time of one optimizer step (all micro-batches through 1F1B); zeros without a GPU.
struct StepSeconds {
  double step = 0;
  double recompute = 0;
};
StepSeconds EstimateJobStepTime(const Graph& step, const Machine& machine, const JobSpec& job,
                                const EstimateSetup& setup);

}  // namespace headroom

#endif  // HEADROOM_ESTIMATORS_ESTIMATE_STAGES_H_

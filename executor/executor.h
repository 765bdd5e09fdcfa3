// Runs a plan for real: a training step of a demo model (executor/demo_models.h)
// under a schedule from the planner, with every device byte from the caching
// allocator and every offloaded tensor in the host pool, so that what the
// planner and `headroom plan` predict can be checked against what happened.
//
//   HEADROOM_ASSIGN_OR_RETURN(PlanInput in, BuildPlanInput(loaded, job, machine));
//   HEADROOM_ASSIGN_OR_RETURN(PlanResult plan, RunStrategy(in.Problem(budget), Strategy::kHybrid));
//   HEADROOM_ASSIGN_OR_RETURN(auto executor, PlanExecutor::Create(model, in, plan.schedule, {}));
//   HEADROOM_ASSIGN_OR_RETURN(StepResult r, executor->RunStep(model.MakeBatch(0)));
//   r.loss; r.peak_requested_bytes == ReplayPlan(in, scheduled)->requested_bytes
//
// The statistics are the run's so far. ReplayPlan's sequence covers the
// first steps until the allocator's cache settles, so its peaks are those of
// a run of kStepsUntilSettled steps.
//
// Compute runs on a ComputeDevice (executor/compute_device.h): by default the
// CPU reference (executor/cpu_kernels.h) over a simulated device whose memory
// is host memory, so the whole path runs on any machine; on a GPU, cuBLAS
// (executor/cuda/).
//
// Note [Executor allocation order]
// The executor allocates what ReplayPlan replays (estimators/step_replay.h,
// Note [Allocator replay]), in the same order, so that a prediction and a
// run can be compared byte for byte: the resident blocks once, before the
// first step (weights one per parameter in TensorId order, the rest held
// unused), except the SGD momentum buffers, which the first step creates at
// its first optimizer op as torch.optim does (Note [The first step in the
// replay]), in the same order; then each step walks the
// materialized schedule, allocating every counted tensor right before its
// first op and freeing it right after its last (Note [Plan trace order] in
// replay/graph_trace.h). Offloads copy into the host pool at their entry
// and prefetches copy back into the fresh device tensor, on a copy stream
// (Note [Executor copies] in the .cc); a host copy is freed after its
// tensor's last prefetch. Every op reads the latest copy of each value, as
// the schedule's semantics say (Note [Schedule semantics] in
// planner/schedule.h), so the gradients do not depend on the plan.
//
// The optimizer is SGD with momentum (the job's --optimizer sgd-momentum),
// which updates in place and has no temporaries. fp32 only.
#ifndef HEADROOM_EXECUTOR_EXECUTOR_H_
#define HEADROOM_EXECUTOR_EXECUTOR_H_

#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "absl/status/statusor.h"
#include "allocator/caching_allocator.h"
#include "estimators/plan_input.h"
#include "executor/compute_device.h"
#include "executor/demo_models.h"
#include "executor/host_pool.h"
#include "graph/graph.h"
#include "graph/liveness.h"
#include "planner/schedule.h"
#include "replay/graph_trace.h"

namespace headroom {

struct ExecutorOptions {
  // The CPU reference's simulated device (when Create is given no device);
  // host memory backs only what the allocator takes from it.
  uint64_t device_bytes = uint64_t{80} << 30;
  float learning_rate = 0.05f;
  float momentum = 0.9f;
  // The host pool's capacity; 0 sizes it from the plan (Note [Host pool size] in executor.cc).
  uint64_t host_pool_bytes = 0;
  // Run the allocator's Validate() after every allocation and free (tests).
  bool validate_allocator = false;
  // Keep a copy of each parameter gradient as the optimizer reads it (tests).
  bool record_gradients = false;
};

struct StepResult {
  float loss = 0;
  // Device memory, from the caching allocator's statistics over the run so
  // far (resident state included): requested bytes, rounded blocks, segments.
  uint64_t peak_requested_bytes = 0;
  uint64_t peak_allocated_bytes = 0;
  uint64_t peak_reserved_bytes = 0;
  // Allocated blocks and freed ones a copy still uses (Note [Executor copies]).
  uint64_t peak_active_bytes = 0;
  uint64_t host_peak_bytes = 0;  // the host pool's requested bytes
  double seconds = 0;            // wall time of the step
};

// The job a demo model trains as: fp32, SGD with momentum, the given
// allocator configuration. `headroom plan MODEL.json --precision fp32
// --optimizer sgd-momentum` plans the same step from the model's graph JSON.
JobSpec DemoJob(const AllocatorOptions& allocator = {});
// The plan problem of `model` under `job` on a device of `device_bytes`
// (estimators/plan_input.h), as `headroom plan` builds it.
absl::StatusOr<PlanInput> DemoPlanInput(const DemoModel& model, const JobSpec& job, uint64_t device_bytes);

class PlanExecutor {
 public:
  // Checks that `in` is a step the kernels can run (fp32, SGD with
  // momentum, op kinds of the demo models) and `schedule` materializes over
  // it, allocates the resident state and initializes the parameters.
  // Errors name the op, tensor or setting at fault. `model` and `in` must
  // outlive the executor. `device`: where to run; the CPU reference of
  // options.device_bytes when null.
  static absl::StatusOr<std::unique_ptr<PlanExecutor>> Create(const DemoModel& model, const PlanInput& in,
                                                              const Schedule& schedule, ExecutorOptions options,
                                                              std::unique_ptr<ComputeDevice> device = nullptr);
  ~PlanExecutor();

  // One training step. A bad batch (sizes, ids out of range) is refused
  // before anything runs; an error midway (out of memory) leaves the
  // executor refusing further steps.
  absl::StatusOr<StepResult> RunStep(const DemoBatch& batch);

  // Current values of a parameter of the model (by forward TensorId), and
  // new ones (InvalidArgument for another tensor or a wrong count).
  absl::StatusOr<std::vector<float>> ParameterValues(TensorId parameter) const;
  absl::Status SetParameterValues(TensorId parameter, std::span<const float> values);
  // With record_gradients: each parameter's gradient in the last step, by forward TensorId (empty for others).
  const std::vector<std::vector<float>>& last_gradients() const { return gradients_; }

  const CachingAllocator& allocator() const { return *allocator_; }
  const HostPool& host_pool() const { return *host_pool_; }

 private:
  PlanExecutor(const DemoModel& model, const PlanInput& in, ExecutorOptions options,
               std::unique_ptr<ComputeDevice> device);
  absl::Status CheckBatch(const DemoBatch& batch) const;
  absl::StatusOr<StepResult> RunCheckedStep(const DemoBatch& batch);
  absl::Status Initialize(const Schedule& schedule);
  absl::Status AllocateResident();
  // The momentum buffers the first step creates (Note [Executor allocation order]).
  absl::Status CreateOptimizerState();
  absl::Status ZeroMomentum(TensorId p, uint64_t bytes);
  absl::Status CheckParameter(TensorId parameter) const;

  // Device memory of materialized tensors.
  absl::Status AllocateTensor(TensorId t);
  absl::Status FreeTensor(TensorId t);
  float* Data(TensorId t) const;  // t's storage as the kernels see it, as floats
  int64_t* Ids(TensorId t) const;
  // Copies the batch into t when t is the model's input or labels.
  absl::Status LoadBatch(TensorId t, const DemoBatch& batch);

  absl::Status RunForward(const Op& op, OpId step_op, float& loss);
  absl::Status RunBackward(const Op& op);
  absl::Status RunOptimizer(const Op& op);
  absl::Status Offload(const Op& op);
  absl::Status Prefetch(size_t index, const Op& op);
  // Note [Executor copies] in the .cc.
  absl::StatusOr<EventHandle> RecordOn(StreamHandle stream);
  absl::Status CopyStreamWaitsForCompute();
  absl::Status FreeFinishedHostCopies(bool wait);

  // The tensor of materialized op `op` that holds step tensor `value`: one of
  // its inputs, or `value` itself when it is resident (a parameter).
  absl::StatusOr<TensorId> Find(const Op& op, TensorId value) const;

  const DemoModel& model_;
  const PlanInput& in_;
  const ExecutorOptions options_;
  Schedule schedule_;
  Graph scheduled_;
  std::vector<TensorId> copy_of_;  // by scheduled TensorId
  std::vector<TensorLifetime> lifetimes_;
  std::unique_ptr<GraphEventOrder> order_;
  std::vector<bool> requires_grad_;  // by step TensorId

  std::unique_ptr<ComputeDevice> device_;
  const ExecutorKernels& kernels_;
  std::unique_ptr<CachingAllocator> allocator_;
  std::unique_ptr<HostPool> host_pool_;
  std::vector<DeviceAddress> address_;  // by scheduled TensorId: storage of live tensors
  std::vector<std::byte*> pointer_;     // the same storage as the kernels see it
  std::vector<bool> live_;
  std::vector<DeviceAddress> momentum_;  // by step TensorId (parameters)
  std::vector<std::byte*> momentum_pointer_;
  std::vector<DeviceAddress> unused_resident_;
  std::vector<std::pair<TensorId, uint64_t>> state_to_create_;  // owner and bytes, in resident order
  StreamHandle copy_stream_ = kDefaultStream;
  std::vector<std::optional<EventHandle>> ready_;  // by scheduled TensorId: a prefetch still copying into it
  std::deque<std::pair<void*, EventHandle>> host_frees_;  // host copies to free once their last prefetch is done
  std::vector<EventHandle> idle_events_;
  std::vector<void*> host_copy_;             // by step TensorId: offloaded bytes
  std::vector<size_t> last_prefetch_;        // by step TensorId: the entry of its last prefetch
  std::vector<std::vector<float>> gradients_;
  absl::Status broken_;  // the error that stopped a step midway
};

}  // namespace headroom

#endif  // HEADROOM_EXECUTOR_EXECUTOR_H_

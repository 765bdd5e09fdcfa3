// A plan as a schedule: the order in which a training step runs its ops,
// replays forward ops (rematerialization) and copies activations to and from
// host memory. Every strategy of the planner produces one; the same liveness
// code that the estimators use profiles it (graph/liveness.h), and the
// allocator can replay it.
//
//   Schedule s = StoreAllSchedule(step);                     // the step as it is
//   Schedule c = *SegmentSchedule(step, checkpoint_plan);    // torch.utils.checkpoint
//   HEADROOM_ASSIGN_OR_RETURN(Graph scheduled, MaterializeSchedule(step, c));
//   MemoryProfile p = ProfileMemory(scheduled, {});
//
// The step is any complete training step in program order: one that
// graph/training_step.h built without checkpointing, or an imported
// node-link graph that holds its backward already.
//
// Note [Schedule semantics]
// Entries run one at a time, in order.
//  - kCompute runs step op `target`. Every op of the step is computed exactly
//    once, and computes keep the step's program order.
//  - kRecompute replays forward op `target` into fresh copies of its outputs
//    ("<name>@recompute<k>").
//  - Every op reads the latest copy of each input: the original, the most
//    recent replay, or the most recent prefetch. So when backward reads a
//    replayed copy, the original is freed after its last forward use; that is
//    how a schedule drops an activation. Nothing else frees memory: storage is
//    freed right after its last reader (Note [Liveness rule]).
//  - kOffload marks the point where the device-to-host copy of tensor
//    `target` has completed: it reads the tensor's latest copy, keeping the
//    device storage alive until then. The copy itself was issued right after
//    the tensor's last reader before this entry and runs on the copy engine
//    (planner/plan.h prices it).
//  - kPrefetch issues the host-to-device copy of offloaded tensor `target`:
//    a fresh device copy ("<name>@prefetch<k>") is allocated here and becomes
//    the latest copy. Ops reading it wait for the copy to complete.
// MaterializeSchedule writes the schedule out as a Graph with these
// semantics: compute and recompute entries become ops (recompute ones with
// Op::recompute, phase kBackward, forward_of = the replayed op), copies
// become ops of kind "offload_copy" (one input, no output) and
// "prefetch_copy" (no input, one output), so ProfileMemory measures the
// plan's device memory with no special case.
#ifndef HEADROOM_PLANNER_SCHEDULE_H_
#define HEADROOM_PLANNER_SCHEDULE_H_

#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "graph/checkpoint_plan.h"
#include "graph/graph.h"

namespace headroom {

enum class ScheduleAction : uint8_t { kCompute, kRecompute, kOffload, kPrefetch };
std::string_view ScheduleActionName(ScheduleAction action);  // "compute", "recompute", "offload", "prefetch"
absl::StatusOr<ScheduleAction> ParseScheduleAction(std::string_view name);

struct ScheduleEntry {
  ScheduleAction action = ScheduleAction::kCompute;
  int32_t target = kNone;  // OpId for compute and recompute, TensorId for copies

  friend bool operator==(const ScheduleEntry&, const ScheduleEntry&) = default;
};

struct Schedule {
  std::vector<ScheduleEntry> entries;

  size_t CountOf(ScheduleAction action) const;
  friend bool operator==(const Schedule&, const Schedule&) = default;
};

// Whether `op` of `step` may be replayed: a forward-phase op (not loss,
// backward or optimizer).
bool IsRecomputable(const Op& op);

// Every op once, in program order: nothing replayed, nothing copied.
Schedule StoreAllSchedule(const Graph& step);

// Checkpointed segments over the step's forward ops (plan indexed by the
// step's OpId; only forward ops may belong to a segment): each segment keeps
// only what enters it from outside, and its ops are replayed right before
// the first op after the forward pass that reads a tensor the segment
// produces (the segment's backward), as torch.utils.checkpoint does.
absl::StatusOr<Schedule> SegmentSchedule(const Graph& step, const CheckpointPlan& plan);

// The schedule as a Graph (Note [Schedule semantics]). Errors
// (InvalidArgument, naming the entry): an unknown op or tensor, a compute
// missing, repeated or out of program order, a replay of a non-forward op or
// before its compute, an op reading a tensor not yet produced, an offload of
// a tensor not on the device, a prefetch of a tensor not offloaded.
// `copy_of`, when given, receives for each tensor of the result the step
// tensor it holds: itself for the step's own, the original for a replay's or
// a prefetch's fresh copy (what an executor needs to find a value).
absl::StatusOr<Graph> MaterializeSchedule(const Graph& step, const Schedule& schedule,
                                          std::vector<TensorId>* copy_of = nullptr);

// Drops replays whose outputs nobody reads (directly or through a later
// replay), as PyTorch's non-reentrant checkpoint stops early, and offloads
// never prefetched back whose tensor has no later reader. The schedule must
// materialize.
absl::StatusOr<Schedule> PruneSchedule(const Graph& step, const Schedule& schedule);

}  // namespace headroom

#endif  // HEADROOM_PLANNER_SCHEDULE_H_

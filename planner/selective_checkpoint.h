// A plan as PyTorch runs it op by op: selective activation checkpointing
// (torch.utils.checkpoint, non-reentrant, with a policy from
// create_selective_checkpoint_contexts) around the model's blocks. Any
// strategy's schedule is turned into what that mechanism can carry out, and
// the result is a schedule again, so its peak, host bytes and time are those
// of what runs, priced by the same evaluation as every plan.
//
//   HEADROOM_ASSIGN_OR_RETURN(SelectiveCheckpoint sc, RealizeSelectiveCheckpoint(step, plan.schedule));
//   EvaluateSchedule(problem, sc.schedule);       // what PyTorch will run
//   for (const CheckpointRegion& r : sc.regions) r.layer, r.save[i];   // the policy, per op of each region
//
// Note [Selective checkpoint semantics]
// What PyTorch 2.x does (torch/utils/checkpoint.py: _checkpoint_hook,
// _recomputation_hook, _CachingTorchDispatchMode, _CachedTorchDispatchMode),
// and so what the realized schedule says:
//  - A region is one call of a block's forward (the ops of one layer, which
//    are contiguous in program order). Its forward runs as usual, except
//    that everything autograd saves inside it is dropped, and the outputs of
//    the ops the policy marks save are cached. The region's inputs stay
//    referenced by the checkpoint.
//  - The first time backward unpacks a tensor saved inside the region (in
//    the backward of one of its ops), the region's forward runs again from
//    its start: ops marked save return their cached outputs, the others
//    compute afresh. It stops early once the op that saved the region's last
//    tensor has run (early stop), so ops after that one are never replayed.
//    The realized schedule replays, right before that backward op, every
//    recompute-marked op up to the last op that saves anything, in program
//    order; the liveness rule frees each fresh copy after its last reader,
//    as autograd frees what it unpacked.
//  - A cached output lives until the replay hands it back, so an op is
//    marked save only where backward or a replayed op needs its output;
//    otherwise it is replayed, unless it is a GEMM or attention (then caching
//    is cheaper than computing it again). Ops after the last saving one are
//    marked recompute: they are never replayed, and a cached output would
//    never be handed back.
//  - A tensor written in place (dropout's mask: empty_like, bernoulli_,
//    div_) cannot be cached while a later write changes it, and a replayed
//    write must start from a replayed tensor: the op that makes a storage
//    and every op writing into it inside the region are replayed together.
//    A region whose ops write into one of its inputs is not checkpointed at
//    all (its replay would write the input twice).
//  - The random number generator is reset to its state at the region's
//    start before the replay, so the replayed random ops must draw exactly
//    the numbers their first run drew: every random op before a replayed one
//    is replayed too.
//  - A region with nothing to replay is not checkpointed.
//
// Note [Offload through saved-tensor hooks]
// Outside the regions, an offload of the plan is carried out by
// torch.autograd.graph.saved_tensors_hooks around the model's forward: the
// pack hook copies a storage the plan offloads to host memory when autograd
// saves it, and the unpack hook brings it back. That can only carry what
// autograd alone keeps alive for backward, so a tensor is offloaded only if
//  - every op that saves it (or a view of its storage) is a forward op
//    outside the regions (inside, the checkpoint's own hooks take it), none
//    reads it inside a region (a checkpoint keeps its inputs) and it is not
//    made there;
//  - every op after the loss that reads it is the backward of one of those
//    savers (it reads the tensor only through what autograd unpacks).
// The device storage is freed after its last forward reader, as Python lets
// it go: the realized offload is there. Backward unpacks an op's saved
// tensors when it starts that op's backward (the first backward op derived
// from it), so the first unpack of a hooked storage is an event the hooks
// see: a prefetch is issued at the first such event at or after the plan's
// prefetch, and where none comes before the tensor's own first unpack, the
// unpack copies it back. The host copy is released once the tensor is back;
// the device copy lives until its last reader, as the liveness rule frees
// it. Offloads that fail these rules are dropped (their tensors stay), and a
// plan that then does not fit is planned again (Note [Plan runners]).
#ifndef HEADROOM_PLANNER_SELECTIVE_CHECKPOINT_H_
#define HEADROOM_PLANNER_SELECTIVE_CHECKPOINT_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "graph/graph.h"
#include "planner/schedule.h"

namespace headroom {

// One checkpointed region: the forward ops first..last of a layer.
struct CheckpointRegion {
  int layer = -1;
  OpId first = kNone;
  OpId last = kNone;
  // Indexed by op - first: the policy marks the op's output save (cached in
  // forward), else recompute.
  std::vector<bool> save;
  OpId last_saving = kNone;   // the last op that saves a tensor for backward: the replay stops after it
  OpId replay_before = kNone;  // the backward op that first unpacks a tensor saved in the region
  size_t replayed_ops = 0;
};

// A storage offloaded by the hooks (Note [Offload through saved-tensor hooks]).
struct HookedOffload {
  TensorId tensor = kNone;  // the storage's base tensor
  // The storage whose first unpack issues the copy back; kNone: the
  // tensor's own first unpack copies it back.
  TensorId prefetch_on_unpack_of = kNone;
};

struct SelectiveCheckpoint {
  std::vector<CheckpointRegion> regions;  // in program order
  std::vector<HookedOffload> offloads;    // in the order forward saves them
  Schedule schedule;                      // what runs (Note [Selective checkpoint semantics])
};

// The schedule PyTorch runs for `plan`, a schedule of `step`, with a region
// per layer that `plan` replays any op of, and the plan's offloads that
// saved-tensor hooks carry. Errors: `plan` does not materialize (its
// message).
absl::StatusOr<SelectiveCheckpoint> RealizeSelectiveCheckpoint(const Graph& step, const Schedule& plan);

// The schedule PyTorch runs with torch.utils.checkpoint around each of
// `regions` (only first, last and layer are read; each a contiguous run of
// forward ops, ascending and apart): every op of each replayed, up to its
// last save. What framework settings that checkpoint whole layers, groups
// of layers or attention functions run (report/plan_emit.h). InvalidArgument
// names a region out of order or holding another phase's op.
absl::StatusOr<SelectiveCheckpoint> RealizeFullCheckpoints(const Graph& step, std::vector<CheckpointRegion> regions);

// One region per layer whose forward ops are one contiguous run (a block called once), in program order.
std::vector<CheckpointRegion> LayerRegions(const Graph& step);

// Random ops, whose replay must draw the same numbers (dropout, bernoulli, rand...).
bool IsRandomKind(std::string_view kind);

}  // namespace headroom

#endif  // HEADROOM_PLANNER_SELECTIVE_CHECKPOINT_H_

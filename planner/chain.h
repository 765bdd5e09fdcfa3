// A model as a chain of stages, the input of the chain-dp strategy
// (planner/chain_dp.h): per stage what it costs to replay and what it holds
// under each choice a plan can make for it, plus the few terms no choice
// changes. For transformer stacks the stages are the layers.
//
//   HEADROOM_ASSIGN_OR_RETURN(Chain chain, ExtractLayerChain(*problem.step, problem.op_cost, problem.profile));
//   chain.stages[3].all_bytes;        // layer 3's saved-for-backward bytes
//   Chain synthetic = RandomChain(1000, /*seed=*/7);
//
// Note [Chain memory model]
// The chain is the DP's model of a training step, simple on purpose; the
// real peak of a plan is the one ProfileMemory measures on the materialized
// schedule, and the driver tightens the DP's budget until that fits. Stages
// 0..L-1 run forward in order and backward in reverse. Each stage is
//  - kept whole ("all"): it holds all_bytes from its forward to its backward;
//  - selective: it holds selective_bytes, and its attention core is replayed
//    (selective_cost) right before its backward;
//  - in a checkpointed segment, a run of consecutive stages [j..k]: the
//    segment holds only its first stage's input_bytes, and the whole segment
//    is replayed once right before its backward, costing its stages'
//    forward_cost plus the boundary_cost of each stage but the last (the
//    last stage's output is kept as the next stage's input, so the ops that
//    produce it are not replayed; an inner stage's output must be).
// The stored prefix P(i) is the sum of what stages 0..i-1 hold. The peak is
// the largest of
//  - fixed_bytes + P(i) + all_bytes(i) + backward_bytes(i) for a stage i kept
//    whole or selective (a selective stage's replayed core brings it back to
//    all_bytes while its backward runs),
//  - fixed_bytes + P(j) + all_bytes(j..m) + backward_bytes(m) for each stage m
//    of a segment [j..k] (the replayed stages j..m are live during m's
//    backward; those after m have been freed by their own backward),
//  - fixed_bytes + P(L) + tail_bytes (the part after the chain: the head, the
//    loss and their backward, on top of everything the stages hold),
//  - outside_peak_bytes (the part before the chain's forward and after its
//    backward, which no plan changes).
// all_bytes counts the stage's input (its first ops save it), so a replayed
// segment's live bytes are the sum of its stages' all_bytes and nothing more.
// A stage's forward is assumed to need no more than its backward
// (backward_bytes covers both when extracted, ExtractLayerChain), so the
// model checks backward only.
#ifndef HEADROOM_PLANNER_CHAIN_H_
#define HEADROOM_PLANNER_CHAIN_H_

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "graph/graph.h"
#include "graph/liveness.h"

namespace headroom {

struct ChainStage {
  // Replaying the stage as a segment of its own (Note [Plan costs] units).
  double forward_cost = 0;
  // Replaying, on top, the ops that produce its output, when a later stage
  // of the same segment reads it.
  double boundary_cost = 0;
  // Selective recomputation replays the attention core alone; a stage without
  // one offers no selective choice and its selective figures are ignored.
  bool has_attention_core = false;
  double selective_cost = 0;     // replaying the attention core
  uint64_t input_bytes = 0;      // what a segment starting here holds
  uint64_t all_bytes = 0;        // held when kept whole; includes input_bytes
  uint64_t selective_bytes = 0;  // held under selective (all but the core's internals)
  uint64_t backward_bytes = 0;   // needed on top while the stage's backward runs

  friend bool operator==(const ChainStage&, const ChainStage&) = default;
};

// Note [Chain memory model].
struct Chain {
  std::vector<ChainStage> stages;
  uint64_t fixed_bytes = 0;         // live throughout the chain, whatever the plan
  uint64_t tail_bytes = 0;          // on top of every stage's held bytes after the chain
  uint64_t outside_peak_bytes = 0;  // the peak before and after the chain, plan-free
  std::string cost_unit = "s";  // as op_cost's (PlanProblem::cost_unit); for reports only

  int num_stages() const { return static_cast<int>(stages.size()); }
  // InvalidArgument naming the stage and field: no stages, a cost negative or
  // not finite, input_bytes or selective_bytes above all_bytes, or byte
  // figures whose sum reaches 2^62 (so that no sum of them can wrap).
  absl::Status Validate() const;

  friend bool operator==(const Chain&, const Chain&) = default;
};

// The chain of a model's layers (Op::layer >= 0; layer i is stage i), as
// PlanForMode sees them (planner/checkpoint_mode_plan.h). `forward_or_step` is a
// forward graph as the builders emit it, or a complete step with nothing
// checkpointed (PlanProblem::step, planner/schedule.h); `op_cost` one finite
// non-negative cost per op of it, and `profile` the bytes that count
// (PlanProblem::profile). The bytes are measured, not derived: the step
// (for a forward graph, BuildTrainingStep's with nothing checkpointed) is
// profiled as it is and under PlanForMode's kFull and kSelective segments
// (SegmentSchedule, materialized), and
//  - all_bytes, input_bytes, selective_bytes are each profile's
//    saved_bytes_by_layer (graph/liveness.h), all_bytes raised to
//    input_bytes and selective_bytes where a stage saves less than what its
//    segment would hold (a stage before the first trainable parameter);
//  - in the step as it is, stage i's requirement is the highest live bytes
//    during its forward or backward ops less the bytes stages 0..i hold;
//    fixed_bytes is the least of those requirements and of the tail's,
//    backward_bytes and tail_bytes the rest of each, and outside_peak_bytes
//    the highest live bytes before the first layer op or after the last
//    layer's backward (the optimizer's ops, though they carry their
//    parameter's layer, are outside). Ops outside any layer that run between
//    layer ops count towards the next layer op's stage. So the model's peak
//    of the plan that keeps everything is that step's measured peak.
//  - forward_cost and selective_cost sum op_cost over the layer's replays
//    in the kFull and kSelective schedules (what torch.utils.checkpoint runs
//    again: not the ops whose outputs backward never reads, such as the
//    attention core's last matmul, whose output the next op saves), and
//    boundary_cost is the rest of the layer's forward cost, which a longer
//    segment replays too (exact when every op the single-layer replay skips
//    produces the layer's output or feeds only ops that do).
// Errors (InvalidArgument): an invalid graph, a step that already replays
// ops, no layers, a layer with no forward op, layers not in program order
// (the op is named), op_cost of the wrong size or with a bad entry (the op
// is named), and the step builder's and schedule's errors.
absl::StatusOr<Chain> ExtractLayerChain(const Graph& forward_or_step, std::span<const double> op_cost,
                                        const ProfileOptions& profile = {});

// A heterogeneous synthetic chain for tests and benchmarks, the same for the
// same arguments on every platform: stages of a few kinds (attention layers
// of varied width and sequence, MLP blocks and convolution-like stages
// without an attention core), all byte figures whole MiB so that a 1 MiB
// memory unit is exact. num_stages below 1 gives one stage.
Chain RandomChain(int num_stages, uint64_t seed);

}  // namespace headroom

#endif  // HEADROOM_PLANNER_CHAIN_H_

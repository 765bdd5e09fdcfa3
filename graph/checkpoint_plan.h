// A checkpoint plan: which forward ops of a graph are replayed during
// backward, grouped into segments. It is a value the planner computes
// (planner/checkpoint_mode_plan.h turns the named modes into plans; a search over
// the graph may produce any other) and the step builder executes
// (graph/training_step.h, Note [Checkpoint segments]).
//
//   CheckpointPlan plan = *PlanForMode(forward, CheckpointMode::kFull);
//   plan.segment_of_op[op]   // the segment of forward op `op`, or kNone
//   Graph step = *BuildTrainingStep(forward, {.checkpoint = plan});
//
// Invariants (Validate): the plan is empty (nothing checkpointed) or has one
// entry per forward op; only forward-phase ops belong to a segment; segments
// are numbered 0, 1, ... in program order, and each is one contiguous run
// of ops.
#ifndef HEADROOM_GRAPH_CHECKPOINT_PLAN_H_
#define HEADROOM_GRAPH_CHECKPOINT_PLAN_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "graph/graph.h"

namespace headroom {

struct CheckpointPlan {
  // Indexed by OpId of the forward graph; empty when nothing is checkpointed.
  std::vector<int32_t> segment_of_op;

  bool empty() const;
  int32_t num_segments() const;
  // Checks the invariants above against `forward`; the message names the op.
  absl::Status Validate(const Graph& forward) const;
};

}  // namespace headroom

#endif  // HEADROOM_GRAPH_CHECKPOINT_PLAN_H_

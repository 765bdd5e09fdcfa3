// Chen et al. 2016, "Training Deep Nets with Sublinear Memory Cost": cut
// the forward pass into segments that keep only their inputs and replay
// during backward, either ~sqrt(n) equal segments or greedily under a
// memory threshold (their Algorithm 2), with cuts placed where the graph is
// narrowest, as cybertronai/gradient-checkpointing does with articulation
// points.
//
//   ForwardCuts cuts = FindForwardCuts(step);     // where a segment may end
//   CheckpointPlan p = SqrtNPlan(step, cuts);      // then SegmentSchedule(step, p)
//   absl::StatusOr<Schedule> s = ChenGreedySchedule(problem, cuts);
//
// Note [Forward cuts]
// The forward ops (phase kForward) in program order are a sequence; a cut
// at position p separates ops before p from ops at and after p. The tensors
// crossing it are those made by forward ops before p and read by forward
// ops (or the loss) at or after p: what a segment starting at p must keep.
// In a chain one tensor crosses every cut. In a DAG, a cut crossed by a
// single tensor is an articulation point of the path from the batch to the
// loss (the graph minus that tensor falls apart). Only tensors that depend
// on the batch (reachable from an input tensor) are counted: a causal mask
// or rotary table made once from constants crosses every cut and is kept
// whatever the plan. We take the cuts crossed by the fewest such tensors:
// the articulation points, when the graph has any. One sweep with a difference array over (producer, last forward
// reader) intervals: O(ops + edges). The linearized variant treats every
// position as a cut, as Chen et al. do for graphs that are not chains; a
// segment then keeps whatever crosses its start.
#ifndef HEADROOM_PLANNER_CHEN_H_
#define HEADROOM_PLANNER_CHEN_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "graph/checkpoint_plan.h"
#include "graph/graph.h"
#include "planner/plan.h"
#include "planner/schedule.h"

namespace headroom {

struct ForwardCuts {
  std::vector<OpId> forward_ops;  // the step's forward-phase ops, in program order
  // Positions (indices into forward_ops, 1..size-1) where a segment may
  // start, ascending (Note [Forward cuts]).
  std::vector<size_t> positions;
  size_t min_crossing = 0;  // tensors crossing each of those positions
};

// The narrowest cuts (Note [Forward cuts]); `linearized`: every position.
ForwardCuts FindForwardCuts(const Graph& step, bool linearized = false);

// ~sqrt(n) segments over the n forward ops, each starting at the cut
// nearest to an equal split; every forward op belongs to a segment. The
// plan is indexed by the step's OpId (for SegmentSchedule).
CheckpointPlan SqrtNPlan(const Graph& step, const ForwardCuts& cuts);

// The greedy of Chen et al. (Algorithm 2): walk the forward ops, and close a
// segment at the first cut after the bytes it saves pass a threshold b.
// Tries a geometric range of b and returns the schedule with the least
// replay cost whose peak fits problem.budget (ties: the lower peak).
// ResourceExhausted names the smallest peak any threshold reached when none fits.
absl::StatusOr<Schedule> ChenGreedySchedule(const PlanProblem& problem, const ForwardCuts& cuts);

// The lowest peak any threshold of the greedy reaches, whatever the budget.
absl::StatusOr<uint64_t> ChenGreedyLowestPeak(const PlanProblem& problem, const ForwardCuts& cuts);

}  // namespace headroom

#endif  // HEADROOM_PLANNER_CHEN_H_

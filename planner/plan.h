// What a plan costs and whether it is sound: the problem every strategy
// solves, the evaluation of a schedule against it, and an independent
// validator.
//
//   PlanProblem problem = {.step = &step, .op_cost = costs, .budget = 20 * kGiB};
//   HEADROOM_ASSIGN_OR_RETURN(PlanEvaluation e, EvaluateSchedule(problem, schedule));
//   e.peak_bytes <= problem.budget;   e.extra_cost;   e.step_cost;
//   HEADROOM_RETURN_IF_ERROR(ValidateSchedule(problem, schedule));
//
// Note [Plan costs]
// Op costs are in one unit per problem: seconds from the roofline cost model
// (hardware/cost_model.h), or a graph's own measured units (node-link
// cost_cpu). A replay costs what its op costs. The compute stream runs
// entries in order; copies run on two copy engines (device-to-host,
// host-to-device), each one copy at a time in issue order, at
// bytes_per_cost_unit. An offload is issued right after the last reader of
// the tensor before the kOffload entry, and the compute stream waits at the
// kOffload entry until it completes (its storage is freed there). A prefetch
// is issued at its entry, no earlier than the offload's completion, and the
// first op that reads the prefetched copy waits for it. step_cost = compute
// time + replay time + waits.
#ifndef HEADROOM_PLANNER_PLAN_H_
#define HEADROOM_PLANNER_PLAN_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "graph/graph.h"
#include "graph/liveness.h"
#include "planner/schedule.h"

namespace headroom {

// Note [Plan runners]
// Headroom's executor runs any schedule. PyTorch runs what selective
// activation checkpointing around the model's blocks expresses (Note
// [Selective checkpoint semantics] in planner/selective_checkpoint.h): for
// kTorchSelectiveCheckpoint every strategy's schedule is turned into that
// before it is evaluated, and planned again for a lower budget while what
// runs does not fit (planner/planner.h), so the figures reported are those
// of what runs.
enum class PlanRunner : uint8_t { kAnySchedule, kTorchSelectiveCheckpoint };

class PlanMemo;  // planner/plan_memo.h

struct PlanProblem {
  const Graph* step = nullptr;  // a complete step (planner/schedule.h), not owned
  // Cost of each op of the step (indexed by OpId), Note [Plan costs].
  std::vector<double> op_cost;
  std::string cost_unit = "s";  // "s", or the graph's measured unit
  // Which bytes count towards the budget (e.g. parameter gradients are fixed
  // state when the budget comes from a GPU, and count in a node-link graph).
  ProfileOptions profile;
  uint64_t budget = 0;  // device bytes for counted tensors
  // Copy engine speed, bytes per cost unit each way; 0: no offload possible.
  double copy_bytes_per_cost = 0;
  // Micro-batches a pipeline stage holds at once under 1F1B, each running
  // this schedule (Note [Pipeline in-flight]); 1 without pipelining.
  int in_flight = 1;
  // Who carries the plan out (Note [Plan runners]).
  PlanRunner runner = PlanRunner::kAnySchedule;
  // Searches kept for the problem's copies (Note [Plan memo]); none: none kept.
  std::shared_ptr<PlanMemo> memo;
};

// Note [Pipeline in-flight]
// Under 1F1B a pipeline stage runs up to in_flight micro-batches between
// their forward and their backward, all with the same schedule (frameworks
// set checkpointing once for every micro-batch). While one micro-batch runs
// its schedule, each of the others holds what its forward leaves behind:
// the device copies made by compute entries of forward-side ops that are
// still live at the last such entry. So every entry's live bytes, and the
// peak, carry (in_flight - 1) times that; both EvaluateSchedule and
// ValidateSchedule count it, each in its own way.

// Checks the problem itself: a step, one finite non-negative cost per op.
absl::Status ValidateProblem(const PlanProblem& problem);

struct PlanEvaluation {
  uint64_t peak_bytes = 0;   // ProfileMemory of the materialized schedule
  OpId peak_entry = kNone;   // schedule entry index at the peak
  double base_cost = 0;      // sum of op costs (the store-all step)
  double extra_cost = 0;     // replays
  double wait_cost = 0;      // compute stalled on copies
  double step_cost = 0;      // base + extra + waits
  uint64_t host_peak_bytes = 0;      // most bytes in host memory at once
  uint64_t offloaded_bytes = 0;      // total device-to-host bytes
  size_t recomputed_ops = 0;
  std::vector<uint64_t> live_bytes;  // counted device bytes during each entry, in-flight bytes included
  // What each other in-flight micro-batch holds (Note [Pipeline in-flight]);
  // peak_bytes and live_bytes include in_flight - 1 times it.
  uint64_t held_after_forward = 0;
};

// Materializes and profiles `schedule`, and prices it (Note [Plan costs]).
absl::StatusOr<PlanEvaluation> EvaluateSchedule(const PlanProblem& problem, const Schedule& schedule);

// An independent check of a schedule, written apart from MaterializeSchedule
// and graph/liveness.cc so that neither vouches for itself: every step op
// computed once in program order; replays only of forward ops, after their
// compute; each entry's inputs produced before it runs (kept, replayed or
// prefetched); prefetches only of offloaded tensors; every gradient the
// store-all step produces is produced; and the peak of counted live bytes,
// simulated here from scratch, within the budget. FailedPrecondition names
// the entry at fault.
absl::Status ValidateSchedule(const PlanProblem& problem, const Schedule& schedule);

}  // namespace headroom

#endif  // HEADROOM_PLANNER_PLAN_H_

// The step as the rematerialization solvers see it (planner/remat_solver.h):
// ops in program order with a cost, the bytes they allocate and the ops they
// read, plus a fast simulator of a compute/recompute sequence under the
// latest-copy rule (Note [Schedule semantics] in planner/schedule.h).
// Internal to the planner: not installed, and the COIN-OR headers stay in
// remat_lp.cc.
//
// Note [Remat model]
// Each op is one node. Its bytes are its counted, non-view outputs that are
// not whole-step tensors (those, e.g. batch inputs, are `fixed_bytes`, live
// throughout as graph/liveness.h has it). It depends on the producers of its
// inputs and, for an input that is a view, on the producer of the view's
// base. A node's copy lives from the entry that makes it to its last reader
// (an entry reading it while it is the latest copy); a copy whose outputs
// include a view of another node's output keeps the copy it aliases alive as
// long as itself ("aliases"). Against ProfileMemory of the materialized
// schedule this is exact for single-output ops (node-link graphs) and
// conservative for multi-output ones (all outputs of a copy live until the
// last reader of any). Whether MaterializeSchedule replays a view over the
// same base copy we assume is its business: the strategies measure their
// final schedule with EvaluateSchedule, not with this simulator.
//
// For the LP bound the memory is counted per value instead (Note [Remat LP
// bound] in remat_lp.cc): a value is one counted storage tensor made by an op,
// so that a value counted live is really live, which the bound needs.
#ifndef HEADROOM_PLANNER_REMAT_MODEL_H_
#define HEADROOM_PLANNER_REMAT_MODEL_H_

#include <cstdint>
#include <span>
#include <vector>

#include "absl/status/statusor.h"
#include "planner/plan.h"

namespace headroom::remat {

struct Model {
  int32_t n = 0;                    // ops, in program order
  std::vector<double> cost;         // PlanProblem::op_cost
  std::vector<uint64_t> bytes;      // Note [Remat model]
  std::vector<uint8_t> recomputable;  // IsRecomputable(op)
  std::vector<std::vector<int32_t>> deps;     // producers read, ascending, each < the op
  std::vector<std::vector<int32_t>> users;    // inverse of deps, ascending
  std::vector<std::vector<int32_t>> aliases;  // producers of the bases this op's outputs view
  uint64_t fixed_bytes = 0;         // counted whole-step tensors

  // Values for the LP bound: counted storage tensors (non-view, not
  // whole-step, more than 0 bytes) that an op produces.
  std::vector<int32_t> value_producer;
  std::vector<uint64_t> value_bytes;
  std::vector<std::vector<int32_t>> reads;   // per op: values it reads, ascending
  std::vector<std::vector<int32_t>> writes;  // per op: values it produces, ascending
  std::vector<int32_t> value_last_reader;     // per value: the last op reading it, -1 for none

  // Per op, bytes that must be live while it runs in any schedule: fixed,
  // its own inputs and outputs, and values made by non-recomputable ops
  // before it and read after it (their only copy spans it).
  std::vector<uint64_t> floor_at;
  uint64_t floor = 0;  // max of floor_at: no schedule peaks lower
};

// Builds the model of `problem` (ValidateProblem must pass). InvalidArgument
// names the op when the problem does not fit the solvers' assumptions.
absl::StatusOr<Model> BuildModel(const PlanProblem& problem);

struct Step {
  int32_t op = 0;
  bool recompute = false;
  friend bool operator==(const Step&, const Step&) = default;
};

struct Simulation {
  bool ok = false;      // every read found a copy, computes in program order
  uint64_t peak = 0;
  int32_t peak_entry = -1;
  double extra = 0;     // cost of the recompute steps
  size_t recomputes = 0;
  std::vector<uint64_t> live;  // bytes live during each step
};

// Runs `steps` under the latest-copy rule (Note [Remat model]).
Simulation Simulate(const Model& model, std::span<const Step> steps);

// Drops recompute steps whose copy nobody reads, last first, so that a
// dropped replay can leave its own inputs unread too.
std::vector<Step> PruneSteps(const Model& model, std::span<const Step> steps);

// Note [Lazy derivation]
// A retention pattern decides the replays: keep[i][t] says what happens to
// forward op i's copy in stage t (the steps up to and including the compute
// of op t):
//   kDrop    drop the copy when the stage ends;
//   kHold    hold a copy past the stage end, if there is one;
//   kReplay  as kHold, and replay i in the stage if no copy is held, so that
//            a later use finds it (replaying early, where memory is low).
// Stage t replays, in program order, every op that the compute of t or a
// kReplay needs (transitively) and that no held copy provides.
// Non-recomputable ops are always held. Any pattern gives a valid schedule;
// memory is left to Simulate. keep[i] is indexed by stage (size n) and only
// read for stages >= i.
enum Keep : uint8_t { kDrop = 0, kHold = 1, kReplay = 2 };
using Retention = std::vector<std::vector<uint8_t>>;
std::vector<Step> DeriveSteps(const Model& model, const Retention& keep);

// The steps as a Schedule of compute and recompute entries.
Schedule ToSchedule(std::span<const Step> steps);

// A retention pattern that derives a schedule close to `schedule` (another
// strategy's plan, as a start for the search): each stage holds the copies
// that `schedule` reads after it, and drops the rest, to be replayed lazily
// where they are read again. Entries other than computes and recomputes are
// ignored.
Retention RetentionOf(const Model& model, const Schedule& schedule);

}  // namespace headroom::remat

#endif  // HEADROOM_PLANNER_REMAT_MODEL_H_

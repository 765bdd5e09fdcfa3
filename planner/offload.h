// Plans that send saved activations to pinned host memory between their
// forward and backward uses (offload), and plans that choose per tensor
// between keeping it, replaying its producers and offloading it (hybrid).
// Both are schedules (planner/schedule.h) priced by EvaluateSchedule
// (planner/plan.h) and within the problem's budget.
//
//   PlanProblem problem = {.step = &step, .op_cost = costs, .budget = 20 * kGiB,
//                          .copy_bytes_per_cost = 0.8 * gpu.host_link.bandwidth_bytes_per_s};
//   HEADROOM_ASSIGN_OR_RETURN(Schedule s, PlanOffload(problem));
//   HEADROOM_ASSIGN_OR_RETURN(Schedule h, PlanHybrid(problem));
//   EvaluateSchedule(problem, h)->host_peak_bytes;   // pinned host memory it needs
//
// Note [Saved tensors]
// The forward side is the ops before the first backward or optimizer op. A
// saved tensor is the storage (not a view) of a counted role that a forward
// side op produces and that an op after the forward side reads, directly or
// through a view, with at least one op between its last forward-side use
// and its first later use (else nothing could be freed). Decisions are made
// per saved tensor; everything else stays as the step has it, except that a
// recomputation may replay the producers of tensors that are not saved.
//
// Note [Offload planning]
// A plan is a set of decisions, written out as a schedule by one placement
// pass:
//  - Offload of saved tensor S: its device-to-host copy joins the D2H queue
//    (first in, first out, by last forward use) when its last forward-side
//    user ends; the kOffload entry goes after the first op that ends once
//    the copy has completed, so that compute does not wait, unless the plan
//    needs S gone sooner (then compute waits there for it and for the copies
//    ahead of it).
//  - Its prefetch is placed just in time through the H2D queue (first in,
//    first out): latest deadline first, each copy lands before S's first
//    later use and before the next copy issues, on the step's timeline (op
//    costs, no waits), so that the device copy is not re-occupied sooner
//    than it must be. The plan may hold a prefetch back further.
// PlanOffload chooses the decisions greedily. While the peak is over budget,
// it takes the op at the peak and the run of ops around it that are over
// budget (the window); lists the saved tensors resident at the peak that
// could be off the device over the window (offload one, or hold an offloaded
// one off longer); tries the most promising few (four new offloads and two
// hold-offs, ranked by bytes x ops freed in the window over the copy time
// that does not fit in the timeline around it) and keeps the one that
// removes the most bytes over budget, summed over schedule entries, per unit
// of added step cost, without raising the peak. It stops when no trial
// removes any. Once within budget, four trims, each kept only if the plan
// stays within budget and gets no slower: undo decisions no longer needed
// (latest first); release constraints set for earlier peaks; place each
// prefetch as if it had the H2D engine to itself (less memory held, more
// waits); issue sooner the prefetches compute still waits for.
// Trials are priced by a private simulation of EvaluateSchedule's semantics
// on flat arrays (Note [Planner simulation] in offload.cc: tens of
// microseconds for a 32-layer step, where materializing a graph takes about
// a millisecond); the returned schedule is checked with EvaluateSchedule.
//
// Note [Hybrid planning]
// The same greedy, with a second kind of decision per saved tensor S:
// recompute, which replays S's producer right before S's first later use,
// along with the chain of producers of its inputs that are not resident then
// (inputs that are not saved, or recomputed themselves) and of the views of
// recomputed tensors read later, so that no original copy stays alive through
// a view; everything a replayed op makes is recomputed with it. Replays read
// kept inputs (extending their lives) and prefetched ones (moving their
// prefetch earlier). Four recomputes are tried per peak as well, ranked by
// bytes x ops freed over the replayed ops' cost. A recompute costs its
// replayed ops' op_cost; an offload costs only the waits it adds, about 0
// when the copies overlap with compute, so with a fast link the greedy
// offloads and with a slow one it recomputes. PlanHybrid returns the
// cheapest schedule within budget among: that greedy, the same greedy
// limited to offload and to recompute, and the checkpoint modes as segment
// schedules (each layer, every 2 layers, sqrt(n) layers, selective), so it
// is never slower than any of those.
// What it does NOT guarantee: the fastest schedule within budget (choosing
// what to free is a knapsack over intervals with queueing on top, NP-hard in
// general; a greedy can pick a tensor early that a better plan would not
// need, and tries only a few candidates per peak), nor, when it fails, the
// smallest peak any plan could reach. Placement uses the step's timeline
// without waits, so under heavy copy contention a plan may wait more than
// one placed with the waits known.
#ifndef HEADROOM_PLANNER_OFFLOAD_H_
#define HEADROOM_PLANNER_OFFLOAD_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "planner/plan.h"
#include "planner/schedule.h"

namespace headroom {

// Offload only (Note [Offload planning]): the store-all schedule when it
// fits, else a schedule with kOffload/kPrefetch entries whose peak is within
// problem.budget. Errors: ValidateProblem's; FailedPrecondition when the
// store-all step does not fit and the problem has no copy speed;
// ResourceExhausted, giving the smallest peak reached and where, when
// offloading saved tensors cannot meet the budget.
absl::StatusOr<Schedule> PlanOffload(const PlanProblem& problem);

// Keep, recompute or offload per saved tensor (Note [Hybrid planning]),
// minimizing EvaluateSchedule's step_cost within problem.budget. Without a
// copy speed only recomputation is considered. Errors: ValidateProblem's;
// ResourceExhausted, giving the smallest peak reached, when no candidate
// fits.
absl::StatusOr<Schedule> PlanHybrid(const PlanProblem& problem);

// PlanHybrid's plan and, when its search stopped at its work limit (Note
// [Hybrid work] in the .cc), a note saying so and whose plan it returns.
struct HybridPlan {
  Schedule schedule;
  std::string note;  // empty when the search ran to its end
};
// `work`, when given: the simulated schedule entries left to several calls
// together (the replans of one RunStrategy), else kHybridWork of its own.
absl::StatusOr<HybridPlan> PlanHybridWithNote(const PlanProblem& problem, int64_t* work = nullptr);

// PlanHybrid's work limit, in schedule entries simulated (Note [Hybrid work]).
inline constexpr int64_t kHybridWork = 100'000'000;

// The smallest peak PlanOffload (or PlanHybrid, when `hybrid`) reaches,
// whatever problem.budget says, found by bisecting the budget: what an error
// for a budget no strategy meets names. Not a bound: the greedy may stop
// above the least peak any offload plan could reach, and the bisection
// stops at a work limit (Note [Smallest offload peak work] in the .cc).
absl::StatusOr<uint64_t> SmallestOffloadPeak(const PlanProblem& problem, bool hybrid);

}  // namespace headroom

#endif  // HEADROOM_PLANNER_OFFLOAD_H_

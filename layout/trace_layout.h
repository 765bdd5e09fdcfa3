// A layout of a recorded allocation trace planned with every block's
// lifetime known in advance: the yardstick for a caching allocator, which
// learns each lifetime only at the free.
//
//   HEADROOM_ASSIGN_OR_RETURN(TraceLayout planned, LayoutTrace(trace));
//   planned.peak_page_bytes;      // pages live blocks touch at once, at most
//   planned.arena.arena_bytes;    // one buffer holding the whole layout
//
// Note [Planned trace layout]
// Every allocation of the trace becomes an ArenaRequest whose lifetime runs
// from its allocation to the last allocation before its free, counted in
// allocations rather than events: two blocks share a moment exactly when one
// is allocated while the other lives, so allocations are the only moments
// that matter, and a trace may hold up to kMaxGraphTensors of them (events
// may be twice as many). LayoutArena places them greedy by size (Note
// [Greedy by size] in arena_layout.h). The trace's anomalies follow the
// replay's rules (trace_replay.h): a failed allocation and a free of a
// pointer never allocated are skipped, an allocation of a pointer still live
// frees it first, and a 0-byte allocation at pointer 0 is skipped. Streams
// are not told apart: blocks of every stream share one address space, as a
// policy with cross-stream reuse lets them.
// Two device figures come out. `arena_bytes` is one buffer for everything;
// `peak_page_bytes` is what an allocator that maps a page while some live
// block touches it (and unmaps it once none does) would hold at most, the
// figure to set beside a policy's smallest device with expandable segments.
// Only a block's first and last page can be shared (live blocks are
// disjoint), so a sweep over the trace counts pages in O(1) per event.
// Greedy by size is a heuristic, not an optimum: an online policy can do
// better on some traces, and no layout does better than the live peak.
#ifndef HEADROOM_LAYOUT_TRACE_LAYOUT_H_
#define HEADROOM_LAYOUT_TRACE_LAYOUT_H_

#include <cstddef>
#include <cstdint>
#include <span>

#include "absl/status/statusor.h"
#include "allocator/layout_plan.h"
#include "layout/arena_layout.h"
#include "replay/allocation_trace.h"

namespace headroom {

struct TraceLayout {
  // One block per allocation the layout holds, in trace order; lifetimes in
  // allocations (Note [Planned trace layout]).
  ArenaLayout arena;
  uint64_t page_bytes = 0;
  uint64_t peak_page_bytes = 0;  // whole pages
};

// Errors: InvalidArgument for a page size that is 0 or not a multiple of the
// arena's alignment; OutOfRange, naming the trace, for more allocations than
// kMaxGraphTensors or one above kMaxTensorBytes.
absl::StatusOr<TraceLayout> LayoutTrace(const AllocationTrace& trace, uint64_t page_bytes = uint64_t{2} << 20,
                                        ArenaOrder order = ArenaOrder::kSize);

// Note [Repeating steps]
// A training loop of static shapes allocates and frees the same sequence
// every step after its first (bench/RESULTS.md: five of the eight CPU runs
// from step 2, the LSTM from step 3; not the MoEs, whose expert batches
// follow the data), and the sequence repeats from one run of the job to the
// next. So a plan that a run could follow forever needs only the steps up
// to the first one that every later step repeats: where that step frees
// every block it allocates by its end, its blocks find, in every later
// step, the same blocks live around them as in it (those of earlier steps
// still live, and their own), and their offsets hold in every later step.
// LayoutRepeatingSteps finds that step, the first after which the trace's
// recorded steps all repeat it (at least one does), and lays out the trace
// up to its end with LayoutTrace; blocks live past it stay live to the end.
// Steps are compared by each allocation's size and stream and by which
// earlier allocation each free ends, counted back from it, so that a step
// freeing the step before's blocks compares equal to the next one.
// An allocator following the plan serves the job's allocation n at
// blocks[n] while n is below the step's first allocation f, and at
// blocks[f + (n - f) % (blocks.size() - f)] after (the step allocates at
// least one block): ToLayoutPlan makes the caching allocator's plan of it
// (Note [Following a layout plan] in allocator/sources/planned_range.h).
struct RepeatingStepsLayout {
  TraceLayout layout;                // of the trace up to the repeating step's end
  size_t repeating_step = 0;         // 1-based; step 1 holds what came before its end too
  size_t first_step_allocation = 0;  // f: the step's first allocation, an index into layout.arena.blocks
};

// `step_end_times` as RecordedRun's (an event belongs to the first step whose
// end time it does not pass). Errors: NotFound when no recorded step is
// repeated by all later ones; FailedPrecondition, naming the step and the
// allocation's line, when that step leaves a block of its own live at its
// end; and LayoutTrace's.
absl::StatusOr<RepeatingStepsLayout> LayoutRepeatingSteps(const AllocationTrace& trace,
                                                          std::span<const uint64_t> step_end_times,
                                                          uint64_t page_bytes = uint64_t{2} << 20,
                                                          ArenaOrder order = ArenaOrder::kSize);

// LayoutRepeatingSteps in both orders: the layout whose pages peak lower,
// then whose buffer is smaller (neither order wins on every recorded run).
absl::StatusOr<RepeatingStepsLayout> LayoutRepeatingStepsEitherOrder(const AllocationTrace& trace,
                                                                     std::span<const uint64_t> step_end_times,
                                                                     uint64_t page_bytes = uint64_t{2} << 20);

// The plan the caching allocator follows (allocator/layout_plan.h): the
// layout's blocks of at least one byte (an allocator counts no empty
// request), repeating from the step's first allocation.
LayoutPlan ToLayoutPlan(const RepeatingStepsLayout& steps);

// InvalidArgument naming the first allocation (of at least one byte) on a
// stream other than the first one's: an allocator follows a plan on its first
// request's stream only, so a plan of such a trace would be left at the first
// request on another (Note [Following a layout plan] in
// allocator/sources/planned_range.h).
absl::Status CheckPlanFollowsOneStream(const AllocationTrace& trace);

}  // namespace headroom

#endif  // HEADROOM_LAYOUT_TRACE_LAYOUT_H_

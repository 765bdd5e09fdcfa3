// A scheduled graph's allocation sequence as an allocation trace, and RMM's
// logging_resource_adaptor CSV for any trace: what `headroom replay` reads
// (replay/allocation_trace.h), so a plan or an estimate can be replayed
// through the caching allocator like a recorded run.
//
//   HEADROOM_ASSIGN_OR_RETURN(AllocationTrace trace, PlanAllocationTrace(scheduled, {}));
//   std::ofstream("plan.rmm.csv") << FormatRmmLog(trace);   // for `headroom replay plan.rmm.csv`
//   ReplayTrace(trace, options)->peak_live_bytes == ProfileMemory(scheduled).peak_bytes
//
// A caller that interleaves allocations of its own (the estimator's resident
// state and optimizer temporaries, estimators/step_replay.h) walks the same
// order through GraphEventOrder.
//
// Note [Plan trace order]
// Each counted tensor (ProfileOptions, as ProfileMemory counts them) is
// allocated right before its first op and freed right after its last op
// (Note [Liveness rule] in graph/liveness.h); tensors that live for the
// whole step are allocated before op 0 and freed after the last op. At op
// i the trace first allocates every tensor whose life begins at i, then
// frees every tensor whose life ends at i, each in TensorId order; so after
// op i's allocations exactly the tensors ProfileMemory counts as live
// during op i are live, and the trace's peak of live bytes is ProfileMemory's
// peak_bytes. An op's frees come before the next op's allocations, as a
// framework frees a dead tensor before it runs the next kernel.
// Time is the op index in nanoseconds (op 12 at 0.000000012 s), one thread
// (1) and the default stream (0x0). Pointers are fake but deterministic:
// each tensor gets its own 512-byte-aligned address from 0x7f0000000000 up,
// in TensorId order, as if nothing were reused; a replay uses them only to
// match frees to allocations. A 0-byte tensor gets the null pointer, as
// PyTorch and RMM answer a 0-byte request (Note [Zero-byte allocations] in
// replay/trace_replay.h).
#ifndef HEADROOM_REPLAY_GRAPH_TRACE_H_
#define HEADROOM_REPLAY_GRAPH_TRACE_H_

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "graph/graph.h"
#include "graph/liveness.h"
#include "replay/allocation_trace.h"

namespace headroom {

inline constexpr uint64_t kPlanTraceBaseAddress = 0x7f0000000000;

// The tensors whose storage begins and ends at each op, in TensorId order
// (Note [Plan trace order]): Beginning(i) and Ending(i) list op i's
// allocations and frees. Built by a counting sort, O(ops + tensors).
class GraphEventOrder {
 public:
  // `lifetimes` as ComputeLifetimes returns them for `step`.
  GraphEventOrder(const Graph& step, std::span<const TensorLifetime> lifetimes);

  std::span<const TensorId> Beginning(OpId op) const {
    return std::span<const TensorId>(beginning_).subspan(begin_at_[op], begin_at_[op + 1] - begin_at_[op]);
  }
  std::span<const TensorId> Ending(OpId op) const {
    return std::span<const TensorId>(ending_).subspan(end_at_[op], end_at_[op + 1] - end_at_[op]);
  }
  size_t num_allocations() const { return beginning_.size(); }

 private:
  std::vector<uint32_t> begin_at_, end_at_;  // offsets into beginning_ and ending_ per op, and one past the last
  std::vector<TensorId> beginning_, ending_;
};

// The allocations and frees of `step` (any graph in program order, such as
// a materialized schedule) in Note [Plan trace order]; source is the
// graph's name, format "rmm-csv". Errors: the graph's CheckBounds().
absl::StatusOr<AllocationTrace> PlanAllocationTrace(const Graph& step, const ProfileOptions& options = {});

// `trace` as an RMM log: the header Thread,Time,Action,Pointer,Size,Stream,
// then one line per event (actions allocate, free, allocate failure; time
// in seconds with nanosecond digits; pointer and stream in hex). Thread is
// 1 throughout, since traces do not record it. ParseRmmLog reads it back to
// the same events.
std::string FormatRmmLog(const AllocationTrace& trace);

}  // namespace headroom

#endif  // HEADROOM_REPLAY_GRAPH_TRACE_H_

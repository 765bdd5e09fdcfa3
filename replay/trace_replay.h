// Replays a recorded allocation trace through the caching allocator on a
// simulated device, to predict what a job reserves under a given
// HEADROOM_ALLOC_CONF before it runs (or after it ran out of memory).
//
//   ReplayOptions options{.capacity_bytes = 80 * kGiB, .allocator = *ParseAllocConf("expandable_segments:True")};
//   HEADROOM_ASSIGN_OR_RETURN(ReplayResult r, ReplayTrace(trace, options));
//   r.peak_reserved_bytes / r.peak_allocated_bytes   // overhead of the policy at its worst
//
// Trace pointers only identify allocations; the replay allocates at the
// simulated device's own addresses. Streams keep their identity (one
// simulated stream per recorded stream). Frees of pointers the trace never
// allocated (a trace that starts mid-run), repeated allocations of a live
// pointer, and size mismatches are anomalies: counted, the first few
// reported with their line, and fatal only with `strict`. Allocations the
// replay cannot serve count as OOMs and the replay goes on. Any other error
// (a size beyond any device) names the trace line.
//
// Note [Zero-byte allocations]
// PyTorch's caching allocator and RMM's resources answer a 0-byte request
// with a null pointer that occupies nothing, and freeing null is a no-op in
// every API. So a 0-byte allocation recorded at pointer 0, and every free of
// pointer 0, is skipped. A 0-byte allocation recorded at a non-null pointer
// (an allocator that hands out unique pointers for 0 bytes) is replayed as
// a live allocation of 0 bytes, so that its later free matches it rather
// than being reported as a free of a pointer the trace never allocated.
// Neither takes device memory.
#ifndef HEADROOM_REPLAY_TRACE_REPLAY_H_
#define HEADROOM_REPLAY_TRACE_REPLAY_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "replay/allocation_trace.h"
#include "allocator/allocator_options.h"
#include "allocator/memory_stats.h"

namespace headroom {

struct ReplayOptions {
  // The simulated device; at most kMaxSimulatedCapacity (64 PiB).
  uint64_t capacity_bytes = uint64_t{80} << 30;
  uint64_t map_granularity = uint64_t{2} << 20;
  AllocatorOptions allocator;
  bool strict = false;
  size_t max_reported_anomalies = 5;
  // End the replay at the first allocation it cannot serve (a question of
  // whether the trace fits, not of how much it needs).
  bool stop_at_first_oom = false;
  // Trace times (TraceEvent::time_ns) at which steps end, ascending: the
  // allocator's statistics are kept at each (ReplayResult::step_stats), to
  // tell a steady loop from its first steps.
  std::vector<uint64_t> step_end_times;
};

// The first allocation a replay could not serve, and what the allocator held
// then (after its out-of-memory path had flushed what it could): free bytes
// it could not use are fragmentation; without them, the live bytes alone did
// not fit.
struct ReplayOutOfMemory {
  std::string location;         // "trace.csv:12" or "snapshot.json:device_traces entry 12"
  uint64_t capacity_bytes = 0;  // the simulated device's
  uint64_t requested_bytes = 0;
  uint64_t live_bytes = 0;      // the trace's live bytes before the request
  uint64_t reserved_bytes = 0;
  uint64_t free_cached_bytes = 0;         // reserved and neither allocated nor waiting for a stream
  uint64_t largest_free_block_bytes = 0;  // the largest of those free blocks
};

struct ReplayResult {
  uint64_t allocations = 0;
  uint64_t frees = 0;
  uint64_t trace_failures = 0;       // "allocate failure" / "oom" entries in the trace itself
  uint64_t peak_live_bytes = 0;      // the trace's own peak of requested bytes
  uint64_t peak_allocated_bytes = 0; // after rounding
  uint64_t peak_reserved_bytes = 0;
  double reserved_to_allocated = 0;  // peak reserved / peak allocated
  double reserved_to_live = 0;       // peak reserved / the trace's peak live bytes
  // External fragmentation (1 - largest free / total free) when reserved
  // memory reached its peak.
  double fragmentation_at_peak = 0;
  int64_t alloc_retries = 0;
  int64_t ooms = 0;
  uint64_t anomalies = 0;
  std::vector<std::string> anomaly_examples;
  std::optional<ReplayOutOfMemory> first_oom;
  MemoryStats final_stats;
  // With a layout plan (AllocatorOptions::layout_plan): why the replay left
  // it, empty if it never did (CachingAllocator::PlanDeparture).
  std::string plan_departure;
  // The statistics after the last event of each step of
  // ReplayOptions::step_end_times (the final ones for steps the replay did
  // not reach).
  std::vector<MemoryStats> step_stats;
};

absl::StatusOr<ReplayResult> ReplayTrace(const AllocationTrace& trace, const ReplayOptions& options);

// Where an event of `trace` was recorded, for messages: "trace.csv:12" or
// "snapshot.json:device_traces entry 12".
std::string TraceLocation(const AllocationTrace& trace, const TraceEvent& event);

inline constexpr uint64_t kSmallestDeviceStep = uint64_t{2} << 20;

// The smallest simulated device, in whole steps of `step` bytes, on which
// the trace runs under `options.allocator` with no out-of-memory error: a
// bisection from the trace's live peak up to `options.capacity_bytes` (the
// other fields of `options` are kept), which first tries what the trace
// reserves there. NotFound if it does not run on that device either.
absl::StatusOr<uint64_t> SmallestDevice(const AllocationTrace& trace, ReplayOptions options,
                                        uint64_t step = kSmallestDeviceStep);

}  // namespace headroom

#endif  // HEADROOM_REPLAY_TRACE_REPLAY_H_

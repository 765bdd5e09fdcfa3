#include "replay/trace_replay.h"

#include <algorithm>
#include <limits>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_format.h"
#include "allocator/caching_allocator.h"
#include "allocator/simulated/simulated_backend.h"
#include "common/checked_math.h"
#include "common/status_macros.h"
#include "common/units.h"

namespace headroom {

std::string TraceLocation(const AllocationTrace& trace, const TraceEvent& event) {
  return absl::StrFormat("%s:%s%d", trace.source, trace.format == "rmm-csv" ? "" : "device_traces entry ",
                         event.line);
}

absl::StatusOr<ReplayResult> ReplayTrace(const AllocationTrace& trace, const ReplayOptions& options) {
  HEADROOM_ASSIGN_OR_RETURN(
      std::unique_ptr<SimulatedBackend> device,
      SimulatedBackend::Create({.name = "simulated (replay)",
                                .capacity_bytes = options.capacity_bytes,
                                .map_granularity = options.map_granularity}));
  HEADROOM_ASSIGN_OR_RETURN(std::unique_ptr<CachingAllocator> allocator,
                            CachingAllocator::Create(device.get(), options.allocator));
  ReplayResult result;
  struct Live {
    DeviceAddress address;
    uint64_t size;
  };
  absl::flat_hash_map<uint64_t, Live> live;            // trace pointer -> replayed allocation
  absl::flat_hash_map<uint64_t, uint64_t> failed;      // trace pointer -> size, its allocation failed here
  absl::flat_hash_map<uint64_t, StreamHandle> streams = {{0, kDefaultStream}};
  // Bytes the trace itself holds live, whether or not this replay could
  // serve them, so that peak_live_bytes describes the trace, not the run.
  uint64_t live_bytes = 0;
  int64_t peak_reserved_seen = -1;

  auto location = [&](const TraceEvent& event) { return TraceLocation(trace, event); };
  auto anomaly = [&](const TraceEvent& event, std::string what) -> absl::Status {
    const std::string where = absl::StrFormat("%s: %s", location(event), what);
    if (options.strict) return absl::DataLossError(absl::StrFormat("%s (--strict)", where));
    ++result.anomalies;
    if (result.anomaly_examples.size() < options.max_reported_anomalies) result.anomaly_examples.push_back(where);
    return absl::OkStatus();
  };
  auto stream_for = [&](uint64_t recorded) -> absl::StatusOr<StreamHandle> {
    auto it = streams.find(recorded);
    if (it != streams.end()) return it->second;
    HEADROOM_ASSIGN_OR_RETURN(StreamHandle created, device->CreateStream());
    streams[recorded] = created;
    return created;
  };

  if (!std::is_sorted(options.step_end_times.begin(), options.step_end_times.end())) {
    return absl::InvalidArgumentError(absl::StrFormat("%s: step end times are not in ascending order", trace.source));
  }
  size_t next_step = 0;  // the step whose end the replay has not passed yet
  auto end_steps_before = [&](uint64_t time_ns) {
    while (next_step < options.step_end_times.size() && time_ns > options.step_end_times[next_step]) {
      result.step_stats.push_back(allocator->GetStats());
      ++next_step;
    }
  };
  bool stopped = false;
  for (const TraceEvent& event : trace.events) {
    if (stopped) break;
    end_steps_before(event.time_ns);
    switch (event.op) {
      case TraceOp::kAllocateFailure:
        ++result.trace_failures;
        break;
      case TraceOp::kAllocate: {
        if (live.contains(event.pointer)) {
          HEADROOM_RETURN_IF_ERROR(
              anomaly(event, absl::StrFormat("allocation of 0x%x, which is already live (free missing)", event.pointer)));
          const Live old = live[event.pointer];
          HEADROOM_RETURN_IF_ERROR(allocator->Free(old.address));
          live_bytes -= old.size;
          live.erase(event.pointer);
        }
        // Note [Zero-byte allocations]
        if (event.size == 0 && event.pointer == 0) break;
        HEADROOM_ASSIGN_OR_RETURN(StreamHandle stream, stream_for(event.stream));
        absl::StatusOr<DeviceAddress> address = allocator->Allocate(event.size, stream);
        live_bytes += event.size;
        result.peak_live_bytes = std::max(result.peak_live_bytes, live_bytes);
        if (!address.ok()) {
          if (!absl::IsResourceExhausted(address.status())) {
            return absl::Status(address.status().code(),
                                absl::StrFormat("%s: allocation of %d bytes: %s", location(event), event.size,
                                                address.status().message()));
          }
          if (!result.first_oom.has_value()) {
            const MemoryStats stats = allocator->GetStats();
            result.first_oom = ReplayOutOfMemory{
                .location = location(event),
                .capacity_bytes = options.capacity_bytes,
                .requested_bytes = event.size,
                .live_bytes = live_bytes - event.size,
                .reserved_bytes = static_cast<uint64_t>(stats.reserved_bytes[kAllPools].current),
                .free_cached_bytes = stats.total_free_bytes,
                .largest_free_block_bytes = stats.largest_free_block_bytes};
          }
          failed[event.pointer] = event.size;
          if (options.stop_at_first_oom) stopped = true;
          break;
        }
        ++result.allocations;
        live[event.pointer] = {*address, event.size};
        break;
      }
      case TraceOp::kFree: {
        // A free of null: Note [Zero-byte allocations].
        if (event.pointer == 0 && !live.contains(0) && !failed.contains(0)) break;
        auto it = live.find(event.pointer);
        if (it == live.end()) {
          if (auto f = failed.find(event.pointer); f != failed.end()) {  // its allocation failed in this replay
            live_bytes -= f->second;
            failed.erase(f);
            break;
          }
          HEADROOM_RETURN_IF_ERROR(
              anomaly(event, absl::StrFormat("free of 0x%x, which the trace never allocated", event.pointer)));
          break;
        }
        if (event.size != 0 && event.size != it->second.size) {
          HEADROOM_RETURN_IF_ERROR(anomaly(
              event, absl::StrFormat("free of 0x%x with size %d, allocated with size %d", event.pointer, event.size,
                                     it->second.size)));
        }
        HEADROOM_RETURN_IF_ERROR(allocator->Free(it->second.address));
        ++result.frees;
        live_bytes -= it->second.size;
        live.erase(it);
        break;
      }
    }
    // Fragmentation is sampled whenever reserved memory reaches a new peak,
    // which happens at most once per segment growth.
    if (event.op == TraceOp::kAllocate && allocator->PeakReservedBytes() > peak_reserved_seen) {
      const MemoryStats stats = allocator->GetStats();
      peak_reserved_seen = stats.reserved_bytes[kAllPools].peak;
      result.fragmentation_at_peak = stats.external_fragmentation;
    }
  }
  end_steps_before(std::numeric_limits<uint64_t>::max());
  result.final_stats = allocator->GetStats();
  result.plan_departure = allocator->PlanDeparture();
  const MemoryStats& s = result.final_stats;
  result.peak_allocated_bytes = static_cast<uint64_t>(s.allocated_bytes[kAllPools].peak);
  result.peak_reserved_bytes = static_cast<uint64_t>(s.reserved_bytes[kAllPools].peak);
  result.reserved_to_allocated = result.peak_allocated_bytes == 0
                                     ? 0.0
                                     : static_cast<double>(result.peak_reserved_bytes) /
                                           static_cast<double>(result.peak_allocated_bytes);
  result.reserved_to_live = result.peak_live_bytes == 0 ? 0.0
                                                        : static_cast<double>(result.peak_reserved_bytes) /
                                                              static_cast<double>(result.peak_live_bytes);
  result.alloc_retries = s.num_alloc_retries;
  result.ooms = s.num_ooms;
  return result;
}

absl::StatusOr<uint64_t> SmallestDevice(const AllocationTrace& trace, ReplayOptions options, uint64_t step) {
  if (step == 0) return absl::InvalidArgumentError("smallest device: a step of 0 bytes");
  options.stop_at_first_oom = true;
  HEADROOM_ASSIGN_OR_RETURN(const ReplayResult largest, ReplayTrace(trace, options));
  if (largest.ooms > 0) {
    return absl::NotFoundError(absl::StrFormat("%s does not run on a device of %s", trace.source,
                                               FormatBytes(options.capacity_bytes)));
  }
  auto runs_on = [&](uint64_t capacity) -> absl::StatusOr<bool> {
    options.capacity_bytes = capacity;
    HEADROOM_ASSIGN_OR_RETURN(const ReplayResult r, ReplayTrace(trace, options));
    return r.ooms == 0;
  };
  // Below the live peak nothing runs; the device given does.
  uint64_t fails = largest.peak_live_bytes == 0 ? 0 : (largest.peak_live_bytes - 1) / step * step;
  uint64_t runs = options.capacity_bytes;
  // What the run reserved there is usually close to the answer: try it first.
  if (const uint64_t reserved = RoundUp(largest.peak_reserved_bytes, step); reserved > fails && reserved < runs) {
    HEADROOM_ASSIGN_OR_RETURN(const bool ok, runs_on(reserved));
    (ok ? runs : fails) = reserved;
  }
  while (runs - fails > step) {
    const uint64_t mid = fails + std::max<uint64_t>(1, (runs - fails) / step / 2) * step;
    HEADROOM_ASSIGN_OR_RETURN(const bool ok, runs_on(mid));
    (ok ? runs : fails) = mid;
  }
  return runs;
}

}  // namespace headroom

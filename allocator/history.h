// A bounded record of what the allocator did, for snapshots and replay.
//
//   HistoryRing history(10000);       // keeps the newest 10000 entries
//   history.Add({.action = TraceAction::kAlloc, .address = p, .size = n, ...});
//   for (const TraceEntry& e : history.Entries()) ...   // oldest first
//
// Off by default (capacity 0: Add is a no-op): recording costs a clock read
// per event. Actions and their meaning follow PyTorch's device_traces
// (torch.cuda.memory._snapshot()): alloc, free_requested (the caller freed),
// free_completed (the block is reusable: all stream uses finished),
// segment_alloc/segment_free (device Malloc/Free), segment_map/segment_unmap
// (expandable segments), oom.
#ifndef HEADROOM_ALLOCATOR_HISTORY_H_
#define HEADROOM_ALLOCATOR_HISTORY_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>
#include <vector>

#include "allocator/device_backend.h"

namespace headroom {

enum class TraceAction {
  kAlloc,
  kFreeRequested,
  kFreeCompleted,
  kSegmentAlloc,
  kSegmentFree,
  kSegmentMap,
  kSegmentUnmap,
  kOom,
};

// PyTorch's spelling: "alloc", "free_requested", ..., "oom".
std::string_view TraceActionName(TraceAction action);
std::optional<TraceAction> TraceActionFromName(std::string_view name);

struct TraceEntry {
  TraceAction action = TraceAction::kAlloc;
  DeviceAddress address = 0;
  uint64_t size = 0;
  StreamHandle stream;
  uint64_t time_ns = 0;      // backend clock
  uint64_t device_free = 0;  // kOom only: free bytes the device reported
};

// The most entries a history may keep (HEADROOM_ALLOC_CONF history_entries,
// headroom_record_history): the ring grows as entries come, but a bound
// keeps a typo (or SIZE_MAX) from promising more host memory than exists.
inline constexpr size_t kMaxHistoryEntries = size_t{1} << 32;

class HistoryRing {
 public:
  explicit HistoryRing(size_t capacity = 0) { SetCapacity(capacity); }

  // Drops the recorded entries; 0 turns recording off.
  void SetCapacity(size_t capacity);
  size_t capacity() const { return capacity_; }
  bool enabled() const { return capacity_ > 0; }

  void Add(const TraceEntry& entry);
  // Oldest first.
  std::vector<TraceEntry> Entries() const;
  // Entries overwritten since recording started.
  uint64_t dropped() const { return dropped_; }

 private:
  size_t capacity_ = 0;
  std::vector<TraceEntry> entries_;
  size_t next_ = 0;  // slot of the next entry once full
  uint64_t dropped_ = 0;
};

}  // namespace headroom

#endif  // HEADROOM_ALLOCATOR_HISTORY_H_

// A picture of the allocator's memory, in the structure of PyTorch's
// torch.cuda.memory._snapshot(), so that PyTorch's memory_viz can draw it.
//
//   AllocatorSnapshot snap = allocator->TakeSnapshot();
//   std::string json = SnapshotToJson(snap).dump();
//   // {"segments": [{"address": ..., "total_size": ..., "blocks": [...]}],
//   //  "device_traces": [[{"action": "alloc", "addr": ..., ...}]], ...}
//
// Expandable segments appear as one segment per run of mapped pages (PyTorch
// shows them the same way), flagged "is_expandable".
#ifndef HEADROOM_ALLOCATOR_SNAPSHOT_H_
#define HEADROOM_ALLOCATOR_SNAPSHOT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "allocator/device_backend.h"
#include "allocator/history.h"
#include "nlohmann/json.hpp"

namespace headroom {

enum class BlockState { kActiveAllocated, kActivePendingFree, kInactive };

struct BlockSnapshot {
  DeviceAddress address = 0;
  uint64_t size = 0;
  uint64_t requested_size = 0;
  BlockState state = BlockState::kInactive;
};

struct SegmentSnapshot {
  DeviceAddress address = 0;
  uint64_t total_size = 0;
  uint64_t allocated_size = 0;
  uint64_t active_size = 0;
  uint64_t requested_size = 0;
  StreamHandle stream;
  bool small_pool = false;
  bool expandable = false;
  std::vector<BlockSnapshot> blocks;
};

struct AllocatorSnapshot {
  int device = 0;
  std::vector<SegmentSnapshot> segments;
  std::vector<TraceEntry> trace;
  nlohmann::json settings = nlohmann::json::object();
};

nlohmann::json SnapshotToJson(const AllocatorSnapshot& snapshot);

}  // namespace headroom

#endif  // HEADROOM_ALLOCATOR_SNAPSHOT_H_

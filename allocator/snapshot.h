// A picture of the allocator's memory, in the structure of PyTorch's
// torch.cuda.memory._snapshot(), so that PyTorch's memory_viz can draw it.
//
//   AllocatorSnapshot snap = allocator->TakeSnapshot();
//   std::string json = SnapshotToJson(snap).dump();
//   // {"segments": [{"address": ..., "total_size": ..., "blocks": [...]}],
//   //  "device_traces": [[{"action": "alloc", "addr": ..., ...}]], ...}
//
// Expandable segments appear as one segment per run of mapped pages (PyTorch
// shows them the same way), flagged "is_expandable". A stitched block (Note
// [Stitched blocks] in sources/stitched_ranges.h) is a segment of its own, flagged
// "is_stitched", mapped ("segment_map") before its alloc and unmapped
// ("segment_unmap") after its free completes, as memory_viz expects of any
// block. Its pieces stay blocks of their segments in a state of their own,
// "stitched_part": not free, but not counted as allocations either (the
// stitched block counts their bytes; tools that know PyTorch's three states
// see no allocation there), and no event names them. The address range of
// a layout plan (Note [Following a layout plan]) shows, like an expandable
// segment, one segment per run of mapped pages, flagged "is_planned".
#ifndef HEADROOM_ALLOCATOR_SNAPSHOT_H_
#define HEADROOM_ALLOCATOR_SNAPSHOT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "allocator/device_backend.h"
#include "allocator/history.h"
#include "nlohmann/json.hpp"

namespace headroom {

enum class BlockState { kActiveAllocated, kActivePendingFree, kInactive, kStitchedPart };

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
  bool stitched = false;
  bool planned = false;
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

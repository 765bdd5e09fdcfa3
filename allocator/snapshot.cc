#include "allocator/snapshot.h"

namespace headroom {
namespace {

const char* StateName(BlockState state) {
  switch (state) {
    case BlockState::kActiveAllocated: return "active_allocated";
    case BlockState::kActivePendingFree: return "active_pending_free";
    case BlockState::kInactive: return "inactive";
    case BlockState::kStitchedPart: return "stitched_part";
  }
  return "inactive";
}

}  // namespace

nlohmann::json SnapshotToJson(const AllocatorSnapshot& snapshot) {
  using nlohmann::json;
  json segments = json::array();
  for (const SegmentSnapshot& segment : snapshot.segments) {
    json blocks = json::array();
    for (const BlockSnapshot& block : segment.blocks) {
      blocks.push_back({{"address", block.address},
                        {"size", block.size},
                        {"requested_size", block.requested_size},
                        {"state", StateName(block.state)},
                        {"frames", json::array()}});
    }
    segments.push_back({{"device", snapshot.device},
                        {"address", segment.address},
                        {"total_size", segment.total_size},
                        {"allocated_size", segment.allocated_size},
                        {"active_size", segment.active_size},
                        {"requested_size", segment.requested_size},
                        {"stream", segment.stream.value},
                        {"segment_type", segment.small_pool ? "small" : "large"},
                        {"segment_pool_id", json::array({0, 0})},
                        {"is_expandable", segment.expandable},
                        {"frames", json::array()},
                        {"blocks", blocks}});
    if (segment.stitched) segments.back()["is_stitched"] = true;
    if (segment.planned) segments.back()["is_planned"] = true;
  }
  json trace = json::array();
  for (const TraceEntry& entry : snapshot.trace) {
    json item = {{"action", std::string(TraceActionName(entry.action))},
                 {"addr", entry.address},
                 {"size", entry.size},
                 {"stream", entry.stream.value},
                 {"time_us", entry.time_ns / 1000},
                 {"frames", json::array()}};
    if (entry.action == TraceAction::kOom) item["device_free"] = entry.device_free;
    trace.push_back(std::move(item));
  }
  json device_traces = json::array();
  for (int d = 0; d < snapshot.device; ++d) device_traces.push_back(json::array());
  device_traces.push_back(std::move(trace));
  return {{"segments", segments}, {"device_traces", device_traces}, {"allocator_settings", snapshot.settings}};
}

}  // namespace headroom

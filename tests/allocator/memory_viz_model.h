// A model of how PyTorch's memory_viz (torch/utils/viz/MemoryViz.js, its
// "Allocator State History" view) rebuilds the memory at each event of a
// snapshot: it starts from the snapshot's segments and active blocks and
// undoes device_traces from the newest event back. The view fails (a
// TypeError in the browser) where an event names a block or segment the
// state lacks, and draws nonsense where a block lies outside every segment.
// DrawableByMemoryViz undoes every event and checks the state after each, so
// a snapshot it accepts draws at every event; with `history_from_start` (the
// history holds every event since the allocator was made) nothing may remain
// once all are undone.
#ifndef HEADROOM_TESTS_ALLOCATOR_MEMORY_VIZ_MODEL_H_
#define HEADROOM_TESTS_ALLOCATOR_MEMORY_VIZ_MODEL_H_

#include <cstdint>
#include <iterator>
#include <map>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_format.h"
#include "nlohmann/json.hpp"

namespace headroom::testing {

inline absl::Status DrawableByMemoryViz(const nlohmann::json& snapshot, bool history_from_start = false,
                                        int device = 0) {
  struct Segment {
    uint64_t size;
    uint64_t stream;
  };
  struct Block {
    uint64_t size;
    bool free_requested;
  };
  std::map<uint64_t, Segment> segments;  // by address
  std::map<uint64_t, Block> blocks;
  for (const nlohmann::json& s : snapshot.at("segments")) {
    if (s.at("device") != device) continue;
    segments[s.at("address")] = {s.at("total_size"), s.at("stream")};
    for (const nlohmann::json& b : s.at("blocks")) {
      const std::string state = b.at("state");
      if (state == "active_allocated" || state == "active_pending_free") {
        blocks[b.at("address")] = {b.at("size"), state == "active_pending_free"};
      }
    }
  }
  auto containing = [&](uint64_t address, uint64_t size) -> std::map<uint64_t, Segment>::iterator {
    auto it = segments.upper_bound(address);
    if (it == segments.begin()) return segments.end();
    --it;
    return address + size <= it->first + it->second.size ? it : segments.end();
  };
  auto overlaps = [&](uint64_t address, uint64_t size) {
    auto it = segments.lower_bound(address + size);
    return it != segments.begin() && std::prev(it)->first + std::prev(it)->second.size > address;
  };
  // The state at each event: every block drawn lies in one segment.
  auto check = [&](const std::string& when) -> absl::Status {
    for (const auto& [address, block] : blocks) {
      if (containing(address, block.size) == segments.end()) {
        return absl::FailedPreconditionError(
            absl::StrFormat("%s: block 0x%x (%d bytes) lies in no segment", when, address, block.size));
      }
    }
    return absl::OkStatus();
  };
  if (absl::Status s = check("at the snapshot"); !s.ok()) return s;

  const nlohmann::json& events = snapshot.at("device_traces").at(device);
  for (size_t i = events.size(); i-- > 0;) {
    const nlohmann::json& e = events[i];
    const std::string action = e.at("action");
    const uint64_t address = e.at("addr");
    const uint64_t size = e.at("size");
    const std::string when = absl::StrFormat("before event %d (%s 0x%x)", i, action, address);
    if (action == "alloc") {
      blocks.erase(address);
    } else if (action == "free_requested") {
      auto it = blocks.find(address);
      if (it == blocks.end()) return absl::FailedPreconditionError(when + ": no such block");
      it->second.free_requested = false;
    } else if (action == "free_completed") {
      blocks[address] = {size, true};
    } else if (action == "segment_free" || action == "segment_unmap") {
      // Undone: the range comes back; an unmapped range joins its neighbours of the same stream.
      if (overlaps(address, size)) return absl::FailedPreconditionError(when + ": the range overlaps a segment");
      const uint64_t stream = e.at("stream");
      auto it = segments.emplace(address, Segment{size, stream}).first;
      if (action == "segment_unmap") {
        if (auto next = std::next(it);
            next != segments.end() && address + size == next->first && next->second.stream == stream) {
          it->second.size += next->second.size;
          segments.erase(next);
        }
        if (it != segments.begin()) {
          if (auto prev = std::prev(it); prev->first + prev->second.size == address && prev->second.stream == stream) {
            prev->second.size += it->second.size;
            segments.erase(it);
          }
        }
      }
    } else if (action == "segment_alloc") {
      auto it = segments.find(address);
      if (it == segments.end()) return absl::FailedPreconditionError(when + ": no such segment");
      segments.erase(it);
    } else if (action == "segment_map") {
      auto it = containing(address, size);
      if (it == segments.end()) return absl::FailedPreconditionError(when + ": no segment holds the range");
      const auto [start, segment] = *it;
      segments.erase(it);
      if (start < address) segments[start] = {address - start, segment.stream};
      if (address + size < start + segment.size) {
        segments[address + size] = {start + segment.size - address - size, segment.stream};
      }
    }
    if (absl::Status s = check(when); !s.ok()) return s;
  }
  if (history_from_start && !segments.empty()) {
    return absl::FailedPreconditionError(
        absl::StrFormat("before the first event: segment 0x%x was never mapped", segments.begin()->first));
  }
  if (history_from_start && !blocks.empty()) {
    return absl::FailedPreconditionError(
        absl::StrFormat("before the first event: block 0x%x was never allocated", blocks.begin()->first));
  }
  return absl::OkStatus();
}

}  // namespace headroom::testing

#endif  // HEADROOM_TESTS_ALLOCATOR_MEMORY_VIZ_MODEL_H_

#include "planner/trace_layout.h"

#include <algorithm>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_format.h"
#include "common/status_macros.h"

namespace headroom {
namespace {

// A block of the layout starting or ending at an event of the trace.
struct Change {
  size_t event;
  int32_t request;
  bool allocate;
};

// Pages touched by the live blocks of a layout, as blocks come and go
// (Note [Planned trace layout]: only a block's end pages can be shared).
class PageCount {
 public:
  explicit PageCount(uint64_t page_bytes) : page_bytes_(page_bytes) {}

  void Add(const ArenaBlock& block) { Update(block, true); }
  void Remove(const ArenaBlock& block) { Update(block, false); }
  uint64_t pages() const { return interior_pages_ + end_pages_; }

 private:
  void Update(const ArenaBlock& block, bool add) {
    if (block.size == 0) return;
    const uint64_t first = block.offset / page_bytes_;
    const uint64_t last = (block.offset + block.size - 1) / page_bytes_;
    const uint64_t interior = last > first + 1 ? last - first - 1 : 0;
    interior_pages_ = add ? interior_pages_ + interior : interior_pages_ - interior;
    Touch(first, add);
    if (last != first) Touch(last, add);
  }
  void Touch(uint64_t page, bool add) {
    uint32_t& blocks = blocks_on_end_page_[page];
    if (add) {
      if (blocks++ == 0) ++end_pages_;
    } else if (--blocks == 0) {
      --end_pages_;
      blocks_on_end_page_.erase(page);
    }
  }

  uint64_t page_bytes_;
  uint64_t interior_pages_ = 0;  // pages inside one block, which no other live block touches
  uint64_t end_pages_ = 0;       // pages holding a live block's first or last byte
  absl::flat_hash_map<uint64_t, uint32_t> blocks_on_end_page_;
};

}  // namespace

absl::StatusOr<TraceLayout> LayoutTrace(const AllocationTrace& trace, uint64_t page_bytes) {
  if (page_bytes == 0 || page_bytes % kDefaultArenaAlignment != 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "page size %d bytes: a page is a positive multiple of %d bytes", page_bytes, kDefaultArenaAlignment));
  }
  std::vector<ArenaRequest> requests;
  std::vector<Change> changes;
  absl::flat_hash_map<uint64_t, int32_t> live;  // the trace's pointer -> its request
  auto close = [&](auto it, size_t event) {
    // Its last moment is the last allocation before the free.
    requests[it->second].last = static_cast<OpId>(requests.size()) - 1;
    changes.push_back({event, it->second, false});
    live.erase(it);
  };
  for (size_t event = 0; event < trace.events.size(); ++event) {
    const TraceEvent& e = trace.events[event];
    if (e.op == TraceOp::kAllocateFailure) continue;
    auto it = live.find(e.pointer);
    if (e.op == TraceOp::kFree) {
      if (it != live.end()) close(it, event);
      continue;
    }
    if (it != live.end()) close(it, event);  // allocated again while live: its free is missing
    if (e.size == 0 && e.pointer == 0) continue;
    if (requests.size() == kMaxGraphTensors) {
      return absl::OutOfRangeError(absl::StrFormat("%s: more than %d allocations, the most a planned layout takes",
                                                   trace.source, kMaxGraphTensors));
    }
    const auto id = static_cast<int32_t>(requests.size());
    requests.push_back({.id = id, .first = id, .last = -1, .bytes = e.size});
    changes.push_back({event, id, true});
    live[e.pointer] = id;
  }
  for (const auto& [pointer, id] : live) requests[id].last = static_cast<OpId>(requests.size()) - 1;

  absl::StatusOr<ArenaLayout> arena = LayoutArena(requests);
  if (!arena.ok()) {
    return absl::Status(arena.status().code(), absl::StrFormat("%s: %s", trace.source, arena.status().message()));
  }
  TraceLayout layout{.arena = *std::move(arena), .page_bytes = page_bytes};
  PageCount count(page_bytes);
  for (size_t i = 0; i < changes.size(); ++i) {
    const ArenaBlock& block = layout.arena.blocks[changes[i].request];
    changes[i].allocate ? count.Add(block) : count.Remove(block);
    const bool event_done = i + 1 == changes.size() || changes[i + 1].event != changes[i].event;
    if (event_done) layout.peak_page_bytes = std::max(layout.peak_page_bytes, count.pages() * page_bytes);
  }
  return layout;
}

}  // namespace headroom

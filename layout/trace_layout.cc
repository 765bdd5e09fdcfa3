#include "layout/trace_layout.h"

#include <algorithm>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_format.h"
#include "common/status_macros.h"
#include "replay/trace_replay.h"

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

// The blocks of events [0, end) of a trace (Note [Planned trace layout]):
// one request per allocation, and when each starts and ends.
struct TraceBlocks {
  std::vector<ArenaRequest> requests;
  std::vector<Change> changes;  // in event order
  std::vector<int32_t> live_at_end;
};

absl::StatusOr<TraceBlocks> CollectBlocks(const AllocationTrace& trace, size_t end) {
  TraceBlocks blocks;
  std::vector<ArenaRequest>& requests = blocks.requests;
  absl::flat_hash_map<uint64_t, int32_t> live;  // the trace's pointer -> its request
  auto close = [&](auto it, size_t event) {
    // Its last moment is the last allocation before the free.
    requests[it->second].last = static_cast<OpId>(requests.size()) - 1;
    blocks.changes.push_back({event, it->second, false});
    live.erase(it);
  };
  for (size_t event = 0; event < end; ++event) {
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
    blocks.changes.push_back({event, id, true});
    live[e.pointer] = id;
  }
  for (const auto& [pointer, id] : live) {
    requests[id].last = static_cast<OpId>(requests.size()) - 1;
    blocks.live_at_end.push_back(id);
  }
  std::sort(blocks.live_at_end.begin(), blocks.live_at_end.end());
  return blocks;
}

absl::StatusOr<TraceLayout> Layout(const AllocationTrace& trace, const TraceBlocks& blocks, uint64_t page_bytes,
                                   ArenaOrder order) {
  absl::StatusOr<ArenaLayout> arena = LayoutArena(blocks.requests, kDefaultArenaAlignment, order);
  if (!arena.ok()) {
    return absl::Status(arena.status().code(), absl::StrFormat("%s: %s", trace.source, arena.status().message()));
  }
  TraceLayout layout{.arena = *std::move(arena), .page_bytes = page_bytes};
  PageCount count(page_bytes);
  const std::vector<Change>& changes = blocks.changes;
  for (size_t i = 0; i < changes.size(); ++i) {
    const ArenaBlock& block = layout.arena.blocks[changes[i].request];
    changes[i].allocate ? count.Add(block) : count.Remove(block);
    const bool event_done = i + 1 == changes.size() || changes[i + 1].event != changes[i].event;
    if (event_done) layout.peak_page_bytes = std::max(layout.peak_page_bytes, count.pages() * page_bytes);
  }
  return layout;
}

absl::Status CheckPageSize(uint64_t page_bytes) {
  if (page_bytes == 0 || page_bytes % kDefaultArenaAlignment != 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "page size %d bytes: a page is a positive multiple of %d bytes", page_bytes, kDefaultArenaAlignment));
  }
  return absl::OkStatus();
}

// What a step does at one change, as steps compare (Note [Repeating steps]):
// an allocation of `size` bytes on `stream`, or the end of the block
// allocated `back` allocations before (back = 0 for an allocation).
struct StepToken {
  uint64_t size = 0;
  uint64_t stream = 0;
  int64_t back = 0;
  bool operator==(const StepToken&) const = default;
};

// The trace up to the end of the first step every later recorded step
// repeats, and where that step starts (Note [Repeating steps]): what both
// orders of a layout of repeating steps are made of.
struct RepeatingPrefix {
  TraceBlocks blocks;
  size_t repeating_step = 0;  // 0-based
  size_t first = 0;           // the step's first allocation
};

absl::StatusOr<RepeatingPrefix> FindRepeatingPrefix(const AllocationTrace& trace,
                                                    std::span<const uint64_t> step_end_times) {
  if (!std::is_sorted(step_end_times.begin(), step_end_times.end())) {
    return absl::InvalidArgumentError(absl::StrFormat("%s: step end times are not in ascending order", trace.source));
  }
  // Each step's events end at the first event past its end time.
  std::vector<size_t> step_end(step_end_times.size());
  for (size_t step = 0, event = 0; step < step_end_times.size(); ++step) {
    while (event < trace.events.size() && trace.events[event].time_ns <= step_end_times[step]) ++event;
    step_end[step] = event;
  }
  HEADROOM_ASSIGN_OR_RETURN(const TraceBlocks all, CollectBlocks(trace, trace.events.size()));
  std::vector<std::vector<StepToken>> steps(step_end.size());
  int64_t allocations = 0;
  for (size_t i = 0, step = 0; i < all.changes.size(); ++i) {
    const Change& change = all.changes[i];
    while (step < step_end.size() && change.event >= step_end[step]) ++step;
    if (step == step_end.size()) break;  // after the last step
    if (change.allocate) {
      ++allocations;
      steps[step].push_back({.size = all.requests[change.request].bytes, .stream = trace.events[change.event].stream});
    } else {
      steps[step].push_back({.back = allocations - change.request});
    }
  }
  // The first step that every later recorded step repeats, with at least one that does.
  const size_t n = steps.size();
  size_t r = n == 0 ? 0 : n - 1;  // 0-based
  while (r >= 1 && steps[r - 1] == steps.back()) --r;
  if (n < 2 || r == n - 1) {
    return absl::NotFoundError(
        absl::StrFormat("%s: no step of the %d recorded is repeated by every later one", trace.source, n));
  }
  if (std::none_of(steps[r].begin(), steps[r].end(), [](const StepToken& t) { return t.back == 0; })) {
    return absl::NotFoundError(
        absl::StrFormat("%s: step %d, which every later step repeats, allocates nothing", trace.source, r + 1));
  }

  HEADROOM_ASSIGN_OR_RETURN(TraceBlocks prefix, CollectBlocks(trace, step_end[r]));
  const size_t first = r == 0 ? 0 : static_cast<size_t>(std::count_if(
      prefix.changes.begin(), prefix.changes.end(),
      [&](const Change& c) { return c.allocate && c.event < step_end[r - 1]; }));
  for (int32_t id : prefix.live_at_end) {
    if (static_cast<size_t>(id) < first) continue;
    const auto opened = std::find_if(prefix.changes.begin(), prefix.changes.end(),
                                     [id](const Change& c) { return c.allocate && c.request == id; });
    return absl::FailedPreconditionError(absl::StrFormat(
        "step %d, which every later step repeats, leaves %d of its blocks live at its end (the first allocated at "
        "%s), so its layout would not hold in the next step",
        r + 1, prefix.live_at_end.end() - std::find(prefix.live_at_end.begin(), prefix.live_at_end.end(), id),
        TraceLocation(trace, trace.events[opened->event])));
  }
  return RepeatingPrefix{.blocks = std::move(prefix), .repeating_step = r, .first = first};
}

absl::StatusOr<RepeatingStepsLayout> LayoutPrefix(const AllocationTrace& trace, const RepeatingPrefix& prefix,
                                                  uint64_t page_bytes, ArenaOrder order) {
  HEADROOM_ASSIGN_OR_RETURN(TraceLayout layout, Layout(trace, prefix.blocks, page_bytes, order));
  return RepeatingStepsLayout{
      .layout = std::move(layout), .repeating_step = prefix.repeating_step + 1, .first_step_allocation = prefix.first};
}

}  // namespace

absl::StatusOr<TraceLayout> LayoutTrace(const AllocationTrace& trace, uint64_t page_bytes, ArenaOrder order) {
  HEADROOM_RETURN_IF_ERROR(CheckPageSize(page_bytes));
  HEADROOM_ASSIGN_OR_RETURN(const TraceBlocks blocks, CollectBlocks(trace, trace.events.size()));
  return Layout(trace, blocks, page_bytes, order);
}

absl::StatusOr<RepeatingStepsLayout> LayoutRepeatingSteps(const AllocationTrace& trace,
                                                          std::span<const uint64_t> step_end_times,
                                                          uint64_t page_bytes, ArenaOrder order) {
  HEADROOM_RETURN_IF_ERROR(CheckPageSize(page_bytes));
  HEADROOM_ASSIGN_OR_RETURN(const RepeatingPrefix prefix, FindRepeatingPrefix(trace, step_end_times));
  return LayoutPrefix(trace, prefix, page_bytes, order);
}

absl::StatusOr<RepeatingStepsLayout> LayoutRepeatingStepsEitherOrder(const AllocationTrace& trace,
                                                                     std::span<const uint64_t> step_end_times,
                                                                     uint64_t page_bytes) {
  HEADROOM_RETURN_IF_ERROR(CheckPageSize(page_bytes));
  HEADROOM_ASSIGN_OR_RETURN(const RepeatingPrefix prefix, FindRepeatingPrefix(trace, step_end_times));
  HEADROOM_ASSIGN_OR_RETURN(RepeatingStepsLayout by_size, LayoutPrefix(trace, prefix, page_bytes, ArenaOrder::kSize));
  HEADROOM_ASSIGN_OR_RETURN(RepeatingStepsLayout by_lifetime,
                            LayoutPrefix(trace, prefix, page_bytes, ArenaOrder::kSizeTimesLifetime));
  auto cost = [](const RepeatingStepsLayout& steps) {
    return std::pair(steps.layout.peak_page_bytes, steps.layout.arena.arena_bytes);
  };
  return cost(by_lifetime) < cost(by_size) ? std::move(by_lifetime) : std::move(by_size);
}

absl::Status CheckPlanFollowsOneStream(const AllocationTrace& trace) {
  const TraceEvent* first = nullptr;
  for (const TraceEvent& e : trace.events) {
    if (e.op != TraceOp::kAllocate || e.size == 0) continue;  // the allocator counts no empty request
    if (first == nullptr) {
      first = &e;
    } else if (e.stream != first->stream) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s allocates on stream %#x after stream %#x (%s); an allocator follows a layout plan on one stream "
          "only, and would leave it there",
          TraceLocation(trace, e), e.stream, first->stream, TraceLocation(trace, *first)));
    }
  }
  return absl::OkStatus();
}

LayoutPlan ToLayoutPlan(const RepeatingStepsLayout& steps) {
  LayoutPlan plan;
  const std::vector<ArenaBlock>& blocks = steps.layout.arena.blocks;
  for (size_t i = 0; i < blocks.size(); ++i) {
    if (i == steps.first_step_allocation) plan.repeat_from = plan.blocks.size();
    if (blocks[i].size > 0) plan.blocks.push_back({.offset = blocks[i].offset, .size = blocks[i].size});
  }
  return plan;
}

}  // namespace headroom

#include "layout/arena_layout.h"

#include <algorithm>
#include <bit>
#include <iterator>
#include <limits>
#include <numeric>
#include <span>
#include <utility>

#include "absl/container/inlined_vector.h"
#include "absl/strings/str_format.h"
#include "common/status_macros.h"

namespace headroom {
namespace {

// Note [Arena index]
// The paper's loop scans every placed tensor for each new one, O(n^2); a
// training step keeps thousands of saved activations live across the
// backward pass, so most pairs overlap and the scans are long. Placing a
// tensor needs only the gaps in the union of the address ranges of the
// placed blocks that overlap it in time. So placed blocks go into a segment
// tree over op indices: a block is recorded, as an address range, in
// `cover` of the O(log ops) canonical nodes whose op range lies inside its
// lifetime and whose parent's does not, and in `below` of those nodes and
// all their ancestors (the union of `cover` over the subtree). Two op
// ranges intersect exactly when a canonical node of one is an ancestor, a
// descendant or the same node as a canonical node of the other (both
// contain a common leaf). So the placed blocks that overlap [first, last]
// are those in `below` of its canonical nodes plus those in `cover` of the
// nodes on the paths from leaves first and last to the root that are not
// inside [first, last] (the canonical nodes' strict ancestors are exactly
// these). Each set merges touching ranges, so a packed arena is a few
// ranges however many tensors it holds. An insertion into `below` climbs
// only until an ancestor already covers the range (a parent's union
// contains its children's); a leaf's `cover` is never read.
// Place unites the sets in view, smallest first, closing gaps narrower than
// the block as it goes (the union's gaps only shrink as sets join it) and
// galloping over ranges the union already covers. Per tensor that is
// O(log ops) insertions plus the ranges in view outside the union's wide
// parts: a few dozen on model steps (a 100k-tensor Llama-shaped step is laid
// out in a fraction of a second, bench/arena_layout_bench.cc), more when
// lifetimes leave many gaps wide enough for the block, since best fit must
// weigh each of them.

struct Range {
  uint64_t start;
  uint64_t end;  // exclusive
};

// Disjoint address ranges, sorted, touching ones merged. Inline storage:
// most sets hold a range or two, and the index holds a set per tree node
// in use.
class RangeSet {
 public:
  // Adds [start, end); false when it was covered already.
  bool Insert(uint64_t start, uint64_t end) {
    if (ranges_.empty() || start >= ranges_.back().start) {  // at the top: the usual case
      if (ranges_.empty() || start > ranges_.back().end) {
        ranges_.push_back({start, end});
        return true;
      }
      if (end <= ranges_.back().end) return false;
      ranges_.back().end = end;
      return true;
    }
    auto it = std::upper_bound(ranges_.begin(), ranges_.end(), start,
                               [](uint64_t s, const Range& r) { return s < r.start; });
    if (it != ranges_.begin() && std::prev(it)->end >= start) {  // extend the range below
      if (std::prev(it)->end >= end) return false;
      --it;
      start = it->start;
    }
    auto last = it;
    for (; last != ranges_.end() && last->start <= end; ++last) end = std::max(end, last->end);
    if (last == it) {
      ranges_.insert(it, {start, end});
    } else {  // reuse the first absorbed range's slot
      *it = {start, end};
      ranges_.erase(std::next(it), last);
    }
    return true;
  }

  std::span<const Range> ranges() const { return {ranges_.data(), ranges_.size()}; }

 private:
  absl::InlinedVector<Range, 2> ranges_;
};

// Note [Arena index].
class ArenaIndex {
 public:
  explicit ArenaIndex(OpId num_ops)
      : leaves_(std::bit_ceil(static_cast<uint32_t>(std::max<OpId>(num_ops, 1)))),
        cover_(2 * static_cast<size_t>(leaves_), -1),
        below_(2 * static_cast<size_t>(leaves_), -1) {}

  // The offset of a block of `size` bytes live during [first, last], by
  // best fit among the gaps that the placed blocks overlapping it leave
  // (Note [Greedy by size]); then records it there.
  uint64_t Place(OpId first, OpId last, uint64_t size) {
    sets_in_view_.clear();
    ForEachCanonical(first, last, [&](uint32_t node) { View(below_, node); });
    // The two leaf-to-root paths, each node once, minus those inside [first, last].
    uint32_t span = 1;
    auto partial = [&](uint32_t node) {
      const uint32_t lo = (node - (leaves_ / span)) * span;  // first leaf under `node`
      return lo < static_cast<uint32_t>(first) || lo + span - 1 > static_cast<uint32_t>(last);
    };
    for (uint32_t a = leaves_ + static_cast<uint32_t>(first), b = leaves_ + static_cast<uint32_t>(last); a >= 1;
         a >>= 1, b >>= 1, span <<= 1) {
      if (partial(a)) View(cover_, a);
      if (b != a && partial(b)) View(cover_, b);
    }
    // Their union, merged set by set, smallest first: the larger sets then
    // meet a union that covers much of them already, and gallop over it.
    std::sort(sets_in_view_.begin(), sets_in_view_.end(), [](const RangeSet* x, const RangeSet* y) {
      return x->ranges().size() < y->ranges().size();
    });
    occupied_.clear();
    for (const RangeSet* set : sets_in_view_) Unite(set->ranges(), size);
    uint64_t top = 0;  // the end of the occupied ranges below the current one
    uint64_t best_gap = std::numeric_limits<uint64_t>::max();
    uint64_t offset = 0;
    for (const Range& r : occupied_) {
      if (r.start - top >= size && r.start - top < best_gap) {
        best_gap = r.start - top;
        offset = top;
      }
      top = r.end;
    }
    if (best_gap == std::numeric_limits<uint64_t>::max()) offset = top;
    ForEachCanonical(first, last, [&](uint32_t node) {
      if (node < leaves_) Set(cover_, node).Insert(offset, offset + size);  // a leaf is nobody's ancestor
      for (uint32_t up = node; up >= 1 && Set(below_, up).Insert(offset, offset + size); up >>= 1) {
      }
    });
    return offset;
  }

 private:
  template <typename F>
  void ForEachCanonical(OpId first, OpId last, F&& visit) const {
    uint32_t l = leaves_ + static_cast<uint32_t>(first);
    uint32_t r = leaves_ + static_cast<uint32_t>(last) + 1;
    for (; l < r; l >>= 1, r >>= 1) {
      if (l & 1) visit(l++);
      if (r & 1) visit(--r);
    }
  }

  // occupied_ |= ranges (both sorted and disjoint), closing gaps narrower
  // than `size`: the union's gaps only shrink as sets join it, so those
  // can never hold the block.
  void Unite(std::span<const Range> ranges, uint64_t size) {
    if (ranges.size() <= 2) {  // most sets: in place, no copy of the union
      for (const Range& r : ranges) UniteOne(r, size);
      return;
    }
    merged_.clear();
    auto add = [&](Range r) {
      if (merged_.empty()) {
        if (r.start < size) r.start = 0;
        merged_.push_back(r);
      } else if (Range& back = merged_.back(); r.start <= back.end || r.start - back.end < size) {
        back.end = std::max(back.end, r.end);
      } else {
        merged_.push_back(r);
      }
    };
    auto a = occupied_.begin();
    const Range* b = ranges.data();
    const Range* const b_end = b + ranges.size();
    while (a != occupied_.end() || b != b_end) {
      add(b == b_end || (a != occupied_.end() && a->start <= b->start) ? *a++ : *b++);
      // The set's ranges that end under the union's last one add nothing:
      // skip them by galloping (ends are sorted too).
      const uint64_t covered = merged_.back().end;
      if (b != b_end && b->end <= covered) {
        size_t step = 1;
        while (b + step < b_end && (b + step)->end <= covered) {
          b += step;
          step *= 2;
        }
        b = std::partition_point(b + 1, std::min(b + step, b_end),
                                 [covered](const Range& r) { return r.end <= covered; });
      }
    }
    occupied_.swap(merged_);
  }

  // Unite for one range, in place.
  void UniteOne(Range r, uint64_t size) {
    auto it = std::upper_bound(occupied_.begin(), occupied_.end(), r.start,
                               [](uint64_t s, const Range& x) { return s < x.start; });
    if (it != occupied_.begin() && (r.start <= std::prev(it)->end || r.start - std::prev(it)->end < size)) {
      --it;
      r.start = it->start;
    } else if (it == occupied_.begin() && r.start < size) {
      r.start = 0;
    }
    auto last = it;
    for (; last != occupied_.end() && (last->start <= r.end || last->start - r.end < size); ++last) {
      r.end = std::max(r.end, last->end);
    }
    if (last == it) {
      occupied_.insert(it, r);
    } else {
      *it = r;
      occupied_.erase(std::next(it), last);
    }
  }

  RangeSet& Set(std::vector<int32_t>& index, uint32_t node) {
    int32_t& i = index[node];
    if (i < 0) {
      i = static_cast<int32_t>(sets_.size());
      sets_.emplace_back();
    }
    return sets_[static_cast<size_t>(i)];
  }

  void View(const std::vector<int32_t>& index, uint32_t node) {
    if (index[node] >= 0) sets_in_view_.push_back(&sets_[static_cast<size_t>(index[node])]);
  }

  uint32_t leaves_;  // a power of two, at least the number of ops
  std::vector<int32_t> cover_;  // node -> sets_ index, -1 when empty
  std::vector<int32_t> below_;
  std::vector<RangeSet> sets_;  // Place holds no reference across a Set()
  std::vector<const RangeSet*> sets_in_view_;  // scratch for Place
  std::vector<Range> occupied_;  // scratch for Place: the union of the sets in view
  std::vector<Range> merged_;
};

uint64_t AlignUp(uint64_t bytes, uint64_t alignment) { return (bytes + alignment - 1) & ~(alignment - 1); }

absl::Status CheckRequests(std::span<const ArenaRequest> requests, uint64_t alignment) {
  if (alignment == 0 || !std::has_single_bit(alignment) || alignment > kMaxTensorBytes) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "arena alignment %d must be a power of two between 1 and %d bytes", alignment, kMaxTensorBytes));
  }
  if (requests.size() > kMaxGraphTensors) {
    return absl::OutOfRangeError(absl::StrFormat("%d arena requests; at most %d (one per tensor of a graph)",
                                                 requests.size(), kMaxGraphTensors));
  }
  for (size_t i = 0; i < requests.size(); ++i) {
    const ArenaRequest& r = requests[i];
    if (r.first < 0 || r.first > r.last) {
      return absl::InvalidArgumentError(
          absl::StrFormat("arena request %d (id %d): lifetime [%d, %d] is empty", i, r.id, r.first, r.last));
    }
    if (static_cast<size_t>(r.last) >= kMaxGraphOps) {
      return absl::OutOfRangeError(absl::StrFormat("arena request %d (id %d): lifetime ends at op %d, beyond %d ops",
                                                   i, r.id, r.last, kMaxGraphOps));
    }
    if (r.bytes > kMaxTensorBytes) {
      return absl::OutOfRangeError(absl::StrFormat("arena request %d (id %d): %d bytes, above the %d-byte bound",
                                                   i, r.id, r.bytes, kMaxTensorBytes));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ArenaLayout> LayoutArena(std::span<const ArenaRequest> requests, uint64_t alignment,
                                        ArenaOrder order) {
  HEADROOM_RETURN_IF_ERROR(CheckRequests(requests, alignment));
  ArenaLayout layout{.alignment = alignment};
  layout.blocks.reserve(requests.size());
  OpId num_ops = 0;
  for (const ArenaRequest& r : requests) {
    layout.blocks.push_back(
        {.id = r.id, .first = r.first, .last = r.last, .offset = 0, .size = AlignUp(r.bytes, alignment)});
    num_ops = std::max(num_ops, r.last + 1);
  }
  if (requests.empty()) return layout;

  // The bound, and the naive layout, from the aligned sizes (Note [Size
  // bounds]: the sums stay below 2^62).
  std::vector<uint64_t> delta(static_cast<size_t>(num_ops) + 1, 0);
  for (const ArenaBlock& b : layout.blocks) {
    delta[static_cast<size_t>(b.first)] += b.size;
    delta[static_cast<size_t>(b.last) + 1] -= b.size;  // wraps, and the prefix sum wraps back
    layout.naive_bytes += b.size;
  }
  uint64_t live = 0;
  for (OpId op = 0; op < num_ops; ++op) {
    live += delta[static_cast<size_t>(op)];
    if (layout.lower_bound_op == kNone || live > layout.lower_bound_bytes) {
      layout.lower_bound_bytes = live;
      layout.lower_bound_op = op;
    }
  }

  // Note [Greedy by size]: largest first, then earlier first use, then request order.
  std::vector<uint32_t> visit(requests.size());
  std::iota(visit.begin(), visit.end(), 0u);
  // Below 2^40 bytes and 2^21 ops (Note [Size bounds]), a product fits 64 bits.
  auto weight = [order](const ArenaBlock& b) {
    return order == ArenaOrder::kSize ? b.size : b.size * static_cast<uint64_t>(b.last - b.first + 1);
  };
  std::sort(visit.begin(), visit.end(), [&layout, &weight](uint32_t a, uint32_t b) {
    const ArenaBlock& x = layout.blocks[a];
    const ArenaBlock& y = layout.blocks[b];
    if (weight(x) != weight(y)) return weight(x) > weight(y);
    if (x.size != y.size) return x.size > y.size;
    if (x.first != y.first) return x.first < y.first;
    return a < b;
  });
  ArenaIndex index(num_ops);
  for (uint32_t i : visit) {
    ArenaBlock& block = layout.blocks[i];
    if (block.size == 0) break;  // the rest weigh nothing too, at offset 0
    block.offset = index.Place(block.first, block.last, block.size);
    layout.arena_bytes = std::max(layout.arena_bytes, block.offset + block.size);
  }
  return layout;
}

absl::StatusOr<ArenaLayout> LayoutActivationArena(const Graph& step, const ArenaLayoutOptions& options) {
  HEADROOM_RETURN_IF_ERROR(step.CheckBounds());
  const std::vector<TensorLifetime> life = ComputeLifetimes(step, options.profile);
  std::vector<ArenaRequest> requests;
  for (const Tensor& t : step.tensors()) {
    const TensorLifetime& l = life[static_cast<size_t>(t.id)];
    if (l.first > l.last) continue;
    requests.push_back({.id = t.id, .first = l.first, .last = l.last, .bytes = t.bytes()});
  }
  return LayoutArena(requests, options.alignment);
}

}  // namespace headroom

// A static layout of the activation arena: one offset per tensor such that
// tensors live at the same time never share an address, as a runtime that
// preallocates one buffer for the whole step would place them.
//
//   HEADROOM_ASSIGN_OR_RETURN(ArenaLayout layout, LayoutActivationArena(scheduled, {}));
//   layout.arena_bytes;         // the buffer the step needs
//   layout.lower_bound_bytes;   // no layout can do better than this
//   layout.gap_bytes();         // what the heuristic leaves on the table
//   layout.blocks[0].offset;    // where the first counted tensor lives
//
// Note [Greedy by size]
// Finding the smallest arena is NP-hard (it is dynamic storage allocation),
// so we use the heuristic TensorFlow Lite ships, "greedy by size" with best
// fit (Pisarchyk & Lee 2020, "Efficient Memory Management for Deep Neural
// Net Inference", sec. 4.2): visit tensors by size, largest first (ties:
// earlier first use, then lower id); collect the address ranges of the
// already placed tensors whose lifetimes overlap this one; place it in the
// smallest gap between those ranges that fits it (ties: the lowest such
// gap), or, when none fits, right above the highest of them. Sizes are
// rounded up to `alignment`, so every offset is a multiple of it too (a
// CUDA caching allocator hands out 512-byte aligned blocks).
// The lower bound is the largest sum of aligned sizes live at one op, since
// those tensors must all be disjoint; the heuristic usually reaches it on
// training steps, but not always (tests/layout/arena_layout_test.cc has a
// four-tensor case where it needs 4 units for an optimum of 3).
//
// Visiting tensors by the bytes they hold over time instead (size times
// the ops they live, ArenaOrder::kSizeTimesLifetime; ties as above) places
// the long-lived ones first: on some recorded allocation traces it leaves
// a much smaller arena (the CPU GPT-2, Llama and MoE runs), on others a
// larger one (layout/trace_layout.h; bench/RESULTS.md).
//
// Lifetimes are op indices, inclusive (TensorLifetime, Note [Liveness rule]
// in graph/liveness.h): two tensors conflict when their [first, last]
// ranges intersect. Zero-byte tensors take no space and sit at offset 0.
#ifndef HEADROOM_LAYOUT_ARENA_LAYOUT_H_
#define HEADROOM_LAYOUT_ARENA_LAYOUT_H_

#include <cstdint>
#include <span>
#include <vector>

#include "absl/status/statusor.h"
#include "graph/graph.h"
#include "graph/liveness.h"

namespace headroom {

// The alignment of CUDA caching allocators' blocks (allocator/size_rounding.h).
inline constexpr uint64_t kDefaultArenaAlignment = 512;

// One tensor to place: `bytes` live during ops [first, last].
struct ArenaRequest {
  int32_t id = kNone;  // the caller's name for it (a TensorId); carried into ArenaBlock
  OpId first = 0;
  OpId last = -1;
  uint64_t bytes = 0;
};

struct ArenaBlock {
  int32_t id = kNone;  // ArenaRequest::id
  OpId first = 0;
  OpId last = -1;
  uint64_t offset = 0;
  uint64_t size = 0;  // bytes rounded up to the alignment
};

struct ArenaLayout {
  uint64_t alignment = kDefaultArenaAlignment;
  // One block per request, in request order (per counted tensor with
  // storage, in TensorId order, for LayoutActivationArena).
  std::vector<ArenaBlock> blocks;
  uint64_t arena_bytes = 0;        // highest offset + size over blocks
  uint64_t lower_bound_bytes = 0;  // max over ops of the aligned sizes live there
  OpId lower_bound_op = kNone;     // the first op where the bound is reached
  uint64_t naive_bytes = 0;        // sum of aligned sizes: no reuse at all

  uint64_t gap_bytes() const { return arena_bytes - lower_bound_bytes; }
};

enum class ArenaOrder {
  kSize,               // Note [Greedy by size]
  kSizeTimesLifetime,  // bytes times ops live, largest first
};

// Lays out `requests` (Note [Greedy by size]). Errors name the input at
// fault: InvalidArgument for an alignment that is not a power of two
// (or above kMaxTensorBytes) and for a request with first < 0 or first >
// last; OutOfRange for more than kMaxGraphTensors requests, a request above
// kMaxTensorBytes or a lifetime beyond kMaxGraphOps (Note [Size bounds]).
// O(n log n) for the sort plus, per request, O(log ops) set insertions to
// record it and the gaps of the placed blocks around its lifetime to place
// it (Note [Arena index] in the .cc).
absl::StatusOr<ArenaLayout> LayoutArena(std::span<const ArenaRequest> requests,
                                        uint64_t alignment = kDefaultArenaAlignment,
                                        ArenaOrder order = ArenaOrder::kSize);

struct ArenaLayoutOptions {
  // Which tensors live in the arena: those ProfileMemory counts.
  ProfileOptions profile;
  uint64_t alignment = kDefaultArenaAlignment;
};

// Lays out the counted tensors of `step` (any graph in program order, such
// as a materialized schedule) over their lifetimes from ComputeLifetimes.
// Errors: the graph's CheckBounds() and LayoutArena's, for the alignment.
absl::StatusOr<ArenaLayout> LayoutActivationArena(const Graph& step, const ArenaLayoutOptions& options = {});

}  // namespace headroom

#endif  // HEADROOM_LAYOUT_ARENA_LAYOUT_H_

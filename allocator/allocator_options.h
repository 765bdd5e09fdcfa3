// What the caching allocator can be told. Policy code reads only this
// struct (never the environment); ParseAllocConf (alloc_conf.h) builds one
// from a HEADROOM_ALLOC_CONF / PYTORCH_CUDA_ALLOC_CONF-style string.
//
//   AllocatorOptions options{.max_split_size = 512 * kMiB, .expandable_segments = true};
//
// Defaults reproduce PyTorch's native caching allocator with an empty
// PYTORCH_CUDA_ALLOC_CONF.
#ifndef HEADROOM_ALLOCATOR_ALLOCATOR_OPTIONS_H_
#define HEADROOM_ALLOCATOR_ALLOCATOR_OPTIONS_H_

#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <string>

#include "allocator/layout_plan.h"
#include "allocator/size_rounding.h"

namespace headroom {

inline constexpr uint64_t kUnlimitedSplitSize = std::numeric_limits<uint64_t>::max();

// AllocatorOptions::reuse_layout_min_bytes must exceed this: smaller free
// blocks are kept in size bins, where the search for a remembered range does
// not look (Note [Size bins] in block_pool.h).
inline constexpr uint64_t kReuseLayoutAbove = uint64_t{2} << 20;

struct AllocatorOptions {
  RoundingOptions rounding;
  // Cached blocks at least this large are never split, and serve only
  // requests at least this large (and within kLargeBuffer of their size).
  // Bounds fragmentation by huge blocks; PyTorch's max_split_size_mb.
  uint64_t max_split_size = kUnlimitedSplitSize;
  // In (0, 1): once reserved memory exceeds this fraction of the allowed
  // memory, the oldest unused cached segments are released before the device
  // is asked for more. 0: off.
  double garbage_collection_threshold = 0.0;
  // Note [Expandable segments] in sources/expandable_segments.h.
  bool expandable_segments = false;
  // An expandable segment grows by whole pages of this size (rounded up to
  // the device's map granularity): PyTorch's 2 MiB for the small pool and
  // 20 MiB for the large one, so a large pool maps ten times fewer pages.
  uint64_t expandable_small_page_bytes = uint64_t{2} << 20;
  uint64_t expandable_large_page_bytes = uint64_t{20} << 20;
  // Fraction of the device's total memory this allocator may reserve.
  double memory_fraction = 1.0;
  // Absolute cap on reserved bytes; 0: none. The stricter of the two applies.
  uint64_t hard_limit_bytes = 0;
  // Note [Cross-stream reuse] in caching_allocator.h. Off as in PyTorch.
  bool cross_stream_reuse = false;
  // Expandable segments only: a segment that must grow first takes whole free
  // pages from cached blocks of any expandable segment (another pool's or
  // stream's, or a hole of its own) and maps them where they are needed,
  // before it creates new physical memory (Note [Moving free pages] in
  // sources/expandable_segments.h). Off in PyTorch's policy; Headroom's own
  // turns it on.
  bool move_free_pages = false;
  // With move_free_pages: growth creates new pages while reserved memory
  // stays within this multiple of the peak allocated bytes (and the memory
  // limit), and moves free pages only for what would go past it, so that
  // pages stay where a steady training loop will use them again.
  double move_threshold = 1.0;
  // With move_free_pages: each page moved widens that room by one page, up
  // to this multiple of the peak (if above move_threshold; 1: never widens),
  // so that a loop whose layout drifts a little each step stops moving pages
  // once the room covers the drift (Note [Moving free pages]).
  double move_threshold_max = 1.0;
  // Expandable segments only: every request, small ones too, is served from
  // one pool per stream (the large pool's segment, in its pages), so free
  // memory serves any size without moving pages between pools (Note [One
  // pool] in caching_allocator.h). Off in PyTorch's policy.
  bool unified_pool = false;
  // Requests of at least this many bytes (0: none; else above
  // kReuseLayoutAbove) go where the request of the same name went last time,
  // where that range is free, before best fit, so that the blocks of a
  // training loop's steps keep one layout (Note [Reusing a step's layout] in
  // caching_allocator.h). Off in PyTorch's policy.
  uint64_t reuse_layout_min_bytes = 0;
  // Expandable segments only: a request of a page or more (the device's map
  // granularity) that grows a segment starts at a page boundary rather than
  // in the free tail of a partly used page, where that maps no more pages
  // (Note [Page-aligned growth] in sources/expandable_segments.h). Off in
  // PyTorch's policy.
  bool align_growth = false;
  // Expandable segments only: a request that would run out of memory only
  // because the free bytes lie in pieces of pages that hold live blocks is
  // served from pieces that end and start at page boundaries (and new pages
  // between them), mapped once more, side by side, at a new address (Note
  // [Stitched blocks] in sources/stitched_ranges.h). Off in PyTorch's policy.
  bool stitch_pages = false;
  // Where each allocation goes, planned from a recorded run of the same job:
  // followed while the job matches it, the policy above serving the rest
  // (Note [Following a layout plan] in sources/planned_range.h). `layout_plan`
  // if set; else the file `layout_plan_file` names (HEADROOM_ALLOC_CONF's
  // layout_plan key), read by CachingAllocator::Create. Neither: no plan.
  std::shared_ptr<const LayoutPlan> layout_plan;
  std::string layout_plan_file;
  // Entries kept in the history ring buffer (0: not recorded).
  size_t history_entries = 0;
};

}  // namespace headroom

#endif  // HEADROOM_ALLOCATOR_ALLOCATOR_OPTIONS_H_

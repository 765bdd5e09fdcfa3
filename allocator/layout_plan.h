// A layout plan: where each allocation of a job goes, worked out offline
// from a recorded run of the same job (LayoutRepeatingSteps in
// layout/trace_layout.h, `headroom replay --write-plan`) and followed by the
// caching allocator (Note [Following a layout plan] in sources/planned_range.h).
//
//   HEADROOM_ASSIGN_OR_RETURN(LayoutPlan plan, ReadLayoutPlanFile("t5.plan.json"));
//   const PlannedBlock* block = plan.At(n);  // where the job's allocation n goes
//
// The file is JSON:
//   {"format": "headroom.layout_plan", "version": 1,
//    "repeat_from": 812,                        // f
//    "blocks": [[offset, size], ...]}           // bytes, multiples of 512
// Allocation n (0-based, counting the allocations of at least one byte)
// goes at blocks[n] while n is below blocks.size(), and at blocks[f + (n - f)
// % (blocks.size() - f)] after: blocks from f on are one training step that
// repeats forever. With f equal to blocks.size() the plan ends there.
// A plan says nothing about lifetimes: whether a planned range is free when
// its allocation comes is the allocator's to check.
#ifndef HEADROOM_ALLOCATOR_LAYOUT_PLAN_H_
#define HEADROOM_ALLOCATOR_LAYOUT_PLAN_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/input_file.h"

namespace headroom {

struct PlannedBlock {
  uint64_t offset = 0;  // from the start of the plan's address range
  uint64_t size = 0;    // a request's size rounded up to 512 bytes
};

struct LayoutPlan {
  // The most blocks a plan file may hold (a step of a large model allocates
  // tens of thousands).
  static constexpr size_t kMaxBlocks = size_t{1} << 24;

  std::vector<PlannedBlock> blocks;
  size_t repeat_from = 0;  // f above; blocks.size(): the plan does not repeat

  // The block of allocation `n`, or nullptr past the end of a plan that
  // does not repeat.
  const PlannedBlock* At(uint64_t n) const {
    if (n < blocks.size()) return &blocks[n];
    if (repeat_from >= blocks.size()) return nullptr;
    const uint64_t period = blocks.size() - repeat_from;
    return &blocks[repeat_from + (n - repeat_from) % period];
  }
  // The highest offset + size over the blocks: the address range it needs.
  uint64_t extent_bytes() const;
};

// InvalidArgument, naming `source` and the block, unless the plan has at
// least one block and at most kMaxBlocks, every offset and size is a
// multiple of 512 (sizes above 0, extent at most 2^62) and repeat_from is at
// most blocks.size().
absl::Status CheckLayoutPlan(const LayoutPlan& plan, std::string_view source);

// A layout plan file's bound (Note [Input bounds] in common/input_file.h):
// LayoutPlanJson writes at most 46 bytes a block (",\n  [offset, size]" with
// 19 digits each), so a plan of kMaxBlocks fits.
inline constexpr InputFileKind kLayoutPlanFile{.noun = "a layout plan", .max_bytes = kMaxRecordingFileBytes};
static_assert(LayoutPlan::kMaxBlocks * 46 < kLayoutPlanFile.max_bytes);

// Parses a plan file's text; errors name `source` and the field at fault.
absl::StatusOr<LayoutPlan> ParseLayoutPlan(std::string_view text, std::string_view source);
absl::StatusOr<LayoutPlan> ReadLayoutPlanFile(const std::string& path);
// The file's text; ParseLayoutPlan reads it back to the same plan.
std::string LayoutPlanJson(const LayoutPlan& plan);

}  // namespace headroom

#endif  // HEADROOM_ALLOCATOR_LAYOUT_PLAN_H_

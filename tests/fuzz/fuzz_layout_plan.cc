// Layout plan files (allocator/layout_plan.h) accept or reject any text; what
// they accept writes back to a file that reads to the same plan, and its
// blocks can be looked up for any allocation.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "allocator/layout_plan.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view text(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<headroom::LayoutPlan> plan = headroom::ParseLayoutPlan(text, "fuzz.plan.json");
  if (!plan.ok()) return 0;
  absl::StatusOr<headroom::LayoutPlan> again = headroom::ParseLayoutPlan(headroom::LayoutPlanJson(*plan), "again");
  if (!again.ok() || again->repeat_from != plan->repeat_from || again->blocks.size() != plan->blocks.size()) {
    __builtin_trap();
  }
  for (size_t i = 0; i < plan->blocks.size(); ++i) {
    if (again->blocks[i].offset != plan->blocks[i].offset || again->blocks[i].size != plan->blocks[i].size) {
      __builtin_trap();
    }
  }
  for (uint64_t n : {uint64_t{0}, uint64_t{plan->blocks.size()}, uint64_t{1} << 40}) {
    const headroom::PlannedBlock* block = plan->At(n);
    if (block != nullptr && (block < plan->blocks.data() || block >= plan->blocks.data() + plan->blocks.size())) {
      __builtin_trap();
    }
  }
  (void)plan->extent_bytes();
  return 0;
}

#include "allocator/layout_plan.h"

#include <algorithm>

#include "absl/strings/str_format.h"
#include "allocator/size_rounding.h"
#include "common/json_fields.h"
#include "common/quote.h"
#include "common/status_macros.h"

namespace headroom {
namespace {

constexpr std::string_view kFormat = "headroom.layout_plan";
constexpr uint64_t kVersion = 1;
constexpr uint64_t kMaxExtent = uint64_t{1} << 62;

}  // namespace

uint64_t LayoutPlan::extent_bytes() const {
  uint64_t extent = 0;
  for (const PlannedBlock& block : blocks) extent = std::max(extent, block.offset + block.size);
  return extent;
}

absl::Status CheckLayoutPlan(const LayoutPlan& plan, std::string_view source) {
  if (plan.blocks.empty() || plan.blocks.size() > LayoutPlan::kMaxBlocks) {
    return absl::InvalidArgumentError(absl::StrFormat("%s: a layout plan holds 1 to %d blocks, not %d", source,
                                                      LayoutPlan::kMaxBlocks, plan.blocks.size()));
  }
  for (size_t i = 0; i < plan.blocks.size(); ++i) {
    const PlannedBlock& block = plan.blocks[i];
    if (block.size == 0 || block.size % kMinBlockSize != 0 || block.offset % kMinBlockSize != 0 ||
        block.size > kMaxExtent || block.offset > kMaxExtent - block.size) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s: blocks[%d] at offset %d of %d bytes: offsets and sizes are multiples of %d, sizes above 0, and a "
          "block ends below 2^62",
          source, i, block.offset, block.size, kMinBlockSize));
    }
  }
  if (plan.repeat_from > plan.blocks.size()) {
    return absl::InvalidArgumentError(absl::StrFormat("%s: repeat_from %d is past the plan's %d blocks", source,
                                                      plan.repeat_from, plan.blocks.size()));
  }
  return absl::OkStatus();
}

absl::StatusOr<LayoutPlan> ParseLayoutPlan(std::string_view text, std::string_view source) {
  HEADROOM_ASSIGN_OR_RETURN(nlohmann::json document, ParseJsonDocument(text, source));
  const JsonPath root(source);
  if (!document.is_object()) return root.Error("expected a JSON object (a Headroom layout plan)");
  HEADROOM_ASSIGN_OR_RETURN(std::string format, RequireString(document, "format", root));
  if (format != kFormat) {
    return (root / "format").Error(absl::StrFormat("expected \"%s\", got %s", kFormat, QuoteForError(format)));
  }
  HEADROOM_ASSIGN_OR_RETURN(uint64_t version, RequireUint(document, "version", root));
  if (version != kVersion) {
    return (root / "version").Error(absl::StrFormat("this Headroom reads version %d, not %d", kVersion, version));
  }
  LayoutPlan plan;
  HEADROOM_ASSIGN_OR_RETURN(const nlohmann::json* blocks, RequireField(document, "blocks", root));
  if (!blocks->is_array()) return (root / "blocks").Error("expected an array of [offset, size] pairs");
  if (blocks->size() > LayoutPlan::kMaxBlocks) {
    return (root / "blocks").Error(absl::StrFormat("more than %d blocks", LayoutPlan::kMaxBlocks));
  }
  plan.blocks.reserve(blocks->size());
  for (size_t i = 0; i < blocks->size(); ++i) {
    const nlohmann::json& pair = (*blocks)[i];
    const JsonPath at = root / "blocks" / i;
    if (!pair.is_array() || pair.size() != 2) return at.Error("expected [offset, size]");
    HEADROOM_ASSIGN_OR_RETURN(uint64_t offset, AsUint(pair[0], at / size_t{0}));
    HEADROOM_ASSIGN_OR_RETURN(uint64_t size, AsUint(pair[1], at / size_t{1}));
    plan.blocks.push_back({.offset = offset, .size = size});
  }
  HEADROOM_ASSIGN_OR_RETURN(uint64_t repeat_from, RequireUint(document, "repeat_from", root));
  // Checked here, as read: a value clamped to fit would be shown as the clamp.
  if (repeat_from > plan.blocks.size()) {
    return absl::InvalidArgumentError(absl::StrFormat("%s: repeat_from %d is past the plan's %d blocks", source,
                                                      repeat_from, plan.blocks.size()));
  }
  plan.repeat_from = static_cast<size_t>(repeat_from);
  HEADROOM_RETURN_IF_ERROR(CheckLayoutPlan(plan, source));
  return plan;
}

absl::StatusOr<LayoutPlan> ReadLayoutPlanFile(const std::string& path) {
  HEADROOM_ASSIGN_OR_RETURN(std::string text, ReadTextFile(path, kLayoutPlanFile));
  return ParseLayoutPlan(text, path);
}

std::string LayoutPlanJson(const LayoutPlan& plan) {
  std::string out = absl::StrFormat("{\"format\": \"%s\", \"version\": %d, \"repeat_from\": %d,\n \"blocks\": [",
                                    kFormat, kVersion, plan.repeat_from);
  for (size_t i = 0; i < plan.blocks.size(); ++i) {
    // One block a line keeps a plan of thousands readable and diffable.
    absl::StrAppendFormat(&out, "%s\n  [%d, %d]", i == 0 ? "" : ",", plan.blocks[i].offset, plan.blocks[i].size);
  }
  out += "\n]}\n";
  return out;
}

}  // namespace headroom

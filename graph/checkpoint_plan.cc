#include "graph/checkpoint_plan.h"

#include <algorithm>

#include "absl/strings/str_format.h"
#include "common/quote.h"

namespace headroom {

bool CheckpointPlan::empty() const {
  return std::all_of(segment_of_op.begin(), segment_of_op.end(), [](int32_t s) { return s == kNone; });
}

int32_t CheckpointPlan::num_segments() const {
  int32_t n = 0;
  for (int32_t s : segment_of_op) n = std::max(n, s + 1);
  return n;
}

absl::Status CheckpointPlan::Validate(const Graph& forward) const {
  if (segment_of_op.empty()) return absl::OkStatus();
  if (segment_of_op.size() != forward.num_ops()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "checkpoint plan covers %d ops, graph %s has %d", segment_of_op.size(), QuoteForError(forward.name()),
        forward.num_ops()));
  }
  int32_t next = 0;  // the segment a new run must open
  int32_t previous = kNone;
  for (const Op& op : forward.ops()) {
    const int32_t s = segment_of_op[static_cast<size_t>(op.id)];
    if (s == kNone) {
      previous = kNone;
      continue;
    }
    if (op.phase != Phase::kForward) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "checkpoint plan puts op %s (phase %s) in segment %d; only forward ops are replayed",
          QuoteForError(op.name), PhaseName(op.phase), s));
    }
    if (s == previous) continue;
    if (s != next) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "checkpoint plan: op %s opens segment %d where segment %d was expected (segments are numbered in "
          "program order and each is one contiguous run of ops)",
          QuoteForError(op.name), s, next));
    }
    ++next;
    previous = s;
  }
  return absl::OkStatus();
}

}  // namespace headroom

// A memory timeline of a scheduled graph as a self-contained SVG: device
// bytes (y) during each schedule entry (x), stacked by role, with the budget,
// the replayed (recompute) and copy entries marked. No scripts, fonts or
// links: it opens in any browser and embeds in a report as is.
//
//   MemoryTimelineOptions options{.fixed = {.weights = 14 * kGiB, .optimizer_state = 28 * kGiB},
//                                 .budget_bytes = 80 * kGiB};
//   HEADROOM_ASSIGN_OR_RETURN(std::string svg, RenderMemoryTimelineSvg(scheduled, options));
//
// Note [Timeline series]
// The graph's profile counts the tensors ProfileOptions names (activations,
// gradients, temporaries, inputs by default) op by op; what the estimators
// add for the whole step (weights, optimizer state, gradients kept apart
// such as fp32 main gradients) comes in as FixedBytes and is drawn flat. The
// series stack from the steady to the changing: weights (parameters and
// buffers), optimizer state, inputs, gradients, activations, temporaries, so
// the top of the stack is the total and its highest point the peak.
//
// Note [Timeline columns]
// A long schedule has more entries than the plot has pixel columns, so
// entries are grouped into at most `max_columns` columns of consecutive
// entries and each column draws the entry with the most bytes in it (the
// first on ties), with that entry's split by series. The drawn top is then
// the maximum of its column, so no peak is ever hidden, and the stack stays
// a real breakdown of one entry. Each series is one <path> of steps, a point
// only where its value changes.
#ifndef HEADROOM_REPORT_MEMORY_TIMELINE_SVG_H_
#define HEADROOM_REPORT_MEMORY_TIMELINE_SVG_H_

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "graph/graph.h"
#include "graph/liveness.h"

namespace headroom {

// Note [Timeline series], bottom to top.
enum class TimelineSeries : uint8_t { kWeights, kOptimizerState, kInputs, kGradients, kActivations, kTemporaries };
inline constexpr size_t kNumTimelineSeries = 6;
// "weights", "optimizer state", "inputs", "gradients", "activations", "temporaries".
std::string_view TimelineSeriesName(TimelineSeries series);

// Bytes held for the whole step that the graph's profile does not count.
struct FixedBytes {
  uint64_t weights = 0;          // parameters and buffers
  uint64_t optimizer_state = 0;  // moments, master weights
  uint64_t gradients = 0;        // parameter gradients kept outside the graph (fp32 main grads, ZeRO shards)
};

struct MemoryTimelineOptions {
  std::string title;        // empty: "Memory timeline: <graph name>"
  ProfileOptions profile;   // the graph's tensors drawn op by op
  FixedBytes fixed;
  uint64_t budget_bytes = 0;  // 0: no budget line
  std::string budget_label = "budget";
  // The whole picture, in pixels; the plot takes what the margins leave.
  int width = 1200;
  int height = 640;
};

struct TimelineColumn {
  OpId first_op = 0;  // the entries it covers, inclusive
  OpId last_op = 0;
  OpId op = 0;        // the one drawn (Note [Timeline columns])
  std::array<uint64_t, kNumTimelineSeries> bytes{};  // at `op`, by TimelineSeries

  uint64_t total() const;
};

// What the SVG draws, for callers that draw it otherwise.
struct MemoryTimeline {
  std::vector<TimelineColumn> columns;  // in op order, covering every op once
  uint64_t peak_bytes = 0;              // the highest total, fixed bytes included
  OpId peak_op = kNone;                 // where (first on ties); kNone without ops
  std::array<uint64_t, kNumTimelineSeries> bytes_at_peak{};
  std::array<bool, kNumTimelineSeries> present{};  // series with bytes anywhere
  // Runs of consecutive recompute ops (Op::recompute) and of copy ops
  // ("offload_copy", "prefetch_copy"), as inclusive op ranges.
  std::vector<std::pair<OpId, OpId>> recompute_runs;
  std::vector<std::pair<OpId, OpId>> copy_runs;
};

// The timeline of `step` (any graph in program order, such as a
// materialized schedule) in at most `max_columns` columns (>= 1). Errors:
// the graph's CheckBounds(); InvalidArgument naming the field for a fixed
// byte count or a budget above 2^60 bytes, or max_columns 0.
absl::StatusOr<MemoryTimeline> BuildMemoryTimeline(const Graph& step, const MemoryTimelineOptions& options,
                                                   size_t max_columns);

// The SVG document. Errors: BuildMemoryTimeline's, and InvalidArgument
// naming width or height outside [400, 20000] pixels.
absl::StatusOr<std::string> RenderMemoryTimelineSvg(const Graph& step, const MemoryTimelineOptions& options = {});

}  // namespace headroom

#endif  // HEADROOM_REPORT_MEMORY_TIMELINE_SVG_H_

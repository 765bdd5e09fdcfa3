// Any byte string given to the node-link importer yields a valid graph with
// one op per node, each with a cost the planner can price, or an error.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "models/node_link.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view text(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<headroom::Graph> graph = headroom::ImportNodeLink(text, "fuzz");
  if (!graph.ok()) return 0;
  if (!graph->Validate().ok()) __builtin_trap();
  for (const headroom::Op& op : graph->ops()) {
    if (op.outputs.size() != 1) __builtin_trap();
    if (!(op.measured_cost >= 0 && op.measured_cost <= headroom::kMaxMeasuredCost)) __builtin_trap();
  }
  return 0;
}

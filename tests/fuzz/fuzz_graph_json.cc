// Any byte string given to the graph JSON loader yields a valid graph or an
// error; a loaded graph saves and reloads to the same text.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "models/graph_json.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view text(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<headroom::Graph> graph = headroom::LoadGraphJson(text, "fuzz");
  if (!graph.ok()) return 0;
  if (!graph->Validate().ok()) __builtin_trap();
  const std::string saved = headroom::SaveGraphJson(*graph);
  absl::StatusOr<headroom::Graph> again = headroom::LoadGraphJson(saved, "fuzz-resaved");
  if (!again.ok() || headroom::SaveGraphJson(*again) != saved) __builtin_trap();
  return 0;
}

// Headroom graph JSON: a versioned, documented file form of any Graph
// (models/GRAPH_FORMAT.md is the schema), so graphs can be saved from one tool
// run, inspected, edited, and loaded back.
//
//   std::string text = SaveGraphJson(graph);
//   absl::StatusOr<Graph> back = LoadGraphJson(text, "step.json");
//
// Invariants: LoadGraphJson(SaveGraphJson(g)) reproduces g field by field;
// a loaded graph passes Graph::Validate() (errors name the JSON path at
// fault); documents of a newer major version are rejected.
#ifndef HEADROOM_MODELS_GRAPH_JSON_H_
#define HEADROOM_MODELS_GRAPH_JSON_H_

#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "graph/graph.h"

namespace headroom {

inline constexpr int kGraphJsonVersion = 1;

std::string SaveGraphJson(const Graph& graph);
absl::StatusOr<Graph> LoadGraphJson(std::string_view json_text, std::string_view origin);

}  // namespace headroom

#endif  // HEADROOM_MODELS_GRAPH_JSON_H_

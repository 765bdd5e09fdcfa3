#include "models/node_link.h"

#include <algorithm>
#include <map>
#include <queue>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_format.h"
#include "common/json_fields.h"
#include "common/quote.h"
#include "common/status_macros.h"
#include "nlohmann/json.hpp"

namespace headroom {
namespace {

// A node's `name`: a string as given, a number as written (networkx graphs
// built from integers, as MOCCASIN's random_layered ones, name nodes by
// them), else "node<id>".
absl::StatusOr<std::string> NodeName(const nlohmann::json& node, int64_t id, const JsonPath& path) {
  if (!node.contains("name") || node["name"].is_null()) return absl::StrFormat("node%d", id);
  const nlohmann::json& name = node["name"];
  if (name.is_string()) return name.get<std::string>();
  if (name.is_number_integer()) return name.dump();
  if (name.is_number()) return absl::StrFormat("%g", name.get<double>());
  return (path / "name").Error(absl::StrFormat("expected a string or a number, got %s", JsonTypeName(name)));
}

}  // namespace

absl::StatusOr<Graph> ImportNodeLink(std::string_view json_text, std::string_view origin) {
  using nlohmann::json;
  HEADROOM_ASSIGN_OR_RETURN(json doc, ParseJsonDocument(json_text, origin));
  const JsonPath path(origin);
  if (!doc.is_object()) {
    return path.Error(absl::StrFormat("expected a JSON object, got %s", JsonTypeName(doc)));
  }
  HEADROOM_ASSIGN_OR_RETURN(const json* nodes, RequireField(doc, "nodes", path));
  HEADROOM_ASSIGN_OR_RETURN(const json* links, RequireField(doc, "links", path));
  if (!nodes->is_array()) return (path / "nodes").Error("expected an array");
  if (!links->is_array()) return (path / "links").Error("expected an array");
  if (nodes->size() > kMaxGraphOps) {
    return (path / "nodes").Error(
        absl::StrFormat("%d nodes, more than the %d ops a graph may hold", nodes->size(), kMaxGraphOps));
  }

  struct Node {
    int64_t id;
    std::string name;
    bool backward;
    double cost_cpu;
    uint64_t cost_ram;
  };
  std::vector<Node> parsed;
  std::map<int64_t, size_t> index_of;  // node id -> position in `parsed`
  for (size_t i = 0; i < nodes->size(); ++i) {
    const json& n = (*nodes)[i];
    const JsonPath np = path / "nodes" / i;
    if (!n.is_object()) return np.Error("expected an object");
    Node node;
    HEADROOM_ASSIGN_OR_RETURN(node.id, RequireInt(n, "id", np));
    HEADROOM_ASSIGN_OR_RETURN(node.name, NodeName(n, node.id, np));
    // Note [Node-link graphs without backward]: absent or null is a node anyone may replay.
    node.backward = false;
    if (n.contains("backward") && !n["backward"].is_null()) {
      HEADROOM_ASSIGN_OR_RETURN(node.backward, RequireBool(n, "backward", np));
    }
    HEADROOM_ASSIGN_OR_RETURN(node.cost_cpu, RequireNumber(n, "cost_cpu", np));
    HEADROOM_ASSIGN_OR_RETURN(node.cost_ram, RequireUint(n, "cost_ram", np));
    if (!(node.cost_cpu >= 0) || !(node.cost_cpu <= kMaxMeasuredCost)) {
      return (np / "cost_cpu")
          .Error(absl::StrFormat("%g (node %s) is not a cost: it must be between 0 and %g",
                                 node.cost_cpu, QuoteForError(node.name), kMaxMeasuredCost));
    }
    // Note [Size bounds] in graph/graph.h: each node's output is one tensor.
    if (node.cost_ram > kMaxTensorBytes) {
      return (np / "cost_ram")
          .Error(absl::StrFormat("%d (node %s) exceeds the %d bytes (1 TiB) a tensor may hold", node.cost_ram,
                                 QuoteForError(node.name), kMaxTensorBytes));
    }
    if (!index_of.emplace(node.id, parsed.size()).second) {
      return (np / "id").Error(absl::StrFormat("duplicate node id %d", node.id));
    }
    parsed.push_back(std::move(node));
  }

  std::vector<std::vector<size_t>> successors(parsed.size());
  std::vector<std::vector<size_t>> predecessors(parsed.size());
  for (size_t i = 0; i < links->size(); ++i) {
    const json& l = (*links)[i];
    const JsonPath lp = path / "links" / i;
    if (!l.is_object()) return lp.Error("expected an object");
    HEADROOM_ASSIGN_OR_RETURN(int64_t source, RequireInt(l, "source", lp));
    HEADROOM_ASSIGN_OR_RETURN(int64_t target, RequireInt(l, "target", lp));
    auto s = index_of.find(source);
    auto t = index_of.find(target);
    if (s == index_of.end()) {
      return (lp / "source").Error(absl::StrFormat("unknown node id %d", source));
    }
    if (t == index_of.end()) {
      return (lp / "target").Error(absl::StrFormat("unknown node id %d", target));
    }
    if (s->second == t->second) return lp.Error("a node cannot depend on itself");
    successors[s->second].push_back(t->second);
    predecessors[t->second].push_back(s->second);
  }

  // Kahn's algorithm, smallest node id first: the files list nodes in
  // program order, and this keeps it wherever the edges allow.
  std::vector<size_t> pending(parsed.size());
  using Entry = std::pair<int64_t, size_t>;
  std::priority_queue<Entry, std::vector<Entry>, std::greater<>> ready;
  for (size_t i = 0; i < parsed.size(); ++i) {
    pending[i] = predecessors[i].size();
    if (pending[i] == 0) ready.emplace(parsed[i].id, i);
  }
  std::string graph_name(origin);
  if (doc.contains("graph") && doc["graph"].is_object() && doc["graph"].contains("name") &&
      doc["graph"]["name"].is_string()) {
    graph_name = doc["graph"]["name"].get<std::string>();
  }
  Graph graph(graph_name);
  std::vector<TensorId> output_of(parsed.size(), kNone);
  while (!ready.empty()) {
    const size_t i = ready.top().second;
    ready.pop();
    const Node& node = parsed[i];
    TensorId out = graph.AddTensor(
        {.name = node.name + ".out",
         .shape = {static_cast<int64_t>(node.cost_ram)},
         .dtype = DType::kU8,
         .role = node.backward ? TensorRole::kGradient : TensorRole::kActivation});
    output_of[i] = out;
    Op op{.kind = "node", .name = node.name, .outputs = {out},
          .bytes_written = node.cost_ram,
          .phase = node.backward ? Phase::kBackward : Phase::kForward,
          .measured_cost = node.cost_cpu};
    for (size_t p : predecessors[i]) {
      const TensorId in = output_of[p];
      if (std::find(op.inputs.begin(), op.inputs.end(), in) == op.inputs.end()) {
        op.inputs.push_back(in);
        op.bytes_read += graph.tensor(in).bytes();
      }
    }
    graph.AddOp(std::move(op));
    for (size_t s : successors[i]) {
      if (--pending[s] == 0) ready.emplace(parsed[s].id, s);
    }
  }
  if (graph.num_ops() != parsed.size()) {
    for (size_t i = 0; i < parsed.size(); ++i) {
      if (output_of[i] == kNone) {
        return path.Error(absl::StrFormat("the graph has a cycle through node %d (%s)",
                                          parsed[i].id, QuoteForError(parsed[i].name)));
      }
    }
  }
  HEADROOM_RETURN_IF_ERROR(graph.Validate());
  return graph;
}

}  // namespace headroom

// Import of networkx node-link training graphs, the format the Checkmate
// (Jain et al., MLSys 2020) and MOCCASIN (Bartan et al., ICML 2023)
// rematerialization papers publish their benchmark graphs in.
//
//   absl::StatusOr<Graph> g = ImportNodeLink(text, "vgg16.nx.json");
//
// Mapping: each node becomes one op (kind "node", name from the node's
// `name`, else its id) with exactly one output tensor: a 1-D u8 tensor of
// `cost_ram` bytes (role kActivation for forward nodes, kGradient for
// backward ones). Its inputs are the outputs of its predecessors (`links`
// source -> target). `backward: true` gives phase kBackward, else kForward;
// `cost_cpu` is kept as Op::measured_cost (profiled units, not seconds) and
// as flops = 0. Ops are emitted in a topological order that keeps node ids
// ascending where the edges allow. The graph already contains its backward
// pass, so it is a complete step: profile it directly, do not pass it to
// BuildTrainingStep. Ops save nothing: a forward output needed by a backward
// node is an input of that node, so "free after last use" is exactly the
// papers' no-rematerialization schedule.
//
// Errors (InvalidArgument, naming the node or link index): missing or
// mistyped attributes, duplicate ids, links to unknown nodes, cycles.
#ifndef HEADROOM_MODELS_NODE_LINK_H_
#define HEADROOM_MODELS_NODE_LINK_H_

#include <string_view>

#include "absl/status/statusor.h"
#include "graph/graph.h"

namespace headroom {

absl::StatusOr<Graph> ImportNodeLink(std::string_view json_text, std::string_view origin);

}  // namespace headroom

#endif  // HEADROOM_MODELS_NODE_LINK_H_

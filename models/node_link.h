// Import of networkx node-link training graphs, the format the Checkmate
// (Jain et al., MLSys 2020) and MOCCASIN (Bartan et al., ICML 2023)
// rematerialization papers publish their benchmark graphs in.
//
//   absl::StatusOr<Graph> g = ImportNodeLink(text, "vgg16.nx.json");
//
// Mapping: each node becomes one op (kind "node", name from the node's
// `name`, a string or a number as written, else "node<id>") with exactly one
// output tensor: a 1-D u8 tensor of `cost_ram` bytes (role kActivation for
// forward nodes, kGradient for backward ones). Its inputs are the outputs of
// its predecessors (`links` source -> target). `backward: true` gives phase
// kBackward; false, null or no `backward` kForward. `cost_cpu` is kept as
// Op::measured_cost (profiled units, not seconds) and as flops = 0. Ops are
// emitted in a topological order that keeps node ids ascending where the
// edges allow. The graph is the whole computation, with or without backward
// nodes (Note [Node-link graphs without backward]): profile it directly, do
// not pass it to BuildTrainingStep. Ops save nothing: a forward output needed
// by a backward node is an input of that node, so "free after last use" is
// exactly the papers' no-rematerialization schedule.
//
// Errors (InvalidArgument, naming the node or link index): missing or
// mistyped attributes, duplicate ids, links to unknown nodes, cycles.
//
// Note [Node-link graphs without backward]
// Checkmate and MOCCASIN pose rematerialization on any DAG: every node is
// computed at least once, in a topological order, with its inputs resident
// while it runs; an output may be freed after a reader and computed again for
// a later one. Their training graphs mark backward nodes, but their random
// DAGs (MOCCASIN's random_layered) have no `backward` attribute, no loss and
// numbers for names. Such a graph means the same thing: the DAG is the whole
// computation to schedule, not a forward pass to differentiate (its nodes
// save nothing, so there would be nothing for autograd to build). So the
// estimators and the planner take every node-link graph as a complete step
// (IsWholeStep in estimators/estimate_stages.h) and never ask for a loss.
// Headroom replays forward ops only (planner/schedule.h IsRecomputable), so
// `backward: true` is what keeps a node from being replayed; a graph without
// the attribute is all forward and any node may be replayed. A sink's output
// lives only while it is computed (Note [Liveness rule]), as a node's memory
// in Checkmate counts from its compute to its last reader.
#ifndef HEADROOM_MODELS_NODE_LINK_H_
#define HEADROOM_MODELS_NODE_LINK_H_

#include <string_view>

#include "absl/status/statusor.h"
#include "graph/graph.h"

namespace headroom {

absl::StatusOr<Graph> ImportNodeLink(std::string_view json_text, std::string_view origin);

}  // namespace headroom

#endif  // HEADROOM_MODELS_NODE_LINK_H_

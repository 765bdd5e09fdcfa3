// Tensor lifetimes over a schedule and the peak of live bytes.
//
//   HEADROOM_ASSIGN_OR_RETURN(Graph step, BuildTrainingStep(forward, {}));
//   MemoryProfile p = ProfileMemory(step, {});
//   p.peak_bytes;                 // activations + gradients + temporaries at the worst op
//   step.op(p.peak_op).name;      // where it happens
//   p.live_at_peak[0];            // the largest tensor live there
//
// Note [Liveness rule]
// Ops run in graph order, one at a time. A tensor's storage is allocated
// right before the op that produces it and freed right after the last op that
// reads it or any view of it; an output nobody reads lives only during its
// producing op. Saved-for-backward tensors need no special case: backward ops
// list them as inputs, so they die once their backward has run. Views
// (view_of) and in-place outputs allocate nothing and extend their base's
// life. Parameters, buffers, inputs and optimizer state live for the whole
// step. The bytes "live during op i" are those of every tensor allocated at
// or before i and freed at or after i (inputs and outputs of i both count,
// as a kernel's operands and results coexist). The peak is the maximum over
// ops; ties go to the earliest op.
//
// The computation is two passes over ops plus one over tensors: O(ops +
// tensors + edges), with flat vectors only (Note [Profile speed] in the .cc).
#ifndef HEADROOM_GRAPH_LIVENESS_H_
#define HEADROOM_GRAPH_LIVENESS_H_

#include <cstdint>
#include <map>
#include <vector>

#include "graph/graph.h"

namespace headroom {

struct ProfileOptions {
  // Roles whose bytes count towards the profile. Parameters and optimizer
  // state are left to the estimators (they depend on sharding and precision).
  std::vector<TensorRole> counted_roles = {TensorRole::kInput, TensorRole::kActivation,
                                           TensorRole::kGradient, TensorRole::kTemporary};
  // Count gradients of parameters (Tensor::grad_of is a parameter). Turn off
  // when the estimator accounts for them itself (ZeRO-2 sharding, fp32 main grads).
  bool count_parameter_gradients = true;
  // How many of the largest live tensors at the peak to list.
  size_t max_live_at_peak = 16;
};

// Lifetime of one tensor's storage, in op indices (inclusive). Tensors that
// are never allocated (views, uncounted roles, unused) have first > last.
struct TensorLifetime {
  OpId first = 0;
  OpId last = -1;
};

struct MemoryProfile {
  uint64_t peak_bytes = 0;
  OpId peak_op = kNone;  // kNone only for a graph without ops
  std::map<TensorRole, uint64_t> bytes_by_role_at_peak;
  uint64_t parameter_gradient_bytes_at_peak = 0;   // part of bytes_by_role_at_peak[kGradient]
  uint64_t activation_gradient_bytes_at_peak = 0;  // the rest of it
  // The largest counted tensors live at the peak, largest first (ties: lower id).
  std::vector<TensorId> live_at_peak;
  // Bytes live during each op (indexed by OpId): the per-op timeline.
  std::vector<uint64_t> live_bytes;
  // Highest live bytes within each phase (indexed by Phase).
  std::map<Phase, uint64_t> peak_bytes_by_phase;
  // Saved-for-backward bytes per layer: counted tensors produced by forward
  // ops (not recompute) and read by a backward-phase op, charged to the layer
  // of the last such reader (the layer whose backward frees them), which is
  // Korthikanti et al.'s "activations stored per layer". Indexed by layer;
  // tensors whose reader has no layer go to saved_bytes_outside_layers.
  std::vector<uint64_t> saved_bytes_by_layer;
  uint64_t saved_bytes_outside_layers = 0;
  // Live bytes when forward (and loss) ends: what the step holds between the
  // passes, the usual "activation memory" figure.
  uint64_t bytes_at_end_of_forward = 0;
};

// A parameter's gradient (.grad): a gradient whose grad_of is a parameter,
// which ProfileOptions::count_parameter_gradients may leave out.
bool IsParameterGradient(const Graph& graph, const Tensor& t);

// Profiles `step` (any graph in program order: a training step, a forward
// graph for inference, or an imported node-link graph).
MemoryProfile ProfileMemory(const Graph& step, const ProfileOptions& options = {});

// The storage lifetimes behind ProfileMemory (indexed by TensorId), for the
// planner and the allocator replay.
std::vector<TensorLifetime> ComputeLifetimes(const Graph& step, const ProfileOptions& options = {});

}  // namespace headroom

#endif  // HEADROOM_GRAPH_LIVENESS_H_

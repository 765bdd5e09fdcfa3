#include "graph/liveness.h"

#include <algorithm>
#include <array>

namespace headroom {
namespace {

// Note [Profile speed]
// A 70B model at sequence 8192 gives a step of tens of thousands of ops and
// tensors, and the estimators profile it several times per run (searching the
// largest micro-batch). Everything here is a flat vector indexed by id, built
// in one pass over op inputs/outputs; the live-bytes timeline is a difference
// array (+bytes at the first op, -bytes after the last) turned into a prefix
// sum, so the whole profile is O(ops + tensors + edges) with no maps, strings
// or per-tensor allocation. bench/graph_liveness_bench.cc compares it with the
// naive scan of every tensor at every op.

bool WholeStep(TensorRole role) {
  return role == TensorRole::kParameter || role == TensorRole::kBuffer ||
         role == TensorRole::kInput || role == TensorRole::kOptimizerState;
}

std::array<bool, 8> CountedRoles(const ProfileOptions& options) {
  std::array<bool, 8> counted{};
  for (TensorRole role : options.counted_roles) counted[static_cast<size_t>(role)] = true;
  return counted;
}

}  // namespace

bool IsParameterGradient(const Graph& graph, const Tensor& t) {
  return t.role == TensorRole::kGradient && t.grad_of != kNone &&
         graph.tensor(t.grad_of).role == TensorRole::kParameter;
}

std::vector<TensorLifetime> ComputeLifetimes(const Graph& step, const ProfileOptions& options) {
  const auto num_ops = static_cast<OpId>(step.num_ops());
  std::vector<TensorLifetime> life(step.num_tensors(), TensorLifetime{.first = num_ops, .last = -1});
  const std::span<const Tensor> tensors = step.tensors();
  for (const Op& op : step.ops()) {
    for (TensorId out : op.outputs) {
      TensorLifetime& l = life[static_cast<size_t>(step.storage(out))];
      l.first = std::min(l.first, op.id);
      l.last = std::max(l.last, op.id);
    }
    for (TensorId in : op.inputs) {
      TensorLifetime& l = life[static_cast<size_t>(step.storage(in))];
      l.last = std::max(l.last, op.id);
    }
  }
  const std::array<bool, 8> counted = CountedRoles(options);
  for (const Tensor& t : tensors) {
    TensorLifetime& l = life[static_cast<size_t>(t.id)];
    const bool count = counted[static_cast<size_t>(t.role)] && t.view_of == kNone &&
                       (options.count_parameter_gradients || !IsParameterGradient(step, t));
    if (!count) {
      l = {.first = 0, .last = -1};
    } else if (WholeStep(t.role)) {
      l = {.first = 0, .last = num_ops - 1};
    } else if (l.first > l.last) {
      l = {.first = 0, .last = -1};  // never produced: nothing to allocate
    }
  }
  return life;
}

MemoryProfile ProfileMemory(const Graph& step, const ProfileOptions& options) {
  MemoryProfile profile;
  const size_t num_ops = step.num_ops();
  if (num_ops == 0) return profile;
  const std::vector<TensorLifetime> life = ComputeLifetimes(step, options);
  const std::span<const Tensor> tensors = step.tensors();

  std::vector<int64_t> delta(num_ops + 1, 0);
  for (const Tensor& t : tensors) {
    const TensorLifetime& l = life[static_cast<size_t>(t.id)];
    if (l.first > l.last) continue;
    const auto bytes = static_cast<int64_t>(t.bytes());
    delta[static_cast<size_t>(l.first)] += bytes;
    delta[static_cast<size_t>(l.last) + 1] -= bytes;
  }
  profile.live_bytes.resize(num_ops);
  int64_t live = 0;
  OpId last_forward = kNone;
  for (size_t i = 0; i < num_ops; ++i) {
    live += delta[i];
    const auto bytes = static_cast<uint64_t>(live);
    profile.live_bytes[i] = bytes;
    const Op& op = step.op(static_cast<OpId>(i));
    if (profile.peak_op == kNone || bytes > profile.peak_bytes) {
      profile.peak_bytes = bytes;
      profile.peak_op = static_cast<OpId>(i);
    }
    uint64_t& phase_peak = profile.peak_bytes_by_phase[op.phase];
    phase_peak = std::max(phase_peak, bytes);
    if (IsForwardPhase(op.phase) && !op.recompute) {
      last_forward = static_cast<OpId>(i);
    }
  }

  const OpId peak = profile.peak_op;
  std::vector<TensorId> live_at_peak;
  for (const Tensor& t : tensors) {
    const TensorLifetime& l = life[static_cast<size_t>(t.id)];
    if (l.first > l.last) continue;
    const uint64_t bytes = t.bytes();
    if (l.first <= peak && peak <= l.last) {
      profile.bytes_by_role_at_peak[t.role] += bytes;
      if (t.role == TensorRole::kGradient) {
        (IsParameterGradient(step, t) ? profile.parameter_gradient_bytes_at_peak
                                      : profile.activation_gradient_bytes_at_peak) += bytes;
      }
      if (bytes > 0) live_at_peak.push_back(t.id);
    }
    if (last_forward != kNone && l.first <= last_forward && last_forward < l.last) {
      profile.bytes_at_end_of_forward += bytes;
    }
    // Saved for backward: made by a forward op, freed by a backward op.
    const OpId producer = step.producer(t.id);
    if (producer == kNone || bytes == 0) continue;
    const Op& made_by = step.op(producer);
    const Op& freed_by = step.op(l.last);
    const bool forward = IsForwardPhase(made_by.phase);
    if (made_by.recompute || !forward || freed_by.phase != Phase::kBackward) {
      continue;
    }
    if (freed_by.layer < 0) {
      profile.saved_bytes_outside_layers += bytes;
    } else {
      if (profile.saved_bytes_by_layer.size() <= static_cast<size_t>(freed_by.layer)) {
        profile.saved_bytes_by_layer.resize(static_cast<size_t>(freed_by.layer) + 1, 0);
      }
      profile.saved_bytes_by_layer[static_cast<size_t>(freed_by.layer)] += bytes;
    }
  }
  const size_t keep = std::min(options.max_live_at_peak, live_at_peak.size());
  auto larger = [&step](TensorId a, TensorId b) {
    const uint64_t ba = step.tensor(a).bytes();
    const uint64_t bb = step.tensor(b).bytes();
    return ba != bb ? ba > bb : a < b;
  };
  std::partial_sort(live_at_peak.begin(), live_at_peak.begin() + static_cast<ptrdiff_t>(keep),
                    live_at_peak.end(), larger);
  live_at_peak.resize(keep);
  profile.live_at_peak = std::move(live_at_peak);
  return profile;
}

}  // namespace headroom

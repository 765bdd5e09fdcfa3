// A synthesised transformer-like training trace, shared by the replay
// benchmarks on the simulated device (allocator_replay_bench.cc) and on a GPU
// (cuda_allocator_bench.cc).
//
// The trace: persistent weights (and, from the first backward, gradients) of
// a 24-layer model with hidden size 4096; each step runs forward (saved
// activations per layer, attention scores freed after use) and backward
// (gradient temporaries; saved activations freed in reverse), with the
// sequence length changing from step to step as with dynamic batches, which
// is what fragments a caching allocator. 16 steps: 8,648 events, 41.16 GiB
// live at the peak.
#ifndef HEADROOM_BENCH_TRANSFORMER_TRACE_H_
#define HEADROOM_BENCH_TRANSFORMER_TRACE_H_

#include <algorithm>
#include <cstdint>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "replay/allocation_trace.h"

namespace headroom::bench {

inline AllocationTrace TransformerTrace(int steps) {
  AllocationTrace trace{.source = "synthetic-transformer", .format = "synthetic", .events = {}};
  uint64_t next = 1;
  auto alloc = [&](uint64_t size) {
    trace.events.push_back({.op = TraceOp::kAllocate, .pointer = next, .size = size});
    return next++;
  };
  auto free = [&](uint64_t pointer) { trace.events.push_back({.op = TraceOp::kFree, .pointer = pointer}); };
  constexpr uint64_t kHidden = 4096, kHeads = 32, kLayers = 24, kBytes = 2;  // bf16
  for (uint64_t l = 0; l < kLayers; ++l) {
    alloc(3 * kHidden * kHidden * kBytes);  // qkv weights
    alloc(kHidden * kHidden * kBytes);      // output projection
    alloc(8 * kHidden * kHidden * kBytes);  // MLP up + down
    alloc(2 * kHidden * kBytes);            // norms
  }
  const uint64_t seqs[] = {1024, 1536, 2048, 1280, 1792, 896, 2048, 1152};
  std::vector<uint64_t> grads;
  for (int step = 0; step < steps; ++step) {
    const uint64_t tokens = seqs[step % 8] * 2;  // batch 2
    const uint64_t seq = seqs[step % 8];
    std::vector<std::vector<uint64_t>> saved(kLayers);
    for (uint64_t l = 0; l < kLayers; ++l) {
      saved[l].push_back(alloc(tokens * kHidden * kBytes));      // layer input (norm output)
      saved[l].push_back(alloc(3 * tokens * kHidden * kBytes));  // q, k, v
      const uint64_t scores = alloc(2 * kHeads * seq * seq * kBytes);
      saved[l].push_back(alloc(2 * kHeads * seq * seq * kBytes));  // softmax probabilities
      free(scores);
      saved[l].push_back(alloc(tokens * kHidden * kBytes));      // attention output
      saved[l].push_back(alloc(4 * tokens * kHidden * kBytes));  // MLP hidden
      const uint64_t gelu = alloc(4 * tokens * kHidden * kBytes);
      saved[l].push_back(gelu);
      saved[l].push_back(alloc(tokens * kHidden * kBytes));      // residual output
    }
    const uint64_t logits = alloc(tokens * 32000 * 4);  // fp32 logits
    free(logits);
    for (uint64_t l = kLayers; l-- > 0;) {
      const uint64_t grad_hidden = alloc(4 * tokens * kHidden * kBytes);
      const uint64_t grad_scores = alloc(2 * kHeads * seq * seq * kBytes);
      const uint64_t grad_in = alloc(tokens * kHidden * kBytes);
      if (step == 0) {
        for (uint64_t size : {3 * kHidden * kHidden, kHidden * kHidden, 8 * kHidden * kHidden}) {
          grads.push_back(alloc(size * kBytes));
        }
      }
      free(grad_scores);
      free(grad_hidden);
      for (auto it = saved[l].rbegin(); it != saved[l].rend(); ++it) free(*it);
      free(grad_in);
    }
  }
  return trace;
}

// The most bytes live at once (requested sizes).
inline uint64_t PeakLive(const AllocationTrace& trace) {
  absl::flat_hash_map<uint64_t, uint64_t> live;
  uint64_t current = 0, peak = 0;
  for (const TraceEvent& e : trace.events) {
    if (e.op == TraceOp::kAllocate) {
      live[e.pointer] = e.size;
      current += e.size;
      peak = std::max(peak, current);
    } else if (e.op == TraceOp::kFree) {
      current -= live[e.pointer];
      live.erase(e.pointer);
    }
  }
  return peak;
}

}  // namespace headroom::bench

#endif  // HEADROOM_BENCH_TRANSFORMER_TRACE_H_

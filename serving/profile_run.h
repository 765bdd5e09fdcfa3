// What a serving engine's start-up measures besides weights and cache, as
// Headroom estimates it before launch: the profile run's activation peak,
// memory outside PyTorch, and the CUDA graphs. The engines measure these on
// the GPU; here they are formulas read from the engines' code and sized
// against published start-up logs, so unlike the block arithmetic
// (serving/kv_cache_layout.h) they are estimates (README, Serving).
//
// Note [vLLM profile run]
// vLLM runs one forward over max_num_batched_tokens tokens (split into
// min(tokens, max_num_seqs) requests; every max_num_seqs before V1), then
// its sampler over one row per request (model_runner.py profile_run,
// _dummy_run, _dummy_sampler_run in each release). From V1 attention kernels
// do not run in it (its output buffer does). Per token of d bytes, with H the
// hidden size, I the MLP's width, h and kv the heads on this rank of hd:
//  - attention: 2H + (h + 2 kv) hd + h hd + H;
//  - MLP: 2H + max(3I, I + H) (3H + 3I before 0.6.5, which matches the
//    peaks an RTX 3090 logged under 0.6.4 to 0.01 GiB at 20000 and 29000
//    tokens: vllm-project/vllm#10517);
//  - a mixture of experts through fused_moe: 3H + topk (max(N, H) + N / 2)
//    with N = 2 I_expert (N + N / 2 + H before 0.8), and E (d + 4) + 8 topk
//    bytes of router logits and ids; chunks of at most 32768 tokens from 0.6
//    to 0.11 and 16384 in 0.15 to 0.17;
//  - plus H under tensor parallelism (the all-reduce's output).
// The sampler holds, per row and vocabulary entry, the logits in the model's
// dtype and the copies its top-p/top-k path makes: 5d + 19 bytes in 0.2,
// 5d + 18 to 0.5, d + 30 in 0.6 to 0.10, d + 26 in 0.11 to 0.16, d + 12
// from 0.17 (FlashInfer's sampler, the default on an H100) - while the
// forward's [tokens, H] output is still held. The peak is the larger of the
// two. (Read from the wheels; no GPU measured them here.)
//
// Note [vLLM non-PyTorch memory]
// What vLLM counts outside PyTorch depends on its era (Note [vLLM eras] in
// serving/engine.h): the CUDA context and library handles that start-up
// leaves (0.35 GiB on an RTX 3090 with 0.6.4: vllm-project/vllm#10517,
// "non_torch_memory=0.35GiB") where the era counts them, else only what grows
// after the baseline snapshot (0.16 GiB on an H100 with 0.6.6:
// vllm-project/vllm#12126). Tensor parallelism adds NCCL's lazily allocated
// buffers: 0.20 GiB on RTX 3090s under 0.8 (vllm-project/vllm#14447) is the
// one figure found; Headroom adds 0.25 GiB, unmeasured here.
//
// Note [CUDA graph memory]
// vLLM captures one graph per batch size (V0: 1, 2, 4, then multiples of 8
// up to max_num_seqs and 256; V1: the same to 256, then steps of 16 up to
// min(2 max_num_seqs, 512) and at most max_num_batched_tokens). Published
// captures took 0.60 GiB for a 24-layer model and 1.12 GiB for a 40-layer
// one with 43 sizes (logs gathered in the session notes of issue [14]):
// about 0.625 MiB per size and layer, the figure used. It comes out of the
// KV cache from 0.20; before, it must fit in what the utilization leaves.
// SGLang captures up to cuda_graph_max_bs and keeps it within its static
// fraction's remainder.
#ifndef HEADROOM_SERVING_PROFILE_RUN_H_
#define HEADROOM_SERVING_PROFILE_RUN_H_

#include <cstdint>

#include "models/model_config.h"
#include "serving/engine.h"

namespace headroom {

inline constexpr uint64_t kVllmStartupNonTorchBytes = 350 * (uint64_t{1} << 20);   // Note [vLLM non-PyTorch memory]
inline constexpr uint64_t kVllmNonTorchGrowthBytes = 160 * (uint64_t{1} << 20);
inline constexpr uint64_t kNcclBuffersBytes = 256 * (uint64_t{1} << 20);
inline constexpr uint64_t kCudaGraphBytesPerSizeAndLayer = 640 * (uint64_t{1} << 10);  // Note [CUDA graph memory]

struct ProfileRunOptions {
  EngineRelease release;
  int64_t tokens = 0;        // max_num_batched_tokens
  int64_t max_num_seqs = 0;
  int tensor_parallel = 1;
  int64_t dtype_bytes = 2;
  bool samples = true;       // the last pipeline stage runs the sampler
};

struct ProfileRun {
  int64_t rows = 0;             // requests of the dummy batch (sampler rows)
  uint64_t forward_bytes = 0;   // the forward's peak above the weights
  uint64_t sampler_bytes = 0;   // the sampler's, with the forward's output held
  uint64_t peak_bytes = 0;      // the larger
};

// Note [vLLM profile run].
ProfileRun VllmProfileRun(const ModelConfig& config, const ProfileRunOptions& options);

// Batch sizes vLLM captures a CUDA graph for (Note [CUDA graph memory]).
int64_t VllmCudaGraphSizes(const EngineRelease& release, int64_t max_num_seqs, int64_t max_num_batched_tokens);

}  // namespace headroom

#endif  // HEADROOM_SERVING_PROFILE_RUN_H_

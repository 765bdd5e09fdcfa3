// The serving engines Headroom sizes, by release: which rules a release of
// vLLM or SGLang follows when it divides a GPU at start-up. Each rule names the
// engine's code it comes from; they were read from the engines' PyPI wheels,
// release by release (the versions in each Note are the wheels read: a
// boundary lies between the last wheel without a change and the first with it).
//
//   absl::StatusOr<EngineRelease> vllm = ParseEngine("vllm@0.6.3");
//   const VllmRules rules = VllmRulesOf(*vllm);   // how 0.6.3 counts
//   ParseEngine("vllm")   -> the current release (kCurrentVllm)
//
// Note [vLLM eras]
// How vLLM turns the GPU into a KV cache budget changed five times; each
// release follows one of these (vllm/worker/worker.py before V1,
// vllm/v1/worker/gpu_worker.py determine_available_memory after):
//  - 0.2.x: free memory after the profile run is all it reads; the cache gets
//    total x utilization less everything in use on the device (the CUDA
//    context, weights, the profile's cached activations, other processes).
//  - 0.3.x to 0.6.3: the same, less the free memory at start (a baseline), so
//    the CUDA context and other processes no longer count; PyTorch's cache of
//    the profile run's activations still does (no empty_cache).
//  - 0.6.4, and V1 from 0.8 to 0.10: PyTorch's peak (weights included) plus
//    the memory outside PyTorch (the CUDA context and other processes again).
//  - 0.6.5 to 0.7.x, and V1 from 0.11: weights, the profile's activation peak
//    and the growth of non-PyTorch memory since a baseline snapshot
//    (utils/mem_utils.py memory_profiling); from 0.15 the request is
//    ceil(total x utilization) (v1/worker/utils.py request_memory).
//  - from 0.20 the CUDA graphs' memory, measured by a capture before the
//    cache exists, is subtracted too (VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS
//    defaults to 1 from 0.20; it appeared in 0.18 with 0); 0.34 turns on the
//    extensible KV cache on CUDA, which sizes the cache after warm-up with a
//    margin (v1/worker/extensible_kv_cache.py), and defaults the utilization
//    to 1.0 there (0.92 otherwise; 0.90 before 0.20).
// V1 became the default engine in 0.8.0 (VLLM_USE_V1 "1"). Its KV cache
// manager groups layers of different kinds from 0.11 (the first wheel read
// after 0.8.0); earlier releases size every attention layer as a full one.
// The block accounting of each era is Note [vLLM KV blocks] in
// serving/kv_cache_layout.h.
//
// Note [SGLang release]
// SGLang's rules are those of 0.5.23 (python/sglang/srt/mem_cache/
// kv_cache_configurator.py, model_executor/pool_configurator.py,
// arg_groups/memory_hook.py), the release read; other SGLang releases are
// refused by name rather than sized by rules they may not follow.
#ifndef HEADROOM_SERVING_ENGINE_H_
#define HEADROOM_SERVING_ENGINE_H_

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace headroom {

enum class Engine : uint8_t { kVllm, kSglang };
std::string_view EngineName(Engine engine);  // "vllm", "sglang"

struct EngineRelease {
  Engine engine = Engine::kVllm;
  int major = 0;
  int minor = 0;
  int patch = 0;

  bool AtLeast(int ma, int mi, int pa = 0) const {
    return major != ma ? major > ma : minor != mi ? minor > mi : patch >= pa;
  }
  std::string Version() const;  // "0.6.3"
  std::string Name() const;     // "vLLM 0.6.3", "SGLang 0.5.23"
};

inline constexpr EngineRelease kCurrentVllm{.engine = Engine::kVllm, .major = 0, .minor = 34, .patch = 0};
inline constexpr EngineRelease kCurrentSglang{.engine = Engine::kSglang, .major = 0, .minor = 5, .patch = 23};
inline constexpr EngineRelease kOldestVllm{.engine = Engine::kVllm, .major = 0, .minor = 2, .patch = 0};

// "vllm", "sglang" (their current releases), "vllm@0.6.3", "vllm@0.6.4.post1" (a post release counts as
// its release). Errors name the spec: an unknown engine, a malformed version, a vLLM before 0.2 or after the
// current release, an SGLang other than the one read (Note [SGLang release]).
absl::StatusOr<EngineRelease> ParseEngine(std::string_view spec);

// How a vLLM release measures what the KV cache may have (Note [vLLM eras]).
enum class VllmProfile : uint8_t {
  kDeviceUsed,            // 0.2.x
  kFreeDrop,              // 0.3.x - 0.6.3
  kTorchPeakAndNonTorch,  // 0.6.4; V1 0.8 - 0.10
  kBaselineIncrease,      // 0.6.5 - 0.7.x; V1 from 0.11
};

struct VllmRules {
  bool v1 = false;                  // the V1 engine (0.8.0 on)
  VllmProfile profile = VllmProfile::kBaselineIncrease;
  bool ceil_request = false;        // requested = ceil(total x utilization) (0.15 on)
  bool free_memory_check = false;   // "Free memory on device ... on startup is less than desired" (0.11 on)
  bool subtracts_cuda_graphs = false;  // the CUDA-graph estimate comes out of the cache (0.20 on)
  bool extensible_kv_cache = false;    // sized after warm-up, on CUDA by default (0.34 on)
  double default_utilization = 0.9;    // 0.92 from 0.20; 1.0 with the extensible cache
  int64_t default_block_size = 16;     // 64 from 0.34
  bool hybrid_groups = false;          // layers grouped by kind (sliding window, MLA) (0.11 on)
  bool attention_layers_only = false;  // only attention layers hold a cache (0.6.3 on)
  bool null_block = false;             // one block is kept back from every check (0.29 on)
  bool tokens_from_concurrency = false;  // "KV cache size" = concurrency x max_model_len (0.21 on)
  bool check_per_request = false;      // V1's check of one request's blocks against the memory (0.8 on)
  bool estimates_max_len = false;      // that check's error gives the longest length that fits (0.11 on)
  bool model_spelled = false;          // "model's" where earlier releases print "models's" (0.22 on)
  bool docs_link = false;              // errors end with a link to the conserving-memory page (0.15 on)
  bool bitsandbytes = true;            // loads bitsandbytes checkpoints (removed in 0.28)
  bool gptq_g_idx = true;              // GPTQ layers hold a g_idx even without act-order (until 0.20)
  bool tier_160gib = false;            // the >= 160 GiB batch defaults (read in 0.34)
  bool memory_tiers = false;           // batch defaults by memory, not by the name H100/H200 (0.11 on)
};
VllmRules VllmRulesOf(const EngineRelease& release);

}  // namespace headroom

#endif  // HEADROOM_SERVING_ENGINE_H_

// How a serving engine lays out the KV cache of one GPU: the page each layer
// keeps per block, how vLLM groups layers of different kinds into blocks that
// share one pool, and how a byte budget becomes blocks, tokens and the number
// of max-length requests that fit; SGLang's bytes per token and token pool.
//
//   std::vector<KvLayer> layers = KvLayersOf(config, {...});
//   absl::StatusOr<VllmKvCache> kv = SizeVllmKvCache(layers, available_bytes, {...});
//   kv->num_blocks; kv->tokens; kv->max_concurrency; kv->error;   // error: the engine's start-up message
//
// Note [vLLM KV blocks]
// V1 (vllm/v1/kv_cache_interface.py, v1/core/kv_cache_utils.py, and
// v1/core/kv_cache_planning.py from 0.33): a full-attention layer's page holds
// block_size tokens of keys and values for its KV heads on this rank
// (block_size x num_kv_heads x 2 x head_size x dtype bytes); MLA's holds one
// latent of kv_lora_rank + qk_rope_head_dim per token, on every rank; a Mamba
// layer's holds its conv and SSM state. Layers whose specs are equal form one
// group; specs of one kind with different pages form one group whose block
// spans them all; a hybrid model (sliding window beside full attention)
// brings every page to the largest (a smaller attention page by a larger
// block_size) and splits each kind into groups of group_size layers: the
// fewest layers of any kind, or the most when the most is under 1.5 times the
// fewest (get_kv_cache_groups). A block id then holds one page of every layer
// of one group: bytes_per_block = group_size x page, and num_blocks =
// available // bytes_per_block, the blocks of every group drawn from one pool.
// One request at max_model_len needs, per group, cdiv(its spec's most bytes
// per request, page) blocks: every block of max_model_len for full attention,
// (cdiv(min(window - 1 + tokens in flight, max_model_len), block) + 1) for a
// sliding window, its state for Mamba. The start-up check (from 0.29 with
// the null block held back) refuses a budget without a block ("No available
// memory for the cache blocks") or below one request ("To serve at least one
// request with the model's max seq len ..."), giving from 0.11 the longest
// max_model_len that fits (a binary search over lengths); the log's
// "Maximum concurrency" is num_blocks over one request's blocks (from 0.21;
// before, tokens = num_blocks // groups x block_size over max_model_len).
// Releases before 0.11 size every attention layer as full, in one group.
// V0 (before 0.8; worker/cache_engine.py get_cache_block_size) has one block
// of every layer (every attention layer from 0.6.3): num_gpu_blocks =
// available // (page x layers), and refuses a max_model_len above
// block_size x num_gpu_blocks.
//
// Note [SGLang token pool]
// SGLang 0.5.23 (model_executor/pool_configurator.py) sizes its pool in
// tokens: a token's cell is num_kv_heads per rank x (head_dim + v_head_dim) x
// layers x dtype bytes (MLA: the latent, not split by tensor parallelism), and
// max_total_num_tokens = available // cell, rounded down to the page size;
// under one token it raises "Not enough memory. Please try to increase
// --mem-fraction-static." Sliding-window layers hold whole sequences, except
// in the architectures SGLang gives a hybrid SWA pool (is_hybrid_swa_model;
// of Headroom's families, GPT-OSS): there a token costs the full layers'
// cell plus swa_full_tokens_ratio (0.8) of the sliding ones', the sliding
// pool holds 0.8 of the full pool's tokens, and a pool below the window plus
// a page refuses to start (HybridSWAPoolConfigurator).
#ifndef HEADROOM_SERVING_KV_CACHE_LAYOUT_H_
#define HEADROOM_SERVING_KV_CACHE_LAYOUT_H_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "models/model_config.h"
#include "serving/engine.h"

namespace headroom {

enum class KvLayerKind : uint8_t { kFull, kSlidingWindow, kChunkedLocal, kMla, kMamba };
std::string_view KvLayerKindName(KvLayerKind kind);  // "full", "sliding", "chunked_local", "mla", "mamba"

// One layer's cache on one GPU.
struct KvLayer {
  int layer = 0;  // the model's layer index
  KvLayerKind kind = KvLayerKind::kFull;
  int64_t num_kv_heads = 0;  // on this rank; 1 for MLA
  int64_t head_size = 0;     // keys (MLA: kv_lora_rank + qk_rope_head_dim)
  int64_t head_size_v = 0;   // values (0 for MLA)
  int64_t dtype_bytes = 2;
  int64_t block_size = 16;
  int64_t window = 0;  // sliding window or attention chunk, tokens
  uint64_t state_bytes = 0;  // Mamba: conv and SSM state per request

  uint64_t PageBytes() const;
  bool SameSpec(const KvLayer& other) const;  // all but the index
};

struct KvLayerOptions {
  int tensor_parallel = 1;
  int64_t dtype_bytes = 2;   // the KV cache's
  int64_t block_size = 16;
  int first_layer = 0;       // this pipeline stage's layers [first_layer, end_layer)
  int end_layer = -1;        // -1: to the last
  bool windows = true;       // sliding-window and chunked layers as such (false: sized as full)
  DType state_dtype = DType::kBF16;  // Mamba's conv and SSM state
};

// The layers of `config` that hold a cache, on one rank of one stage. A model without attention or state
// (none here: the caller refuses them) gives none.
std::vector<KvLayer> KvLayersOf(const ModelConfig& config, const KvLayerOptions& options);

// vLLM's layer groups (Note [vLLM KV blocks]).
struct KvGroup {
  KvLayer spec;             // the group's spec (its page and block size after unification)
  std::vector<int> layers;  // model layer indices
  int padding = 0;          // empty slots of a hybrid group
};

struct VllmKvOptions {
  VllmRules rules;
  int64_t max_model_len = 0;
  int64_t max_num_batched_tokens = 0;
  int pipeline_parallel = 1;
  bool async_scheduling = true;  // 0.34: tokens in flight = (pp + 1) x max_num_batched_tokens
  std::optional<int64_t> num_gpu_blocks_override;
  bool extensible_hint = false;  // 0.34's error hints under the extensible KV cache
  double utilization = 0.92;     // for those hints
};

struct VllmKvCache {
  std::vector<KvGroup> groups;
  uint64_t bytes_per_block = 0;
  int64_t block_size = 0;        // the engine's (the smallest of the groups')
  int64_t num_blocks = 0;        // available // bytes_per_block (the null block included, as vLLM counts)
  int64_t blocks_per_request = 0;  // one request at max_model_len
  uint64_t bytes_per_request = 0;
  int64_t tokens = 0;            // "GPU KV cache size: N tokens"
  double max_concurrency = 0;    // "Maximum concurrency for max_model_len tokens per request: X"
  int64_t max_model_len_that_fits = 0;  // the longest length one request can have (0: none)
  std::string error;             // the engine's start-up error, empty when it starts
};

// Sizes the cache of one GPU from `available_bytes` (what determine_available_memory returns; may be
// negative). Errors (not the engine's: Headroom's) only for layers vLLM cannot group.
absl::StatusOr<VllmKvCache> SizeVllmKvCache(const std::vector<KvLayer>& layers, int64_t available_bytes,
                                            const VllmKvOptions& options);

// vLLM's own rendering of a byte count in errors: round(bytes / 2^30, 2) as Python prints a float ("16.0",
// "10.72").
std::string VllmGib(double bytes);

// SGLang (Note [SGLang token pool]).
struct SglangKvCache {
  double cell_bytes = 0;       // one token of every layer (hybrid SWA: the sliding layers' at 0.8)
  int64_t max_total_tokens = 0;
  int64_t swa_tokens = 0;      // the sliding-window pool's (hybrid SWA models), else 0
  int64_t max_running_requests = 0;
  double max_concurrency = 0;  // max_total_tokens / context_length
  std::string error;
};
SglangKvCache SizeSglangKvCache(const std::vector<KvLayer>& layers, int64_t available_bytes, int64_t page_size,
                                int64_t context_length, std::optional<int64_t> max_running_requests);

}  // namespace headroom

#endif  // HEADROOM_SERVING_KV_CACHE_LAYOUT_H_

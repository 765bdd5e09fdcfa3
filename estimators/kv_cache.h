// KV-cache bytes for inference, as a paged server such as vLLM allocates
// them.
//
//   KvCacheOptions kv{.num_layers = 32, .num_kv_heads = 8, .head_dim = 128,
//                     .dtype = DType::kBF16, .context_tokens = 8192, .batch = 4};
//   KvCacheBytes(kv)       // 4 sequences x ceil(8192 / 16) blocks x block bytes
//   KvBlockBytes(kv)       // 2 * 16 * 8 * 128 * 2 * 32 = 2 MiB
//
// Note [Paged KV blocks]
// vLLM stores keys and values in fixed-size blocks of block_size tokens
// (16 by default); a sequence holds ceil(tokens / block_size) blocks, so the
// last block of each sequence is partly empty. One block of one layer holds
// block_size tokens of keys and of values for every KV head: the cache
// engine's block size is 2 * block_size * num_kv_heads * head_dim *
// dtype_bytes * num_layers (vLLM vllm/worker/cache_engine.py,
// CacheEngine.get_cache_block_size). With grouped-query attention only the
// num_key_value_heads heads are cached. block_size 0 means contiguous
// (HF transformers' DynamicCache): exactly context_tokens per sequence.
// Under tensor parallelism each rank caches num_kv_heads / tp heads.
//
// Note [Sliding-window KV cache]
// A layer that attends within a sliding window (Gemma 2's even layers)
// needs the keys and values of its last sliding_window tokens only. Paged
// servers free the blocks that fall out of the window, so such a layer holds
// ceil(min(tokens, window) / block_size) blocks, plus one while the window
// straddles a block boundary (tokens > window, block_size > 1); a
// contiguous cache (transformers' HybridCache) holds min(tokens, window)
// tokens. Full-attention layers hold the whole context as before.
//
// Note [MLA KV cache]
// Multi-head latent attention (DeepSeek-V2 and V3; Note [Multi-head latent
// attention] in models/builders/attention.cc) caches, per token and layer, one latent
// of kv_lora_rank + qk_rope_head_dim values from which every head's keys and
// values are recomputed, instead of keys and values per KV head: 576 values
// for V2 and V3 (vLLM's MLA backends and SGLang store exactly this). The
// latent is not split by heads, so every tensor-parallel rank holds all of
// it.
//
// Note [KV cache bound]
// A cache is at most kMaxKvCacheBytes (2^50 bytes, 1 PiB) per GPU, far
// beyond any GPU, so that it adds to the other categories without wrapping
// (graph/graph.h, Note [Size bounds]). ValidateKvCache checks it with
// saturating arithmetic; the byte functions below then cannot wrap.
#ifndef HEADROOM_ESTIMATORS_KV_CACHE_H_
#define HEADROOM_ESTIMATORS_KV_CACHE_H_

#include <cstdint>

#include "absl/status/status.h"
#include "graph/graph.h"

namespace headroom {

inline constexpr uint64_t kMaxKvCacheBytes = uint64_t{1} << 50;  // Note [KV cache bound]

struct KvCacheOptions {
  int64_t num_layers = 0;
  int64_t num_kv_heads = 0;  // this rank's share under tensor parallelism
  int64_t head_dim = 0;
  DType dtype = DType::kBF16;
  int64_t context_tokens = 0;  // prompt + generated tokens per sequence
  int64_t batch = 1;           // concurrent sequences
  int64_t block_size = 16;     // tokens per block; 0: contiguous, no paging
  // Note [Sliding-window KV cache]: sliding_layers of the num_layers keep
  // only the last sliding_window tokens (both 0: none).
  int64_t sliding_window = 0;
  int64_t sliding_layers = 0;
  // Note [MLA KV cache]: > 0 caches this many values per token and layer
  // (one latent) instead of keys and values for num_kv_heads heads.
  int64_t latent_dim = 0;
};

// InvalidArgument naming the field when a size is not positive; OutOfRange
// naming the fields when the cache exceeds kMaxKvCacheBytes.
absl::Status ValidateKvCache(const KvCacheOptions& options);

// Bytes of one paged block across all layers (keys and values).
uint64_t KvBlockBytes(const KvCacheOptions& options);
// Blocks one sequence of context_tokens occupies in a full-attention layer
// (rounded up), and in a sliding-window one (Note [Sliding-window KV cache]).
uint64_t KvBlocksPerSequence(const KvCacheOptions& options);
uint64_t KvSlidingBlocksPerSequence(const KvCacheOptions& options);
// The whole cache: batch sequences of context_tokens, blocks rounded up.
uint64_t KvCacheBytes(const KvCacheOptions& options);

}  // namespace headroom

#endif  // HEADROOM_ESTIMATORS_KV_CACHE_H_

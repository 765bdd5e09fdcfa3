#include "estimators/kv_cache.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_format.h"
#include "common/checked_math.h"

namespace headroom {
namespace {

// Values one token adds to one layer's cache: keys and values per KV head, or one latent (Note [MLA KV cache]).
uint64_t ValuesPerToken(const KvCacheOptions& options) {
  if (options.latent_dim > 0) return static_cast<uint64_t>(options.latent_dim);
  return SaturatingMul(2, SaturatingMul(static_cast<uint64_t>(options.num_kv_heads),
                                        static_cast<uint64_t>(options.head_dim)));
}

}  // namespace

absl::Status ValidateKvCache(const KvCacheOptions& options) {
  if (options.latent_dim < 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("kv_lora_rank + qk_rope_head_dim: must be positive for a latent cache, got %d",
                        options.latent_dim));
  }
  const bool latent = options.latent_dim > 0;
  for (const auto& [value, field] :
       {std::pair{options.num_layers, "num_hidden_layers"},
        {latent ? int64_t{1} : options.num_kv_heads, "num_key_value_heads"},
        {latent ? int64_t{1} : options.head_dim, "head_dim"}, {options.context_tokens, "context"},
        {options.batch, "micro_batch"}}) {
    if (value <= 0) {
      return absl::InvalidArgumentError(
          absl::StrFormat("%s: must be positive for a KV cache, got %d", field, value));
    }
  }
  if (options.sliding_window < 0 || options.sliding_layers < 0 || options.sliding_layers > options.num_layers ||
      (options.sliding_layers > 0) != (options.sliding_window > 0)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "sliding_window: %d sliding layers of %d with a window of %d tokens; both or neither must be positive",
        options.sliding_layers, options.num_layers, options.sliding_window));
  }
  if (options.block_size < 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("kv_block_size: must be 0 (contiguous) or positive, got %d", options.block_size));
  }
  // Note [KV cache bound]: the same product as KvCacheBytes, saturating.
  const auto block = static_cast<uint64_t>(options.block_size > 0 ? options.block_size : 1);
  const uint64_t blocks = CeilDiv(static_cast<uint64_t>(options.context_tokens), block);
  uint64_t bytes = DTypeBytes(options.dtype, ValuesPerToken(options));
  for (uint64_t factor : {block, static_cast<uint64_t>(options.num_layers), blocks,
                          static_cast<uint64_t>(options.batch)}) {
    bytes = SaturatingMul(bytes, factor);
  }
  if (bytes > kMaxKvCacheBytes) {
    const std::string per_token =
        latent ? absl::StrFormat("a latent of %d", options.latent_dim)
               : absl::StrFormat("2 x num_key_value_heads %d x head_dim %d", options.num_kv_heads, options.head_dim);
    return absl::OutOfRangeError(absl::StrFormat(
        "micro_batch %d x context %d x num_hidden_layers %d x %s x %s: a KV cache of %s bytes, more than the %d "
        "(1 PiB) a GPU's cache may hold",
        options.batch, options.context_tokens, options.num_layers, per_token, DTypeName(options.dtype),
        bytes == UINT64_MAX ? std::string("over 2^64") : std::to_string(bytes), kMaxKvCacheBytes));
  }
  return absl::OkStatus();
}

uint64_t KvBlockBytes(const KvCacheOptions& options) {
  const auto tokens = static_cast<uint64_t>(options.block_size > 0 ? options.block_size : 1);
  return tokens * DTypeBytes(options.dtype, ValuesPerToken(options)) * static_cast<uint64_t>(options.num_layers);
}

uint64_t KvBlocksPerSequence(const KvCacheOptions& options) {
  const auto tokens = static_cast<uint64_t>(options.context_tokens);
  if (options.block_size <= 0) return tokens;
  const auto block = static_cast<uint64_t>(options.block_size);
  return (tokens + block - 1) / block;
}

uint64_t KvSlidingBlocksPerSequence(const KvCacheOptions& options) {
  if (options.sliding_window <= 0) return KvBlocksPerSequence(options);
  KvCacheOptions window = options;
  window.context_tokens = std::min(options.context_tokens, options.sliding_window);
  const bool straddles = options.context_tokens > options.sliding_window && options.block_size > 1;
  return KvBlocksPerSequence(window) + (straddles ? 1 : 0);
}

uint64_t KvCacheBytes(const KvCacheOptions& options) {
  // KvBlockBytes covers every layer; split it into layers (it is a multiple of num_layers).
  const uint64_t per_layer = KvBlockBytes(options) / static_cast<uint64_t>(options.num_layers);
  const auto sliding = static_cast<uint64_t>(options.sliding_layers);
  const uint64_t full = static_cast<uint64_t>(options.num_layers) - sliding;
  const uint64_t blocks = full * KvBlocksPerSequence(options) + sliding * KvSlidingBlocksPerSequence(options);
  return static_cast<uint64_t>(options.batch) * blocks * per_layer;
}

}  // namespace headroom

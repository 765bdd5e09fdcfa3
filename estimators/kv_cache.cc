#include "estimators/kv_cache.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_format.h"
#include "common/checked_math.h"

namespace headroom {

absl::Status ValidateKvCache(const KvCacheOptions& options) {
  for (const auto& [value, field] :
       {std::pair{options.num_layers, "num_hidden_layers"}, {options.num_kv_heads, "num_key_value_heads"},
        {options.head_dim, "head_dim"}, {options.context_tokens, "context"},
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
  uint64_t bytes = DTypeBytes(options.dtype, SaturatingMul(static_cast<uint64_t>(options.num_kv_heads),
                                                          static_cast<uint64_t>(options.head_dim)));
  for (uint64_t factor : {uint64_t{2}, block, static_cast<uint64_t>(options.num_layers), blocks,
                          static_cast<uint64_t>(options.batch)}) {
    bytes = SaturatingMul(bytes, factor);
  }
  if (bytes > kMaxKvCacheBytes) {
    return absl::OutOfRangeError(absl::StrFormat(
        "micro_batch %d x context %d x num_hidden_layers %d x 2 x num_key_value_heads %d x head_dim %d x "
        "%s: a KV cache of %s bytes, more than the %d (1 PiB) a GPU's cache may hold",
        options.batch, options.context_tokens, options.num_layers, options.num_kv_heads, options.head_dim,
        DTypeName(options.dtype), bytes == UINT64_MAX ? std::string("over 2^64") : std::to_string(bytes),
        kMaxKvCacheBytes));
  }
  return absl::OkStatus();
}

uint64_t KvBlockBytes(const KvCacheOptions& options) {
  const auto tokens = static_cast<uint64_t>(options.block_size > 0 ? options.block_size : 1);
  return 2 * tokens * DTypeBytes(options.dtype, static_cast<uint64_t>(options.num_kv_heads * options.head_dim)) *
         static_cast<uint64_t>(options.num_layers);
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

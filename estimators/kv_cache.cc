#include "estimators/kv_cache.h"

#include <utility>

#include "absl/strings/str_format.h"

namespace headroom {

absl::Status ValidateKvCache(const KvCacheOptions& options) {
  for (const auto& [value, field] :
       {std::pair{options.num_layers, "num_hidden_layers"}, {options.num_kv_heads, "num_key_value_heads"},
        {options.head_dim, "head_dim"}, {options.context_tokens, "--context"},
        {options.batch, "--batch"}}) {
    if (value <= 0) {
      return absl::InvalidArgumentError(
          absl::StrFormat("%s: must be positive for a KV cache, got %d", field, value));
    }
  }
  if (options.block_size < 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("--kv-block-size: must be 0 (contiguous) or positive, got %d", options.block_size));
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

uint64_t KvCacheBytes(const KvCacheOptions& options) {
  return static_cast<uint64_t>(options.batch) * KvBlocksPerSequence(options) * KvBlockBytes(options);
}

}  // namespace headroom

// KV cache against vLLM's block size formula (CacheEngine.get_cache_block_size):
// 2 * block_size * num_kv_heads * head_dim * dtype_bytes * num_layers.
#include "estimators/kv_cache.h"

#include "common/units.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace headroom {
namespace {

TEST(KvCache, VllmBlockBytes) {
  // Llama-2-7B: 32 layers, 32 KV heads of 128, fp16: 8 MiB per 16-token block.
  KvCacheOptions llama2{.num_layers = 32, .num_kv_heads = 32, .head_dim = 128, .dtype = DType::kF16,
                        .context_tokens = 4096, .batch = 1};
  EXPECT_EQ(KvBlockBytes(llama2), 2u * 16 * 32 * 128 * 2 * 32);
  EXPECT_EQ(KvBlockBytes(llama2), 8 * kMiB);
  // Llama-3-8B with GQA caches 8 KV heads only: a quarter of that.
  KvCacheOptions llama3 = llama2;
  llama3.num_kv_heads = 8;
  llama3.dtype = DType::kBF16;
  EXPECT_EQ(KvBlockBytes(llama3), 2 * kMiB);
  // fp8 cache halves it again.
  llama3.dtype = DType::kF8E4M3;
  EXPECT_EQ(KvBlockBytes(llama3), 1 * kMiB);
}

TEST(KvCache, BlocksRoundUpPerSequence) {
  KvCacheOptions kv{.num_layers = 2, .num_kv_heads = 1, .head_dim = 64, .dtype = DType::kBF16,
                    .context_tokens = 100, .batch = 3, .block_size = 16};
  EXPECT_EQ(KvBlocksPerSequence(kv), 7u);  // ceil(100 / 16)
  EXPECT_EQ(KvCacheBytes(kv), 3u * 7 * KvBlockBytes(kv));
  kv.block_size = 0;  // contiguous: exactly 100 tokens
  EXPECT_EQ(KvCacheBytes(kv), 3u * 100 * 2 * 64 * 2 * 2);
}

// Note [Sliding-window KV cache]: Gemma-2-9B (42 layers, 8 KV heads of 256) at 32768 tokens, every other
// layer within a 4096-token window.
TEST(KvCache, SlidingLayersHoldTheWindowOnly) {
  KvCacheOptions kv{.num_layers = 42, .num_kv_heads = 8, .head_dim = 256, .dtype = DType::kBF16,
                    .context_tokens = 32768, .batch = 4, .block_size = 16, .sliding_window = 4096,
                    .sliding_layers = 21};
  ASSERT_TRUE(ValidateKvCache(kv).ok()) << ValidateKvCache(kv);
  const uint64_t token_bytes = 2u * 8 * 256 * 2;  // keys and values of one token in one layer
  EXPECT_EQ(KvSlidingBlocksPerSequence(kv), 4096u / 16 + 1);  // the window straddles a block boundary
  EXPECT_EQ(KvCacheBytes(kv), 4u * (21 * 32768 + 21 * (4096 + 16)) * token_bytes);
  // A context inside the window: the sliding layers hold all of it, as full ones do.
  kv.context_tokens = 1000;
  EXPECT_EQ(KvCacheBytes(kv), 4u * 42 * 63 * 16 * token_bytes);
  // Contiguous (transformers' HybridCache): exactly the window.
  kv.context_tokens = 32768;
  kv.block_size = 0;
  EXPECT_EQ(KvCacheBytes(kv), 4u * (21 * 32768 + 21 * 4096) * token_bytes);
  // Sliding layers without a window, or more of them than layers, are refused by name.
  kv.sliding_window = 0;
  EXPECT_THAT(std::string(ValidateKvCache(kv).message()), ::testing::HasSubstr("sliding_window"));
  kv.sliding_window = 4096;
  kv.sliding_layers = 43;
  EXPECT_FALSE(ValidateKvCache(kv).ok());
}

// Note [MLA KV cache]: DeepSeek-V3 caches a 576-value latent per token and layer, whatever its 128 heads.
TEST(KvCache, LatentAttentionCachesTheLatentOnly) {
  KvCacheOptions kv{.num_layers = 61, .num_kv_heads = 128, .head_dim = 192, .dtype = DType::kBF16,
                    .context_tokens = 32768, .batch = 2, .block_size = 16, .latent_dim = 512 + 64};
  ASSERT_TRUE(ValidateKvCache(kv).ok()) << ValidateKvCache(kv);
  EXPECT_EQ(KvBlockBytes(kv), 16u * 576 * 2 * 61);
  EXPECT_EQ(KvCacheBytes(kv), uint64_t{2} * 32768 * 576 * 2 * 61);
  kv.context_tokens = 100;  // ceil(100 / 16) = 7 blocks
  EXPECT_EQ(KvCacheBytes(kv), uint64_t{2} * 7 * 16 * 576 * 2 * 61);
  kv.latent_dim = -1;
  EXPECT_THAT(std::string(ValidateKvCache(kv).message()), ::testing::HasSubstr("kv_lora_rank"));
}

TEST(KvCache, ZeroSizesNameTheField) {
  KvCacheOptions kv{.num_layers = 2, .num_kv_heads = 0, .head_dim = 64, .context_tokens = 10};
  EXPECT_THAT(std::string(ValidateKvCache(kv).message()), ::testing::HasSubstr("num_key_value_heads"));
  kv.num_kv_heads = 1;
  kv.context_tokens = -5;
  // The library names the field; the command line maps it to --context (cli/job_flags.h).
  EXPECT_THAT(std::string(ValidateKvCache(kv).message()), ::testing::HasSubstr("context"));
}

}  // namespace
}  // namespace headroom

// The block arithmetic against vLLM 0.34.0's and SGLang 0.5.23's own outputs: every expected figure below is
// what the engine's sizing code printed for the same layers and bytes, run on a CPU
// (validation/headroom_validation/serving_reference.py runs the same comparison for every preset).
#include "serving/kv_cache_layout.h"

#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace headroom {
namespace {

constexpr int64_t kGiB = int64_t{1} << 30;

std::vector<KvLayer> Layers(int count, KvLayerKind kind, int64_t heads, int64_t head, int64_t block, int64_t window = 0,
                            int first = 0) {
  std::vector<KvLayer> out;
  for (int i = 0; i < count; ++i) {
    out.push_back({.layer = first + i, .kind = kind, .num_kv_heads = heads, .head_size = head,
                   .head_size_v = kind == KvLayerKind::kMla ? 0 : head, .dtype_bytes = 2, .block_size = block,
                   .window = window});
  }
  return out;
}

VllmKvOptions Current(int64_t max_model_len, int64_t tokens = 8192) {
  return {.rules = VllmRulesOf(kCurrentVllm), .max_model_len = max_model_len, .max_num_batched_tokens = tokens};
}

TEST(VllmKvCache, AUniformModelSplitsTheBytesIntoBlocksOfEveryLayer) {
  // Llama-3-8B's 32 layers of 8 KV heads x 128, bf16; 20 GiB.
  const std::vector<KvLayer> layers = Layers(32, KvLayerKind::kFull, 8, 128, 16);
  const VllmKvCache kv = *SizeVllmKvCache(layers, 20 * kGiB, Current(8192));
  EXPECT_EQ(kv.num_blocks, 10240);
  EXPECT_EQ(kv.tokens, 163840);
  EXPECT_DOUBLE_EQ(kv.max_concurrency, 20.0);
  EXPECT_TRUE(kv.error.empty());
  const VllmKvCache big = *SizeVllmKvCache(Layers(32, KvLayerKind::kFull, 8, 128, 64), 20 * kGiB, Current(8192));
  EXPECT_EQ(big.num_blocks, 2560);
  EXPECT_EQ(big.tokens, 163840);
}

TEST(VllmKvCache, TooLittleForOneRequestGivesTheEnginesMessageAndTheLengthThatFits) {
  const VllmKvCache kv = *SizeVllmKvCache(Layers(32, KvLayerKind::kFull, 8, 128, 16), kGiB, Current(131072));
  EXPECT_EQ(kv.error,
            "To serve at least one request with the model's max seq len (131072), (16.0 GiB KV cache is needed, which "
            "is larger than the available KV cache memory (1.0 GiB). Based on the available memory, the estimated "
            "maximum model length is 8176. Try increasing `gpu_memory_utilization` when initializing the engine (this "
            "flag also controls CPU memory reservation on the CPU backend, despite its name). Decreasing "
            "`max_model_len` also reduces what is needed. See "
            "https://docs.vllm.ai/en/latest/configuration/conserving_memory/ for more details.");
  EXPECT_EQ(kv.max_model_len_that_fits, 8176);  // the null block held back: 511 blocks of 16
  const VllmKvCache none = *SizeVllmKvCache(Layers(32, KvLayerKind::kFull, 8, 128, 16), -1000000, Current(4096));
  EXPECT_EQ(none.error,
            "No available memory for the cache blocks. Try increasing `gpu_memory_utilization` when initializing the "
            "engine (this flag also controls CPU memory reservation on the CPU backend, despite its name). See "
            "https://docs.vllm.ai/en/latest/configuration/conserving_memory/ for more details.");
}

TEST(VllmKvCache, AnOverrideFixesTheBlocks) {
  VllmKvOptions o = Current(4096);
  o.num_gpu_blocks_override = 1000;
  const VllmKvCache kv = *SizeVllmKvCache(Layers(32, KvLayerKind::kFull, 8, 128, 16), 20 * kGiB, o);
  EXPECT_EQ(kv.num_blocks, 1000);
  EXPECT_EQ(kv.tokens, 16000);
  EXPECT_DOUBLE_EQ(kv.max_concurrency, 3.90625);
}

TEST(VllmKvCache, SlidingWindowLayersShareTheBlocksOfAHybridModel) {
  // Gemma-3-like: 40 sliding layers (window 1024) and 8 full ones, 8 KV heads x 256.
  std::vector<KvLayer> layers = Layers(40, KvLayerKind::kSlidingWindow, 8, 256, 16, 1024);
  for (const KvLayer& l : Layers(8, KvLayerKind::kFull, 8, 256, 16, 0, 40)) layers.push_back(l);
  const VllmKvCache kv = *SizeVllmKvCache(layers, 10 * kGiB, Current(32768, 2048));
  EXPECT_EQ(kv.groups.size(), 6u);  // 5 sliding groups and 1 full, 8 layers each
  EXPECT_EQ(kv.bytes_per_block, 8u * 16 * 8 * 512 * 2);
  EXPECT_EQ(kv.num_blocks, 10240);
  EXPECT_EQ(kv.tokens, 91854);
  EXPECT_NEAR(kv.max_concurrency, 2.803175472214618, 1e-12);
}

TEST(VllmKvCache, MlaHoldsOneLatentOnEveryRank) {
  const VllmKvCache kv = *SizeVllmKvCache(Layers(61, KvLayerKind::kMla, 1, 576, 64), 20 * kGiB, Current(163840));
  EXPECT_EQ(kv.num_blocks, 4774);
  EXPECT_EQ(kv.tokens, 305536);
  EXPECT_NEAR(kv.max_concurrency, 1.86484375, 1e-12);
}

TEST(VllmKvCache, V0CountsBlocksTimesBlockSizeAgainstTheLength) {
  VllmKvOptions o{.rules = VllmRulesOf(*ParseEngine("vllm@0.6.4")), .max_model_len = 29000, .max_num_batched_tokens = 29000};
  // 1478 blocks of 32 layers x 16 tokens x 8 heads x 256 x 2 bytes, as an RTX 3090 logged (vllm-project/vllm#10517).
  const VllmKvCache kv = *SizeVllmKvCache(Layers(32, KvLayerKind::kFull, 8, 128, 16), 1478LL * 2 * 1024 * 1024 + 5, o);
  EXPECT_EQ(kv.num_blocks, 1478);
  EXPECT_EQ(kv.error,
            "The model's max seq len (29000) is larger than the maximum number of tokens that can be stored in KV "
            "cache (23648). Try increasing `gpu_memory_utilization` or decreasing `max_model_len` when initializing "
            "the engine.");
}

TEST(VllmKvCache, GibAsPythonPrintsIt) {
  EXPECT_EQ(VllmGib(16.0 * kGiB), "16.0");
  EXPECT_EQ(VllmGib(5.625 * kGiB), "5.62");  // ties to even, as round() does
  EXPECT_EQ(VllmGib(10.7249 * kGiB), "10.72");
}

TEST(SglangKvCache, TokensAreTheBytesOverACell) {
  const std::vector<KvLayer> layers = Layers(32, KvLayerKind::kFull, 8, 128, 1);
  const SglangKvCache kv = SizeSglangKvCache(layers, 20 * kGiB, 1, 8192, std::nullopt);
  EXPECT_DOUBLE_EQ(kv.cell_bytes, 32.0 * 8 * 256 * 2);
  EXPECT_EQ(kv.max_total_tokens, 20 * kGiB / (32 * 8 * 256 * 2));
  EXPECT_EQ(kv.max_running_requests, 4096);
  EXPECT_EQ(SizeSglangKvCache(layers, 100, 1, 8192, std::nullopt).error,
            "Not enough memory. Please try to increase --mem-fraction-static.");
}

}  // namespace
}  // namespace headroom

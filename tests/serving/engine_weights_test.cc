#include "serving/engine_weights.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "models/builders.h"
#include "models/model_source.h"

namespace headroom {
namespace {

Graph Parameters(const ModelConfig& c) {
  return *BuildModelGraph(c, {.batch = 1, .seq_len = 8, .param_dtype = DType::kBF16, .compute_dtype = DType::kBF16,
                              .attention = AttentionImpl::kFlash, .training = false});
}

// Llama-3-8B's blocks: q and o 4096 x 4096, k and v 1024 x 4096, gate, up and down 14336 x 4096.
constexpr uint64_t kBlockLinear = 2 * 4096ull * 4096 + 2 * 1024ull * 4096 + 3 * 14336ull * 4096;
constexpr uint64_t kEmbedding = 128256ull * 4096;  // and as many in the untied head
constexpr uint64_t kNorms = 65ull * 4096;

TEST(EngineWeights, Bf16WeightsAreWhatVllmLoads) {
  const ModelConfig c = *LoadPresetConfig("llama-3-8b");
  const EngineWeights w = *WeightsAsLoaded(c, Parameters(c), {.dtype_bytes = 2});
  EXPECT_EQ(w.bytes, 2 * (32 * kBlockLinear + 2 * kEmbedding + kNorms));
  // vLLM 0.6.4 on an RTX 3090: "Loading model weights took 14.9888 GB" (GiB; vllm-project/vllm#10517).
  EXPECT_NEAR(static_cast<double>(w.bytes) / (1 << 30), 14.9888, 14.9888 * 0.005);
}

TEST(EngineWeights, TensorParallelRanksSplitAllButNormsAndReplicateKvHeadsTheyOutnumber) {
  const ModelConfig c = *LoadPresetConfig("llama-3-8b");
  const Graph g = Parameters(c);
  const EngineWeights two = *WeightsAsLoaded(c, g, {.tensor_parallel = 2, .dtype_bytes = 2});
  EXPECT_EQ(two.bytes, 2 * (32 * kBlockLinear / 2 + kEmbedding + kNorms));
  // 16 ranks, 8 KV heads: each rank holds one whole key and value head.
  const EngineWeights sixteen = *WeightsAsLoaded(c, g, {.tensor_parallel = 16, .dtype_bytes = 2});
  const uint64_t per_layer = (2 * 4096ull * 4096 + 3 * 14336ull * 4096) / 16 + 2 * 128ull * 4096;
  EXPECT_EQ(sixteen.bytes, 2 * (32 * per_layer + 2 * kEmbedding / 16 + kNorms));
}

TEST(EngineWeights, Awq4BitWeightsPackEightToAnInt32WithScalesAndZerosPerGroup) {
  ModelConfig c = *LoadPresetConfig("llama-3-8b");
  c.quantization = {.method = QuantMethod::kAwq, .bits = 4, .group_size = 128, .zero_point = true};
  const EngineWeights w = *WeightsAsLoaded(c, Parameters(c), {.dtype_bytes = 2, .quantization = c.quantization});
  const uint64_t e = kBlockLinear;
  const uint64_t packed = e / 2 + 2 * (e / 128) + (e / 128) / 2;  // qweight, fp16 scales, int32 zeros
  EXPECT_EQ(w.quantized_bytes, 32 * packed);
  EXPECT_EQ(w.bytes, 32 * packed + 2 * (2 * kEmbedding + kNorms));
}

TEST(EngineWeights, PipelineStagesTakeTheRemainderBeforeTheLast) {
  EXPECT_EQ(PipelineStageLayers(32, 0, 3), std::make_pair(0, 11));
  EXPECT_EQ(PipelineStageLayers(32, 1, 3), std::make_pair(11, 22));
  EXPECT_EQ(PipelineStageLayers(32, 2, 3), std::make_pair(22, 32));
  const ModelConfig c = *LoadPresetConfig("llama-3-8b");
  const Graph g = Parameters(c);
  const EngineWeights first = *WeightsAsLoaded(c, g, {.pipeline_parallel = 2, .stage = 0, .dtype_bytes = 2});
  const EngineWeights last = *WeightsAsLoaded(c, g, {.pipeline_parallel = 2, .stage = 1, .dtype_bytes = 2});
  EXPECT_EQ(first.bytes, 2 * (16 * kBlockLinear + kEmbedding + 32ull * 4096));
  EXPECT_EQ(last.bytes, 2 * (16 * kBlockLinear + kEmbedding + 33ull * 4096));
}

}  // namespace
}  // namespace headroom

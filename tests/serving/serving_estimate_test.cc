#include "serving/serving_estimate.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace headroom {
namespace {

using ::testing::HasSubstr;

LoadedModel WithConfig(const std::string& preset, const nlohmann::json& changes) {
  nlohmann::json doc = nlohmann::json::parse(R"({"architectures": ["LlamaForCausalLM"], "model_type": "llama",
    "hidden_size": 4096, "intermediate_size": 14336, "num_attention_heads": 32, "num_hidden_layers": 32,
    "num_key_value_heads": 8, "vocab_size": 128256, "max_position_embeddings": 8192, "torch_dtype": "bfloat16"})");
  if (!changes.is_null()) doc.update(changes);
  return *LoadModelDocument(doc, preset);
}

ServingMachine H100() { return {.gpu = *GpuCatalog::Builtin().Find("h100")}; }

TEST(ServingEstimate, TheDefaultLengthIsTheModelsAsEachEngineScalesIt) {
  auto length = [](const LoadedModel& m, const char* engine) {
    return EstimateServing(m, {.engine = *ParseEngine(engine)}, H100())->max_model_len;
  };
  const nlohmann::json llama3 = {{"max_position_embeddings", 131072},
                                 {"rope_scaling", {{"rope_type", "llama3"}, {"factor", 8.0}}}};
  EXPECT_EQ(length(WithConfig("llama-3.1", llama3), "vllm"), 131072);   // llama3 keeps positions
  EXPECT_EQ(length(WithConfig("llama-3.1", llama3), "sglang"), 131072);
  const nlohmann::json linear = {{"rope_scaling", {{"type", "linear"}, {"factor", 2.0}}}};
  EXPECT_EQ(length(WithConfig("linear", linear), "vllm"), 16384);
  EXPECT_EQ(length(WithConfig("linear", linear), "sglang"), 16384);
  EXPECT_EQ(length(*LoadModel("deepseek-v3"), "vllm"), 163840);  // yarn keeps positions
}

TEST(ServingEstimate, QuantizationComesFromTheCheckpointAndTheFlagMustAgree) {
  const LoadedModel awq = WithConfig("awq", {{"quantization_config",
                                              {{"quant_method", "awq"}, {"bits", 4}, {"group_size", 128}}}});
  const ServingEstimate e = *EstimateServing(awq, {}, H100());
  EXPECT_EQ(e.quantization, "awq");
  EXPECT_EQ(e.dtype, "float16");  // AWQ's kernels
  EXPECT_LT(e.gpus[0].weights.bytes, 6ull << 30);
  absl::StatusOr<ServingEstimate> mismatch = EstimateServing(awq, {.quantization = QuantMethod::kGptq}, H100());
  EXPECT_THAT(mismatch.status().message(),
              HasSubstr("--quantization: Quantization method specified in the model config (awq) does not match"));
  absl::StatusOr<ServingEstimate> bnb =
      EstimateServing(WithConfig("plain", nlohmann::json::object()), {.quantization = QuantMethod::kBitsAndBytes}, H100());
  EXPECT_THAT(bnb.status().message(), HasSubstr("vLLM removed bitsandbytes quantization in 0.28.0"));
  EXPECT_TRUE(EstimateServing(WithConfig("plain", nlohmann::json::object()),
                              {.engine = *ParseEngine("vllm@0.27.0"), .quantization = QuantMethod::kBitsAndBytes},
                              H100())
                  .ok());
}

TEST(ServingEstimate, PipelineStagesEachSizeTheirCacheAndTheEngineTakesTheFewestBlocks) {
  const ServingEstimate e = *EstimateServing(*LoadModel("llama-3-8b"), {.pipeline_parallel = 2}, H100());
  ASSERT_EQ(e.gpus.size(), 2u);
  EXPECT_EQ(e.gpus[0].kv_layers.size() + e.gpus[1].kv_layers.size(), 32u);
  EXPECT_EQ(e.gpu_blocks, std::min(e.gpus[0].kv.num_blocks, e.gpus[1].kv.num_blocks));
  EXPECT_GT(e.gpus[1].profile.sampler_bytes, 0u);  // the last stage samples
  EXPECT_EQ(e.gpus[0].profile.sampler_bytes, 0u);
}

TEST(ServingEstimate, FixesMakeAWantedConcurrencyFit) {
  const LoadedModel m = *LoadModel("llama-3-8b");
  ServingOptions o{.wanted_concurrency = 100};
  const ServingEstimate e = *EstimateServing(m, o, H100());
  ASSERT_LT(e.max_concurrency, 100);
  const std::vector<ServingFix> fixes = ServingFixes(m, o, H100(), e);
  ASSERT_FALSE(fixes.empty());
  for (const ServingFix& f : fixes) {
    EXPECT_TRUE(f.estimate.starts) << f.flags;
    EXPECT_GE(f.estimate.max_concurrency, 100) << f.flags;
  }
  EXPECT_EQ(fixes.front().flags, "--kv-cache-dtype fp8");
}

TEST(ServingEstimate, WeightsThatDoNotFitAreTheVerdictNotAnError) {
  const ServingEstimate e = *EstimateServing(*LoadModel("llama-2-70b"), {}, H100());
  EXPECT_FALSE(e.starts);
  EXPECT_THAT(e.error, HasSubstr("CUDA out of memory while loading the weights"));
}

}  // namespace
}  // namespace headroom

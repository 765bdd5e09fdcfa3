#include "serving/engine.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace headroom {
namespace {

using ::testing::HasSubstr;

TEST(Engine, ParsesEnginesAndReleases) {
  EXPECT_EQ(ParseEngine("vllm")->Version(), kCurrentVllm.Version());
  EXPECT_EQ(ParseEngine("sglang")->Name(), "SGLang 0.5.23");
  EXPECT_EQ(ParseEngine("vllm@0.6.3")->Name(), "vLLM 0.6.3");
  EXPECT_EQ(ParseEngine("vllm@0.6.4.post1")->Version(), "0.6.4");
  EXPECT_EQ(ParseEngine("vllm@v0.8")->Version(), "0.8.0");
  EXPECT_THAT(ParseEngine("tgi").status().message(), HasSubstr("unknown engine 'tgi'"));
  EXPECT_THAT(ParseEngine("vllm@").status().message(), HasSubstr("expected a release as MAJOR.MINOR[.PATCH]"));
  EXPECT_THAT(ParseEngine("vllm@0.x").status().message(), HasSubstr("expected a release"));
  EXPECT_THAT(ParseEngine("vllm@0.1.9").status().message(), HasSubstr("from 0.2.0 on"));
  EXPECT_THAT(ParseEngine("vllm@0.35.0").status().message(), HasSubstr("the newest vLLM release Headroom has read is 0.34.0"));
  EXPECT_THAT(ParseEngine("sglang@0.4.3").status().message(), HasSubstr("as of 0.5.23 only"));
}

TEST(Engine, EachEraCountsAsItsWheels) {
  auto rules = [](const char* spec) { return VllmRulesOf(*ParseEngine(spec)); };
  EXPECT_EQ(rules("vllm@0.2.7").profile, VllmProfile::kDeviceUsed);
  EXPECT_EQ(rules("vllm@0.4.3").profile, VllmProfile::kFreeDrop);
  EXPECT_EQ(rules("vllm@0.6.3").profile, VllmProfile::kFreeDrop);
  EXPECT_TRUE(rules("vllm@0.6.3").attention_layers_only);
  EXPECT_EQ(rules("vllm@0.6.4").profile, VllmProfile::kTorchPeakAndNonTorch);
  EXPECT_EQ(rules("vllm@0.6.5").profile, VllmProfile::kBaselineIncrease);
  EXPECT_EQ(rules("vllm@0.8.0").profile, VllmProfile::kTorchPeakAndNonTorch);
  EXPECT_TRUE(rules("vllm@0.8.0").v1);
  EXPECT_FALSE(rules("vllm@0.8.0").hybrid_groups);
  EXPECT_EQ(rules("vllm@0.11.0").profile, VllmProfile::kBaselineIncrease);
  EXPECT_FALSE(rules("vllm@0.19.0").subtracts_cuda_graphs);
  EXPECT_TRUE(rules("vllm@0.20.0").subtracts_cuda_graphs);
  EXPECT_DOUBLE_EQ(rules("vllm@0.19.0").default_utilization, 0.9);
  EXPECT_DOUBLE_EQ(rules("vllm@0.20.0").default_utilization, 0.92);
  EXPECT_FALSE(rules("vllm@0.21.0").model_spelled);
  EXPECT_TRUE(rules("vllm@0.22.0").model_spelled);
  EXPECT_TRUE(rules("vllm@0.27.0").bitsandbytes);
  EXPECT_FALSE(rules("vllm@0.28.0").bitsandbytes);
  EXPECT_FALSE(rules("vllm@0.28.0").null_block);
  EXPECT_TRUE(rules("vllm@0.29.0").null_block);
  EXPECT_EQ(rules("vllm@0.33.0").default_block_size, 16);
  EXPECT_EQ(rules("vllm@0.34.0").default_block_size, 64);
  EXPECT_TRUE(rules("vllm@0.34.0").extensible_kv_cache);
  EXPECT_DOUBLE_EQ(rules("vllm@0.34.0").default_utilization, 1.0);
}

}  // namespace
}  // namespace headroom

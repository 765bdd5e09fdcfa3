// config.json's quantization_config as the checkpoints of each format write it, and its errors.
#include "models/quantization_config.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "models/model_config.h"
#include "models/model_source.h"

namespace headroom {
namespace {

using ::testing::HasSubstr;

absl::StatusOr<QuantizationConfig> Parse(const char* text) {
  return ParseQuantizationConfig(nlohmann::json::parse(text), JsonPath("config.json") / "quantization_config");
}

TEST(QuantizationConfig, ReadsEachFormatAsItsCheckpointsWriteIt) {
  const QuantizationConfig awq = *Parse(R"({"quant_method": "awq", "bits": 4, "group_size": 128, "version": "gemm",
                                             "zero_point": true, "modules_to_not_convert": null})");
  EXPECT_EQ(awq.method, QuantMethod::kAwq);
  EXPECT_EQ(awq.bits, 4);
  EXPECT_EQ(awq.group_size, 128);
  EXPECT_TRUE(awq.zero_point);
  const QuantizationConfig gptq = *Parse(R"({"quant_method": "gptq", "bits": 8, "group_size": -1, "desc_act": true,
                                              "sym": true})");
  EXPECT_EQ(gptq.bits, 8);
  EXPECT_EQ(gptq.group_size, -1);
  EXPECT_TRUE(gptq.act_order);
  const QuantizationConfig fp8 = *Parse(R"({"quant_method": "fp8", "activation_scheme": "dynamic",
                                             "weight_block_size": [128, 128]})");
  EXPECT_EQ(fp8.weight_block, (std::vector<int64_t>{128, 128}));
  const QuantizationConfig bnb = *Parse(R"({"quant_method": "bitsandbytes", "load_in_4bit": true,
                                             "bnb_4bit_use_double_quant": true, "llm_int8_skip_modules": ["lm_head"]})");
  EXPECT_EQ(bnb.bits, 4);
  EXPECT_TRUE(bnb.double_quant);
  EXPECT_TRUE(bnb.LeavesUnquantized("lm_head.weight"));
  const QuantizationConfig w4a16 = *Parse(R"({"quant_method": "compressed-tensors", "format": "pack-quantized",
      "config_groups": {"group_0": {"targets": ["Linear"], "weights": {"num_bits": 4, "type": "int",
      "symmetric": false, "strategy": "group", "group_size": 128}}}, "ignore": ["lm_head"]})");
  EXPECT_EQ(w4a16.method, QuantMethod::kCompressedTensors);
  EXPECT_EQ(w4a16.bits, 4);
  EXPECT_TRUE(w4a16.zero_point);
  const QuantizationConfig w8a8 = *Parse(R"({"quant_method": "compressed-tensors", "config_groups": {"group_0":
      {"weights": {"num_bits": 8, "type": "float", "strategy": "channel"}}}})");
  EXPECT_TRUE(w8a8.float_weights);
  const QuantizationConfig mxfp4 = *Parse(R"({"quant_method": "mxfp4", "modules_to_not_convert":
      ["model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"]})");
  EXPECT_TRUE(mxfp4.LeavesUnquantized("model.layers.3.self_attn.q_proj.weight"));
  EXPECT_FALSE(mxfp4.LeavesUnquantized("model.layers.3.mlp.experts.gate_up_proj"));
}

TEST(QuantizationConfig, ErrorsNameTheField) {
  EXPECT_THAT(Parse(R"({"bits": 4})").status().message(),
              HasSubstr("config.json: quantization_config.quant_method: required field is missing"));
  EXPECT_THAT(Parse(R"({"quant_method": "hqq"})").status().message(),
              HasSubstr("quantization_config.quant_method: unknown quantization 'hqq'"));
  EXPECT_THAT(Parse(R"({"quant_method": "gptq", "bits": 3})").status().message(),
              HasSubstr("quantization_config.bits: 3-bit gptq weights are not a format the engines load"));
  EXPECT_THAT(Parse(R"({"quant_method": "awq", "group_size": 0})").status().message(),
              HasSubstr("quantization_config.group_size: must be -1 (per column) or positive, got 0"));
  EXPECT_THAT(Parse(R"({"quant_method": "bitsandbytes"})").status().message(),
              HasSubstr("load_in_4bit or load_in_8bit: exactly one must be true"));
  EXPECT_THAT(Parse(R"({"quant_method": "fp8", "weight_block_size": [128]})").status().message(),
              HasSubstr("quantization_config.weight_block_size: expected [rows, cols]"));
}

TEST(QuantizationConfig, PresetsKeepTheirs) {
  EXPECT_EQ(LoadPresetConfig("deepseek-v3")->quantization.method, QuantMethod::kFp8);
  EXPECT_EQ(LoadPresetConfig("gpt-oss-20b")->quantization.method, QuantMethod::kMxfp4);
  EXPECT_FALSE(LoadPresetConfig("llama-3-8b")->quantization.quantized());
  const ModelConfig llama = *LoadPresetConfig("llama-3-8b");
  EXPECT_EQ(llama.length_keys, (std::vector<std::pair<std::string, int64_t>>{{"max_position_embeddings", 8192}}));
  const ModelConfig v3 = *LoadPresetConfig("deepseek-v3");
  EXPECT_EQ(v3.rope_scaling_type, "yarn");
  EXPECT_DOUBLE_EQ(v3.rope_scaling_factor, 40);
  EXPECT_EQ(v3.original_max_position_embeddings, 4096);
}

}  // namespace
}  // namespace headroom

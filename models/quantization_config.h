// How a checkpoint stores its weights when they are quantized: config.json's
// `quantization_config`, as AutoAWQ, AutoGPTQ, bitsandbytes, llm-compressor
// (compressed-tensors), FP8 and MXFP4 checkpoints write it. A model fact, read
// with the architecture; what an engine then holds on the GPU for it is the
// serving room's (serving/engine_weights.h).
//
//   {"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": true}
//   -> {.method = kAwq, .bits = 4, .group_size = 128, .zero_point = true}
//
// Invariants kept by ParseQuantizationConfig: bits is 4 or 8 for the integer
// formats (what the engines load), group_size is -1 (one group per column) or
// positive, a block size is two positive ints. Errors name the field
// ("config.json: quantization_config.bits: 3-bit weights are not loaded by ...").
#ifndef HEADROOM_MODELS_QUANTIZATION_CONFIG_H_
#define HEADROOM_MODELS_QUANTIZATION_CONFIG_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "common/json_fields.h"
#include "nlohmann/json.hpp"

namespace headroom {

enum class QuantMethod : uint8_t {
  kUnquantized,       // weights in the checkpoint's torch_dtype
  kAwq,               // AutoAWQ: int4 packed into int32 along the output, zeros and fp16 scales per group
  kGptq,              // AutoGPTQ: int4/int8 packed into int32 along the input, zeros and scales per group
  kFp8,               // float8_e4m3 weights with fp32 scales per tensor or per weight block
  kBitsAndBytes,      // bitsandbytes NF4/FP4 (4-bit) or LLM.int8() (8-bit)
  kCompressedTensors,  // llm-compressor: int8/fp8 W8A8, packed int4 W4A16
  kMxfp4,             // OCP MX FP4: e2m1 values with one e8m0 scale per 32 (GPT-OSS's experts)
};
std::string_view QuantMethodName(QuantMethod method);  // "awq", "gptq", "fp8", "bitsandbytes", ...
// The engines' flag names for a method (vLLM --quantization): "awq", "gptq", "fp8", "bitsandbytes",
// "compressed-tensors", "mxfp4"; also "awq_marlin" and "gptq_marlin", the same checkpoints.
absl::StatusOr<QuantMethod> ParseQuantMethod(std::string_view name);

struct QuantizationConfig {
  QuantMethod method = QuantMethod::kUnquantized;
  int bits = 16;              // bits per weight value (4 or 8; 16 for none)
  int64_t group_size = -1;    // weights per scale along the input; -1: one scale per output column
  bool zero_point = false;    // an integer zero point per group (AWQ; GPTQ always stores qzeros)
  bool act_order = false;     // GPTQ desc_act / compressed-tensors actorder: a g_idx per input row
  bool float_weights = false;  // compressed-tensors: fp8 rather than int values
  std::vector<int64_t> weight_block;  // FP8 block quantization [rows, cols]; empty: one scale per tensor
  bool double_quant = false;  // bitsandbytes bnb_4bit_use_double_quant
  // Module name patterns left unquantized (modules_to_not_convert, ignore), as written ("lm_head",
  // "model.layers.*.self_attn", "re:.*mlp.gate$").
  std::vector<std::string> unquantized_modules;

  bool quantized() const { return method != QuantMethod::kUnquantized; }
  // Whether the parameter `name` ("model.layers.3.mlp.down_proj.weight") sits in a module the checkpoint left
  // unquantized.
  bool LeavesUnquantized(std::string_view name) const;
};

// Parses config.json's quantization_config object at `path`.
absl::StatusOr<QuantizationConfig> ParseQuantizationConfig(const nlohmann::json& object, const JsonPath& path);

}  // namespace headroom

#endif  // HEADROOM_MODELS_QUANTIZATION_CONFIG_H_

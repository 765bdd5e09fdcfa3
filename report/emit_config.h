// Framework settings that realize an estimated layout, so what Headroom
// budgeted is what the user runs.
//
//   nlohmann::json ds = DeepSpeedConfig(job);   // {"zero_optimization": {"stage": 3, ...}, ...}
//   std::string fsdp = FsdpSettings(job, "LlamaDecoderLayer");
//
// DeepSpeedConfig gives the fragment of a DeepSpeed config JSON that sets
// what the estimate assumed: micro-batch, gradient accumulation, precision
// (bf16/fp16 blocks), ZeRO stage and offload devices. FsdpSettings gives a
// torchrun line and the FullyShardedDataParallel arguments (sharding
// strategy, MixedPrecision, CPUOffload, transformer auto-wrap, backward
// prefetch) with the matching Accelerate config keys.
#ifndef HEADROOM_REPORT_EMIT_CONFIG_H_
#define HEADROOM_REPORT_EMIT_CONFIG_H_

#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "estimators/memory_estimate.h"
#include "nlohmann/json.hpp"

namespace headroom {

// The framework configs Headroom can write.
enum class ConfigFormat { kDeepSpeed, kFsdp };
absl::StatusOr<ConfigFormat> ParseConfigFormat(std::string_view name);  // "deepspeed", "fsdp"

// The config of `format` for `job` on `model`, as printed by `headroom estimate --emit`.
std::string EmitConfig(ConfigFormat format, const JobSpec& job, const LoadedModel& model);

nlohmann::json DeepSpeedConfig(const JobSpec& job);
// `block_class`: the decoder/encoder layer class to wrap ("LlamaDecoderLayer").
std::string FsdpSettings(const JobSpec& job, std::string_view block_class);
// The transformer block class of a Hugging Face architecture, for auto-wrap.
std::string BlockClassFor(std::string_view architecture);

}  // namespace headroom

#endif  // HEADROOM_REPORT_EMIT_CONFIG_H_

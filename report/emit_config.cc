#include "report/emit_config.h"

#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/name_table.h"

namespace headroom {
namespace {
constexpr NameTable<ConfigFormat, 2> kConfigFormatNames("config format", {{
    {"deepspeed", ConfigFormat::kDeepSpeed},
    {"fsdp", ConfigFormat::kFsdp},
}});
}  // namespace

absl::StatusOr<ConfigFormat> ParseConfigFormat(std::string_view name) { return kConfigFormatNames.Parse(name); }

std::string EmitConfig(ConfigFormat format, const JobSpec& job, const LoadedModel& model) {
  if (format == ConfigFormat::kDeepSpeed) return DeepSpeedConfig(job).dump(2) + "\n";
  return FsdpSettings(job, BlockClassFor(model.config ? model.config->architecture : ""));
}

nlohmann::json DeepSpeedConfig(const JobSpec& job) {
  const ParallelLayout& layout = job.layout;
  nlohmann::json ds;
  ds["train_micro_batch_size_per_gpu"] = job.micro_batch;
  ds["gradient_accumulation_steps"] = job.grad_accum;
  ds["train_batch_size"] = job.micro_batch * job.grad_accum * layout.data_parallel();
  if (job.precision == Precision::kBf16Mixed || job.precision == Precision::kBf16 ||
      job.precision == Precision::kFp8) {
    ds["bf16"] = {{"enabled", true}};
  } else if (job.precision == Precision::kFp16Mixed || job.precision == Precision::kFp16) {
    ds["fp16"] = {{"enabled", true}, {"loss_scale", 0}};
  }
  int stage = 0;
  if (layout.sharding == Sharding::kZero1) stage = 1;
  if (layout.sharding == Sharding::kZero2) stage = 2;
  if (layout.sharding == Sharding::kZero3) stage = 3;
  nlohmann::json zero = {{"stage", stage}};
  if (layout.offload_optimizer) zero["offload_optimizer"] = {{"device", "cpu"}, {"pin_memory", true}};
  if (layout.offload_params) zero["offload_param"] = {{"device", "cpu"}, {"pin_memory", true}};
  if (stage >= 2) zero["overlap_comm"] = true;
  ds["zero_optimization"] = zero;
  if (job.optimizer == Optimizer::kAdamW) {
    ds["optimizer"] = {{"type", "AdamW"}, {"params", {{"lr", "auto"}, {"weight_decay", "auto"}}}};
  }
  return ds;
}

std::string FsdpSettings(const JobSpec& job, std::string_view block_class) {
  const ParallelLayout& layout = job.layout;
  const bool hybrid = layout.sharding == Sharding::kFsdpHybrid;
  std::string strategy = "FULL_SHARD";
  if (hybrid) strategy = "HYBRID_SHARD";
  if (layout.sharding == Sharding::kFsdpGradOp) strategy = "SHARD_GRAD_OP";
  std::string dtype = "torch.float32";
  if (job.precision == Precision::kBf16Mixed || job.precision == Precision::kBf16) dtype = "torch.bfloat16";
  if (job.precision == Precision::kFp16Mixed || job.precision == Precision::kFp16) dtype = "torch.float16";
  const bool offload = layout.offload_params || layout.offload_optimizer;
  const int per_node = hybrid ? layout.shard_group() : std::min(layout.gpus, 8);
  const int nodes = std::max(1, layout.gpus / std::max(1, per_node));
  std::string out;
  absl::StrAppend(&out, "# torchrun: ", layout.gpus, " processes\n");
  absl::StrAppend(&out, absl::StrFormat("torchrun --nnodes=%d --nproc_per_node=%d train.py\n\n", nodes, per_node));
  absl::StrAppend(&out, "# FullyShardedDataParallel arguments\n");
  absl::StrAppend(&out, "FSDP(model,\n");
  absl::StrAppend(&out, "     sharding_strategy=ShardingStrategy.", strategy, ",\n");
  absl::StrAppend(&out, "     mixed_precision=MixedPrecision(param_dtype=", dtype,
                  ", reduce_dtype=torch.float32, buffer_dtype=", dtype, "),\n");
  absl::StrAppend(&out, "     cpu_offload=CPUOffload(offload_params=", offload ? "True" : "False", "),\n");
  absl::StrAppend(&out, "     auto_wrap_policy=functools.partial(transformer_auto_wrap_policy, "
                        "transformer_layer_cls={", std::string(block_class), "}),\n");
  absl::StrAppend(&out, "     backward_prefetch=BackwardPrefetch.BACKWARD_PRE)\n");
  if (job.checkpoint != CheckpointMode::kOff) {
    absl::StrAppend(&out, "# activation checkpointing on each ", std::string(block_class),
                    " (apply_activation_checkpointing)\n");
  }
  absl::StrAppend(&out, "\n# Accelerate config (accelerate config / fsdp_config)\n");
  absl::StrAppend(&out, "fsdp_sharding_strategy: ", strategy, "\n");
  absl::StrAppend(&out, "fsdp_offload_params: ", offload ? "true" : "false", "\n");
  absl::StrAppend(&out, "fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP\n");
  absl::StrAppend(&out, "fsdp_transformer_layer_cls_to_wrap: ", std::string(block_class), "\n");
  absl::StrAppend(&out, "fsdp_backward_prefetch: BACKWARD_PRE\n");
  absl::StrAppend(&out, "mixed_precision: ",
                  dtype == "torch.bfloat16" ? "bf16" : dtype == "torch.float16" ? "fp16" : "no", "\n");
  absl::StrAppend(&out, "fsdp_activation_checkpointing: ",
                  job.checkpoint != CheckpointMode::kOff ? "true" : "false", "\n");
  return out;
}

std::string BlockClassFor(std::string_view architecture) {
  constexpr std::pair<std::string_view, std::string_view> kBlocks[] = {
      {"LlamaForCausalLM", "LlamaDecoderLayer"},     {"MistralForCausalLM", "MistralDecoderLayer"},
      {"Qwen2ForCausalLM", "Qwen2DecoderLayer"},     {"GPT2LMHeadModel", "GPT2Block"},
      {"GPT2Model", "GPT2Block"},                    {"GPTNeoXForCausalLM", "GPTNeoXLayer"},
      {"MixtralForCausalLM", "MixtralDecoderLayer"}, {"RobertaModel", "RobertaLayer"},
      {"RobertaForMaskedLM", "RobertaLayer"},        {"RobertaForSequenceClassification", "RobertaLayer"},
  };
  for (const auto& [arch, block] : kBlocks) {
    if (arch == architecture) return std::string(block);
  }
  if (architecture.starts_with("Bert")) return "BertLayer";
  return "<your block class>";
}

}  // namespace headroom

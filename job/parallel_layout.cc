#include "job/parallel_layout.h"

#include <algorithm>
#include <string>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/name_table.h"

namespace headroom {
namespace {

constexpr NameTable<Sharding, 17> kShardingNames("sharding", {{
    {"none", Sharding::kReplicated},
    {"zero1", Sharding::kZero1},
    {"zero2", Sharding::kZero2},
    {"zero3", Sharding::kZero3},
    {"fsdp-full", Sharding::kFsdpFull},
    {"fsdp-hybrid", Sharding::kFsdpHybrid},
    {"fsdp-grad-op", Sharding::kFsdpGradOp},
    {"ddp", Sharding::kReplicated, kAlias},
    {"zero0", Sharding::kReplicated, kAlias},
    {"zero-0", Sharding::kReplicated, kAlias},
    {"zero-1", Sharding::kZero1, kAlias},
    {"zero-2", Sharding::kZero2, kAlias},
    {"zero-3", Sharding::kZero3, kAlias},
    {"fsdp", Sharding::kFsdpFull, kAlias},
    {"full_shard", Sharding::kFsdpFull, kAlias},
    {"hybrid_shard", Sharding::kFsdpHybrid, kAlias},
    {"shard_grad_op", Sharding::kFsdpGradOp, kAlias},
}});

constexpr NameTable<PipelineSchedule, 3> kPipelineScheduleNames("pipeline schedule", {{
    {"1f1b", PipelineSchedule::k1F1B},
    {"gpipe", PipelineSchedule::kGPipe},
    {"fill-drain", PipelineSchedule::kGPipe, kAlias},
}});

constexpr NameTable<Sharding, 3> kFsdpStrategyNames("FSDP sharding strategy", {{
    {"full", Sharding::kFsdpFull},
    {"hybrid", Sharding::kFsdpHybrid},
    {"grad-op", Sharding::kFsdpGradOp},
}});

constexpr NameTable<Offload, 4> kOffloadNames("offload", {{
    {"none", Offload::kOff},
    {"optimizer", Offload::kOptimizer},
    {"all", Offload::kAll},
    {"params", Offload::kAll, kAlias},
}});

}  // namespace

absl::StatusOr<Sharding> ParseFsdpStrategy(std::string_view name) { return kFsdpStrategyNames.Parse(name); }
std::string_view FsdpStrategyName(Sharding sharding) { return kFsdpStrategyNames.Name(sharding); }

absl::StatusOr<Sharding> ZeroStageSharding(int stage) {
  switch (stage) {
    case 0: return Sharding::kReplicated;
    case 1: return Sharding::kZero1;
    case 2: return Sharding::kZero2;
    case 3: return Sharding::kZero3;
    default: return absl::InvalidArgumentError(absl::StrFormat("ZeRO stage must be 0-3, got %d", stage));
  }
}

int ZeroStage(Sharding sharding) {
  switch (sharding) {
    case Sharding::kZero1: return 1;
    case Sharding::kZero2: return 2;
    case Sharding::kZero3: return 3;
    default: return 0;
  }
}

std::string_view OffloadName(Offload offload) { return kOffloadNames.Name(offload); }
absl::StatusOr<Offload> ParseOffload(std::string_view name) { return kOffloadNames.Parse(name); }

Offload ParallelLayout::offload() const {
  return offload_params ? Offload::kAll : offload_optimizer ? Offload::kOptimizer : Offload::kOff;
}

void ParallelLayout::set_offload(Offload offload) {
  offload_optimizer = offload != Offload::kOff;
  offload_params = offload == Offload::kAll;
}

std::string_view ShardingName(Sharding sharding) { return kShardingNames.Name(sharding); }

absl::StatusOr<Sharding> ParseSharding(std::string_view name) { return kShardingNames.Parse(name); }

std::string_view PipelineScheduleName(PipelineSchedule schedule) { return kPipelineScheduleNames.Name(schedule); }

absl::StatusOr<PipelineSchedule> ParsePipelineSchedule(std::string_view name) {
  return kPipelineScheduleNames.Parse(name);
}

bool IsDeepSpeed(Sharding sharding) {
  return sharding == Sharding::kZero1 || sharding == Sharding::kZero2 || sharding == Sharding::kZero3;
}

bool IsFsdp(Sharding sharding) {
  return sharding == Sharding::kFsdpFull || sharding == Sharding::kFsdpHybrid || sharding == Sharding::kFsdpGradOp;
}

bool ReshardsAfterForward(Sharding sharding) {
  return sharding == Sharding::kFsdpFull || sharding == Sharding::kFsdpHybrid;
}

int ParallelLayout::shard_group() const {
  if (sharding == Sharding::kReplicated) return 1;
  if (sharding == Sharding::kFsdpHybrid) return std::min(hybrid_shard_group, data_parallel());
  return data_parallel();
}

absl::Status ParallelLayout::Validate() const {
  for (const auto& [value, field] :
       {std::pair{gpus, "gpus"}, {tensor_parallel, "tensor_parallel"}, {pipeline_parallel, "pipeline_parallel"},
        {expert_parallel, "expert_parallel"}, {hybrid_shard_group, "hybrid_shard_group"}}) {
    if (value < 1) return absl::InvalidArgumentError(absl::StrFormat("%s: must be at least 1, got %d", field, value));
    if (value > kMaxGpus) {
      return absl::InvalidArgumentError(absl::StrFormat("%s: must be at most %d, got %d", field, kMaxGpus, value));
    }
  }
  if (pipeline_stage < -1 || pipeline_stage >= pipeline_parallel) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "pipeline_stage: stage %d does not exist; the pipeline's stages are 0 to %d (pipeline_parallel %d)",
        pipeline_stage, pipeline_parallel - 1, pipeline_parallel));
  }
  if (gpus % (static_cast<int64_t>(tensor_parallel) * pipeline_parallel) != 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "gpus: %d GPUs cannot be split into tensor parallel %d x pipeline parallel %d groups",
        gpus, tensor_parallel, pipeline_parallel));
  }
  if (data_parallel() % expert_parallel != 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "expert_parallel: expert parallel degree %d must divide the data parallel degree %d", expert_parallel,
        data_parallel()));
  }
  if (sharding == Sharding::kFsdpHybrid && data_parallel() % shard_group() != 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "hybrid_shard_group: hybrid shard group %d must divide the data parallel degree %d",
        hybrid_shard_group, data_parallel()));
  }
  if (sequence_parallel && tensor_parallel == 1) {
    return absl::InvalidArgumentError(
        "sequence_parallel: sequence parallelism needs a tensor-parallel degree above 1");
  }
  if (torch_parallel && (deepspeed_stage0 || sharding == Sharding::kZero2 || sharding == Sharding::kZero3)) {
    return absl::InvalidArgumentError(
        "torch_parallel: torch.distributed has ZeRO stage 1 (ZeroRedundancyOptimizer); it shards gradients and "
        "parameters with FSDP (--fsdp), not ZeRO stages 0, 2 or 3");
  }
  if (torch_parallel && sharding == Sharding::kZero1 && (offload_optimizer || offload_params)) {
    return absl::InvalidArgumentError("offload: ZeroRedundancyOptimizer keeps its optimizer state on the GPU");
  }
  if ((offload_optimizer || offload_params) && sharding == Sharding::kReplicated) {
    return absl::InvalidArgumentError(
        "offload: CPU offload needs ZeRO (stage 1, 2 or 3) or FSDP (full or hybrid) sharding");
  }
  if (offload_params && !(sharding == Sharding::kZero3 || IsFsdp(sharding))) {
    return absl::InvalidArgumentError(
        "offload: parameter offload needs ZeRO stage 3 or FSDP (stages 1-2 keep parameters on the GPU)");
  }
  return absl::OkStatus();
}

int ParallelLayout::MicroBatchesInFlight(int stage, int64_t micro_batches) const {
  if (pipeline_parallel == 1) return 1;
  const int64_t held = pipeline_schedule == PipelineSchedule::kGPipe ? micro_batches
                                                                     : std::min<int64_t>(pipeline_parallel - stage,
                                                                                         micro_batches);
  return static_cast<int>(std::max<int64_t>(1, held));
}

std::string ParallelLayout::Describe() const {
  std::string dp = absl::StrCat("data ", data_parallel());
  if (sharding != Sharding::kReplicated) absl::StrAppend(&dp, " (", std::string(ShardingName(sharding)), ")");
  std::string out = absl::StrFormat("%d GPU%s: %s, tensor %d%s, pipeline %d", gpus,
                                    gpus == 1 ? "" : "s", dp, tensor_parallel,
                                    sequence_parallel ? " + sequence" : "", pipeline_parallel);
  if (expert_parallel > 1) absl::StrAppend(&out, ", expert ", expert_parallel);
  if (offload_optimizer) absl::StrAppend(&out, ", optimizer offloaded");
  if (offload_params) absl::StrAppend(&out, ", parameters offloaded");
  return out;
}

}  // namespace headroom

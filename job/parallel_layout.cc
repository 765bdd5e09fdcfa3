#include "job/parallel_layout.h"

#include <algorithm>
#include <string>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace headroom {
namespace {

constexpr std::pair<std::string_view, Sharding> kNames[] = {
    {"none", Sharding::kReplicated},        {"ddp", Sharding::kReplicated},
    {"zero0", Sharding::kReplicated},       {"zero-0", Sharding::kReplicated},
    {"zero1", Sharding::kZero1},      {"zero-1", Sharding::kZero1},
    {"zero2", Sharding::kZero2},      {"zero-2", Sharding::kZero2},
    {"zero3", Sharding::kZero3},      {"zero-3", Sharding::kZero3},
    {"fsdp", Sharding::kFsdpFull},    {"fsdp-full", Sharding::kFsdpFull},
    {"full_shard", Sharding::kFsdpFull}, {"fsdp-hybrid", Sharding::kFsdpHybrid},
    {"hybrid_shard", Sharding::kFsdpHybrid},
};

}  // namespace

std::string_view ShardingName(Sharding sharding) {
  switch (sharding) {
    case Sharding::kReplicated: return "none";
    case Sharding::kZero1: return "zero1";
    case Sharding::kZero2: return "zero2";
    case Sharding::kZero3: return "zero3";
    case Sharding::kFsdpFull: return "fsdp-full";
    case Sharding::kFsdpHybrid: return "fsdp-hybrid";
  }
  return "unknown";
}

absl::StatusOr<Sharding> ParseSharding(std::string_view name) {
  const std::string lower = absl::AsciiStrToLower(std::string(name));
  for (const auto& [n, sharding] : kNames) {
    if (n == lower) return sharding;
  }
  return absl::InvalidArgumentError(absl::StrFormat(
      "unknown sharding '%s' (expected none, zero1, zero2, zero3, fsdp-full or fsdp-hybrid)", name));
}

bool IsDeepSpeed(Sharding sharding) {
  return sharding == Sharding::kZero1 || sharding == Sharding::kZero2 || sharding == Sharding::kZero3;
}

bool IsFsdp(Sharding sharding) {
  return sharding == Sharding::kFsdpFull || sharding == Sharding::kFsdpHybrid;
}

int ParallelLayout::shard_group() const {
  if (sharding == Sharding::kReplicated) return 1;
  if (sharding == Sharding::kFsdpHybrid) return std::min(hybrid_shard_group, data_parallel());
  return data_parallel();
}

absl::Status ParallelLayout::Validate() const {
  auto positive = [](int value, std::string_view flag) -> absl::Status {
    if (value < 1) {
      return absl::InvalidArgumentError(
          absl::StrFormat("%s: must be at least 1, got %d", flag, value));
    }
    return absl::OkStatus();
  };
  for (const auto& [value, flag] :
       {std::pair{gpus, "--gpus"}, {tensor_parallel, "--tp"}, {pipeline_parallel, "--pp"},
        {expert_parallel, "--ep"}, {hybrid_shard_group, "--shard-group"}}) {
    if (absl::Status s = positive(value, flag); !s.ok()) return s;
  }
  if (gpus % (tensor_parallel * pipeline_parallel) != 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "--gpus: %d GPUs cannot be split into tensor parallel %d x pipeline parallel %d groups",
        gpus, tensor_parallel, pipeline_parallel));
  }
  if (data_parallel() % expert_parallel != 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "--ep: expert parallel degree %d must divide the data parallel degree %d", expert_parallel,
        data_parallel()));
  }
  if (sharding == Sharding::kFsdpHybrid && data_parallel() % shard_group() != 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "--shard-group: hybrid shard group %d must divide the data parallel degree %d",
        hybrid_shard_group, data_parallel()));
  }
  if (sequence_parallel && tensor_parallel == 1) {
    return absl::InvalidArgumentError("--sp: sequence parallel needs --tp greater than 1");
  }
  if ((offload_optimizer || offload_params) && sharding == Sharding::kReplicated) {
    return absl::InvalidArgumentError(
        "--offload: CPU offload needs ZeRO (--zero 1|2|3) or FSDP (--fsdp full|hybrid)");
  }
  if (offload_params && !(sharding == Sharding::kZero3 || IsFsdp(sharding))) {
    return absl::InvalidArgumentError(
        "--offload: parameter offload needs ZeRO stage 3 or FSDP (stages 1-2 keep parameters on the GPU)");
  }
  return absl::OkStatus();
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

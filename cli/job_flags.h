// The command line's words for a job: the setup and layout flags of
// `headroom estimate`, their translation into a JobSpec through the
// libraries' parsers, and the one table that pairs JobSpec fields with flags.
// The libraries name fields ("micro_batch: must be at least 1"); this table
// turns those into flags ("--micro-batch: must be at least 1"), and turns a
// changed JobSpec (a fix) back into the flags that select it.
//
//   JobFlags flags;
//   AddJobFlags(*app, flags);                        // declares --micro-batch, --zero, ...
//   absl::StatusOr<JobSpec> job = ToJob(flags);       // after parsing
//   absl::Status shown = InFlagTerms(EstimateMemory(...).status());
//   FlagsForChange(job, fix.job)                     -> "--zero 2 --offload optimizer"
#ifndef HEADROOM_CLI_JOB_FLAGS_H_
#define HEADROOM_CLI_JOB_FLAGS_H_

#include <cstdint>
#include <optional>
#include <string>

#include "CLI/CLI.hpp"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "hardware/gpu_catalog.h"
#include "job/job_spec.h"
#include "models/model_source.h"

namespace headroom::cli {

struct JobFlags {
  int gpus = 1;
  int tp = 1;
  bool sp = false;
  int pp = 1;
  std::string pp_schedule = "1f1b";
  int pp_stage = -1;  // -1: the fullest stage
  bool torch_parallel = false;
  int ep = 1;
  std::optional<int> zero;
  std::string fsdp;
  int shard_group = 8;
  std::string offload = "none";
  std::string ema = "none";
  std::string precision;  // empty: bf16-mixed for training, bf16 for inference
  std::string optimizer = "adamw";
  std::string optimizer_impl = "foreach";
  int64_t micro_batch = 1;
  std::optional<int64_t> seq;
  int64_t target_seq = 0;
  int64_t grad_accum = 1;
  std::string attention;  // empty: flash, or eager for models without a flash path (T5)
  std::string checkpoint = "none";
  int checkpoint_every = 1;
  int64_t lora_rank = 0;
  std::optional<double> lora_alpha;
  std::string lora_targets;
  bool qlora = false;
  bool inference = false;
  int64_t context = 0;
  int64_t kv_block_size = 16;
  std::string kv_dtype;
  std::string cuda_context;
  int streams = 1;
  std::string alloc_conf = "pytorch-default";
  bool keep_grads = false;
  std::string head;
  int64_t images = 1;
  std::string vlm_train = "projector+lm";
  std::string loop = "hand";
  std::string rms_norm;  // empty: fused under Megatron layouts (--tp, --pp), else eager
  std::string torch_version;  // empty: the current 2.x line
  std::string kernels = "cuda";
  bool emulated_host = false;
  std::string transformers_version;  // empty: TransformersVersion's default
};

void AddJobFlags(CLI::App& app, JobFlags& flags);

// The job the flags describe. Errors name the flag at fault.
absl::StatusOr<JobSpec> ToJob(const JobFlags& flags);

// Defaults that depend on the model, for flags left out: T5, whose position bias is added to the scores, runs
// eager attention.
void ApplyModelDefaults(const JobFlags& flags, const LoadedModel& model, JobSpec& job);

// `status` with each JobSpec field name that leads a message or names a
// value replaced by its flag: "overheads.streams: ..." ->
// "--streams: ...", "micro_batch 4 x seq_len 8192 x ..." ->
// "--micro-batch 4 x --seq 8192 x ...". A field inside a longer name
// ("gpus.json") or in prose ("the context") stays as it is.
absl::Status InFlagTerms(const absl::Status& status);

// The flags that turn job `from` into job `to`, in a fixed order (layout,
// then batch, checkpointing, attention, optimizer, KV cache, LoRA). Fields
// the command line cannot set do not appear.
std::string FlagsForChange(const JobSpec& from, const JobSpec& to);

// The GPU `--gpu NAME` names, in the built-in catalog or in `--catalog FILE`
// (loaded into `catalog`, which the result then points into); nullptr when
// no GPU is named.
absl::StatusOr<const GpuSpec*> FindGpuFlag(const std::string& gpu, const std::string& catalog_path,
                                           std::optional<GpuCatalog>& catalog);

// `--budget BYTES` ("24GiB"): a positive byte count.
absl::StatusOr<uint64_t> ParseBudgetFlag(const std::string& text);
// `--budget N%` ("60%", ending in '%'): N/100 of the store-all peak, N in (0, 1000].
absl::StatusOr<double> ParseBudgetShareFlag(const std::string& text);

}  // namespace headroom::cli

#endif  // HEADROOM_CLI_JOB_FLAGS_H_

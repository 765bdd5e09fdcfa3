// The serving engines' own flags on `headroom estimate --engine vllm|sglang`,
// named as each engine's launch command names them, so that a user can paste
// the flags of `vllm serve` or `python -m sglang.launch_server`; mapped onto
// ServingOptions (serving/serving_estimate.h). A flag of the other engine is
// refused with the name this engine uses for it; an engine flag without
// --engine is refused too.
//
//   ServingFlags flags;
//   AddServingFlags(*app, flags);
//   absl::StatusOr<ServingOptions> options = ToServingOptions(flags, job_flags.tp, job_flags.pp);
#ifndef HEADROOM_CLI_SERVING_FLAGS_H_
#define HEADROOM_CLI_SERVING_FLAGS_H_

#include <optional>
#include <string>

#include "CLI/CLI.hpp"
#include "absl/status/statusor.h"
#include "serving/serving_estimate.h"

namespace headroom::cli {

struct ServingFlags {
  std::string engine;  // empty: not a serving estimate
  // vLLM's names.
  std::optional<double> gpu_memory_utilization;
  std::optional<int64_t> max_model_len;
  std::optional<int64_t> max_num_seqs;
  std::optional<int64_t> max_num_batched_tokens;
  std::optional<int64_t> block_size;
  std::optional<int64_t> num_gpu_blocks_override;
  bool enforce_eager = false;
  bool enable_chunked_prefill = false;
  bool no_enable_chunked_prefill = false;
  // SGLang's names.
  std::optional<double> mem_fraction_static;
  std::optional<int64_t> context_length;
  std::optional<int64_t> max_running_requests;
  std::optional<int64_t> chunked_prefill_size;
  std::optional<int64_t> page_size;
  bool disable_cuda_graph = false;
  // Both.
  std::string kv_cache_dtype = "auto";
  std::string quantization;
  std::string dtype = "auto";
  std::optional<int> tensor_parallel_size;
  std::optional<int> pipeline_parallel_size;
  int64_t concurrency = 1;
};

void AddServingFlags(CLI::App& app, ServingFlags& flags);

// Whether any engine flag was given (then --engine must be too).
bool AnyServingFlag(const ServingFlags& flags);

// `tp`, `pp`: Headroom's --tp/--pp, which --tensor-parallel-size/--pipeline-parallel-size may replace.
absl::StatusOr<ServingOptions> ToServingOptions(const ServingFlags& flags, int tp, int pp);

}  // namespace headroom::cli

#endif  // HEADROOM_CLI_SERVING_FLAGS_H_

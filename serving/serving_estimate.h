// What an inference server holds on each GPU, computed the way the engine
// computes it at start-up: the budget (total x utilization, or SGLang's
// static fraction), the weights as loaded, the profile run's activation
// peak, memory outside PyTorch, CUDA graphs, and what is left for the KV
// cache as blocks, tokens and concurrent max-length requests; then whether
// the engine starts, or the error it raises, and the cheapest changes that
// make a wanted length or concurrency fit.
//
//   ServingOptions options{.engine = *ParseEngine("vllm@0.6.3"), .max_model_len = 32768};
//   absl::StatusOr<ServingEstimate> e = EstimateServing(model, options, {.gpu = h100});
//   e->starts; e->error; e->gpus[0].kv.num_blocks; e->max_concurrency;
//
// Figures from the engine's own arithmetic (budget, blocks, tokens,
// concurrency, the checks and their messages) follow its code exactly; the
// measured terms (activation peak, non-PyTorch memory, CUDA graphs) are
// Headroom's estimates of what the engine would measure (serving/
// profile_run.h). Flag errors name the engine's flag ("--tensor-parallel-size
// 3 does not divide ..."); errors the engine itself would raise are not
// errors here but its verdict (`starts` false, `error` its message).
#ifndef HEADROOM_SERVING_SERVING_ESTIMATE_H_
#define HEADROOM_SERVING_SERVING_ESTIMATE_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "hardware/gpu_catalog.h"
#include "models/model_source.h"
#include "models/quantization_config.h"
#include "serving/engine.h"
#include "serving/engine_weights.h"
#include "serving/kv_cache_layout.h"
#include "serving/profile_run.h"

namespace headroom {

// The engine's flags, as a launch command gives them (unset: the engine's default for its release).
struct ServingOptions {
  EngineRelease engine = kCurrentVllm;
  std::optional<double> gpu_memory_utilization;  // vLLM; SGLang --mem-fraction-static
  std::optional<int64_t> max_model_len;          // SGLang --context-length
  std::optional<int64_t> max_num_seqs;           // SGLang --max-running-requests
  std::optional<int64_t> max_num_batched_tokens;  // SGLang --chunked-prefill-size
  std::optional<int64_t> block_size;             // SGLang --page-size
  std::string kv_cache_dtype = "auto";
  std::optional<QuantMethod> quantization;       // --quantization; unset: the checkpoint's
  std::string dtype = "auto";
  bool enforce_eager = false;                    // SGLang --disable-cuda-graph
  std::optional<bool> enable_chunked_prefill;
  int tensor_parallel = 1;
  int pipeline_parallel = 1;
  std::optional<int64_t> num_gpu_blocks_override;
  int64_t wanted_concurrency = 1;  // Headroom's --concurrency: max-length requests wanted at once (for fixes)
};

// The device: a catalog GPU (its runtime total) or a byte count taken as the runtime total.
struct ServingMachine {
  const GpuSpec* gpu = nullptr;
  std::optional<uint64_t> total_bytes;
};

// One GPU: every tensor-parallel rank of a pipeline stage holds the same.
struct ServingGpu {
  int stage = 0;
  int first_layer = 0, end_layer = 0;
  uint64_t total_bytes = 0;       // cudaMemGetInfo's total
  uint64_t budget_bytes = 0;      // total x utilization (SGLang: the static fraction of the free memory)
  uint64_t startup_bytes = 0;     // CUDA context, library handles, NCCL (before the engine's baseline)
  EngineWeights weights;
  ProfileRun profile;
  uint64_t non_torch_bytes = 0;   // what the era counts outside PyTorch
  uint64_t cuda_graph_bytes = 0;
  bool cuda_graph_in_budget = false;  // subtracted from the cache (vLLM >= 0.20)
  uint64_t margin_bytes = 0;      // the extensible cache's safety margin (vLLM 0.34)
  int64_t kv_cache_bytes = 0;     // handed to the block sizing; may be negative
  std::vector<KvLayer> kv_layers;
  VllmKvCache kv;                 // vLLM
  SglangKvCache sglang;           // SGLang
  std::string error;              // this GPU's start-up error
  // A risk the engine's own checks do not catch, from Headroom's estimates (e.g. CUDA graphs that may not fit
  // beside a cache sized without them); empty when none.
  std::string warning;
};

struct ServingEstimate {
  EngineRelease engine;
  VllmRules rules;
  std::string model_name;
  std::string gpu_name;           // catalog name, or "budget"
  bool total_sourced = true;      // the runtime total is a cited observation (else the catalog's fallback)
  // The flags as resolved.
  int64_t max_model_len = 0;
  std::string max_model_len_from;  // "max_position_embeddings 8192", "--max-model-len"
  int64_t max_num_seqs = 0;
  int64_t max_num_batched_tokens = 0;
  int64_t block_size = 0;         // vLLM's block / SGLang's page
  std::string kv_cache_dtype;
  int64_t kv_dtype_bytes = 2;
  std::string dtype;              // "bfloat16", "float16", "float32"
  int64_t dtype_bytes = 2;
  double utilization = 0;         // SGLang: mem_fraction_static
  bool chunked_prefill = true;
  bool extensible_kv_cache = false;
  bool async_scheduling = false;
  std::string quantization;       // "none", "awq", ...
  int tensor_parallel = 1;
  int pipeline_parallel = 1;
  int64_t cuda_graph_sizes = 0;   // batch sizes captured (0: eager)
  int64_t sglang_context_length = 0;
  std::vector<ServingGpu> gpus;   // one per pipeline stage
  // The engine's verdict.
  bool starts = false;
  std::string error;
  int64_t gpu_blocks = 0;         // the smallest of the stages' (vLLM uses the minimum)
  int64_t kv_cache_tokens = 0;
  double max_concurrency = 0;
  int64_t max_model_len_that_fits = 0;
  int64_t max_running_requests = 0;  // SGLang
};

absl::StatusOr<ServingEstimate> EstimateServing(const LoadedModel& model, const ServingOptions& options,
                                                const ServingMachine& machine);

// A change of flags and what it gives (the fix search).
struct ServingFix {
  std::string flags;        // "--kv-cache-dtype fp8"
  std::string description;  // "fp8 KV cache: half the bytes per token"
  ServingEstimate estimate;
};

// The cheapest changes (in the order: settings that cost nothing, then accuracy, then throughput, then
// GPUs) under which the engine starts and serves `wanted_concurrency` requests of max_model_len at once; each
// re-estimated in full. Empty when the current setup does.
std::vector<ServingFix> ServingFixes(const LoadedModel& model, const ServingOptions& options,
                                     const ServingMachine& machine, const ServingEstimate& current);

}  // namespace headroom

#endif  // HEADROOM_SERVING_SERVING_ESTIMATE_H_

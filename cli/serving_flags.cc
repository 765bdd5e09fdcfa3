#include "cli/serving_flags.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status_macros.h"
#include "models/quantization_config.h"

namespace headroom::cli {
namespace {

// A flag given to the engine that names it otherwise: (given, its name here, the other engine's name).
absl::Status Misnamed(bool given, std::string_view flag, std::string_view other, std::string_view engine) {
  if (!given) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrFormat("%s: a flag of the other engine; %s's is %s", flag, engine, other));
}

}  // namespace

void AddServingFlags(CLI::App& app, ServingFlags& f) {
  app.add_option("--engine", f.engine,
                 "Size a serving engine's start-up instead of a training step: vllm or sglang, optionally @VERSION "
                 "(vllm@0.6.3)");
  app.add_option("--gpu-memory-utilization", f.gpu_memory_utilization, "vLLM: fraction of the GPU the engine takes");
  app.add_option("--max-model-len", f.max_model_len, "vLLM: longest request, tokens (default: the model's)");
  app.add_option("--max-num-seqs", f.max_num_seqs, "vLLM: requests scheduled at once");
  app.add_option("--max-num-batched-tokens", f.max_num_batched_tokens, "vLLM: tokens per scheduler step");
  app.add_option("--block-size", f.block_size, "vLLM: tokens per KV cache block");
  app.add_option("--num-gpu-blocks-override", f.num_gpu_blocks_override, "vLLM: use this many KV blocks");
  app.add_flag("--enforce-eager", f.enforce_eager, "vLLM: no CUDA graphs");
  app.add_flag("--enable-chunked-prefill", f.enable_chunked_prefill, "vLLM: chunked prefill on");
  app.add_flag("--no-enable-chunked-prefill", f.no_enable_chunked_prefill, "vLLM: chunked prefill off");
  app.add_option("--mem-fraction-static", f.mem_fraction_static, "SGLang: fraction for weights and KV cache");
  app.add_option("--context-length", f.context_length, "SGLang: longest request, tokens");
  app.add_option("--max-running-requests", f.max_running_requests, "SGLang: requests running at once");
  app.add_option("--chunked-prefill-size", f.chunked_prefill_size, "SGLang: tokens per prefill chunk");
  app.add_option("--page-size", f.page_size, "SGLang: tokens per KV page");
  app.add_flag("--disable-cuda-graph", f.disable_cuda_graph, "SGLang: no CUDA graphs");
  app.add_option("--kv-cache-dtype", f.kv_cache_dtype, "Serving: auto, fp8, fp8_e5m2, ...");
  app.add_option("--quantization", f.quantization,
                 "Serving: awq, gptq, fp8, bitsandbytes, compressed-tensors, mxfp4 (default: the checkpoint's)");
  app.add_option("--dtype", f.dtype, "Serving: auto, float16, bfloat16, float32");
  app.add_option("--tensor-parallel-size", f.tensor_parallel_size, "Serving: tensor-parallel GPUs (or --tp)");
  app.add_option("--pipeline-parallel-size", f.pipeline_parallel_size, "Serving: pipeline stages (or --pp)");
  app.add_option("--concurrency", f.concurrency,
                 "Serving: requests of the full length wanted at once; fixes make that fit (default 1)");
}

bool AnyServingFlag(const ServingFlags& f) {
  return f.gpu_memory_utilization || f.max_model_len || f.max_num_seqs || f.max_num_batched_tokens || f.block_size ||
         f.num_gpu_blocks_override || f.enforce_eager || f.enable_chunked_prefill || f.no_enable_chunked_prefill ||
         f.mem_fraction_static || f.context_length || f.max_running_requests || f.chunked_prefill_size ||
         f.page_size || f.disable_cuda_graph || f.kv_cache_dtype != "auto" || !f.quantization.empty() ||
         f.dtype != "auto" || f.tensor_parallel_size || f.pipeline_parallel_size || f.concurrency != 1;
}

absl::StatusOr<ServingOptions> ToServingOptions(const ServingFlags& f, int tp, int pp) {
  ServingOptions o;
  absl::StatusOr<EngineRelease> engine = ParseEngine(f.engine);
  if (!engine.ok()) return absl::InvalidArgumentError(absl::StrCat("--engine: ", engine.status().message()));
  o.engine = *engine;
  const bool vllm = o.engine.engine == Engine::kVllm;
  // The flags both engines have under their own names: the other engine's name is refused with this one's.
  struct Renamed {
    std::string_view vllm, sglang;
    bool vllm_given, sglang_given;
  };
  const Renamed renamed[] = {
      {"--gpu-memory-utilization", "--mem-fraction-static", f.gpu_memory_utilization.has_value(),
       f.mem_fraction_static.has_value()},
      {"--max-model-len", "--context-length", f.max_model_len.has_value(), f.context_length.has_value()},
      {"--max-num-seqs", "--max-running-requests", f.max_num_seqs.has_value(), f.max_running_requests.has_value()},
      {"--max-num-batched-tokens", "--chunked-prefill-size", f.max_num_batched_tokens.has_value(),
       f.chunked_prefill_size.has_value()},
      {"--block-size", "--page-size", f.block_size.has_value(), f.page_size.has_value()},
      {"--enforce-eager", "--disable-cuda-graph", f.enforce_eager, f.disable_cuda_graph},
  };
  for (const Renamed& r : renamed) {
    HEADROOM_RETURN_IF_ERROR(vllm ? Misnamed(r.sglang_given, r.sglang, r.vllm, "vLLM")
                                  : Misnamed(r.vllm_given, r.vllm, r.sglang, "SGLang"));
  }
  o.gpu_memory_utilization = vllm ? f.gpu_memory_utilization : f.mem_fraction_static;
  o.max_model_len = vllm ? f.max_model_len : f.context_length;
  o.max_num_seqs = vllm ? f.max_num_seqs : f.max_running_requests;
  o.max_num_batched_tokens = vllm ? f.max_num_batched_tokens : f.chunked_prefill_size;
  o.block_size = vllm ? f.block_size : f.page_size;
  o.enforce_eager = vllm ? f.enforce_eager : f.disable_cuda_graph;
  if (vllm) {
    if (f.enable_chunked_prefill && f.no_enable_chunked_prefill) {
      return absl::InvalidArgumentError("--enable-chunked-prefill and --no-enable-chunked-prefill: give one");
    }
    o.num_gpu_blocks_override = f.num_gpu_blocks_override;
    if (f.enable_chunked_prefill) o.enable_chunked_prefill = true;
    if (f.no_enable_chunked_prefill) o.enable_chunked_prefill = false;
    if (o.num_gpu_blocks_override && *o.num_gpu_blocks_override < 1) {
      return absl::InvalidArgumentError(absl::StrFormat("--num-gpu-blocks-override: must be at least 1, got %d",
                                                        *o.num_gpu_blocks_override));
    }
  } else if (f.num_gpu_blocks_override || f.enable_chunked_prefill || f.no_enable_chunked_prefill) {
    return absl::InvalidArgumentError(
        "--num-gpu-blocks-override, --enable-chunked-prefill: vLLM's flags; SGLang has no such flag");
  }
  if (o.max_num_seqs && *o.max_num_seqs < 1) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: must be at least 1, got %d", vllm ? "--max-num-seqs" : "--max-running-requests",
        *o.max_num_seqs));
  }
  o.kv_cache_dtype = f.kv_cache_dtype;
  o.dtype = f.dtype;
  if (!f.quantization.empty()) {
    absl::StatusOr<QuantMethod> method = ParseQuantMethod(f.quantization);
    if (!method.ok()) return absl::InvalidArgumentError(absl::StrCat("--quantization: ", method.status().message()));
    o.quantization = *method;
  }
  if (f.tensor_parallel_size && tp != 1 && *f.tensor_parallel_size != tp) {
    return absl::InvalidArgumentError("--tensor-parallel-size and --tp: give one");
  }
  if (f.pipeline_parallel_size && pp != 1 && *f.pipeline_parallel_size != pp) {
    return absl::InvalidArgumentError("--pipeline-parallel-size and --pp: give one");
  }
  o.tensor_parallel = f.tensor_parallel_size.value_or(tp);
  o.pipeline_parallel = f.pipeline_parallel_size.value_or(pp);
  o.wanted_concurrency = f.concurrency;
  return o;
}

}  // namespace headroom::cli

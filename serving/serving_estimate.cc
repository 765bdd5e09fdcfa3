#include "serving/serving_estimate.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/quote.h"
#include "common/status_macros.h"
#include "common/units.h"
#include "estimators/overheads.h"
#include "models/builders.h"

namespace headroom {
namespace {

constexpr uint64_t kGiB = uint64_t{1} << 30;
constexpr uint64_t kMiB = uint64_t{1} << 20;

absl::Status FlagError(std::string_view flag, std::string_view message) {
  return absl::InvalidArgumentError(absl::StrCat(std::string(flag), ": ", std::string(message)));
}

// Note [Serving max_model_len]
// vLLM (config/model.py _get_and_verify_max_len, 0.34): the smallest of the
// length keys present (model_max_length, where present, wins), times the RoPE
// scaling factor unless the scaling is one that keeps positions (su,
// longrope, llama3, yarn, deepseek_yarn) or the model is Gemma 3; 2048 when
// no key is present. SGLang (utils/hf_transformers/common.py
// get_context_length, 0.5.23): the first present of max_sequence_length,
// seq_length, max_seq_len, model_max_length, max_position_embeddings, times
// the factor unless original_max_position_embeddings is given or the type is
// llama3. A longer --max-model-len (--context-length) is refused by both.
struct DerivedLength {
  int64_t tokens = 2048;
  std::string from = "no length key in config.json: the engines' 2048";
};

DerivedLength VllmDerivedLength(const ModelConfig& c) {
  DerivedLength out;
  const std::vector<std::pair<std::string, int64_t>>& keys = c.length_keys;
  bool found = false;
  for (const auto& [key, value] : keys) {
    if (key == "model_max_length") continue;
    if (!found || value < out.tokens) {
      out = {value, absl::StrFormat("%s %d", key, value)};
      found = true;
    }
  }
  for (const auto& [key, value] : keys) {
    if (key == "model_max_length") out = {value, absl::StrFormat("model_max_length %d", value)};
  }
  const std::string& type = c.rope_scaling_type;
  const bool keeps = type.empty() || type == "su" || type == "longrope" || type == "llama3" || type == "yarn" ||
                     type == "deepseek_yarn" || type == "deepseek_llama_scaling";
  if (!keeps && c.model_type.find("gemma3") == std::string::npos && c.rope_scaling_factor != 1) {
    out.tokens = static_cast<int64_t>(static_cast<double>(out.tokens) * c.rope_scaling_factor);
    out.from += absl::StrFormat(" x rope_scaling %s factor %g", type, c.rope_scaling_factor);
  }
  return out;
}

DerivedLength SglangDerivedLength(const ModelConfig& c) {
  DerivedLength out;
  for (std::string_view wanted :
       {"max_sequence_length", "seq_length", "max_seq_len", "model_max_length", "max_position_embeddings"}) {
    const auto it = std::find_if(c.length_keys.begin(), c.length_keys.end(),
                                 [&](const auto& kv) { return kv.first == wanted; });
    if (it == c.length_keys.end()) continue;
    out = {it->second, absl::StrFormat("%s %d", it->first, it->second)};
    if (!c.rope_scaling_type.empty() && c.rope_scaling_type != "llama3" && c.original_max_position_embeddings == 0 &&
        c.rope_scaling_factor != 1) {
      out.tokens = static_cast<int64_t>(static_cast<double>(out.tokens) * c.rope_scaling_factor);
      out.from += absl::StrFormat(" x rope_scaling factor %g", c.rope_scaling_factor);
    }
    break;
  }
  return out;
}

// --dtype (vllm config/model.py _get_and_verify_dtype): auto takes the checkpoint's, with fp32 checkpoints
// served in bf16 (fp16 before Ampere), and AWQ/GPTQ kernels in fp16.
absl::Status ResolveDtype(const ModelConfig& c, const ServingOptions& o, const GpuSpec* gpu, QuantMethod quant,
                          ServingEstimate& e) {
  const bool ampere = gpu == nullptr || gpu->compute_capability_major() >= 8;
  std::string dtype = o.dtype;
  if (dtype == "auto") {
    if (quant == QuantMethod::kAwq || quant == QuantMethod::kGptq) {
      dtype = "float16";
    } else if (c.torch_dtype == DType::kF16) {
      dtype = "float16";
    } else if (c.torch_dtype == DType::kBF16 || c.torch_dtype == DType::kF32) {
      dtype = ampere ? "bfloat16" : "float16";
    } else {
      dtype = "bfloat16";
    }
  } else if (dtype == "half" || dtype == "fp16") {
    dtype = "float16";
  } else if (dtype == "bf16") {
    dtype = "bfloat16";
  } else if (dtype == "float" || dtype == "fp32") {
    dtype = "float32";
  }
  if (dtype != "float16" && dtype != "bfloat16" && dtype != "float32") {
    return FlagError("--dtype", absl::StrFormat("unknown dtype %s (expected auto, float16, bfloat16 or float32)",
                                                QuoteForError(o.dtype)));
  }
  if (dtype == "bfloat16" && !ampere) {
    return FlagError("--dtype", absl::StrFormat("bfloat16 needs compute capability 8.0; the %s has %s", gpu->name,
                                                gpu->compute_capability));
  }
  if (dtype == "float16" && (c.model_type == "gemma2" || c.model_type == "gemma3" || c.model_type == "gemma3_text")) {
    return FlagError("--dtype", absl::StrFormat("The model type '%s' does not support float16. Reason: Numerical "
                                                "instability. Please use bfloat16 or float32 instead.",
                                                c.model_type));
  }
  e.dtype = dtype;
  e.dtype_bytes = dtype == "float32" ? 4 : 2;
  return absl::OkStatus();
}

absl::Status ResolveKvDtype(const ServingOptions& o, ServingEstimate& e) {
  const std::string& name = o.kv_cache_dtype;
  e.kv_cache_dtype = name;
  if (name == "auto") {
    e.kv_dtype_bytes = e.dtype_bytes;
  } else if (name == "float16" || name == "bfloat16" || name == "half") {
    e.kv_dtype_bytes = 2;
  } else if (name == "float32") {
    e.kv_dtype_bytes = 4;
  } else if (name == "fp8" || name == "fp8_e4m3" || name == "fp8_e5m2" || name == "fp8_inc" || name == "int8") {
    e.kv_dtype_bytes = 1;
  } else {
    return FlagError("--kv-cache-dtype",
                     absl::StrFormat("%s is not one Headroom sizes (auto, float16, bfloat16, fp8, fp8_e4m3, fp8_e5m2, "
                                     "fp8_inc, int8; vLLM's packed 4-bit formats are not modelled)",
                                     QuoteForError(name)));
  }
  return absl::OkStatus();
}

absl::StatusOr<QuantizationConfig> ResolveQuantization(const ModelConfig& c, const ServingOptions& o,
                                                       const VllmRules& rules, bool vllm) {
  QuantizationConfig q = c.quantization;
  if (o.quantization) {
    const QuantMethod asked = *o.quantization;
    if (q.quantized() && asked != q.method) {
      return FlagError("--quantization",
                       absl::StrFormat("Quantization method specified in the model config (%s) does not match the "
                                       "quantization method specified in the `quantization` argument (%s).",
                                       QuantMethodName(q.method), QuantMethodName(asked)));
    }
    if (!q.quantized()) {
      // Without a checkpoint in that format only in-flight methods apply: fp8 (weights cast at load) and
      // bitsandbytes (quantized at load); the others need their checkpoint's scales.
      if (asked == QuantMethod::kFp8) {
        q = {.method = QuantMethod::kFp8, .bits = 8, .float_weights = true};
      } else if (asked == QuantMethod::kBitsAndBytes) {
        q = {.method = QuantMethod::kBitsAndBytes, .bits = 4, .group_size = 64};
      } else if (asked != QuantMethod::kUnquantized) {
        return FlagError("--quantization",
                         absl::StrFormat("%s needs a checkpoint quantized that way (its quantization_config); %s's "
                                         "config.json has none",
                                         QuantMethodName(asked), c.origin));
      }
    }
  }
  if (vllm && q.method == QuantMethod::kBitsAndBytes && !rules.bitsandbytes) {
    return FlagError("--quantization", "bitsandbytes: vLLM removed bitsandbytes quantization in 0.28.0");
  }
  return q;
}

absl::Status CheckParallel(const ModelConfig& c, const ServingOptions& o) {
  const ModelConfig& text = c.family == ModelFamily::kVisionLanguage ? c.text_tower() : c;
  if (o.tensor_parallel < 1 || o.tensor_parallel > 1024) {
    return FlagError("--tensor-parallel-size", absl::StrFormat("must be 1 to 1024, got %d", o.tensor_parallel));
  }
  if (o.pipeline_parallel < 1 || o.pipeline_parallel > text.num_layers) {
    return FlagError("--pipeline-parallel-size",
                     absl::StrFormat("must be 1 to the model's %d layers, got %d", text.num_layers, o.pipeline_parallel));
  }
  const int64_t tp = o.tensor_parallel;
  if (text.num_heads > 0 && text.num_heads % tp != 0) {
    return FlagError("--tensor-parallel-size",
                     absl::StrFormat("Total number of attention heads (%d) must be divisible by tensor parallel size "
                                     "(%d).",
                                     text.num_heads, tp));
  }
  if (text.num_kv_heads > 0 && !text.is_mla()) {
    const bool ok = tp >= text.num_kv_heads ? tp % text.num_kv_heads == 0 : text.num_kv_heads % tp == 0;
    if (!ok) {
      return FlagError("--tensor-parallel-size",
                       absl::StrFormat("%d does not divide the %d key/value heads (nor they it): vLLM's "
                                       "QKVParallelLinear asserts '%d is not divisible by %d'",
                                       tp, text.num_kv_heads, std::max<int64_t>(tp, text.num_kv_heads),
                                       std::min<int64_t>(tp, text.num_kv_heads)));
    }
  }
  if (text.is_moe() && text.intermediate_size > 0 && (text.moe_intermediate_size > 0 ? text.moe_intermediate_size
                                                                                     : text.intermediate_size) % tp != 0) {
    return FlagError("--tensor-parallel-size", absl::StrFormat("%d does not divide the experts' width", tp));
  }
  return absl::OkStatus();
}

absl::Status CheckFamily(const LoadedModel& model) {
  if (!model.config) {
    return FlagError("--model", absl::StrFormat("%s is a graph file; serving budgets need the model's config.json "
                                                "(the engine builds the model from it)",
                                                QuoteForError(model.name)));
  }
  const ModelConfig& c = *model.config;
  switch (c.family) {
    case ModelFamily::kDecoder:
    case ModelFamily::kVisionLanguage:
    case ModelFamily::kStateSpace:
      return absl::OkStatus();
    default:
      return FlagError("--engine",
                       absl::StrFormat("%s is not a generative decoder; vLLM and SGLang size a KV cache for "
                                       "decoders and vision-language models (vLLM runs encoders such as BERT as "
                                       "pooling models, with no KV cache, and V1 dropped encoder-decoders)",
                                       c.architecture));
  }
}

// vLLM's scheduler defaults (engine/arg_utils.py: get_batch_defaults in each release, for `vllm serve`).
void VllmSchedulerDefaults(const ServingOptions& o, const VllmRules& rules, const ServingMachine& machine,
                           uint64_t total, ServingEstimate& e) {
  int64_t tokens = 2048, seqs = 256;
  if (rules.v1) {
    const std::string name = machine.gpu != nullptr ? NormalizeGpuName(machine.gpu->name) : "";
    const bool big = rules.memory_tiers ? total >= 70 * kGiB && name.find("a100") == std::string::npos
                                        : name.find("h100") != std::string::npos || name.find("h200") != std::string::npos;
    seqs = rules.memory_tiers ? (big ? 1024 : 256) : 1024;
    tokens = big ? 8192 : 2048;
    if (rules.tier_160gib && total >= 160 * kGiB) tokens = 16384;
  }
  e.chunked_prefill = o.enable_chunked_prefill.value_or(rules.v1 || e.max_model_len > 32768);
  e.max_num_seqs = o.max_num_seqs.value_or(seqs);
  if (o.max_num_batched_tokens) {
    e.max_num_batched_tokens = *o.max_num_batched_tokens;
  } else if (!e.chunked_prefill) {
    e.max_num_batched_tokens = std::max(e.max_model_len, rules.v1 ? tokens : int64_t{2048});
  } else {
    e.max_num_batched_tokens = std::min(tokens, e.max_num_seqs * e.max_model_len);
  }
}

absl::Status CheckScheduler(const ServingEstimate& e) {
  if (e.max_num_seqs < 1) return FlagError("--max-num-seqs", absl::StrFormat("must be at least 1, got %d", e.max_num_seqs));
  if (e.max_num_batched_tokens < 1 || e.max_num_batched_tokens > (int64_t{1} << 24)) {
    return FlagError("--max-num-batched-tokens",
                     absl::StrFormat("must be 1 to 16777216, got %d", e.max_num_batched_tokens));
  }
  if (!e.chunked_prefill && e.max_num_batched_tokens < e.max_model_len) {
    return FlagError("--max-num-batched-tokens",
                     absl::StrFormat("max_num_batched_tokens (%d) is smaller than max_model_len (%d). This effectively "
                                     "limits the maximum sequence length to max_num_batched_tokens and makes vLLM "
                                     "reject longer sequences. Please increase max_num_batched_tokens or decrease "
                                     "max_model_len.",
                                     e.max_num_batched_tokens, e.max_model_len));
  }
  return absl::OkStatus();
}

absl::StatusOr<Graph> ParameterGraph(const ModelConfig& c, int64_t dtype_bytes) {
  BuildOptions build;
  build.training = false;
  build.batch = 1;
  build.param_dtype = build.compute_dtype = dtype_bytes == 4 ? DType::kF32 : DType::kBF16;
  build.attention = AttentionImpl::kFlash;
  build.seq_len = c.family == ModelFamily::kVisionLanguage ? c.image_feature_tokens() + 8 : 8;
  if (!HasFlashAttentionPath(c)) build.attention = AttentionImpl::kEager;
  return BuildModelGraph(c, build);
}

uint64_t StartupBytes(const ServingOptions& o) {
  return kVllmStartupNonTorchBytes + (o.tensor_parallel * o.pipeline_parallel > 1 ? kNcclBuffersBytes : 0);
}

absl::StatusOr<ServingEstimate> EstimateVllm(const LoadedModel& model, const ServingOptions& o,
                                             const ServingMachine& machine, ServingEstimate e) {
  const ModelConfig& c = *model.config;
  const ModelConfig& text = c.family == ModelFamily::kVisionLanguage ? c.text_tower() : c;
  const VllmRules& rules = e.rules;
  const uint64_t total = e.gpus.front().total_bytes;
  if (c.family == ModelFamily::kStateSpace && !rules.hybrid_groups) {
    return FlagError("--engine", absl::StrFormat("%s keeps Mamba's state outside its paged KV cache; Headroom sizes "
                                                 "it from vLLM 0.11",
                                                 e.engine.Name()));
  }
  HEADROOM_ASSIGN_OR_RETURN(const QuantizationConfig quant, ResolveQuantization(c, o, rules, true));
  e.quantization = std::string(QuantMethodName(quant.method));
  HEADROOM_RETURN_IF_ERROR(ResolveDtype(c, o, machine.gpu, quant.method, e));
  HEADROOM_RETURN_IF_ERROR(ResolveKvDtype(o, e));
  const DerivedLength derived = VllmDerivedLength(c);
  if (o.max_model_len) {
    if (*o.max_model_len < 1) {
      return FlagError("--max-model-len", absl::StrFormat("must be at least 1, got %d", *o.max_model_len));
    }
    if (*o.max_model_len > derived.tokens) {
      return FlagError("--max-model-len",
                       absl::StrFormat("%d is longer than the model's %d (%s): vLLM raises \"User-specified "
                                       "max_model_len (%d) is greater than the derived max_model_len\" unless "
                                       "VLLM_ALLOW_LONG_MAX_MODEL_LEN=1",
                                       *o.max_model_len, derived.tokens, derived.from, *o.max_model_len));
    }
    e.max_model_len = *o.max_model_len;
    e.max_model_len_from = "--max-model-len";
  } else {
    e.max_model_len = derived.tokens;
    e.max_model_len_from = derived.from;
  }
  VllmSchedulerDefaults(o, rules, machine, total, e);
  HEADROOM_RETURN_IF_ERROR(CheckScheduler(e));
  e.utilization = o.gpu_memory_utilization.value_or(rules.default_utilization);
  if (!(e.utilization > 0) || e.utilization > 1) {
    return FlagError("--gpu-memory-utilization",
                     absl::StrFormat("must be above 0 and at most 1, got %g", e.utilization));
  }
  e.extensible_kv_cache = rules.extensible_kv_cache && !o.num_gpu_blocks_override;
  e.async_scheduling = rules.extensible_kv_cache;
  e.block_size = o.block_size.value_or(text.is_mla() && rules.v1 ? std::max<int64_t>(64, rules.default_block_size)
                                                                  : rules.default_block_size);
  if (e.block_size < 1 || e.block_size > 4096) {
    return FlagError("--block-size", absl::StrFormat("must be 1 to 4096, got %d", e.block_size));
  }
  e.cuda_graph_sizes = o.enforce_eager ? 0 : VllmCudaGraphSizes(e.engine, e.max_num_seqs, e.max_num_batched_tokens);
  HEADROOM_ASSIGN_OR_RETURN(const Graph params, ParameterGraph(c, e.dtype_bytes));

  // The request: total x utilization (ceil from 0.15; v1/worker/utils.py request_memory).
  const double requested_exact = static_cast<double>(total) * e.utilization;
  const auto requested = static_cast<int64_t>(rules.ceil_request ? std::ceil(requested_exact) : requested_exact);
  const uint64_t startup = StartupBytes(o);
  std::vector<ServingGpu> gpus;
  for (int stage = 0; stage < o.pipeline_parallel; ++stage) {
    ServingGpu g = e.gpus.front();
    g.stage = stage;
    std::tie(g.first_layer, g.end_layer) = PipelineStageLayers(static_cast<int>(text.num_layers), stage,
                                                               o.pipeline_parallel);
    g.budget_bytes = static_cast<uint64_t>(requested);
    g.startup_bytes = startup;
    HEADROOM_ASSIGN_OR_RETURN(g.weights, WeightsAsLoaded(c, params, {.tensor_parallel = o.tensor_parallel,
                                                                     .pipeline_parallel = o.pipeline_parallel,
                                                                     .stage = stage,
                                                                     .dtype_bytes = e.dtype_bytes,
                                                                     .quantization = quant,
                                                                     .gptq_g_idx = rules.gptq_g_idx}));
    g.profile = VllmProfileRun(c, {.release = e.engine,
                                   .tokens = e.max_num_batched_tokens,
                                   .max_num_seqs = e.max_num_seqs,
                                   .tensor_parallel = o.tensor_parallel,
                                   .dtype_bytes = e.dtype_bytes,
                                   .samples = stage == o.pipeline_parallel - 1});
    const uint64_t growth = kVllmNonTorchGrowthBytes + (o.tensor_parallel > 1 ? kNcclBuffersBytes : 0);
    g.cuda_graph_bytes = static_cast<uint64_t>(e.cuda_graph_sizes) * static_cast<uint64_t>(g.end_layer - g.first_layer) *
                         kCudaGraphBytesPerSizeAndLayer;
    g.cuda_graph_in_budget = rules.subtracts_cuda_graphs;
    const int64_t weights = static_cast<int64_t>(g.weights.bytes);
    const int64_t peak = static_cast<int64_t>(g.profile.peak_bytes);
    int64_t available = 0;
    switch (rules.profile) {
      case VllmProfile::kDeviceUsed:
        g.non_torch_bytes = startup + growth;
        available = requested - (static_cast<int64_t>(g.non_torch_bytes) + weights + peak);
        break;
      case VllmProfile::kFreeDrop:
        g.non_torch_bytes = growth;
        available = requested - (static_cast<int64_t>(g.non_torch_bytes) + weights + peak);
        break;
      case VllmProfile::kTorchPeakAndNonTorch:  // one reading of everything outside PyTorch
        g.non_torch_bytes = startup;
        available = requested - (weights + peak + static_cast<int64_t>(g.non_torch_bytes));
        break;
      case VllmProfile::kBaselineIncrease:
        g.non_torch_bytes = growth;
        available = requested - (weights + peak + static_cast<int64_t>(g.non_torch_bytes));
        break;
    }
    if (e.extensible_kv_cache) {
      // Sized after warm-up (v1/worker/extensible_kv_cache.py measure_kv_cache_bytes): within the request and
      // the free memory less a margin, then less the transient peak; the graphs are in what warm-up used.
      g.margin_bytes = std::max<uint64_t>(kGiB, static_cast<uint64_t>(0.75 * static_cast<double>(peak)));
      const int64_t used = weights + static_cast<int64_t>(g.non_torch_bytes + g.cuda_graph_bytes);
      const int64_t headroom = static_cast<int64_t>(total) - static_cast<int64_t>(startup) - used;
      available = std::min(requested - used, headroom - static_cast<int64_t>(g.margin_bytes)) - peak;
      g.cuda_graph_in_budget = true;
    } else if (g.cuda_graph_in_budget) {
      available -= static_cast<int64_t>(g.cuda_graph_bytes);
    }
    g.kv_cache_bytes = available;
    g.kv_layers = KvLayersOf(c, {.tensor_parallel = o.tensor_parallel,
                                 .dtype_bytes = e.kv_dtype_bytes,
                                 .block_size = e.block_size,
                                 .first_layer = g.first_layer,
                                 .end_layer = g.end_layer,
                                 .windows = rules.hybrid_groups,  // earlier releases size them as full
                                 .state_dtype = e.dtype_bytes == 4 ? DType::kF32 : DType::kBF16});
    HEADROOM_ASSIGN_OR_RETURN(g.kv, SizeVllmKvCache(g.kv_layers, available,
                                                    {.rules = rules,
                                                     .max_model_len = e.max_model_len,
                                                     .max_num_batched_tokens = e.max_num_batched_tokens,
                                                     .pipeline_parallel = o.pipeline_parallel,
                                                     .async_scheduling = e.async_scheduling,
                                                     .num_gpu_blocks_override = o.num_gpu_blocks_override,
                                                     .extensible_hint = e.extensible_kv_cache,
                                                     .utilization = e.utilization}));
    // The checks that come before the cache's, in the order the engine meets them.
    if (startup + g.weights.bytes > total) {
      g.error = absl::StrFormat(
          "torch.OutOfMemoryError: CUDA out of memory while loading the weights: %s of weights on a GPU with %s "
          "total (engine core initialization failed)",
          FormatBytes(g.weights.bytes), FormatBytes(total));
    } else if (rules.free_memory_check && !e.extensible_kv_cache &&
               static_cast<int64_t>(total - startup) < requested) {
      g.error = absl::StrFormat(
          "Free memory on device cuda:0 (%s/%s GiB) on startup is less than desired GPU memory utilization (%s, %s "
          "GiB). Decrease GPU memory utilization or reduce GPU memory used by other processes.",
          VllmGib(static_cast<double>(total - startup)), VllmGib(static_cast<double>(total)),
          absl::StrFormat("%g", e.utilization), VllmGib(static_cast<double>(requested)));
    } else {
      g.error = g.kv.error;
    }
    // Before 0.20 the graphs are captured after the cache took its share: they must fit in what the budget
    // leaves of the GPU (Note [CUDA graph memory]).
    if (g.error.empty() && !g.cuda_graph_in_budget && g.cuda_graph_bytes > 0) {
      const int64_t left = static_cast<int64_t>(total) - static_cast<int64_t>(startup) - requested +
                           (rules.profile == VllmProfile::kDeviceUsed || rules.profile == VllmProfile::kTorchPeakAndNonTorch
                                ? static_cast<int64_t>(startup)
                                : 0);
      if (static_cast<int64_t>(g.cuda_graph_bytes) > left) {
        g.warning = absl::StrFormat(
            "the CUDA graphs (about %s) may not fit in the %s the budget leaves of the GPU: capture would run out "
            "of memory; lower --gpu-memory-utilization or add --enforce-eager",
            FormatBytes(g.cuda_graph_bytes), FormatBytes(static_cast<uint64_t>(std::max<int64_t>(left, 0))));
      }
    }
    gpus.push_back(std::move(g));
  }
  e.gpus = std::move(gpus);
  // The engine's figures: the fewest blocks of any stage (every stage gets that many).
  const ServingGpu* fewest = &e.gpus.front();
  e.max_model_len_that_fits = fewest->kv.max_model_len_that_fits;
  for (const ServingGpu& g : e.gpus) {
    if (g.kv.num_blocks < fewest->kv.num_blocks) fewest = &g;
    if (e.error.empty() && !g.error.empty()) e.error = g.error;
    e.max_model_len_that_fits = std::min(e.max_model_len_that_fits, g.kv.max_model_len_that_fits);
  }
  e.starts = e.error.empty();
  e.gpu_blocks = fewest->kv.num_blocks;
  e.kv_cache_tokens = fewest->kv.tokens;
  e.max_concurrency = fewest->kv.max_concurrency;
  return e;
}

// SGLang 0.5.23's default static fraction (arg_groups/memory_hook.py handle_gpu_memory_settings), from the
// total memory in MiB; and the batch sizes it captures graphs for and chunks prefill by.
struct SglangDefaults {
  int64_t chunked_prefill = 4096;
  int64_t graph_bs = 160;
  double mem_fraction = 0.95;
};

SglangDefaults SglangDefaultsFor(uint64_t total, int tp, int pp, bool mla) {
  const double mib = static_cast<double>(total) / kMiB;
  SglangDefaults d;
  if (mib < 20 * 1024) {
    d.chunked_prefill = 2048;
    d.graph_bs = 8;
  } else if (mib < 35 * 1024) {
    d.graph_bs = tp < 4 ? 48 : 160;
  } else if (mib < 60 * 1024) {
    d.graph_bs = tp < 4 ? 32 : 160;
  } else if (mib < 160 * 1024) {
    d.chunked_prefill = 8192;
    d.graph_bs = tp < 4 ? 256 : 512;
  } else {
    d.chunked_prefill = 16384;
    d.graph_bs = 512;
  }
  // Prefill graph buckets: 4..32 step 4, 48..256 step 16, 288..512 step 32, 576..1024 step 64,
  // 1280..4096 step 256, 4608..max step 512, capped at the chunk (MLA: at most 8192), 8 MiB each; an MLA model
  // reserves 1536 MiB for them.
  const int64_t cap = mla ? std::min<int64_t>(8192, d.chunked_prefill) : d.chunked_prefill;
  int64_t buckets = 0;
  for (auto [from, to, step] : {std::tuple<int64_t, int64_t, int64_t>{4, 32, 4}, {48, 256, 16}, {288, 512, 32},
                                {576, 1024, 64}, {1280, 4096, 256}, {4608, cap, 512}}) {
    for (int64_t s = from; s <= to && s <= cap; s += step) ++buckets;
  }
  const double activation_tokens = static_cast<double>(std::max<int64_t>(d.chunked_prefill, 2048));
  double reserved = 512 + activation_tokens * 1.5 + tp * pp / 8.0 * 1024 + static_cast<double>(d.graph_bs * 2) +
                    (mla ? 1536 : static_cast<double>(buckets) * 8);
  if (mib > 60 * 1024) reserved = std::max(reserved, 10240.0);
  d.mem_fraction = std::round((mib - reserved) / mib * 1000) / 1000;
  return d;
}

absl::StatusOr<ServingEstimate> EstimateSglang(const LoadedModel& model, const ServingOptions& o,
                                               const ServingMachine& machine, ServingEstimate e) {
  const ModelConfig& c = *model.config;
  const ModelConfig& text = c.family == ModelFamily::kVisionLanguage ? c.text_tower() : c;
  if (c.family == ModelFamily::kStateSpace) {
    return FlagError("--engine", "SGLang's Mamba state pools are not modelled");
  }
  const uint64_t total = e.gpus.front().total_bytes;
  HEADROOM_ASSIGN_OR_RETURN(const QuantizationConfig quant, ResolveQuantization(c, o, e.rules, false));
  e.quantization = std::string(QuantMethodName(quant.method));
  HEADROOM_RETURN_IF_ERROR(ResolveDtype(c, o, machine.gpu, quant.method, e));
  HEADROOM_RETURN_IF_ERROR(ResolveKvDtype(o, e));
  const DerivedLength derived = SglangDerivedLength(c);
  if (o.max_model_len && *o.max_model_len > derived.tokens) {
    return FlagError("--context-length",
                     absl::StrFormat("%d is longer than the model's %d (%s): SGLang raises \"User-specified "
                                     "context_length (%d) is greater than the derived context_length\" unless "
                                     "SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1",
                                     *o.max_model_len, derived.tokens, derived.from, *o.max_model_len));
  }
  if (o.max_model_len && *o.max_model_len < 1) {
    return FlagError("--context-length", absl::StrFormat("must be at least 1, got %d", *o.max_model_len));
  }
  e.max_model_len = o.max_model_len.value_or(derived.tokens);
  e.max_model_len_from = o.max_model_len ? "--context-length" : derived.from;
  e.sglang_context_length = e.max_model_len;
  const SglangDefaults d = SglangDefaultsFor(total, o.tensor_parallel, o.pipeline_parallel, text.is_mla());
  e.utilization = o.gpu_memory_utilization.value_or(d.mem_fraction);
  if (!o.gpu_memory_utilization && !(e.utilization > 0)) {
    return FlagError("--mem-fraction-static",
                     absl::StrFormat("SGLang's default for a GPU of %s comes to %g: its fixed reserve (activations, "
                                     "CUDA graphs, at least 512 MiB) is larger than the GPU; SGLang cannot start "
                                     "on it without a --mem-fraction-static of its own",
                                     FormatBytes(total), d.mem_fraction));
  }
  if (!(e.utilization > 0) || e.utilization > 1) {
    return FlagError("--mem-fraction-static", absl::StrFormat("must be above 0 and at most 1, got %g", e.utilization));
  }
  e.max_num_batched_tokens = o.max_num_batched_tokens.value_or(d.chunked_prefill);
  e.block_size = o.block_size.value_or(1);
  if (e.block_size < 1 || e.block_size > 4096) {
    return FlagError("--page-size", absl::StrFormat("must be 1 to 4096, got %d", e.block_size));
  }
  e.cuda_graph_sizes = o.enforce_eager ? 0 : d.graph_bs;
  HEADROOM_ASSIGN_OR_RETURN(const Graph params, ParameterGraph(c, e.dtype_bytes));
  std::vector<ServingGpu> gpus;
  for (int stage = 0; stage < o.pipeline_parallel; ++stage) {
    ServingGpu g = e.gpus.front();
    g.stage = stage;
    std::tie(g.first_layer, g.end_layer) = PipelineStageLayers(static_cast<int>(text.num_layers), stage,
                                                               o.pipeline_parallel);
    g.startup_bytes = StartupBytes(o);
    HEADROOM_ASSIGN_OR_RETURN(g.weights, WeightsAsLoaded(c, params, {.tensor_parallel = o.tensor_parallel,
                                                                     .pipeline_parallel = o.pipeline_parallel,
                                                                     .stage = stage,
                                                                     .dtype_bytes = e.dtype_bytes,
                                                                     .quantization = quant,
                                                                     .gptq_g_idx = false}));
    // kv_cache_configurator.py _profile_available_bytes: free after the weights less the static slack.
    const int64_t before_load = static_cast<int64_t>(total) - static_cast<int64_t>(g.startup_bytes);
    const int64_t after_load = before_load - static_cast<int64_t>(g.weights.bytes);
    const auto slack = static_cast<int64_t>(static_cast<double>(before_load) * (1 - e.utilization));
    g.budget_bytes = static_cast<uint64_t>(std::max<int64_t>(0, static_cast<int64_t>(static_cast<double>(before_load) * e.utilization)));
    g.kv_cache_bytes = after_load - slack;
    g.kv_layers = KvLayersOf(c, {.tensor_parallel = o.tensor_parallel,
                                 .dtype_bytes = e.kv_dtype_bytes,
                                 .block_size = e.block_size,
                                 .first_layer = g.first_layer,
                                 .end_layer = g.end_layer,
                                 .windows = c.model_type == "gpt_oss"});  // Note [SGLang token pool]
    g.sglang = SizeSglangKvCache(g.kv_layers, g.kv_cache_bytes, e.block_size, e.max_model_len, o.max_num_seqs);
    if (g.startup_bytes + g.weights.bytes <= total) {
      if (g.kv_cache_bytes <= 0) {
        const double minimum = 1 - static_cast<double>(after_load) / static_cast<double>(before_load);
        g.error = absl::StrFormat(
            "Loaded weights leave no GPU memory for the KV cache under --mem-fraction-static=%g. Raise "
            "--mem-fraction-static above %.3f (minimum viable = 1 - available/pre = %.4f).",
            e.utilization, std::ceil(minimum * 1000) / 1000, minimum);
      } else {
        g.error = g.sglang.error;
      }
    } else {
      g.error = absl::StrFormat("CUDA out of memory while loading the weights: %s of weights on a GPU with %s total",
                                FormatBytes(g.weights.bytes), FormatBytes(total));
    }
    gpus.push_back(std::move(g));
  }
  e.gpus = std::move(gpus);
  const ServingGpu* fewest = &e.gpus.front();
  for (const ServingGpu& g : e.gpus) {
    if (g.sglang.max_total_tokens < fewest->sglang.max_total_tokens) fewest = &g;
    if (e.error.empty() && !g.error.empty()) e.error = g.error;
  }
  e.starts = e.error.empty();
  e.kv_cache_tokens = fewest->sglang.max_total_tokens;
  e.max_running_requests = fewest->sglang.max_running_requests;
  e.max_num_seqs = e.max_running_requests;
  e.max_concurrency = fewest->sglang.max_concurrency;
  e.max_model_len_that_fits = std::min(e.kv_cache_tokens, e.max_model_len);
  return e;
}

}  // namespace

absl::StatusOr<ServingEstimate> EstimateServing(const LoadedModel& model, const ServingOptions& o,
                                                const ServingMachine& machine) {
  HEADROOM_RETURN_IF_ERROR(CheckFamily(model));
  HEADROOM_RETURN_IF_ERROR(CheckParallel(*model.config, o));
  if (o.wanted_concurrency < 1 || o.wanted_concurrency > (int64_t{1} << 24)) {
    return FlagError("--concurrency", absl::StrFormat("must be 1 to 16777216, got %d", o.wanted_concurrency));
  }
  ServingEstimate e;
  e.engine = o.engine;
  e.rules = VllmRulesOf(o.engine);
  e.model_name = model.name;
  e.tensor_parallel = o.tensor_parallel;
  e.pipeline_parallel = o.pipeline_parallel;
  ServingGpu gpu;
  if (machine.total_bytes) {
    gpu.total_bytes = *machine.total_bytes;
    e.gpu_name = machine.gpu != nullptr ? machine.gpu->name : "budget";
  } else if (machine.gpu != nullptr) {
    gpu.total_bytes = machine.gpu->RuntimeTotalBytes();
    e.gpu_name = machine.gpu->name;
    e.total_sourced = machine.gpu->cuda_total_memory_bytes.has_value();
  } else {
    return FlagError("--gpu or --budget", "name a GPU (see 'headroom gpus') or give the GPU's memory");
  }
  // One GPU's memory: the largest today hold a few hundred GiB; beyond 64 TiB the figures would mean nothing.
  if (gpu.total_bytes > (uint64_t{64} << 40)) {
    return FlagError("--budget", absl::StrFormat("%s is one GPU's memory for a serving engine; at most 64 TiB",
                                                 FormatBytes(gpu.total_bytes)));
  }
  e.gpus.push_back(gpu);
  if (o.engine.engine == Engine::kVllm) return EstimateVllm(model, o, machine, std::move(e));
  return EstimateSglang(model, o, machine, std::move(e));
}

namespace {

bool Serves(const ServingEstimate& e, int64_t wanted) {
  return e.starts && e.max_concurrency + 1e-9 >= static_cast<double>(wanted);
}

}  // namespace

std::vector<ServingFix> ServingFixes(const LoadedModel& model, const ServingOptions& o, const ServingMachine& machine,
                                     const ServingEstimate& current) {
  std::vector<ServingFix> fixes;
  if (Serves(current, o.wanted_concurrency)) return fixes;
  const bool vllm = o.engine.engine == Engine::kVllm;
  struct Candidate {
    std::string flags, description;
    ServingOptions options;
    std::optional<QuantizationConfig> checkpoint;  // a checkpoint quantized this way
  };
  std::vector<Candidate> candidates;
  const double high = vllm ? 0.95 : std::min(0.95, current.utilization + 0.05);
  if (current.utilization < high && !current.extensible_kv_cache) {
    ServingOptions next = o;
    next.gpu_memory_utilization = high;
    candidates.push_back({absl::StrFormat("%s %.2f", vllm ? "--gpu-memory-utilization" : "--mem-fraction-static", high),
                          "give the engine more of the GPU (nothing else may run on it)", next, std::nullopt});
  }
  if (current.kv_dtype_bytes > 1) {
    ServingOptions next = o;
    next.kv_cache_dtype = "fp8";
    candidates.push_back({"--kv-cache-dtype fp8", "an fp8 KV cache: half the bytes per token, a small accuracy cost",
                          next, std::nullopt});
  }
  if (current.max_num_batched_tokens > 2048) {
    ServingOptions next = o;
    next.max_num_batched_tokens = 2048;
    candidates.push_back({absl::StrFormat("%s 2048", vllm ? "--max-num-batched-tokens" : "--chunked-prefill-size"),
                          "a smaller profile batch: less activation memory, slower long prefills", next, std::nullopt});
  }
  if (current.cuda_graph_sizes > 0 && vllm && current.rules.subtracts_cuda_graphs) {
    ServingOptions next = o;
    next.enforce_eager = true;
    candidates.push_back({"--enforce-eager", "no CUDA graphs: their memory goes to the cache, decoding is slower", next,
                          std::nullopt});
  }
  if (current.quantization == "none") {
    ServingOptions next = o;
    candidates.push_back({"a 4-bit AWQ checkpoint of the model",
                          "4-bit weights (group 128): about a quarter of the weight bytes, an accuracy cost", next,
                          QuantizationConfig{.method = QuantMethod::kAwq, .bits = 4, .group_size = 128,
                                             .zero_point = true}});
  }
  for (int tp = o.tensor_parallel * 2; tp <= 8; tp *= 2) {
    ServingOptions next = o;
    next.tensor_parallel = tp;
    candidates.push_back({absl::StrFormat("--tensor-parallel-size %d", tp),
                          absl::StrFormat("%d GPUs: weights and cache split over them", tp), next, std::nullopt});
  }
  auto estimate = [&](const Candidate& c) -> std::optional<ServingEstimate> {
    LoadedModel changed = model;
    if (c.checkpoint) changed.config->quantization = *c.checkpoint;
    absl::StatusOr<ServingEstimate> e = EstimateServing(changed, c.options, machine);
    if (!e.ok()) return std::nullopt;
    return *std::move(e);
  };
  for (const Candidate& c : candidates) {
    std::optional<ServingEstimate> e = estimate(c);
    if (e && Serves(*e, o.wanted_concurrency)) fixes.push_back({c.flags, c.description, *std::move(e)});
  }
  if (fixes.empty() && current.max_model_len_that_fits > 0 && o.wanted_concurrency == 1) {
    ServingOptions next = o;
    next.max_model_len = current.max_model_len_that_fits;
    Candidate c{absl::StrFormat("%s %d", vllm ? "--max-model-len" : "--context-length", current.max_model_len_that_fits),
                "shorter requests: the longest that fits", next, std::nullopt};
    if (std::optional<ServingEstimate> e = estimate(c); e && Serves(*e, 1)) {
      fixes.push_back({c.flags, c.description, *std::move(e)});
    }
  }
  return fixes;
}

}  // namespace headroom

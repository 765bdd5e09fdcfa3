#include "report/serving_report.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/text_table.h"
#include "common/units.h"

namespace headroom {
namespace {

std::string Signed(int64_t bytes) {
  return bytes < 0 ? "-" + FormatBytes(static_cast<uint64_t>(-bytes)) : FormatBytes(static_cast<uint64_t>(bytes));
}

// Consecutive layers with the same spec, for the report.
struct LayerRun {
  KvLayer spec;
  std::vector<int> layers;
};
std::vector<LayerRun> LayerRuns(const std::vector<KvLayer>& layers) {
  std::vector<LayerRun> runs;
  for (const KvLayer& l : layers) {
    auto it = std::find_if(runs.begin(), runs.end(), [&](const LayerRun& r) { return r.spec.SameSpec(l); });
    if (it == runs.end()) {
      runs.push_back({l, {l.layer}});
    } else {
      it->layers.push_back(l.layer);
    }
  }
  return runs;
}

std::string LayerText(const KvLayer& l) {
  switch (l.kind) {
    case KvLayerKind::kMla:
      return absl::StrFormat("MLA latent %d", l.head_size);
    case KvLayerKind::kMamba:
      return absl::StrFormat("Mamba state %s", FormatBytes(l.state_bytes));
    case KvLayerKind::kSlidingWindow:
      return absl::StrFormat("sliding window %d, %d KV heads x %d", l.window, l.num_kv_heads, l.head_size);
    case KvLayerKind::kChunkedLocal:
      return absl::StrFormat("chunked %d, %d KV heads x %d", l.window, l.num_kv_heads, l.head_size);
    case KvLayerKind::kFull:
      break;
  }
  return absl::StrFormat("full, %d KV heads x %d", l.num_kv_heads, l.head_size);
}

void GpuText(const ServingEstimate& e, const ServingGpu& g, std::string& out) {
  const bool vllm = e.engine.engine == Engine::kVllm;
  const std::string stage = e.pipeline_parallel > 1 ? absl::StrFormat("stage %d (layers %d-%d), ", g.stage,
                                                                        g.first_layer, g.end_layer - 1)
                                                    : "";
  absl::StrAppendFormat(&out, "\nper GPU (%seach of %d tensor-parallel rank%s):\n", stage, e.tensor_parallel,
                        e.tensor_parallel == 1 ? "" : "s");
  TextTable t({"", "bytes", "from"}, {Align::kLeft, Align::kRight, Align::kLeft});
  t.AddRow({"GPU memory (cudaMemGetInfo total)", FormatBytes(g.total_bytes),
            e.total_sourced ? "catalog, observed on this card" : "catalog estimate (no observation of this card)"});
  if (vllm) {
    t.AddRow({absl::StrFormat("budget (x %g)", e.utilization), FormatBytes(g.budget_bytes),
              e.rules.ceil_request ? "ceil(total x gpu_memory_utilization)" : "total x gpu_memory_utilization"});
  } else {
    t.AddRow({absl::StrFormat("static pool (x %g of free)", e.utilization), FormatBytes(g.budget_bytes),
              "mem_fraction_static of the memory free before loading"});
  }
  t.AddRow({"CUDA context, handles, NCCL", FormatBytes(g.startup_bytes), "estimate, before the engine's baseline"});
  t.AddRow({"weights", FormatBytes(g.weights.bytes),
            e.quantization == "none" ? absl::StrFormat("%s, as loaded", e.dtype)
                                     : absl::StrFormat("%s (%s of them quantized), as loaded", e.quantization,
                                                       FormatBytes(g.weights.quantized_bytes))});
  if (vllm) {
    t.AddRow({"profile run's activation peak", FormatBytes(g.profile.peak_bytes),
              absl::StrFormat("estimate: %d tokens forward %s, sampler %d rows %s", e.max_num_batched_tokens,
                              FormatBytes(g.profile.forward_bytes), g.profile.rows,
                              FormatBytes(g.profile.sampler_bytes))});
    t.AddRow({"non-PyTorch memory counted", FormatBytes(g.non_torch_bytes), "estimate, as this release counts it"});
    t.AddRow({"CUDA graphs", FormatBytes(g.cuda_graph_bytes),
              g.cuda_graph_bytes == 0 ? "eager"
              : g.cuda_graph_in_budget
                  ? absl::StrFormat("estimate, %d batch sizes; taken from the cache", e.cuda_graph_sizes)
                  : absl::StrFormat("estimate, %d batch sizes; outside the budget", e.cuda_graph_sizes)});
    if (g.margin_bytes > 0) {
      t.AddRow({"warm-up margin", FormatBytes(g.margin_bytes), "extensible KV cache: max(1 GiB, 0.75 x peak)"});
    }
  }
  t.AddRow({"KV cache", Signed(g.kv_cache_bytes), "what is left"});
  out += t.Render();
  for (const LayerRun& run : LayerRuns(g.kv_layers)) {
    absl::StrAppendFormat(&out, "  %d layer%s: %s, %d-byte values, page %s per %d-token block\n", run.layers.size(),
                          run.layers.size() == 1 ? "" : "s", LayerText(run.spec), run.spec.dtype_bytes,
                          FormatBytes(run.spec.PageBytes()), run.spec.block_size);
  }
  if (vllm) {
    absl::StrAppendFormat(&out, "  %d group%s, a block is %s: %d blocks; one %d-token request needs %d blocks\n",
                          g.kv.groups.size(), g.kv.groups.size() == 1 ? "" : "s", FormatBytes(g.kv.bytes_per_block),
                          g.kv.num_blocks, e.max_model_len, g.kv.blocks_per_request);
  } else {
    absl::StrAppendFormat(&out, "  a token holds %s: %d tokens\n", FormatBytes(static_cast<uint64_t>(g.sglang.cell_bytes)),
                          g.sglang.max_total_tokens);
  }
}

}  // namespace

std::string ServingText(const ServingEstimate& e, const std::vector<ServingFix>& fixes, int64_t wanted) {
  const bool vllm = e.engine.engine == Engine::kVllm;
  std::string out;
  absl::StrAppendFormat(&out, "engine: %s%s\n", e.engine.Name(),
                        vllm && e.extensible_kv_cache ? " (extensible KV cache, sized after warm-up)" : "");
  absl::StrAppendFormat(&out, "model:  %s, %s weights%s\n", e.model_name, e.dtype,
                        e.quantization == "none" ? "" : absl::StrCat(", ", e.quantization));
  absl::StrAppendFormat(&out, "GPUs:   %d x %s (tensor %d, pipeline %d)\n", e.tensor_parallel * e.pipeline_parallel,
                        e.gpu_name, e.tensor_parallel, e.pipeline_parallel);
  if (vllm) {
    absl::StrAppendFormat(&out,
                          "flags:  --max-model-len %d (%s) --max-num-seqs %d --max-num-batched-tokens %d --block-size "
                          "%d --kv-cache-dtype %s --gpu-memory-utilization %g%s\n",
                          e.max_model_len, e.max_model_len_from, e.max_num_seqs, e.max_num_batched_tokens, e.block_size,
                          e.kv_cache_dtype, e.utilization, e.cuda_graph_sizes == 0 ? " --enforce-eager" : "");
  } else {
    absl::StrAppendFormat(&out,
                          "flags:  --context-length %d (%s) --chunked-prefill-size %d --page-size %d --kv-cache-dtype "
                          "%s --mem-fraction-static %g\n",
                          e.max_model_len, e.max_model_len_from, e.max_num_batched_tokens, e.block_size,
                          e.kv_cache_dtype, e.utilization);
  }
  for (const ServingGpu& g : e.gpus) GpuText(e, g, out);
  out += "\n";
  if (vllm) {
    absl::StrAppendFormat(&out, "KV cache: %d blocks, %d tokens; maximum concurrency for %d tokens per request: %.2fx\n",
                          e.gpu_blocks, e.kv_cache_tokens, e.max_model_len, e.max_concurrency);
  } else {
    absl::StrAppendFormat(&out, "KV cache: max_total_num_tokens=%d, max_running_requests=%d; %.2f requests of %d "
                                "tokens at once\n",
                          e.kv_cache_tokens, e.max_running_requests, e.max_concurrency, e.max_model_len);
  }
  if (e.starts) {
    absl::StrAppendFormat(&out, "verdict: STARTS; the longest request that fits is %d tokens\n",
                          e.max_model_len_that_fits);
    for (const ServingGpu& g : e.gpus) {
      if (!g.warning.empty()) absl::StrAppendFormat(&out, "warning: %s\n", g.warning);
    }
  } else {
    absl::StrAppendFormat(&out, "verdict: DOES NOT START: %s\n", e.error);
  }
  if (!fixes.empty()) {
    absl::StrAppendFormat(&out, "\nchanges that start it with %d request%s of %d tokens at once, cheapest first:\n",
                          wanted, wanted == 1 ? "" : "s", e.max_model_len);
    TextTable t({"change", "blocks", "concurrency", "what it costs"}, {Align::kLeft, Align::kRight, Align::kRight, Align::kLeft});
    for (const ServingFix& f : fixes) {
      t.AddRow({f.flags, absl::StrCat(f.estimate.gpu_blocks > 0 ? f.estimate.gpu_blocks : f.estimate.kv_cache_tokens),
                absl::StrFormat("%.2fx", f.estimate.max_concurrency), f.description});
    }
    out += t.Render();
  } else if (!e.starts || e.max_concurrency + 1e-9 < static_cast<double>(wanted)) {
    out += "\nno single change Headroom tries (utilization, fp8 KV cache, a smaller batch, eager mode, 4-bit weights, "
           "up to 8 GPUs) makes it fit\n";
  }
  out += vllm ? "\nBlocks, tokens, concurrency and the start-up checks follow the engine's code; the activation peak, "
                "non-PyTorch memory and CUDA graphs are estimates of what it measures (README, Serving).\n"
              : "\nThe static fraction, tokens and the start-up checks follow SGLang's code; the memory in use before "
                "it loads (CUDA context, NCCL) is an estimate (README, Serving).\n";
  return out;
}

nlohmann::json ServingJson(const ServingEstimate& e, const std::vector<ServingFix>& fixes) {
  using nlohmann::json;
  const bool vllm = e.engine.engine == Engine::kVllm;
  auto error_or_null = [](const std::string& s) { return s.empty() ? json(nullptr) : json(s); };
  json gpus = json::array();
  for (const ServingGpu& g : e.gpus) {
    json layers = json::array();
    for (const LayerRun& run : LayerRuns(g.kv_layers)) {
      layers.push_back({{"layers", run.layers},
                        {"kind", KvLayerKindName(run.spec.kind)},
                        {"num_kv_heads", run.spec.num_kv_heads},
                        {"head_size", run.spec.head_size},
                        {"head_size_v", run.spec.head_size_v},
                        {"dtype_bytes", run.spec.dtype_bytes},
                        {"block_size", run.spec.block_size},
                        {"window", run.spec.window},
                        {"state_bytes", run.spec.state_bytes}});
    }
    json gpu = {{"engine", EngineName(e.engine.engine)},
                {"engine_version", e.engine.Version()},
                {"stage", g.stage},
                {"total_bytes", g.total_bytes},
                {"budget_bytes", g.budget_bytes},
                {"startup_bytes", g.startup_bytes},
                {"weights_bytes", g.weights.bytes},
                {"activation_peak_bytes", g.profile.peak_bytes},
                {"non_torch_bytes", g.non_torch_bytes},
                {"cuda_graph_bytes", g.cuda_graph_bytes},
                {"kv_cache_bytes", g.kv_cache_bytes},
                {"kv_layers", layers},
                {"starts", g.error.empty()},
                {"error", error_or_null(g.error)},
                {"warning", error_or_null(g.warning)}};
    if (vllm) {
      gpu["kv_block_bytes"] = g.kv.bytes_per_block;
      gpu["gpu_blocks"] = g.kv.num_blocks;
      gpu["kv_cache_tokens"] = g.kv.tokens;
      gpu["max_concurrency"] = g.kv.max_concurrency;
      gpu["max_model_len_that_fits"] = g.kv.max_model_len_that_fits;
    } else {
      gpu["cell_bytes"] = g.sglang.cell_bytes;
      gpu["max_total_num_tokens"] = g.sglang.max_total_tokens;
      gpu["kv_cache_tokens"] = g.sglang.max_total_tokens;
      gpu["kv_block_bytes"] = static_cast<uint64_t>(g.sglang.cell_bytes * static_cast<double>(e.block_size));
      gpu["gpu_blocks"] = g.sglang.max_total_tokens / e.block_size;
      gpu["max_concurrency"] = g.sglang.max_concurrency;
      gpu["max_model_len_that_fits"] = std::min(g.sglang.max_total_tokens, e.max_model_len);
    }
    gpus.push_back(std::move(gpu));
  }
  json out = {{"engine", EngineName(e.engine.engine)},
              {"engine_version", e.engine.Version()},
              {"model", e.model_name},
              {"gpu", e.gpu_name},
              {"gpu_total_sourced", e.total_sourced},
              {"dtype", e.dtype},
              {"quantization", e.quantization},
              {"kv_cache_dtype", e.kv_cache_dtype},
              {"max_model_len", e.max_model_len},
              {"max_model_len_from", e.max_model_len_from},
              {"tensor_parallel_size", e.tensor_parallel},
              {"pipeline_parallel_size", e.pipeline_parallel},
              {"cuda_graph_sizes", e.cuda_graph_sizes},
              {"starts", e.starts},
              {"error", error_or_null(e.error)},
              {"kv_cache_tokens", e.kv_cache_tokens},
              {"max_concurrency", e.max_concurrency},
              {"max_model_len_that_fits", e.max_model_len_that_fits},
              {"gpus", gpus}};
  if (vllm) {
    out["max_num_seqs"] = e.max_num_seqs;
    out["max_num_batched_tokens"] = e.max_num_batched_tokens;
    out["block_size"] = e.block_size;
    out["gpu_memory_utilization"] = e.utilization;
    out["extensible_kv_cache"] = e.extensible_kv_cache;
    out["async_scheduling"] = e.async_scheduling;
    out["enable_chunked_prefill"] = e.chunked_prefill;
    out["gpu_blocks"] = e.gpu_blocks;
  } else {
    out["context_length"] = e.max_model_len;
    out["page_size"] = e.block_size;
    out["chunked_prefill_size"] = e.max_num_batched_tokens;
    out["mem_fraction_static"] = e.utilization;
    out["max_running_requests"] = e.max_running_requests;
    out["max_total_num_tokens"] = e.kv_cache_tokens;
  }
  json fix_list = json::array();
  for (const ServingFix& f : fixes) {
    fix_list.push_back({{"change", f.flags},
                        {"description", f.description},
                        {"kv_cache_tokens", f.estimate.kv_cache_tokens},
                        {"max_concurrency", f.estimate.max_concurrency}});
  }
  out["fixes"] = fix_list;
  return out;
}

}  // namespace headroom

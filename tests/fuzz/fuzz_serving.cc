// Any config.json with any engine, release and flags gives a serving estimate or a one-line error, never a
// crash; an estimate's figures are consistent: blocks are the cache's bytes over a block's, an engine that
// starts has a block for one request at max_model_len, and the engine's verdict is its stages'.
// Input: four bytes of flags (engine and release, tensor and pipeline parallelism, utilization, KV dtype and
// block size), then the config's JSON (the seed corpus is the bundled presets behind four zero bytes).
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "models/model_source.h"
#include "serving/serving_estimate.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace headroom;
  if (size < 4) return 0;
  std::string_view text(reinterpret_cast<const char*>(data + 4), size - 4);
  absl::StatusOr<nlohmann::json> doc = [&]() -> absl::StatusOr<nlohmann::json> {
    nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
    if (j.is_discarded()) return absl::InvalidArgumentError("not JSON");
    return j;
  }();
  if (!doc.ok()) return 0;
  absl::StatusOr<LoadedModel> model = LoadModelDocument(*doc, "fuzz");
  if (!model.ok() || !model->config || model->config->num_layers > 96) return 0;
  static const char* const kReleases[] = {"vllm", "vllm@0.2.7", "vllm@0.4.3", "vllm@0.6.4", "vllm@0.6.5",
                                          "vllm@0.8.0", "vllm@0.11.0", "vllm@0.20.0", "vllm@0.29.0", "sglang"};
  ServingOptions o;
  o.engine = *ParseEngine(kReleases[data[0] % 10]);
  o.tensor_parallel = 1 << (data[1] % 4);
  o.pipeline_parallel = 1 + (data[1] >> 4) % 3;
  if (data[2] != 0) o.gpu_memory_utilization = data[2] / 255.0;
  static const char* const kKvDtypes[] = {"auto", "fp8", "float16", "int8"};
  o.kv_cache_dtype = kKvDtypes[data[3] % 4];
  if ((data[3] >> 2) % 4 != 0) o.block_size = int64_t{1} << ((data[3] >> 2) % 4 * 2);
  if ((data[3] >> 4) % 2 != 0) o.max_model_len = 1 + (data[3] >> 5) * 1000;
  const ServingMachine machine{.total_bytes = uint64_t{1} << (30 + data[0] % 9)};
  absl::StatusOr<ServingEstimate> e = EstimateServing(*model, o, machine);
  if (!e.ok()) {
    if (std::string(e.status().message()).find('\n') != std::string::npos) __builtin_trap();
    return 0;
  }
  for (const ServingGpu& g : e->gpus) {
    if (o.engine.engine == Engine::kVllm) {
      if (g.kv.bytes_per_block == 0) __builtin_trap();
      const int64_t blocks = g.kv_cache_bytes > 0 ? g.kv_cache_bytes / static_cast<int64_t>(g.kv.bytes_per_block) : 0;
      if (g.kv.num_blocks != blocks) __builtin_trap();
      if (g.error.empty() && g.kv.num_blocks < g.kv.blocks_per_request) __builtin_trap();
    } else if (g.sglang.max_total_tokens < 0) {
      __builtin_trap();
    }
  }
  if (e->starts != e->error.empty()) __builtin_trap();
  return 0;
}

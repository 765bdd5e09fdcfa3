// Any byte string given to the config.json parser yields a config or an
// error, never a crash; a small parsed config also builds into a valid graph
// (or a clean error) for training and inference.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "models/builders.h"
#include "models/model_config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view text(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<headroom::ModelConfig> config = headroom::ParseHfConfig(text, "fuzz");
  if (!config.ok()) return 0;
  // Keep graphs small enough for the fuzzer's time and memory budget.
  const headroom::ModelConfig& c = *config;
  if (c.num_layers > 4 || c.num_experts > 8 || c.mlp_layer_sizes.size() > 8) return 0;
  for (bool training : {true, false}) {
    absl::StatusOr<headroom::Graph> graph = headroom::BuildModelGraph(
        c, {.batch = 1, .seq_len = 4, .training = training, .tensor_parallel = 2});
    if (graph.ok() && !graph->Validate().ok()) __builtin_trap();
  }
  return 0;
}

// The MLP chain (MlpChain, model_type "mlp"): Headroom's own config form for a stack of Linears (model_config.h).
// Built by BuildMlp (builders/cnn_and_mlp.cc).
#include <cstdint>

#include "absl/strings/str_format.h"
#include "common/checked_math.h"
#include "common/status_macros.h"
#include "models/builder.h"
#include "models/config_parsing.h"
#include "models/model_registry.h"

namespace headroom::models_internal {
namespace {

using builders_internal::Builder;

absl::Status ParseMlpChain(const json& doc, const JsonPath& path, ModelConfig& c) {
  HEADROOM_ASSIGN_OR_RETURN(c.mlp_input_size, PositiveInt(doc, "input_size", path));
  HEADROOM_ASSIGN_OR_RETURN(const json* sizes, RequireField(doc, "layer_sizes", path));
  if (!sizes->is_array() || sizes->empty()) {
    return (path / "layer_sizes").Error("expected a non-empty array of positive integers");
  }
  if (sizes->size() > static_cast<size_t>(kMaxLayers)) {
    return (path / "layer_sizes")
        .Error(absl::StrFormat("has %d entries, more than the %d layers a model may have", sizes->size(),
                               kMaxLayers));
  }
  for (size_t i = 0; i < sizes->size(); ++i) {
    HEADROOM_ASSIGN_OR_RETURN(int64_t size, AsInt((*sizes)[i], path / "layer_sizes" / i));
    if (size <= 0 || size > kMaxSize) {
      return (path / "layer_sizes" / i).Error(absl::StrFormat("must be between 1 and 2^31, got %d", size));
    }
    c.mlp_layer_sizes.push_back(size);
  }
  HEADROOM_ASSIGN_OR_RETURN(c.activation,
                            ParseActivation(doc, "activation", path, ActivationKind::kRelu));
  HEADROOM_ASSIGN_OR_RETURN(c.mlp_bias, OptionalBool(doc, "bias", path, true));
  HEADROOM_ASSIGN_OR_RETURN(c.mlp_dropout, Probability(doc, "dropout", path, 0.0));
  c.num_layers = static_cast<int64_t>(c.mlp_layer_sizes.size());
  return absl::OkStatus();
}

absl::Status CheckMlpSizes(const JsonPath& path, const ModelConfig& c) {
  uint64_t parameters = 0;
  int64_t in = c.mlp_input_size;
  for (size_t i = 0; i < c.mlp_layer_sizes.size(); ++i) {
    const int64_t out = c.mlp_layer_sizes[i];
    HEADROOM_RETURN_IF_ERROR(CheckWeight(path, i == 0 ? "input_size" : absl::StrFormat("layer_sizes[%d]", i - 1),
                                         in, absl::StrFormat("layer_sizes[%d]", i), out));
    parameters = SaturatingAdd(parameters, static_cast<uint64_t>(in) * static_cast<uint64_t>(out + 1));
    in = out;
  }
  return CheckParameterCount(path, "input_size and layer_sizes", parameters);
}

absl::Status ParseMlpChainConfig(const json& doc, const JsonPath& path, ModelConfig& c) {
  HEADROOM_RETURN_IF_ERROR(ParseMlpChain(doc, path, c));
  return CheckMlpSizes(path, c);
}

constexpr ArchitectureClass kClasses[] = {{"MlpChain"}};

}  // namespace

extern constexpr ModelFamilyEntry kMlpChainFamily{
    .model_type = "mlp",
    .classes = kClasses,
    .kind = ModelFamily::kMlp,
    .parse = ParseMlpChainConfig,
    .build = [](Builder& b) { return b.BuildMlp(); },
};

}  // namespace headroom::models_internal

// Mamba (MambaForCausalLM; Note [Mamba] in builders/state_space.cc): selective state-space blocks, no attention.
// Built by BuildMamba (builders/state_space.cc).
#include <cstdint>
#include <string>

#include "absl/strings/str_format.h"
#include "common/checked_math.h"
#include "common/quote.h"
#include "common/status_macros.h"
#include "models/builder.h"
#include "models/config_parsing.h"
#include "models/model_registry.h"

namespace headroom::models_internal {
namespace {

using builders_internal::Builder;

// MambaForCausalLM (transformers 4.46's MambaConfig; Note [Mamba] in builders/state_space.cc). MambaConfig gives every
// size but vocab_size, hidden_size and num_hidden_layers a default; intermediate_size is int(expand x hidden_size)
// unless the config writes it (PretrainedConfig keeps extra keys, and the released checkpoints write it), and
// time_step_rank "auto" is ceil(hidden_size / 16). use_mambapy selects mamba.py's parallel scan in training, which
// saves other tensors than the sequential loop; it is refused rather than guessed.
absl::Status ParseMamba(const json& doc, const JsonPath& path, ModelConfig& c) {
  HEADROOM_ASSIGN_OR_RETURN(c.vocab_size, PositiveInt(doc, "vocab_size", path));
  HEADROOM_ASSIGN_OR_RETURN(c.hidden_size, PositiveInt(doc, "hidden_size", path));
  HEADROOM_ASSIGN_OR_RETURN(c.num_layers, BoundedCount(doc, "num_hidden_layers", path, kMaxLayers));
  HEADROOM_ASSIGN_OR_RETURN(c.ssm_state_size, OptionalPositiveInt(doc, "state_size", path, 16));
  HEADROOM_ASSIGN_OR_RETURN(c.conv_kernel, OptionalPositiveInt(doc, "conv_kernel", path, 4));
  if (Present(doc, "intermediate_size")) {
    HEADROOM_ASSIGN_OR_RETURN(c.intermediate_size, PositiveInt(doc, "intermediate_size", path));
  } else {
    HEADROOM_ASSIGN_OR_RETURN(const double expand, OptionalNumber(doc, "expand", path, 2.0));
    const double width = expand * static_cast<double>(c.hidden_size);
    if (!(width >= 1 && width <= static_cast<double>(kMaxSize))) {
      return (path / "expand")
          .Error(absl::StrFormat("%g x hidden_size (%d) must give an intermediate size between 1 and %d", expand,
                                 c.hidden_size, kMaxSize));
    }
    c.intermediate_size = static_cast<int64_t>(width);  // int() truncates, as MambaConfig does
  }
  if (Present(doc, "time_step_rank") && doc["time_step_rank"].is_string()) {
    HEADROOM_ASSIGN_OR_RETURN(const std::string rank, RequireString(doc, "time_step_rank", path));
    if (rank != "auto") {
      return (path / "time_step_rank")
          .Error(absl::StrFormat("%s is neither \"auto\" nor an integer", QuoteForError(rank)));
    }
    c.time_step_rank = CeilDiv<int64_t>(c.hidden_size, 16);
  } else {
    HEADROOM_ASSIGN_OR_RETURN(c.time_step_rank,
                              OptionalPositiveInt(doc, "time_step_rank", path, CeilDiv<int64_t>(c.hidden_size, 16)));
  }
  HEADROOM_ASSIGN_OR_RETURN(c.mlp_bias, OptionalBool(doc, "use_bias", path, false));
  HEADROOM_ASSIGN_OR_RETURN(c.conv_bias, OptionalBool(doc, "use_conv_bias", path, true));
  HEADROOM_ASSIGN_OR_RETURN(c.activation, ParseActivation(doc, "hidden_act", path, ActivationKind::kSilu));
  HEADROOM_ASSIGN_OR_RETURN(c.norm_eps, OptionalNumber(doc, "layer_norm_epsilon", path, 1e-5));
  HEADROOM_ASSIGN_OR_RETURN(c.residual_in_fp32, OptionalBool(doc, "residual_in_fp32", path, true));
  HEADROOM_ASSIGN_OR_RETURN(c.tie_word_embeddings, OptionalBool(doc, "tie_word_embeddings", path, true));
  HEADROOM_ASSIGN_OR_RETURN(c.use_cache, OptionalBool(doc, "use_cache", path, true));
  HEADROOM_ASSIGN_OR_RETURN(const bool mambapy, OptionalBool(doc, "use_mambapy", path, false));
  if (mambapy) {
    return (path / "use_mambapy")
        .Error("true selects mamba.py's parallel scan, which is not modelled; set it to false (the default)");
  }
  c.norm = NormKind::kRmsNorm;
  c.norm_bias = false;
  return absl::OkStatus();
}

// State-space models: the largest weights and the parameter count (Note [Model size bounds]). Each size is at
// most 2^31, so the sums below fit and the products saturate.
absl::Status CheckStateSpaceSizes(const JsonPath& path, const ModelConfig& c) {
  const auto h = static_cast<uint64_t>(c.hidden_size), inner = static_cast<uint64_t>(c.intermediate_size);
  const int64_t x_proj_width = c.time_step_rank + 2 * c.ssm_state_size;
  HEADROOM_RETURN_IF_ERROR(CheckWeight(path, "vocab_size", c.vocab_size, "hidden_size", c.hidden_size));
  HEADROOM_RETURN_IF_ERROR(CheckWeight(path, "hidden_size", c.hidden_size, "2 x intermediate_size",
                                       2 * c.intermediate_size));
  HEADROOM_RETURN_IF_ERROR(CheckWeight(path, "intermediate_size", c.intermediate_size,
                                       "time_step_rank + 2 x state_size", x_proj_width));
  HEADROOM_RETURN_IF_ERROR(CheckWeight(path, "intermediate_size", c.intermediate_size, "conv_kernel + state_size",
                                       c.conv_kernel + c.ssm_state_size));
  // in_proj, out_proj, x_proj, dt_proj, conv1d and A_log, about; the embeddings twice (an upper bound).
  const uint64_t per_layer = SaturatingMul(
      inner, SaturatingAdd(3 * h, static_cast<uint64_t>(2 * x_proj_width + c.conv_kernel + c.ssm_state_size)));
  const uint64_t parameters = SaturatingAdd(SaturatingMul(per_layer, static_cast<uint64_t>(c.num_layers)),
                                            SaturatingMul(2 * h, static_cast<uint64_t>(c.vocab_size)));
  return CheckParameterCount(path, "num_hidden_layers, hidden_size, intermediate_size and vocab_size", parameters);
}

absl::Status ParseMambaConfig(const json& doc, const JsonPath& path, ModelConfig& c) {
  HEADROOM_RETURN_IF_ERROR(ParseMamba(doc, path, c));
  return CheckStateSpaceSizes(path, c);
}

constexpr ArchitectureClass kClasses[] = {{"MambaForCausalLM"}};

}  // namespace

extern constexpr ModelFamilyEntry kMambaFamily{
    .model_type = "mamba",
    .classes = kClasses,
    .kind = ModelFamily::kStateSpace,
    .parse = ParseMambaConfig,
    .build = [](Builder& b) { return b.BuildMamba(); },
};

}  // namespace headroom::models_internal

// LLaVA (LlavaForConditionalGeneration; Note [LLaVA] in builders/vision.cc): a decoder config of any family as
// text_config, read through the registry, and CLIP's vision tower. Built by BuildLlava (builders/vision.cc).
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>

#include "absl/strings/str_format.h"
#include "common/quote.h"
#include "common/status_macros.h"
#include "models/builder.h"
#include "models/config_parsing.h"
#include "models/families/vision_towers.h"
#include "models/model_registry.h"

namespace headroom::models_internal {
namespace {

using builders_internal::Builder;

// Note [LLaVA configs]
// LlavaConfig (transformers 4.46's configuration_llava.py) nests a whole decoder config as text_config and a
// vision tower's as vision_config, and llava-hf's checkpoints lean on their defaults: llava-1.5-7b-hf's
// text_config names little beyond vocab_size and max_position_embeddings, the rest being LlamaConfig's. So, as
// AutoConfig does, an absent text_config.model_type is "llama" and a llama text_config's absent sizes take
// LlamaConfig's defaults; other decoders must name their sizes. The vision tower is CLIPVisionModel (the only
// one modelled): an absent vision_config is LlavaConfig's CLIP ViT-L/14 at 336 pixels, absent fields in a
// present one CLIPVisionConfig's defaults. vision_feature_layer indexes the vision tower's hidden states as
// Python does (-2: the penultimate block's output; 0: the embeddings), vision_feature_select_strategy is
// "default" (drop the class token) or "full", projector_hidden_act the projector's activation.
constexpr std::pair<std::string_view, int64_t> kLlamaConfigDefaults[] = {
    {"vocab_size", 32000},         {"hidden_size", 4096},        {"intermediate_size", 11008},
    {"num_hidden_layers", 32},     {"num_attention_heads", 32},  {"max_position_embeddings", 2048},
};

constexpr std::pair<std::string_view, int64_t> kLlavaVisionDefaults[] = {
    {"hidden_size", 1024},  {"intermediate_size", 4096},  {"num_hidden_layers", 24},
    {"num_attention_heads", 16},  {"image_size", 336},  {"patch_size", 14},
};

absl::Status ParseLlava(const json& doc, const JsonPath& path, ModelConfig& c) {
  json text = json::object();
  if (Present(doc, "text_config")) {
    if (!doc["text_config"].is_object()) {
      return (path / "text_config")
          .Error(absl::StrFormat("expected an object, got %s", JsonTypeName(doc["text_config"])));
    }
    text = doc["text_config"];
  }
  // AutoModelForCausalLM builds the language model from model_type alone.
  text.erase("architectures");
  if (!Present(text, "model_type")) text["model_type"] = "llama";
  if (text["model_type"] == "llama") {
    for (const auto& [key, value] : kLlamaConfigDefaults) {
      if (!Present(text, key)) text[std::string(key)] = value;
    }
  }
  if (!Present(text, "torch_dtype") && Present(doc, "torch_dtype")) text["torch_dtype"] = doc["torch_dtype"];
  const JsonPath text_path = path / "text_config";
  HEADROOM_ASSIGN_OR_RETURN(ModelConfig language, ParseConfigDocument(text, text_path, c.origin));
  if (language.family != ModelFamily::kDecoder) {
    return (text_path / "model_type")
        .Error(absl::StrFormat("%s is not a causal language model; LLaVA's language model is a decoder",
                               QuoteForError(language.model_type)));
  }

  json vision_doc = json::object();
  if (Present(doc, "vision_config")) {
    if (!doc["vision_config"].is_object()) {
      return (path / "vision_config")
          .Error(absl::StrFormat("expected an object, got %s", JsonTypeName(doc["vision_config"])));
    }
    vision_doc = doc["vision_config"];
    if (Present(vision_doc, "model_type")) {
      HEADROOM_ASSIGN_OR_RETURN(std::string type, RequireString(vision_doc, "model_type", path / "vision_config"));
      if (type != "clip_vision_model") {
        return (path / "vision_config" / "model_type")
            .Error(absl::StrFormat("%s is not modelled; LLaVA's vision tower must be clip_vision_model",
                                   QuoteForError(type)));
      }
    }
  } else {
    for (const auto& [key, value] : kLlavaVisionDefaults) vision_doc[std::string(key)] = value;
  }
  const json holder = {{"vision_config", vision_doc}};
  HEADROOM_ASSIGN_OR_RETURN(ModelConfig vision, ParseTower(holder, path, "vision_config", true, c, "clip"));

  HEADROOM_ASSIGN_OR_RETURN(c.activation, ParseActivation(doc, "projector_hidden_act", path, ActivationKind::kGelu));
  HEADROOM_ASSIGN_OR_RETURN(const int64_t layer, OptionalInt(doc, "vision_feature_layer", path, -2));
  if (layer < -(vision.num_layers + 1) || layer > vision.num_layers) {
    return (path / "vision_feature_layer")
        .Error(absl::StrFormat("%d indexes no hidden state of the vision tower's %d (embeddings and %d blocks: "
                               "%d to %d)",
                               layer, vision.num_layers + 1, vision.num_layers, -(vision.num_layers + 1),
                               vision.num_layers));
  }
  c.vision_feature_layer = layer >= 0 ? layer : vision.num_layers + 1 + layer;
  std::string strategy = "default";
  if (Present(doc, "vision_feature_select_strategy")) {
    HEADROOM_ASSIGN_OR_RETURN(strategy, RequireString(doc, "vision_feature_select_strategy", path));
  }
  if (strategy != "default" && strategy != "full") {
    return (path / "vision_feature_select_strategy")
        .Error(absl::StrFormat("expected \"default\" or \"full\", got %s", QuoteForError(strategy)));
  }
  c.vision_feature_full = strategy == "full";
  // The projector: linear_1 [text hidden, vision hidden] and linear_2 [text hidden, text hidden], with biases.
  HEADROOM_RETURN_IF_ERROR(CheckWeight(path, "text_config.hidden_size", language.hidden_size,
                                       "vision_config.hidden_size", vision.hidden_size));
  c.hidden_size = language.hidden_size;
  c.vocab_size = language.vocab_size;
  c.max_position_embeddings = language.max_position_embeddings;
  c.num_layers = language.num_layers + vision.num_layers;
  c.towers = {std::move(language), std::move(vision)};
  return absl::OkStatus();
}

constexpr ArchitectureClass kClasses[] = {{"LlavaForConditionalGeneration"}};

}  // namespace

extern constexpr ModelFamilyEntry kLlavaFamily{
    .model_type = "llava",
    .classes = kClasses,
    .kind = ModelFamily::kVisionLanguage,
    .parse = ParseLlava,
    .build = [](Builder& b) { return b.BuildLlava(); },
    .field_names = TwoTowerFieldNames,
};

}  // namespace headroom::models_internal

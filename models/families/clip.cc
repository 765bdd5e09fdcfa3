// Two-tower image-text models (Note [Contrastive towers] in builders/vision.cc): OpenAI's CLIP (CLIPModel) and
// Google's SigLIP (SiglipModel). Built by BuildContrastive (builders/vision.cc).
#include <utility>

#include "absl/strings/str_format.h"
#include "common/status_macros.h"
#include "models/builder.h"
#include "models/config_parsing.h"
#include "models/families/vision_towers.h"
#include "models/model_registry.h"

namespace headroom::models_internal {
namespace {

using builders_internal::Builder;

// CLIPModel and SiglipModel (Note [Contrastive towers] in builders/vision.cc): text_config, vision_config, and CLIP's
// projection_dim.
absl::Status ParseContrastive(const json& doc, const JsonPath& path, ModelConfig& c) {
  HEADROOM_ASSIGN_OR_RETURN(ModelConfig text, ParseTower(doc, path, "text_config", false, c));
  HEADROOM_ASSIGN_OR_RETURN(ModelConfig vision, ParseTower(doc, path, "vision_config", true, c));
  c.num_layers = text.num_layers + vision.num_layers;
  if (c.model_type == "clip") {
    HEADROOM_ASSIGN_OR_RETURN(c.projection_dim, OptionalPositiveInt(doc, "projection_dim", path, 512));
    HEADROOM_RETURN_IF_ERROR(
        CheckWeight(path, "text_config.hidden_size", text.hidden_size, "projection_dim", c.projection_dim));
    HEADROOM_RETURN_IF_ERROR(
        CheckWeight(path, "vision_config.hidden_size", vision.hidden_size, "projection_dim", c.projection_dim));
  } else if (text.hidden_size != vision.hidden_size) {
    // SigLIP compares the pooled outputs directly.
    return (path / "text_config" / "hidden_size")
        .Error(absl::StrFormat("%d differs from vision_config.hidden_size (%d): SigLIP compares the towers' "
                               "outputs without a projection", text.hidden_size, vision.hidden_size));
  }
  c.hidden_size = text.hidden_size;
  c.towers = {std::move(text), std::move(vision)};
  return absl::OkStatus();
}

constexpr ArchitectureClass kClipClasses[] = {{"CLIPModel"}};
constexpr ArchitectureClass kSiglipClasses[] = {{"SiglipModel"}};

}  // namespace

extern constexpr ModelFamilyEntry kClipFamily{
    .model_type = "clip",
    .classes = kClipClasses,
    .kind = ModelFamily::kContrastive,
    .parse = ParseContrastive,
    .build = [](Builder& b) { return b.BuildContrastive(); },
    .field_names = TwoTowerFieldNames,
};

extern constexpr ModelFamilyEntry kSiglipFamily{
    .model_type = "siglip",
    .classes = kSiglipClasses,
    .kind = ModelFamily::kContrastive,
    .parse = ParseContrastive,
    .build = [](Builder& b) { return b.BuildContrastive(); },
    .field_names = TwoTowerFieldNames,
};

}  // namespace headroom::models_internal

#include "models/families/vision_towers.h"

#include <string>
#include <string_view>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status_macros.h"

namespace headroom::models_internal {
namespace {

constexpr TowerDefaults kClipTextDefaults{512, 12, 8, 2048, ActivationKind::kQuickGelu, 1e-5, 0, 49408, 77};
constexpr TowerDefaults kClipVisionDefaults{768, 12, 12, 3072, ActivationKind::kQuickGelu, 1e-5, 32, 0, 0};
constexpr TowerDefaults kSiglipTextDefaults{768, 12, 12, 3072, ActivationKind::kGeluTanh, 1e-6, 0, 32000, 64};
constexpr TowerDefaults kSiglipVisionDefaults{768, 12, 12, 3072, ActivationKind::kGeluTanh, 1e-6, 16, 0, 0};

}  // namespace

// The sizes every tower has: hidden_size, num_hidden_layers, num_attention_heads, intermediate_size, hidden_act
// and layer_norm_eps; LayerNorm with bias and biased projections throughout.
absl::Status ParseTowerDims(const json& doc, const JsonPath& path, const TowerDefaults& d, ModelConfig& c) {
  HEADROOM_ASSIGN_OR_RETURN(c.hidden_size, OptionalPositiveInt(doc, "hidden_size", path, d.hidden_size));
  if (Present(doc, "num_hidden_layers")) {
    HEADROOM_ASSIGN_OR_RETURN(c.num_layers, BoundedCount(doc, "num_hidden_layers", path, kMaxLayers));
  } else {
    c.num_layers = d.num_layers;
  }
  HEADROOM_ASSIGN_OR_RETURN(c.num_heads, OptionalPositiveInt(doc, "num_attention_heads", path, d.num_heads));
  c.num_kv_heads = c.num_heads;
  HEADROOM_ASSIGN_OR_RETURN(c.intermediate_size,
                            OptionalPositiveInt(doc, "intermediate_size", path, d.intermediate_size));
  HEADROOM_ASSIGN_OR_RETURN(c.activation, ParseActivation(doc, "hidden_act", path, d.activation));
  HEADROOM_ASSIGN_OR_RETURN(c.norm_eps, OptionalNumber(doc, "layer_norm_eps", path, d.norm_eps));
  HEADROOM_ASSIGN_OR_RETURN(c.attention_dropout, Probability(doc, "attention_dropout", path, 0.0));
  c.norm = NormKind::kLayerNorm;
  c.positions = PositionKind::kLearned;
  c.qkv_bias = c.attn_output_bias = c.mlp_bias = true;
  return CheckAttentionShape(path, c);
}

// image_size, patch_size and num_channels of a vision transformer (Note [Vision transformer configs]).
absl::Status ParseImageSizes(const json& doc, const JsonPath& path, const TowerDefaults& d, ModelConfig& c) {
  HEADROOM_ASSIGN_OR_RETURN(c.image_size, OptionalInt(doc, "image_size", path, 224));
  if (c.image_size < 1 || c.image_size > kMaxImageSize) {
    return (path / "image_size")
        .Error(absl::StrFormat("must be between 1 and %d pixels, got %d", kMaxImageSize, c.image_size));
  }
  HEADROOM_ASSIGN_OR_RETURN(c.patch_size, OptionalInt(doc, "patch_size", path, d.patch_size));
  if (c.patch_size < 1 || c.patch_size > c.image_size) {
    return (path / "patch_size")
        .Error(absl::StrFormat("must be between 1 and image_size (%d), got %d", c.image_size, c.patch_size));
  }
  HEADROOM_ASSIGN_OR_RETURN(c.in_channels, OptionalInt(doc, "num_channels", path, 3));
  if (c.in_channels < 1 || c.in_channels > kMaxInChannels) {
    return (path / "num_channels")
        .Error(absl::StrFormat("must be between 1 and %d, got %d", kMaxInChannels, c.in_channels));
  }
  // The patch embedding's kernel and the position table; both products fit int64 within the bounds above.
  HEADROOM_RETURN_IF_ERROR(CheckWeight(path, "hidden_size", c.hidden_size, "num_channels x patch_size^2",
                                       c.in_channels * c.patch_size * c.patch_size));
  HEADROOM_RETURN_IF_ERROR(CheckWeight(path, "(image_size / patch_size)^2 patches", c.image_tokens(), "hidden_size",
                                       c.hidden_size));
  return CheckTransformerSizes(path, c);
}

// One tower of CLIPModel or SiglipModel from its text_config or vision_config object; CLIP's older configs
// repeat it as text_config_dict / vision_config_dict, whose keys win as CLIPConfig lets them. `kind` ("clip",
// "siglip") picks the defaults and the tower's model_type; empty: the parent's model_type.
absl::StatusOr<ModelConfig> ParseTower(const json& doc, const JsonPath& path, std::string_view key, bool vision,
                                       const ModelConfig& parent, std::string_view kind) {
  json tower = json::object();
  JsonPath tower_path = path / key;
  if (Present(doc, key)) {
    if (!doc[std::string(key)].is_object()) {
      return tower_path.Error(absl::StrFormat("expected an object, got %s", JsonTypeName(doc[std::string(key)])));
    }
    tower = doc[std::string(key)];
  }
  const std::string dict_key = std::string(key) + "_dict";
  if (Present(doc, dict_key)) {
    if (!doc[dict_key].is_object()) {
      return (path / dict_key).Error(absl::StrFormat("expected an object, got %s", JsonTypeName(doc[dict_key])));
    }
    tower.update(doc[dict_key]);
    tower_path = path / dict_key;
  }
  if (kind.empty()) kind = parent.model_type;
  const bool clip = kind == "clip";
  ModelConfig c;
  c.origin = parent.origin;
  c.torch_dtype = parent.torch_dtype;
  c.architecture = absl::StrCat(parent.architecture, vision ? ".vision_model" : ".text_model");
  c.model_type = absl::StrCat(std::string(kind), vision ? "_vision_model" : "_text_model");
  c.family = vision ? ModelFamily::kVision : ModelFamily::kEncoder;
  const TowerDefaults& d = clip ? (vision ? kClipVisionDefaults : kClipTextDefaults)
                                : (vision ? kSiglipVisionDefaults : kSiglipTextDefaults);
  HEADROOM_RETURN_IF_ERROR(ParseTowerDims(tower, tower_path, d, c));
  if (vision) {
    c.class_token = clip;
    // SiglipVisionTransformer pools through its attention head unless vision_use_head is false.
    HEADROOM_ASSIGN_OR_RETURN(c.encoder_pooler, OptionalBool(tower, "vision_use_head", tower_path, true));
    HEADROOM_RETURN_IF_ERROR(ParseImageSizes(tower, tower_path, d, c));
    return c;
  }
  HEADROOM_ASSIGN_OR_RETURN(c.vocab_size, OptionalPositiveInt(tower, "vocab_size", tower_path, d.vocab_size));
  HEADROOM_ASSIGN_OR_RETURN(c.max_position_embeddings,
                            OptionalPositiveInt(tower, "max_position_embeddings", tower_path,
                                                d.max_position_embeddings));
  HEADROOM_RETURN_IF_ERROR(CheckTransformerSizes(tower_path, c));
  return c;
}

}  // namespace headroom::models_internal

// The vision transformers' config.json reading that ViT (vit.cc), CLIP and SigLIP (clip.cc) and LLaVA's vision tower
// (llava.cc) share, internal to models/families/.
//
// Note [Vision transformer configs]
// ViTConfig, CLIPTextConfig/CLIPVisionConfig and SiglipTextConfig/SiglipVisionConfig give every size a
// default, and configs on the Hub lean on them (google/siglip-base-patch16-224's vision_config names little
// beyond its model_type), so an absent size takes transformers 4.46's default, as AutoConfig does. Images are
// square: image_size and patch_size are integers, the patch at most the image, and the image within
// kMaxImageSize. The sequence, (image_size / patch_size)^2 patches plus ViT's and CLIP's class token, is
// bounded by the position-embedding table it needs (CheckWeight) and, for a batch, by the activation checks
// of estimators/estimate_stages.cc.
#ifndef HEADROOM_MODELS_FAMILIES_VISION_TOWERS_H_
#define HEADROOM_MODELS_FAMILIES_VISION_TOWERS_H_

#include <cstdint>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "models/config_parsing.h"
#include "models/model_config.h"

namespace headroom::models_internal {

// transformers' defaults for a tower's absent sizes (Note [Vision transformer configs]).
struct TowerDefaults {
  int64_t hidden_size, num_layers, num_heads, intermediate_size;
  ActivationKind activation;
  double norm_eps;
  int64_t patch_size;                          // vision towers
  int64_t vocab_size, max_position_embeddings;  // text towers
};

// The sizes every tower has: hidden_size, num_hidden_layers, num_attention_heads, intermediate_size, hidden_act
// and layer_norm_eps; LayerNorm with bias and biased projections throughout.
absl::Status ParseTowerDims(const json& doc, const JsonPath& path, const TowerDefaults& d, ModelConfig& c);

// image_size, patch_size and num_channels of a vision transformer (Note [Vision transformer configs]).
absl::Status ParseImageSizes(const json& doc, const JsonPath& path, const TowerDefaults& d, ModelConfig& c);

// One tower of CLIPModel or SiglipModel from its text_config or vision_config object; CLIP's older configs
// repeat it as text_config_dict / vision_config_dict, whose keys win as CLIPConfig lets them. `kind` ("clip",
// "siglip") picks the defaults and the tower's model_type; empty: the parent's model_type.
absl::StatusOr<ModelConfig> ParseTower(const json& doc, const JsonPath& path, std::string_view key, bool vision,
                                       const ModelConfig& parent, std::string_view kind = "");

}  // namespace headroom::models_internal

#endif  // HEADROOM_MODELS_FAMILIES_VISION_TOWERS_H_

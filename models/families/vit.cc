// Google's ViT (ViTModel, ViTForImageClassification; transformers' modeling_vit.py, Note [Vision transformers] in
// builders/vision.cc). Built by BuildVision (builders/vision.cc).
#include <cstdint>
#include <string>
#include <vector>

#include "common/status_macros.h"
#include "models/builder.h"
#include "models/config_parsing.h"
#include "models/families/vision_towers.h"
#include "models/model_registry.h"

namespace headroom::models_internal {
namespace {

using builders_internal::Builder;

constexpr TowerDefaults kVitDefaults{768, 12, 12, 3072, ActivationKind::kGelu, 1e-12, 16, 0, 0};

// ViTModel and ViTForImageClassification (transformers' modeling_vit.py; Note [Vision transformers] in
// builders.cc): a class token, pre-norm blocks, a final layernorm; ViTModel adds its pooler.
absl::Status ParseVit(const json& doc, const JsonPath& path, ModelConfig& c) {
  HEADROOM_RETURN_IF_ERROR(ParseTowerDims(doc, path, kVitDefaults, c));
  HEADROOM_ASSIGN_OR_RETURN(c.hidden_dropout, Probability(doc, "hidden_dropout_prob", path, 0.0));
  HEADROOM_ASSIGN_OR_RETURN(c.attention_dropout, Probability(doc, "attention_probs_dropout_prob", path, 0.0));
  c.embedding_dropout = c.hidden_dropout;
  HEADROOM_ASSIGN_OR_RETURN(c.qkv_bias, OptionalBool(doc, "qkv_bias", path, true));
  c.class_token = true;
  c.encoder_pooler = c.encoder_head == EncoderHead::kBodyOnly;
  HEADROOM_RETURN_IF_ERROR(ParseImageSizes(doc, path, kVitDefaults, c));
  HEADROOM_RETURN_IF_ERROR(ParseNumLabels(doc, path, c));
  return CheckWeight(path, "hidden_size", c.hidden_size, "num_labels", c.num_labels);
}

constexpr ArchitectureClass kClasses[] = {
    {"ViTModel", EncoderHead::kBodyOnly},
    {"ViTForImageClassification", EncoderHead::kSequenceClassification},
};

std::vector<std::string> LoraTargets(const ModelConfig&, const TransformersVersion& transformers) {
  // Note [ViT in transformers 5.9]: the query and value projections' new names.
  if (transformers.AtLeast(5, 9)) return {"q_proj", "v_proj"};
  return {"query", "value"};
}

}  // namespace

extern constexpr ModelFamilyEntry kVitFamily{
    .model_type = "vit",
    .classes = kClasses,
    .kind = ModelFamily::kVision,
    .parse = ParseVit,
    .build = [](Builder& b) { return b.BuildVision(); },
    .lora_targets = LoraTargets,
};

}  // namespace headroom::models_internal

// Google's ViT (ViTModel, ViTForImageClassification; transformers' modeling_vit.py, Note [Vision transformers] in
// builders/vision.cc). Built by BuildVision (builders/vision.cc).
#include <cstdint>

#include "common/status_macros.h"
#include "models/builder.h"
#include "models/config_parsing.h"
#include "models/families/vision_towers.h"
#include "models/model_registry.h"

namespace headroom::models_internal {
namespace {

using builders_internal::Builder;

constexpr TowerDefaults kVitDefaults{768, 12, 12, 3072, ActivationKind::kGelu, 1e-12, 16, 0, 0};

// Labels of a classification head: num_labels, or as many as id2label names; transformers' 2 otherwise.
absl::Status ParseNumLabels(const json& doc, const JsonPath& path, ModelConfig& c) {
  if (Present(doc, "num_labels")) {
    HEADROOM_ASSIGN_OR_RETURN(c.num_labels, PositiveInt(doc, "num_labels", path));
  } else if (Present(doc, "id2label")) {
    const json& labels = doc["id2label"];
    if (!labels.is_object() || labels.empty()) {
      return (path / "id2label").Error("expected a non-empty object");
    }
    c.num_labels = static_cast<int64_t>(labels.size());
  }
  return CheckWeight(path, "hidden_size", c.hidden_size, "num_labels", c.num_labels);
}

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
  return ParseNumLabels(doc, path, c);
}

constexpr ArchitectureClass kClasses[] = {
    {"ViTModel", EncoderHead::kBodyOnly},
    {"ViTForImageClassification", EncoderHead::kSequenceClassification},
};

}  // namespace

extern constexpr ModelFamilyEntry kVitFamily{
    .model_type = "vit",
    .classes = kClasses,
    .kind = ModelFamily::kVision,
    .parse = ParseVit,
    .build = [](Builder& b) { return b.BuildVision(); },
};

}  // namespace headroom::models_internal

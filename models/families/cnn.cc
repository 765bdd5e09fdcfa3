// torchvision's resnet50 and vgg16, which have no config.json of their own (Note [CNN configs]), and CnnConfig
// (model_config.h). Built by BuildCnn (builders/cnn_and_mlp.cc).
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/quote.h"
#include "common/status_macros.h"
#include "models/builder.h"
#include "models/config_parsing.h"
#include "models/model_registry.h"

namespace headroom::models_internal {
namespace {

using builders_internal::Builder;

// Note [CNN configs]
// torchvision models have no config.json; a CNN is written in the same form
// as a config, {"architectures": ["resnet50"], "image_size": 64,
// "num_classes": 100, "in_channels": 3}, each size optional (torchvision's
// 224, 1000 and 3 otherwise). Both networks downsample by 32 before their
// adaptive pooling, so smaller images are refused; kMaxImageSize keeps a
// batch of activations far inside Note [Size bounds] of graph/graph.h
// (64 channels x 16384^2 x fp32 is 64 GiB per image).
constexpr int64_t kMinImageSize = 32;

absl::Status ParseCnnSizes(const json& doc, const JsonPath& path, ModelConfig& c) {
  HEADROOM_ASSIGN_OR_RETURN(c.image_size, OptionalInt(doc, "image_size", path, c.image_size));
  if (c.image_size < kMinImageSize || c.image_size > kMaxImageSize) {
    return (path / "image_size")
        .Error(absl::StrFormat("must be between %d (the networks downsample by 32) and %d pixels, got %d",
                               kMinImageSize, kMaxImageSize, c.image_size));
  }
  HEADROOM_ASSIGN_OR_RETURN(c.in_channels, OptionalInt(doc, "in_channels", path, c.in_channels));
  if (c.in_channels < 1 || c.in_channels > kMaxInChannels) {
    return (path / "in_channels")
        .Error(absl::StrFormat("must be between 1 and %d, got %d", kMaxInChannels, c.in_channels));
  }
  HEADROOM_ASSIGN_OR_RETURN(c.num_classes, OptionalPositiveInt(doc, "num_classes", path, c.num_classes));
  // The classifier: resnet50's fc reads 2048 features, vgg16's last Linear 4096.
  return CheckWeight(path, "features", c.architecture == "resnet50" ? 2048 : 4096, "num_classes", c.num_classes);
}

// Note [CNN configs]: torchvision's ReLU, and the blocks a layer count counts (resnet50's bottleneck blocks,
// vgg16's convolutions).
void UseTorchvisionCnn(ModelConfig& c) {
  c.activation = ActivationKind::kRelu;
  c.num_layers = c.architecture == "resnet50" ? 16 : 13;  // bottleneck blocks / conv layers
}

absl::Status ParseCnn(const json& doc, const JsonPath& path, ModelConfig& c) {
  UseTorchvisionCnn(c);
  return ParseCnnSizes(doc, path, c);
}

constexpr ArchitectureClass kClasses[] = {{"resnet50"}, {"vgg16"}};

}  // namespace

extern constexpr ModelFamilyEntry kCnnFamily{
    .model_type = "cnn",
    .classes = kClasses,
    .kind = ModelFamily::kCnn,
    .parse = ParseCnn,
    .build = [](Builder& b) { return b.BuildCnn(); },
    .model_type_selects = false,
};

}  // namespace headroom::models_internal

namespace headroom {

std::vector<std::string> CnnNames() {
  std::vector<std::string> names;
  for (const models_internal::ModelFamilyEntry* family : models_internal::ModelFamilies()) {
    if (family->kind != ModelFamily::kCnn) continue;
    for (const models_internal::ArchitectureClass& architecture : family->classes) {
      names.emplace_back(architecture.name);
    }
  }
  return names;
}

absl::StatusOr<ModelConfig> CnnConfig(std::string_view name) {
  const models_internal::FamilyClass cnn = models_internal::FindClass(name);
  if (cnn.family == nullptr || cnn.family->kind != ModelFamily::kCnn) {
    return absl::NotFoundError(absl::StrFormat("unknown CNN %s (built in: %s)", QuoteForError(name),
                                               absl::StrJoin(CnnNames(), ", ")));
  }
  ModelConfig c;
  c.origin = absl::StrFormat("torchvision %s", name);
  c.architecture = std::string(name);
  c.model_type = std::string(cnn.family->model_type);
  c.family = ModelFamily::kCnn;
  models_internal::UseTorchvisionCnn(c);
  return c;
}

}  // namespace headroom

#include "models/model_config.h"

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/checked_math.h"
#include "common/json_fields.h"
#include "common/name_table.h"
#include "common/quote.h"
#include "common/status_macros.h"
#include "models/builder.h"
#include "models/config_parsing.h"
#include "models/model_registry.h"

namespace headroom {

using namespace models_internal;  // the registry and the shared config.json helpers

namespace {

constexpr NameTable<EncoderHead, 3> kEncoderHeadNames("encoder head", {{
    {"classification", EncoderHead::kSequenceClassification},
    {"mlm", EncoderHead::kMaskedLm},
    {"body-only", EncoderHead::kBodyOnly},
}});

// Names read from a config, each quoted for an error or a report line (common/quote.h).
std::string JoinQuoted(const std::vector<std::string>& names) {
  return absl::StrJoin(names, ", ", [](std::string* out, const std::string& name) { out->append(QuoteForError(name)); });
}

struct ResolvedArchitecture {
  const ModelFamilyEntry* family = nullptr;
  const ArchitectureClass* architecture = nullptr;
  std::string from;  // ModelConfig::architecture_from
};

// Note [Choosing the architecture]
// `architectures` lists the classes a checkpoint was saved with, in whatever order the saving code wrote them
// (facebook/bart-large: BartModel, then BartForConditionalGeneration), and may name remote code
// (tiiuae/falcon-7b's first config: RWForCausalLM, model_type RefinedWebModel), while transformers' Auto classes
// build from model_type alone. So the first entry Headroom models is taken; where none is, model_type resolves
// to its family's main class, as AutoModelForCausalLM would, older names included (model_type_aliases). Whenever
// the class is not architectures[0], the config says how it was chosen (architecture_from) and the reports
// print it, since the estimate is of that class.
absl::StatusOr<ResolvedArchitecture> ArchitectureOf(const json& doc, const JsonPath& path) {
  std::string type;
  if (Present(doc, "model_type")) {
    HEADROOM_ASSIGN_OR_RETURN(type, RequireString(doc, "model_type", path));
  }
  if (Present(doc, "architectures")) {
    const json& list = doc["architectures"];
    if (!list.is_array() || list.empty()) {
      return (path / "architectures").Error("expected a non-empty array of class names");
    }
    std::vector<std::string> seen;
    for (size_t i = 0; i < list.size(); ++i) {
      HEADROOM_ASSIGN_OR_RETURN(std::string name, AsString(list[i], path / "architectures" / i));
      if (const FamilyClass modelled = FindClass(name); modelled.family != nullptr) {
        if (i == 0) return ResolvedArchitecture{.family = modelled.family, .architecture = modelled.architecture};
        return ResolvedArchitecture{
            .family = modelled.family,
            .architecture = modelled.architecture,
            .from = absl::StrFormat("architectures[%d], the first entry Headroom models (not %s)", i,
                                    JoinQuoted(seen))};
      }
      seen.push_back(std::move(name));
    }
    if (const ModelFamilyEntry* family = FamilyOfModelType(type); family != nullptr) {
      return ResolvedArchitecture{
          .family = family,
          .architecture = &family->classes.front(),
          .from = absl::StrFormat("model_type %s, as transformers' Auto classes resolve it (%s not modelled)",
                                  QuoteForError(type), JoinQuoted(seen))};
    }
    for (const ModelFamilyEntry* family : ModelFamilies()) {
      for (const RefusedClass& refused : family->refused_classes) {
        if (std::find(seen.begin(), seen.end(), refused.name) != seen.end()) {
          return (path / "architectures" / 0).Error(absl::StrFormat("%s: %s", refused.name, refused.advice));
        }
      }
    }
    if (seen.size() == 1) {
      return (path / "architectures" / 0)
          .Error(absl::StrFormat("unsupported architecture %s; supported: %s", QuoteForError(seen[0]),
                                 absl::StrJoin(SupportedArchitectures(), ", ")));
    }
    return (path / "architectures")
        .Error(absl::StrFormat("none of %s is supported%s; supported: %s", JoinQuoted(seen),
                               type.empty() ? "" : absl::StrFormat(", nor model_type %s", QuoteForError(type)),
                               absl::StrJoin(SupportedArchitectures(), ", ")));
  }
  if (!type.empty()) {
    const ModelFamilyEntry* family = FamilyOfModelType(type);
    if (family == nullptr) {
      return (path / "model_type")
          .Error(absl::StrFormat("unsupported model_type %s; supported architectures: %s", QuoteForError(type),
                                 absl::StrJoin(SupportedArchitectures(), ", ")));
    }
    // model_type alone names its class as it always has; only an older name is worth saying.
    ResolvedArchitecture resolved{.family = family, .architecture = &family->classes.front()};
    if (type != family->model_type) {
      resolved.from =
          absl::StrFormat("model_type %s, which transformers reads as '%s'", QuoteForError(type), family->model_type);
    }
    return resolved;
  }
  return path.Error("field 'architectures' (or 'model_type') is required");
}

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

// Note [Vision transformer configs]
// ViTConfig, CLIPTextConfig/CLIPVisionConfig and SiglipTextConfig/SiglipVisionConfig give every size a
// default, and configs on the Hub lean on them (google/siglip-base-patch16-224's vision_config names little
// beyond its model_type), so an absent size takes transformers 4.46's default, as AutoConfig does. Images are
// square: image_size and patch_size are integers, the patch at most the image, and the image within
// kMaxImageSize. The sequence, (image_size / patch_size)^2 patches plus ViT's and CLIP's class token, is
// bounded by the position-embedding table it needs (CheckWeight) and, for a batch, by the activation checks
// of estimators/estimate_stages.cc.
struct TowerDefaults {
  int64_t hidden_size, num_layers, num_heads, intermediate_size;
  ActivationKind activation;
  double norm_eps;
  int64_t patch_size;                          // vision towers
  int64_t vocab_size, max_position_embeddings;  // text towers
};

constexpr TowerDefaults kVitDefaults{768, 12, 12, 3072, ActivationKind::kGelu, 1e-12, 16, 0, 0};
constexpr TowerDefaults kClipTextDefaults{512, 12, 8, 2048, ActivationKind::kQuickGelu, 1e-5, 0, 49408, 77};
constexpr TowerDefaults kClipVisionDefaults{768, 12, 12, 3072, ActivationKind::kQuickGelu, 1e-5, 32, 0, 0};
constexpr TowerDefaults kSiglipTextDefaults{768, 12, 12, 3072, ActivationKind::kGeluTanh, 1e-6, 0, 32000, 64};
constexpr TowerDefaults kSiglipVisionDefaults{768, 12, 12, 3072, ActivationKind::kGeluTanh, 1e-6, 16, 0, 0};

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

// One tower of CLIPModel or SiglipModel from its text_config or vision_config object; CLIP's older configs
// repeat it as text_config_dict / vision_config_dict, whose keys win as CLIPConfig lets them. `kind` ("clip",
// "siglip") picks the defaults and the tower's model_type; empty: the parent's model_type.
absl::StatusOr<ModelConfig> ParseTower(const json& doc, const JsonPath& path, std::string_view key, bool vision,
                                       const ModelConfig& parent, std::string_view kind = "") {
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

absl::Status ParseMambaConfig(const json& doc, const JsonPath& path, ModelConfig& c) {
  HEADROOM_RETURN_IF_ERROR(ParseMamba(doc, path, c));
  return CheckStateSpaceSizes(path, c);
}

absl::Status ParseMlpChainConfig(const json& doc, const JsonPath& path, ModelConfig& c) {
  HEADROOM_RETURN_IF_ERROR(ParseMlpChain(doc, path, c));
  return CheckMlpSizes(path, c);
}

using builders_internal::Builder;


constexpr ArchitectureClass kVitClasses[] = {
    {"ViTModel", EncoderHead::kBodyOnly},
    {"ViTForImageClassification", EncoderHead::kSequenceClassification},
};
constexpr ArchitectureClass kClipClasses[] = {{"CLIPModel"}};
constexpr ArchitectureClass kSiglipClasses[] = {{"SiglipModel"}};
constexpr ArchitectureClass kLlavaClasses[] = {{"LlavaForConditionalGeneration"}};
constexpr ArchitectureClass kMambaClasses[] = {{"MambaForCausalLM"}};
constexpr ArchitectureClass kMlpChainClasses[] = {{"MlpChain"}};
constexpr ArchitectureClass kCnnClasses[] = {{"resnet50"}, {"vgg16"}};

}  // namespace

namespace models_internal {

extern constexpr ModelFamilyEntry kVitFamily{.model_type = "vit", .classes = kVitClasses,
    .kind = ModelFamily::kVision, .parse = ParseVit, .build = [](Builder& b) { return b.BuildVision(); }};
extern constexpr ModelFamilyEntry kClipFamily{.model_type = "clip", .classes = kClipClasses,
    .kind = ModelFamily::kContrastive, .parse = ParseContrastive,
    .build = [](Builder& b) { return b.BuildContrastive(); }, .field_names = TwoTowerFieldNames};
extern constexpr ModelFamilyEntry kSiglipFamily{.model_type = "siglip", .classes = kSiglipClasses,
    .kind = ModelFamily::kContrastive, .parse = ParseContrastive,
    .build = [](Builder& b) { return b.BuildContrastive(); }, .field_names = TwoTowerFieldNames};
extern constexpr ModelFamilyEntry kLlavaFamily{.model_type = "llava", .classes = kLlavaClasses,
    .kind = ModelFamily::kVisionLanguage, .parse = ParseLlava,
    .build = [](Builder& b) { return b.BuildLlava(); }, .field_names = TwoTowerFieldNames};
extern constexpr ModelFamilyEntry kMambaFamily{.model_type = "mamba", .classes = kMambaClasses,
    .kind = ModelFamily::kStateSpace, .parse = ParseMambaConfig, .build = [](Builder& b) { return b.BuildMamba(); }};
extern constexpr ModelFamilyEntry kMlpChainFamily{.model_type = "mlp", .classes = kMlpChainClasses,
    .kind = ModelFamily::kMlp, .parse = ParseMlpChainConfig, .build = [](Builder& b) { return b.BuildMlp(); }};
extern constexpr ModelFamilyEntry kCnnFamily{.model_type = "cnn", .classes = kCnnClasses, .kind = ModelFamily::kCnn,
    .parse = ParseCnn, .build = [](Builder& b) { return b.BuildCnn(); }, .model_type_selects = false};

absl::StatusOr<ModelConfig> ParseConfigDocument(const json& doc, const JsonPath& path, std::string_view origin) {
  if (!doc.is_object()) {
    return path.Error(absl::StrFormat("expected a JSON object, got %s", JsonTypeName(doc)));
  }
  HEADROOM_ASSIGN_OR_RETURN(ResolvedArchitecture resolved, ArchitectureOf(doc, path));
  const ModelFamilyEntry& family = *resolved.family;
  ModelConfig c;
  c.origin = std::string(origin);
  c.architecture = std::string(resolved.architecture->name);
  c.architecture_from = resolved.from;
  c.model_type = std::string(family.model_type);
  c.family = family.kind;
  c.encoder_head = resolved.architecture->head;
  // Note [CNN configs]: a torchvision model has no checkpoint, and no torch_dtype is read for it.
  if (family.kind != ModelFamily::kCnn && Present(doc, "torch_dtype")) {
    HEADROOM_ASSIGN_OR_RETURN(std::string dtype_name, RequireString(doc, "torch_dtype", path));
    absl::StatusOr<DType> dtype = ParseDType(dtype_name);
    if (!dtype.ok()) return (path / "torch_dtype").Error(std::string(dtype.status().message()));
    c.torch_dtype = *dtype;
  }
  HEADROOM_RETURN_IF_ERROR(family.parse(doc, path, c));
  return c;
}

}  // namespace models_internal

std::string_view EncoderHeadName(EncoderHead head) { return kEncoderHeadNames.Name(head); }
absl::StatusOr<EncoderHead> ParseEncoderHead(std::string_view name) { return kEncoderHeadNames.Parse(name); }

ConfigFieldNames FieldNamesOf(const ModelConfig& c) {
  const ModelFamilyEntry* family = FindFamily(c.model_type);
  if (family == nullptr || family->field_names == nullptr) return {};
  return family->field_names(c);
}

std::vector<std::string> SupportedArchitectures() {
  std::vector<std::string> names;
  for (const ModelFamilyEntry* family : ModelFamilies()) {
    for (const ArchitectureClass& architecture : family->classes) names.emplace_back(architecture.name);
  }
  return names;
}

absl::StatusOr<ModelConfig> ParseHfConfig(std::string_view json_text, std::string_view origin) {
  HEADROOM_ASSIGN_OR_RETURN(json doc, ParseJsonDocument(json_text, origin));
  return ParseConfigDocument(doc, JsonPath(origin), origin);
}

std::string ArchitectureChoice(const ModelConfig& config) {
  if (config.architecture_from.empty()) return "";
  return absl::StrFormat("%s, from %s", config.architecture, config.architecture_from);
}

std::vector<std::string> CnnNames() {
  std::vector<std::string> names;
  for (const ModelFamilyEntry* family : ModelFamilies()) {
    if (family->kind != ModelFamily::kCnn) continue;
    for (const ArchitectureClass& architecture : family->classes) names.emplace_back(architecture.name);
  }
  return names;
}

absl::StatusOr<ModelConfig> CnnConfig(std::string_view name) {
  const FamilyClass cnn = FindClass(name);
  if (cnn.family == nullptr || cnn.family->kind != ModelFamily::kCnn) {
    return absl::NotFoundError(absl::StrFormat("unknown CNN %s (built in: %s)", QuoteForError(name),
                                               absl::StrJoin(CnnNames(), ", ")));
  }
  ModelConfig c;
  c.origin = absl::StrFormat("torchvision %s", name);
  c.architecture = std::string(name);
  c.model_type = std::string(cnn.family->model_type);
  c.family = ModelFamily::kCnn;
  UseTorchvisionCnn(c);
  return c;
}

}  // namespace headroom

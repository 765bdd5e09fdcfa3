#include "models/model_config.h"

#include <algorithm>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/json_fields.h"
#include "common/name_table.h"
#include "common/quote.h"
#include "common/status_macros.h"
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

// Note [Serving fields]
// A serving engine reads a few config.json fields that no builder needs: the
// keys it takes the model's longest sequence from, the RoPE scaling that
// stretches it, and how the checkpoint's weights are quantized. They are kept
// as written (serving/max_model_len.h applies each engine's rules to them); a
// vision-language model's come from its text_config, as vLLM's
// hf_text_config and SGLang's read them.
absl::Status ParseServingFields(const json& doc, const JsonPath& path, ModelConfig& c) {
  const bool text = doc.contains("text_config") && doc["text_config"].is_object();
  const json& config = text ? doc["text_config"] : doc;
  const JsonPath config_path = text ? path / "text_config" : path;
  for (std::string_view key : {"max_position_embeddings", "n_positions", "max_seq_len", "seq_length",
                               "model_max_length", "max_target_positions", "max_sequence_length", "max_seq_length",
                               "seq_len"}) {
    if (!Present(config, key)) continue;
    const json& value = config[std::string(key)];
    if (!value.is_number_integer() || value.get<int64_t>() <= 0) continue;  // engines skip what is not a length
    c.length_keys.emplace_back(std::string(key), value.get<int64_t>());
  }
  for (std::string_view key : {"rope_scaling", "rope_parameters"}) {
    if (!Present(config, key) || !config[std::string(key)].is_object()) continue;
    const json& rope = config[std::string(key)];
    const JsonPath rope_path = config_path / key;
    for (std::string_view type_key : {"rope_type", "type"}) {
      if (Present(rope, type_key) && rope[std::string(type_key)].is_string()) {
        c.rope_scaling_type = rope[std::string(type_key)].get<std::string>();
        break;
      }
    }
    HEADROOM_ASSIGN_OR_RETURN(c.rope_scaling_factor, OptionalNumber(rope, "factor", rope_path, 1.0));
    if (!(c.rope_scaling_factor > 0) || c.rope_scaling_factor > 1e6) {
      return (rope_path / "factor").Error(absl::StrFormat("must be positive, got %g", c.rope_scaling_factor));
    }
    HEADROOM_ASSIGN_OR_RETURN(c.original_max_position_embeddings,
                              OptionalPositiveInt(rope, "original_max_position_embeddings", rope_path, 0));
    if (c.rope_scaling_type == "default") c.rope_scaling_type.clear();  // transformers 5 writes the unscaled one
    break;
  }
  if (Present(doc, "quantization_config")) {
    HEADROOM_ASSIGN_OR_RETURN(c.quantization,
                              ParseQuantizationConfig(doc["quantization_config"], path / "quantization_config"));
  }
  return absl::OkStatus();
}

}  // namespace

namespace models_internal {

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
  HEADROOM_RETURN_IF_ERROR(ParseServingFields(doc, path, c));
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

}  // namespace headroom

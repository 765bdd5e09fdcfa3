// The model families Headroom models, in one registry, internal to models/. An entry is one Hugging Face
// model_type: the names it answers to (its model_type, older spellings of it, the classes config.json's
// "architectures" lists), the parser that reads its config.json, and the builder that emits its graph. Config
// resolution (ParseHfConfig; Note [Choosing the architecture] in model_config.cc), the builder dispatch
// (Builder::Build in builders.cc), the config.json key names errors quote (FieldNamesOf) and every listing of
// names (SupportedArchitectures, and so the errors naming every supported class; the torchvision CNNs) read
// this one table.
//
// Adding an architecture is adding its family's file, models/families/<family>.cc, with its parser (written
// with models/config_parsing.h), its classes and its entry; its line in models/CMakeLists.txt; and its entry's
// declaration and line in model_registry.cc. A family's file defines its entry:
//
//   constexpr ArchitectureClass kClasses[] = {{"LlamaForCausalLM"}};
//
//   extern constexpr ModelFamilyEntry kLlamaFamily{
//       .model_type = "llama",
//       .classes = kClasses,
//       .kind = ModelFamily::kDecoder,
//       .parse = CheckedTransformer<ParseLlama>,  // ParseLlama, then the size checks
//       .build = [](builders_internal::Builder& b) { return b.BuildDecoder(); },
//   };
//
//   const ModelFamilyEntry* family = FindFamily(config.model_type);  // the family a parsed config is of
//
// An entry also says what the builders ask of a family by name: whether its attention and loss are Llama's
// (llama_like), its decoder's module names and PEFT's default LoRA targets. The builders' blocks still branch
// on model_type where one family's graph differs from its kind's in the ops themselves (builders/); a family
// whose graph is its kind's needs none of that.
//
// Invariants (tests/models/model_registry_test.cc checks them): every model_type, model_type alias and class
// name belongs to one entry; every entry has a class, a parser and a builder.
#ifndef HEADROOM_MODELS_MODEL_REGISTRY_H_
#define HEADROOM_MODELS_MODEL_REGISTRY_H_

#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "common/json_fields.h"
#include "models/model_config.h"
#include "nlohmann/json.hpp"

namespace headroom {
namespace builders_internal {
class Builder;
struct DecoderNames;
}  // namespace builders_internal

namespace models_internal {

// A class config.json's "architectures" may name, and the head it puts on an encoder's body.
struct ArchitectureClass {
  std::string_view name;  // "LlamaForCausalLM", "BertForMaskedLM", "resnet50"
  EncoderHead head = EncoderHead::kBodyOnly;
};

// A class of the family's checkpoints that is not modelled, refused with advice on what to give instead
// ("Llama4ForConditionalGeneration", "the vision tower is not modelled; give its text_config ...").
struct RefusedClass {
  std::string_view name;
  std::string_view advice;
};

// Reads config.json into `config`, whose origin, architecture, architecture_from, model_type, family,
// encoder_head and torch_dtype are already set, and checks what it read (Note [Model size bounds]).
using ConfigParser = absl::Status (*)(const nlohmann::json& doc, const JsonPath& path, ModelConfig& config);
// Emits the whole forward graph (and loss) of a config of the family.
using GraphBuilder = absl::Status (*)(builders_internal::Builder& builder);
// The config.json keys the family's sizes were read from (ConfigFieldNames in model_config.h).
using FieldNamer = ConfigFieldNames (*)(const ModelConfig& config);
// The leaf modules PEFT adapts by default (DefaultLoraTargets in builder.h).
using LoraTargeter = std::vector<std::string> (*)(const ModelConfig& config, const TransformersVersion& transformers);
// A decoder's module names as its state dict spells them (DecoderNamesOf in builder.h).
using DecoderNamer = builders_internal::DecoderNames (*)(const ModelConfig& config);

struct ModelFamilyEntry {
  // ModelConfig::model_type of every config the family parses: "llama", "falcon", "cnn".
  std::string_view model_type;
  // The classes it answers to, in the order listings print them; the first is the one model_type alone names.
  std::span<const ArchitectureClass> classes;
  ModelFamily kind;
  ConfigParser parse;
  GraphBuilder build;
  // Null: Hugging Face's standard key names (ConfigFieldNames' defaults).
  FieldNamer field_names = nullptr;
  // Other model_type spellings transformers reads as this one (RWConfig's "RefinedWebModel" is Falcon's).
  std::span<const std::string_view> model_type_aliases = {};
  // False where no config.json's model_type names the family (the torchvision CNNs'): only its classes do.
  bool model_type_selects = true;
  std::span<const RefusedClass> refused_classes = {};
  // Llama's eager attention (softmax in f32) and loss over f32 logits, which its descendants keep.
  bool llama_like = false;
  // PEFT's TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING for the family; null: q_proj and v_proj.
  LoraTargeter lora_targets = nullptr;
  // Null: Llama's names (DecoderNames' defaults).
  DecoderNamer decoder_names = nullptr;
};

// Every family, in the order listings give their classes (SupportedArchitectures).
std::span<const ModelFamilyEntry* const> ModelFamilies();

// The family of a parsed config, by its ModelConfig::model_type; null for none (a tower's "clip_text_model").
const ModelFamilyEntry* FindFamily(std::string_view model_type);

// The family config.json's model_type alone selects, older spellings included; null for none.
const ModelFamilyEntry* FamilyOfModelType(std::string_view config_model_type);

// The class named `name` and its family; both null when no family answers to it.
struct FamilyClass {
  const ModelFamilyEntry* family = nullptr;
  const ArchitectureClass* architecture = nullptr;
};
FamilyClass FindClass(std::string_view name);

}  // namespace models_internal
}  // namespace headroom

#endif  // HEADROOM_MODELS_MODEL_REGISTRY_H_

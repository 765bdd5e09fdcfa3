#include "models/model_registry.h"

#include <algorithm>
#include <span>
#include <string_view>

namespace headroom::models_internal {

// Each family's entry, defined in its family's file.
extern const ModelFamilyEntry kLlamaFamily;
extern const ModelFamilyEntry kMistralFamily;
extern const ModelFamilyEntry kQwen2Family;
extern const ModelFamilyEntry kGpt2Family;
extern const ModelFamilyEntry kGptNeoxFamily;
extern const ModelFamilyEntry kMixtralFamily;
extern const ModelFamilyEntry kQwen3Family;
extern const ModelFamilyEntry kGemmaFamily;
extern const ModelFamilyEntry kGemma2Family;
extern const ModelFamilyEntry kPhi3Family;
extern const ModelFamilyEntry kQwen2MoeFamily;
extern const ModelFamilyEntry kQwen3MoeFamily;
extern const ModelFamilyEntry kOlmo2Family;
extern const ModelFamilyEntry kGemma3Family;
extern const ModelFamilyEntry kStarcoder2Family;
extern const ModelFamilyEntry kOptFamily;
extern const ModelFamilyEntry kFalconFamily;
extern const ModelFamilyEntry kGptjFamily;
extern const ModelFamilyEntry kGptBigCodeFamily;
extern const ModelFamilyEntry kBloomFamily;
extern const ModelFamilyEntry kBertFamily;
extern const ModelFamilyEntry kRobertaFamily;
extern const ModelFamilyEntry kT5Family;
extern const ModelFamilyEntry kBartFamily;
extern const ModelFamilyEntry kWhisperFamily;
extern const ModelFamilyEntry kDeepseekV2Family;
extern const ModelFamilyEntry kDeepseekV3Family;
extern const ModelFamilyEntry kGptOssFamily;
extern const ModelFamilyEntry kLlama4TextFamily;
extern const ModelFamilyEntry kVitFamily;
extern const ModelFamilyEntry kClipFamily;
extern const ModelFamilyEntry kSiglipFamily;
extern const ModelFamilyEntry kLlavaFamily;
extern const ModelFamilyEntry kMambaFamily;
extern const ModelFamilyEntry kMlpChainFamily;
extern const ModelFamilyEntry kCnnFamily;

namespace {

// The registry. Its order is the listings' (the errors that name every supported class print them so), which
// is the order the families were added in; a new family goes at the end, before the CNNs.
constexpr const ModelFamilyEntry* kFamilies[] = {
    &kLlamaFamily,     &kMistralFamily,    &kQwen2Family,       &kGpt2Family,       &kGptNeoxFamily,
    &kMixtralFamily,   &kQwen3Family,      &kGemmaFamily,       &kGemma2Family,     &kPhi3Family,
    &kQwen2MoeFamily,  &kQwen3MoeFamily,   &kOlmo2Family,       &kGemma3Family,     &kStarcoder2Family,
    &kOptFamily,       &kFalconFamily,     &kGptjFamily,        &kGptBigCodeFamily, &kBloomFamily,
    &kBertFamily,      &kRobertaFamily,    &kT5Family,          &kBartFamily,       &kWhisperFamily,
    &kDeepseekV2Family, &kDeepseekV3Family, &kGptOssFamily,     &kLlama4TextFamily, &kVitFamily,
    &kClipFamily,      &kSiglipFamily,     &kLlavaFamily,       &kMambaFamily,      &kMlpChainFamily,
    &kCnnFamily,
};

}  // namespace

std::span<const ModelFamilyEntry* const> ModelFamilies() { return kFamilies; }

const ModelFamilyEntry* FindFamily(std::string_view model_type) {
  for (const ModelFamilyEntry* family : kFamilies) {
    if (family->model_type == model_type) return family;
  }
  return nullptr;
}

const ModelFamilyEntry* FamilyOfModelType(std::string_view config_model_type) {
  for (const ModelFamilyEntry* family : kFamilies) {
    if (!family->model_type_selects) continue;
    if (family->model_type == config_model_type ||
        std::find(family->model_type_aliases.begin(), family->model_type_aliases.end(), config_model_type) !=
            family->model_type_aliases.end()) {
      return family;
    }
  }
  return nullptr;
}

FamilyClass FindClass(std::string_view name) {
  for (const ModelFamilyEntry* family : kFamilies) {
    for (const ArchitectureClass& architecture : family->classes) {
      if (architecture.name == name) return {.family = family, .architecture = &architecture};
    }
  }
  return {};
}

}  // namespace headroom::models_internal

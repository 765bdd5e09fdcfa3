#include "models/model_registry.h"

#include <algorithm>
#include <span>
#include <string_view>

namespace headroom::models_internal {

// Each family's entry, defined in its file under models/families/ (`extern constexpr ModelFamilyEntry k...Family`).
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

// The registry, one line per family. The order is the listings' (SupportedArchitectures, and so the errors that
// name every supported class), the order the families were added in; a new family goes before the CNNs.
constexpr const ModelFamilyEntry* kFamilies[] = {
    &kLlamaFamily,       // families/llama.cc
    &kMistralFamily,     // families/mistral.cc
    &kQwen2Family,       // families/qwen.cc
    &kGpt2Family,        // families/gpt2.cc
    &kGptNeoxFamily,     // families/gpt_neox.cc
    &kMixtralFamily,     // families/mistral.cc
    &kQwen3Family,       // families/qwen.cc
    &kGemmaFamily,       // families/gemma.cc
    &kGemma2Family,      // families/gemma.cc
    &kPhi3Family,        // families/phi3.cc
    &kQwen2MoeFamily,    // families/qwen.cc
    &kQwen3MoeFamily,    // families/qwen.cc
    &kOlmo2Family,       // families/olmo2.cc
    &kGemma3Family,      // families/gemma.cc
    &kStarcoder2Family,  // families/starcoder2.cc
    &kOptFamily,         // families/opt.cc
    &kFalconFamily,      // families/falcon.cc
    &kGptjFamily,        // families/gptj.cc
    &kGptBigCodeFamily,  // families/gpt_bigcode.cc
    &kBloomFamily,       // families/bloom.cc
    &kBertFamily,        // families/bert.cc
    &kRobertaFamily,     // families/bert.cc
    &kT5Family,          // families/t5.cc
    &kBartFamily,        // families/bart.cc
    &kWhisperFamily,     // families/bart.cc
    &kDeepseekV2Family,  // families/deepseek.cc
    &kDeepseekV3Family,  // families/deepseek.cc
    &kGptOssFamily,      // families/gpt_oss.cc
    &kLlama4TextFamily,  // families/llama4.cc
    &kVitFamily,         // families/vit.cc
    &kClipFamily,        // families/clip.cc
    &kSiglipFamily,      // families/clip.cc
    &kLlavaFamily,       // families/llava.cc
    &kMambaFamily,       // families/mamba.cc
    &kMlpChainFamily,    // families/mlp_chain.cc
    &kCnnFamily,         // families/cnn.cc
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

// Google's Gemma decoders (transformers' modeling_gemma.py, modeling_gemma2.py, modeling_gemma3.py; Note [Gemma
// decoders] in builders/decoder.cc): Gemma (GemmaForCausalLM), Gemma 2 (Gemma2ForCausalLM) and Gemma 3's text model
// (Gemma3ForCausalLM, model_type "gemma3_text"), each keeping its predecessor's departures from Llama. Built by
// BuildDecoder (builders/decoder.cc).
#include <string_view>
#include <utility>

#include "absl/strings/str_format.h"
#include "common/status_macros.h"
#include "models/builder.h"
#include "models/config_parsing.h"
#include "models/model_registry.h"

namespace headroom::models_internal {
namespace {

using builders_internal::Builder;

// Gemma's departures from Llama (Note [Gemma decoders] in builders/decoder.cc), which Gemma 2 and 3 keep.
absl::Status ParseGemma(const json& doc, const JsonPath& path, ModelConfig& c) {
  HEADROOM_RETURN_IF_ERROR(ParseLlamaDecoder(doc, path, c));
  // transformers reads hidden_activation and falls back to the tanh GELU
  // whatever hidden_act says (Gemma 1 configs say "gelu").
  HEADROOM_ASSIGN_OR_RETURN(c.activation,
                            ParseActivation(doc, "hidden_activation", path, ActivationKind::kGeluTanh));
  HEADROOM_ASSIGN_OR_RETURN(c.tie_word_embeddings, OptionalBool(doc, "tie_word_embeddings", path, true));
  HEADROOM_RETURN_IF_ERROR(ParseAttentionBias(doc, path, false, c));
  c.norm_plus_one = true;
  c.embedding_scaled = true;
  return absl::OkStatus();
}

// Gemma 2's departures from Gemma, which Gemma 3 keeps: sandwich norms, soft caps, a sliding window.
absl::Status ParseGemma2Block(const json& doc, const JsonPath& path, ModelConfig& c) {
  HEADROOM_RETURN_IF_ERROR(ParseGemma(doc, path, c));
  c.norm_placement = NormPlacement::kSandwich;
  for (const auto& [key, cap] : {std::pair<std::string_view, double*>{"attn_logit_softcapping", &c.attn_logit_softcap},
                                 {"final_logit_softcapping", &c.final_logit_softcap}}) {
    HEADROOM_ASSIGN_OR_RETURN(*cap, OptionalNumber(doc, key, path, 0.0));
    if (!(*cap >= 0)) return (path / key).Error(absl::StrFormat("must be positive or null, got %g", *cap));
  }
  HEADROOM_ASSIGN_OR_RETURN(c.sliding_window, PositiveInt(doc, "sliding_window", path));
  return absl::OkStatus();
}

absl::Status ParseGemma2(const json& doc, const JsonPath& path, ModelConfig& c) {
  HEADROOM_RETURN_IF_ERROR(ParseGemma2Block(doc, path, c));
  // Gemma2DecoderLayer: even layers attend within the window, odd ones to everything.
  c.global_layer_every = 2;
  return absl::OkStatus();
}

// Gemma 3 (Note [Gemma decoders]): q/k norms over head_dim, a second rotary table for the sliding layers,
// and every sliding_window_pattern-th layer global; newer configs list layer_types instead.
absl::Status ParseGemma3(const json& doc, const JsonPath& path, ModelConfig& c) {
  HEADROOM_RETURN_IF_ERROR(ParseGemma2Block(doc, path, c));
  c.qk_norm = true;
  c.local_rotary = true;
  HEADROOM_ASSIGN_OR_RETURN(c.query_pre_attn_scalar, OptionalNumber(doc, "query_pre_attn_scalar", path, 256.0));
  if (!(c.query_pre_attn_scalar > 0)) {
    return (path / "query_pre_attn_scalar").Error(absl::StrFormat("must be positive, got %g", c.query_pre_attn_scalar));
  }
  if (Present(doc, "layer_types")) {
    return ParseLayerTypeList(doc, path, {"sliding_attention", "full_attention"}, "sliding_attention", c);
  }
  HEADROOM_ASSIGN_OR_RETURN(c.global_layer_every, OptionalInt(doc, "sliding_window_pattern", path, 6));
  if (c.global_layer_every < 1 || c.global_layer_every > kMaxLayers) {
    return (path / "sliding_window_pattern")
        .Error(absl::StrFormat("must be between 1 and %d, got %d", kMaxLayers, c.global_layer_every));
  }
  return absl::OkStatus();
}

constexpr ArchitectureClass kGemmaClasses[] = {{"GemmaForCausalLM"}};
constexpr ArchitectureClass kGemma2Classes[] = {{"Gemma2ForCausalLM"}};
constexpr ArchitectureClass kGemma3Classes[] = {{"Gemma3ForCausalLM"}};

}  // namespace

extern constexpr ModelFamilyEntry kGemmaFamily{
    .model_type = "gemma",
    .classes = kGemmaClasses,
    .kind = ModelFamily::kDecoder,
    .parse = CheckedTransformer<ParseGemma>,
    .build = [](Builder& b) { return b.BuildDecoder(); },
    .llama_like = true,
};

extern constexpr ModelFamilyEntry kGemma2Family{
    .model_type = "gemma2",
    .classes = kGemma2Classes,
    .kind = ModelFamily::kDecoder,
    .parse = CheckedTransformer<ParseGemma2>,
    .build = [](Builder& b) { return b.BuildDecoder(); },
    .llama_like = true,
};

extern constexpr ModelFamilyEntry kGemma3Family{
    .model_type = "gemma3_text",
    .classes = kGemma3Classes,
    .kind = ModelFamily::kDecoder,
    .parse = CheckedTransformer<ParseGemma3>,
    .build = [](Builder& b) { return b.BuildDecoder(); },
    .llama_like = true,
};

}  // namespace headroom::models_internal

// BART (BartForConditionalGeneration; Note [BART] in builders/encoder_decoder.cc) and OpenAI's Whisper
// (WhisperForConditionalGeneration; Note [Whisper]), which reads BART's key names for its two stacks. Built by
// BuildBart and BuildWhisper (builders/encoder_decoder.cc).
#include <cstdint>
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

// BartForConditionalGeneration (Note [BART] in builders/encoder_decoder.cc): encoder and decoder of the same width,
// each with its own learned positions; the encoder's and decoder's heads and feed-forward sizes must agree (every BART
// checkpoint's do).
absl::Status ParseBart(const json& doc, const JsonPath& path, ModelConfig& c) {
  HEADROOM_ASSIGN_OR_RETURN(c.vocab_size, PositiveInt(doc, "vocab_size", path));
  HEADROOM_ASSIGN_OR_RETURN(c.hidden_size, PositiveInt(doc, "d_model", path));
  HEADROOM_ASSIGN_OR_RETURN(c.num_layers, BoundedCount(doc, "encoder_layers", path, kMaxLayers));
  HEADROOM_ASSIGN_OR_RETURN(c.decoder_layers, BoundedCount(doc, "decoder_layers", path, kMaxLayers));
  HEADROOM_ASSIGN_OR_RETURN(c.num_heads, PositiveInt(doc, "encoder_attention_heads", path));
  HEADROOM_ASSIGN_OR_RETURN(c.intermediate_size, PositiveInt(doc, "encoder_ffn_dim", path));
  for (const auto& [key, encoder_value] : {std::pair<std::string_view, int64_t>{"decoder_attention_heads", c.num_heads},
                                          {"decoder_ffn_dim", c.intermediate_size}}) {
    HEADROOM_ASSIGN_OR_RETURN(const int64_t value, PositiveInt(doc, key, path));
    if (value != encoder_value) {
      return (path / key).Error(absl::StrFormat("%d differs from the encoder's %d, which is not modelled", value,
                                                encoder_value));
    }
  }
  c.num_kv_heads = c.num_heads;
  HEADROOM_ASSIGN_OR_RETURN(c.max_position_embeddings, OptionalPositiveInt(doc, "max_position_embeddings", path, 1024));
  HEADROOM_ASSIGN_OR_RETURN(c.activation, ParseActivation(doc, "activation_function", path, ActivationKind::kGelu));
  HEADROOM_ASSIGN_OR_RETURN(c.hidden_dropout, Probability(doc, "dropout", path, 0.1));
  c.embedding_dropout = c.hidden_dropout;
  HEADROOM_ASSIGN_OR_RETURN(c.attention_dropout, Probability(doc, "attention_dropout", path, 0.0));
  HEADROOM_ASSIGN_OR_RETURN(c.activation_dropout, Probability(doc, "activation_dropout", path, 0.0));
  HEADROOM_ASSIGN_OR_RETURN(c.embedding_scaled, OptionalBool(doc, "scale_embedding", path, false));
  HEADROOM_ASSIGN_OR_RETURN(c.tie_word_embeddings, OptionalBool(doc, "tie_word_embeddings", path, true));
  c.qkv_bias = c.attn_output_bias = c.mlp_bias = true;
  c.norm = NormKind::kLayerNorm;
  c.positions = PositionKind::kLearned;
  return absl::OkStatus();
}

// WhisperForConditionalGeneration (Note [Whisper] in builders/encoder_decoder.cc): BART's key names for the two stacks
// (whose heads and feed-forward sizes must agree, as every Whisper checkpoint's do), the audio front end's num_mel_bins
// and max_source_positions, and the decoder's max_target_positions (WhisperConfig's defaults when absent: 80,
// 1500, 448; dropout 0). The sinusoidal table the encoder is initialized from needs an even d_model.
absl::Status ParseWhisper(const json& doc, const JsonPath& path, ModelConfig& c) {
  HEADROOM_RETURN_IF_ERROR(ParseBart(doc, path, c));
  if (c.hidden_size % 2 != 0) {
    return (path / "d_model").Error(absl::StrFormat("%d is odd; the encoder's sinusoidal positions need it even",
                                                    c.hidden_size));
  }
  HEADROOM_ASSIGN_OR_RETURN(c.num_mel_bins, OptionalPositiveInt(doc, "num_mel_bins", path, 80));
  HEADROOM_ASSIGN_OR_RETURN(c.source_positions, OptionalPositiveInt(doc, "max_source_positions", path, 1500));
  HEADROOM_ASSIGN_OR_RETURN(c.max_position_embeddings, OptionalPositiveInt(doc, "max_target_positions", path, 448));
  HEADROOM_ASSIGN_OR_RETURN(c.hidden_dropout, Probability(doc, "dropout", path, 0.0));
  c.embedding_dropout = c.hidden_dropout;
  c.embedding_scaled = false;  // WhisperConfig reads scale_embedding, but neither stack's forward applies it
  return absl::OkStatus();
}

ConfigFieldNames BartFieldNames(const ModelConfig&) {
  return {.hidden = "d_model", .layers = "encoder_layers", .heads = "encoder_attention_heads",
          .kv_heads = "encoder_attention_heads", .intermediate = "encoder_ffn_dim",
          .positions = "max_position_embeddings"};
}

ConfigFieldNames WhisperFieldNames(const ModelConfig& c) {
  ConfigFieldNames names = BartFieldNames(c);
  names.positions = "max_target_positions";
  return names;
}

constexpr ArchitectureClass kBartClasses[] = {{"BartForConditionalGeneration"}};
constexpr ArchitectureClass kWhisperClasses[] = {{"WhisperForConditionalGeneration"}};

}  // namespace

extern constexpr ModelFamilyEntry kBartFamily{
    .model_type = "bart",
    .classes = kBartClasses,
    .kind = ModelFamily::kEncoderDecoder,
    .parse = CheckedTransformer<ParseBart>,
    .build = [](Builder& b) { return b.BuildBart(); },
    .field_names = BartFieldNames,
};

extern constexpr ModelFamilyEntry kWhisperFamily{
    .model_type = "whisper",
    .classes = kWhisperClasses,
    .kind = ModelFamily::kEncoderDecoder,
    .parse = CheckedTransformer<ParseWhisper>,
    .build = [](Builder& b) { return b.BuildWhisper(); },
    .field_names = WhisperFieldNames,
};

}  // namespace headroom::models_internal

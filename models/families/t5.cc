// Google's T5, T5 v1.1 and Flan-T5 (T5ForConditionalGeneration; Note [T5] in builders/encoder_decoder.cc). Built by
// BuildT5 (builders/encoder_decoder.cc).
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "common/quote.h"
#include "common/status_macros.h"
#include "models/builder.h"
#include "models/config_parsing.h"
#include "models/model_registry.h"

namespace headroom::models_internal {
namespace {

using builders_internal::Builder;

// T5ForConditionalGeneration (T5, T5 v1.1, Flan-T5; Note [T5] in builders/encoder_decoder.cc): its own key names,
// relative position buckets instead of position embeddings, `feed_forward_proj` "relu" or "gated-<act>" (transformers
// maps "gated-gelu" to the tanh GELU), embeddings tied to the head unless tie_word_embeddings says otherwise.
absl::Status ParseT5(const json& doc, const JsonPath& path, ModelConfig& c) {
  HEADROOM_ASSIGN_OR_RETURN(c.vocab_size, PositiveInt(doc, "vocab_size", path));
  HEADROOM_ASSIGN_OR_RETURN(c.hidden_size, PositiveInt(doc, "d_model", path));
  HEADROOM_ASSIGN_OR_RETURN(c.head_dim, PositiveInt(doc, "d_kv", path));
  HEADROOM_ASSIGN_OR_RETURN(c.intermediate_size, PositiveInt(doc, "d_ff", path));
  HEADROOM_ASSIGN_OR_RETURN(c.num_heads, PositiveInt(doc, "num_heads", path));
  c.num_kv_heads = c.num_heads;
  HEADROOM_ASSIGN_OR_RETURN(c.num_layers, BoundedCount(doc, "num_layers", path, kMaxLayers));
  c.decoder_layers = c.num_layers;
  if (Present(doc, "num_decoder_layers")) {
    HEADROOM_ASSIGN_OR_RETURN(c.decoder_layers, BoundedCount(doc, "num_decoder_layers", path, kMaxLayers));
  }
  HEADROOM_ASSIGN_OR_RETURN(c.relative_buckets, OptionalPositiveInt(doc, "relative_attention_num_buckets", path, 32));
  // Relative buckets reach any length; n_positions is the length T5 was trained at, the default --seq.
  HEADROOM_ASSIGN_OR_RETURN(c.max_position_embeddings, OptionalPositiveInt(doc, "n_positions", path, 512));
  HEADROOM_ASSIGN_OR_RETURN(c.norm_eps, OptionalNumber(doc, "layer_norm_epsilon", path, 1e-6));
  HEADROOM_ASSIGN_OR_RETURN(c.hidden_dropout, Probability(doc, "dropout_rate", path, 0.1));
  c.attention_dropout = c.embedding_dropout = c.hidden_dropout;
  HEADROOM_ASSIGN_OR_RETURN(c.tie_word_embeddings, OptionalBool(doc, "tie_word_embeddings", path, true));
  std::string projection = "relu";
  if (Present(doc, "feed_forward_proj")) {
    HEADROOM_ASSIGN_OR_RETURN(projection, RequireString(doc, "feed_forward_proj", path));
  }
  c.gated_mlp = projection.starts_with("gated-");
  std::string act = c.gated_mlp ? projection.substr(6) : projection;
  if (act == "gelu" && c.gated_mlp) act = "gelu_new";
  absl::StatusOr<ActivationKind> kind = HfActivation(act);
  if (!kind.ok() || act.find('-') != std::string::npos) {
    return (path / "feed_forward_proj")
        .Error(absl::StrFormat("%s is neither 'ACT' nor 'gated-ACT' with a known activation",
                               QuoteForError(projection)));
  }
  c.activation = *kind;
  c.norm = NormKind::kRmsNorm;  // T5LayerNorm: no mean subtraction, no bias
  c.norm_bias = false;
  c.positions = PositionKind::kRelativeBuckets;
  return absl::OkStatus();
}

ConfigFieldNames T5FieldNames(const ModelConfig&) {
  return {.hidden = "d_model", .layers = "num_layers", .heads = "num_heads", .kv_heads = "num_heads",
          .intermediate = "d_ff", .positions = "n_positions"};
}

constexpr ArchitectureClass kClasses[] = {{"T5ForConditionalGeneration"}};

std::vector<std::string> LoraTargets(const ModelConfig&, const TransformersVersion&) {
  return {"q", "v"};
}

}  // namespace

extern constexpr ModelFamilyEntry kT5Family{
    .model_type = "t5",
    .classes = kClasses,
    .kind = ModelFamily::kEncoderDecoder,
    .parse = CheckedTransformer<ParseT5>,
    .build = [](Builder& b) { return b.BuildT5(); },
    .field_names = T5FieldNames,
    .lora_targets = LoraTargets,
};

}  // namespace headroom::models_internal

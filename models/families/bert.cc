// BERT and RoBERTa (transformers' modeling_bert.py and modeling_roberta.py): the bodies (BertModel, RobertaModel),
// their masked-LM and sequence-classification heads (Note [Headless encoders] in builders.h). Built by BuildEncoder
// (builders/encoder.cc).
#include <cstdint>
#include <string>
#include <vector>

#include "common/status_macros.h"
#include "models/builder.h"
#include "models/config_parsing.h"
#include "models/model_registry.h"

namespace headroom::models_internal {
namespace {

using builders_internal::Builder;

absl::Status ParseBertLike(const json& doc, const JsonPath& path, ModelConfig& c) {
  HEADROOM_RETURN_IF_ERROR(ParseStandardDims(doc, path, 512, c));
  HEADROOM_ASSIGN_OR_RETURN(c.type_vocab_size, OptionalInt(doc, "type_vocab_size", path, 2));
  if (c.type_vocab_size < 0 || c.type_vocab_size > kMaxSize) {
    return (path / "type_vocab_size").Error("must be between 0 and 2^31");
  }
  HEADROOM_ASSIGN_OR_RETURN(c.norm_eps, OptionalNumber(doc, "layer_norm_eps", path, 1e-12));
  HEADROOM_ASSIGN_OR_RETURN(c.activation,
                            ParseActivation(doc, "hidden_act", path, ActivationKind::kGelu));
  HEADROOM_ASSIGN_OR_RETURN(c.hidden_dropout, Probability(doc, "hidden_dropout_prob", path, 0.1));
  HEADROOM_ASSIGN_OR_RETURN(c.attention_dropout,
                            Probability(doc, "attention_probs_dropout_prob", path, 0.1));
  c.embedding_dropout = c.hidden_dropout;
  HEADROOM_ASSIGN_OR_RETURN(c.tie_word_embeddings,
                            OptionalBool(doc, "tie_word_embeddings", path, true));
  HEADROOM_RETURN_IF_ERROR(ParseNumLabels(doc, path, c));
  c.norm = NormKind::kLayerNorm;
  c.positions = PositionKind::kLearned;
  c.qkv_bias = c.attn_output_bias = c.mlp_bias = true;
  c.final_norm = false;
  // The pooler belongs to BertModel/RobertaModel only: the masked-LM and
  // RoBERTa classification models build the encoder with add_pooling_layer=False.
  c.encoder_pooler = c.encoder_head == EncoderHead::kBodyOnly ||
                     (c.encoder_head == EncoderHead::kSequenceClassification &&
                      c.model_type == "bert");
  return absl::OkStatus();
}

constexpr ArchitectureClass kBertClasses[] = {
    {"BertModel", EncoderHead::kBodyOnly},
    {"BertForMaskedLM", EncoderHead::kMaskedLm},
    {"BertForSequenceClassification", EncoderHead::kSequenceClassification},
};
constexpr ArchitectureClass kRobertaClasses[] = {
    {"RobertaModel", EncoderHead::kBodyOnly},
    {"RobertaForMaskedLM", EncoderHead::kMaskedLm},
    {"RobertaForSequenceClassification", EncoderHead::kSequenceClassification},
};

std::vector<std::string> LoraTargets(const ModelConfig&, const TransformersVersion&) {
  return {"query", "value"};
}

}  // namespace

extern constexpr ModelFamilyEntry kBertFamily{
    .model_type = "bert",
    .classes = kBertClasses,
    .kind = ModelFamily::kEncoder,
    .parse = CheckedTransformer<ParseBertLike>,
    .build = [](Builder& b) { return b.BuildEncoder(); },
    .field_names = UngroupedHeadNames,
    .lora_targets = LoraTargets,
};

extern constexpr ModelFamilyEntry kRobertaFamily{
    .model_type = "roberta",
    .classes = kRobertaClasses,
    .kind = ModelFamily::kEncoder,
    .parse = CheckedTransformer<ParseBertLike>,
    .build = [](Builder& b) { return b.BuildEncoder(); },
    .field_names = UngroupedHeadNames,
    .lora_targets = LoraTargets,
};

}  // namespace headroom::models_internal

// BERT and RoBERTa encoders and their heads.
#include <string>

#include "absl/strings/str_format.h"
#include "common/checked_math.h"
#include "common/status_macros.h"
#include "models/builder.h"

namespace headroom::builders_internal {

absl::Status Builder::BuildEncoder() {
  const int64_t b = o_.batch, s = o_.seq_len, h = c_.hidden_size;
  const int64_t s_local = sp_ ? s / t_ : s;
  const int64_t vocab = CeilDiv<int64_t>(c_.vocab_size, t_);
  const bool roberta = c_.model_type == "roberta";
  const std::string root =
      c_.encoder_head == EncoderHead::kBodyOnly ? "" : (roberta ? "roberta." : "bert.");

  e_.set_layer(-1);
  TensorId ids = e_.Input("input_ids", {b, s}, DType::kI64);
  TensorId word = Param(root + "embeddings.word_embeddings.weight", {vocab, h});
  TensorId x = e_.Embedding(root + "embeddings.word_embeddings", ids, word);
  if (t_ > 1) x = ReduceOutput(root + "embeddings.word_embeddings", x);
  TensorId positions = e_.Input("position_ids", {roberta ? b : 1, s_local}, DType::kI64);
  TensorId pos_table =
      Param(root + "embeddings.position_embeddings.weight", {c_.max_position_embeddings, h});
  x = e_.Add(root + "embeddings.add_position", x,
             e_.Embedding(root + "embeddings.position_embeddings", positions, pos_table));
  if (c_.type_vocab_size > 0) {
    TensorId types = e_.Input("token_type_ids", {b, s_local}, DType::kI64);
    TensorId type_table =
        Param(root + "embeddings.token_type_embeddings.weight", {c_.type_vocab_size, h});
    x = e_.Add(root + "embeddings.add_token_type", x,
               e_.Embedding(root + "embeddings.token_type_embeddings", types, type_table));
  }
  x = LayerNormModule(root + "embeddings.LayerNorm", x);
  x = e_.Dropout(root + "embeddings.dropout", x, c_.embedding_dropout);

  for (int64_t i = 0; i < c_.num_layers; ++i) {
    e_.set_layer(static_cast<int>(i));
    const std::string p = absl::StrFormat("%sencoder.layer.%d.", root, i);
    // BERT is post-norm: LayerNorm(x + sublayer(x)).
    TensorId attn = Attention(p, GatherInput(p + "attention", x), sp_ ? x : kNone);
    attn = e_.Dropout(p + "attention.output.dropout", attn, c_.hidden_dropout);
    x = LayerNormModule(p + "attention.output.LayerNorm",
                        e_.Add(p + "attention.output.residual", attn, x));
    TensorId mlp = Mlp(p, GatherInput(p + "intermediate", x), sp_ ? x : kNone);
    mlp = e_.Dropout(p + "output.dropout", mlp, c_.hidden_dropout);
    x = LayerNormModule(p + "output.LayerNorm", e_.Add(p + "output.residual", mlp, x));
    HEADROOM_RETURN_IF_ERROR(CheckGraphSize(i));
  }
  e_.set_layer(-1);
  if (sp_) x = e_.AllGather(root + "encoder.all_gather", x, 1, t_);
  TensorId pooled = kNone;
  if (c_.encoder_pooler) {
    TensorId first = e_.View(root + "pooler.first_token", x, {b, h});
    pooled = e_.Activation(root + "pooler.activation", ActivationKind::kTanh,
                           Proj(root + "pooler.dense", first, h, h, true, Parallel::kReplicated));
  }
  if (c_.encoder_head == EncoderHead::kMaskedLm) {
    const std::string head = roberta ? "lm_head." : "cls.predictions.";
    const std::string transform = roberta ? head : head + "transform.";
    TensorId y = Proj(transform + "dense", x, h, h, true, Parallel::kReplicated);
    y = Activation(transform + "act", y);
    y = LayerNormModule(transform + (roberta ? "layer_norm" : "LayerNorm"), y);
    // The head's bias is the decoder Linear's own (`self.decoder.bias = self.bias` in BertLMPredictionHead and
    // RobertaLMHead): one addmm, whose output under autocast is 16-bit, not a 16-bit product plus an f32 bias.
    TensorId logits = Proj(head + "decoder", y, h, vocab, true, Parallel::kColumn, false, kNone,
                           c_.tie_word_embeddings ? word : kNone);
    if (o_.training) Loss(logits, b * s, vocab);
    return absl::OkStatus();
  }
  const bool classify = c_.encoder_head == EncoderHead::kSequenceClassification || o_.training;
  if (!classify) return absl::OkStatus();
  TensorId logits;
  if (roberta && c_.encoder_head == EncoderHead::kSequenceClassification) {
    // RobertaClassificationHead: dropout, dense, tanh, dropout, out_proj on <s>.
    TensorId first = e_.View("classifier.first_token", x, {b, h});
    TensorId y = e_.Dropout("classifier.dropout_in", first, c_.hidden_dropout);
    y = e_.Activation("classifier.activation", ActivationKind::kTanh,
                      Proj("classifier.dense", y, h, h, true, Parallel::kReplicated));
    y = e_.Dropout("classifier.dropout_out", y, c_.hidden_dropout);
    logits = Proj("classifier.out_proj", y, h, c_.num_labels, true, Parallel::kReplicated);
  } else {
    // Note [Headless encoders]: BertForSequenceClassification's head.
    TensorId y = e_.Dropout("classifier.dropout", pooled, c_.hidden_dropout);
    logits = Proj("classifier", y, h, c_.num_labels, true, Parallel::kReplicated);
  }
  if (o_.training) Loss(logits, b, c_.num_labels);
  return absl::OkStatus();
}

}  // namespace headroom::builders_internal

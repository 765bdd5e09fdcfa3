// EleutherAI's GPT-J (GPTJForCausalLM; Note [GPT-J] in builders/attention.cc). Built by BuildDecoder
// (builders/decoder.cc).
#include "absl/strings/str_format.h"
#include "common/status_macros.h"
#include "models/builder.h"
#include "models/config_parsing.h"
#include "models/model_registry.h"

namespace headroom::models_internal {
namespace {

using builders_internal::Builder;

// GPTJForCausalLM (transformers 4.46's modeling_gptj.py, Note [GPT-J] in builders/attention.cc): GPT-2's size names,
// unbiased q/k/v/out projections, rotary positions over the first rotary_dim features of each head, attention and
// MLP in parallel from one ln_1, a biased fc_in/fc_out MLP, and an untied lm_head with a bias.
absl::Status ParseGptj(const json& doc, const JsonPath& path, ModelConfig& c) {
  HEADROOM_RETURN_IF_ERROR(ParseCoreDims(doc, path, {.hidden = "n_embd", .layers = "n_layer", .heads = "n_head"}, c));
  HEADROOM_ASSIGN_OR_RETURN(c.intermediate_size, OptionalPositiveInt(doc, "n_inner", path, 4 * c.hidden_size));
  HEADROOM_ASSIGN_OR_RETURN(c.max_position_embeddings, OptionalPositiveInt(doc, "n_positions", path, 2048));
  HEADROOM_ASSIGN_OR_RETURN(c.norm_eps, OptionalNumber(doc, "layer_norm_epsilon", path, 1e-5));
  HEADROOM_ASSIGN_OR_RETURN(c.activation,
                            ParseActivation(doc, "activation_function", path, ActivationKind::kGeluNew));
  if (doc.contains("rotary_dim") && doc["rotary_dim"].is_null()) {
    // GPTJAttention then rotates hidden_size features of every head-sized slice, which only runs with one head.
    return (path / "rotary_dim").Error("null (rotary over hidden_size features) is not supported");
  }
  HEADROOM_ASSIGN_OR_RETURN(c.rotary_dim, OptionalPositiveInt(doc, "rotary_dim", path, 64));
  if (c.rotary_dim % 2 != 0 || (c.hidden_size % c.num_heads == 0 && c.rotary_dim > c.hidden_size / c.num_heads)) {
    return (path / "rotary_dim")
        .Error(absl::StrFormat("%d: must be even and at most the head size, n_embd / n_head", c.rotary_dim));
  }
  HEADROOM_ASSIGN_OR_RETURN(c.hidden_dropout, Probability(doc, "resid_pdrop", path, 0.0));
  HEADROOM_ASSIGN_OR_RETURN(c.embedding_dropout, Probability(doc, "embd_pdrop", path, 0.0));
  HEADROOM_ASSIGN_OR_RETURN(c.attention_dropout, Probability(doc, "attn_pdrop", path, 0.0));
  HEADROOM_ASSIGN_OR_RETURN(c.tie_word_embeddings, OptionalBool(doc, "tie_word_embeddings", path, false));
  c.norm = NormKind::kLayerNorm;
  c.positions = PositionKind::kRotary;
  c.parallel_residual = true;
  c.branch_norms = 1;
  c.mlp_bias = c.lm_head_bias = true;
  return absl::OkStatus();
}

constexpr ArchitectureClass kClasses[] = {{"GPTJForCausalLM"}};

builders_internal::DecoderNames ModuleNames(const ModelConfig&) {
  return {.root = "transformer.", .embed = "wte", .layers = "h", .norm1 = "ln_1", .final_norm = "ln_f"};
}

}  // namespace

extern constexpr ModelFamilyEntry kGptjFamily{
    .model_type = "gptj",
    .classes = kClasses,
    .kind = ModelFamily::kDecoder,
    .parse = CheckedTransformer<ParseGptj>,
    .build = [](Builder& b) { return b.BuildDecoder(); },
    .field_names = Gpt2FieldNames,
    .decoder_names = ModuleNames,
};

}  // namespace headroom::models_internal

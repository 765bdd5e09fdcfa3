// T5, BART and Whisper (Note [T5], Note [BART] and Note [Whisper] in models/builders/encoder_decoder.cc):
// parameter counts, the blocks of both stacks, and malformed configs.
#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "models/builders.h"
#include "models/model_config.h"
#include "models/model_source.h"
#include "tests/models/model_test_util.h"

namespace headroom {
namespace {

using ::testing::HasSubstr;

// The original t5-base: ReLU feed-forward of 3072, embeddings tied to the head.
constexpr char kT5Base[] = R"({"architectures": ["T5ForConditionalGeneration"], "model_type": "t5",
    "d_model": 768, "d_kv": 64, "d_ff": 3072, "num_layers": 12, "num_heads": 12, "vocab_size": 32128,
    "feed_forward_proj": "relu"})";

using ::headroom::testing::Build;
using ::headroom::testing::CountOps;
using ::headroom::testing::FindOp;
using ::headroom::testing::FindTensor;

const BuildOptions kEager{.batch = 2, .seq_len = 32, .target_seq_len = 8, .attention = AttentionImpl::kEager};

// The counts come from transformers 4.46.3's T5ForConditionalGeneration built from each config (summing
// p.numel() over model.parameters(), shared weights once): 247.6 M for google/t5-v1_1-base (gated GELU,
// untied head; the model card's "base" 250 M), 222.9 M for the original t5-base (220 M on its card).
// transformers 5.24 ties v1.1's head to the shared embedding too (Note [transformers versions]): 222.9 M.
TEST(EncoderDecoder, ParameterCountsMatchTransformers) {
  absl::StatusOr<ModelConfig> v11 = LoadPresetConfig("t5-v1_1-base");
  ASSERT_TRUE(v11.ok()) << v11.status();
  BuildOptions hf446 = kEager;
  hf446.runtime.transformers = {.major = 4, .minor = 46};
  EXPECT_EQ(Build(*v11, hf446).ParameterCount(), 247'577'856u);
  EXPECT_EQ(Build(*v11, kEager).ParameterCount(), 222'903'552u);
  absl::StatusOr<ModelConfig> base = ParseHfConfig(kT5Base, "t5-base.json");
  ASSERT_TRUE(base.ok()) << base.status();
  EXPECT_EQ(Build(*base, kEager).ParameterCount(), 222'903'552u);
}

TEST(EncoderDecoder, DecoderBlocksFollowTheEncodersAndAttendToIt) {
  absl::StatusOr<ModelConfig> c = LoadPresetConfig("t5-v1_1-base");
  ASSERT_TRUE(c.ok()) << c.status();
  c->num_layers = 2;
  c->decoder_layers = 3;
  const Graph g = Build(*c, kEager);
  int bias_tables = 0;
  int max_layer = -1;
  for (const Tensor& t : g.tensors()) {
    if (t.name.ends_with("relative_attention_bias.weight")) {
      ++bias_tables;
      EXPECT_THAT(t.name, HasSubstr("block.0.layer.0.SelfAttention")) << "only each stack's first block";
    }
    max_layer = std::max(max_layer, t.layer);
  }
  EXPECT_EQ(bias_tables, 2);
  EXPECT_EQ(max_layer, 4);  // encoder blocks 0-1, decoder blocks 2-4
  bool cross_reads_encoder = false, logits_are_targets = false;
  for (const Op& op : g.ops()) {
    if (op.name == "decoder.block.2.layer.1.EncDecAttention.k") {
      cross_reads_encoder = g.tensor(op.inputs[0]).shape == std::vector<int64_t>{2, 32, 768};
      EXPECT_EQ(op.layer, 4);
    }
    if (op.name == "lm_head") logits_are_targets = g.tensor(op.outputs[0]).shape == std::vector<int64_t>{2, 8, 32128};
  }
  EXPECT_TRUE(cross_reads_encoder);
  EXPECT_TRUE(logits_are_targets);
}

// Note [T5]: before transformers 5 the mask is folded into a [batch, heads, q, k] position bias that every block
// reads; from 5.0 the bias stays [1, heads, q, k] and only the decoder's self-attention adds its causal mask to the
// scores, in every block.
TEST(EncoderDecoder, PositionBiasIsMaskedAndBatchWideOnlyBeforeTransformers5) {
  absl::StatusOr<ModelConfig> c = ParseHfConfig(kT5Base, "t5-base.json");
  ASSERT_TRUE(c.ok()) << c.status();
  c->num_layers = 2;
  c->decoder_layers = 3;
  BuildOptions hf446 = kEager, hf524 = kEager;
  hf446.runtime.transformers = {.major = 4, .minor = 46};
  hf524.runtime.transformers = {.major = 5, .minor = 24};
  const Graph old_graph = Build(*c, hf446), new_graph = Build(*c, hf524);
  const Tensor* masked = FindTensor(old_graph, "encoder.block.0.layer.0.SelfAttention.position_bias_masked.out");
  ASSERT_NE(masked, nullptr);
  EXPECT_EQ(masked->shape, (std::vector<int64_t>{2, 12, 32, 32}));
  for (const Op& op : old_graph.ops()) EXPECT_FALSE(op.name.ends_with(".add_mask")) << op.name;
  for (const Tensor& t : new_graph.tensors()) EXPECT_THAT(t.name, ::testing::Not(HasSubstr("position_bias_masked")));
  const Tensor* bias = FindTensor(new_graph, "encoder.block.0.layer.0.SelfAttention.position_bias");
  ASSERT_NE(bias, nullptr);
  EXPECT_EQ(bias->shape, (std::vector<int64_t>{1, 12, 32, 32}));
  int masked_blocks = 0;
  for (const Op& op : new_graph.ops()) {
    if (op.name.ends_with(".add_mask")) {
      ++masked_blocks;
      EXPECT_THAT(op.name, HasSubstr("decoder.block.")) << "the encoder's batch has no padding";
      EXPECT_THAT(op.name, HasSubstr("SelfAttention"));
    }
  }
  EXPECT_EQ(masked_blocks, 3);
}

TEST(EncoderDecoder, TiedHeadsScaleAndReuseTheEmbeddings) {
  absl::StatusOr<ModelConfig> c = ParseHfConfig(kT5Base, "t5-base.json");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->tie_word_embeddings);
  EXPECT_FALSE(c->gated_mlp);
  const Graph g = Build(*c, kEager);
  bool rescaled = false;
  for (const Op& op : g.ops()) rescaled = rescaled || op.name == "decoder.rescale";
  EXPECT_TRUE(rescaled);
  for (const Tensor& t : g.tensors()) EXPECT_NE(t.name, "lm_head.weight");
}

TEST(EncoderDecoder, BadConfigsAndOptionsAreNamed) {
  const std::string base = R"({"architectures": ["T5ForConditionalGeneration"], "d_kv": 8, "d_ff": 64,
      "num_layers": 2, "num_heads": 4, "vocab_size": 128)";
  for (const auto& [extra, field] : std::vector<std::pair<std::string, std::string>>{
           {"}", "d_model"},
           {R"(, "d_model": 32, "feed_forward_proj": "gated-swoosh"})", "feed_forward_proj"},
           {R"(, "d_model": 32, "num_decoder_layers": 0})", "num_decoder_layers"},
           {R"(, "d_model": 32, "dropout_rate": 1.5})", "dropout_rate"}}) {
    absl::StatusOr<ModelConfig> c = ParseHfConfig(base + extra, "t5.json");
    ASSERT_FALSE(c.ok()) << extra;
    EXPECT_THAT(c.status().message(), HasSubstr(field)) << extra;
  }
  // A bias table of 2^31 buckets x 256 heads is past the weight bound (Note [Model size bounds]).
  absl::StatusOr<ModelConfig> buckets = ParseHfConfig(
      R"({"architectures": ["T5ForConditionalGeneration"], "d_model": 64, "d_kv": 8, "d_ff": 64, "num_layers": 2,
          "num_heads": 256, "vocab_size": 128, "relative_attention_num_buckets": 2147483647})",
      "t5.json");
  ASSERT_FALSE(buckets.ok());
  EXPECT_THAT(buckets.status().message(), HasSubstr("t5.json: relative_attention_num_buckets x num_heads"));
  absl::StatusOr<ModelConfig> ok = ParseHfConfig(base + R"(, "d_model": 32})", "t5.json");
  ASSERT_TRUE(ok.ok()) << ok.status();
  absl::StatusOr<Graph> flash = BuildModelGraph(*ok, {.batch = 1, .seq_len = 8, .attention = AttentionImpl::kFlash});
  ASSERT_FALSE(flash.ok());
  EXPECT_THAT(flash.status().message(), HasSubstr("attention flash"));
  absl::StatusOr<Graph> tp = BuildModelGraph(
      *ok, {.batch = 1, .seq_len = 8, .attention = AttentionImpl::kEager, .tensor_parallel = 2});
  ASSERT_FALSE(tp.ok());
  EXPECT_THAT(tp.status().message(), HasSubstr("tensor_parallel"));
}

// bart-large: transformers 4.46.3's BartForConditionalGeneration from this config, the shared embeddings counted
// once (406 M on the model card). The preset is written from the published sizes with bart-large-mnli's dropouts.
TEST(EncoderDecoder, BartCountsAndBuildsPostNormStacks) {
  absl::StatusOr<ModelConfig> c = LoadPresetConfig("bart-large");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(Build(*c, kEager).ParameterCount(), 406'291'456u);
  c->num_layers = 1;
  c->decoder_layers = 2;
  const Graph g = Build(*c, kEager);
  bool positions = false, logits_bias = false;
  for (const Tensor& t : g.tensors()) {
    if (t.name == "model.decoder.embed_positions.weight") positions = t.shape == std::vector<int64_t>{1026, 1024};
    if (t.name == "final_logits_bias") logits_bias = t.role == TensorRole::kBuffer;
  }
  EXPECT_TRUE(positions);  // max_position_embeddings + 2 rows
  EXPECT_TRUE(logits_bias);
  int cross = 0;
  for (const Op& op : g.ops()) {
    if (op.name.starts_with("model.decoder.layers.1.encoder_attn.k_proj")) {
      ++cross;
      EXPECT_EQ(op.layer, 2);
      EXPECT_EQ(g.tensor(op.inputs[0]).shape, (std::vector<int64_t>{2, 32, 1024}));  // the encoder's output
    }
  }
  EXPECT_EQ(cross, 1);
  // BART has flash paths (sdpa, flash_attention_2), T5 does not.
  EXPECT_TRUE(BuildModelGraph(*c, {.batch = 1, .seq_len = 16, .attention = AttentionImpl::kFlash}).ok());
  absl::StatusOr<Graph> too_long = BuildModelGraph(*c, {.batch = 1, .seq_len = 16, .target_seq_len = 1025});
  ASSERT_FALSE(too_long.ok());
  EXPECT_THAT(too_long.status().message(), HasSubstr("max_position_embeddings (1024)"));
}

TEST(EncoderDecoder, BadBartFieldsAreNamed) {
  const std::string base = R"({"architectures": ["BartForConditionalGeneration"], "d_model": 32, "encoder_layers": 2,
      "decoder_layers": 2, "encoder_attention_heads": 4, "encoder_ffn_dim": 64, "vocab_size": 128)";
  for (const auto& [extra, field] : std::vector<std::pair<std::string, std::string>>{
           {R"(, "decoder_attention_heads": 4})", "decoder_ffn_dim"},
           {R"(, "decoder_attention_heads": 8, "decoder_ffn_dim": 64})", "decoder_attention_heads"},
           {R"(, "decoder_attention_heads": 4, "decoder_ffn_dim": 32})", "decoder_ffn_dim"},
           {R"(, "decoder_attention_heads": 4, "decoder_ffn_dim": 64, "activation_function": "swoosh"})",
            "activation_function"}}) {
    absl::StatusOr<ModelConfig> c = ParseHfConfig(base + extra, "bart.json");
    ASSERT_FALSE(c.ok()) << extra;
    EXPECT_THAT(c.status().message(), HasSubstr(field)) << extra;
  }
}

// whisper-large-v3: transformers 4.46.3's WhisperForConditionalGeneration built on the meta device from this
// preset, sum(p.numel() for p in model.parameters()) with proj_out tied to the decoder's embed_tokens (1.55 B on
// the model card). The encoder's sinusoidal position table (1500 x 1280) is frozen in transformers.
TEST(EncoderDecoder, WhisperCountsAndFreezesTheEncodersPositions) {
  absl::StatusOr<ModelConfig> c = LoadPresetConfig("whisper-large-v3");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->num_mel_bins, 128);
  EXPECT_EQ(c->source_positions, 1500);
  EXPECT_EQ(c->max_position_embeddings, 448);
  const Graph g = Build(*c, {.batch = 1, .seq_len = 8, .attention = AttentionImpl::kFlash});
  EXPECT_EQ(g.ParameterCount(), 1'543'490'560u);
  const Tensor* positions = FindTensor(g, "model.encoder.embed_positions.weight");
  ASSERT_NE(positions, nullptr);
  EXPECT_FALSE(positions->trainable);
  EXPECT_EQ(positions->shape, (std::vector<int64_t>{1500, 1280}));
  const Tensor* conv1 = FindTensor(g, "model.encoder.conv1.weight");
  ASSERT_NE(conv1, nullptr);
  EXPECT_EQ(conv1->shape, (std::vector<int64_t>{1280, 128, 3}));
  EXPECT_TRUE(FindTensor(g, "model.decoder.embed_positions.weight")->trainable);
  EXPECT_EQ(FindTensor(g, "proj_out.weight"), nullptr);  // tied to model.decoder.embed_tokens.weight
  EXPECT_EQ(FindTensor(g, "model.encoder.layers.0.self_attn.k_proj.bias"), nullptr);
  EXPECT_NE(FindTensor(g, "model.encoder.layers.0.self_attn.v_proj.bias"), nullptr);
}

// The encoder reads 2 x max_source_positions frames whatever the job; seq_len (or target_seq_len when set) is
// the decoder's tokens, up to max_target_positions.
TEST(EncoderDecoder, WhisperEncodesFixedFramesAndDecodesTheJobsTokens) {
  absl::StatusOr<ModelConfig> c = ParseHfConfig(R"({"architectures": ["WhisperForConditionalGeneration"],
      "d_model": 64, "encoder_layers": 2, "decoder_layers": 3, "encoder_attention_heads": 4,
      "decoder_attention_heads": 4, "encoder_ffn_dim": 128, "decoder_ffn_dim": 128, "vocab_size": 512,
      "num_mel_bins": 80, "max_source_positions": 60, "max_target_positions": 100, "dropout": 0.1})",
                                                "whisper.json");
  ASSERT_TRUE(c.ok()) << c.status();
  const Graph g = Build(*c, kEager);  // seq_len 32, target_seq_len 8
  EXPECT_EQ(FindTensor(g, "input_features")->shape, (std::vector<int64_t>{2, 80, 120}));
  EXPECT_EQ(FindTensor(g, "decoder_input_ids")->shape, (std::vector<int64_t>{2, 8}));
  const Op* conv2 = FindOp(g, "model.encoder.conv2");
  ASSERT_NE(conv2, nullptr);
  EXPECT_EQ(conv2->kind, "conv1d");
  EXPECT_EQ(g.tensor(conv2->outputs[0]).shape, (std::vector<int64_t>{2, 64, 60}));  // stride 2
  const Op* cross_k = FindOp(g, "model.decoder.layers.2.encoder_attn.k_proj");
  ASSERT_NE(cross_k, nullptr);
  EXPECT_EQ(cross_k->layer, 4);  // encoder blocks 0-1, decoder blocks 2-4
  EXPECT_EQ(g.tensor(cross_k->inputs[0]).shape, (std::vector<int64_t>{2, 60, 64}));  // the encoder's output
  const Op* head = FindOp(g, "proj_out");
  ASSERT_NE(head, nullptr);
  EXPECT_EQ(g.tensor(head->outputs[0]).shape, (std::vector<int64_t>{2, 8, 512}));
  // Eager attention masks only the decoder's own scores.
  EXPECT_EQ(CountOps(g, "model.encoder.", "add"), 1 + 2 * 2);  // positions, then two residuals per block
  EXPECT_NE(FindOp(g, "model.decoder.layers.0.self_attn.add_mask"), nullptr);
  EXPECT_EQ(FindOp(g, "model.decoder.layers.0.encoder_attn.add_mask"), nullptr);
  // Without target_seq_len, seq_len is the decoder's tokens.
  const Graph by_seq = Build(*c, {.batch = 1, .seq_len = 16});
  EXPECT_EQ(FindTensor(by_seq, "decoder_input_ids")->shape, (std::vector<int64_t>{1, 16}));
  EXPECT_EQ(FindTensor(by_seq, "input_features")->shape, (std::vector<int64_t>{1, 80, 120}));
  for (const BuildOptions& too_long : {BuildOptions{.batch = 1, .seq_len = 101},
                                       BuildOptions{.batch = 1, .seq_len = 8, .target_seq_len = 101}}) {
    absl::StatusOr<Graph> refused = BuildModelGraph(*c, too_long);
    ASSERT_FALSE(refused.ok());
    EXPECT_THAT(refused.status().message(), HasSubstr("max_target_positions (100)"));
  }
  EXPECT_TRUE(BuildModelGraph(*c, {.batch = 1, .seq_len = 512, .target_seq_len = 100}).ok());
}

TEST(EncoderDecoder, BadWhisperFieldsAreNamed) {
  const std::string base = R"({"architectures": ["WhisperForConditionalGeneration"], "encoder_layers": 2,
      "decoder_layers": 2, "encoder_attention_heads": 4, "encoder_ffn_dim": 64, "decoder_ffn_dim": 64,
      "vocab_size": 128)";
  for (const auto& [extra, field] : std::vector<std::pair<std::string, std::string>>{
           {R"(, "decoder_attention_heads": 4})", "d_model"},
           {R"(, "d_model": 32})", "decoder_attention_heads"},
           {R"(, "d_model": 36, "decoder_attention_heads": 2})", "decoder_attention_heads"},
           {R"(, "d_model": 32, "decoder_attention_heads": 4, "num_mel_bins": 0})", "num_mel_bins"},
           {R"(, "d_model": 32, "decoder_attention_heads": 4, "max_source_positions": -1})", "max_source_positions"},
           {R"(, "d_model": 32, "decoder_attention_heads": 4, "max_target_positions": "448"})",
            "max_target_positions"},
           {R"(, "d_model": 4294967296, "decoder_attention_heads": 4})", "d_model"},
           {R"(, "d_model": 65536, "decoder_attention_heads": 4, "max_source_positions": 2147483647})",
            "max_source_positions x d_model"},
           {R"(, "d_model": 32, "decoder_attention_heads": 4, "dropout": 1})", "dropout"}}) {
    absl::StatusOr<ModelConfig> c = ParseHfConfig(base + extra, "whisper.json");
    ASSERT_FALSE(c.ok()) << extra;
    EXPECT_THAT(c.status().message(), HasSubstr(field)) << extra;
  }
  // transformers' sinusoids() refuses an odd width.
  absl::StatusOr<ModelConfig> odd = ParseHfConfig(
      R"({"architectures": ["WhisperForConditionalGeneration"], "d_model": 27, "encoder_layers": 1,
          "decoder_layers": 1, "encoder_attention_heads": 3, "decoder_attention_heads": 3, "encoder_ffn_dim": 64,
          "decoder_ffn_dim": 64, "vocab_size": 128})",
      "whisper.json");
  ASSERT_FALSE(odd.ok());
  EXPECT_THAT(odd.status().message(), HasSubstr("whisper.json: d_model: 27 is odd"));
  absl::StatusOr<ModelConfig> defaults =
      ParseHfConfig(base + R"(, "d_model": 32, "decoder_attention_heads": 4})", "whisper.json");
  ASSERT_TRUE(defaults.ok()) << defaults.status();
  // WhisperConfig's defaults: 80 mel bins, 1500 source and 448 target positions, no dropout.
  EXPECT_EQ(defaults->num_mel_bins, 80);
  EXPECT_EQ(defaults->source_positions, 1500);
  EXPECT_EQ(defaults->max_position_embeddings, 448);
  EXPECT_EQ(defaults->hidden_dropout, 0.0);
}

}  // namespace
}  // namespace headroom

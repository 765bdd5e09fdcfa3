// Vision transformers (Note [Vision transformers] in models/builders/vision.cc) and the two-tower image-text models
// built on them (Note [Contrastive towers]) from their config.json presets: ViT's patch embedding, class token
// and pre-norm blocks; CLIP's and SigLIP's text and vision towers, heads and losses; LLaVA's vision tower,
// projector and language model over text and image tokens (Note [LLaVA]).
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "estimators/memory_estimate.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "models/builders.h"
#include "models/model_config.h"
#include "models/model_source.h"
#include "tests/models/model_test_util.h"

namespace headroom {
namespace {

using ::testing::HasSubstr;

using ::headroom::testing::Build;
using ::headroom::testing::FindOp;
using ::headroom::testing::FindTensor;
using ::headroom::testing::Preset;
using ::headroom::testing::ShapeOf;

// The expected counts come from the reference implementation, not from Headroom: transformers 4.46.3's
// classes built from the preset under accelerate's init_empty_weights, summing p.numel() once per distinct
// parameter:
//  - vit-base-patch16-224 (google/vit-base-patch16-224, the checkpoint's config.json as transformers 4.57.1
//    re-saves it): ViTForImageClassification, 86,567,656 (86.6 M on the model card: 12 blocks of 768, a
//    16 x 16 patch convolution, 197 positions, the 1000-class classifier);
//  - the same config as ViTModel (google/vit-base-patch16-224-in21k's class): 86,389,248, its pooler instead
//    of the classifier;
//  - clip-vit-base-patch32 (openai/clip-vit-base-patch32's config.json): CLIPModel, 151,277,313 (the 151 M
//    of the model card: a 12-layer 512-wide text tower over 49408 tokens and 77 positions, a 12-layer
//    768-wide vision tower over 32-pixel patches, both projections to 512 and logit_scale);
//  - siglip-base-patch16-224 (google/siglip-base-patch16-224, its config.json written from the published
//    values: every size is SiglipConfig's default): SiglipModel, 203,155,970 (203 M on the model card:
//    12-layer 768-wide towers, 32000 tokens and 64 positions, 196 patches of 16 pixels, the attention-pooling
//    head, the text head, logit_scale and logit_bias).
TEST(VisionFamilies, ParameterCountsMatchTheRealModels) {
  const ModelConfig vit = Preset("vit-base-patch16-224");
  EXPECT_EQ(Build(vit, {.batch = 2}).ParameterCount(), 86'567'656u);
  ModelConfig body = vit;
  body.architecture = "ViTModel";
  body.encoder_head = EncoderHead::kBodyOnly;
  EXPECT_EQ(Build(body, {.batch = 2, .training = false}).ParameterCount(), 86'389'248u);
  EXPECT_EQ(Build(Preset("clip-vit-base-patch32"), {.batch = 2, .seq_len = 77}).ParameterCount(), 151'277'313u);
  EXPECT_EQ(Build(Preset("siglip-base-patch16-224"), {.batch = 2, .seq_len = 64}).ParameterCount(), 203'155'970u);
}

// llava-1.5-7b (llava-hf/llava-1.5-7b-hf's config.json): LlavaForConditionalGeneration, 7,063,427,072 from
// transformers 4.46.3 as above (vision_tower 303,507,456, multi_modal_projector 20,979,712, language_model
// 6,738,939,904: the 7.06 B of the model card); the fine-tuning default trains the projector and the language
// model, 6,759,919,616 of them.
TEST(VisionFamilies, LlavaParameterCountMatchesTheRealModel) {
  const Graph g = Build(Preset("llava-1.5-7b"), {.batch = 1, .seq_len = 600});
  EXPECT_EQ(g.ParameterCount(), 7'063'427'072u);
  uint64_t trainable = 0;
  for (const Tensor& t : g.tensors()) {
    if (t.role == TensorRole::kParameter && t.trainable) trainable += t.elements();
  }
  EXPECT_EQ(trainable, 20'979'712u + 6'738'939'904u);
}

TEST(VisionFamilies, VitConfigIsReadFromItsFields) {
  const ModelConfig c = Preset("vit-base-patch16-224");
  EXPECT_EQ(c.family, ModelFamily::kVision);
  EXPECT_EQ(c.architecture, "ViTForImageClassification");
  EXPECT_EQ(c.image_size, 224);
  EXPECT_EQ(c.patch_size, 16);
  EXPECT_EQ(c.in_channels, 3);
  EXPECT_EQ(c.num_labels, 1000);  // from id2label
  EXPECT_EQ(c.num_patches(), 196);
  EXPECT_EQ(c.image_tokens(), 197);
  EXPECT_EQ(c.norm_eps, 1e-12);
  EXPECT_EQ(c.activation, ActivationKind::kGelu);
  EXPECT_EQ(c.head_dim, 64);
}

// A 224-pixel image in 16-pixel patches is 196 patches and the class token, whatever seq_len says; the
// parameters carry Hugging Face's state-dict names and shapes.
TEST(VisionFamilies, VitEmbedsPatchesAndAttendsOverThem) {
  ModelConfig c = Preset("vit-base-patch16-224");
  c.num_layers = 2;
  const Graph g = Build(c, {.batch = 2, .seq_len = 8, .attention = AttentionImpl::kEager});
  EXPECT_EQ(ShapeOf(g, "vit.embeddings.patch_embeddings.projection.weight"), (std::vector<int64_t>{768, 3, 16, 16}));
  EXPECT_EQ(ShapeOf(g, "vit.embeddings.patch_embeddings.projection.bias"), (std::vector<int64_t>{768}));
  EXPECT_EQ(ShapeOf(g, "vit.embeddings.cls_token"), (std::vector<int64_t>{1, 1, 768}));
  EXPECT_EQ(ShapeOf(g, "vit.embeddings.position_embeddings"), (std::vector<int64_t>{1, 197, 768}));
  EXPECT_EQ(ShapeOf(g, "classifier.weight"), (std::vector<int64_t>{1000, 768}));
  // Note [ViT in transformers 5.9]: the names of transformers 5.24 (the default), and of 4.46.
  for (const char* name :
       {"vit.layers.1.layernorm_before.weight", "vit.layers.1.attention.q_proj.weight",
        "vit.layers.1.attention.k_proj.bias", "vit.layers.1.attention.v_proj.weight",
        "vit.layers.1.attention.o_proj.weight", "vit.layers.1.layernorm_after.bias", "vit.layers.1.mlp.fc1.weight",
        "vit.layers.1.mlp.fc2.weight", "vit.layernorm.weight", "classifier.bias"}) {
    EXPECT_NE(FindTensor(g, name), nullptr) << name;
  }
  const Graph g446 = Build(c, {.batch = 2, .seq_len = 8, .attention = AttentionImpl::kEager,
                               .runtime = {.transformers = {.major = 4, .minor = 46}}});
  for (const char* name :
       {"vit.encoder.layer.1.layernorm_before.weight", "vit.encoder.layer.1.attention.attention.query.weight",
        "vit.encoder.layer.1.attention.attention.key.bias", "vit.encoder.layer.1.attention.attention.value.weight",
        "vit.encoder.layer.1.attention.output.dense.weight", "vit.encoder.layer.1.layernorm_after.bias",
        "vit.encoder.layer.1.intermediate.dense.weight", "vit.encoder.layer.1.output.dense.weight"}) {
    EXPECT_NE(FindTensor(g446, name), nullptr) << name;
  }
  EXPECT_EQ(g446.ParameterCount(), g.ParameterCount());
  EXPECT_EQ(FindTensor(g, "vit.pooler.dense.weight"), nullptr);  // ViTForImageClassification builds no pooler
  // The patch convolution: kernel and stride 16 over the 224-pixel image, a 14 x 14 grid.
  const Op* conv = FindOp(g, "vit.embeddings.patch_embeddings.projection");
  ASSERT_NE(conv, nullptr);
  EXPECT_EQ(conv->kind, "conv2d");
  EXPECT_EQ(g.tensor(conv->outputs[0]).shape, (std::vector<int64_t>{2, 768, 14, 14}));
  const Op* scores = FindOp(g, "vit.layers.1.attn_core.qk");
  ASSERT_NE(scores, nullptr);
  EXPECT_EQ(g.tensor(scores->outputs[0]).shape, (std::vector<int64_t>{2, 12, 197, 197}));
  EXPECT_EQ(scores->layer, 1);
  // Pre-norm: each block's first op normalizes the residual stream.
  const Op* norm = FindOp(g, "vit.layers.0.layernorm_before");
  ASSERT_NE(norm, nullptr);
  EXPECT_EQ(norm->kind, "layer_norm");
  // The loss is cross-entropy over the 1000 classes of the class token.
  const Op* loss = FindOp(g, "loss");
  ASSERT_NE(loss, nullptr);
  EXPECT_EQ(loss->phase, Phase::kLoss);
}

// ViTModel has a pooler; trained, it becomes AutoModelForImageClassification's ViTForImageClassification:
// no pooler, a classifier of num_labels (2 without id2label).
TEST(VisionFamilies, HeadlessVitPoolsAndTrainsWithAClassifier) {
  absl::StatusOr<ModelConfig> c = ParseHfConfig(
      R"({"architectures": ["ViTModel"], "model_type": "vit", "hidden_size": 64, "num_hidden_layers": 2,
          "num_attention_heads": 4, "intermediate_size": 128, "image_size": 32, "patch_size": 8})",
      "vit.json");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->num_labels, 2);
  const Graph inference = Build(*c, {.batch = 1, .training = false});
  EXPECT_NE(FindTensor(inference, "pooler.dense.weight"), nullptr);
  EXPECT_EQ(FindTensor(inference, "classifier.weight"), nullptr);
  EXPECT_NE(FindTensor(inference, "layers.1.attention.q_proj.weight"), nullptr);
  const Graph training = Build(*c, {.batch = 4});
  EXPECT_EQ(FindTensor(training, "pooler.dense.weight"), nullptr);
  EXPECT_EQ(ShapeOf(training, "classifier.weight"), (std::vector<int64_t>{2, 64}));
  // (32 / 8)^2 patches and the class token.
  EXPECT_EQ(ShapeOf(training, "embeddings.position_embeddings"), (std::vector<int64_t>{1, 17, 64}));
}

// Absent sizes take ViTConfig's defaults, as transformers reads the file.
TEST(VisionFamilies, VitDefaultsAreTransformers) {
  absl::StatusOr<ModelConfig> c = ParseHfConfig(R"({"model_type": "vit"})", "vit.json");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->architecture, "ViTModel");
  EXPECT_EQ(c->hidden_size, 768);
  EXPECT_EQ(c->num_layers, 12);
  EXPECT_EQ(c->image_size, 224);
  EXPECT_EQ(c->patch_size, 16);
  EXPECT_DOUBLE_EQ(c->hidden_dropout, 0.0);
}

// PEFT's default LoRA targets for ViT are its attention's query and value (not q_proj/v_proj): 12 blocks x 2
// targets x rank 8 x (768 + 768).
TEST(VisionFamilies, VitLoraTargetsQueryAndValueByDefault) {
  const Graph g = Build(Preset("vit-base-patch16-224"), {.batch = 2, .lora = {.rank = 8, .alpha = 16}});
  uint64_t trainable = 0;
  for (const Tensor& t : g.tensors()) {
    if (t.role == TensorRole::kParameter && t.trainable) trainable += t.elements();
  }
  EXPECT_EQ(trainable, 12u * 2 * 8 * (768 + 768));
}

TEST(VisionFamilies, BadVitFieldsAreNamed) {
  const std::string base =
      R"({"architectures": ["ViTForImageClassification"], "model_type": "vit", "hidden_size": 64,
          "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 128)";
  for (const auto& [extra, field] : std::vector<std::pair<std::string, std::string>>{
           {R"(, "patch_size": 0})", "vit.json: patch_size: must be between 1 and image_size (224), got 0"},
           {R"(, "image_size": 32, "patch_size": 64})", "vit.json: patch_size"},
           {R"(, "image_size": 1000000})", "vit.json: image_size: must be between 1 and 16384"},
           {R"(, "image_size": [224, 224]})", "vit.json: image_size"},
           {R"(, "num_channels": 0})", "vit.json: num_channels"},
           {R"(, "num_attention_heads": 5})", "vit.json: num_attention_heads: 5 does not divide hidden_size"},
           {R"(, "id2label": {}})", "vit.json: id2label"},
           {R"(, "hidden_act": "swiglu"})", "vit.json: hidden_act"},
           {R"(, "hidden_dropout_prob": 1.5})", "vit.json: hidden_dropout_prob"},
           {R"(, "num_hidden_layers": 0})", "vit.json: num_hidden_layers"},
           // 16384-pixel images in 1-pixel patches: 2^28 + 1 positions of 1M features.
           {R"(, "hidden_size": 1048576, "num_attention_heads": 1, "image_size": 16384, "patch_size": 1})",
            "(image_size / patch_size)^2 patches x hidden_size"}}) {
    absl::StatusOr<ModelConfig> c = ParseHfConfig(base + extra, "vit.json");
    ASSERT_FALSE(c.ok()) << extra;
    EXPECT_THAT(c.status().message(), HasSubstr(field)) << extra;
  }
}

// The sequence of a ViT is its image's: a job's seq_len is refused unless it says the same, and an image
// too large for a batch names image_size and patch_size.
TEST(VisionFamilies, EstimateTakesTheSequenceFromTheImage) {
  absl::StatusOr<LoadedModel> model = LoadModel("vit-base-patch16-224");
  ASSERT_TRUE(model.ok()) << model.status();
  JobSpec job{.micro_batch = 8};
  EXPECT_EQ(ResolveSeqLen(*model, job), 197);
  job.seq_len = 512;
  EXPECT_EQ(ResolveSeqLen(*model, job), 197);
  absl::StatusOr<MemoryEstimate> refused = EstimateMemory(*model, job, {});
  ASSERT_FALSE(refused.ok());
  EXPECT_THAT(refused.status().message(), HasSubstr("seq_len 512"));
  EXPECT_THAT(refused.status().message(), HasSubstr("197 tokens"));
  job.seq_len = 0;
  absl::StatusOr<MemoryEstimate> e = EstimateMemory(*model, job, {});
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_GT(e->activations, 0u);

  model->config->image_size = 16384;
  model->config->patch_size = 2;
  absl::StatusOr<MemoryEstimate> huge = EstimateMemory(*model, {.micro_batch = 1024}, {});
  ASSERT_FALSE(huge.ok());
  EXPECT_THAT(huge.status().message(), HasSubstr("image_size 16384 / patch_size 2"));
}

TEST(VisionFamilies, ClipConfigHoldsBothTowers) {
  const ModelConfig c = Preset("clip-vit-base-patch32");
  EXPECT_EQ(c.family, ModelFamily::kContrastive);
  ASSERT_EQ(c.towers.size(), 2u);
  const ModelConfig& text = c.text_tower();
  const ModelConfig& vision = c.vision_tower();
  EXPECT_EQ(text.model_type, "clip_text_model");
  EXPECT_EQ(text.vocab_size, 49408);
  EXPECT_EQ(text.max_position_embeddings, 77);
  EXPECT_EQ(text.activation, ActivationKind::kQuickGelu);
  EXPECT_EQ(vision.model_type, "clip_vision_model");
  EXPECT_EQ(vision.patch_size, 32);
  EXPECT_EQ(vision.image_tokens(), 50);  // 7 x 7 patches and the class embedding
  EXPECT_EQ(c.projection_dim, 512);
  EXPECT_EQ(c.num_layers, 24);
}

// The vision tower runs first (layers 0-2), then the text tower (3-4); names keep each tower's numbering.
TEST(VisionFamilies, ClipBuildsTheTowersProjectionsAndSymmetricLoss) {
  ModelConfig c = Preset("clip-vit-base-patch32");
  c.towers[0].num_layers = 2;
  c.towers[1].num_layers = 3;
  const Graph g = Build(c, {.batch = 4, .seq_len = 16, .attention = AttentionImpl::kEager});
  EXPECT_EQ(ShapeOf(g, "vision_model.embeddings.patch_embedding.weight"), (std::vector<int64_t>{768, 3, 32, 32}));
  EXPECT_EQ(FindTensor(g, "vision_model.embeddings.patch_embedding.bias"), nullptr);
  EXPECT_EQ(ShapeOf(g, "vision_model.embeddings.class_embedding"), (std::vector<int64_t>{768}));
  EXPECT_EQ(ShapeOf(g, "vision_model.embeddings.position_embedding.weight"), (std::vector<int64_t>{50, 768}));
  EXPECT_EQ(ShapeOf(g, "text_model.embeddings.position_embedding.weight"), (std::vector<int64_t>{77, 512}));
  EXPECT_EQ(ShapeOf(g, "visual_projection.weight"), (std::vector<int64_t>{512, 768}));
  EXPECT_EQ(ShapeOf(g, "text_projection.weight"), (std::vector<int64_t>{512, 512}));
  EXPECT_EQ(ShapeOf(g, "logit_scale"), (std::vector<int64_t>{}));
  for (const char* name : {"vision_model.pre_layrnorm.weight", "vision_model.post_layernorm.bias",
                           "vision_model.encoder.layers.2.self_attn.out_proj.weight",
                           "vision_model.encoder.layers.2.mlp.fc2.weight", "text_model.final_layer_norm.weight",
                           "text_model.encoder.layers.1.layer_norm2.bias",
                           "text_model.encoder.layers.1.self_attn.q_proj.weight"}) {
    EXPECT_NE(FindTensor(g, name), nullptr) << name;
  }
  const Op* vision_block = FindOp(g, "vision_model.encoder.layers.2.layer_norm1");
  const Op* text_block = FindOp(g, "text_model.encoder.layers.0.layer_norm1");
  ASSERT_NE(vision_block, nullptr);
  ASSERT_NE(text_block, nullptr);
  EXPECT_EQ(vision_block->layer, 2);
  EXPECT_EQ(text_block->layer, 3);
  EXPECT_LT(vision_block->id, text_block->id);
  // Text attends over seq_len tokens, vision over 50; quick_gelu keeps its sigmoid.
  const Op* text_scores = FindOp(g, "text_model.encoder.layers.0.attn_core.qk");
  const Op* vision_scores = FindOp(g, "vision_model.encoder.layers.0.attn_core.qk");
  ASSERT_NE(text_scores, nullptr);
  ASSERT_NE(vision_scores, nullptr);
  EXPECT_EQ(g.tensor(text_scores->outputs[0]).shape, (std::vector<int64_t>{4, 8, 16, 16}));
  EXPECT_EQ(g.tensor(vision_scores->outputs[0]).shape, (std::vector<int64_t>{4, 12, 50, 50}));
  EXPECT_NE(FindOp(g, "text_model.encoder.layers.0.mlp.fc1.act.sigmoid"), nullptr);
  // Similarities of every text with every image, and cross-entropy both ways.
  const Op* logits = FindOp(g, "logits_per_text");
  ASSERT_NE(logits, nullptr);
  EXPECT_EQ(g.tensor(logits->outputs[0]).shape, (std::vector<int64_t>{4, 4}));
  ASSERT_NE(FindOp(g, "loss.text"), nullptr);
  ASSERT_NE(FindOp(g, "loss.image"), nullptr);
  EXPECT_EQ(FindOp(g, "loss")->phase, Phase::kLoss);
}

TEST(VisionFamilies, SiglipPoolsThroughItsHeadsAndTrainsOnPairs) {
  ModelConfig c = Preset("siglip-base-patch16-224");
  EXPECT_EQ(c.text_tower().activation, ActivationKind::kGeluTanh);
  EXPECT_EQ(c.text_tower().max_position_embeddings, 64);
  EXPECT_FALSE(c.vision_tower().class_token);
  EXPECT_EQ(c.vision_tower().image_tokens(), 196);
  c.towers[0].num_layers = 1;
  c.towers[1].num_layers = 1;
  const Graph g = Build(c, {.batch = 2, .seq_len = 64, .param_dtype = DType::kBF16, .compute_dtype = DType::kBF16,
                            .attention = AttentionImpl::kEager});
  EXPECT_EQ(ShapeOf(g, "vision_model.embeddings.patch_embedding.bias"), (std::vector<int64_t>{768}));
  EXPECT_EQ(ShapeOf(g, "vision_model.head.probe"), (std::vector<int64_t>{1, 1, 768}));
  EXPECT_EQ(ShapeOf(g, "vision_model.head.attention.in_proj_weight"), (std::vector<int64_t>{2304, 768}));
  EXPECT_EQ(ShapeOf(g, "text_model.head.weight"), (std::vector<int64_t>{768, 768}));
  EXPECT_EQ(ShapeOf(g, "logit_bias"), (std::vector<int64_t>{1}));
  EXPECT_EQ(FindTensor(g, "vision_model.embeddings.class_embedding"), nullptr);
  EXPECT_EQ(FindTensor(g, "visual_projection.weight"), nullptr);
  // Eager SigLIP attention runs its softmax in f32 and casts back to bf16.
  const Op* softmax = FindOp(g, "vision_model.encoder.layers.0.attn_core.softmax");
  ASSERT_NE(softmax, nullptr);
  EXPECT_EQ(g.tensor(softmax->outputs[0]).dtype, DType::kF32);
  EXPECT_NE(FindOp(g, "vision_model.encoder.layers.0.attn_core.probs_cast"), nullptr);
  EXPECT_NE(FindOp(g, "loss.log_sigmoid"), nullptr);
}

TEST(VisionFamilies, BadTowerFieldsAreNamed) {
  for (const auto& [config, field] : std::vector<std::pair<std::string, std::string>>{
           {R"({"model_type": "clip", "vision_config": {"patch_size": 0}})",
            "clip.json: vision_config.patch_size: must be between 1 and image_size (224), got 0"},
           {R"({"model_type": "clip", "vision_config": {"image_size": 99999}})", "clip.json: vision_config.image_size"},
           {R"({"model_type": "clip", "text_config": {"vocab_size": -1}})", "clip.json: text_config.vocab_size"},
           {R"({"model_type": "clip", "text_config": {"num_attention_heads": 7}})",
            "clip.json: text_config.num_attention_heads"},
           {R"({"model_type": "clip", "text_config": 3})", "clip.json: text_config: expected an object"},
           {R"({"model_type": "clip", "projection_dim": 0})", "clip.json: projection_dim"},
           {R"({"model_type": "clip", "text_config_dict": {"hidden_act": "nope"}})",
            "clip.json: text_config_dict.hidden_act"},
           {R"({"model_type": "siglip", "text_config": {"hidden_size": 512, "num_attention_heads": 8}})",
            "clip.json: text_config.hidden_size: 512 differs from vision_config.hidden_size (768)"}}) {
    absl::StatusOr<ModelConfig> c = ParseHfConfig(config, "clip.json");
    ASSERT_FALSE(c.ok()) << config;
    EXPECT_THAT(c.status().message(), HasSubstr(field)) << config;
  }
  // The text tower's positions bound the sequence.
  absl::StatusOr<Graph> g = BuildModelGraph(Preset("clip-vit-base-patch32"), {.batch = 1, .seq_len = 78});
  ASSERT_FALSE(g.ok());
  EXPECT_THAT(g.status().message(), HasSubstr("text_config.max_position_embeddings (77)"));
}

// A two-tower model's sequence is its text tower's: max_position_embeddings by default.
TEST(VisionFamilies, EstimateTakesTheTextSequenceOfTwoTowers) {
  absl::StatusOr<LoadedModel> model = LoadModel("clip-vit-base-patch32");
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_EQ(ResolveSeqLen(*model, {.micro_batch = 8}), 77);
  EXPECT_EQ(ResolveSeqLen(*model, {.micro_batch = 8, .seq_len = 20}), 20);
  absl::StatusOr<MemoryEstimate> e = EstimateMemory(*model, {.micro_batch = 32}, {});
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_GT(e->activations, 0u);
}

// Note [LLaVA configs]: llava-1.5-7b-hf's text_config leans on LlamaConfig's defaults.
TEST(VisionFamilies, LlavaConfigHoldsTheLanguageModelAndTheVisionTower) {
  const ModelConfig c = Preset("llava-1.5-7b");
  EXPECT_EQ(c.family, ModelFamily::kVisionLanguage);
  EXPECT_EQ(c.architecture, "LlavaForConditionalGeneration");
  const ModelConfig& text = c.text_tower();
  const ModelConfig& vision = c.vision_tower();
  EXPECT_EQ(text.model_type, "llama");
  EXPECT_EQ(text.family, ModelFamily::kDecoder);
  EXPECT_EQ(text.hidden_size, 4096);
  EXPECT_EQ(text.intermediate_size, 11008);
  EXPECT_EQ(text.num_layers, 32);
  EXPECT_EQ(text.num_kv_heads, 32);
  EXPECT_EQ(text.vocab_size, 32064);
  EXPECT_EQ(text.max_position_embeddings, 4096);
  EXPECT_EQ(text.norm_eps, 1e-5);
  EXPECT_EQ(vision.model_type, "clip_vision_model");
  EXPECT_EQ(vision.activation, ActivationKind::kQuickGelu);
  EXPECT_EQ(vision.image_tokens(), 577);
  EXPECT_EQ(c.vision_feature_layer, 23);  // -2 of 24 blocks: the penultimate block's output
  EXPECT_EQ(c.image_feature_tokens(), 576);
  EXPECT_EQ(c.activation, ActivationKind::kGelu);
  EXPECT_EQ(c.num_layers, 56);
}

ModelConfig TinyLlava() {
  ModelConfig c = Preset("llava-1.5-7b");
  c.towers[0].num_layers = 2;
  c.towers[1].num_layers = 3;
  c.vision_feature_layer = 2;  // -2 of 3 blocks
  return c;
}

// Vision blocks 0-2 run first over batch x images images, then the language blocks 3-4 over text and image
// tokens; by default only the projector and the language model train, so the vision tower saves nothing.
TEST(VisionFamilies, LlavaScattersProjectedPatchesIntoTheLanguageModel) {
  const Graph g = Build(TinyLlava(), {.batch = 2, .seq_len = 1200, .images = 2, .attention = AttentionImpl::kEager});
  EXPECT_EQ(ShapeOf(g, "pixel_values"), (std::vector<int64_t>{4, 3, 336, 336}));
  EXPECT_EQ(ShapeOf(g, "vision_tower.vision_model.embeddings.patch_embedding.weight"),
            (std::vector<int64_t>{1024, 3, 14, 14}));
  EXPECT_EQ(ShapeOf(g, "multi_modal_projector.linear_1.weight"), (std::vector<int64_t>{4096, 1024}));
  EXPECT_EQ(ShapeOf(g, "multi_modal_projector.linear_2.bias"), (std::vector<int64_t>{4096}));
  EXPECT_EQ(ShapeOf(g, "language_model.model.embed_tokens.weight"), (std::vector<int64_t>{32064, 4096}));
  EXPECT_EQ(ShapeOf(g, "language_model.lm_head.weight"), (std::vector<int64_t>{32064, 4096}));
  EXPECT_NE(FindTensor(g, "vision_tower.vision_model.post_layernorm.weight"), nullptr);
  EXPECT_FALSE(FindTensor(g, "vision_tower.vision_model.encoder.layers.0.self_attn.q_proj.weight")->trainable);
  EXPECT_TRUE(FindTensor(g, "multi_modal_projector.linear_1.weight")->trainable);
  EXPECT_TRUE(FindTensor(g, "language_model.model.layers.1.mlp.down_proj.weight")->trainable);
  const Op* vision_block = FindOp(g, "vision_tower.vision_model.encoder.layers.2.layer_norm1");
  const Op* text_block = FindOp(g, "language_model.model.layers.0.input_layernorm.square");
  ASSERT_NE(vision_block, nullptr);
  ASSERT_NE(text_block, nullptr);
  EXPECT_EQ(vision_block->layer, 2);
  EXPECT_EQ(text_block->layer, 3);
  // The penultimate block's output without its class token, copied as linear_1 folds it: 2 x 2 images of 576.
  const Op* fold = FindOp(g, "multi_modal_projector.linear_1.fold");
  ASSERT_NE(fold, nullptr);
  EXPECT_EQ(g.tensor(fold->outputs[0]).shape, (std::vector<int64_t>{4, 576, 1024}));
  const Op* selected = &g.op(g.producer(g.tensor(fold->inputs[0]).view_of));
  EXPECT_EQ(selected->name, "vision_tower.vision_model.encoder.layers.1.mlp_residual");
  const Op* scatter = FindOp(g, "inputs_embeds.masked_scatter");
  ASSERT_NE(scatter, nullptr);
  EXPECT_EQ(g.tensor(scatter->outputs[0]).shape, (std::vector<int64_t>{2, 1200, 4096}));
  ASSERT_EQ(scatter->saved.size(), 1u);
  EXPECT_EQ(g.tensor(scatter->saved[0]).dtype, DType::kBool);
  const Op* scores = FindOp(g, "language_model.model.layers.0.attn_core.qk");
  ASSERT_NE(scores, nullptr);
  EXPECT_EQ(g.tensor(scores->outputs[0]).shape, (std::vector<int64_t>{2, 32, 1200, 1200}));
  for (const Op& op : g.ops()) {
    if (op.layer >= 0 && op.layer < 3) {
      EXPECT_TRUE(op.saved.empty()) << op.name;
    }
  }
  // From transformers 4.52 LLaVA's loss is ForCausalLMLoss, which shifts the labels, not the logits (Note
  // [Causal LM loss]); before, its own loss copied the shifted logits.
  EXPECT_EQ(FindOp(g, "loss.shift_logits"), nullptr);
  EXPECT_NE(FindOp(g, "loss.shift_labels"), nullptr);
  const Graph own_loss = Build(TinyLlava(), {.batch = 2, .seq_len = 1200, .images = 2,
                                             .attention = AttentionImpl::kEager,
                                             .runtime = {.transformers = {.major = 4, .minor = 51}}});
  EXPECT_NE(FindOp(own_loss, "loss.shift_logits"), nullptr);
}

TEST(VisionFamilies, LlavaTrainsWhatVlmTrainableSays) {
  auto trainable = [](const Graph& g, std::string_view name) { return FindTensor(g, name)->trainable; };
  const Graph all = Build(TinyLlava(), {.batch = 1, .seq_len = 600, .vlm_trainable = VlmTrainable::kAll});
  EXPECT_TRUE(trainable(all, "vision_tower.vision_model.encoder.layers.0.mlp.fc1.weight"));
  const Op* fc1 = FindOp(all, "vision_tower.vision_model.encoder.layers.0.mlp.fc1");
  ASSERT_NE(fc1, nullptr);
  EXPECT_FALSE(fc1->saved.empty());
  const Graph projector = Build(TinyLlava(), {.batch = 1, .seq_len = 600, .vlm_trainable = VlmTrainable::kProjector});
  EXPECT_FALSE(trainable(projector, "language_model.model.layers.0.self_attn.q_proj.weight"));
  EXPECT_FALSE(trainable(projector, "language_model.lm_head.weight"));
  EXPECT_TRUE(trainable(projector, "multi_modal_projector.linear_2.weight"));
  // The projector's gradient flows back through the frozen language model, which keeps its activations.
  const Op* down = FindOp(projector, "language_model.model.layers.1.mlp.down_proj");
  ASSERT_NE(down, nullptr);
  EXPECT_FALSE(down->saved.empty());
  // LoRA adapts the language model only; the projector trains, the vision tower gets no adapters.
  const Graph lora = Build(TinyLlava(), {.batch = 1, .seq_len = 600, .lora = {.rank = 8}});
  EXPECT_NE(FindTensor(lora, "language_model.model.layers.0.self_attn.q_proj.lora_A.weight"), nullptr);
  EXPECT_EQ(FindTensor(lora, "vision_tower.vision_model.encoder.layers.0.self_attn.q_proj.lora_A.weight"), nullptr);
  EXPECT_FALSE(trainable(lora, "language_model.model.layers.0.self_attn.q_proj.weight"));
  EXPECT_TRUE(trainable(lora, "multi_modal_projector.linear_1.weight"));
  // Text only: no pixel_values, no vision tower run.
  const Graph text = Build(TinyLlava(), {.batch = 1, .seq_len = 16, .images = 0});
  EXPECT_EQ(FindTensor(text, "pixel_values"), nullptr);
}

TEST(VisionFamilies, BadLlavaFieldsAndOptionsAreNamed) {
  for (const auto& [config, field] : std::vector<std::pair<std::string, std::string>>{
           {R"({"model_type": "llava", "vision_feature_layer": -26})",
            "llava.json: vision_feature_layer: -26 indexes no hidden state"},
           {R"({"model_type": "llava", "vision_feature_select_strategy": "cls"})",
            "llava.json: vision_feature_select_strategy: expected \"default\" or \"full\""},
           {R"({"model_type": "llava", "vision_config": {"model_type": "siglip_vision_model"}})",
            "llava.json: vision_config.model_type: 'siglip_vision_model' is not modelled"},
           {R"({"model_type": "llava", "vision_config": {"patch_size": 0}})", "llava.json: vision_config.patch_size"},
           {R"({"model_type": "llava", "text_config": 3})", "llava.json: text_config: expected an object"},
           {R"({"model_type": "llava", "text_config": {"model_type": "mistral"}})",
            "llava.json: text_config.vocab_size: required field is missing"},
           {R"({"model_type": "llava", "text_config": {"num_attention_heads": 7}})",
            "llava.json: text_config.num_attention_heads"},
           {R"({"model_type": "llava", "text_config": {"model_type": "bert", "hidden_size": 64, "vocab_size": 8,
                "num_hidden_layers": 1, "num_attention_heads": 4, "intermediate_size": 8}})",
            "llava.json: text_config.model_type: 'bert' is not a causal language model"},
           {R"({"model_type": "llava", "projector_hidden_act": "nope"})", "llava.json: projector_hidden_act"}}) {
    absl::StatusOr<ModelConfig> c = ParseHfConfig(config, "llava.json");
    ASSERT_FALSE(c.ok()) << config;
    EXPECT_THAT(c.status().message(), HasSubstr(field)) << config;
  }
  // The sequence must hold the images' tokens; LLaVA options on another model are refused.
  absl::StatusOr<Graph> short_seq =
      BuildModelGraph(Preset("llava-1.5-7b"), {.batch = 1, .seq_len = 1000, .images = 2});
  ASSERT_FALSE(short_seq.ok());
  EXPECT_THAT(short_seq.status().message(), HasSubstr("seq_len 1000 is too short for 2 image(s) of 576 tokens"));
  absl::StatusOr<Graph> llama = BuildModelGraph(Preset("llama-2-7b"), {.batch = 1, .seq_len = 8, .images = 2});
  ASSERT_FALSE(llama.ok());
  EXPECT_THAT(llama.status().message(), HasSubstr("vision-language models (LLaVA) only"));
  absl::StatusOr<Graph> tp =
      BuildModelGraph(Preset("llava-1.5-7b"), {.batch = 1, .seq_len = 600, .tensor_parallel = 2});
  ASSERT_FALSE(tp.ok());
  EXPECT_THAT(tp.status().message(), HasSubstr("tensor_parallel 2"));
}

// LLaVA's sequence and KV cache are its language model's: text and image tokens, 32 layers (not 56).
TEST(VisionFamilies, LlavaEstimateCachesTheLanguageModelsTokens) {
  absl::StatusOr<LoadedModel> model = LoadModel("llava-1.5-7b");
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_EQ(ResolveSeqLen(*model, {.micro_batch = 1}), 4096);
  absl::StatusOr<MemoryEstimate> e = EstimateMemory(
      *model, {.training = false, .micro_batch = 4, .seq_len = 1024, .context = 1024, .kv_block_size = 0}, {});
  ASSERT_TRUE(e.ok()) << e.status();
  // 4 sequences x 1024 tokens x 32 layers x (k, v) x 4096 x 2 bytes (bf16).
  EXPECT_EQ(e->kv_cache, 4u * 1024 * 32 * 2 * 4096 * 2);
}

}  // namespace
}  // namespace headroom

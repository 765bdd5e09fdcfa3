#include "models/model_config.h"

#include <string>

#include "gmock/gmock.h"
#include "models/builders.h"
#include "models/model_source.h"
#include "gtest/gtest.h"

namespace headroom {
namespace {

using ::testing::HasSubstr;

TEST(ParseHfConfig, ReadsLlamaWithGqa) {
  absl::StatusOr<ModelConfig> c = LoadPresetConfig("llama-3-8b");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->architecture, "LlamaForCausalLM");
  EXPECT_EQ(c->family, ModelFamily::kDecoder);
  EXPECT_EQ(c->num_heads, 32);
  EXPECT_EQ(c->num_kv_heads, 8);
  EXPECT_EQ(c->head_dim, 128);
  EXPECT_EQ(c->norm, NormKind::kRmsNorm);
  EXPECT_TRUE(c->gated_mlp);
  EXPECT_FALSE(c->tie_word_embeddings);
  EXPECT_EQ(c->torch_dtype, DType::kBF16);
}

TEST(ParseHfConfig, ReadsGpt2DropoutsAndTiedEmbeddings) {
  absl::StatusOr<ModelConfig> c = LoadPresetConfig("gpt2");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->intermediate_size, 4 * 768);  // n_inner absent
  EXPECT_TRUE(c->tie_word_embeddings);
  EXPECT_DOUBLE_EQ(c->attention_dropout, 0.1);
  EXPECT_DOUBLE_EQ(c->hidden_dropout, 0.1);
  EXPECT_EQ(c->activation, ActivationKind::kGeluNew);
}

TEST(ParseHfConfig, ReadsMixtralExperts) {
  absl::StatusOr<ModelConfig> c = LoadPresetConfig("mixtral-8x7b");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->num_experts, 8);
  EXPECT_EQ(c->experts_per_token, 2);
}

TEST(ParseHfConfig, ModelTypeAloneSelectsTheMainClass) {
  absl::StatusOr<ModelConfig> c = ParseHfConfig(
      R"({"model_type": "bert", "vocab_size": 100, "hidden_size": 64, "num_hidden_layers": 2,
          "num_attention_heads": 4, "intermediate_size": 256})",
      "bert.json");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->architecture, "BertModel");
  EXPECT_TRUE(c->encoder_pooler);
}

// Note [Choosing the architecture]: config.json files as people have them.
absl::StatusOr<ModelConfig> TestConfig(const std::string& file) {
  absl::StatusOr<LoadedModel> m = LoadModel(std::string(HEADROOM_SOURCE_DIR) + "/tests/models/testdata/" + file);
  if (!m.ok()) return m.status();
  return *m->config;
}

uint64_t Parameters(const ModelConfig& c) {
  absl::StatusOr<Graph> g = BuildModelGraph(c, {.batch = 1, .seq_len = 8});
  EXPECT_TRUE(g.ok()) << g.status();
  return g.ok() ? g->ParameterCount() : 0;
}

// tiiuae/falcon-7b as first published: remote code (RWForCausalLM), model_type RefinedWebModel and RWConfig's
// n_layer and n_head. transformers loads it as Falcon, and so does Headroom, saying so; it is the falcon-7b preset.
TEST(ParseHfConfig, FirstPublishedFalconConfigIsFalcon) {
  absl::StatusOr<ModelConfig> c = TestConfig("falcon-7b-refinedweb.config.json");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->architecture, "FalconForCausalLM");
  EXPECT_EQ(c->model_type, "falcon");
  EXPECT_THAT(c->architecture_from, HasSubstr("model_type 'RefinedWebModel'"));
  EXPECT_THAT(c->architecture_from, HasSubstr("'RWForCausalLM' not modelled"));
  EXPECT_EQ(c->hidden_size, 4544);
  EXPECT_EQ(c->num_layers, 32);
  EXPECT_EQ(c->num_heads, 71);
  EXPECT_EQ(c->num_kv_heads, 1);  // multi_query
  EXPECT_TRUE(c->parallel_residual);
  EXPECT_FALSE(c->qkv_bias);
  absl::StatusOr<ModelConfig> preset = LoadPresetConfig("falcon-7b");
  ASSERT_TRUE(preset.ok());
  EXPECT_TRUE(preset->architecture_from.empty());
  EXPECT_EQ(Parameters(*c), Parameters(*preset));

  // RWConfig's n_embed for hidden_size, and falcon-40b's RefinedWeb with n_head_kv, without architectures.
  absl::StatusOr<ModelConfig> rw40 = ParseHfConfig(
      R"({"model_type": "RefinedWeb", "vocab_size": 65024, "n_embed": 8192, "n_layer": 60, "n_head": 128,
          "n_head_kv": 8, "new_decoder_architecture": true, "parallel_attn": true, "bias": false})",
      "falcon-40b.json");
  ASSERT_TRUE(rw40.ok()) << rw40.status();
  EXPECT_EQ(rw40->architecture, "FalconForCausalLM");
  EXPECT_EQ(rw40->architecture_from, "model_type 'RefinedWeb', which transformers reads as 'falcon'");
  EXPECT_EQ(rw40->hidden_size, 8192);
  EXPECT_EQ(rw40->num_kv_heads, 8);
}

// facebook/bart-large lists BartModel (not modelled) before BartForConditionalGeneration: the first entry
// modelled is taken and named; it is the bart-large preset.
TEST(ParseHfConfig, TakesTheFirstArchitectureModelled) {
  absl::StatusOr<ModelConfig> c = TestConfig("bart-large.config.json");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->architecture, "BartForConditionalGeneration");
  EXPECT_EQ(ArchitectureChoice(*c),
            "BartForConditionalGeneration, from architectures[1], the first entry Headroom models (not 'BartModel')");
  absl::StatusOr<ModelConfig> preset = LoadPresetConfig("bart-large");
  ASSERT_TRUE(preset.ok());
  EXPECT_EQ(ArchitectureChoice(*preset), "");
  EXPECT_EQ(Parameters(*c), Parameters(*preset));

  // None modelled, and no model_type to fall back on: every entry seen is named, with the file.
  EXPECT_THAT(ParseHfConfig(R"({"architectures": ["BartModel", "BartForQuestionAnswering"], "model_type": "mbart"})",
                            "bart.json")
                  .status()
                  .message(),
              HasSubstr("bart.json: architectures: none of 'BartModel', 'BartForQuestionAnswering' is supported, "
                        "nor model_type 'mbart'; supported: "));
}

TEST(ParseHfConfig, ErrorsNameTheField) {
  EXPECT_THAT(ParseHfConfig(R"({"architectures": ["LlamaForCausalLM"], "vocab_size": 10})", "c.json")
                  .status()
                  .message(),
              HasSubstr("c.json: hidden_size"));
  EXPECT_THAT(ParseHfConfig(R"({"architectures": ["RwkvForCausalLM"]})", "rwkv.json")
                  .status()
                  .message(),
              HasSubstr("unsupported architecture 'RwkvForCausalLM'"));
  EXPECT_THAT(ParseHfConfig(R"({"vocab_size": 10})", "x.json").status().message(),
              HasSubstr("'architectures' (or 'model_type') is required"));
  EXPECT_THAT(ParseHfConfig(R"({"architectures": ["GPT2LMHeadModel"], "vocab_size": 10,
                                "n_embd": -768, "n_layer": 1, "n_head": 1, "n_positions": 8})",
                            "g.json")
                  .status()
                  .message(),
              HasSubstr("g.json: n_embd: must be positive, got -768"));
  EXPECT_THAT(ParseHfConfig(R"({"architectures": ["LlamaForCausalLM"], "vocab_size": 10,
                                "hidden_size": 64, "num_hidden_layers": 1,
                                "num_attention_heads": 8, "num_key_value_heads": 3,
                                "intermediate_size": 128})",
                            "l.json")
                  .status()
                  .message(),
              HasSubstr("l.json: num_key_value_heads: 3 does not divide num_attention_heads (8)"));
  EXPECT_THAT(ParseHfConfig(R"({"architectures": ["GPT2LMHeadModel"], "vocab_size": 10,
                                "n_embd": 8, "n_layer": 1, "n_head": 1, "n_positions": 8,
                                "attn_pdrop": 1.5})",
                            "g.json")
                  .status()
                  .message(),
              HasSubstr("attn_pdrop: must be a probability"));
  EXPECT_THAT(ParseHfConfig(R"({"architectures": ["LlamaForCausalLM"], "vocab_size": "big"})",
                            "l.json")
                  .status()
                  .message(),
              HasSubstr("vocab_size"));
  EXPECT_THAT(ParseHfConfig("{not json", "broken.json").status().message(),
              HasSubstr("broken.json"));
}

TEST(ParseHfConfig, MlpChain) {
  absl::StatusOr<ModelConfig> c = LoadPresetConfig("mlp-mnist");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->family, ModelFamily::kMlp);
  EXPECT_EQ(c->mlp_layer_sizes, (std::vector<int64_t>{1024, 1024, 10}));
  EXPECT_THAT(ParseHfConfig(R"({"architectures": ["MlpChain"], "input_size": 4,
                                "layer_sizes": [8, 0]})",
                            "m.json")
                  .status()
                  .message(),
              HasSubstr("m.json: layer_sizes[1]: must be between 1 and 2^31, got 0"));
}

// Note [CNN configs]: a torchvision CNN in config form, sizes optional.
TEST(ParseHfConfig, CnnConfigs) {
  absl::StatusOr<ModelConfig> small =
      ParseHfConfig(R"({"architectures": ["resnet50"], "image_size": 64, "num_classes": 100})", "r.json");
  ASSERT_TRUE(small.ok()) << small.status();
  EXPECT_EQ(small->family, ModelFamily::kCnn);
  EXPECT_EQ(small->architecture, "resnet50");
  EXPECT_EQ(small->image_size, 64);
  EXPECT_EQ(small->num_classes, 100);
  EXPECT_EQ(small->in_channels, 3);
  EXPECT_EQ(small->num_layers, 16);
  absl::StatusOr<ModelConfig> vgg = ParseHfConfig(R"({"architectures": ["vgg16"]})", "v.json");
  ASSERT_TRUE(vgg.ok()) << vgg.status();
  EXPECT_EQ(vgg->image_size, 224);
  EXPECT_EQ(vgg->num_classes, 1000);
  EXPECT_THAT(ParseHfConfig(R"({"architectures": ["vgg16"], "image_size": 16})", "v.json").status().message(),
              HasSubstr("v.json: image_size: must be between 32 (the networks downsample by 32) and 16384"));
  EXPECT_THAT(ParseHfConfig(R"({"architectures": ["resnet50"], "num_classes": 0})", "r.json").status().message(),
              HasSubstr("r.json: num_classes: must be positive, got 0"));
  EXPECT_THAT(
      ParseHfConfig(R"({"architectures": ["resnet50"], "num_classes": 2147483648})", "r.json").status().message(),
      HasSubstr("r.json: features x num_classes (2048 x 2147483648) exceeds"));
  EXPECT_THAT(ParseHfConfig(R"({"architectures": ["resnet50"], "in_channels": "3"})", "r.json").status().message(),
              HasSubstr("r.json: in_channels: expected an integer, got string"));
}

// A model embedded in a larger document loads as the same file would, its
// errors named after the document it came from.
TEST(LoadModelDocument, ReadsConfigsAndNamesErrorsAfterTheOrigin) {
  const nlohmann::json config = nlohmann::json::parse(R"({"architectures": ["GPT2LMHeadModel"],
      "vocab_size": 100, "n_embd": 64, "n_layer": 2, "n_head": 4, "n_positions": 32})");
  absl::StatusOr<LoadedModel> model = LoadModelDocument(config, "fixtures/x.json: model");
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_EQ(model->kind, ModelSourceKind::kConfigFile);
  EXPECT_EQ(model->name, "fixtures/x.json: model");
  EXPECT_EQ(model->config->num_layers, 2);
  absl::StatusOr<LoadedModel> cnn =
      LoadModelDocument(nlohmann::json::parse(R"({"architectures": ["resnet50"], "image_size": 64})"), "cnn");
  ASSERT_TRUE(cnn.ok()) << cnn.status();
  EXPECT_EQ(cnn->config->image_size, 64);

  nlohmann::json broken = config;
  broken.erase("n_embd");
  EXPECT_EQ(LoadModelDocument(broken, "fixtures/x.json: model").status().message(),
            "fixtures/x.json: model: n_embd: required field is missing");
  EXPECT_EQ(LoadModelDocument(nlohmann::json::array(), "fixtures/x.json: model").status().message(),
            "fixtures/x.json: model: expected a JSON object, got array");
}

TEST(LoadModel, PresetsFilesAndCloseNames) {
  absl::StatusOr<LoadedModel> m = LoadModel("Llama_3_8B");
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->kind, ModelSourceKind::kPreset);
  EXPECT_TRUE(m->config.has_value());
  absl::StatusOr<LoadedModel> unknown = LoadModel("llama-3-7b");
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(unknown.status().message()), HasSubstr("did you mean: "));
  EXPECT_THAT(std::string(unknown.status().message()), HasSubstr("llama-3-8b"));
  EXPECT_THAT(LoadModel("/no/such/config.json").status().message(),
              HasSubstr("'/no/such/config.json' does not exist"));
  absl::StatusOr<LoadedModel> cnn = LoadModel("resnet50");
  ASSERT_TRUE(cnn.ok()) << cnn.status();
  EXPECT_EQ(cnn->config->family, ModelFamily::kCnn);
  std::vector<std::string> names = PresetNames();
  for (const char* expected : {"llama-3-8b", "llama-2-7b", "llama-2-70b", "mistral-7b", "qwen2-7b",
                               "gpt2", "gpt2-xl", "bert-large", "mixtral-8x7b", "resnet50",
                               "vgg16", "olmo-2-13b", "gemma-3-1b", "starcoder2-15b", "opt-1.3b",
                               "deepseek-v3", "deepseek-v2-lite", "vit-base-patch16-224", "clip-vit-base-patch32",
                               "siglip-base-patch16-224", "falcon-7b", "gpt-j-6b", "santacoder", "bloom-560m",
                               "t5-v1-1-base", "bart-large", "whisper-large-v3", "llava-1.5-7b",
                               "mamba-2.8b"}) {
    EXPECT_THAT(names, ::testing::Contains(std::string(expected)));
  }
}

}  // namespace
}  // namespace headroom

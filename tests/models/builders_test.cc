#include "models/builders.h"

#include <algorithm>
#include <set>
#include <string>

#include "gmock/gmock.h"
#include "models/model_source.h"
#include "tests/models/model_test_util.h"
#include "gtest/gtest.h"

namespace headroom {
namespace {

using ::testing::HasSubstr;

using ::headroom::testing::Build;
using ::headroom::testing::FindOp;
using ::headroom::testing::FindTensor;
using ::headroom::testing::Preset;

uint64_t Params(const ModelConfig& c, BuildOptions o = {.batch = 1, .seq_len = 8}) {
  absl::StatusOr<Graph> g = BuildModelGraph(c, o);
  EXPECT_TRUE(g.ok()) << g.status();
  return g.ok() ? g->ParameterCount() : 0;
}

// Bytes of distinct storage that the ops of `layer` save for backward
// (views count as their base tensor, leaves as nothing).
uint64_t SavedBytesOfLayer(const Graph& g, int layer) {
  std::set<TensorId> storage;
  for (const Op& op : g.ops()) {
    if (op.layer != layer) continue;
    for (TensorId id : op.saved) {
      const Tensor& t = g.tensor(id);
      const TensorId base = t.view_of == kNone ? id : t.view_of;
      const TensorRole role = g.tensor(base).role;
      if (role == TensorRole::kParameter || role == TensorRole::kBuffer ||
          role == TensorRole::kInput) {
        continue;
      }
      storage.insert(base);
    }
  }
  uint64_t bytes = 0;
  for (TensorId id : storage) bytes += g.tensor(id).bytes();
  return bytes;
}

TEST(BuildModelGraph, ParameterCountsMatchTheRealModels) {
  EXPECT_EQ(Params(Preset("llama-2-7b")), 6'738'415'616u);
  EXPECT_EQ(Params(Preset("llama-3-8b")), 8'030'261'248u);
  EXPECT_EQ(Params(Preset("mistral-7b")), 7'241'732'096u);
  EXPECT_EQ(Params(Preset("llama-2-70b")), 68'976'648'192u);
  EXPECT_EQ(Params(Preset("qwen2-7b")), 7'615'616'512u);
  EXPECT_EQ(Params(Preset("mixtral-8x7b")), 46'702'792'704u);
  EXPECT_EQ(Params(Preset("gpt2")), 124'439'808u);
  EXPECT_EQ(Params(Preset("gpt2-xl")), 1'557'611'200u);
  EXPECT_EQ(Params(Preset("resnet50")), 25'557'032u);
  EXPECT_EQ(Params(Preset("vgg16")), 138'357'544u);
  EXPECT_EQ(Params(Preset("mlp-mnist")), 784u * 1024 + 1024 + 1024u * 1024 + 1024 + 1024u * 10 + 10);
}

TEST(BuildModelGraph, BertLargeUncasedHasTheRealParameterCount) {
  ModelConfig bert = Preset("bert-large");  // the checkpoint's BertForMaskedLM
  // MLM head: transform dense + LayerNorm + output bias (decoder tied), no pooler.
  EXPECT_EQ(Params(bert), 335'141'888u - 1'049'600u + 1'049'600u + 2'048u + 30'522u);
  // bert-large-uncased as BertModel (with its pooler): 335,141,888.
  bert.encoder_head = EncoderHead::kBodyOnly;
  bert.encoder_pooler = true;
  EXPECT_EQ(Params(bert, {.batch = 1, .seq_len = 8, .training = false}), 335'141'888u);
  // Training a headless encoder attaches a 2-label classifier (Note [Headless encoders]).
  EXPECT_EQ(Params(bert), 335'141'888u + 1024u * 2 + 2);
}

TEST(BuildModelGraph, GptNeoxAndRobertaCounts) {
  // EleutherAI/pythia-160m.
  absl::StatusOr<ModelConfig> pythia = ParseHfConfig(
      R"({"architectures": ["GPTNeoXForCausalLM"], "hidden_size": 768, "intermediate_size": 3072,
          "num_attention_heads": 12, "num_hidden_layers": 12, "vocab_size": 50304,
          "max_position_embeddings": 2048, "rotary_pct": 0.25, "use_parallel_residual": true,
          "tie_word_embeddings": false, "layer_norm_eps": 1e-05, "hidden_act": "gelu"})",
      "pythia-160m");
  ASSERT_TRUE(pythia.ok()) << pythia.status();
  EXPECT_EQ(Params(*pythia), 162'322'944u);
  // FacebookAI/roberta-base as RobertaModel.
  absl::StatusOr<ModelConfig> roberta = ParseHfConfig(
      R"({"architectures": ["RobertaModel"], "hidden_size": 768, "intermediate_size": 3072,
          "num_attention_heads": 12, "num_hidden_layers": 12, "vocab_size": 50265,
          "max_position_embeddings": 514, "type_vocab_size": 1})",
      "roberta-base");
  ASSERT_TRUE(roberta.ok()) << roberta.status();
  EXPECT_EQ(Params(*roberta, {.batch = 1, .seq_len = 8, .training = false}), 124'645'632u);
}

TEST(BuildModelGraph, ParametersAreNamedAsTheStateDict) {
  absl::StatusOr<Graph> g = BuildModelGraph(Preset("llama-2-7b"), {.batch = 1, .seq_len = 8});
  ASSERT_TRUE(g.ok()) << g.status();
  const Tensor* q = FindTensor(*g, "model.layers.3.self_attn.q_proj.weight");
  ASSERT_NE(q, nullptr);
  EXPECT_EQ(q->layer, 3);
  EXPECT_EQ(q->shape, (std::vector<int64_t>{4096, 4096}));
  EXPECT_NE(FindTensor(*g, "lm_head.weight"), nullptr);
  EXPECT_NE(FindTensor(*g, "model.norm.weight"), nullptr);
  absl::StatusOr<Graph> gpt = BuildModelGraph(Preset("gpt2"), {.batch = 1, .seq_len = 8});
  ASSERT_TRUE(gpt.ok());
  const Tensor* c_attn = FindTensor(*gpt, "transformer.h.0.attn.c_attn.weight");
  ASSERT_NE(c_attn, nullptr);
  EXPECT_EQ(c_attn->shape, (std::vector<int64_t>{768, 2304}));  // Conv1D layout
  EXPECT_EQ(FindTensor(*gpt, "lm_head.weight"), nullptr);         // tied to wte
}

// Note [gelu_new]: under CUDA autocast pow runs in f32, so x is cast for it and the tanh, 1 + tanh and the
// result are f32; under CPU autocast the chain stays in bf16.
TEST(BuildModelGraph, GeluNewUnderCudaAutocastRunsItsPowInF32) {
  for (Kernels kernels : {Kernels::kCuda, Kernels::kCpu}) {
    SCOPED_TRACE(std::string(KernelsName(kernels)));
    absl::StatusOr<Graph> g = BuildModelGraph(Preset("gpt2"), {.batch = 1, .seq_len = 8, .param_dtype = DType::kF32,
                                                               .compute_dtype = DType::kBF16,
                                                               .runtime = {.kernels = kernels}});
    ASSERT_TRUE(g.ok()) << g.status();
    const bool cuda = kernels == Kernels::kCuda;
    EXPECT_EQ(FindOp(*g, "transformer.h.0.mlp.c_fc.act.cube_input_cast") != nullptr, cuda);
    const Op* tanh = FindOp(*g, "transformer.h.0.mlp.c_fc.act.tanh");
    ASSERT_NE(tanh, nullptr);
    EXPECT_EQ(g->tensor(tanh->outputs[0]).dtype, cuda ? DType::kF32 : DType::kBF16);
    const Op* half = FindOp(*g, "transformer.h.0.mlp.c_fc.act.half");
    ASSERT_NE(half, nullptr);
    EXPECT_EQ(g->tensor(half->outputs[0]).dtype, DType::kBF16);
  }
}

// Note [Eager attention's scale and mask]: the Llama family scales the scores, then adds a mask of the hidden
// states' dtype, so under autocast over f32 weights the bf16 scores become f32 there; GPT-2 keeps one op.
TEST(BuildModelGraph, LlamaEagerAttentionScalesThenAddsTheMask) {
  for (DType compute : {DType::kF32, DType::kBF16}) {
    SCOPED_TRACE(std::string(DTypeName(compute)));
    absl::StatusOr<Graph> g = BuildModelGraph(Preset("llama-3-8b"), {.batch = 1, .seq_len = 8,
                                                                      .param_dtype = DType::kF32,
                                                                      .compute_dtype = compute});
    ASSERT_TRUE(g.ok()) << g.status();
    const Op* scale = FindOp(*g, "model.layers.0.attn_core.scale");
    const Op* mask = FindOp(*g, "model.layers.0.attn_core.mask");
    ASSERT_NE(scale, nullptr);
    ASSERT_NE(mask, nullptr);
    EXPECT_EQ(scale->kind, "scale");
    EXPECT_EQ(mask->kind, "add_mask");
    EXPECT_EQ(mask->inputs, std::vector<TensorId>{scale->outputs[0]});
    EXPECT_EQ(g->tensor(scale->outputs[0]).dtype, compute);
    EXPECT_EQ(g->tensor(mask->outputs[0]).dtype, DType::kF32);
    EXPECT_EQ(FindOp(*g, "model.layers.0.attn_core.scale_mask"), nullptr);
    // `attn_weights = softmax(attn_weights, ...).to(...)`: the masked scores stay referenced to the statement's end.
    const Op* statement = FindOp(*g, "model.layers.0.attn_core.softmax_statement");
    ASSERT_NE(statement, nullptr);
    EXPECT_EQ(statement->inputs, mask->outputs);
  }
  absl::StatusOr<Graph> gpt2 = BuildModelGraph(Preset("gpt2"), {.batch = 1, .seq_len = 8});
  ASSERT_TRUE(gpt2.ok()) << gpt2.status();
  EXPECT_NE(FindOp(*gpt2, "transformer.h.0.attn_core.scale_mask"), nullptr);
  EXPECT_EQ(FindOp(*gpt2, "transformer.h.0.attn_core.mask"), nullptr);
}

// Korthikanti et al. 2022, "Reducing Activation Recomputation in Large
// Transformer Models" (arXiv:2205.05198), Section 4.1: a GPT layer in 16-bit with dropout stores
// s*b*h*(34 + 5*a*s/h) bytes. Our layer norms also keep mean and rstd in f32
// (2 x 4 bytes per token each), which the paper neglects.
TEST(BuildModelGraph, GptLayerSavesKorthikantiActivations) {
  ModelConfig gpt2 = Preset("gpt2");
  // Korthikanti et al. count one GeLU kernel saving its input (Megatron's); Hugging Face's
  // gelu_new keeps four tensors more (Note [gelu_new] in models/builders.cc).
  gpt2.activation = ActivationKind::kGeluTanh;
  const int64_t s = 128, b = 2, h = 768, a = 12;
  absl::StatusOr<Graph> g = BuildModelGraph(
      gpt2, {.batch = b, .seq_len = s, .param_dtype = DType::kBF16,
             .compute_dtype = DType::kBF16, .attention = AttentionImpl::kEager});
  ASSERT_TRUE(g.ok()) << g.status();
  const uint64_t ln_stats = 2 * 2 * 4 * s * b;
  const uint64_t expected = s * b * h * 34 + 5 * a * s * s * b;
  for (int layer : {0, 5, 11}) EXPECT_EQ(SavedBytesOfLayer(*g, layer), expected + ln_stats) << layer;

  // Flash attention keeps q, k, v, the output and an f32 logsumexp instead of
  // the s^2 terms; the rest of the layer is unchanged.
  absl::StatusOr<Graph> flash = BuildModelGraph(
      gpt2, {.batch = b, .seq_len = s, .param_dtype = DType::kBF16,
             .compute_dtype = DType::kBF16, .attention = AttentionImpl::kFlash});
  ASSERT_TRUE(flash.ok()) << flash.status();
  EXPECT_EQ(SavedBytesOfLayer(*flash, 5), s * b * h * 34 + 4 * a * s * b + ln_stats);
}

// Korthikanti et al. 2022, Section 4.2: tensor parallel t keeps
// s*b*h*(10 + 24/t + 5*a*s/(h*t)); with sequence parallelism everything is
// divided by t, sbh*(34 + 5as/h)/t.
TEST(BuildModelGraph, TensorAndSequenceParallelShards) {
  ModelConfig gpt2 = Preset("gpt2");
  gpt2.activation = ActivationKind::kGeluTanh;  // Korthikanti's one GeLU kernel, as above
  const int64_t s = 128, b = 2, h = 768, a = 12, t = 4;
  BuildOptions o{.batch = b, .seq_len = s, .param_dtype = DType::kBF16,
                 .compute_dtype = DType::kBF16, .tensor_parallel = t};
  absl::StatusOr<Graph> tp = BuildModelGraph(gpt2, o);
  ASSERT_TRUE(tp.ok()) << tp.status();
  const uint64_t ln_stats = 2 * 2 * 4 * s * b;
  EXPECT_EQ(SavedBytesOfLayer(*tp, 3), s * b * h * 10 + s * b * h * 24 / t +
                                           5 * a * s * s * b / t + ln_stats);
  o.sequence_parallel = true;
  absl::StatusOr<Graph> sp = BuildModelGraph(gpt2, o);
  ASSERT_TRUE(sp.ok()) << sp.status();
  EXPECT_EQ(SavedBytesOfLayer(*sp, 3), (s * b * h * 34 + 5 * a * s * s * b + ln_stats) / t);
  // Shard shapes: c_attn is column-parallel, c_proj row-parallel.
  EXPECT_EQ(FindTensor(*sp, "transformer.h.0.attn.c_attn.weight")->shape,
            (std::vector<int64_t>{768, 3 * 768 / t}));
  EXPECT_EQ(FindTensor(*sp, "transformer.h.0.attn.c_proj.weight")->shape,
            (std::vector<int64_t>{768 / t, 768}));
  EXPECT_NE(FindOp(*sp, "transformer.h.0.attn.c_proj.reduce_scatter"), nullptr);
}

TEST(BuildModelGraph, BadOptionsNameTheField) {
  EXPECT_THAT(BuildModelGraph(Preset("gpt2-xl"), {.batch = 1, .seq_len = 8, .tensor_parallel = 2})
                  .status()
                  .message(),
              HasSubstr("n_head (25) is not divisible by tensor_parallel (2)"));
  EXPECT_THAT(BuildModelGraph(Preset("llama-3-8b"), {.batch = 1, .seq_len = 8, .tensor_parallel = 16})
                  .status()
                  .message(),
              HasSubstr("num_key_value_heads (8) is not divisible by tensor_parallel (16)"));
  EXPECT_THAT(BuildModelGraph(Preset("gpt2"), {.batch = 0, .seq_len = 8}).status().message(),
              HasSubstr("batch must be positive, got 0"));
  EXPECT_THAT(BuildModelGraph(Preset("gpt2"), {.batch = 1, .seq_len = -3}).status().message(),
              HasSubstr("seq_len must be positive, got -3"));
  EXPECT_THAT(BuildModelGraph(Preset("gpt2"), {.batch = 1, .seq_len = 2048}).status().message(),
              HasSubstr("exceeds the model's n_positions (1024)"));
  EXPECT_THAT(BuildModelGraph(Preset("gpt2"), {.batch = 1, .seq_len = 8,
                                               .param_dtype = DType::kBF16,
                                               .compute_dtype = DType::kF32})
                  .status()
                  .message(),
              HasSubstr("wider than param_dtype"));
  EXPECT_THAT(BuildModelGraph(Preset("llama-2-7b"),
                              {.batch = 1, .seq_len = 8, .lora = {.rank = 8,
                                                                  .target_modules = {"qproj"}}})
                  .status()
                  .message(),
              HasSubstr("lora target module 'qproj' matches no Linear"));
}

// The fix search offers LoRA with the default targets to every model with attention (estimators/fit_search.cc):
// each preset of such a family must have them. DeepSeek's latent attention has no v_proj; its values come out of
// kv_b_proj (Note [Multi-head latent attention]).
TEST(BuildModelGraph, DefaultLoraTargetsMatchEveryPresetWithAttention) {
  for (const std::string& name : PresetNames()) {
    ModelConfig c = Preset(name);
    if (c.family == ModelFamily::kCnn || c.family == ModelFamily::kMlp || c.family == ModelFamily::kStateSpace) {
      continue;
    }
    c.num_layers = std::min<int64_t>(c.num_layers, 4);  // DeepSeek-V3's first MoE layer is its fourth
    const int64_t seq = c.family == ModelFamily::kVisionLanguage ? 1024 : 16;  // LLaVA's image tokens count
    absl::StatusOr<Graph> g = BuildModelGraph(c, {.batch = 1, .seq_len = seq, .lora = {.rank = 8}});
    EXPECT_TRUE(g.ok()) << name << ": " << g.status();
  }
  const Graph lite = Build(Preset("deepseek-v2-lite"), {.batch = 1, .seq_len = 16, .lora = {.rank = 8}});
  EXPECT_NE(FindOp(lite, "model.layers.0.self_attn.q_proj.lora_A"), nullptr);
  EXPECT_NE(FindOp(lite, "model.layers.0.self_attn.kv_b_proj.lora_A"), nullptr);
  ModelConfig v3 = Preset("deepseek-v3");
  v3.num_layers = 1;
  const Graph v3_graph = Build(v3, {.batch = 1, .seq_len = 16, .lora = {.rank = 8}});
  EXPECT_NE(FindOp(v3_graph, "model.layers.0.self_attn.q_b_proj.lora_A"), nullptr);
}

TEST(BuildModelGraph, LoraFreezesTheBaseAndSavesOnlyWhatAdaptersNeed) {
  absl::StatusOr<Graph> g = BuildModelGraph(
      Preset("llama-2-7b"), {.batch = 1, .seq_len = 16, .param_dtype = DType::kBF16,
                             .compute_dtype = DType::kBF16, .lora = {.rank = 8}});
  ASSERT_TRUE(g.ok()) << g.status();
  // PEFT reports 4,194,304 trainable parameters for r=8 on q_proj, v_proj.
  EXPECT_EQ(g->ParameterCount(/*trainable_only=*/true), 4'194'304u);
  EXPECT_EQ(g->ParameterCount(), 6'738'415'616u + 4'194'304u);
  // A frozen projection (k_proj) saves nothing of its input: no weight gradient.
  const Op* k = FindOp(*g, "model.layers.2.self_attn.k_proj");
  ASSERT_NE(k, nullptr);
  for (TensorId id : k->saved) EXPECT_EQ(g->tensor(id).role, TensorRole::kParameter);
  const Op* lora_a = FindOp(*g, "model.layers.2.self_attn.q_proj.lora_A");
  ASSERT_NE(lora_a, nullptr);
  EXPECT_THAT(lora_a->saved, ::testing::Contains(lora_a->inputs[0]));
  // Before the first adapter nothing needs a gradient, so the embedding saves nothing.
  EXPECT_TRUE(FindOp(*g, "model.embed")->saved.empty());
}

TEST(BuildModelGraph, QloraStoresNf4WithDoubleQuantConstants) {
  absl::StatusOr<Graph> g = BuildModelGraph(
      Preset("llama-2-7b"), {.batch = 1, .seq_len = 16, .param_dtype = DType::kBF16,
                             .compute_dtype = DType::kBF16,
                             .lora = {.rank = 16, .quantize_base_nf4 = true}});
  ASSERT_TRUE(g.ok()) << g.status();
  const Tensor* w = FindTensor(*g, "model.layers.0.mlp.down_proj.weight");
  ASSERT_NE(w, nullptr);
  EXPECT_EQ(w->dtype, DType::kNF4);
  EXPECT_EQ(w->bytes(), 4096u * 11008 / 2);
  const Tensor* absmax = FindTensor(*g, "model.layers.0.mlp.down_proj.weight.absmax");
  ASSERT_NE(absmax, nullptr);
  EXPECT_EQ(absmax->bytes(), 4096u * 11008 / 64);  // one u8 per 64 weights
  EXPECT_EQ(FindTensor(*g, "model.layers.0.mlp.down_proj.weight.nested_absmax")->bytes(),
            (4096u * 11008 / 64 + 255) / 256 * 4);
  // Embeddings and the LM head stay in param_dtype (bitsandbytes skips them).
  EXPECT_EQ(FindTensor(*g, "lm_head.weight")->dtype, DType::kBF16);
  // bitsandbytes' MatMul4Bit keeps neither the input nor the dequantized weight.
  const Op* q = FindOp(*g, "model.layers.4.self_attn.q_proj");
  ASSERT_NE(q, nullptr);
  EXPECT_EQ(g->op(g->producer(q->inputs[1])).kind, "dequantize_nf4");
  EXPECT_TRUE(q->saved.empty());
}

// Note [Grouped experts]: transformers 5 runs the stacked experts as two grouped GEMMs over the rows sorted by
// expert; transformers 4 looped over one nn.Linear per expert and projection.
TEST(BuildModelGraph, MixtralRoutesTopKTokensPerExpert) {
  const int64_t b = 2, s = 64;
  const BuildOptions options{.batch = b, .seq_len = s, .param_dtype = DType::kBF16, .compute_dtype = DType::kBF16,
                             .attention = AttentionImpl::kFlash};
  absl::StatusOr<Graph> g = BuildModelGraph(Preset("mixtral-8x7b"), options);
  ASSERT_TRUE(g.ok()) << g.status();
  const int64_t rows = b * s * 2 / 8;  // Note [MoE routing]
  const Op* up = FindOp(*g, "model.layers.7.mlp.experts.gate_up_grouped_mm");
  ASSERT_NE(up, nullptr);
  EXPECT_EQ(g->tensor(up->outputs[0]).shape, (std::vector<int64_t>{8, rows, 2 * 14336}));
  EXPECT_DOUBLE_EQ(up->flops, 2.0 * 8 * rows * 4096 * 2 * 14336);
  EXPECT_EQ(g->tensor(up->inputs[1]).name, "model.layers.7.mlp.experts.gate_up_proj");
  EXPECT_EQ(g->tensor(up->inputs[1]).shape, (std::vector<int64_t>{8, 2 * 14336, 4096}));
  const Op* down = FindOp(*g, "model.layers.7.mlp.experts.down_grouped_mm");
  ASSERT_NE(down, nullptr);
  EXPECT_EQ(g->tensor(down->outputs[0]).shape, (std::vector<int64_t>{8, rows, 4096}));
  EXPECT_EQ(FindOp(*g, "model.layers.7.mlp.experts.3.w1"), nullptr);
  const Op* router = FindOp(*g, "model.layers.7.mlp.router");
  ASSERT_NE(router, nullptr);
  EXPECT_EQ(g->tensor(router->outputs[0]).dtype, DType::kF32);

  BuildOptions hf4 = options;
  hf4.runtime.transformers = {.major = 4, .minor = 46};
  absl::StatusOr<Graph> looped = BuildModelGraph(Preset("mixtral-8x7b"), hf4);
  ASSERT_TRUE(looped.ok()) << looped.status();
  const Op* w1 = FindOp(*looped, "model.layers.7.block_sparse_moe.experts.3.w1");
  ASSERT_NE(w1, nullptr);
  EXPECT_EQ(looped->tensor(w1->outputs[0]).shape, (std::vector<int64_t>{rows, 14336}));
  EXPECT_DOUBLE_EQ(w1->flops, 2.0 * rows * 4096 * 14336);
  EXPECT_EQ(FindOp(*looped, "model.layers.7.block_sparse_moe.experts.gate_up_grouped_mm"), nullptr);
  // The same experts in both: as many expert parameters, as many FLOPs through them.
  EXPECT_EQ(up->flops + down->flops, 8 * (w1->flops + FindOp(*looped, "model.layers.7.block_sparse_moe.experts.3.w3")->flops +
                                          FindOp(*looped, "model.layers.7.block_sparse_moe.experts.3.w2")->flops));
}

// Note [Expert parallelism in the graph]: under expert parallelism the graph holds a rank's stacked experts,
// each over ep times the rows, and the two all-to-alls of transformers' AllToAllEP around them.
TEST(BuildModelGraph, ExpertParallelGraphHoldsOneRanksExpertsBetweenAllToAlls) {
  ModelConfig c = Preset("mixtral-8x7b");
  c.num_layers = 1;
  const int64_t b = 2, s = 64, rows = b * s * 2;  // tokens x top_k
  absl::StatusOr<Graph> g = BuildModelGraph(c, {.batch = b, .seq_len = s, .param_dtype = DType::kBF16,
                                                .compute_dtype = DType::kBF16, .attention = AttentionImpl::kFlash,
                                                .expert_parallel = 4});
  ASSERT_TRUE(g.ok()) << g.status();
  const Op* up = FindOp(*g, "model.layers.0.mlp.experts.gate_up_grouped_mm");
  ASSERT_NE(up, nullptr);
  EXPECT_EQ(g->tensor(up->inputs[1]).shape, (std::vector<int64_t>{2, 2 * 14336, 4096}));  // 8 experts / 4
  EXPECT_EQ(g->tensor(up->outputs[0]).shape, (std::vector<int64_t>{2, rows / 2, 2 * 14336}));
  for (const char* name : {"model.layers.0.mlp.experts.ep.dispatch", "model.layers.0.mlp.experts.ep.combine"}) {
    const Op* op = FindOp(*g, name);
    ASSERT_NE(op, nullptr) << name;
    EXPECT_EQ(op->kind, "all_to_all");
    EXPECT_EQ(g->tensor(op->outputs[0]).shape, (std::vector<int64_t>{rows, 4096}));
  }
  // The routing weights' product keeps the rows put back in (token, choice) order.
  const Op* weighted = FindOp(*g, "model.layers.0.mlp.experts.ep.weighted");
  ASSERT_NE(weighted, nullptr);
  EXPECT_THAT(weighted->saved, ::testing::Contains(weighted->inputs[0]));
  ASSERT_NE(FindOp(*g, "model.layers.0.mlp.experts.gate_up_masked"), nullptr);  // the sentinel mask's copy
}

// Note [grouped_mm under autocast]: the grouped GEMMs are no autocast ops; transformers casts the rows to the
// stacked weights' dtype, so under autocast over f32 weights they run in f32 and no 16-bit copy of the experts
// exists, while the attention's Linears still get their 16-bit casts.
TEST(BuildModelGraph, GroupedExpertsRunAtTheWeightsDtypeUnderAutocast) {
  ModelConfig c = Preset("mixtral-8x7b");
  c.num_layers = 1;
  absl::StatusOr<Graph> g = BuildModelGraph(c, {.batch = 1, .seq_len = 64, .param_dtype = DType::kF32,
                                                .compute_dtype = DType::kBF16, .attention = AttentionImpl::kFlash});
  ASSERT_TRUE(g.ok()) << g.status();
  for (const char* name : {"model.layers.0.mlp.experts.gate_up_grouped_mm", "model.layers.0.mlp.experts.down_grouped_mm"}) {
    const Op* op = FindOp(*g, name);
    ASSERT_NE(op, nullptr) << name;
    EXPECT_EQ(op->compute_dtype, DType::kF32) << name;
    EXPECT_EQ(g->tensor(op->outputs[0]).dtype, DType::kF32) << name;
    EXPECT_EQ(g->tensor(op->inputs[1]).role, TensorRole::kParameter) << name;  // the weight itself, not a cast
  }
  for (const Op& op : g->ops()) {
    if (op.kind != "cast" || g->tensor(op.inputs[0]).role != TensorRole::kParameter) continue;
    EXPECT_EQ(g->tensor(op.inputs[0]).name.find("experts"), std::string::npos) << op.name;
  }
  const Op* q = FindOp(*g, "model.layers.0.self_attn.q_proj");
  ASSERT_NE(q, nullptr);
  EXPECT_EQ(g->tensor(q->inputs[1]).dtype, DType::kBF16);
}

TEST(BuildModelGraph, OpsCarryFlopsBytesAndDtypes) {
  const int64_t b = 2, s = 32;
  absl::StatusOr<Graph> g = BuildModelGraph(
      Preset("llama-2-7b"), {.batch = b, .seq_len = s, .param_dtype = DType::kF32,
                             .compute_dtype = DType::kBF16, .attention = AttentionImpl::kEager});
  ASSERT_TRUE(g.ok()) << g.status();
  const Op* q = FindOp(*g, "model.layers.0.self_attn.q_proj");
  ASSERT_NE(q, nullptr);
  EXPECT_DOUBLE_EQ(q->flops, 2.0 * b * s * 4096 * 4096);
  EXPECT_EQ(q->compute_dtype, DType::kBF16);
  // Autocast: the f32 weight is cast to bf16 and that copy is what is saved.
  const Tensor& weight = g->tensor(q->inputs[1]);
  EXPECT_EQ(weight.dtype, DType::kBF16);
  EXPECT_EQ(g->op(g->producer(q->inputs[1])).kind, "cast");
  EXPECT_EQ(q->bytes_read, (b * s * 4096 + 4096 * 4096) * 2u);
  EXPECT_EQ(q->bytes_written, b * s * 4096 * 2u);
  // Eager attention saves the f32 softmax output (HF Llama's dtype=float32).
  const Op* softmax = FindOp(*g, "model.layers.0.attn_core.softmax");
  ASSERT_NE(softmax, nullptr);
  EXPECT_TRUE(softmax->attention_core);
  EXPECT_EQ(g->tensor(softmax->saved[0]).dtype, DType::kF32);
  EXPECT_DOUBLE_EQ(FindOp(*g, "model.layers.0.attn_core.qk")->flops, 2.0 * b * 32 * s * s * 128);
  // The loss is an f32 cross-entropy over all s positions of the logits, whose labels ForCausalLMLoss pads and
  // shifts (transformers >= 4.49), in phase kLoss (Note [Causal LM loss]).
  const Op* loss = FindOp(*g, "loss");
  ASSERT_NE(loss, nullptr);
  EXPECT_EQ(loss->phase, Phase::kLoss);
  EXPECT_EQ(loss->kind, "nll_loss");
  EXPECT_EQ(g->tensor(loss->saved[0]).bytes(), b * s * 32000 * 4u);
  EXPECT_EQ(FindOp(*g, "loss.shift_logits"), nullptr);
  const Op* shift_labels = FindOp(*g, "loss.shift_labels");
  ASSERT_NE(shift_labels, nullptr);
  EXPECT_EQ(g->tensor(shift_labels->outputs[0]).shape, (std::vector<int64_t>{b, s}));
  // Before 4.49 it copied the shifted logits (s - 1 positions) instead.
  absl::StatusOr<Graph> old =
      BuildModelGraph(Preset("llama-2-7b"), {.batch = b, .seq_len = s, .param_dtype = DType::kF32,
                                             .compute_dtype = DType::kBF16, .attention = AttentionImpl::kEager,
                                             .runtime = {.transformers = {.major = 4, .minor = 48}}});
  ASSERT_TRUE(old.ok()) << old.status();
  const Op* shift = FindOp(*old, "loss.shift_logits");
  ASSERT_NE(shift, nullptr);
  EXPECT_EQ(old->tensor(shift->outputs[0]).dtype, DType::kF32);
  EXPECT_EQ(old->tensor(shift->outputs[0]).bytes(), b * (s - 1) * 32000 * 4u);
  EXPECT_EQ(old->tensor(FindOp(*old, "loss")->saved[0]).bytes(), b * (s - 1) * 32000 * 4u);
  // ForCausalLMLoss keeps the upcast copy in a local until it returns: a scope_end after the loss reads it.
  const Op* returns = FindOp(*g, "loss.returns");
  ASSERT_NE(returns, nullptr);
  EXPECT_EQ(returns->kind, "scope_end");
  EXPECT_GT(returns->id, loss->id);
  ASSERT_EQ(returns->inputs.size(), 1u);
  EXPECT_EQ(g->op(g->producer(returns->inputs[0])).name, "loss.logits_float");
}

// Note [Eager RMSNorm]: Hugging Face's RMSNorm keeps the normalized tensor (and, before PyTorch 2.0,
// x^2 for the mean's backward); the fused kernel keeps only x and rstd.
TEST(BuildModelGraph, EagerRmsNormSavesTheNormalizedTensor) {
  auto saved_by_layer0 = [](RmsNormImpl impl, TorchRuntime runtime) {
    absl::StatusOr<Graph> g = BuildModelGraph(
        Preset("llama-2-7b"), {.batch = 1, .seq_len = 16, .rms_norm = impl, .runtime = runtime});
    EXPECT_TRUE(g.ok()) << g.status();
    std::set<TensorId> saved;
    for (const Op& op : g->ops()) {
      if (op.name.starts_with("model.layers.0.input_layernorm")) saved.insert(op.saved.begin(), op.saved.end());
    }
    uint64_t bytes = 0;
    for (TensorId t : saved) {
      if (g->tensor(t).role != TensorRole::kParameter) bytes += g->tensor(t).bytes();
    }
    return bytes;
  };
  const uint64_t row = 16 * 4096 * 4;  // one f32 hidden-sized tensor
  const uint64_t rstd = 16 * 4;
  EXPECT_EQ(saved_by_layer0(RmsNormImpl::kFused, {}), row + rstd);
  EXPECT_EQ(saved_by_layer0(RmsNormImpl::kEager, {}), 2 * row + rstd);
  EXPECT_EQ(saved_by_layer0(RmsNormImpl::kEager, {.major = 1, .minor = 13}), 3 * row + rstd);
}

TEST(BuildModelGraph, InferenceHasNoLossDropoutOrSaves) {
  absl::StatusOr<Graph> g =
      BuildModelGraph(Preset("gpt2"), {.batch = 1, .seq_len = 64, .training = false});
  ASSERT_TRUE(g.ok()) << g.status();
  for (const Op& op : g->ops()) {
    EXPECT_NE(op.kind, "dropout");
    EXPECT_NE(op.phase, Phase::kLoss);
  }
}

TEST(BuildModelGraph, CnnsFollowTorchvision) {
  absl::StatusOr<Graph> r = BuildModelGraph(Preset("resnet50"), {.batch = 8});
  ASSERT_TRUE(r.ok()) << r.status();
  // ResNet-50 at 224x224: about 4.1 GMACs per image (torchvision docs: 4.09 GFLOPS as MACs).
  double conv_flops = 0;
  for (const Op& op : r->ops()) {
    if (op.kind == "conv2d" || op.kind == "linear") conv_flops += op.flops;
  }
  EXPECT_NEAR(conv_flops / 8 / 2, 4.09e9, 0.05e9);
  const Op* relu = FindOp(*r, "layer1.0.relu3");
  ASSERT_NE(relu, nullptr);
  EXPECT_TRUE(relu->inplace);
  EXPECT_EQ(FindTensor(*r, "layer4.2.conv3.weight")->shape, (std::vector<int64_t>{2048, 512, 1, 1}));
  absl::StatusOr<Graph> v = BuildModelGraph(Preset("vgg16"), {.batch = 2});
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_NE(FindTensor(*v, "features.28.weight"), nullptr);
  EXPECT_EQ(FindTensor(*v, "classifier.0.weight")->shape, (std::vector<int64_t>{4096, 25088}));
  EXPECT_THAT(BuildModelGraph(Preset("vgg16"), {.batch = 2, .lora = {.rank = 4}}).status().message(),
              HasSubstr("LoRA is supported for transformers only"));
}

}  // namespace
}  // namespace headroom

// Model states against the closed forms frameworks publish: Megatron's 18
// bytes per parameter for mixed-precision AdamW, DeepSpeed's ZeRO-2 and
// ZeRO-3 estimators (estimators/model_states.h, Note [DeepSpeed gradient
// buffers]), FSDP, DDP, offload, pipeline and expert parallelism, LoRA.
#include "estimators/model_states.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace headroom {
namespace {

using ::testing::HasSubstr;

// A two-block toy transformer: embedding (8192 x 512), per block a
// [2048, 512] and a [512, 2048] matrix plus a 512 bias, and an LM head.
// P = 4194304 + 2 * (1048576 + 1048576 + 512) + 4194304 = 12583936, a
// multiple of 8 so the DeepSpeed formulas divide exactly.
Graph ToyModel(DType dtype = DType::kBF16, bool frozen_blocks = false) {
  Graph g("toy");
  auto param = [&](std::string name, std::vector<int64_t> shape, int layer, bool trainable = true) {
    return g.AddTensor({.name = std::move(name), .shape = std::move(shape), .dtype = dtype,
                        .role = TensorRole::kParameter, .layer = layer, .trainable = trainable});
  };
  const TensorId ids = g.AddTensor({.name = "ids", .shape = {1, 16}, .dtype = DType::kI64,
                                    .role = TensorRole::kInput});
  const TensorId emb = param("model.embed_tokens.weight", {8192, 512}, -1);
  TensorId x = g.AddTensor({.name = "h", .shape = {16, 512}, .dtype = dtype});
  g.AddOp({.kind = "embedding", .name = "embed", .inputs = {ids, emb}, .outputs = {x}});
  for (int layer = 0; layer < 2; ++layer) {
    const std::string p = "model.layers." + std::to_string(layer) + ".mlp.";
    const TensorId up = param(p + "up_proj.weight", {2048, 512}, layer, !frozen_blocks);
    const TensorId down = param(p + "down_proj.weight", {512, 2048}, layer, !frozen_blocks);
    const TensorId bias = param(p + "down_proj.bias", {512}, layer, !frozen_blocks);
    const TensorId u = g.AddTensor({.name = p + "u", .shape = {16, 2048}, .dtype = dtype, .layer = layer});
    g.AddOp({.kind = "linear", .name = p + "up_proj", .inputs = {x, up}, .outputs = {u}, .layer = layer});
    const TensorId y = g.AddTensor({.name = p + "y", .shape = {16, 512}, .dtype = dtype, .layer = layer});
    g.AddOp({.kind = "linear", .name = p + "down_proj", .inputs = {u, down, bias}, .outputs = {y},
             .layer = layer});
    x = y;
  }
  const TensorId head = param("lm_head.weight", {8192, 512}, -1);
  const TensorId logits = g.AddTensor({.name = "logits", .shape = {16, 8192}, .dtype = dtype});
  g.AddOp({.kind = "linear", .name = "lm_head", .inputs = {x, head}, .outputs = {logits}});
  return g;
}

constexpr uint64_t kP = 12583936;
constexpr uint64_t kLargest = 8192 * 512;  // embed_tokens / lm_head

ModelStates Estimate(const Graph& g, Precision precision, ParallelLayout layout = {},
                     Optimizer optimizer = Optimizer::kAdamW) {
  absl::StatusOr<ModelStates> s = EstimateModelStates(
      g, {.precision = SetupFor(precision), .optimizer = optimizer, .layout = layout});
  EXPECT_TRUE(s.ok()) << s.status();
  return s.ok() ? *s : ModelStates{};
}

TEST(ModelStates, ToyModelParameterCount) {
  EXPECT_EQ(ToyModel().ParameterCount(), kP);
}

// Megatron-LM / Korthikanti et al. 2022: 18 bytes per parameter with mixed
// precision AdamW (2 weights + 4 fp32 gradient + 4 master + 8 moments).
TEST(ModelStates, MegatronEighteenBytesPerParameter) {
  for (Precision p : {Precision::kBf16Mixed, Precision::kFp16Mixed}) {
    const ModelStates s = Estimate(ToyModel(), p);
    EXPECT_EQ(s.weights, 2 * kP);
    EXPECT_EQ(s.master_weights, 4 * kP);
    EXPECT_EQ(s.gradients, 4 * kP);
    EXPECT_EQ(s.optimizer_state, 8 * kP);
    EXPECT_EQ(s.gpu_bytes(), 18 * kP);
  }
}

// An EMA copy of the trainable weights (Note [EMA weights]): fp32 under
// mixed precision, the weight dtype in pure bf16, none for frozen
// parameters, sharded like the optimizer state under ZeRO, and in host
// memory with EmaPlacement::kCpu.
TEST(ModelStates, EmaCopyOfTheTrainableWeights) {
  auto with_ema = [](const Graph& g, Precision precision, EmaPlacement ema, ParallelLayout layout = {}) {
    absl::StatusOr<ModelStates> s =
        EstimateModelStates(g, {.precision = SetupFor(precision), .layout = layout, .ema = ema});
    EXPECT_TRUE(s.ok()) << s.status();
    return s.ok() ? *s : ModelStates{};
  };
  const Graph toy = ToyModel();
  const ModelStates none = Estimate(toy, Precision::kBf16Mixed);
  const ModelStates gpu = with_ema(toy, Precision::kBf16Mixed, EmaPlacement::kGpu);
  EXPECT_EQ(gpu.ema_weights, 4 * kP);
  EXPECT_EQ(gpu.gpu_bytes(), none.gpu_bytes() + 4 * kP);
  EXPECT_EQ(with_ema(toy, Precision::kBf16, EmaPlacement::kGpu).ema_weights, 2 * kP);
  const ModelStates cpu = with_ema(toy, Precision::kBf16Mixed, EmaPlacement::kCpu);
  EXPECT_EQ(cpu.ema_weights, 0u);
  EXPECT_EQ(cpu.gpu_bytes(), none.gpu_bytes());
  EXPECT_EQ(cpu.host_bytes, none.host_bytes + 4 * kP);
  EXPECT_EQ(with_ema(toy, Precision::kBf16Mixed, EmaPlacement::kGpu, {.gpus = 4, .sharding = Sharding::kZero2})
                .ema_weights,
            4 * kP / 4);
  // Frozen blocks: only the embedding and the head (2 x 8192 x 512) train.
  EXPECT_EQ(with_ema(ToyModel(DType::kBF16, /*frozen_blocks=*/true), Precision::kBf16Mixed, EmaPlacement::kGpu)
                .ema_weights,
            4 * 2 * kLargest);
}

TEST(ModelStates, Fp32AndPureBf16) {
  EXPECT_EQ(Estimate(ToyModel(DType::kF32), Precision::kFp32).gpu_bytes(), 16 * kP);
  EXPECT_EQ(Estimate(ToyModel(), Precision::kBf16).gpu_bytes(), 8 * kP);  // 2 + 2 + 2*2
  EXPECT_EQ(Estimate(ToyModel(), Precision::kBf16, {}, Optimizer::kSgd).gpu_bytes(), 4 * kP);
}

// DeepSpeed stage_1_and_2.py estimate_zero2_model_states_mem_needs
// (cpu_offload=False): GPU 2P + 18P/N.
TEST(ModelStates, DeepSpeedZero2) {
  for (int n : {1, 2, 4, 8}) {
    const ModelStates s = Estimate(ToyModel(), Precision::kBf16Mixed,
                                   {.gpus = n, .sharding = Sharding::kZero2});
    EXPECT_EQ(s.gpu_bytes(), 2 * kP + 18 * kP / n) << n << " GPUs";
  }
}

// ZeRO-1 leaves the 16-bit gradients whole: 4P + 16P/N.
TEST(ModelStates, DeepSpeedZero1) {
  const ModelStates s = Estimate(ToyModel(), Precision::kBf16Mixed, {.gpus = 4, .sharding = Sharding::kZero1});
  EXPECT_EQ(s.gpu_bytes(), 4 * kP + 16 * kP / 4);
}

// DeepSpeed stage3.py estimate_zero3_model_states_mem_needs
// (cpu_offload=False): GPU 4 * largest_layer + 18P/N, where largest_layer is
// the largest module's own parameters.
TEST(ModelStates, DeepSpeedZero3) {
  std::string name;
  EXPECT_EQ(LargestModuleParameters(ToyModel(), &name), kLargest);
  EXPECT_EQ(name, "lm_head");
  for (int n : {1, 2, 8}) {
    const ModelStates s = Estimate(ToyModel(), Precision::kBf16Mixed,
                                   {.gpus = n, .sharding = Sharding::kZero3});
    EXPECT_EQ(s.gathered_parameters, 4 * kLargest);
    EXPECT_EQ(s.gpu_bytes(), 4 * kLargest + 18 * kP / n) << n << " GPUs";
  }
}

// The same functions with cpu_offload: ZeRO-2 GPU 2P; ZeRO-3 with the
// optimizer offloaded 4 * largest + 2P/N; with parameters too 4 * largest.
TEST(ModelStates, DeepSpeedOffload) {
  const ModelStates z2 = Estimate(ToyModel(), Precision::kBf16Mixed,
                                  {.gpus = 4, .sharding = Sharding::kZero2, .offload_optimizer = true});
  EXPECT_EQ(z2.gpu_bytes(), 2 * kP);
  EXPECT_EQ(z2.host_bytes, 18 * kP / 4);
  const ModelStates z3 = Estimate(ToyModel(), Precision::kBf16Mixed,
                                  {.gpus = 4, .sharding = Sharding::kZero3, .offload_optimizer = true});
  EXPECT_EQ(z3.gpu_bytes(), 4 * kLargest + 2 * kP / 4);
  const ModelStates z3p = Estimate(ToyModel(), Precision::kBf16Mixed,
                                   {.gpus = 4, .sharding = Sharding::kZero3, .offload_optimizer = true,
                                    .offload_params = true});
  EXPECT_EQ(z3p.gpu_bytes(), 4 * kLargest);
  EXPECT_EQ(z3p.host_bytes, 18 * kP / 4);
}

// FSDP FULL_SHARD with MixedPrecision: fp32 flat parameters, fp32 gradients
// and moments sharded (16P/N), plus two gathered units of bf16 parameters
// and one of gradients (Note [FSDP gathered units]). The largest unit here is
// the root (embedding + head).
TEST(ModelStates, FsdpFullAndHybrid) {
  const ModelStates full = Estimate(ToyModel(), Precision::kBf16Mixed,
                                    {.gpus = 8, .sharding = Sharding::kFsdpFull});
  EXPECT_EQ(full.gathered_parameters, 2 * kLargest * 2 * 3);
  EXPECT_EQ(full.gpu_bytes(), 16 * kP / 8 + 2 * kLargest * 2 * 3);
  const ModelStates hybrid = Estimate(ToyModel(), Precision::kBf16Mixed,
                                      {.gpus = 16, .sharding = Sharding::kFsdpHybrid, .hybrid_shard_group = 8});
  EXPECT_EQ(hybrid.gpu_bytes(), full.gpu_bytes());
}

// Note [ZeroRedundancyOptimizer]: torch.distributed's ZeRO-1 divides the moments only; the gradients and
// DDP's buckets stay whole. fp32: 4P weights + 4P gradients + 4P buckets + 8P/N moments.
TEST(ModelStates, ZeroRedundancyOptimizerShardsTheMomentsOnly) {
  const ModelStates s = Estimate(ToyModel(), Precision::kFp32,
                                 {.gpus = 4, .torch_parallel = true, .sharding = Sharding::kZero1});
  EXPECT_EQ(s.gradients, 4 * kP);
  EXPECT_EQ(s.communication_buffers, 4 * kP);
  EXPECT_EQ(s.optimizer_state, 8 * kP / 4);
  EXPECT_EQ(s.gpu_bytes(), 12 * kP + 8 * kP / 4);
  const ParallelLayout zero3{.gpus = 4, .torch_parallel = true, .sharding = Sharding::kZero3};
  EXPECT_THAT(std::string(zero3.Validate().message()), HasSubstr("FSDP (--fsdp), not ZeRO stages 0, 2 or 3"));
}

TEST(ModelStates, DdpKeepsGradientBuckets) {
  const ModelStates s = Estimate(ToyModel(), Precision::kBf16Mixed, {.gpus = 4});
  EXPECT_EQ(s.communication_buffers, 4 * kP);
  EXPECT_EQ(s.gpu_bytes(), 22 * kP);
}

TEST(ModelStates, PipelineStagesSplitBlocks) {
  const uint64_t block = 2048 * 512 * 2 + 512;
  const uint64_t table = 8192 * 512;
  for (int stage : {0, 1}) {
    absl::StatusOr<ModelStates> s = EstimateModelStates(
        ToyModel(), {.precision = SetupFor(Precision::kBf16Mixed),
                     .layout = {.gpus = 2, .pipeline_parallel = 2}, .pipeline_stage = stage});
    ASSERT_TRUE(s.ok()) << s.status();
    EXPECT_EQ(s->parameters, table + block) << "stage " << stage;  // embedding first, head last
    EXPECT_EQ(s->gpu_bytes(), 18 * (table + block));
  }
}

TEST(ModelStates, ExpertParallelSplitsExperts) {
  Graph g("moe");
  for (int e = 0; e < 8; ++e) {
    g.AddTensor({.name = "model.layers.0.block_sparse_moe.experts." + std::to_string(e) + ".w1.weight",
                 .shape = {1024, 256}, .dtype = DType::kBF16, .role = TensorRole::kParameter, .layer = 0});
  }
  g.AddTensor({.name = "model.layers.0.self_attn.q_proj.weight", .shape = {256, 256},
               .dtype = DType::kBF16, .role = TensorRole::kParameter, .layer = 0});
  const ModelStates s = Estimate(g, Precision::kBf16Mixed, {.gpus = 4, .expert_parallel = 4,
                                                             .sharding = Sharding::kZero1});
  // Experts: 2 of 8 per rank, their optimizer states split over dp/ep = 1 rank.
  const uint64_t experts = 2 * 1024 * 256;
  const uint64_t dense = 256 * 256;
  EXPECT_EQ(s.parameters, experts + dense);
  EXPECT_EQ(s.gpu_bytes(), 4 * experts + 16 * experts + 4 * dense + 16 * dense / 4);
}

// Note [Expert gradients outside DDP's buckets]: DDP buckets the experts' gradients only where other ranks hold
// the same experts (measured on mixtral-ep-2, where each expert lives on one rank).
TEST(ModelStates, DdpBucketsExpertGradientsOnlyWhereTheirGroupReducesThem) {
  Graph g("moe");
  for (int e = 0; e < 8; ++e) {
    g.AddTensor({.name = "model.layers.0.block_sparse_moe.experts." + std::to_string(e) + ".w1.weight",
                 .shape = {1024, 256}, .dtype = DType::kF32, .role = TensorRole::kParameter, .layer = 0});
  }
  g.AddTensor({.name = "model.layers.0.self_attn.q_proj.weight", .shape = {256, 256}, .dtype = DType::kF32,
               .role = TensorRole::kParameter, .layer = 0});
  const uint64_t experts = 8 * 1024 * 256, dense = 256 * 256;
  const ModelStates one_rank_per_expert = Estimate(g, Precision::kFp32, {.gpus = 4, .expert_parallel = 4});
  EXPECT_EQ(one_rank_per_expert.gradients, 4 * (experts / 4 + dense));
  EXPECT_EQ(one_rank_per_expert.communication_buffers, 4 * dense);
  const ModelStates two_ranks_per_expert = Estimate(g, Precision::kFp32, {.gpus = 4, .expert_parallel = 2});
  EXPECT_EQ(two_ranks_per_expert.communication_buffers, 4 * (experts / 2 + dense));
}

// Stacked experts are built at a rank's share (Note [Expert parallelism in the graph]); transformers 4's
// per-expert modules are all built and divided here.
TEST(ModelStates, ParameterShareDividesPerExpertModulesOnly) {
  const ParallelLayout layout{.gpus = 4, .expert_parallel = 4};
  EXPECT_EQ(ParameterShare({.name = "model.layers.0.block_sparse_moe.experts.3.w1.weight"}, layout), 0.25);
  EXPECT_EQ(ParameterShare({.name = "model.layers.0.mlp.experts.gate_up_proj"}, layout), 1.0);
  EXPECT_EQ(ParameterShare({.name = "model.layers.0.self_attn.q_proj.weight"}, layout), 1.0);
  EXPECT_EQ(ParameterShare({.name = "model.layers.0.mlp.experts."}, layout), 1.0);
}

TEST(ModelStates, LoraFrozenBaseCarriesWeightsOnly) {
  const ModelStates s = Estimate(ToyModel(DType::kBF16, /*frozen_blocks=*/true), Precision::kBf16Mixed);
  const uint64_t frozen = 2 * (2048 * 512 * 2 + 512);
  EXPECT_EQ(s.trainable_parameters, kP - frozen);
  EXPECT_EQ(s.gpu_bytes(), 2 * frozen + 18 * (kP - frozen));
}

TEST(ModelStates, Nf4WeightsKeepTheirBytes) {
  Graph g("qlora");
  g.AddTensor({.name = "w", .shape = {4096, 4096}, .dtype = DType::kNF4, .role = TensorRole::kParameter,
               .trainable = false});
  g.AddTensor({.name = "w.absmax", .shape = {4096 * 4096 / 64}, .dtype = DType::kU8,
               .role = TensorRole::kBuffer});
  const ModelStates s = Estimate(g, Precision::kBf16Mixed);
  EXPECT_EQ(s.weights, 4096u * 4096 / 2);
  EXPECT_EQ(s.buffers, 4096u * 4096 / 64);
  EXPECT_EQ(s.gpu_bytes(), 4096u * 4096 / 2 + 4096u * 4096 / 64);
}

TEST(ModelStates, InferenceKeepsWeightsOnly) {
  absl::StatusOr<ModelStates> s = EstimateModelStates(
      ToyModel(), {.precision = SetupFor(Precision::kBf16Mixed), .training = false});
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->gpu_bytes(), 2 * kP);
}

TEST(ModelStates, Fp8CachesGemmWeights) {
  const ModelStates s = Estimate(ToyModel(), Precision::kFp8);
  // Every matrix feeding a linear (not the embedding table): 1 byte each.
  EXPECT_EQ(s.fp8_weight_cache, 2 * 2048 * 512 * 2 + 8192 * 512);
}

TEST(ModelStates, LayoutErrorsNameTheField) {
  auto error = [](ParallelLayout layout) {
    absl::StatusOr<ModelStates> s =
        EstimateModelStates(ToyModel(), {.precision = SetupFor(Precision::kFp32), .layout = layout});
    return s.ok() ? std::string() : std::string(s.status().message());
  };
  // The library names the field; the command line maps it to its flag (cli/job_flags.h).
  EXPECT_THAT(error({.gpus = 6, .tensor_parallel = 4}), HasSubstr("gpus"));
  EXPECT_THAT(error({.gpus = 0}), HasSubstr("gpus: must be at least 1"));
  EXPECT_THAT(error({.gpus = 4, .expert_parallel = 3}), HasSubstr("expert_parallel"));
  EXPECT_THAT(error({.offload_optimizer = true}), HasSubstr("offload"));
  EXPECT_THAT(error({.gpus = 2, .sharding = Sharding::kZero2, .offload_params = true}),
              HasSubstr("stage 3"));
  EXPECT_THAT(error({.sequence_parallel = true}), HasSubstr("sequence_parallel"));
}

}  // namespace
}  // namespace headroom

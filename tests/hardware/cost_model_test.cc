// Roofline figures worked out by hand from data/gpus.json.
#include "hardware/cost_model.h"
#include "planner/checkpoint_mode_plan.h"

#include "common/units.h"
#include "gmock/gmock.h"
#include "graph/training_step.h"
#include "gtest/gtest.h"

namespace headroom {
namespace {

const GpuSpec& Gpu(const char* name) { return **GpuCatalog::Builtin().Find(name); }

// Moved from graph_test with MathModeFor (the IR knows no hardware).
TEST(MathMode, Tf32WhenAllowed) { EXPECT_EQ(MathModeFor(DType::kF32, /*allow_tf32=*/true), MathMode::kTf32); }

TEST(CostModel, GemmIsComputeBoundOnTensorCores) {
  // 4096^3 bf16 GEMM: 2*4096^3 FLOPs, reads two and writes one 32 MiB matrix.
  const double n = 4096;
  const Op gemm{.kind = "linear", .flops = 2 * n * n * n,
                .bytes_read = 2 * 4096u * 4096 * 2, .bytes_written = 4096u * 4096 * 2,
                .compute_dtype = DType::kBF16};
  const CostModelOptions options;  // 70% of peak, 80% of bandwidth, 5 us launch
  const OpCost c = EstimateOpTime(gemm, Gpu("H100-80GB"), options);
  const double compute = 2 * n * n * n / (989.4e12 * 0.7);
  const double memory = 3 * 4096.0 * 4096 * 2 / (3.35e12 * 0.8);
  EXPECT_TRUE(c.compute_bound);
  EXPECT_DOUBLE_EQ(c.compute_seconds, compute);
  EXPECT_DOUBLE_EQ(c.memory_seconds, memory);
  EXPECT_DOUBLE_EQ(c.seconds, compute + 5e-6);
  // Its backward runs on Tensor Cores too; an optimizer step does not.
  EXPECT_TRUE(RunsOnTensorCores({.kind = "linear_backward"}));
  EXPECT_FALSE(RunsOnTensorCores({.kind = "optimizer_step", .phase = Phase::kOptimizer}));
  // A V100 has no bf16 unit: the fp32 rate.
  const OpCost v = EstimateOpTime(gemm, Gpu("V100"), options);
  EXPECT_DOUBLE_EQ(v.compute_seconds, 2 * n * n * n / (15.7e12 * 0.7));
  // f16 on the V100 has Tensor Cores.
  Op f16 = gemm;
  f16.compute_dtype = DType::kF16;
  EXPECT_DOUBLE_EQ(EstimateOpTime(f16, Gpu("V100"), options).compute_seconds,
                   2 * n * n * n / (125e12 * 0.7));
}

TEST(CostModel, ElementwiseIsMemoryBoundOnCudaCores) {
  const uint64_t elements = 64u << 20;
  const Op gelu{.kind = "gelu", .flops = 8.0 * static_cast<double>(elements),
                .bytes_read = elements * 2, .bytes_written = elements * 2,
                .compute_dtype = DType::kBF16};
  const OpCost c = EstimateOpTime(gelu, Gpu("H100-80GB"), {.launch_latency_s = 0,
                                                            .compute_efficiency = 1,
                                                            .bandwidth_efficiency = 1});
  EXPECT_FALSE(c.compute_bound);
  EXPECT_DOUBLE_EQ(c.compute_seconds, 8.0 * static_cast<double>(elements) / 67e12);  // fp32 CUDA cores
  EXPECT_DOUBLE_EQ(c.seconds, 4.0 * static_cast<double>(elements) / 3.35e12);
  // A tiny op costs its launch latency.
  EXPECT_DOUBLE_EQ(EstimateOpTime({.kind = "add", .flops = 1}, Gpu("H100-80GB"),
                                  {.launch_latency_s = 7e-6, .compute_efficiency = 1})
                       .seconds,
                   7e-6 + 1 / 67e12);
}

TEST(CostModel, OffloadUsesTheHostLinkEachWay) {
  // H100 SXM: PCIe gen5 x16, 63 GB/s one way; 80% efficiency.
  const double seconds = OffloadSeconds(12 * kGiB, 4 * kGiB, Gpu("H100-80GB"));
  EXPECT_DOUBLE_EQ(seconds, 16.0 * static_cast<double>(kGiB) / (63e9 * 0.8));
  // GH200's NVLink-C2C is seven times faster.
  EXPECT_LT(OffloadSeconds(12 * kGiB, 4 * kGiB, Gpu("GH200")), seconds / 7);
}

TEST(CostModel, StepTimeAndRecomputePrice) {
  // Two layers of linear + gelu, then a sum loss; full checkpointing replays
  // each layer's linear.
  Graph g("two");
  TensorId x = g.AddTensor({.name = "x", .shape = {1024, 1024}, .dtype = DType::kBF16,
                            .role = TensorRole::kInput});
  for (int l = 0; l < 2; ++l) {
    TensorId w = g.AddTensor({.name = "w" + std::to_string(l), .shape = {1024, 1024},
                              .dtype = DType::kBF16, .role = TensorRole::kParameter, .layer = l});
    TensorId h = g.AddTensor({.name = "h" + std::to_string(l), .shape = {1024, 1024},
                              .dtype = DType::kBF16, .layer = l});
    TensorId a = g.AddTensor({.name = "a" + std::to_string(l), .shape = {1024, 1024},
                              .dtype = DType::kBF16, .layer = l});
    g.AddOp({.kind = "linear", .name = "fc" + std::to_string(l), .inputs = {x, w}, .outputs = {h},
             .saved = {x}, .flops = 2.0 * 1024 * 1024 * 1024, .bytes_read = 4u << 20,
             .bytes_written = 2u << 20, .compute_dtype = DType::kBF16, .layer = l});
    g.AddOp({.kind = "gelu", .name = "gelu" + std::to_string(l), .inputs = {h}, .outputs = {a},
             .saved = {h}, .flops = 8.0 * 1024 * 1024, .bytes_read = 2u << 20,
             .bytes_written = 2u << 20, .compute_dtype = DType::kBF16, .layer = l});
    x = a;
  }
  TensorId loss = g.AddTensor({.name = "loss", .shape = {}});
  g.AddOp({.kind = "sum", .name = "loss", .inputs = {x}, .outputs = {loss}, .phase = Phase::kLoss});
  const GpuSpec& h100 = Gpu("H100-80GB");
  absl::StatusOr<Graph> plain = BuildTrainingStep(g, {});
  absl::StatusOr<Graph> full = BuildTrainingStep(g, {.checkpoint = *PlanForMode(g, CheckpointMode::kFull)});
  ASSERT_TRUE(plain.ok() && full.ok());
  const Op& fc = g.op(0);
  // Layer 1's fc and layer 0's fc are replayed (gelu's output is not saved).
  EXPECT_DOUBLE_EQ(RecomputeSeconds(*full, h100), 2 * EstimateOpTime(fc, h100).seconds);
  EXPECT_EQ(RecomputeSeconds(*plain, h100), 0);
  const StepTime t = EstimateStepTimeBreakdown(*full, h100);
  EXPECT_DOUBLE_EQ(t.recompute_seconds, RecomputeSeconds(*full, h100));
  EXPECT_NEAR(t.seconds - EstimateStepTime(*plain, h100), t.recompute_seconds, 1e-15);
  EXPECT_GT(t.seconds_by_phase.at(Phase::kBackward), t.seconds_by_phase.at(Phase::kForward));
}

}  // namespace
}  // namespace headroom

#include "estimators/optimizer_state.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace headroom {
namespace {

TEST(OptimizerState, BytesPerParameter) {
  EXPECT_EQ(OptimizerStateBytesPerParam(*ParseOptimizer("AdamW")), 8u);
  EXPECT_EQ(OptimizerStateBytesPerParam(*ParseOptimizer("adam8bit")), 2u);
  EXPECT_EQ(OptimizerStateBytesPerParam(*ParseOptimizer("sgd-momentum")), 4u);
  EXPECT_EQ(OptimizerStateBytesPerParam(*ParseOptimizer("sgd")), 0u);
  EXPECT_EQ(OptimizerStateBytesPerParam(*ParseOptimizer("lion")), 4u);
}

TEST(OptimizerState, AdafactorFactorsMatrices) {
  EXPECT_EQ(AdafactorStateBytes(4096, 11008), 4u * (4096 + 11008));
  EXPECT_EQ(AdafactorStateBytes(1, 4096), 4u * 4096);
}

TEST(OptimizerState, UnknownNameListsChoices) {
  absl::StatusOr<Optimizer> bad = ParseOptimizer("adagrad");
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(bad.status().message(), ::testing::HasSubstr("unknown optimizer 'adagrad'"));
  for (Optimizer o : {Optimizer::kAdamW, Optimizer::kAdam8bit, Optimizer::kSgdMomentum,
                      Optimizer::kSgd, Optimizer::kAdafactor, Optimizer::kLion}) {
    EXPECT_EQ(*ParseOptimizer(OptimizerName(o)), o);
  }
}

}  // namespace
}  // namespace headroom

namespace headroom {
namespace {

TEST(OptimizerState, TensorStateBytes) {
  const std::vector<int64_t> matrix = {4096, 1024};
  const uint64_t n = 4096 * 1024;
  EXPECT_EQ(OptimizerStateBytes(Optimizer::kAdamW, matrix, DType::kF32), 8 * n);
  EXPECT_EQ(OptimizerStateBytes(Optimizer::kAdamW, matrix, DType::kBF16), 4 * n);
  // bitsandbytes: two uint8 states + an fp32 absmax per 256 values and state.
  EXPECT_EQ(OptimizerStateBytes(Optimizer::kAdam8bit, matrix, DType::kF32), 2 * n + 2 * 4 * (n / 256));
  // Under min_8bit_size (4096 elements) the states stay fp32.
  const std::vector<int64_t> bias = {1024};
  EXPECT_EQ(OptimizerStateBytes(Optimizer::kAdam8bit, bias, DType::kF32), 8u * 1024);
  EXPECT_EQ(OptimizerStateBytes(Optimizer::kAdafactor, matrix, DType::kF32), 4u * (4096 + 1024));
  EXPECT_EQ(OptimizerStateBytes(Optimizer::kAdafactor, bias, DType::kF32), 4u * 1024);
  EXPECT_EQ(OptimizerStateBytes(Optimizer::kLion, matrix, DType::kF32), 4 * n);
  EXPECT_EQ(OptimizerStateBytes(Optimizer::kSgdMomentum, matrix, DType::kF32), 4 * n);
  EXPECT_EQ(OptimizerStateBytes(Optimizer::kSgd, matrix, DType::kF32), 0u);
  // Rank-3 (conv-like) tensors factor over the last two dimensions.
  const std::vector<int64_t> conv = {8, 16, 32};
  EXPECT_EQ(OptimizerStateBytes(Optimizer::kAdafactor, conv, DType::kF32), 4u * (8 * 16 + 8 * 32));
}

}  // namespace
}  // namespace headroom

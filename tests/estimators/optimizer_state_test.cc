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

#include "planner/checkpoint_sets.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace headroom {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

TEST(CheckpointSets, EveryKLayers) {
  EXPECT_THAT(*EveryKLayers(8, 3), ElementsAre(0, 3, 6));
  EXPECT_THAT(*EveryKLayers(8, 1), ElementsAre(0, 1, 2, 3, 4, 5, 6, 7));
  EXPECT_THAT(*EveryKLayers(0, 4), IsEmpty());
  EXPECT_FALSE(EveryKLayers(8, 0).ok());
  EXPECT_FALSE(EveryKLayers(-1, 2).ok());
}

TEST(CheckpointSets, SqrtSpacing) {
  EXPECT_THAT(SqrtCheckpoints(16), ElementsAre(0, 4, 8, 12));
  EXPECT_THAT(SqrtCheckpoints(10), ElementsAre(0, 4, 8));
  EXPECT_THAT(SqrtCheckpoints(1), ElementsAre(0));
  EXPECT_EQ(SqrtCheckpoints(80).size(), 9u);
  EXPECT_THAT(SqrtCheckpoints(0), IsEmpty());
}

}  // namespace
}  // namespace headroom

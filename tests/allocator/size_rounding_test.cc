#include "allocator/size_rounding.h"

#include "gtest/gtest.h"

namespace headroom {
namespace {

constexpr uint64_t kMiB = 1 << 20;

TEST(SizeRounding, MinimumAndMultiplesOf512) {
  EXPECT_EQ(RoundSize(0, {}), 512u);
  EXPECT_EQ(RoundSize(1, {}), 512u);
  EXPECT_EQ(RoundSize(512, {}), 512u);
  EXPECT_EQ(RoundSize(513, {}), 1024u);
  EXPECT_EQ(RoundSize(1200 * kMiB + 1, {}), 1200 * kMiB + 512);
}

TEST(SizeRounding, PowerOfTwoDivisions) {
  // [1 GiB, 2 GiB) cut into 4 steps of 256 MiB: 1200 MiB -> 1280 MiB.
  EXPECT_EQ(RoundSize(1200 * kMiB, {.power2_divisions = 4}), 1280 * kMiB);
  EXPECT_EQ(RoundSize(1024 * kMiB, {.power2_divisions = 4}), 1024 * kMiB);
  EXPECT_EQ(RoundSize(1025 * kMiB, {.power2_divisions = 8}), 1152 * kMiB);
  // Steps below 512 bytes fall back to plain rounding.
  EXPECT_EQ(RoundSize(1500, {.power2_divisions = 4}), 1536u);
  EXPECT_EQ(RoundSize(1200 * kMiB, {.power2_divisions = 1}), 1200 * kMiB);
}

}  // namespace
}  // namespace headroom

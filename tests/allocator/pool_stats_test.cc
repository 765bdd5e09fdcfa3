#include "allocator/pool_stats.h"

#include "gtest/gtest.h"

namespace headroom::internal {
namespace {

TEST(PooledStat, AllPoolsAreSumsExceptThePeak) {
  PooledStat stat;
  stat.Increase(kSmallPoolStat, 10);  // all: 10
  stat.Decrease(kSmallPoolStat, 10);  // all: 0
  stat.Increase(kLargePoolStat, 7);   // all: 7
  const StatArray a = stat.ToArray();
  EXPECT_EQ(a[kSmallPoolStat].peak, 10);
  EXPECT_EQ(a[kLargePoolStat].peak, 7);
  EXPECT_EQ(a[kAllPools].peak, 10);  // not 17: the pools peaked at different times
  EXPECT_EQ(a[kAllPools].current, 7);
  EXPECT_EQ(a[kAllPools].allocated, 17);
  EXPECT_EQ(a[kAllPools].freed, 10);
  EXPECT_EQ(stat.current(), 7);
}

TEST(PooledStat, ResetsKeepCurrent) {
  PooledStat stat;
  stat.Increase(kSmallPoolStat, 5);
  stat.Increase(kLargePoolStat, 5);
  stat.Decrease(kLargePoolStat, 4);
  stat.ResetPeak();
  EXPECT_EQ(stat.peak(), 6);
  EXPECT_EQ(stat.ToArray()[kLargePoolStat].peak, 1);
  stat.ResetAccumulated();
  const StatArray a = stat.ToArray();
  EXPECT_EQ(a[kAllPools].current, 6);
  EXPECT_EQ(a[kAllPools].allocated, 0);
  EXPECT_EQ(a[kAllPools].freed, 0);
}

TEST(PoolStats, ToMemoryStatsCarriesEveryCounter) {
  PoolStats stats;
  stats.reserved_bytes.Increase(kLargePoolStat, 20 << 20);
  stats.num_ooms = 2;
  stats.num_device_alloc = 3;
  stats.oversize_segments.Increase(1);
  stats.ResetPeaks();
  const MemoryStats m = stats.ToMemoryStats();
  EXPECT_EQ(m.reserved_bytes[kAllPools].current, 20 << 20);
  EXPECT_EQ(m.reserved_bytes[kLargePoolStat].current, 20 << 20);
  EXPECT_EQ(m.reserved_bytes_at_peak_allocated, 20 << 20);
  EXPECT_EQ(m.num_ooms, 2);
  EXPECT_EQ(m.num_device_alloc, 3);
  EXPECT_EQ(m.oversize_segments.current, 1);
}

}  // namespace
}  // namespace headroom::internal

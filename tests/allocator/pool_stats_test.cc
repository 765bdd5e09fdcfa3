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

// Note [Peak budgets]: a shard gets its share of each counter's room below
// the peak, and what it adds comes back as currents and totals.
TEST(ShardStats, BudgetsShareTheRoomBelowEachPeak) {
  PoolStats stats;
  stats.allocated_bytes.Increase(kLargePoolStat, 100);
  stats.allocated_bytes.Decrease(kLargePoolStat, 40);  // current 60, peak 100: room 40
  stats.active.Increase(kSmallPoolStat, 3);            // at its peak: no room
  const auto budget = stats.Budget(2);
  constexpr auto kBytes = static_cast<size_t>(BlockStat::kAllocatedBytes);
  constexpr auto kActive = static_cast<size_t>(BlockStat::kActive);
  EXPECT_EQ(budget[1][kBytes], 20);  // large pool
  EXPECT_EQ(budget[2][kBytes], 20);  // all pools
  EXPECT_EQ(budget[0][kActive], 0);

  ShardStats shard;
  shard.SetBudget(budget);
  ShardStats::Counters most{};
  most[kBytes] = 19;
  EXPECT_TRUE(shard.Admits(kLargePoolStat, most));
  most[kBytes] = 20;  // would make the sum reach the allocated peak: that call must take every lock
  EXPECT_FALSE(shard.Admits(kLargePoolStat, most));
  ShardStats::Counters active{};
  active[kActive] = 1;
  EXPECT_FALSE(shard.Admits(kSmallPoolStat, active));
  EXPECT_TRUE(shard.Admits(kSmallPoolStat, ShardStats::Counters{}));  // lowers nothing it has no room for

  shard.Add(BlockStat::kAllocatedBytes, kLargePoolStat, 15);
  shard.Add(BlockStat::kAllocatedBytes, kLargePoolStat, -30);
  most[kBytes] = 34;  // 15 - 30 + 34 = 19 < 20
  EXPECT_TRUE(shard.Admits(kLargePoolStat, most));
  stats.AddShard(shard);
  const StatArray bytes = stats.allocated_bytes.ToArray();
  EXPECT_EQ(bytes[kLargePoolStat].current, 45);
  EXPECT_EQ(bytes[kLargePoolStat].allocated, 115);
  EXPECT_EQ(bytes[kLargePoolStat].freed, 70);
  EXPECT_EQ(bytes[kAllPools].peak, 100);
  EXPECT_EQ(shard.net(1)[kBytes], 0);  // cleared
}

}  // namespace
}  // namespace headroom::internal

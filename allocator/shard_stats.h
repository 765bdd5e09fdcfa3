// The statistics a stream shard's fast path changes, kept in the shard and
// added to the allocator's statistics by the exclusive lock.
//
//   ShardStats stats;
//   stats.SetBudget(headroom_per_counter);          // exclusive lock
//   if (stats.Admits(kLargePoolStat, most_raised)) { ...allocate... }
//   stats.Add(BlockStat::kAllocatedBytes, kLargePoolStat, 4096);
//   pool_stats.AddShard(stats);                     // exclusive lock; clears
//
// Note [Peak budgets]
// PyTorch updates every counter under its one allocator lock, so a peak is
// the highest value the counter ever held. Stream shards (caching_allocator.h,
// Note [Stream shards]) let threads on different streams allocate at once,
// and a counter they all wrote would again be a cache line every call
// writes. So a shard's fast path changes only its own sums, and the
// exclusive lock adds them to the allocator's counters. Currents and totals
// come out exact, being sums; a peak would not, being the highest value of
// a sum whose terms changed at once on several cores.
//
// Hence budgets: when the exclusive lock ends, each counter's room below its
// peak (peak - current, for each pool and for all pools) is divided among
// the shards, and a fast-path call runs only if its shard's running sums,
// raised by the most the call can raise them (worked out from the block
// before the call), stay within the shard's shares: strictly below for the
// allocated bytes, whose peak reached again is an event of its own (the
// reserved bytes at the peak are noted then). The shards' sums then stay
// within the room together, so no counter passes its peak while they run,
// and no peak is lost or made up. A call that needs more room takes
// the exclusive lock, which adds up every shard and orders the call as one
// lock would. While a program sets new peaks (its first steps, or right
// after ResetPeakStats) its allocations therefore serialize, as under
// PyTorch's lock; in the steady state below the peak, threads on different
// streams run apart. With one shard there is nothing to divide: its fast
// path writes the allocator's counters directly (StatsDirect).
#ifndef HEADROOM_ALLOCATOR_SHARD_STATS_H_
#define HEADROOM_ALLOCATOR_SHARD_STATS_H_

#include <array>
#include <cstddef>
#include <cstdint>

#include "allocator/memory_stats.h"

namespace headroom::internal {

// The counters a fast-path call can change.
enum class BlockStat : uint8_t {
  kAllocation,
  kAllocatedBytes,
  kRequestedBytes,
  kActive,
  kActiveBytes,
  kInactiveSplit,
  kInactiveSplitBytes,
  kOversizeAllocations,  // one counter for both pools; kept per pool here like the rest
};
inline constexpr size_t kBlockStatCount = 8;

class ShardStats {
 public:
  using Counters = std::array<int64_t, kBlockStatCount>;

  // Whether a call that raises each counter of `pool` by at most `most`
  // leaves every sum below its budget (Note [Peak budgets]).
  bool Admits(StatIndex pool, const Counters& most) const {
    const size_t p = PoolSlot(pool);
    for (size_t i = 0; i < kBlockStatCount; ++i) {
      if (most[i] <= 0) continue;  // what a call does not raise cannot reach a peak
      // Reaching the allocated peak again is an event of its own (the
      // reserved bytes at the peak are noted then); other counters may.
      const int64_t slack = i == Index(BlockStat::kAllocatedBytes) ? 1 : 0;
      if (net_[p][i] + most[i] + slack > budget_[p][i]) return false;
      if (net_[0][i] + net_[1][i] + most[i] + slack > budget_[2][i]) return false;
    }
    return true;
  }

  void Add(BlockStat stat, StatIndex pool, int64_t amount) {
    const size_t p = PoolSlot(pool);
    const size_t i = Index(stat);
    net_[p][i] += amount;
    if (amount >= 0) {
      increased_[p][i] += amount;
    } else {
      decreased_[p][i] -= amount;
    }
  }

  // Per pool (0 small, 1 large): the change of each counter, and the totals
  // it rose and fell by, since Clear.
  const Counters& net(size_t pool) const { return net_[pool]; }
  const Counters& increased(size_t pool) const { return increased_[pool]; }
  const Counters& decreased(size_t pool) const { return decreased_[pool]; }
  void Clear() {
    net_ = {};
    increased_ = {};
    decreased_ = {};
  }

  // This shard's share of each counter's room below its peak: [0] small
  // pool, [1] large pool, [2] all pools.
  void SetBudget(const std::array<Counters, 3>& budget) { budget_ = budget; }

 private:
  static size_t Index(BlockStat stat) { return static_cast<size_t>(stat); }
  static size_t PoolSlot(StatIndex pool) { return pool == kSmallPoolStat ? 0 : 1; }

  std::array<Counters, 2> net_{};
  std::array<Counters, 2> increased_{};
  std::array<Counters, 2> decreased_{};
  std::array<Counters, 3> budget_{};  // zero until the first exclusive lock: admits nothing
};

}  // namespace headroom::internal

#endif  // HEADROOM_ALLOCATOR_SHARD_STATS_H_

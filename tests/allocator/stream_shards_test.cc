// Stream shards (caching_allocator.h, Note [Stream shards]) and peak budgets
// (shard_stats.h, Note [Peak budgets]): calls on several streams, from one
// thread and from many, keep the statistics PyTorch's one lock would give.
#include <algorithm>
#include <array>
#include <random>
#include <thread>
#include <vector>

#include "allocator/caching_allocator.h"
#include "allocator_test_util.h"
#include "common/units.h"
#include "gtest/gtest.h"

namespace headroom {
namespace {

using testing::MakeAllocator;

// One counter as the model keeps it: current, peak and totals.
struct ModelStat {
  int64_t current = 0;
  int64_t peak = 0;
  int64_t allocated = 0;
  int64_t freed = 0;

  void Add(int64_t amount) {
    current += amount;
    if (amount > 0) allocated += amount;
    if (amount < 0) freed -= amount;
    peak = std::max(peak, current);
  }
};

// allocated_bytes, requested_bytes and allocation for all pools, the small
// pool and the large pool, worked out from the calls alone.
struct Model {
  std::array<ModelStat, kStatIndexCount> bytes, requested, count;

  void Change(size_t pool, int64_t sign, int64_t block_bytes, int64_t requested_bytes) {
    for (size_t i : {size_t{kAllPools}, pool}) {
      bytes[i].Add(sign * block_bytes);
      requested[i].Add(sign * requested_bytes);
      count[i].Add(sign);
    }
  }
  void ResetPeaks() {
    for (auto* stats : {&bytes, &requested, &count}) {
      for (ModelStat& stat : *stats) stat.peak = stat.current;
    }
  }
};

void ExpectMatches(const StatArray& actual, const std::array<ModelStat, kStatIndexCount>& expected,
                   const char* name, int op) {
  for (size_t i = 0; i < kStatIndexCount; ++i) {
    EXPECT_EQ(actual[i].current, expected[i].current) << name << "[" << i << "] after op " << op;
    EXPECT_EQ(actual[i].peak, expected[i].peak) << name << "[" << i << "] peak after op " << op;
    EXPECT_EQ(actual[i].allocated, expected[i].allocated) << name << "[" << i << "] total after op " << op;
    EXPECT_EQ(actual[i].freed, expected[i].freed) << name << "[" << i << "] freed after op " << op;
  }
}

struct Live {
  DeviceAddress address;
  StreamHandle stream;
  size_t pool;
  int64_t block_bytes;
  int64_t requested;
};

// Calls on four streams from one thread, statistics read every few calls:
// between reads the shards run on their budgets, and every counter, peak and
// total still equals what the model of the calls says, also across
// ResetPeakStats. For the first calls the allocator is validated after each
// one, which checks every counter against its peak.
TEST(StreamShards, StatisticsMatchAModelOfTheCallsOnEveryStream) {
  for (const bool expandable : {false, true}) {
    SCOPED_TRACE(expandable ? "expandable segments" : "segments");
    auto a = MakeAllocator({.capacity_bytes = 64 * kGiB}, {.expandable_segments = expandable});
    std::vector<StreamHandle> streams = {kDefaultStream};
    for (int i = 0; i < 3; ++i) streams.push_back(*a.device->CreateStream());
    std::mt19937_64 rng(7);
    Model model;
    std::vector<Live> live;
    int next_check = 1;
    for (int op = 0; op < 6000; ++op) {
      if (live.empty() || rng() % 100 < 52) {
        const uint64_t size = rng() % 3 == 0 ? 1 + rng() % (12 * kMiB) : 1 + rng() % (512 * kKiB);
        const StreamHandle stream = streams[rng() % streams.size()];
        absl::StatusOr<DeviceAddress> p = a->Allocate(size, stream);
        ASSERT_TRUE(p.ok()) << p.status();
        absl::StatusOr<BlockInfo> info = a->Lookup(*p);
        ASSERT_TRUE(info.ok()) << info.status();
        const size_t pool = size <= kMiB ? kSmallPoolStat : kLargePoolStat;
        live.push_back({*p, stream, pool, static_cast<int64_t>(info->size), static_cast<int64_t>(size)});
        model.Change(pool, 1, live.back().block_bytes, live.back().requested);
      } else {
        const size_t k = rng() % live.size();
        const Live freed = live[k];
        live[k] = live.back();
        live.pop_back();
        // Half the frees name the block's stream, as the C library does.
        const absl::Status status = rng() % 2 == 0 ? a->Free(freed.address, std::nullopt, freed.stream)
                                                   : a->Free(freed.address);
        ASSERT_TRUE(status.ok()) << status;
        model.Change(freed.pool, -1, freed.block_bytes, freed.requested);
      }
      if (op == 3000) {
        a->ResetPeakStats();
        model.ResetPeaks();
      }
      // Validate adds up the shards: no counter, inactive splits included, may pass its peak in one call.
      if (op < 1500) HEADROOM_EXPECT_VALID(a);
      if (op == next_check) {
        const MemoryStats stats = a->GetStats();
        ExpectMatches(stats.allocated_bytes, model.bytes, "allocated_bytes", op);
        ExpectMatches(stats.requested_bytes, model.requested, "requested_bytes", op);
        ExpectMatches(stats.allocation, model.count, "allocation", op);
        ASSERT_FALSE(::testing::Test::HasFailure());
        next_check = op + 1 + static_cast<int>(rng() % 200);
      }
    }
    HEADROOM_EXPECT_VALID(a);
  }
}

// Threads allocating and freeing on streams of their own: the totals are
// exact, the peak lies between the largest one thread reached and their
// sum, and the allocator is consistent afterwards.
TEST(StreamShards, ThreadsOnTheirOwnStreamsKeepExactStatistics) {
  constexpr int kThreads = 4;
  constexpr int kOps = 20000;
  auto a = MakeAllocator({.capacity_bytes = 256 * kGiB});
  std::vector<StreamHandle> streams;
  for (int t = 0; t < kThreads; ++t) streams.push_back(*a.device->CreateStream());
  struct Totals {
    int64_t allocated = 0;
    int64_t freed = 0;
    int64_t peak = 0;
    int failures = 0;
  };
  std::vector<Totals> totals(kThreads);
  std::vector<std::vector<DeviceAddress>> kept(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937_64 rng(100 + t);
      Totals& mine = totals[static_cast<size_t>(t)];
      std::vector<std::pair<DeviceAddress, int64_t>> live;
      int64_t current = 0;
      for (int i = 0; i < kOps; ++i) {
        if (live.empty() || rng() % 2 == 0) {
          const uint64_t size = rng() % 4 == 0 ? 1 + rng() % (8 * kMiB) : 1 + rng() % (256 * kKiB);
          absl::StatusOr<DeviceAddress> p = a->Allocate(size, streams[static_cast<size_t>(t)]);
          absl::StatusOr<BlockInfo> info = p.ok() ? a->Lookup(*p) : absl::StatusOr<BlockInfo>(p.status());
          if (!info.ok()) {
            ++mine.failures;
            continue;
          }
          const auto bytes = static_cast<int64_t>(info->size);
          live.emplace_back(*p, bytes);
          mine.allocated += bytes;
          current += bytes;
          mine.peak = std::max(mine.peak, current);
        } else {
          const size_t k = rng() % live.size();
          if (!a->Free(live[k].first).ok()) ++mine.failures;
          mine.freed += live[k].second;
          current -= live[k].second;
          live[k] = live.back();
          live.pop_back();
        }
      }
      for (const auto& [address, bytes] : live) kept[static_cast<size_t>(t)].push_back(address);
    });
  }
  for (std::thread& thread : threads) thread.join();

  HEADROOM_EXPECT_VALID(a);
  int64_t allocated = 0;
  int64_t freed = 0;
  int64_t largest_peak = 0;
  int64_t summed_peaks = 0;
  for (const Totals& t : totals) {
    EXPECT_EQ(t.failures, 0);
    allocated += t.allocated;
    freed += t.freed;
    largest_peak = std::max(largest_peak, t.peak);
    summed_peaks += t.peak;
  }
  const Stat bytes = a->GetStats().allocated_bytes[kAllPools];
  EXPECT_EQ(bytes.allocated, allocated);
  EXPECT_EQ(bytes.freed, freed);
  EXPECT_EQ(bytes.current, allocated - freed);
  EXPECT_GE(bytes.peak, largest_peak);
  EXPECT_LE(bytes.peak, summed_peaks);

  // Another thread frees what is left: no hint names the shard, yet every free succeeds.
  std::thread cleaner([&] {
    for (const auto& addresses : kept) {
      for (DeviceAddress address : addresses) EXPECT_TRUE(a->Free(address).ok());
    }
  });
  cleaner.join();
  HEADROOM_EXPECT_VALID(a);
  EXPECT_EQ(a->GetStats().allocated_bytes[kAllPools].current, 0);
  EXPECT_EQ(a->GetStats().allocation[kAllPools].current, 0);
}

// A double free and a foreign pointer are found whichever shard is asked.
TEST(StreamShards, BadFreesAreReportedFromAnyShard) {
  auto a = MakeAllocator({.capacity_bytes = 8 * kGiB});
  const StreamHandle s1 = *a.device->CreateStream();
  const StreamHandle s2 = *a.device->CreateStream();
  const DeviceAddress p = *a->Allocate(4 * kMiB, s1);
  const DeviceAddress q = *a->Allocate(4 * kMiB, s2);
  ASSERT_TRUE(a->Free(p, std::nullopt, s1).ok());
  const absl::Status twice = a->Free(p, std::nullopt, s2);
  EXPECT_EQ(twice.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(twice.message().find("double free"), std::string_view::npos) << twice;
  const absl::Status foreign = a->Free(q + 4 * kGiB);
  EXPECT_NE(foreign.message().find("did not allocate"), std::string_view::npos) << foreign;
  // The wrong size keeps the block allocated, in its own shard.
  EXPECT_EQ(a->Free(q, 1).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(a->Lookup(q).ok());
  EXPECT_TRUE(a->Free(q).ok());
  HEADROOM_EXPECT_VALID(a);
}

}  // namespace
}  // namespace headroom

#include "allocator/block_pool.h"

#include <algorithm>
#include <deque>
#include <map>
#include <random>
#include <tuple>
#include <vector>

#include "common/units.h"
#include "gtest/gtest.h"

namespace headroom::internal {
namespace {

// Blocks owned by the test; the pool only links them.
class BlockPoolTest : public ::testing::Test {
 protected:
  ~BlockPoolTest() override { pool_.Clear(); }

  Block* Add(uint64_t stream, uint64_t size, DeviceAddress address) {
    Block& block = blocks_.emplace_back();
    block.stream = StreamHandle{stream};
    block.size = size;
    block.address = address;
    pool_.Insert(&block);
    return &block;
  }

  std::deque<Block> blocks_;
  BlockPool pool_;
};

TEST_F(BlockPoolTest, BestFitIsSmallestThenLowestAddressOnTheStream) {
  Add(0, 4096, 0x40000);
  Block* low = Add(0, 4096, 0x10000);
  Add(0, 2048, 0x20000);
  Block* other_stream = Add(7, 1024, 0x30000);
  EXPECT_EQ(pool_.BestFit(StreamHandle{0}, 2560), low);  // no 2560 or 3072 block: next size up
  EXPECT_EQ(pool_.BestFit(StreamHandle{0}, 1024)->size, 2048u);
  EXPECT_EQ(pool_.BestFit(StreamHandle{7}, 512), other_stream);
  EXPECT_EQ(pool_.BestFit(StreamHandle{7}, 1536), nullptr);
  EXPECT_EQ(pool_.BestFit(StreamHandle{3}, 512), nullptr);
  EXPECT_EQ(pool_.BestFit(StreamHandle{0}, 8192), nullptr);
}

TEST_F(BlockPoolTest, BinnedAndLargeBlocksMeetAtTheBinLimit) {
  const uint64_t limit = BlockPool::kBinnedMax;
  Block* at_limit = Add(0, limit, 0x100000);
  Block* above = Add(0, limit + 512, 0x200000);
  Block* huge = Add(0, 64 * kMiB, 0x400000);
  EXPECT_EQ(pool_.BestFit(StreamHandle{0}, 512), at_limit);
  EXPECT_EQ(pool_.BestFit(StreamHandle{0}, limit), at_limit);
  EXPECT_EQ(pool_.BestFit(StreamHandle{0}, limit + 1), above);
  EXPECT_EQ(pool_.BestFit(StreamHandle{0}, limit + kMiB), huge);
  EXPECT_EQ(pool_.LargestSize(), 64 * kMiB);
  pool_.Erase(at_limit);
  EXPECT_EQ(pool_.BestFit(StreamHandle{0}, 512), above);  // no bin holds a block: the large tree answers
  pool_.Erase(huge);
  pool_.Erase(above);
  EXPECT_TRUE(pool_.empty());
  EXPECT_EQ(pool_.BestFit(StreamHandle{0}, 512), nullptr);
  EXPECT_EQ(pool_.LargestSize(), 0u);
}

TEST_F(BlockPoolTest, StreamsLargestSizeAndOrderedWalk) {
  Add(9, 3 * kMiB, 0x900000);
  Add(2, 1024, 0x2000);
  Add(2, 512, 0x3000);
  Add(2, 512, 0x1000);
  Block* emptied = Add(5, 512, 0x5000);
  pool_.Erase(emptied);
  std::vector<uint64_t> streams;
  for (StreamHandle s : pool_.Streams()) streams.push_back(s.value);
  EXPECT_EQ(streams, (std::vector<uint64_t>{2, 9}));
  EXPECT_EQ(pool_.LargestSize(), 3 * kMiB);
  std::vector<std::tuple<uint64_t, uint64_t, DeviceAddress>> walk;
  pool_.ForEach([&](Block* b) { walk.emplace_back(b->stream.value, b->size, b->address); });
  EXPECT_EQ(walk, (std::vector<std::tuple<uint64_t, uint64_t, DeviceAddress>>{
                      {2, 512, 0x1000}, {2, 512, 0x3000}, {2, 1024, 0x2000}, {9, 3 * kMiB, 0x900000}}));
}

// Against a reference ordered by (stream, size, address) under random
// inserts (at random addresses, below and above what is cached), erases,
// best-fit queries, and take-then-recache cycles as an allocate+free pair
// makes them, on both sides of the bin limit.
TEST_F(BlockPoolTest, MatchesAnOrderedReference) {
  std::mt19937_64 rng(42);
  const uint64_t kAroundLimit = BlockPool::kBinnedMax / kMinBlockSize;  // sizes on both sides
  // 4,000 blocks with distinct addresses in random order, few sizes so that
  // bins hold many blocks.
  std::vector<Block*> outside;
  for (uint64_t i = 0; i < 4000; ++i) {
    Block& block = blocks_.emplace_back();
    block.stream = StreamHandle{rng() % 2};
    block.size = kMinBlockSize * (rng() % 4 == 0 ? kAroundLimit - 4 + rng() % 8 : 1 + rng() % 8);
    block.address = 0x10000 + 512 * i;
    outside.push_back(&block);
  }
  std::shuffle(outside.begin(), outside.end(), rng);
  std::map<std::tuple<uint64_t, uint64_t, DeviceAddress>, Block*> reference;
  std::vector<Block*> cached;
  auto key = [](const Block* b) { return std::make_tuple(b->stream.value, b->size, b->address); };
  auto expected_fit = [&](uint64_t stream, uint64_t size) -> Block* {
    auto it = reference.lower_bound({stream, size, 0});
    return it != reference.end() && std::get<0>(it->first) == stream ? it->second : nullptr;
  };
  for (int op = 0; op < 40000; ++op) {
    const uint64_t stream = rng() % 2;
    const uint64_t size = kMinBlockSize * (rng() % 4 == 0 ? kAroundLimit - 4 + rng() % 8 : 1 + rng() % 8);
    switch (rng() % 4) {
      case 0:
        if (!outside.empty()) {
          const size_t i = rng() % outside.size();
          Block* b = outside[i];
          outside[i] = outside.back();
          outside.pop_back();
          pool_.Insert(b);
          reference[key(b)] = b;
          cached.push_back(b);
        }
        break;
      case 1:
        if (!cached.empty()) {
          const size_t i = rng() % cached.size();
          Block* b = cached[i];
          pool_.Erase(b);
          reference.erase(key(b));
          cached[i] = cached.back();
          cached.pop_back();
          outside.push_back(b);
        }
        break;
      case 2: {
        // Take the best fit and cache it again, as a pair does.
        Block* fit = pool_.BestFit(StreamHandle{stream}, size);
        ASSERT_EQ(fit, expected_fit(stream, size)) << "op " << op;
        if (fit != nullptr) {
          pool_.Erase(fit);
          ASSERT_FALSE(pool_.Contains(fit));
          pool_.Insert(fit);
        }
        break;
      }
      default:
        ASSERT_EQ(pool_.BestFit(StreamHandle{stream}, size), expected_fit(stream, size)) << "op " << op;
    }
    ASSERT_EQ(pool_.size(), reference.size());
  }
  std::vector<Block*> walk;
  pool_.ForEach([&](Block* b) { walk.push_back(b); });
  std::vector<Block*> expected;
  for (const auto& [k, b] : reference) expected.push_back(b);
  EXPECT_EQ(walk, expected);
  for (Block* b : cached) EXPECT_TRUE(pool_.Contains(b));
  for (Block* b : outside) EXPECT_FALSE(pool_.Contains(b));
}

}  // namespace
}  // namespace headroom::internal

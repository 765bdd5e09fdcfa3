#include "executor/host_pool.h"

#include <cstring>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace headroom {
namespace {

using ::testing::HasSubstr;

constexpr uint64_t kMiB = uint64_t{1} << 20;

// Note [Host pool size]: a pool of HostPoolBytesFor(copies) holds every copy at once, allocated in an order that
// interleaves copies above and below half a segment.
TEST(HostPool, HoldsEveryCopyItWasSizedFor) {
  const std::vector<uint64_t> copies = {16 * kMiB, 1 * kMiB,  16 * kMiB - 64,  20 * kMiB, 3 * kMiB,
                                        16 * kMiB, 40 * kMiB, (kMiB / 2),      16 * kMiB, 12 * kMiB};
  EXPECT_EQ(HostPoolBytesFor(copies), 12 * kHostPoolSegment);  // 40 MiB takes two segments, one more for slack
  auto pool = HostPool::Create(HostPoolBytesFor(copies));
  ASSERT_TRUE(pool.ok()) << pool.status();
  std::vector<void*> held;
  for (uint64_t bytes : copies) {
    absl::StatusOr<void*> p = (*pool)->Allocate(bytes);
    ASSERT_TRUE(p.ok()) << p.status();
    held.push_back(*p);
  }
  for (void* p : held) EXPECT_TRUE((*pool)->Free(p).ok());

  // Copies of 16 MiB take a segment each: nine of them (144 MiB) overflow 256 MiB, and fit as sized.
  const std::vector<uint64_t> sixteens(9, 16 * kMiB);
  auto small = HostPool::Create(256 * kMiB);
  ASSERT_TRUE(small.ok()) << small.status();
  bool failed = false;
  for (uint64_t bytes : sixteens) failed = failed || !(*small)->Allocate(bytes).ok();
  EXPECT_TRUE(failed);
  auto sized = HostPool::Create(HostPoolBytesFor(sixteens));
  ASSERT_TRUE(sized.ok()) << sized.status();
  for (uint64_t bytes : sixteens) EXPECT_TRUE((*sized)->Allocate(bytes).ok());
  EXPECT_GT(HostPoolBytesFor(std::vector<uint64_t>{kMaxHostPoolBytes}), kMaxHostPoolBytes);
}

TEST(HostPool, ServesFromItsRegionAndCountsLikeTheDeviceAllocator) {
  auto pool = *HostPool::Create(64 * kMiB);
  EXPECT_EQ(pool->stats().capacity_bytes, 64 * kMiB);
  void* a = *pool->Allocate(10 * kMiB);
  void* b = *pool->Allocate(1000);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(a) % 64, 0u);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(b) % 64, 0u);
  std::memset(a, 0xab, 10 * kMiB);  // the bytes are really there
  std::memset(b, 0xcd, 1000);
  EXPECT_EQ(static_cast<unsigned char*>(a)[10 * kMiB - 1], 0xab);
  EXPECT_EQ(*pool->SizeOf(b), 1000u);
  HostPoolStats s = pool->stats();
  EXPECT_EQ(s.current_bytes, 10 * kMiB + 1000);
  EXPECT_EQ(s.peak_bytes, 10 * kMiB + 1000);
  EXPECT_GE(s.current_usable_bytes, s.current_bytes);
  EXPECT_EQ(s.allocations, 2u);
  ASSERT_TRUE(pool->Free(a).ok());
  s = pool->stats();
  EXPECT_EQ(s.current_bytes, 1000u);
  EXPECT_EQ(s.peak_bytes, 10 * kMiB + 1000);
  EXPECT_EQ(s.allocated_bytes, 10 * kMiB + 1000);
  EXPECT_EQ(s.freed_bytes, 10 * kMiB);
  EXPECT_EQ(s.frees, 1u);
  pool->ResetPeak();
  EXPECT_EQ(pool->stats().peak_bytes, 1000u);
  ASSERT_TRUE(pool->Free(b).ok());
}

TEST(HostPool, ExhaustionIsAClearErrorAndChangesNothing) {
  auto pool = *HostPool::Create(32 * kMiB);
  std::vector<void*> held;
  absl::StatusOr<void*> p;
  while ((p = pool->Allocate(4 * kMiB)).ok()) held.push_back(*p);
  EXPECT_EQ(p.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(p.status().message(), HasSubstr("cannot serve 4.00 MiB"));
  EXPECT_THAT(p.status().message(), HasSubstr("32.00 MiB"));
  EXPECT_GE(held.size(), 5u);  // mimalloc's segment headers take a little of the region
  EXPECT_EQ(pool->stats().failures, 1u);
  EXPECT_EQ(pool->stats().current_bytes, held.size() * 4 * kMiB);
  EXPECT_EQ(pool->Allocate(64 * kMiB).status().code(), absl::StatusCode::kResourceExhausted);
  for (void* q : held) ASSERT_TRUE(pool->Free(q).ok());
  EXPECT_TRUE(pool->Allocate(4 * kMiB).ok());  // freed memory serves again
}

TEST(HostPool, BadRequestsAndFreesAreErrors) {
  EXPECT_EQ(HostPool::Create(0).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(HostPool::Create(kMaxHostPoolBytes + 1).status().code(), absl::StatusCode::kInvalidArgument);
  auto pool = *HostPool::Create(32 * kMiB);
  EXPECT_EQ(pool->Allocate(0).status().code(), absl::StatusCode::kInvalidArgument);
  void* p = *pool->Allocate(100);
  ASSERT_TRUE(pool->Free(p).ok());
  EXPECT_THAT(pool->Free(p).message(), HasSubstr("double free"));
  int local = 0;
  EXPECT_EQ(pool->Free(&local).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(pool->SizeOf(p).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(pool->stats().frees, 1u);
}

TEST(HostPool, AllocatesOnlyFromTheThreadThatCreatedIt) {
  auto pool = *HostPool::Create(32 * kMiB);
  void* p = *pool->Allocate(100);
  absl::Status other;
  std::thread([&] {
    other = pool->Allocate(100).status();
    EXPECT_TRUE(pool->Free(p).ok());  // freeing is fine from anywhere
  }).join();
  EXPECT_EQ(other.code(), absl::StatusCode::kFailedPrecondition);
}

TEST(HostPool, ANewPoolReusesAClosedPoolsRegion) {
  void* first = nullptr;
  {
    auto pool = *HostPool::Create(96 * kMiB);
    first = *pool->Allocate(1 * kMiB);  // left live: the pool's destruction frees it
  }
  auto again = *HostPool::Create(96 * kMiB);
  void* second = *again->Allocate(1 * kMiB);
  const auto distance = reinterpret_cast<intptr_t>(second) - reinterpret_cast<intptr_t>(first);
  EXPECT_LT(std::abs(distance), static_cast<intptr_t>(96 * kMiB)) << "a fresh region was pinned";
  EXPECT_EQ(again->stats().current_bytes, 1 * kMiB);
}

}  // namespace
}  // namespace headroom

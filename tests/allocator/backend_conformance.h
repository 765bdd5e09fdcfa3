// The contract of DeviceBackend (allocator/device_backend.h) as a typed test
// suite: every backend runs the same tests. Instantiate with a factory type
// that has
//   static absl::StatusOr<std::unique_ptr<DeviceBackend>> Make();
//   static const char* SkipReason();   // nullptr when the backend can run
//
//   INSTANTIATE_TYPED_TEST_SUITE_P(Simulated, BackendConformance, SimulatedFactory);
#ifndef HEADROOM_TESTS_ALLOCATOR_BACKEND_CONFORMANCE_H_
#define HEADROOM_TESTS_ALLOCATOR_BACKEND_CONFORMANCE_H_

#include <bit>
#include <memory>
#include <set>

#include "allocator/device_backend.h"
#include "gtest/gtest.h"

namespace headroom::testing {

template <typename Factory>
class BackendConformance : public ::testing::Test {
 protected:
  void SetUp() override {
    if (const char* reason = Factory::SkipReason()) GTEST_SKIP() << reason;
    auto made = Factory::Make();
    ASSERT_TRUE(made.ok()) << made.status();
    backend_ = *std::move(made);
  }
  DeviceBackend& backend() { return *backend_; }
  uint64_t page() { return backend_->properties().map_granularity; }

 private:
  std::unique_ptr<DeviceBackend> backend_;
};

TYPED_TEST_SUITE_P(BackendConformance);

TYPED_TEST_P(BackendConformance, PropertiesAreSane) {
  const DeviceProperties& props = this->backend().properties();
  EXPECT_GT(props.total_bytes, 0u);
  EXPECT_TRUE(std::has_single_bit(props.map_granularity)) << props.map_granularity;
  EXPECT_GE(props.map_granularity, 512u);
  EXPECT_FALSE(props.name.empty());
  auto info = this->backend().GetMemoryInfo();
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->total_bytes, props.total_bytes);
  EXPECT_LE(info->free_bytes, info->total_bytes);
}

TYPED_TEST_P(BackendConformance, MallocGivesDistinctAlignedRanges) {
  std::set<DeviceAddress> seen;
  std::vector<DeviceAddress> all;
  for (int i = 0; i < 4; ++i) {
    auto p = this->backend().Malloc(uint64_t{1} << 20);
    ASSERT_TRUE(p.ok()) << p.status();
    EXPECT_NE(*p, 0u);
    EXPECT_EQ(*p % 512, 0u);
    EXPECT_TRUE(seen.insert(*p).second);
    all.push_back(*p);
  }
  // Ranges do not overlap.
  for (auto it = seen.begin(); std::next(it) != seen.end(); ++it) EXPECT_GE(*std::next(it) - *it, uint64_t{1} << 20);
  for (DeviceAddress p : all) EXPECT_TRUE(this->backend().Free(p).ok());
}

TYPED_TEST_P(BackendConformance, MallocBeyondCapacityIsResourceExhausted) {
  const uint64_t too_much = this->backend().properties().total_bytes * 2;
  auto p = this->backend().Malloc(too_much);
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().code(), absl::StatusCode::kResourceExhausted) << p.status();
  // The failure leaves the device usable.
  auto q = this->backend().Malloc(4096);
  ASSERT_TRUE(q.ok()) << q.status();
  EXPECT_TRUE(this->backend().Free(*q).ok());
}

TYPED_TEST_P(BackendConformance, FreeOfUnknownAddressFails) {
  auto p = this->backend().Malloc(4096);
  ASSERT_TRUE(p.ok());
  ASSERT_TRUE(this->backend().Free(*p).ok());
  EXPECT_FALSE(this->backend().Free(*p + 512).ok());
}

TYPED_TEST_P(BackendConformance, MallocChargesMemoryInfo) {
  auto before = this->backend().GetMemoryInfo();
  ASSERT_TRUE(before.ok());
  const uint64_t size = 64 * this->page();
  auto p = this->backend().Malloc(size);
  ASSERT_TRUE(p.ok()) << p.status();
  auto during = this->backend().GetMemoryInfo();
  ASSERT_TRUE(during.ok());
  EXPECT_GE(before->free_bytes - during->free_bytes + this->page(), size);
  ASSERT_TRUE(this->backend().Free(*p).ok());
}

TYPED_TEST_P(BackendConformance, VirtualMemoryReserveMapAccessUnmapRelease) {
  if (!this->backend().properties().supports_virtual_memory) GTEST_SKIP() << "no VMM";
  const uint64_t page = this->page();
  auto range = this->backend().ReserveAddressRange(8 * page);
  ASSERT_TRUE(range.ok()) << range.status();
  EXPECT_EQ(*range % page, 0u);
  std::vector<PhysicalHandle> handles;
  for (int i = 0; i < 3; ++i) {
    auto h = this->backend().CreatePhysical(page);
    ASSERT_TRUE(h.ok()) << h.status();
    ASSERT_TRUE(this->backend().Map(*range + static_cast<uint64_t>(i) * page, page, *h).ok());
    handles.push_back(*h);
  }
  EXPECT_TRUE(this->backend().SetAccess(*range, 3 * page).ok());
  EXPECT_TRUE(this->backend().Unmap(*range, 3 * page).ok());
  for (PhysicalHandle h : handles) EXPECT_TRUE(this->backend().ReleasePhysical(h).ok());
  EXPECT_TRUE(this->backend().ReleaseAddressRange(*range, 8 * page).ok());
}

// One page mapped at two addresses at once (Note [Stitched blocks]), each
// unmapped on its own, the page charged once.
TYPED_TEST_P(BackendConformance, APageMapsAtTwoAddresses) {
  if (!this->backend().properties().supports_virtual_memory) GTEST_SKIP() << "no VMM";
  const uint64_t page = this->page();
  auto first = this->backend().ReserveAddressRange(2 * page);
  auto second = this->backend().ReserveAddressRange(page);
  ASSERT_TRUE(first.ok() && second.ok());
  auto before = this->backend().GetMemoryInfo();
  auto h = this->backend().CreatePhysical(page);
  ASSERT_TRUE(h.ok()) << h.status();
  ASSERT_TRUE(this->backend().Map(*first + page, page, *h).ok());
  ASSERT_TRUE(this->backend().Map(*second, page, *h).ok());
  EXPECT_TRUE(this->backend().SetAccess(*first + page, page).ok());
  EXPECT_TRUE(this->backend().SetAccess(*second, page).ok());
  auto during = this->backend().GetMemoryInfo();
  EXPECT_LE(before->free_bytes - during->free_bytes, 2 * page);  // charged once (the driver may round)
  EXPECT_TRUE(this->backend().Unmap(*second, page).ok());
  EXPECT_TRUE(this->backend().Unmap(*first + page, page).ok());
  EXPECT_TRUE(this->backend().ReleasePhysical(*h).ok());
  EXPECT_TRUE(this->backend().ReleaseAddressRange(*second, page).ok());
  EXPECT_TRUE(this->backend().ReleaseAddressRange(*first, 2 * page).ok());
}

TYPED_TEST_P(BackendConformance, PhysicalMemoryIsCharged) {
  if (!this->backend().properties().supports_virtual_memory) GTEST_SKIP() << "no VMM";
  auto before = this->backend().GetMemoryInfo();
  const uint64_t size = 16 * this->page();
  auto h = this->backend().CreatePhysical(size);
  ASSERT_TRUE(h.ok()) << h.status();
  auto during = this->backend().GetMemoryInfo();
  EXPECT_GE(before->free_bytes - during->free_bytes + this->page(), size);
  EXPECT_TRUE(this->backend().ReleasePhysical(*h).ok());
}

TYPED_TEST_P(BackendConformance, EventsFollowStreams) {
  auto stream = this->backend().CreateStream();
  ASSERT_TRUE(stream.ok()) << stream.status();
  auto other = this->backend().CreateStream();
  ASSERT_TRUE(other.ok());
  auto event = this->backend().CreateEvent();
  ASSERT_TRUE(event.ok()) << event.status();
  // A never-recorded event counts as complete.
  auto fresh = this->backend().QueryEvent(*event);
  ASSERT_TRUE(fresh.ok());
  EXPECT_TRUE(*fresh);
  ASSERT_TRUE(this->backend().RecordEvent(*event, *stream).ok());
  EXPECT_TRUE(this->backend().StreamWaitEvent(*other, *event).ok());
  EXPECT_TRUE(this->backend().SynchronizeEvent(*event).ok());
  auto done = this->backend().QueryEvent(*event);
  ASSERT_TRUE(done.ok());
  EXPECT_TRUE(*done);
  EXPECT_TRUE(this->backend().SynchronizeStream(*other).ok());
  EXPECT_TRUE(this->backend().SynchronizeStream(kDefaultStream).ok());
  EXPECT_TRUE(this->backend().SynchronizeDevice().ok());
  EXPECT_TRUE(this->backend().DestroyEvent(*event).ok());
  EXPECT_TRUE(this->backend().DestroyStream(*stream).ok());
  EXPECT_TRUE(this->backend().DestroyStream(*other).ok());
}

TYPED_TEST_P(BackendConformance, ClockIsMonotonic) {
  uint64_t last = this->backend().NowNanoseconds();
  for (int i = 0; i < 100; ++i) {
    const uint64_t now = this->backend().NowNanoseconds();
    EXPECT_GE(now, last);
    last = now;
  }
}

REGISTER_TYPED_TEST_SUITE_P(BackendConformance, PropertiesAreSane, MallocGivesDistinctAlignedRanges,
                            MallocBeyondCapacityIsResourceExhausted, FreeOfUnknownAddressFails,
                            MallocChargesMemoryInfo, VirtualMemoryReserveMapAccessUnmapRelease,
                            APageMapsAtTwoAddresses, PhysicalMemoryIsCharged, EventsFollowStreams,
                            ClockIsMonotonic);

}  // namespace headroom::testing

#endif  // HEADROOM_TESTS_ALLOCATOR_BACKEND_CONFORMANCE_H_

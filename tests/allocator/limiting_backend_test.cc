#include "allocator/limiting_backend.h"

#include <memory>

#include "allocator/simulated/simulated_backend.h"
#include "common/units.h"
#include "gtest/gtest.h"

namespace headroom {
namespace {

std::unique_ptr<SimulatedBackend> Device() {
  return *SimulatedBackend::Create({.capacity_bytes = 64 * kMiB, .map_granularity = 2 * kMiB});
}

TEST(LimitingBackendTest, RefusesAMallocPastTheLimitBeforeTheDevice) {
  auto device = Device();
  LimitingBackend limited(device.get(), {.memory_fraction = 0.5});
  EXPECT_EQ(limited.AllowedBytes(), 32 * kMiB);
  absl::StatusOr<DeviceAddress> first = limited.Malloc(20 * kMiB);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(limited.alive_bytes(), 20 * kMiB);
  absl::StatusOr<DeviceAddress> second = limited.Malloc(20 * kMiB);
  EXPECT_TRUE(absl::IsResourceExhausted(second.status())) << second.status();
  EXPECT_EQ(second.status().message(), "a 20.00 MiB segment would exceed the limit of 32.00 MiB");
  EXPECT_EQ(device->GetMemoryInfo()->free_bytes, 44 * kMiB);  // the device was not asked
  ASSERT_TRUE(limited.Free(*first).ok());
  EXPECT_EQ(limited.alive_bytes(), 0);
  EXPECT_TRUE(limited.Malloc(32 * kMiB).ok());
}

TEST(LimitingBackendTest, CountsPhysicalPagesAndChecksABatchWhole) {
  auto device = Device();
  LimitingBackend limited(device.get(), {.hard_limit_bytes = 6 * kMiB});
  EXPECT_EQ(limited.AllowedBytes(), 6 * kMiB);
  absl::StatusOr<PhysicalHandle> page = limited.CreatePhysical(2 * kMiB);
  ASSERT_TRUE(page.ok()) << page.status();
  EXPECT_TRUE(limited.CheckRoom(4 * kMiB).ok());
  const absl::Status batch = limited.CheckRoom(6 * kMiB);
  EXPECT_TRUE(absl::IsResourceExhausted(batch));
  EXPECT_EQ(batch.message(), "mapping 6.00 MiB more would exceed the limit of 6.00 MiB");
  ASSERT_TRUE(limited.ReleasePhysical(*page).ok());
  EXPECT_EQ(limited.alive_bytes(), 0);
}

TEST(LimitingBackendTest, AFailedReleaseStaysCounted) {
  auto device = Device();
  LimitingBackend limited(device.get(), {});
  absl::StatusOr<PhysicalHandle> page = limited.CreatePhysical(2 * kMiB);
  ASSERT_TRUE(page.ok()) << page.status();
  device->InjectFailure(BackendCall::kReleasePhysical, {.code = absl::StatusCode::kInternal});
  EXPECT_FALSE(limited.ReleasePhysical(*page).ok());
  EXPECT_EQ(limited.alive_bytes(), 2 * kMiB);  // still the allocator's (Note [Unreleased pages])
  EXPECT_TRUE(limited.ReleasePhysical(*page).ok());
  EXPECT_EQ(limited.alive_bytes(), 0);
}

TEST(LimitingBackendTest, AMemoryFractionChangesTheLimit) {
  auto device = Device();
  LimitingBackend limited(device.get(), {.memory_fraction = 0.25, .hard_limit_bytes = 40 * kMiB});
  EXPECT_EQ(limited.AllowedBytes(), 16 * kMiB);
  limited.SetMemoryFraction(1.0);
  EXPECT_DOUBLE_EQ(limited.memory_fraction(), 1.0);
  EXPECT_EQ(limited.AllowedBytes(), 40 * kMiB);  // the hard limit is the stricter now
  EXPECT_TRUE(limited.GetMemoryInfo().ok());     // other calls go to the device
}

}  // namespace
}  // namespace headroom

#include "allocator/simulated/simulated_backend.h"

#include "common/units.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/allocator/backend_conformance.h"

namespace headroom::testing {
namespace {

struct SimulatedFactory {
  static absl::StatusOr<std::unique_ptr<DeviceBackend>> Make() {
    auto sim = SimulatedBackend::Create({.capacity_bytes = 1 * kGiB});
    if (!sim.ok()) return sim.status();
    return std::unique_ptr<DeviceBackend>(std::move(*sim));
  }
  static const char* SkipReason() { return nullptr; }
};
INSTANTIATE_TYPED_TEST_SUITE_P(Simulated, BackendConformance, SimulatedFactory);

}  // namespace
}  // namespace headroom::testing

namespace headroom {
namespace {

std::unique_ptr<SimulatedBackend> Make(SimulatedBackendOptions options) {
  auto sim = SimulatedBackend::Create(std::move(options));
  EXPECT_TRUE(sim.ok()) << sim.status();
  return *std::move(sim);
}

TEST(SimulatedBackend, RejectsBadOptions) {
  EXPECT_FALSE(SimulatedBackend::Create({.capacity_bytes = 0}).ok());
  EXPECT_FALSE(SimulatedBackend::Create({.map_granularity = 3000}).ok());
}

TEST(SimulatedBackend, AddressesAreDeterministic) {
  auto a = Make({}), b = Make({});
  for (uint64_t size : {uint64_t{512}, 3 * kMiB, 20 * kMiB}) {
    EXPECT_EQ(*a->Malloc(size), *b->Malloc(size));
  }
  EXPECT_EQ(*a->ReserveAddressRange(4 * kMiB), *b->ReserveAddressRange(4 * kMiB));
}

TEST(SimulatedBackend, CapacityIsEnforcedAndReturned) {
  auto sim = Make({.capacity_bytes = 10 * kMiB});
  auto a = sim->Malloc(6 * kMiB);
  ASSERT_TRUE(a.ok());
  auto b = sim->Malloc(6 * kMiB);
  EXPECT_EQ(b.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(sim->used_bytes(), 6 * kMiB);
  ASSERT_TRUE(sim->Free(*a).ok());
  EXPECT_EQ(sim->used_bytes(), 0u);
  EXPECT_TRUE(sim->Malloc(10 * kMiB).ok());
}

TEST(SimulatedBackend, InjectedFailuresSkipThenFail) {
  auto sim = Make({});
  sim->InjectFailure(BackendCall::kMalloc, {.skip = 2, .count = 2, .code = absl::StatusCode::kInternal});
  EXPECT_TRUE(sim->Malloc(512).ok());
  EXPECT_TRUE(sim->Malloc(512).ok());
  EXPECT_EQ(sim->Malloc(512).status().code(), absl::StatusCode::kInternal);
  EXPECT_EQ(sim->Malloc(512).status().code(), absl::StatusCode::kInternal);
  EXPECT_TRUE(sim->Malloc(512).ok());
  EXPECT_EQ(sim->CallCount(BackendCall::kMalloc), 5u);
  EXPECT_EQ(sim->live_mallocs(), 3u);
}

TEST(SimulatedBackend, EventsCompleteWhenTestsSaySo) {
  auto sim = Make({.auto_complete_events = false});
  StreamHandle s = *sim->CreateStream();
  EventHandle e = *sim->CreateEvent();
  ASSERT_TRUE(sim->RecordEvent(e, s).ok());
  EXPECT_FALSE(*sim->QueryEvent(e));
  sim->CompleteStream(s);
  EXPECT_TRUE(*sim->QueryEvent(e));
  EXPECT_EQ(sim->HostSynchronizations(), 0u);
}

TEST(SimulatedBackend, StreamWaitOrdersCompletion) {
  auto sim = Make({.auto_complete_events = false});
  StreamHandle producer = *sim->CreateStream(), consumer = *sim->CreateStream();
  EventHandle produced = *sim->CreateEvent(), consumed = *sim->CreateEvent();
  ASSERT_TRUE(sim->RecordEvent(produced, producer).ok());
  ASSERT_TRUE(sim->StreamWaitEvent(consumer, produced).ok());
  ASSERT_TRUE(sim->RecordEvent(consumed, consumer).ok());
  // Completing the consumer first completes what it waited on.
  sim->CompleteStream(consumer);
  EXPECT_TRUE(*sim->QueryEvent(consumed));
  EXPECT_TRUE(*sim->QueryEvent(produced));
}

TEST(SimulatedBackend, SynchronizeIsCountedAndCompletes) {
  auto sim = Make({.auto_complete_events = false});
  StreamHandle s = *sim->CreateStream();
  EventHandle e = *sim->CreateEvent();
  ASSERT_TRUE(sim->RecordEvent(e, s).ok());
  ASSERT_TRUE(sim->SynchronizeEvent(e).ok());
  EXPECT_TRUE(*sim->QueryEvent(e));
  EXPECT_EQ(sim->HostSynchronizations(), 1u);
}

TEST(SimulatedBackend, VirtualMemoryIsStrict) {
  auto sim = Make({.capacity_bytes = 64 * kMiB});
  const uint64_t page = 2 * kMiB;
  DeviceAddress range = *sim->ReserveAddressRange(4 * page);
  PhysicalHandle h = *sim->CreatePhysical(page);
  EXPECT_FALSE(sim->Map(range + 512, page, h).ok());                 // unaligned
  EXPECT_FALSE(sim->Map(range + 4 * page, page, h).ok());            // outside
  ASSERT_TRUE(sim->Map(range, page, h).ok());
  PhysicalHandle h2 = *sim->CreatePhysical(page);
  EXPECT_FALSE(sim->Map(range, page, h2).ok());                      // over a mapping
  EXPECT_FALSE(sim->ReleasePhysical(h).ok());                        // still mapped
  EXPECT_FALSE(sim->ReleaseAddressRange(range, 4 * page).ok());      // still has mappings
  EXPECT_FALSE(sim->Unmap(range, 2 * page).ok());                    // not all mapped
  EXPECT_TRUE(sim->Unmap(range, page).ok());
  EXPECT_TRUE(sim->ReleasePhysical(h).ok());
  EXPECT_TRUE(sim->ReleasePhysical(h2).ok());
  EXPECT_TRUE(sim->ReleaseAddressRange(range, 4 * page).ok());
  EXPECT_EQ(sim->used_bytes(), 0u);
}

TEST(SimulatedBackend, HostBackingAcrossPages) {
  auto sim = Make({.capacity_bytes = 64 * kMiB, .host_backing = true});
  const uint64_t page = 2 * kMiB;
  DeviceAddress range = *sim->ReserveAddressRange(2 * page);
  for (int i = 0; i < 2; ++i) {
    PhysicalHandle h = *sim->CreatePhysical(page);
    ASSERT_TRUE(sim->Map(range + static_cast<uint64_t>(i) * page, page, h).ok());
  }
  EXPECT_FALSE(sim->FillHost(range, 1024, 7).ok());  // no access yet
  ASSERT_TRUE(sim->SetAccess(range, 2 * page).ok());
  ASSERT_TRUE(sim->FillHost(range + page - 100, 200, 7).ok());
  EXPECT_TRUE(*sim->HostEquals(range + page - 100, 200, 7));
  EXPECT_FALSE(*sim->HostEquals(range + page - 101, 200, 7));
  DeviceAddress m = *sim->Malloc(4096);
  ASSERT_TRUE(sim->FillHost(m, 4096, 1).ok());
  EXPECT_TRUE(*sim->HostEquals(m, 4096, 1));
  EXPECT_FALSE(sim->FillHost(m, 8192, 1).ok());
}

TEST(SimulatedBackend, CapacityAndAddressSpaceAreBounded) {
  auto too_large = SimulatedBackend::Create({.capacity_bytes = kMaxSimulatedCapacity + 1});
  ASSERT_FALSE(too_large.ok());
  EXPECT_EQ(too_large.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(too_large.status().message()), ::testing::HasSubstr("exceeds the limit of 65536.00 TiB"));
  // Near the top of the address space: reservations run out instead of wrapping.
  auto device = SimulatedBackend::Create(
      {.capacity_bytes = kMaxSimulatedCapacity, .base_address = ~uint64_t{0} - 3 * kMaxSimulatedCapacity + 1});
  ASSERT_TRUE(device.ok()) << device.status();
  ASSERT_TRUE((*device)->ReserveAddressRange(kMaxSimulatedCapacity).ok());
  ASSERT_TRUE((*device)->ReserveAddressRange(kMaxSimulatedCapacity).ok());
  absl::StatusOr<DeviceAddress> third = (*device)->ReserveAddressRange(kMaxSimulatedCapacity);
  ASSERT_FALSE(third.ok());
  EXPECT_EQ(third.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(third.status().message()), ::testing::HasSubstr("no address space left"));
}

}  // namespace
}  // namespace headroom

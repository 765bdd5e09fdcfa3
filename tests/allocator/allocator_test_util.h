// A simulated device plus a caching allocator over it, for allocator tests.
#ifndef HEADROOM_TESTS_ALLOCATOR_ALLOCATOR_TEST_UTIL_H_
#define HEADROOM_TESTS_ALLOCATOR_ALLOCATOR_TEST_UTIL_H_

#include <memory>

#include "allocator/caching_allocator.h"
#include "allocator/simulated/simulated_backend.h"
#include "gtest/gtest.h"

namespace headroom::testing {

struct SimulatedAllocator {
  std::unique_ptr<SimulatedBackend> device;
  std::unique_ptr<CachingAllocator> allocator;

  CachingAllocator* operator->() { return allocator.get(); }
};

inline SimulatedAllocator MakeAllocator(SimulatedBackendOptions device_options, AllocatorOptions options = {}) {
  SimulatedAllocator out;
  auto device = SimulatedBackend::Create(std::move(device_options));
  EXPECT_TRUE(device.ok()) << device.status();
  out.device = *std::move(device);
  auto allocator = CachingAllocator::Create(out.device.get(), options);
  EXPECT_TRUE(allocator.ok()) << allocator.status();
  out.allocator = *std::move(allocator);
  return out;
}

#define HEADROOM_EXPECT_VALID(a)                 \
  do {                                           \
    const absl::Status v_ = (a)->Validate();     \
    ASSERT_TRUE(v_.ok()) << v_;                  \
  } while (0)

}  // namespace headroom::testing

#endif  // HEADROOM_TESTS_ALLOCATOR_ALLOCATOR_TEST_UTIL_H_

#include "allocator/cuda/cuda_device.h"

#include "gtest/gtest.h"

namespace headroom::cuda {
namespace {

TEST(CudaDevice, QueriesEveryVisibleDevice) {
  const int count = CudaDeviceCount();
  if (count == 0) GTEST_SKIP() << "no CUDA device visible";
  for (int i = 0; i < count; ++i) {
    absl::StatusOr<DeviceInfo> info = QueryDevice(i);
    ASSERT_TRUE(info.ok()) << info.status();
    EXPECT_GT(info->total_memory_bytes, 0u);
    EXPECT_GE(info->compute_capability_major, 5);
    EXPECT_GT(info->sm_count, 0);
  }
  EXPECT_FALSE(QueryDevice(count).ok());
}

}  // namespace
}  // namespace headroom::cuda

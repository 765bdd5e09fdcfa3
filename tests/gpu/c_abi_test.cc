// The C ABI that PyTorch's CUDAPluggableAllocator loads, on a real GPU.
#include "allocator/cuda/c_abi/headroom_alloc.h"

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <string>

#include "allocator/cuda/cuda_device.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace {

class CAbi : public ::testing::Test {
 protected:
  void SetUp() override {
    if (headroom::cuda::CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device visible";
  }
};

headroom_stats Stats() {
  headroom_stats s{};
  s.version = HEADROOM_STATS_VERSION;
  s.struct_size = sizeof(headroom_stats);
  EXPECT_EQ(headroom_get_stats(0, &s), 0) << headroom_last_error();
  return s;
}

TEST_F(CAbi, MallocFreeStatsSnapshot) {
  ASSERT_EQ(headroom_record_history(0, 100), 0);
  void* p = headroom_malloc(3 << 20, 0, nullptr);
  ASSERT_NE(p, nullptr) << headroom_last_error();
  ASSERT_EQ(cudaMemset(p, 1, 3 << 20), cudaSuccess);
  headroom_stats s = Stats();
  EXPECT_EQ(s.allocated_bytes, 3 << 20);
  EXPECT_GE(s.reserved_bytes, 3 << 20);
  const ssize_t n = headroom_snapshot_json(0, nullptr, 0);
  ASSERT_GT(n, 0);
  std::string json(static_cast<size_t>(n) + 1, '\0');
  ASSERT_EQ(headroom_snapshot_json(0, json.data(), json.size()), n);
  json.resize(static_cast<size_t>(n));
  nlohmann::json snap = nlohmann::json::parse(json);
  EXPECT_FALSE(snap["segments"].empty());
  EXPECT_EQ(snap["device_traces"][0].back()["action"], "alloc");
  // The library's default on a device with the virtual memory API maps
  // pages, and counts them (stats version 2).
  if (snap["allocator_settings"]["expandable_segments"] == true) {
    EXPECT_GE(s.num_pages_mapped, 1);
  } else {
    EXPECT_EQ(s.num_pages_mapped, 0);
  }
  char summary[8192];
  ASSERT_GT(headroom_memory_summary(0, summary, sizeof(summary)), 0);
  EXPECT_NE(std::string(summary).find("reserved memory"), std::string::npos);
  headroom_free(p, 3 << 20, 0, nullptr);
  EXPECT_EQ(Stats().allocated_bytes, 0);
  EXPECT_EQ(headroom_empty_cache(0), 0);
  EXPECT_EQ(headroom_reset_peak_stats(0), 0);
  EXPECT_EQ(headroom_malloc(0, 0, nullptr), nullptr);
}

TEST_F(CAbi, FreeOnAnotherStreamWaitsForIt) {
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
  void* p = headroom_malloc(1 << 20, 0, nullptr);
  ASSERT_NE(p, nullptr);
  headroom_free(p, 1 << 20, 0, stream);
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  void* q = headroom_malloc(1 << 20, 0, nullptr);
  EXPECT_EQ(q, p);
  headroom_free(q, 1 << 20, 0, nullptr);
  ASSERT_EQ(cudaStreamDestroy(stream), cudaSuccess);
}

TEST_F(CAbi, ErrorsAreReported) {
  EXPECT_EQ(headroom_set_memory_fraction(2.0, 0), -1);
  EXPECT_NE(std::string(headroom_last_error()).find("memory fraction"), std::string::npos);
  headroom_stats bad{};
  EXPECT_EQ(headroom_get_stats(0, &bad), -1);
  EXPECT_EQ(headroom_record_stream(reinterpret_cast<void*>(0x1000), 0, nullptr), -1);
}

TEST_F(CAbi, CublasWorkspaceComesFromTheAllocator) {
  cublasHandle_t handle = nullptr;
  ASSERT_EQ(cublasCreate(&handle), CUBLAS_STATUS_SUCCESS);
  void* workspace = nullptr;
  const int64_t before = Stats().allocated_bytes;
  ASSERT_EQ(headroom_cublas_set_workspace(handle, 4 << 20, 0, nullptr, &workspace), 0) << headroom_last_error();
  EXPECT_EQ(Stats().allocated_bytes, before + (4 << 20));
  ASSERT_EQ(cublasDestroy(handle), CUBLAS_STATUS_SUCCESS);
  headroom_free(workspace, 4 << 20, 0, nullptr);
}

}  // namespace

// The DeviceBackend conformance suite and the caching allocator on a real
// GPU. Every test skips when no device is visible.
#include "allocator/cuda/cuda_backend.h"

#include <cuda_runtime_api.h>

#include <vector>

#include "allocator/caching_allocator.h"
#include "allocator/cuda/cuda_device.h"
#include "common/units.h"
#include "gtest/gtest.h"
#include "tests/allocator/backend_conformance.h"

namespace headroom::testing {
namespace {

struct CudaFactory {
  static absl::StatusOr<std::unique_ptr<DeviceBackend>> Make() {
    auto backend = cuda::CudaBackend::Create(0);
    if (!backend.ok()) return backend.status();
    return std::unique_ptr<DeviceBackend>(std::move(*backend));
  }
  static const char* SkipReason() { return cuda::CudaDeviceCount() == 0 ? "no CUDA device visible" : nullptr; }
};
INSTANTIATE_TYPED_TEST_SUITE_P(Cuda, BackendConformance, CudaFactory);

class CudaAllocator : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override {
    if (cuda::CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device visible";
    auto backend = cuda::CudaBackend::Create(0);
    ASSERT_TRUE(backend.ok()) << backend.status();
    backend_ = *std::move(backend);
    if (GetParam() && !backend_->properties().supports_virtual_memory) GTEST_SKIP() << "no VMM support";
    auto allocator = CachingAllocator::Create(backend_.get(), {.expandable_segments = GetParam()});
    ASSERT_TRUE(allocator.ok()) << allocator.status();
    allocator_ = *std::move(allocator);
  }
  std::unique_ptr<cuda::CudaBackend> backend_;
  std::unique_ptr<CachingAllocator> allocator_;
};

TEST_P(CudaAllocator, MemoryIsUsableAndDistinct) {
  std::vector<DeviceAddress> blocks;
  for (uint64_t size : {uint64_t{1000}, 3 * kMiB, 25 * kMiB, 512 * kKiB}) {
    auto p = allocator_->Allocate(size);
    ASSERT_TRUE(p.ok()) << p.status();
    void* ptr = reinterpret_cast<void*>(static_cast<uintptr_t>(*p));
    ASSERT_EQ(cudaMemset(ptr, static_cast<int>(blocks.size() + 1), size), cudaSuccess);
    blocks.push_back(*p);
  }
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  unsigned char first = 0;
  ASSERT_EQ(cudaMemcpy(&first, reinterpret_cast<void*>(static_cast<uintptr_t>(blocks[1])), 1, cudaMemcpyDeviceToHost),
            cudaSuccess);
  EXPECT_EQ(first, 2);
  ASSERT_TRUE(allocator_->Validate().ok());
  for (DeviceAddress p : blocks) ASSERT_TRUE(allocator_->Free(p).ok());
  ASSERT_TRUE(allocator_->EmptyCache().ok());
  EXPECT_EQ(allocator_->GetStats().reserved_bytes[kAllPools].current, 0);
}

TEST_P(CudaAllocator, RecordStreamDefersReuse) {
  auto stream = backend_->CreateStream();
  ASSERT_TRUE(stream.ok());
  auto p = allocator_->Allocate(4 * kMiB);
  ASSERT_TRUE(p.ok());
  ASSERT_TRUE(allocator_->RecordStream(*p, *stream).ok());
  ASSERT_TRUE(allocator_->Free(*p).ok());
  ASSERT_TRUE(backend_->SynchronizeStream(*stream).ok());
  auto q = allocator_->Allocate(4 * kMiB);
  ASSERT_TRUE(q.ok());
  EXPECT_EQ(*q, *p);  // the event completed, so the block was reused
  ASSERT_TRUE(allocator_->Free(*q).ok());
  ASSERT_TRUE(allocator_->Validate().ok());
  allocator_.reset();
  ASSERT_TRUE(backend_->DestroyStream(*stream).ok());
}

TEST_P(CudaAllocator, OutOfMemoryIsResourceExhausted) {
  const uint64_t total = backend_->properties().total_bytes;
  auto r = allocator_->Allocate(total * 2);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kResourceExhausted) << r.status();
  EXPECT_TRUE(allocator_->Allocate(kMiB).ok());
}

INSTANTIATE_TEST_SUITE_P(Segments, CudaAllocator, ::testing::Values(false, true),
                         [](const ::testing::TestParamInfo<bool>& p) { return p.param ? "expandable" : "plain"; });

// Note [Stitched blocks] on the GPU: under a 6 MiB limit, four 1 MiB blocks
// and a 2 MiB one fill three pages; with the first and the fourth freed, a
// 2 MiB request is stitched from the tail of page 1 and the head of page 0,
// and what a kernel writes through it shows at the pieces' own addresses.
TEST(CudaStitchedBlocks, ShowTheBytesOfTheirPieces) {
  if (cuda::CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device visible";
  auto backend = cuda::CudaBackend::Create(0);
  ASSERT_TRUE(backend.ok()) << backend.status();
  if (!(*backend)->properties().supports_virtual_memory) GTEST_SKIP() << "no VMM support";
  if ((*backend)->properties().map_granularity != 2 * kMiB) GTEST_SKIP() << "the layout assumes 2 MiB pages";
  auto allocator = CachingAllocator::Create(backend->get(), {.expandable_segments = true,
                                                             .expandable_large_page_bytes = 2 * kMiB,
                                                             .hard_limit_bytes = 6 * kMiB,
                                                             .unified_pool = true,
                                                             .stitch_pages = true});
  ASSERT_TRUE(allocator.ok()) << allocator.status();
  CachingAllocator& a = **allocator;
  std::vector<DeviceAddress> blocks;
  for (uint64_t size : {kMiB, kMiB, kMiB, kMiB, 2 * kMiB}) blocks.push_back(*a.Allocate(size));
  ASSERT_TRUE(a.Free(blocks[0]).ok());
  ASSERT_TRUE(a.Free(blocks[3]).ok());
  auto stitched = a.Allocate(2 * kMiB);
  ASSERT_TRUE(stitched.ok()) << stitched.status();
  EXPECT_EQ(a.GetStats().num_stitched_blocks, 1);
  auto ptr = [](DeviceAddress address) { return reinterpret_cast<void*>(static_cast<uintptr_t>(address)); };
  ASSERT_EQ(cudaMemset(ptr(*stitched), 0x71, kMiB), cudaSuccess);
  ASSERT_EQ(cudaMemset(ptr(*stitched + kMiB), 0x72, kMiB), cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  std::vector<unsigned char> tail(kMiB), head(kMiB);
  ASSERT_EQ(cudaMemcpy(tail.data(), ptr(blocks[3]), kMiB, cudaMemcpyDeviceToHost), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(head.data(), ptr(blocks[0]), kMiB, cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(tail, std::vector<unsigned char>(kMiB, 0x71));
  EXPECT_EQ(head, std::vector<unsigned char>(kMiB, 0x72));
  ASSERT_TRUE(a.Free(*stitched).ok());
  for (size_t i : {1, 2, 4}) ASSERT_TRUE(a.Free(blocks[i]).ok());
  ASSERT_TRUE(a.EmptyCache().ok());
  ASSERT_TRUE(a.Validate().ok());
  EXPECT_EQ(a.GetStats().reserved_bytes[kAllPools].current, 0);
}

}  // namespace
}  // namespace headroom::testing

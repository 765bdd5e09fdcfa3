// Headroom's caching allocator on a real GPU, next to the CUDA allocators it
// replaces, in the same run: cudaMalloc/cudaFree and the stream-ordered pool
// (cudaMallocAsync/cudaFreeAsync with a pool that keeps its memory).
//
//   BM_Headroom_Pair/bytes:N           cached allocate+free on one stream
//   BM_Baseline_CudaMallocFree/bytes:N cudaMalloc + cudaFree
//   BM_Baseline_CudaMallocAsync/bytes:N cudaMallocAsync + cudaFreeAsync
//   BM_Headroom_Replay/expandable:E    the transformer trace
//                                      (bench/transformer_trace.h) on the
//                                      device: events/s and peak reserved /
//                                      peak live
//   BM_Baseline_CudaMallocAsyncReplay  the same trace through the CUDA pool;
//                                      its reserved high-water mark
//
// Needs a GPU and its driver (the binary links libcuda). Where no device is
// visible every benchmark reports "no CUDA device" and nothing is measured.
#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_format.h"
#include "allocator/caching_allocator.h"
#include "allocator/cuda/cuda_backend.h"
#include "allocator/cuda/cuda_device.h"
#include "bench/transformer_trace.h"
#include "benchmark/benchmark.h"
#include "common/units.h"

namespace headroom {
namespace {

bool NoDevice(benchmark::State& state) {
  if (cuda::CudaDeviceCount() > 0) return false;
  state.SkipWithError("no CUDA device");
  return true;
}

bool CudaFailed(benchmark::State& state, cudaError_t error, const char* what) {
  if (error == cudaSuccess) return false;
  state.SkipWithError(absl::StrFormat("%s: %s", what, cudaGetErrorName(error)).c_str());
  return true;
}

struct GpuAllocator {
  std::unique_ptr<cuda::CudaBackend> device;
  std::unique_ptr<CachingAllocator> allocator;
};

// A fresh allocator over device 0; `error` says why there is none.
GpuAllocator MakeGpuAllocator(AllocatorOptions options, std::string* error) {
  GpuAllocator gpu;
  absl::StatusOr<std::unique_ptr<cuda::CudaBackend>> device = cuda::CudaBackend::Create(0);
  if (!device.ok()) {
    *error = std::string(device.status().message());
    return gpu;
  }
  gpu.device = *std::move(device);
  absl::StatusOr<std::unique_ptr<CachingAllocator>> allocator = CachingAllocator::Create(gpu.device.get(), options);
  if (!allocator.ok()) {
    *error = std::string(allocator.status().message());
    gpu.device.reset();
    return gpu;
  }
  gpu.allocator = *std::move(allocator);
  return gpu;
}

void BM_Headroom_Pair(benchmark::State& state) {
  if (NoDevice(state)) return;
  std::string error;
  GpuAllocator gpu = MakeGpuAllocator({}, &error);
  if (gpu.allocator == nullptr) return state.SkipWithError(error.c_str());
  const auto bytes = static_cast<uint64_t>(state.range(0));
  // The first allocation creates the segment; the loop measures the cache.
  absl::StatusOr<DeviceAddress> warm = gpu.allocator->Allocate(bytes);
  if (!warm.ok() || !gpu.allocator->Free(*warm).ok()) return state.SkipWithError("warm-up allocation failed");
  for (auto _ : state) {
    DeviceAddress p = *gpu.allocator->Allocate(bytes);
    benchmark::DoNotOptimize(p);
    (void)gpu.allocator->Free(p);
  }
}

void BM_Baseline_CudaMallocFree(benchmark::State& state) {
  if (NoDevice(state)) return;
  const auto bytes = static_cast<size_t>(state.range(0));
  for (auto _ : state) {
    void* p = nullptr;
    if (CudaFailed(state, cudaMalloc(&p, bytes), "cudaMalloc")) return;
    benchmark::DoNotOptimize(p);
    if (CudaFailed(state, cudaFree(p), "cudaFree")) return;
  }
}

// The device's default memory pool, set to keep what it holds across
// synchronizations (as a caching allocator does), with its high-water mark
// reset.
cudaError_t PreparePool(cudaMemPool_t* pool) {
  cudaError_t error = cudaDeviceGetDefaultMemPool(pool, 0);
  if (error != cudaSuccess) return error;
  uint64_t keep_all = UINT64_MAX;
  error = cudaMemPoolSetAttribute(*pool, cudaMemPoolAttrReleaseThreshold, &keep_all);
  if (error != cudaSuccess) return error;
  uint64_t zero = 0;
  return cudaMemPoolSetAttribute(*pool, cudaMemPoolAttrReservedMemHigh, &zero);
}

void BM_Baseline_CudaMallocAsync(benchmark::State& state) {
  if (NoDevice(state)) return;
  const auto bytes = static_cast<size_t>(state.range(0));
  cudaMemPool_t pool = nullptr;
  cudaStream_t stream = nullptr;
  if (CudaFailed(state, PreparePool(&pool), "default memory pool")) return;
  if (CudaFailed(state, cudaStreamCreate(&stream), "cudaStreamCreate")) return;
  for (auto _ : state) {
    void* p = nullptr;
    if (CudaFailed(state, cudaMallocAsync(&p, bytes, stream), "cudaMallocAsync")) break;
    benchmark::DoNotOptimize(p);
    if (CudaFailed(state, cudaFreeAsync(p, stream), "cudaFreeAsync")) break;
  }
  (void)cudaStreamSynchronize(stream);
  (void)cudaStreamDestroy(stream);
  (void)cudaMemPoolTrimTo(pool, 0);
}

#define HEADROOM_PAIR_SIZES ArgName("bytes")->Arg(4 * kKiB)->Arg(kMiB)->Arg(64 * kMiB)
BENCHMARK(BM_Headroom_Pair)->HEADROOM_PAIR_SIZES;
BENCHMARK(BM_Baseline_CudaMallocFree)->HEADROOM_PAIR_SIZES;
BENCHMARK(BM_Baseline_CudaMallocAsync)->HEADROOM_PAIR_SIZES;

void SetReplayCounters(benchmark::State& state, size_t events, uint64_t peak_live, uint64_t peak_reserved) {
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations() * events));
  state.counters["peak_live_GiB"] = static_cast<double>(peak_live) / static_cast<double>(kGiB);
  state.counters["peak_reserved_GiB"] = static_cast<double>(peak_reserved) / static_cast<double>(kGiB);
  state.counters["reserved_over_live"] = static_cast<double>(peak_reserved) / static_cast<double>(peak_live);
}

void BM_Headroom_Replay(benchmark::State& state) {
  if (NoDevice(state)) return;
  const AllocationTrace trace = bench::TransformerTrace(16);
  uint64_t peak_reserved = 0;
  for (auto _ : state) {
    std::string error;
    GpuAllocator gpu = MakeGpuAllocator({.expandable_segments = state.range(0) != 0}, &error);
    if (gpu.allocator == nullptr) return state.SkipWithError(error.c_str());
    absl::flat_hash_map<uint64_t, DeviceAddress> live;
    for (const TraceEvent& e : trace.events) {
      if (e.op == TraceOp::kAllocate) {
        absl::StatusOr<DeviceAddress> p = gpu.allocator->Allocate(e.size);
        if (!p.ok()) return state.SkipWithError(std::string(p.status().message()).c_str());
        live[e.pointer] = *p;
      } else if (e.op == TraceOp::kFree) {
        (void)gpu.allocator->Free(live[e.pointer]);
        live.erase(e.pointer);
      }
    }
    peak_reserved = static_cast<uint64_t>(gpu.allocator->PeakReservedBytes());
  }
  SetReplayCounters(state, trace.events.size(), bench::PeakLive(trace), peak_reserved);
}
BENCHMARK(BM_Headroom_Replay)->ArgName("expandable")->Arg(0)->Arg(1)->Iterations(3)->Unit(benchmark::kMillisecond);

void BM_Baseline_CudaMallocAsyncReplay(benchmark::State& state) {
  if (NoDevice(state)) return;
  const AllocationTrace trace = bench::TransformerTrace(16);
  cudaMemPool_t pool = nullptr;
  cudaStream_t stream = nullptr;
  if (CudaFailed(state, PreparePool(&pool), "default memory pool")) return;
  if (CudaFailed(state, cudaStreamCreate(&stream), "cudaStreamCreate")) return;
  uint64_t peak_reserved = 0;
  bool failed = false;
  for (auto _ : state) {
    absl::flat_hash_map<uint64_t, void*> live;
    for (const TraceEvent& e : trace.events) {
      if (e.op == TraceOp::kAllocate) {
        void* p = nullptr;
        failed = CudaFailed(state, cudaMallocAsync(&p, e.size, stream), "cudaMallocAsync");
        if (failed) break;
        live[e.pointer] = p;
      } else if (e.op == TraceOp::kFree) {
        (void)cudaFreeAsync(live[e.pointer], stream);
        live.erase(e.pointer);
      }
    }
    for (const auto& [pointer, p] : live) (void)cudaFreeAsync(p, stream);
    (void)cudaStreamSynchronize(stream);
    (void)cudaMemPoolGetAttribute(pool, cudaMemPoolAttrReservedMemHigh, &peak_reserved);
    (void)cudaMemPoolTrimTo(pool, 0);
    uint64_t zero = 0;
    (void)cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReservedMemHigh, &zero);
    if (failed) break;
  }
  (void)cudaStreamDestroy(stream);
  if (failed) return;
  SetReplayCounters(state, trace.events.size(), bench::PeakLive(trace), peak_reserved);
}
BENCHMARK(BM_Baseline_CudaMallocAsyncReplay)->Iterations(3)->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace headroom

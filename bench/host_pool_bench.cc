// The executor's host pool (executor/host_pool.h, mimalloc arenas over one
// region) against malloc, the baseline in the same run, on the pattern an
// offload plan makes: a forward pass's worth of activation-sized host copies
// allocated and written in order, then read back and freed in reverse order
// during backward.
//
//   BM_HostPool/write:W      the pool; W=1 also writes every byte (the copy)
//   BM_Baseline_Malloc/write:W   glibc malloc/free of the same sizes
// Sizes are log-uniform in [256 KiB, 16 MiB], 48 per step (~200 MiB live at
// the peak). malloc serves sizes this large with fresh mmaps (beyond
// M_MMAP_THRESHOLD), so each write faults its pages in; the pool's pages
// stay committed from one step to the next, as pinned memory must.
#include <cstdlib>
#include <cstring>
#include <vector>

#include "bench/host_copy_sizes.h"
#include "benchmark/benchmark.h"
#include "executor/host_pool.h"

namespace headroom {
namespace {

constexpr uint64_t kMiB = uint64_t{1} << 20;

template <typename Allocate, typename Free>
void Step(const std::vector<uint64_t>& sizes, bool write, std::vector<void*>& held, Allocate allocate, Free free) {
  held.clear();
  for (uint64_t s : sizes) {
    void* p = allocate(s);
    if (write) std::memset(p, 1, s);
    held.push_back(p);
  }
  for (size_t i = held.size(); i-- > 0;) free(held[i]);
}

void Report(benchmark::State& state, const std::vector<uint64_t>& sizes) {
  uint64_t bytes = 0;
  for (uint64_t s : sizes) bytes += s;
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations() * sizes.size()));
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * bytes));
}

void BM_HostPool(benchmark::State& state) {
  const bool write = state.range(0) != 0;
  const std::vector<uint64_t> sizes = HostCopySizes();
  auto pool = *HostPool::Create(512 * kMiB);
  std::vector<void*> held;
  for (auto _ : state) {
    Step(sizes, write, held, [&](uint64_t s) { return *pool->Allocate(s); }, [&](void* p) { (void)pool->Free(p); });
  }
  Report(state, sizes);
  state.counters["peak_MiB"] = static_cast<double>(pool->stats().peak_bytes) / kMiB;
}
BENCHMARK(BM_HostPool)->ArgName("write")->Arg(0)->Arg(1)->Repetitions(3)->DisplayAggregatesOnly();

void BM_Baseline_Malloc(benchmark::State& state) {
  const bool write = state.range(0) != 0;
  const std::vector<uint64_t> sizes = HostCopySizes();
  std::vector<void*> held;
  for (auto _ : state) {
    Step(sizes, write, held, [](uint64_t s) { return std::malloc(s); }, [](void* p) { std::free(p); });
  }
  Report(state, sizes);
}
BENCHMARK(BM_Baseline_Malloc)->ArgName("write")->Arg(0)->Arg(1)->Repetitions(3)->DisplayAggregatesOnly();

}  // namespace
}  // namespace headroom

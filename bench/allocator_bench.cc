// Caching allocator hot paths on the simulated device, each next to a
// mimalloc baseline over the same size sequence in the same run.
//
//   BM_CachedPair/free_blocks:N    one Allocate + Free with N cached blocks in
//                                  the pool (best-fit search over N)
//   BM_RandomAllocations/ops:N     RMM-style random allocate/free mix, mixed
//                                  sizes, 1 and 2 threads on one allocator,
//                                  each thread on a stream of its own
//   BM_Baseline_AllocatorPerThread the same with an allocator per thread:
//                                  what sharding can give at most
//   BM_Baseline_SharedCacheLine    the machine's own limit on thread scaling
#include <mimalloc.h>

#include <atomic>
#include <memory>
#include <random>
#include <vector>

#include "allocator/caching_allocator.h"
#include "allocator/simulated/simulated_backend.h"
#include "benchmark/benchmark.h"
#include "common/units.h"

namespace headroom {
namespace {

struct Fixture {
  std::unique_ptr<SimulatedBackend> device;
  std::unique_ptr<CachingAllocator> allocator;
};

Fixture MakeFixture() {
  Fixture f;
  f.device = *SimulatedBackend::Create({.capacity_bytes = uint64_t{1} << 40});
  f.allocator = *CachingAllocator::Create(f.device.get(), {});
  return f;
}

std::vector<uint64_t> SmallSizes(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<uint64_t> sizes(n);
  for (uint64_t& s : sizes) s = 512 + rng() % (16 * kKiB);
  return sizes;
}

void BM_CachedPair(benchmark::State& state) {
  const auto free_blocks = static_cast<size_t>(state.range(0));
  Fixture f = MakeFixture();
  // Allocate 2N blocks, then free every other one: N isolated cached blocks.
  const std::vector<uint64_t> setup = SmallSizes(2 * free_blocks, 1);
  std::vector<DeviceAddress> all;
  for (uint64_t size : setup) all.push_back(*f.allocator->Allocate(size));
  for (size_t i = 1; i < all.size(); i += 2) (void)f.allocator->Free(all[i]);
  const std::vector<uint64_t> sizes = SmallSizes(256, 2);
  size_t i = 0;
  for (auto _ : state) {
    DeviceAddress p = *f.allocator->Allocate(sizes[i++ & 255]);
    benchmark::DoNotOptimize(p);
    (void)f.allocator->Free(p);
  }
  state.counters["cached_blocks"] = static_cast<double>(f.allocator->GetStats().inactive_split[kAllPools].current);
}
BENCHMARK(BM_CachedPair)->ArgName("free_blocks")->Arg(0)->Arg(4096)->Arg(65536)->Repetitions(5)->DisplayAggregatesOnly();

void BM_Baseline_MimallocPair(benchmark::State& state) {
  const std::vector<uint64_t> sizes = SmallSizes(256, 2);
  size_t i = 0;
  for (auto _ : state) {
    void* p = mi_malloc(sizes[i++ & 255]);
    benchmark::DoNotOptimize(p);
    mi_free(p);
  }
}
BENCHMARK(BM_Baseline_MimallocPair)->Repetitions(5)->DisplayAggregatesOnly();

// RMM's random_allocations benchmark shape: each op allocates (size uniform
// in [1, max]) or frees a random live allocation, half and half; whatever is
// live at the end is freed. Sizes mixed: 3/4 small (<= 1 MiB), 1/4 large.
struct Op {
  bool allocate;
  uint64_t size_or_index;
};

std::vector<Op> RandomOps(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<Op> ops;
  size_t live = 0;
  for (size_t i = 0; i < n; ++i) {
    if (live == 0 || rng() % 2 == 0) {
      const uint64_t size = rng() % 4 == 0 ? 1 + rng() % (64 * kMiB) : 1 + rng() % kMiB;
      ops.push_back({true, size});
      ++live;
    } else {
      ops.push_back({false, rng() % live});
      --live;
    }
  }
  return ops;
}

// One allocator for every thread, and a stream of its own for each thread.
struct SharedFixture {
  Fixture fixture = MakeFixture();
  std::vector<StreamHandle> streams;
  SharedFixture() {
    for (int i = 0; i < 2; ++i) streams.push_back(*fixture.device->CreateStream());
  }
};

SharedFixture& Shared() {
  static auto* shared = new SharedFixture();
  return *shared;
}

// One benchmark iteration of `ops` on `allocator`, allocating on `stream`;
// whatever is live at the end is freed.
void RunOps(const std::vector<Op>& ops, CachingAllocator& allocator, StreamHandle stream,
            std::vector<DeviceAddress>& live) {
  for (const Op& op : ops) {
    if (op.allocate) {
      live.push_back(*allocator.Allocate(op.size_or_index, stream));
    } else {
      (void)allocator.Free(live[op.size_or_index]);
      live[op.size_or_index] = live.back();
      live.pop_back();
    }
  }
  for (DeviceAddress p : live) (void)allocator.Free(p);
  live.clear();
}

void BM_RandomAllocations(benchmark::State& state) {
  const std::vector<Op> ops = RandomOps(static_cast<size_t>(state.range(0)), 42 + state.thread_index());
  CachingAllocator* allocator = Shared().fixture.allocator.get();
  const StreamHandle stream = Shared().streams[static_cast<size_t>(state.thread_index())];
  std::vector<DeviceAddress> live;
  live.reserve(ops.size());
  for (auto _ : state) RunOps(ops, *allocator, stream, live);
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations() * ops.size()));
}
BENCHMARK(BM_RandomAllocations)->ArgName("ops")->Arg(1000)->Arg(10000)->Arg(100000)->Threads(1)->Threads(2)
    ->UseRealTime();

// The most sharding can give: each thread with an allocator (and a device)
// of its own, so that nothing at all is shared.
void BM_Baseline_AllocatorPerThread(benchmark::State& state) {
  const std::vector<Op> ops = RandomOps(static_cast<size_t>(state.range(0)), 42 + state.thread_index());
  Fixture own = MakeFixture();
  std::vector<DeviceAddress> live;
  live.reserve(ops.size());
  for (auto _ : state) RunOps(ops, *own.allocator, kDefaultStream, live);
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations() * ops.size()));
}
BENCHMARK(BM_Baseline_AllocatorPerThread)->ArgName("ops")->Arg(1000)->Arg(10000)->Arg(100000)->Threads(1)
    ->Threads(2)->UseRealTime();

void BM_Baseline_MimallocRandomAllocations(benchmark::State& state) {
  const std::vector<Op> ops = RandomOps(static_cast<size_t>(state.range(0)), 42 + state.thread_index());
  std::vector<void*> live;
  live.reserve(ops.size());
  for (auto _ : state) {
    for (const Op& op : ops) {
      if (op.allocate) {
        live.push_back(mi_malloc(op.size_or_index));
      } else {
        mi_free(live[op.size_or_index]);
        live[op.size_or_index] = live.back();
        live.pop_back();
      }
    }
    for (void* p : live) mi_free(p);
    live.clear();
  }
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations() * ops.size()));
}
BENCHMARK(BM_Baseline_MimallocRandomAllocations)->ArgName("ops")->Arg(1000)->Arg(10000)->Arg(100000)->Threads(1)
    ->Threads(2)->UseRealTime();

// What threads can gain at all on this machine: each operation is a fixed
// amount of private work, and (shared:1) one write to a cache line the
// other thread writes too, as a lock, a statistic or a shared table does.
// With shared:0, two threads should reach twice one thread's operations/s.
void BM_Baseline_SharedCacheLine(benchmark::State& state) {
  static std::atomic<int64_t> shared_counter{0};
  const bool shared = state.range(0) != 0;
  uint64_t x = static_cast<uint64_t>(state.thread_index()) + 1;
  for (auto _ : state) {
    for (int i = 0; i < 40; ++i) x = x * 6364136223846793005u + 1442695040888963407u;  // ~40 ns of work
    if (shared) shared_counter.fetch_add(1, std::memory_order_relaxed);
    benchmark::DoNotOptimize(x);
  }
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations()));
}
BENCHMARK(BM_Baseline_SharedCacheLine)->ArgName("shared")->Arg(0)->Arg(1)->Threads(1)->Threads(2)->UseRealTime();

}  // namespace
}  // namespace headroom

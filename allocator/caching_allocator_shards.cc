// The stream shards' slow side (Note [Stream shards]): creating a shard,
// walking every shard under the exclusive lock, sharing out the budgets that
// keep the statistics exact while shards run apart (Note [Peak budgets]).
// The fast path's side (the exclusive lock, the thread's hint, the budget
// checks) is in caching_allocator.cc, inlined there.
#include <algorithm>
#include <cmath>
#include <vector>

#include "allocator/caching_allocator.h"

namespace headroom {
CachingAllocator::StreamShard& CachingAllocator::NewShard(StreamHandle stream) const {
  // Only the exclusive lock gets here: the fast path starts from a shard that exists.
  auto* shard = new StreamShard();
  shard->mu.Lock();  // held like every other shard's, until the exclusive lock ends
  shards_[ShardIndex(stream)].store(shard, std::memory_order_release);
  shard_list_.push_back(shard);
  return *shard;
}

std::vector<StreamHandle> CachingAllocator::CachedStreams(PoolKind kind) const {
  std::vector<StreamHandle> streams;
  for (const StreamShard* shard : Shards()) {
    for (StreamHandle stream : shard->Pool(kind).Streams()) streams.push_back(stream);
  }
  std::sort(streams.begin(), streams.end());
  return streams;
}

void CachingAllocator::ForEachCached(PoolKind kind, absl::FunctionRef<void(Block*)> fn) const {
  for (StreamHandle stream : CachedStreams(kind)) PoolOf(kind, stream).ForEachOfStream(stream, fn);
}

uint64_t CachingAllocator::LargestCachedSize() const {
  uint64_t largest = 0;
  for (const StreamShard* shard : Shards()) {
    largest = std::max({largest, shard->small_pool.LargestSize(), shard->large_pool.LargestSize()});
  }
  return std::max(largest, planned_.LargestFreeRun());
}

CachingAllocator::Block* CachingAllocator::FindAllocated(DeviceAddress address) const {
  for (const StreamShard* shard : Shards()) {
    if (Block* block = shard->pointers.Find(address)) return block;
  }
  return nullptr;
}

void CachingAllocator::AddShardStats() const {
  for (StreamShard* shard : Shards()) stats_.AddShard(shard->stats);
}

void CachingAllocator::SetShardBudgets() const {
  if (StatsDirect()) return;
  const auto budget = stats_.Budget(Shards().size());
  for (StreamShard* shard : Shards()) shard->stats.SetBudget(budget);
}


}  // namespace headroom

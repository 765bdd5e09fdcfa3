// Address -> allocated block, sharded so that lookups from many threads do
// not serialize on the allocator's lock.
//
//   PointerMap map;
//   map.Insert(block->address, block);
//   Block* b = map.Remove(address);   // nullptr if not allocated here
//
// Note [Sharded pointer map]: free(), record_stream() and size queries start
// from a bare pointer. Resolving it under the allocator's one lock would put
// every thread's lookups in one queue; instead 64 shards, each a hash map
// with its own spin lock (held for one hash-table operation), are chosen by a
// hash of the address. Only the pool
// operations that follow take the allocator lock. Lock order: the allocator
// lock may be held while a shard lock is taken, never the reverse.
#ifndef HEADROOM_ALLOCATOR_POINTER_MAP_H_
#define HEADROOM_ALLOCATOR_POINTER_MAP_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "allocator/annotated_mutex.h"
#include "allocator/block.h"

namespace headroom::internal {

class PointerMap {
 public:
  void Insert(DeviceAddress address, Block* block) {
    Shard& shard = ShardFor(address);
    SpinLockHolder lock(&shard.mu);
    shard.blocks[address] = block;
  }

  // Removes and returns the block at `address`, or nullptr.
  Block* Remove(DeviceAddress address) {
    Shard& shard = ShardFor(address);
    SpinLockHolder lock(&shard.mu);
    auto it = shard.blocks.find(address);
    if (it == shard.blocks.end()) return nullptr;
    Block* block = it->second;
    shard.blocks.erase(it);
    return block;
  }

  // Calls `fn` with the block at `address` (nullptr if none) under the shard
  // lock, so the block cannot be freed meanwhile.
  template <typename Fn>
  auto With(DeviceAddress address, Fn&& fn) {
    Shard& shard = ShardFor(address);
    SpinLockHolder lock(&shard.mu);
    auto it = shard.blocks.find(address);
    return fn(it == shard.blocks.end() ? nullptr : it->second);
  }

  size_t Size() const {
    size_t total = 0;
    for (const Shard& shard : shards_) {
      SpinLockHolder lock(&shard.mu);
      total += shard.blocks.size();
    }
    return total;
  }

  void ForEach(const std::function<void(DeviceAddress, Block*)>& fn) const {
    for (const Shard& shard : shards_) {
      SpinLockHolder lock(&shard.mu);
      for (const auto& [address, block] : shard.blocks) fn(address, block);
    }
  }

 private:
  static constexpr size_t kShards = 64;
  struct alignas(64) Shard {
    mutable SpinLock mu;
    absl::flat_hash_map<DeviceAddress, Block*> blocks ABSL_GUARDED_BY(mu);
  };

  Shard& ShardFor(DeviceAddress address) {
    // Blocks are 512-byte aligned: drop those bits, then mix.
    const uint64_t h = (address >> 9) * 0x9E3779B97F4A7C15ull;
    return shards_[h >> 58];
  }

  std::array<Shard, kShards> shards_;
};

}  // namespace headroom::internal

#endif  // HEADROOM_ALLOCATOR_POINTER_MAP_H_

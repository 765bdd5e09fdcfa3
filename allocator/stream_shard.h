// The part of the caching allocator that belongs to a set of streams and is
// guarded by a lock of its own (caching_allocator.h, Note [Stream shards]):
// their cached blocks, their allocated blocks by address, the statistics
// their fast-path calls changed (shard_stats.h), and spare Block objects.
#ifndef HEADROOM_ALLOCATOR_STREAM_SHARD_H_
#define HEADROOM_ALLOCATOR_STREAM_SHARD_H_

#include <vector>

#include "allocator/address_table.h"
#include "allocator/annotated_mutex.h"
#include "allocator/block.h"
#include "allocator/block_pool.h"
#include "allocator/shard_stats.h"

namespace headroom::internal {

// Fields are guarded by `mu`, which the exclusive lock also holds; the
// annotations cannot say "or every shard's lock", so there are none.
struct alignas(64) StreamShard {
  StreamShard() = default;
  StreamShard(const StreamShard&) = delete;
  StreamShard& operator=(const StreamShard&) = delete;
  ~StreamShard() {
    small_pool.Clear();
    large_pool.Clear();
    for (Block* block : spare_blocks) delete block;
  }

  BlockPool& Pool(PoolKind kind) { return kind == PoolKind::kSmall ? small_pool : large_pool; }
  const BlockPool& Pool(PoolKind kind) const { return kind == PoolKind::kSmall ? small_pool : large_pool; }

  mutable SpinLock mu;
  BlockPool small_pool;  // cached blocks of the shard's streams
  BlockPool large_pool;
  AddressTable pointers;  // allocated blocks of the shard's streams
  ShardStats stats;       // Note [Peak budgets]
  std::vector<Block*> spare_blocks;
};

}  // namespace headroom::internal

#endif  // HEADROOM_ALLOCATOR_STREAM_SHARD_H_

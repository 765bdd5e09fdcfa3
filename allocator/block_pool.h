// The set of cached (free) blocks of one pool, searched by best fit.
//
//   BlockPool pool;
//   pool.Insert(block);
//   Block* fit = pool.BestFit(stream, 4096);  // smallest block >= 4096 on `stream`
//
// Best fit in the order (stream, size, address): the smallest block on the
// stream that holds the request, the lowest address among equal sizes, so
// that allocation is deterministic. O(log n) insert, erase and search.
//
// Layout: one B-tree whose entries hold the key inline (stream, size,
// address, block), so that a search compares integers inside the nodes
// rather than chasing a pointer into every Block it passes; with 64k cached
// blocks that pointer chase was most of an allocation's cost. (A two-level
// layout, (stream, size) -> bucket by address, measured slower: bucket maps
// are created and destroyed as sizes come and go; bench/allocator_bench.cc.)
#ifndef HEADROOM_ALLOCATOR_BLOCK_POOL_H_
#define HEADROOM_ALLOCATOR_BLOCK_POOL_H_

#include <cstddef>
#include <cstdint>
#include <iterator>
#include <utility>
#include <vector>

#include "absl/container/btree_set.h"
#include "allocator/block.h"

namespace headroom::internal {

class BlockPool {
 public:
  // The block's stream, size and address must not change while it is cached.
  void Insert(Block* block) { blocks_.insert(EntryOf(block)); }
  void Erase(Block* block) { blocks_.erase(EntryOf(block)); }
  bool Contains(const Block* block) const {
    auto it = blocks_.find(EntryOf(block));
    return it != blocks_.end() && it->block == block;
  }

  // The smallest block of at least `size` bytes on `stream` (lowest address
  // among equals), or nullptr. Not removed.
  Block* BestFit(StreamHandle stream, uint64_t size) const {
    auto it = LowerBound(stream, size);
    return it == blocks_.end() ? nullptr : it->block;
  }
  // BestFit, removed from the pool if `accept(block)`; else nullptr. One
  // search instead of BestFit + Erase.
  template <typename Accept>
  Block* TakeBestFit(StreamHandle stream, uint64_t size, Accept&& accept) {
    auto it = LowerBound(stream, size);
    if (it == blocks_.end() || !accept(it->block)) return nullptr;
    Block* block = it->block;
    blocks_.erase(it);
    return block;
  }

  // The streams that have cached blocks, ascending.
  std::vector<StreamHandle> Streams() const {
    std::vector<StreamHandle> streams;
    for (auto it = blocks_.begin(); it != blocks_.end();) {
      streams.push_back(StreamHandle{it->stream});
      if (it->stream == UINT64_MAX) break;
      it = blocks_.lower_bound(Entry{it->stream + 1, 0, 0, nullptr});
    }
    return streams;
  }

  // O(number of streams).
  uint64_t LargestSize() const {
    uint64_t largest = 0;
    for (StreamHandle stream : Streams()) {
      auto next = stream.value == UINT64_MAX ? blocks_.end()
                                             : blocks_.lower_bound(Entry{stream.value + 1, 0, 0, nullptr});
      largest = std::max(largest, std::prev(next)->size);
    }
    return largest;
  }

  // Calls fn(Block*) for every cached block, by (stream, size, address). fn
  // must not modify the pool.
  template <typename Fn>
  void ForEach(Fn&& fn) const {
    for (const Entry& entry : blocks_) fn(entry.block);
  }

  size_t size() const { return blocks_.size(); }
  bool empty() const { return blocks_.empty(); }

  // Incremented on each lookup that misses, so that ages of cached blocks can
  // be compared (garbage collection frees the oldest first).
  uint64_t lookups = 0;

 private:
  struct Entry {
    uint64_t stream;
    uint64_t size;
    DeviceAddress address;
    Block* block;
  };
  struct EntryLess {
    bool operator()(const Entry& a, const Entry& b) const {
      if (a.stream != b.stream) return a.stream < b.stream;
      if (a.size != b.size) return a.size < b.size;
      return a.address < b.address;
    }
  };
  using Set = absl::btree_set<Entry, EntryLess>;

  static Entry EntryOf(const Block* block) {
    return {block->stream.value, block->size, block->address, const_cast<Block*>(block)};
  }
  Set::const_iterator LowerBound(StreamHandle stream, uint64_t size) const {
    auto it = blocks_.lower_bound(Entry{stream.value, size, 0, nullptr});
    if (it != blocks_.end() && it->stream != stream.value) return blocks_.end();
    return it;
  }

  Set blocks_;
};

}  // namespace headroom::internal

#endif  // HEADROOM_ALLOCATOR_BLOCK_POOL_H_

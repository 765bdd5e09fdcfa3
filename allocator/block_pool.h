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
// The tree always ends in a sentinel entry (Note [Pool sentinel]) and keeps
// the position of the last operation (Note [Pool position hint]).
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
  BlockPool() { hint_ = blocks_.insert(kSentinel).first; }
  BlockPool(const BlockPool&) = delete;
  BlockPool& operator=(const BlockPool&) = delete;

  void Insert(Block* block) { hint_ = blocks_.insert(hint_, EntryOf(block)); }
  void Erase(Block* block) { hint_ = blocks_.erase(Locate(block)); }
  // Puts `now` in the place of the cached `old`, in one step when the order
  // allows (Note [Pool position hint]).
  void Replace(Block* old, Block* now) {
    const Set::iterator it = Locate(old);
    const Entry entry = EntryOf(now);
    if ((it == blocks_.begin() || EntryLess()(*std::prev(it), entry)) && EntryLess()(entry, *std::next(it))) {
      // The key stays between its neighbours, so the tree stays ordered.
      const_cast<Entry&>(*it) = entry;
      hint_ = it;
      return;
    }
    hint_ = blocks_.insert(blocks_.erase(it), entry);
  }
  bool Contains(const Block* block) const {
    auto it = blocks_.find(EntryOf(block));
    return it != blocks_.end() && it->block == block;
  }

  // The smallest block of at least `size` bytes on `stream` (lowest address
  // among equals), or nullptr. Not removed.
  Block* BestFit(StreamHandle stream, uint64_t size) {
    auto it = blocks_.lower_bound(Entry{stream.value, size, 0, nullptr});
    hint_ = it;
    return it->stream != stream.value ? nullptr : it->block;  // the sentinel's block is nullptr
  }
  // BestFit, removed from the pool if `accept(block)`; else nullptr.
  template <typename Accept>
  Block* TakeBestFit(StreamHandle stream, uint64_t size, Accept&& accept) {
    Block* block = BestFit(stream, size);
    if (block == nullptr || !accept(block)) return nullptr;
    hint_ = blocks_.erase(hint_);
    return block;
  }

  // The streams that have cached blocks, ascending.
  std::vector<StreamHandle> Streams() const {
    std::vector<StreamHandle> streams;
    for (auto it = blocks_.begin(); it->block != nullptr;) {
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
      auto next = stream.value == UINT64_MAX ? std::prev(blocks_.end())
                                             : blocks_.lower_bound(Entry{stream.value + 1, 0, 0, nullptr});
      largest = std::max(largest, std::prev(next)->size);
    }
    return largest;
  }

  // Calls fn(Block*) for every cached block, by (stream, size, address). fn
  // must not modify the pool.
  template <typename Fn>
  void ForEach(Fn&& fn) const {
    for (auto it = blocks_.begin(), last = std::prev(blocks_.end()); it != last; ++it) fn(it->block);
  }

  size_t size() const { return blocks_.size() - 1; }
  bool empty() const { return size() == 0; }

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
  // absl's default 256-byte nodes. 512-byte nodes measured ~5% faster at
  // 64k cached blocks, but absl sets node sizes only through its internal
  // namespace, which a library upgrade may change; not worth the risk.
  using Set = absl::btree_set<Entry, EntryLess>;
  // Note [Pool sentinel]: an entry after every real key keeps the tree from
  // ever becoming empty; absl frees the root node of an emptied tree, and a
  // pool that holds one block between an allocate and a free (the common
  // split/coalesce cycle) would allocate and free a node on every call.
  static constexpr Entry kSentinel{UINT64_MAX, UINT64_MAX, UINT64_MAX, nullptr};

  static Entry EntryOf(const Block* block) {
    return {block->stream.value, block->size, block->address, const_cast<Block*>(block)};
  }
  // The entry of a cached block: the hint if it points there, else a search.
  Set::iterator Locate(const Block* block) {
    if (hint_->block == block) return hint_;
    return blocks_.find(EntryOf(block));
  }

  Set blocks_;
  // Note [Pool position hint]: the position of the last search or change.
  // Every change of blocks_ resets it, so it is always a valid iterator. An
  // allocate looks a block up and then erases it or replaces it with its
  // split remainder; the free that follows erases that remainder (coalescing)
  // or inserts next to where the block was. Through the hint these need no
  // second descent from the root, and a replacement that keeps the order
  // rewrites the entry in place, with no node rebalancing.
  Set::iterator hint_;
};

}  // namespace headroom::internal

#endif  // HEADROOM_ALLOCATOR_BLOCK_POOL_H_

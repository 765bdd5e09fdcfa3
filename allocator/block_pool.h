// The set of cached (free) blocks of one pool, searched by best fit.
//
//   BlockPool pool;
//   pool.Insert(block);
//   Block* fit = pool.BestFit(stream, 4096);  // smallest block >= 4096 on `stream`
//
// Best fit in the order (stream, size, address): the smallest block on the
// stream that holds the request, the lowest address among equal sizes, so
// that allocation is deterministic. Never a linear scan.
//
// Note [Size bins]
// Per stream, blocks of at most kBinnedMax bytes (all sizes are multiples of
// 512) sit in one bin per exact size, each bin ordered by address, and a
// bitmap marks the non-empty bins; larger blocks share one tree ordered by
// (size, address). Best fit for a small request is then a bitmap scan of a
// few words (the first non-empty bin at or above the request) and the lowest
// block of that bin, both O(1); a larger request descends the tree,
// O(log n). The trees are intrusive (Boost.Intrusive red-black trees whose
// links live in the Block), so caching or taking a block allocates nothing.
// Each bin also keeps its lowest block in a slot beside its tree when it can:
// taking the block empties the slot (the tree is not touched to refill it),
// and a block cached below everything in the tree goes back into the empty
// slot, so an allocate+free pair of one size does no tree operation at all.
// Measured (bench/allocator_bench.cc, BM_CachedPair, 64k cached blocks): a
// single B-tree over all blocks took 167 ns per pair, mostly its
// root-to-leaf search; bins with trees alone ~90 ns; with the slot ~75 ns.
#ifndef HEADROOM_ALLOCATOR_BLOCK_POOL_H_
#define HEADROOM_ALLOCATOR_BLOCK_POOL_H_

#include <array>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/base/attributes.h"
#include "absl/container/btree_map.h"
#include "absl/status/status.h"
#include "allocator/block.h"
#include "allocator/size_rounding.h"
#include "boost/intrusive/set.hpp"

namespace headroom::internal {

class BlockPool {
 public:
  // Blocks of up to this size are binned by exact size (Note [Size bins]):
  // every block of a 2 MiB small-pool segment, including the free rest of a
  // segment that is split and coalesced on each allocate+free.
  static constexpr uint64_t kBinnedMax = uint64_t{2} << 20;

  BlockPool() = default;
  BlockPool(const BlockPool&) = delete;
  BlockPool& operator=(const BlockPool&) = delete;
  ~BlockPool() { Clear(); }

  // Drops every block from the pool (the blocks belong to the allocator; it
  // calls this before deleting them).
  void Clear();

  // The block's stream, size and address must not change while it is cached.
  void Insert(Block* block) {
    ++size_;
    StreamBlocks& blocks = BlocksOf(block->stream.value);
    ++blocks.count;
    if (block->size > kBinnedMax) {
      blocks.large.insert(*block);
      return;
    }
    Bins& bins = blocks.BinsOrCreate();
    const size_t index = BinIndex(block->size);
    Bin& bin = bins.bins[index];
    if (bin.empty()) {
      bins.nonempty[index / 64] |= uint64_t{1} << (index % 64);
      bins.nonempty_words |= uint64_t{1} << (index / 64);
    }
    bin.Insert(block);
  }

  void Erase(Block* block) {
    --size_;
    StreamBlocks& blocks = BlocksOf(block->stream.value);
    --blocks.count;
    if (block->size > kBinnedMax) {
      blocks.large.erase(blocks.large.iterator_to(*block));
      return;
    }
    Bins& bins = *blocks.bins;
    const size_t index = BinIndex(block->size);
    Bin& bin = bins.bins[index];
    bin.Erase(block);
    if (bin.empty()) {
      uint64_t& word = bins.nonempty[index / 64];
      word &= ~(uint64_t{1} << (index % 64));
      if (word == 0) bins.nonempty_words &= ~(uint64_t{1} << (index / 64));
    }
  }

  bool Contains(const Block* block) const;

  // InternalError naming the first broken invariant of Note [Size bins]: a
  // bitmap bit (and summary bit) is set exactly for the non-empty bins; every
  // block sits under its own stream, in the bin of its size (or the tree,
  // above kBinnedMax); a bin's front is below the rest of its bin; the
  // counts match. O(blocks + bins): for tests and expensive-checks builds.
  absl::Status Validate() const;

  // The smallest block of at least `size` bytes on `stream` (lowest address
  // among equals), or nullptr. Not removed.
  Block* BestFit(StreamHandle stream, uint64_t size) {
    StreamBlocks* blocks = FindBlocks(stream.value);
    if (blocks == nullptr || blocks->count == 0) return nullptr;
    if (size <= kBinnedMax && blocks->bins != nullptr) {
      if (Block* fit = blocks->bins->FirstAtLeast(BinIndex(size))) return fit;
    }
    auto it = blocks->large.lower_bound(size, SizeAddressLess());
    return it == blocks->large.end() ? nullptr : &*it;
  }
  // The block on `stream` that holds [address, address + size), for a size
  // above kBinnedMax; else nullptr. Not removed. A linear scan of the
  // stream's blocks of at least `size` bytes: a caller asks for the large
  // sizes, of which few blocks are free at once.
  Block* Holding(StreamHandle stream, DeviceAddress address, uint64_t size) {
    StreamBlocks* blocks = FindBlocks(stream.value);
    if (blocks == nullptr || size <= kBinnedMax) return nullptr;
    for (auto it = blocks->large.lower_bound(size, SizeAddressLess()); it != blocks->large.end(); ++it) {
      if (it->address <= address && address + size <= it->address + it->size) return &*it;
    }
    return nullptr;
  }

  // The streams that have cached blocks, ascending.
  std::vector<StreamHandle> Streams() const;
  // O(number of streams).
  uint64_t LargestSize() const;

  // Calls fn(Block*) for every cached block, by (stream, size, address). fn
  // must not modify the pool.
  template <typename Fn>
  void ForEach(Fn&& fn) const {
    for (const auto& [stream, blocks] : streams_) ForEachOf(*blocks, fn);
  }
  // Calls fn(Block*) for every cached block of `stream`, by (size, address).
  template <typename Fn>
  void ForEachOfStream(StreamHandle stream, Fn&& fn) const {
    if (const StreamBlocks* blocks = FindBlocks(stream.value)) ForEachOf(*blocks, fn);
  }

  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }

 private:
  struct AddressLess {
    bool operator()(const Block& a, const Block& b) const { return a.address < b.address; }
  };
  struct SizeAddressLess {
    bool operator()(const Block& a, const Block& b) const {
      return a.size != b.size ? a.size < b.size : a.address < b.address;
    }
    // Heterogeneous lookup by size alone: before every block of that size.
    bool operator()(const Block& a, uint64_t size) const { return a.size < size; }
    bool operator()(uint64_t size, const Block& b) const { return size < b.size; }
  };
  using Hook = boost::intrusive::member_hook<Block, PoolHook, &Block::pool_hook>;
  using AddressSet = boost::intrusive::set<Block, Hook, boost::intrusive::compare<AddressLess>,
                                           boost::intrusive::constant_time_size<false>>;
  using SizeAddressSet = boost::intrusive::set<Block, Hook, boost::intrusive::compare<SizeAddressLess>,
                                               boost::intrusive::constant_time_size<false>>;

  static constexpr size_t kBinCount = kBinnedMax / kMinBlockSize;
  static constexpr size_t kWordCount = kBinCount / 64;
  static_assert(kWordCount <= 64, "one summary word must cover the bitmap");
  static size_t BinIndex(uint64_t size) { return size / kMinBlockSize - 1; }

  // The blocks of one size by address. The lowest may sit outside the tree
  // (Note [Size bins]): taking it and caching it again then touches no tree.
  struct Bin {
    Block* front = nullptr;  // if set, below every block in `rest`
    AddressSet rest;

    bool empty() const { return front == nullptr && rest.empty(); }
    Block* Lowest() { return front != nullptr ? front : &*rest.begin(); }  // not empty()
    void Insert(Block* block) {
      if (front == nullptr) {
        if (rest.empty() || block->address < rest.begin()->address) {
          front = block;
        } else {
          rest.insert(*block);
        }
      } else if (block->address < front->address) {
        rest.insert(rest.begin(), *front);  // hinted: it goes first
        front = block;
      } else {
        rest.insert(*block);
      }
    }
    void Erase(Block* block) {
      if (block == front) {
        front = nullptr;  // the next lowest stays in the tree until needed
      } else {
        rest.erase(rest.iterator_to(*block));
      }
    }
    template <typename Fn>
    void ForEach(Fn&& fn) const {
      if (front != nullptr) fn(front);
      for (const Block& block : rest) fn(const_cast<Block*>(&block));
    }
    bool Contains(const Block* block) const {
      if (block == front) return true;
      auto it = rest.find(*block);
      return it != rest.end() && &*it == block;
    }
    void Clear() {
      front = nullptr;
      rest.clear();
    }
  };

  struct Bins {
    std::array<Bin, kBinCount> bins;  // bins[i]: blocks of (i + 1) * 512 bytes
    std::array<uint64_t, kWordCount> nonempty{};  // bit i: bins[i] holds a block
    uint64_t nonempty_words = 0;                  // bit w: nonempty[w] != 0

    // The lowest block of the first non-empty bin at or above `index`.
    Block* FirstAtLeast(size_t index) {
      size_t word = index / 64;
      uint64_t bits = nonempty[word] & (~uint64_t{0} << (index % 64));
      if (bits == 0) {
        const uint64_t later_words = word + 1 < 64 ? nonempty_words & (~uint64_t{0} << (word + 1)) : 0;
        if (later_words == 0) return nullptr;
        word = static_cast<size_t>(std::countr_zero(later_words));
        bits = nonempty[word];
      }
      return bins[word * 64 + static_cast<size_t>(std::countr_zero(bits))].Lowest();
    }
  };
  struct StreamBlocks {
    size_t count = 0;
    std::unique_ptr<Bins> bins;  // created by the first binned block
    SizeAddressSet large;        // blocks above kBinnedMax

    Bins& BinsOrCreate() {
      if (bins == nullptr) bins = std::make_unique<Bins>();
      return *bins;
    }
  };

  template <typename Fn>
  static void ForEachOf(const StreamBlocks& blocks, Fn&& fn) {
    if (blocks.bins != nullptr) {
      for (const Bin& bin : blocks.bins->bins) bin.ForEach(fn);
    }
    for (const Block& block : blocks.large) fn(const_cast<Block*>(&block));
  }

  // A stream's blocks, created on first use and kept (a stream that cached
  // once is likely to again; PyTorch programs use a bounded set of streams).
  StreamBlocks& BlocksOf(uint64_t stream) {
    if (StreamBlocks* blocks = FindBlocks(stream)) return *blocks;
    auto& slot = streams_[stream];
    slot = std::make_unique<StreamBlocks>();
    last_stream_ = stream;
    last_blocks_ = slot.get();
    return *slot;
  }
  // Inlined everywhere (most calls in a row are for one stream); the map
  // lookup out of line.
  ABSL_ATTRIBUTE_ALWAYS_INLINE StreamBlocks* FindBlocks(uint64_t stream) {
    if (last_blocks_ != nullptr && last_stream_ == stream) return last_blocks_;
    return FindBlocksSlow(stream);
  }
  StreamBlocks* FindBlocksSlow(uint64_t stream);
  const StreamBlocks* FindBlocks(uint64_t stream) const {
    auto it = streams_.find(stream);
    return it == streams_.end() ? nullptr : it->second.get();
  }

  absl::btree_map<uint64_t, std::unique_ptr<StreamBlocks>> streams_;  // by stream, ascending
  // The last stream looked up: most calls in a row are for one stream.
  uint64_t last_stream_ = 0;
  StreamBlocks* last_blocks_ = nullptr;
  size_t size_ = 0;
};

}  // namespace headroom::internal

#endif  // HEADROOM_ALLOCATOR_BLOCK_POOL_H_

// Address -> allocated block, sharded so that lookups from many threads do
// not serialize on the allocator's lock.
//
//   PointerMap map;
//   map.Insert(block->address, block);
//   Block* b = map.Remove(address);   // nullptr if not allocated here
//
// Note [Sharded pointer map]: free(), record_stream() and size queries start
// from a bare pointer. Resolving it under the allocator's one lock would put
// every thread's lookups in one queue; instead 64 shards, each a hash table
// with its own spin lock (held for one table operation), are chosen by a
// hash of the address. Free resolves its pointer before it takes the
// allocator lock, and Lookup never takes it; only the pool operations that
// follow a lookup are serialized. (Resolving under the allocator lock
// measured no faster single-threaded.) Lock order: the allocator lock may be
// held while a shard lock is taken, never the reverse.
//
// Each shard is an open-addressing table with linear probing and
// backward-shift deletion rather than absl::flat_hash_map: an allocate+free
// pair inserts and removes the same few addresses over and over, and
// SwissTable's erase leaves tombstones that later inserts probe past and
// that force periodic rehashes; here a removal closes its gap at once, so
// the table never degrades (bench/allocator_bench.cc, BM_CachedPair).
#ifndef HEADROOM_ALLOCATOR_POINTER_MAP_H_
#define HEADROOM_ALLOCATOR_POINTER_MAP_H_

#include <array>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/strings/str_format.h"
#include "allocator/annotated_mutex.h"
#include "allocator/block.h"

namespace headroom::internal {

// Address -> Block*, open addressing with linear probing. Address 0 marks an
// empty slot (the allocator never hands it out). Not thread-safe.
class AddressTable {
 public:
  AddressTable() : slots_(kInitialSlots), shift_(64 - std::countr_zero(kInitialSlots)) {}

  // Maps `address` to `block`, replacing any previous mapping.
  void Insert(DeviceAddress address, Block* block) {
    if (2 * (count_ + 1) > slots_.size()) Grow();
    size_t i = Home(address);
    while (slots_[i].address != 0 && slots_[i].address != address) i = Next(i);
    if (slots_[i].address == 0) ++count_;
    slots_[i] = {address, block};
  }

  Block* Find(DeviceAddress address) const {
    for (size_t i = Home(address);; i = Next(i)) {
      if (slots_[i].address == address) return slots_[i].block;
      if (slots_[i].address == 0) return nullptr;
    }
  }

  // Removes and returns the block at `address`, or nullptr.
  Block* Remove(DeviceAddress address) {
    size_t hole = Home(address);
    while (slots_[hole].address != address) {
      if (slots_[hole].address == 0) return nullptr;
      hole = Next(hole);
    }
    Block* block = slots_[hole].block;
    // Backward shift: move later entries of the probe run into the hole
    // unless that would put them before their home slot.
    for (size_t i = Next(hole); slots_[i].address != 0; i = Next(i)) {
      const size_t home = Home(slots_[i].address);
      const bool home_in_gap = hole <= i ? (home > hole && home <= i) : (home > hole || home <= i);
      if (!home_in_gap) {
        slots_[hole] = slots_[i];
        hole = i;
      }
    }
    slots_[hole] = {};
    --count_;
    return block;
  }

  size_t size() const { return count_; }

  // Calls check(address, block) for every entry and returns the first
  // address that is not reachable from its home slot (an empty slot inside
  // its probe run), that `check` rejects, or, if the count is off, ~0;
  // 0 when all is well.
  template <typename Check>
  DeviceAddress FirstBadEntry(Check&& check) const {
    size_t entries = 0;
    for (const Slot& slot : slots_) {
      if (slot.address == 0) continue;
      ++entries;
      if (Find(slot.address) != slot.block || !check(slot.address, slot.block)) return slot.address;
    }
    return entries == count_ ? 0 : ~DeviceAddress{0};
  }

  template <typename Fn>
  void ForEach(Fn&& fn) const {
    for (const Slot& slot : slots_) {
      if (slot.address != 0) fn(slot.address, slot.block);
    }
  }

  // Blocks are 512-byte aligned: drop those bits, then multiply (Fibonacci
  // hashing); the table and the shard choice take different high bits.
  static uint64_t Hash(DeviceAddress address) { return (address >> 9) * 0x9E3779B97F4A7C15ull; }

 private:
  static constexpr size_t kInitialSlots = 64;
  struct Slot {
    DeviceAddress address = 0;
    Block* block = nullptr;
  };

  // Bits below the top six (which pick the shard) pick the slot.
  size_t Home(DeviceAddress address) const { return static_cast<size_t>((Hash(address) << 6) >> shift_); }
  size_t Next(size_t i) const { return (i + 1) & (slots_.size() - 1); }

  void Grow() {
    std::vector<Slot> old(slots_.size() * 2);
    old.swap(slots_);
    --shift_;
    count_ = 0;
    for (const Slot& slot : old) {
      if (slot.address != 0) Insert(slot.address, slot.block);
    }
  }

  std::vector<Slot> slots_;  // a power of two, at most half full
  int shift_;                // 64 - log2(slots_.size())
  size_t count_ = 0;
};

class PointerMap {
 public:
  void Insert(DeviceAddress address, Block* block) {
    Shard& shard = ShardFor(address);
    SpinLockHolder lock(&shard.mu);
    shard.table.Insert(address, block);
  }

  // Removes and returns the block at `address`, or nullptr.
  Block* Remove(DeviceAddress address) {
    Shard& shard = ShardFor(address);
    SpinLockHolder lock(&shard.mu);
    return shard.table.Remove(address);
  }

  // Calls `fn` with the block at `address` (nullptr if none) under the shard
  // lock, so the block cannot be freed meanwhile.
  template <typename Fn>
  auto With(DeviceAddress address, Fn&& fn) {
    Shard& shard = ShardFor(address);
    SpinLockHolder lock(&shard.mu);
    return fn(shard.table.Find(address));
  }

  size_t Size() const {
    size_t total = 0;
    for (const Shard& shard : shards_) {
      SpinLockHolder lock(&shard.mu);
      total += shard.table.size();
    }
    return total;
  }

  // InternalError naming the first entry that sits in the wrong shard, is
  // unreachable from its home slot or that `check(address, block)` rejects,
  // or a shard whose count is off. One pass over every slot.
  template <typename Check>
  absl::Status Validate(Check&& check) const {
    for (size_t i = 0; i < kShards; ++i) {
      const Shard& shard = shards_[i];
      SpinLockHolder lock(&shard.mu);
      const DeviceAddress bad = shard.table.FirstBadEntry(
          [&](DeviceAddress address, const Block* block) { return ShardIndex(address) == i && check(address, block); });
      if (bad == ~DeviceAddress{0}) {
        return absl::InternalError(absl::StrFormat("pointer map shard %d: its count is off", i));
      }
      if (bad != 0) {
        return absl::InternalError(absl::StrFormat(
            "pointer map entry 0x%x: in the wrong shard, unreachable, or not an allocated block at that address",
            bad));
      }
    }
    return absl::OkStatus();
  }

  void ForEach(const std::function<void(DeviceAddress, Block*)>& fn) const {
    for (const Shard& shard : shards_) {
      SpinLockHolder lock(&shard.mu);
      shard.table.ForEach(fn);
    }
  }

 private:
  static constexpr size_t kShards = 64;
  struct alignas(64) Shard {
    mutable SpinLock mu;
    AddressTable table ABSL_GUARDED_BY(mu);
  };

  static size_t ShardIndex(DeviceAddress address) { return AddressTable::Hash(address) >> 58; }
  Shard& ShardFor(DeviceAddress address) { return shards_[ShardIndex(address)]; }

  std::array<Shard, kShards> shards_;
};

}  // namespace headroom::internal

#endif  // HEADROOM_ALLOCATOR_POINTER_MAP_H_

// Address -> allocated block: the table each stream shard keeps of its
// allocated blocks (caching_allocator.h, Note [Stream shards]).
//
//   AddressTable table;
//   table.Insert(block->address, block);
//   Block* b = table.Remove(address);   // nullptr if not allocated here
//
// An open-addressing table with linear probing and backward-shift deletion
// rather than absl::flat_hash_map: an allocate+free pair inserts and removes
// the same few addresses over and over, and SwissTable's erase leaves
// tombstones that later inserts probe past and that force periodic rehashes;
// here a removal closes its gap at once, so the table never degrades
// (bench/allocator_bench.cc, BM_CachedPair).
#ifndef HEADROOM_ALLOCATOR_ADDRESS_TABLE_H_
#define HEADROOM_ALLOCATOR_ADDRESS_TABLE_H_

#include <bit>
#include <cstddef>
#include <cstdint>
#include <vector>

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
  // hashing); the high bits pick the slot.
  static uint64_t Hash(DeviceAddress address) { return (address >> 9) * 0x9E3779B97F4A7C15ull; }

 private:
  static constexpr size_t kInitialSlots = 64;
  struct Slot {
    DeviceAddress address = 0;
    Block* block = nullptr;
  };

  size_t Home(DeviceAddress address) const { return static_cast<size_t>(Hash(address) >> shift_); }
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

}  // namespace headroom::internal

#endif  // HEADROOM_ALLOCATOR_ADDRESS_TABLE_H_

#include "allocator/address_table.h"

#include <random>
#include <unordered_map>
#include <vector>

#include "gtest/gtest.h"

namespace headroom::internal {
namespace {

Block* Tag(uint64_t i) { return reinterpret_cast<Block*>(0x1000 + 8 * i); }

TEST(AddressTable, InsertFindRemoveReplace) {
  AddressTable table;
  table.Insert(0x200, Tag(1));
  table.Insert(0x400, Tag(2));
  table.Insert(0x200, Tag(3));  // replaces
  EXPECT_EQ(table.size(), 2u);
  EXPECT_EQ(table.Find(0x200), Tag(3));
  EXPECT_EQ(table.Remove(0x200), Tag(3));
  EXPECT_EQ(table.Remove(0x200), nullptr);
  EXPECT_EQ(table.Find(0x200), nullptr);
  EXPECT_EQ(table.Find(0x400), Tag(2));
  EXPECT_EQ(table.size(), 1u);
}

// Against std::unordered_map under random inserts and removals of a small
// key range (long probe runs, wrap-around at the table's end, repeated
// reuse of the same keys) and growth past many doublings.
TEST(AddressTable, MatchesAReferenceMap) {
  std::mt19937_64 rng(7);
  AddressTable table;
  std::unordered_map<DeviceAddress, Block*> reference;
  for (int op = 0; op < 200000; ++op) {
    const uint64_t key_range = op < 100000 ? 300 : 20000;
    const DeviceAddress address = 512 * (1 + rng() % key_range);
    if (rng() % 2 == 0) {
      table.Insert(address, Tag(op));
      reference[address] = Tag(op);
    } else {
      auto it = reference.find(address);
      Block* expected = it == reference.end() ? nullptr : it->second;
      if (it != reference.end()) reference.erase(it);
      ASSERT_EQ(table.Remove(address), expected) << "op " << op;
    }
    ASSERT_EQ(table.size(), reference.size());
  }
  for (const auto& [address, block] : reference) ASSERT_EQ(table.Find(address), block);
  size_t seen = 0;
  table.ForEach([&](DeviceAddress address, Block* block) {
    ++seen;
    EXPECT_EQ(reference.at(address), block);
  });
  EXPECT_EQ(seen, reference.size());
}

}  // namespace
}  // namespace headroom::internal

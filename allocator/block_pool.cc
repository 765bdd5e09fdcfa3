#include "allocator/block_pool.h"

#include <algorithm>

namespace headroom::internal {

void BlockPool::Clear() {
  for (auto& [stream, blocks] : streams_) {
    if (blocks->bins != nullptr) {
      for (Bin& bin : blocks->bins->bins) bin.Clear();
    }
    blocks->large.clear();
  }
  streams_.clear();
  last_blocks_ = nullptr;
  size_ = 0;
}

bool BlockPool::Contains(const Block* block) const {
  const StreamBlocks* blocks = FindBlocks(block->stream.value);
  if (blocks == nullptr) return false;
  if (block->size > kBinnedMax) {
    auto it = blocks->large.find(*block);
    return it != blocks->large.end() && &*it == block;
  }
  if (blocks->bins == nullptr) return false;
  return blocks->bins->bins[BinIndex(block->size)].Contains(block);
}

std::vector<StreamHandle> BlockPool::Streams() const {
  std::vector<StreamHandle> streams;
  for (const auto& [stream, blocks] : streams_) {
    if (blocks->count > 0) streams.push_back(StreamHandle{stream});
  }
  return streams;
}

uint64_t BlockPool::LargestSize() const {
  uint64_t largest = 0;
  for (const auto& [stream, blocks] : streams_) {
    if (!blocks->large.empty()) {
      largest = std::max(largest, std::prev(blocks->large.end())->size);
    } else if (blocks->bins != nullptr && blocks->bins->nonempty_words != 0) {
      const Bins& bins = *blocks->bins;
      const int word = 63 - std::countl_zero(bins.nonempty_words);
      const int bit = 63 - std::countl_zero(bins.nonempty[static_cast<size_t>(word)]);
      largest = std::max(largest, (static_cast<uint64_t>(word) * 64 + static_cast<uint64_t>(bit) + 1) * kMinBlockSize);
    }
  }
  return largest;
}

}  // namespace headroom::internal

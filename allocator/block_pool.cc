#include "allocator/block_pool.h"

#include <algorithm>
#include <bit>

#include "absl/strings/str_format.h"

namespace headroom::internal {

BlockPool::StreamBlocks* BlockPool::FindBlocksSlow(uint64_t stream) {
  auto it = streams_.find(stream);
  if (it == streams_.end()) return nullptr;
  last_stream_ = stream;
  last_blocks_ = it->second.get();
  return last_blocks_;
}

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

absl::Status BlockPool::Validate() const {
  size_t total = 0;
  for (const auto& [key, blocks] : streams_) {
    const uint64_t stream = key;  // a copy: clang before 16 cannot capture a structured binding
    size_t count = 0;
    auto check_block = [&](const Block& block, bool binned) -> absl::Status {
      if (block.stream.value != stream) {
        return absl::InternalError(absl::StrFormat("block 0x%x of stream %d is filed under stream %d", block.address,
                                                   block.stream.value, stream));
      }
      if (binned != (block.size <= kBinnedMax)) {
        return absl::InternalError(absl::StrFormat("block 0x%x of %d bytes is in the %s", block.address, block.size,
                                                   binned ? "bins" : "tree of large blocks"));
      }
      ++count;
      return absl::OkStatus();
    };
    if (blocks->bins != nullptr) {
      // Only the marked bins are visited, so that a check costs O(blocks),
      // not O(bins); a block in an unmarked bin is then missing from the
      // count below.
      const Bins& bins = *blocks->bins;
      for (size_t word = 0; word < kWordCount; ++word) {
        const bool summary = (bins.nonempty_words >> word & 1) != 0;
        if (summary != (bins.nonempty[word] != 0)) {
          return absl::InternalError(
              absl::StrFormat("stream %d: summary bit of bitmap word %d disagrees with the word", stream, word));
        }
        for (uint64_t bits = bins.nonempty[word]; bits != 0; bits &= bits - 1) {
          const size_t index = word * 64 + static_cast<size_t>(std::countr_zero(bits));
          const Bin& bin = bins.bins[index];
          if (bin.empty()) {
            return absl::InternalError(absl::StrFormat("stream %d: bin of %d bytes is marked but empty", stream,
                                                       (index + 1) * kMinBlockSize));
          }
          if (bin.front != nullptr && !bin.rest.empty() && bin.front->address >= bin.rest.begin()->address) {
            return absl::InternalError(absl::StrFormat("stream %d: front block 0x%x of its bin is not the lowest",
                                                       stream, bin.front->address));
          }
          absl::Status status;
          bin.ForEach([&](const Block* block) {
            if (!status.ok()) return;
            status = check_block(*block, /*binned=*/true);
            if (status.ok() && BinIndex(block->size) != index) {
              status = absl::InternalError(absl::StrFormat("block 0x%x of %d bytes is in the bin of %d bytes",
                                                           block->address, block->size,
                                                           (index + 1) * kMinBlockSize));
            }
          });
          if (!status.ok()) return status;
        }
      }
    }
    for (const Block& block : blocks->large) {
      if (absl::Status status = check_block(block, /*binned=*/false); !status.ok()) return status;
    }
    if (count != blocks->count) {
      return absl::InternalError(absl::StrFormat(
          "stream %d: counts %d blocks but its marked bins and tree hold %d", stream, blocks->count, count));
    }
    total += count;
  }
  if (total != size_) {
    return absl::InternalError(absl::StrFormat("pool counts %d blocks but holds %d", size_, total));
  }
  return absl::OkStatus();
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

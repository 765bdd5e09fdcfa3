// Where large requests went, so that a training loop's next step can put each
// block where the same request went in the step before (Note [Reusing a
// step's layout] in caching_allocator.h).
//
//   LayoutMemory memory;
//   LayoutMemory::Name name = memory.NameOf(stream, size);
//   if (std::optional<DeviceAddress> at = memory.Remembered(name)) ...try *at first...
//   memory.Place(name, address);  // it went there, and is live
//   ...
//   memory.End(stream, size);     // its block freed
//
// A request is named by its stream, its size and its ordinal: the k-th block
// of that size allocated since none was live. A step frees its activations
// and workspaces by its end, so the k-th 64 MiB block of one step has the
// same name in every step. Blocks of one size that are never live together
// (a 64 MiB workspace allocated and freed in each layer) share a name, and
// so a range. An address remembered is a hint, never trusted: the allocator
// takes it only where it is free.
// Memory is bounded: kMaxOrdinals per size and kMaxSizes sizes; when full,
// the sizes with no live block are forgotten, and if none is, a new size is
// not remembered.
#ifndef HEADROOM_ALLOCATOR_LAYOUT_MEMORY_H_
#define HEADROOM_ALLOCATOR_LAYOUT_MEMORY_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "allocator/device_backend.h"

namespace headroom::internal {

class LayoutMemory {
 public:
  static constexpr size_t kMaxSizes = 256;
  static constexpr uint32_t kMaxOrdinals = 1024;

  struct Name {
    StreamHandle stream;
    uint64_t size = 0;
    uint32_t ordinal = 0;  // 1-based
  };

  // The name the next request of `size` bytes on `stream` gets.
  Name NameOf(StreamHandle stream, uint64_t size) const {
    auto it = sizes_.find({stream.value, size});
    return {stream, size, it == sizes_.end() ? 1 : it->second.since_idle + 1};
  }

  // Where the request of the same name went last time, if anywhere.
  std::optional<DeviceAddress> Remembered(const Name& name) const {
    auto it = sizes_.find({name.stream.value, name.size});
    if (it == sizes_.end() || name.ordinal > it->second.addresses.size()) return std::nullopt;
    const DeviceAddress address = it->second.addresses[name.ordinal - 1];
    if (address == 0) return std::nullopt;
    return address;
  }

  // The named request got the block at `address`: counts it live and
  // remembers where it went.
  void Place(const Name& name, DeviceAddress address) {
    auto it = sizes_.find({name.stream.value, name.size});
    if (it == sizes_.end()) {
      if (sizes_.size() >= kMaxSizes) absl::erase_if(sizes_, [](const auto& entry) { return entry.second.live == 0; });
      if (sizes_.size() >= kMaxSizes) return;
      it = sizes_.try_emplace({name.stream.value, name.size}).first;
    }
    SizeLayout& layout = it->second;
    ++layout.live;
    if (layout.since_idle <= kMaxOrdinals) ++layout.since_idle;  // past kMaxOrdinals: not remembered
    if (name.ordinal != layout.since_idle || name.ordinal > kMaxOrdinals) return;
    if (layout.addresses.size() < name.ordinal) layout.addresses.resize(name.ordinal, 0);
    layout.addresses[name.ordinal - 1] = address;
  }

  // A block of `size` bytes on `stream` was freed.
  void End(StreamHandle stream, uint64_t size) {
    auto it = sizes_.find({stream.value, size});
    if (it == sizes_.end() || it->second.live == 0) return;  // placed before its size was remembered
    if (--it->second.live == 0) it->second.since_idle = 0;
  }

  size_t sizes() const { return sizes_.size(); }

 private:
  struct SizeLayout {
    uint32_t live = 0;        // blocks of the size allocated and not yet freed
    uint32_t since_idle = 0;  // blocks of the size allocated since `live` was last 0
    std::vector<DeviceAddress> addresses;  // by ordinal - 1; 0: none yet
  };
  absl::flat_hash_map<std::pair<uint64_t, uint64_t>, SizeLayout> sizes_;  // by stream, size
};

}  // namespace headroom::internal

#endif  // HEADROOM_ALLOCATOR_LAYOUT_MEMORY_H_

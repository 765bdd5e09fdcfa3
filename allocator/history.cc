#include "allocator/history.h"

#include <array>

namespace headroom {
namespace {

constexpr std::array<std::string_view, 8> kActionNames = {
    "alloc", "free_requested", "free_completed", "segment_alloc", "segment_free", "segment_map", "segment_unmap",
    "oom"};

}  // namespace

std::string_view TraceActionName(TraceAction action) { return kActionNames[static_cast<size_t>(action)]; }

std::optional<TraceAction> TraceActionFromName(std::string_view name) {
  for (size_t i = 0; i < kActionNames.size(); ++i) {
    if (kActionNames[i] == name) return static_cast<TraceAction>(i);
  }
  return std::nullopt;
}

void HistoryRing::SetCapacity(size_t capacity) {
  capacity_ = capacity;
  entries_.clear();
  entries_.reserve(std::min<size_t>(capacity, 1 << 16));
  next_ = 0;
  dropped_ = 0;
}

void HistoryRing::Add(const TraceEntry& entry) {
  if (capacity_ == 0) return;
  if (entries_.size() < capacity_) {
    entries_.push_back(entry);
    return;
  }
  entries_[next_] = entry;
  next_ = (next_ + 1) % capacity_;
  ++dropped_;
}

std::vector<TraceEntry> HistoryRing::Entries() const {
  std::vector<TraceEntry> out;
  out.reserve(entries_.size());
  for (size_t i = 0; i < entries_.size(); ++i) out.push_back(entries_[(next_ + i) % entries_.size()]);
  return out;
}

}  // namespace headroom

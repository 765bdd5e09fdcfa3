#include "allocator/size_rounding.h"

#include <algorithm>
#include <bit>

#include "common/checked_math.h"

namespace headroom {

uint32_t RoundingOptions::DivisionsFor(uint64_t size) const {
  if (divisions_by_mib_interval.empty()) return power2_divisions;
  const uint64_t mib = size >> 20;
  const size_t index = mib == 0 ? 0 : static_cast<size_t>(std::bit_width(mib) - 1);
  return divisions_by_mib_interval[std::min(index, divisions_by_mib_interval.size() - 1)];
}

uint64_t RoundSize(uint64_t size, const RoundingOptions& options) {
  if (size <= kMinBlockSize) return kMinBlockSize;
  const uint64_t plain = RoundUp(size, kMinBlockSize);
  const uint32_t divisions = options.DivisionsFor(size);
  if (divisions <= 1) return plain;
  const uint64_t floor_pow2 = std::bit_floor(size);
  if (floor_pow2 == size) return size < kMinBlockSize ? kMinBlockSize : size;
  const uint64_t step = floor_pow2 / divisions;
  if (step < kMinBlockSize) return plain;
  return RoundUp(size, step);
}

uint64_t SegmentSizeFor(uint64_t rounded_size) {
  if (IsSmallRequest(rounded_size)) return kSmallBuffer;
  if (rounded_size < kMinLargeAlloc) return kLargeBuffer;
  return RoundUp(rounded_size, kRoundLarge);
}

}  // namespace headroom

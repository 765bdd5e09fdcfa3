#include "allocator/size_rounding.h"

#include <bit>

namespace headroom {

uint64_t RoundSize(uint64_t size, const RoundingOptions& options) {
  if (size <= kMinBlockSize) return kMinBlockSize;
  const uint64_t plain = (size + kMinBlockSize - 1) / kMinBlockSize * kMinBlockSize;
  const uint32_t divisions = options.power2_divisions;
  if (divisions <= 1) return plain;
  const uint64_t floor_pow2 = std::bit_floor(size);
  if (floor_pow2 == size) return size < kMinBlockSize ? kMinBlockSize : size;
  const uint64_t step = floor_pow2 / divisions;
  if (step < kMinBlockSize) return plain;
  return (size + step - 1) / step * step;
}

uint64_t SegmentSizeFor(uint64_t rounded_size) {
  if (IsSmallRequest(rounded_size)) return kSmallBuffer;
  if (rounded_size < kMinLargeAlloc) return kLargeBuffer;
  return (rounded_size + kRoundLarge - 1) / kRoundLarge * kRoundLarge;
}

}  // namespace headroom

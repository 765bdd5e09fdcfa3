// How the caching allocator rounds a request before it looks for a block.
//
// Every block is a multiple of kMinBlockSize (512 bytes), so that splitting
// and coalescing keep addresses aligned for any CUDA data type. Optionally a
// power-of-two interval [2^k, 2^(k+1)) is cut into `divisions` equal steps and
// a large request rounds up to the next step, which bounds the number of
// distinct sizes and so the fragmentation that many near-equal sizes cause
// (PyTorch's `roundup_power2_divisions`).
//
//   RoundSize(1, {})                      -> 512
//   RoundSize(1200 * 1024 * 1024, {.power2_divisions = 4}) -> 1280 MiB
#ifndef HEADROOM_ALLOCATOR_SIZE_ROUNDING_H_
#define HEADROOM_ALLOCATOR_SIZE_ROUNDING_H_

#include <cstdint>

namespace headroom {

inline constexpr uint64_t kMinBlockSize = 512;

struct RoundingOptions {
  // 0 or 1: plain 512-byte rounding. Otherwise a power of two: the number of
  // equal steps each power-of-two interval is cut into.
  uint32_t power2_divisions = 0;
};

// Rounds `size` up as described above. Sizes at or below kMinBlockSize become
// kMinBlockSize; the result never overflows (callers reject sizes above
// 2^62 before rounding).
uint64_t RoundSize(uint64_t size, const RoundingOptions& options);

}  // namespace headroom

#endif  // HEADROOM_ALLOCATOR_SIZE_ROUNDING_H_

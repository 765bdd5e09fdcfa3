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
#include <vector>

namespace headroom {

inline constexpr uint64_t kMinBlockSize = 512;

// Pool and segment sizes. The figures are PyTorch's (c10/cuda/
// CUDACachingAllocator.cpp: kSmallSize, kSmallBuffer, kMinLargeAlloc,
// kLargeBuffer, kRoundLarge) so that replaying a PyTorch trace predicts what
// PyTorch reserves.
inline constexpr uint64_t kSmallSize = uint64_t{1} << 20;       // largest "small" request
inline constexpr uint64_t kSmallBuffer = uint64_t{2} << 20;     // segment of the small pool
inline constexpr uint64_t kMinLargeAlloc = uint64_t{10} << 20;  // below: a kLargeBuffer segment
inline constexpr uint64_t kLargeBuffer = uint64_t{20} << 20;
inline constexpr uint64_t kRoundLarge = uint64_t{2} << 20;      // large segments are multiples

// Requests at or below kSmallSize (after rounding) are served from the small
// pool, the rest from the large pool; the two never share a segment.
inline constexpr bool IsSmallRequest(uint64_t rounded_size) { return rounded_size <= kSmallSize; }

// The size of the segment allocated from the device when no cached block
// fits a (rounded) request: a 2 MiB small-pool buffer, a 20 MiB large buffer
// for requests below 10 MiB, otherwise the request rounded up to 2 MiB.
uint64_t SegmentSizeFor(uint64_t rounded_size);

struct RoundingOptions {
  // 0 or 1: plain 512-byte rounding. Otherwise a power of two: the number of
  // equal steps each power-of-two interval is cut into.
  uint32_t power2_divisions = 0;
  // Per-interval divisions (PyTorch's "[256:1,512:2,>:8]" form). Entry i
  // applies to sizes in [2^i MiB, 2^(i+1) MiB); smaller sizes use entry 0,
  // larger ones the last entry. When non-empty it replaces power2_divisions.
  std::vector<uint32_t> divisions_by_mib_interval;

  uint32_t DivisionsFor(uint64_t size) const;
};

// Rounds `size` up as described above. Sizes at or below kMinBlockSize become
// kMinBlockSize; the result never overflows (callers reject sizes above
// 2^62 before rounding).
uint64_t RoundSize(uint64_t size, const RoundingOptions& options);

}  // namespace headroom

#endif  // HEADROOM_ALLOCATOR_SIZE_ROUNDING_H_

// Integer arithmetic on sizes and counts that cannot silently wrap.
//
// Byte counts are uint64_t everywhere (DESIGN.md, "Units"); a product of
// user-given dimensions (batch x sequence x hidden x dtype bytes) can exceed
// 2^64 long before anything else notices. Every such product or sum goes
// through these helpers, and an overflow is an error naming what was being
// computed and the operands, never a wrapped value:
//
//   HEADROOM_ASSIGN_OR_RETURN(uint64_t bytes, CheckedMul(elements, 2, "layers.0.mlp.up output bytes"));
//   -> InvalidArgument "layers.0.mlp.up output bytes: 9223372036854775808 x 2 overflows 64 bits"
//
// Saturating forms serve where the caller compares the result with a bound
// right away (a saturated value always fails the comparison).
#ifndef HEADROOM_COMMON_CHECKED_MATH_H_
#define HEADROOM_COMMON_CHECKED_MATH_H_

#include <cstdint>
#include <initializer_list>
#include <limits>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace headroom {

// `value` rounded up to a multiple of `multiple` (> 0). The caller keeps
// `value` at least `multiple` below 2^64.
constexpr uint64_t RoundUp(uint64_t value, uint64_t multiple) {
  return (value + multiple - 1) / multiple * multiple;
}

// ceil(a / b) for a >= 0, b > 0.
template <typename Int>
constexpr Int CeilDiv(Int a, Int b) {
  return a / b + (a % b != 0 ? 1 : 0);
}

constexpr uint64_t SaturatingAdd(uint64_t a, uint64_t b) {
  uint64_t sum = 0;
  return __builtin_add_overflow(a, b, &sum) ? std::numeric_limits<uint64_t>::max() : sum;
}

constexpr uint64_t SaturatingMul(uint64_t a, uint64_t b) {
  uint64_t product = 0;
  return __builtin_mul_overflow(a, b, &product) ? std::numeric_limits<uint64_t>::max() : product;
}

inline absl::StatusOr<uint64_t> CheckedAdd(uint64_t a, uint64_t b, std::string_view what) {
  uint64_t sum = 0;
  if (__builtin_add_overflow(a, b, &sum)) {
    return absl::InvalidArgumentError(std::string(what) + ": " + std::to_string(a) + " + " + std::to_string(b) +
                                      " overflows 64 bits");
  }
  return sum;
}

inline absl::StatusOr<uint64_t> CheckedMul(uint64_t a, uint64_t b, std::string_view what) {
  uint64_t product = 0;
  if (__builtin_mul_overflow(a, b, &product)) {
    return absl::InvalidArgumentError(std::string(what) + ": " + std::to_string(a) + " x " + std::to_string(b) +
                                      " overflows 64 bits");
  }
  return product;
}

// The product of all `factors`; the error lists them all.
inline absl::StatusOr<uint64_t> CheckedProduct(std::initializer_list<uint64_t> factors, std::string_view what) {
  uint64_t product = 1;
  bool overflow = false;
  for (uint64_t f : factors) overflow |= __builtin_mul_overflow(product, f, &product);
  if (!overflow) return product;
  std::string listed;
  for (uint64_t f : factors) listed += (listed.empty() ? "" : " x ") + std::to_string(f);
  return absl::InvalidArgumentError(std::string(what) + ": " + listed + " overflows 64 bits");
}

}  // namespace headroom

#endif  // HEADROOM_COMMON_CHECKED_MATH_H_

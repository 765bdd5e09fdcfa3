// Byte quantities as people write and read them.
//
// Inside Headroom every size is a uint64_t count of bytes (see DESIGN.md,
// "Units"). This header converts at the edges:
//
//   FormatBytes(3 * kGiB / 2)          -> "1.50 GiB"
//   ParseBytes("80GiB")                -> 85899345920
//   ParseBytes("16 GB")                -> 16000000000  (SI when the unit says so)
//   ParseBytes("4096")                 -> 4096
//   ParseBytes("1.2MiB")               -> 1258291      (nearest byte)
//
// Parsing rejects negative, fractional-byte, overflowing and unit-less
// garbage with a message that quotes the input.
#ifndef HEADROOM_COMMON_UNITS_H_
#define HEADROOM_COMMON_UNITS_H_

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace headroom {

inline constexpr uint64_t kKiB = uint64_t{1} << 10;
inline constexpr uint64_t kMiB = uint64_t{1} << 20;
inline constexpr uint64_t kGiB = uint64_t{1} << 30;
inline constexpr uint64_t kTiB = uint64_t{1} << 40;

// "0 B", "512 B", "1.00 KiB", "80.00 GiB": binary units, two decimals above bytes.
std::string FormatBytes(uint64_t bytes);

// Same, for a signed difference: "+1.25 GiB", "-512 B".
std::string FormatSignedBytes(int64_t bytes);

// Accepts an integer or decimal number followed by an optional unit:
// B, KiB, MiB, GiB, TiB (binary), KB, MB, GB, TB (decimal) and the shorthand
// K, M, G, T (binary, as PyTorch's "max_split_size_mb" style configs mean it).
// Case-insensitive; spaces between number and unit allowed. A fraction of a
// unit rounds to the nearest byte ("1.2MiB" -> 1258291); a fraction of a
// byte ("0.5", "1.5B") is refused.
absl::StatusOr<uint64_t> ParseBytes(std::string_view text);

}  // namespace headroom

#endif  // HEADROOM_COMMON_UNITS_H_

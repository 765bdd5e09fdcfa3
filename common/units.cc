#include "common/units.h"

#include <array>
#include <cmath>
#include <cstdio>
#include <limits>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/quote.h"

namespace headroom {
namespace {

struct Unit {
  std::string_view name;
  uint64_t factor;
};

constexpr std::array<Unit, 14> kUnits = {{
    {"", 1},           {"b", 1},
    {"k", kKiB},       {"kib", kKiB},    {"kb", 1000},
    {"m", kMiB},       {"mib", kMiB},    {"mb", 1000 * 1000},
    {"g", kGiB},       {"gib", kGiB},    {"gb", 1000 * 1000 * 1000},
    {"t", kTiB},       {"tib", kTiB},    {"tb", uint64_t{1000} * 1000 * 1000 * 1000},
}};

std::string_view Trim(std::string_view s) {
  while (!s.empty() && absl::ascii_isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && absl::ascii_isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return s;
}

}  // namespace

std::string FormatBytes(uint64_t bytes) {
  static constexpr std::array<std::string_view, 5> kNames = {"B", "KiB", "MiB", "GiB", "TiB"};
  if (bytes < kKiB) return absl::StrCat(bytes, " B");
  double value = static_cast<double>(bytes);
  size_t unit = 0;
  while (value >= 1024.0 && unit + 1 < kNames.size()) {
    value /= 1024.0;
    ++unit;
  }
  return absl::StrFormat("%.2f %s", value, kNames[unit]);
}

std::string FormatSignedBytes(int64_t bytes) {
  const uint64_t magnitude =
      bytes < 0 ? uint64_t{0} - static_cast<uint64_t>(bytes) : static_cast<uint64_t>(bytes);
  return absl::StrCat(bytes < 0 ? "-" : "+", FormatBytes(magnitude));
}

absl::StatusOr<uint64_t> ParseBytes(std::string_view text) {
  const std::string input(text);
  const std::string_view trimmed = Trim(input);
  size_t number_end = 0;
  while (number_end < trimmed.size() &&
         (absl::ascii_isdigit(static_cast<unsigned char>(trimmed[number_end])) ||
          trimmed[number_end] == '.')) {
    ++number_end;
  }
  const std::string_view number = trimmed.substr(0, number_end);
  const std::string unit = absl::AsciiStrToLower(std::string(Trim(trimmed.substr(number_end))));
  if (number.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(QuoteForError(input), " is not a byte size (expected e.g. 4096, 512MiB, 80GiB)"));
  }
  uint64_t factor = 0;
  for (const Unit& u : kUnits) {
    if (u.name == unit) factor = u.factor;
  }
  if (factor == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        QuoteForError(input), " has an unknown unit ", QuoteForError(unit),
        " (use B, KiB, MiB, GiB, TiB, KB, MB, GB, TB)"));
  }
  if (number.find('.') == std::string_view::npos) {
    uint64_t whole = 0;
    if (!absl::SimpleAtoi(std::string(number), &whole) ||
        whole > std::numeric_limits<uint64_t>::max() / factor) {
      return absl::InvalidArgumentError(absl::StrCat(QuoteForError(input), " is too large for 64-bit bytes"));
    }
    return whole * factor;
  }
  double value = 0;
  if (!absl::SimpleAtod(std::string(number), &value) || !std::isfinite(value)) {
    return absl::InvalidArgumentError(absl::StrCat(QuoteForError(input), " is not a number of bytes"));
  }
  // A fraction of a larger unit (1.2MiB = 1258291.2 bytes) rounds to the
  // nearest byte: people write sizes that way, and a byte either side does
  // not matter. A fraction of a byte itself ("0.5", "1.5B") means nothing.
  if (factor == 1) {
    return absl::InvalidArgumentError(absl::StrCat(QuoteForError(input), " is not a whole number of bytes"));
  }
  const double bytes = std::round(value * static_cast<double>(factor));
  if (bytes >= 18446744073709551616.0) {
    return absl::InvalidArgumentError(absl::StrCat(QuoteForError(input), " is too large for 64-bit bytes"));
  }
  return static_cast<uint64_t>(bytes);
}

}  // namespace headroom

// The names of an enum's values, kept in one table per enum: the name each
// value prints as, the spellings a parser also accepts, and one parser whose
// error lists what was expected. Every vocabulary of the command line and of
// the file formats (precision, optimizer, sharding, dtype, phase, ...) goes
// through one of these, so a name is written once.
//
//   enum class Fruit { kApple, kPear };
//   inline constexpr NameTable<Fruit, 3> kFruitNames("fruit", {{
//       {"apple", Fruit::kApple}, {"pear", Fruit::kPear},
//       {"malus", Fruit::kApple, kAlias}}});
//   kFruitNames.Name(Fruit::kApple)  -> "apple"  (the first entry of a value)
//   kFruitNames.Parse("Pear")        -> Fruit::kPear (ASCII case is ignored)
//   kFruitNames.Parse("plum")        -> InvalidArgument
//                                       "unknown fruit 'plum' (expected apple or pear)"
//
// Aliases parse but are left out of the "expected" list and never print.
#ifndef HEADROOM_COMMON_NAME_TABLE_H_
#define HEADROOM_COMMON_NAME_TABLE_H_

#include <array>
#include <cstddef>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "common/quote.h"

namespace headroom {

inline constexpr bool kAlias = true;

template <typename Enum>
struct NameEntry {
  std::string_view name;
  Enum value;
  bool alias = false;
};

template <typename Enum, size_t N>
class NameTable {
 public:
  // `what` names the vocabulary in errors: "optimizer", "checkpoint mode".
  constexpr NameTable(std::string_view what, std::array<NameEntry<Enum>, N> entries)
      : what_(what), entries_(entries) {}

  // The first non-alias entry of `value`; "unknown" for a value outside the table.
  constexpr std::string_view Name(Enum value) const {
    for (const NameEntry<Enum>& e : entries_) {
      if (e.value == value && !e.alias) return e.name;
    }
    return "unknown";
  }

  absl::StatusOr<Enum> Parse(std::string_view text) const {
    for (const NameEntry<Enum>& e : entries_) {
      if (EqualsIgnoringAsciiCase(e.name, text)) return e.value;
    }
    return absl::InvalidArgumentError("unknown " + std::string(what_) + " " + QuoteForError(text) + " (expected " +
                                      Expected() + ")");
  }

  // "a, b or c": the printed names, in table order.
  std::string Expected() const {
    std::string out;
    size_t listed = 0, total = 0;
    for (const NameEntry<Enum>& e : entries_) total += e.alias ? 0 : 1;
    for (const NameEntry<Enum>& e : entries_) {
      if (e.alias) continue;
      if (listed > 0) out += listed + 1 == total ? " or " : ", ";
      out += e.name;
      ++listed;
    }
    return out;
  }

  std::string_view what() const { return what_; }

 private:
  static constexpr bool EqualsIgnoringAsciiCase(std::string_view a, std::string_view b) {
    if (a.size() != b.size()) return false;
    for (size_t i = 0; i < a.size(); ++i) {
      auto lower = [](char c) { return c >= 'A' && c <= 'Z' ? static_cast<char>(c - 'A' + 'a') : c; };
      if (lower(a[i]) != lower(b[i])) return false;
    }
    return true;
  }

  std::string_view what_;
  std::array<NameEntry<Enum>, N> entries_;
};

}  // namespace headroom

#endif  // HEADROOM_COMMON_NAME_TABLE_H_

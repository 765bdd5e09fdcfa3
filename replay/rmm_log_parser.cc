// RMM logging_resource_adaptor CSV (see allocation_trace.h).
#include <charconv>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "replay/allocation_trace.h"
#include "common/quote.h"
#include "common/status_macros.h"

namespace headroom {
namespace {

std::string_view Trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t' || s.front() == '\r')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r')) s.remove_suffix(1);
  return s;
}

std::vector<std::string_view> SplitCsv(std::string_view line) {
  std::vector<std::string_view> fields;
  size_t start = 0;
  while (true) {
    const size_t comma = line.find(',', start);
    if (comma == std::string_view::npos) {
      fields.push_back(Trim(line.substr(start)));
      return fields;
    }
    fields.push_back(Trim(line.substr(start, comma - start)));
    start = comma + 1;
  }
}

std::optional<uint64_t> ParseInteger(std::string_view text) {
  int base = 10;
  if (text.size() > 2 && text[0] == '0' && (text[1] == 'x' || text[1] == 'X')) {
    text.remove_prefix(2);
    base = 16;
  }
  uint64_t value = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value, base);
  if (text.empty() || ec != std::errc() || end != text.data() + text.size()) return std::nullopt;
  return value;
}

// Seconds as a decimal, or a clock time HH:MM:SS with a fraction after '.'
// or ':' (older spdlog patterns).
std::optional<uint64_t> ParseTime(std::string_view text) {
  if (text.find(':') == std::string_view::npos) {
    // Seconds, parsed as integer and fraction so nanoseconds stay exact.
    const size_t dot = text.find('.');
    std::string_view whole = text.substr(0, dot);
    std::string_view fraction = dot == std::string_view::npos ? std::string_view() : text.substr(dot + 1);
    if (whole.empty() || whole.size() > 10 || fraction.size() > 9 || whole.starts_with("0x")) return std::nullopt;
    std::optional<uint64_t> seconds = ParseInteger(whole);
    std::optional<uint64_t> fraction_value = fraction.empty() ? std::optional<uint64_t>(0) : ParseInteger(fraction);
    if (!seconds.has_value() || !fraction_value.has_value() || fraction.starts_with("0x")) return std::nullopt;
    uint64_t fraction_ns = *fraction_value;
    for (size_t d = fraction.size(); d < 9; ++d) fraction_ns *= 10;
    return *seconds * 1'000'000'000ull + fraction_ns;
  }
  uint64_t parts[4] = {0, 0, 0, 0};
  size_t count = 0;
  size_t fraction_digits = 0;
  size_t start = 0;
  while (start <= text.size() && count < 4) {
    size_t end = text.find_first_of(":.", start);
    if (end == std::string_view::npos) end = text.size();
    std::string_view piece = text.substr(start, end - start);
    if (piece.empty() || piece.size() > 9) return std::nullopt;
    std::optional<uint64_t> value = ParseInteger(piece);
    if (!value.has_value() || piece.starts_with("0x")) return std::nullopt;
    if (count == 3) fraction_digits = piece.size();
    parts[count++] = *value;
    start = end + 1;
    if (end == text.size()) break;
  }
  if (count < 3 || start < text.size() || parts[1] >= 60 || parts[2] >= 61) return std::nullopt;
  uint64_t fraction_ns = parts[3];
  for (size_t d = fraction_digits; d < 9; ++d) fraction_ns *= 10;
  return ((parts[0] * 60 + parts[1]) * 60 + parts[2]) * 1'000'000'000ull + fraction_ns;
}

}  // namespace

absl::StatusOr<AllocationTrace> ParseRmmLog(std::string_view text, std::string_view source) {
  AllocationTrace trace{.source = std::string(source), .format = "rmm-csv", .events = {}};
  size_t line_number = 0;
  size_t start = 0;
  int column[6] = {-1, -1, -1, -1, -1, -1};  // Thread, Time, Action, Pointer, Size, Stream
  bool have_header = false;
  auto error = [&](std::string_view what) {
    return absl::InvalidArgumentError(absl::StrFormat("%s:%d: %s", source, line_number, what));
  };
  while (start < text.size()) {
    size_t end = text.find('\n', start);
    if (end == std::string_view::npos) end = text.size();
    std::string_view line = Trim(text.substr(start, end - start));
    start = end + 1;
    ++line_number;
    if (line.empty()) continue;
    std::vector<std::string_view> fields = SplitCsv(line);
    if (!have_header) {
      static constexpr std::string_view kNames[6] = {"Thread", "Time", "Action", "Pointer", "Size", "Stream"};
      for (size_t i = 0; i < fields.size(); ++i) {
        for (int n = 0; n < 6; ++n) {
          if (fields[i] == kNames[n]) column[n] = static_cast<int>(i);
        }
      }
      for (int n = 0; n < 6; ++n) {
        if (n == 0 || n == 5) continue;  // Thread and Stream are optional
        if (column[n] < 0) {
          return error(absl::StrFormat(
              "expected the RMM header Thread,Time,Action,Pointer,Size,Stream (column %s is missing)", kNames[n]));
        }
      }
      have_header = true;
      continue;
    }
    auto field = [&](int n) -> std::string_view {
      return column[n] >= 0 && static_cast<size_t>(column[n]) < fields.size() ? fields[column[n]] : "";
    };
    for (int n : {1, 2, 3, 4}) {
      if (static_cast<size_t>(column[n]) >= fields.size()) {
        return error(absl::StrFormat("expected at least %d fields, got %d", column[n] + 1, fields.size()));
      }
    }
    TraceEvent event{.line = line_number};
    const std::string_view action = field(2);
    if (action == "allocate") {
      event.op = TraceOp::kAllocate;
    } else if (action == "free" || action == "deallocate") {
      event.op = TraceOp::kFree;
    } else if (action == "allocate failure" || action == "allocate_failure") {
      event.op = TraceOp::kAllocateFailure;
    } else {
      return error(absl::StrFormat("unknown action %s (expected allocate, free, deallocate or allocate failure)",
                                   QuoteForError(action)));
    }
    std::optional<uint64_t> time = ParseTime(field(1));
    if (!time.has_value()) return error(absl::StrCat("bad time ", QuoteForError(field(1))));
    event.time_ns = *time;
    std::optional<uint64_t> pointer = ParseInteger(field(3));
    if (!pointer.has_value()) return error(absl::StrCat("bad pointer ", QuoteForError(field(3))));
    event.pointer = *pointer;
    std::optional<uint64_t> size = ParseInteger(field(4));
    if (!size.has_value()) return error(absl::StrCat("bad size ", QuoteForError(field(4))));
    event.size = *size;
    if (column[5] >= 0 && !field(5).empty()) {
      std::optional<uint64_t> stream = ParseInteger(field(5));
      if (!stream.has_value()) return error(absl::StrCat("bad stream ", QuoteForError(field(5))));
      event.stream = *stream;
    }
    trace.events.push_back(event);
  }
  if (!have_header) {
    return absl::InvalidArgumentError(absl::StrFormat("%s: empty; expected an RMM log with a CSV header", source));
  }
  return trace;
}

absl::StatusOr<AllocationTrace> ParseAllocationTrace(std::string_view text, std::string_view source) {
  const size_t first = text.find_first_not_of(" \t\r\n");
  if (first != std::string_view::npos && text[first] == '{') return ParsePyTorchSnapshot(text, source);
  return ParseRmmLog(text, source);
}

}  // namespace headroom

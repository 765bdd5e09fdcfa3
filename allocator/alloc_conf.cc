#include "allocator/alloc_conf.h"

#include <bit>
#include <charconv>
#include <cmath>
#include <optional>
#include <set>

#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "allocator/history.h"
#include "common/quote.h"
#include "common/status_macros.h"
#include "common/units.h"

namespace headroom {
namespace {

std::string_view Trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

absl::Status Bad(std::string_view key, std::string_view value, std::string_view expected) {
  return absl::InvalidArgumentError(
      absl::StrFormat("%s:%s: expected %s", EscapeForError(key), EscapeForError(value), expected));
}

absl::StatusOr<uint64_t> ParseUint(std::string_view key, std::string_view value) {
  uint64_t out = 0;
  auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), out);
  if (value.empty() || ec != std::errc() || end != value.data() + value.size()) {
    return Bad(key, value, "a non-negative integer");
  }
  return out;
}

absl::StatusOr<double> ParseDouble(std::string_view key, std::string_view value) {
  double out = 0;
  auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), out);
  if (value.empty() || ec != std::errc() || end != value.data() + value.size() || !std::isfinite(out)) {
    return Bad(key, value, "a number");
  }
  return out;
}

absl::StatusOr<bool> ParseBool(std::string_view key, std::string_view value) {
  if (value == "True" || value == "true" || value == "1") return true;
  if (value == "False" || value == "false" || value == "0") return false;
  return Bad(key, value, "True or False");
}

absl::StatusOr<uint32_t> ParseDivisions(std::string_view key, std::string_view value) {
  HEADROOM_ASSIGN_OR_RETURN(uint64_t n, ParseUint(key, value));
  if (n > (1u << 16) || (n > 1 && !std::has_single_bit(n))) return Bad(key, value, "a power of two (or 0/1: off)");
  return static_cast<uint32_t>(n);
}

// "[256:1,512:2,>:8]": divisions from each MiB interval start onwards.
absl::Status ParseDivisionList(std::string_view key, std::string_view value, RoundingOptions& rounding) {
  constexpr size_t kIntervals = 64;
  std::string_view inner = Trim(value.substr(1, value.size() - 2));
  if (inner.empty()) return Bad(key, value, "at least one interval:divisions pair in [...]");
  std::vector<uint32_t> table(kIntervals, 0);
  std::optional<size_t> last;
  bool seen_rest = false;
  size_t start = 0;
  while (start <= inner.size()) {
    size_t comma = inner.find(',', start);
    if (comma == std::string_view::npos) comma = inner.size();
    std::string_view item = Trim(inner.substr(start, comma - start));
    start = comma + 1;
    const size_t colon = item.find(':');
    if (colon == std::string_view::npos) return Bad(key, item, "interval:divisions inside [...]");
    std::string_view interval = Trim(item.substr(0, colon));
    HEADROOM_ASSIGN_OR_RETURN(uint32_t divisions, ParseDivisions(key, Trim(item.substr(colon + 1))));
    if (seen_rest) return Bad(key, item, "'>' to be the last entry");
    if (interval == ">") {
      const size_t from = last.has_value() ? *last + 1 : 0;
      for (size_t i = from; i < kIntervals; ++i) table[i] = divisions;
      seen_rest = true;
      continue;
    }
    HEADROOM_ASSIGN_OR_RETURN(uint64_t mib, ParseUint(key, interval));
    if (mib == 0 || !std::has_single_bit(mib)) return Bad(key, interval, "a power-of-two interval start in MiB");
    const size_t index = static_cast<size_t>(std::bit_width(mib) - 1);
    if (last.has_value() && index <= *last) return Bad(key, interval, "interval starts in increasing order");
    // The first entry also covers everything below it; each entry holds until
    // the next one.
    const size_t from = last.has_value() ? index : 0;
    for (size_t i = from; i < kIntervals; ++i) table[i] = divisions;
    last = index;
  }
  // Trim the repeated tail: the last entry applies to all larger sizes.
  while (table.size() > 1 && table[table.size() - 1] == table[table.size() - 2]) table.pop_back();
  rounding.divisions_by_mib_interval = std::move(table);
  return absl::OkStatus();
}

absl::Status ApplyKey(std::string_view key, std::string_view value, AllocatorOptions& options) {
  if (key == "max_split_size_mb") {
    HEADROOM_ASSIGN_OR_RETURN(uint64_t mib, ParseUint(key, value));
    if (mib <= kLargeBuffer / kMiB || mib > (uint64_t{1} << 40)) {
      return Bad(key, value, absl::StrFormat("more than %d (MiB)", kLargeBuffer / kMiB));
    }
    options.max_split_size = mib * kMiB;
  } else if (key == "roundup_power2_divisions") {
    if (!value.empty() && value.front() == '[') {
      if (value.back() != ']') return Bad(key, value, "a list closed by ']'");
      HEADROOM_RETURN_IF_ERROR(ParseDivisionList(key, value, options.rounding));
    } else {
      HEADROOM_ASSIGN_OR_RETURN(options.rounding.power2_divisions, ParseDivisions(key, value));
    }
  } else if (key == "garbage_collection_threshold") {
    HEADROOM_ASSIGN_OR_RETURN(double t, ParseDouble(key, value));
    if (!(t > 0.0 && t < 1.0)) return Bad(key, value, "a number strictly between 0 and 1");
    options.garbage_collection_threshold = t;
  } else if (key == "expandable_segments") {
    HEADROOM_ASSIGN_OR_RETURN(options.expandable_segments, ParseBool(key, value));
  } else if (key == "backend") {
    if (value != "native") return Bad(key, value, "native (Headroom is a native caching allocator)");
  } else if (key == "memory_fraction") {
    HEADROOM_ASSIGN_OR_RETURN(double f, ParseDouble(key, value));
    if (!(f > 0.0 && f <= 1.0)) return Bad(key, value, "a number in (0, 1]");
    options.memory_fraction = f;
  } else if (key == "hard_limit_mb") {
    HEADROOM_ASSIGN_OR_RETURN(uint64_t mib, ParseUint(key, value));
    if (mib == 0 || mib > (uint64_t{1} << 40)) return Bad(key, value, "a positive number of MiB");
    options.hard_limit_bytes = mib * kMiB;
  } else if (key == "cross_stream_reuse") {
    HEADROOM_ASSIGN_OR_RETURN(options.cross_stream_reuse, ParseBool(key, value));
  } else if (key == "history_entries") {
    HEADROOM_ASSIGN_OR_RETURN(uint64_t n, ParseUint(key, value));
    if (n > kMaxHistoryEntries) return Bad(key, value, "at most 2^32 entries");
    options.history_entries = static_cast<size_t>(n);
  } else if (key == "expandable_page_mb") {
    HEADROOM_ASSIGN_OR_RETURN(uint64_t mib, ParseUint(key, value));
    if (mib == 0 || mib > (uint64_t{1} << 20)) return Bad(key, value, "a positive number of MiB");
    options.expandable_large_page_bytes = mib * kMiB;
  } else if (key == "move_free_pages") {
    HEADROOM_ASSIGN_OR_RETURN(options.move_free_pages, ParseBool(key, value));
  } else if (key == "move_threshold") {
    HEADROOM_ASSIGN_OR_RETURN(double t, ParseDouble(key, value));
    if (!(t >= 1.0 && t <= 100.0)) return Bad(key, value, "a ratio of reserved to peak allocated bytes in [1, 100]");
    options.move_threshold = t;
  } else if (key == "move_threshold_max") {
    HEADROOM_ASSIGN_OR_RETURN(double t, ParseDouble(key, value));
    if (!(t >= 1.0 && t <= 100.0)) return Bad(key, value, "a ratio of reserved to peak allocated bytes in [1, 100]");
    options.move_threshold_max = t;
  } else if (key == "unified_pool") {
    HEADROOM_ASSIGN_OR_RETURN(options.unified_pool, ParseBool(key, value));
  } else if (key == "reuse_layout_mb") {
    HEADROOM_ASSIGN_OR_RETURN(uint64_t mib, ParseUint(key, value));
    if (mib <= kReuseLayoutAbove / kMiB || mib > (uint64_t{1} << 20)) {
      return Bad(key, value, absl::StrFormat("more than %d (MiB)", kReuseLayoutAbove / kMiB));
    }
    options.reuse_layout_min_bytes = mib * kMiB;
  } else if (key == "align_growth") {
    HEADROOM_ASSIGN_OR_RETURN(options.align_growth, ParseBool(key, value));
  } else if (key == "stitch_pages") {
    HEADROOM_ASSIGN_OR_RETURN(options.stitch_pages, ParseBool(key, value));
  } else if (key == "layout_plan") {
    if (value.empty()) return Bad(key, value, "the path of a layout plan file");
    options.layout_plan_file = std::string(value);
  } else if (key == "release_lock_on_cudamalloc" || key.starts_with("pinned_")) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "key %s tunes a part of PyTorch's allocator that Headroom does not have "
        "(remove it)", QuoteForError(key)));
  } else {
    return absl::InvalidArgumentError(absl::StrFormat(
        "unknown key %s (known: max_split_size_mb, roundup_power2_divisions, "
        "garbage_collection_threshold, expandable_segments, backend, memory_fraction, hard_limit_mb, "
        "cross_stream_reuse, history_entries, expandable_page_mb, move_free_pages, move_threshold, "
        "move_threshold_max, unified_pool, reuse_layout_mb, align_growth, stitch_pages, layout_plan)",
        QuoteForError(key)));
  }
  return absl::OkStatus();
}

// The shortest text that parses back to the same double ("%g" keeps six
// digits: 0.9999999999 would print as 1, the default, and drop the key).
std::string ShortestDouble(double value) {
  char buffer[32];
  const auto [end, error] = std::to_chars(buffer, buffer + sizeof(buffer), value);
  return error == std::errc() ? std::string(buffer, end) : absl::StrFormat("%.17g", value);
}

}  // namespace

absl::StatusOr<AllocatorOptions> ParseAllocConf(std::string_view conf) {
  AllocatorOptions options;
  std::set<std::string, std::less<>> seen;
  size_t start = 0;
  while (start < conf.size()) {
    // Split at commas outside [...].
    size_t end = start;
    int depth = 0;
    for (; end < conf.size(); ++end) {
      if (conf[end] == '[') ++depth;
      if (conf[end] == ']') --depth;
      if (conf[end] == ',' && depth == 0) break;
    }
    if (depth != 0) {
      return absl::InvalidArgumentError(
          absl::StrFormat("unbalanced brackets in %s", QuoteForError(conf.substr(start, end - start))));
    }
    std::string_view item = Trim(conf.substr(start, end - start));
    start = end + 1;
    if (item.empty()) {
      if (start <= conf.size() && end < conf.size()) continue;  // tolerate "a:b,,c:d" and a trailing comma
      break;
    }
    const size_t colon = item.find(':');
    if (colon == std::string_view::npos) {
      return absl::InvalidArgumentError(
          absl::StrFormat("%s is not key:value", QuoteForError(item)));
    }
    std::string_view key = Trim(item.substr(0, colon));
    std::string_view value = Trim(item.substr(colon + 1));
    if (!seen.insert(std::string(key)).second) {
      return absl::InvalidArgumentError(absl::StrFormat("key %s given twice", QuoteForError(key)));
    }
    HEADROOM_RETURN_IF_ERROR(ApplyKey(key, value, options));
  }
  return options;
}

std::string FormatAllocConf(const AllocatorOptions& options) {
  const AllocatorOptions defaults;
  std::vector<std::string> parts;
  if (options.max_split_size != defaults.max_split_size) {
    parts.push_back(absl::StrFormat("max_split_size_mb:%d", options.max_split_size / kMiB));
  }
  if (!options.rounding.divisions_by_mib_interval.empty()) {
    const std::vector<uint32_t>& table = options.rounding.divisions_by_mib_interval;
    std::vector<std::string> entries;
    for (size_t i = 0; i < table.size(); ++i) {
      if (i == 0 || table[i] != table[i - 1]) {
        entries.push_back(absl::StrFormat("%d:%d", uint64_t{1} << i, table[i]));
      }
    }
    parts.push_back(absl::StrFormat("roundup_power2_divisions:[%s]", absl::StrJoin(entries, ",")));
  } else if (options.rounding.power2_divisions != defaults.rounding.power2_divisions) {
    parts.push_back(absl::StrFormat("roundup_power2_divisions:%d", options.rounding.power2_divisions));
  }
  if (options.garbage_collection_threshold != defaults.garbage_collection_threshold) {
    parts.push_back("garbage_collection_threshold:" + ShortestDouble(options.garbage_collection_threshold));
  }
  if (options.expandable_segments) parts.push_back("expandable_segments:True");
  if (options.memory_fraction != defaults.memory_fraction) {
    parts.push_back("memory_fraction:" + ShortestDouble(options.memory_fraction));
  }
  if (options.hard_limit_bytes != 0) parts.push_back(absl::StrFormat("hard_limit_mb:%d", options.hard_limit_bytes / kMiB));
  if (options.cross_stream_reuse) parts.push_back("cross_stream_reuse:True");
  if (options.history_entries != 0) parts.push_back(absl::StrFormat("history_entries:%d", options.history_entries));
  if (options.expandable_large_page_bytes != defaults.expandable_large_page_bytes) {
    parts.push_back(absl::StrFormat("expandable_page_mb:%d", options.expandable_large_page_bytes / kMiB));
  }
  if (options.move_free_pages) parts.push_back("move_free_pages:True");
  if (options.move_threshold != defaults.move_threshold) {
    parts.push_back("move_threshold:" + ShortestDouble(options.move_threshold));
  }
  if (options.move_threshold_max != defaults.move_threshold_max) {
    parts.push_back("move_threshold_max:" + ShortestDouble(options.move_threshold_max));
  }
  if (options.unified_pool) parts.push_back("unified_pool:True");
  if (options.reuse_layout_min_bytes != 0) {
    parts.push_back(absl::StrFormat("reuse_layout_mb:%d", options.reuse_layout_min_bytes / kMiB));
  }
  if (options.align_growth) parts.push_back("align_growth:True");
  if (options.stitch_pages) parts.push_back("stitch_pages:True");
  if (!options.layout_plan_file.empty()) parts.push_back("layout_plan:" + options.layout_plan_file);
  return absl::StrJoin(parts, ",");
}

const std::vector<AllocConfPreset>& AllocConfPresets() {
  static const auto* presets = new std::vector<AllocConfPreset>{
      {"pytorch-default", ""},
      {"expandable", "expandable_segments:True"},
      {"max-split-512", "max_split_size_mb:512"},
      {"power2-4", "roundup_power2_divisions:4"},
      {"gc-0.8", "garbage_collection_threshold:0.8"},
      // Headroom's own policy (Notes [One pool] and [Reusing a step's layout] in caching_allocator.h, [Moving free
      // pages] and [Page-aligned growth] in sources/expandable_segments.h, [Stitched blocks] in
      // sources/stitched_ranges.h).
      {"headroom",
       "expandable_segments:True,expandable_page_mb:2,unified_pool:True,cross_stream_reuse:True,move_free_pages:True,"
       "move_threshold:1.03,move_threshold_max:1.05,reuse_layout_mb:8,align_growth:True,stitch_pages:True"},
  };
  return *presets;
}

std::string ResolveAllocConfPreset(std::string_view text) {
  const size_t comma = text.find(',');
  const std::string_view head = Trim(text.substr(0, comma));
  for (const AllocConfPreset& preset : AllocConfPresets()) {
    if (preset.name != head) continue;
    if (comma == std::string_view::npos) return preset.conf;
    const std::string_view rest = text.substr(comma + 1);
    return preset.conf.empty() ? std::string(rest) : preset.conf + "," + std::string(rest);
  }
  return std::string(text);
}

absl::StatusOr<AllocatorOptions> ResolveAllocConf(std::string_view text_or_preset) {
  absl::StatusOr<AllocatorOptions> options = ParseAllocConf(ResolveAllocConfPreset(text_or_preset));
  if (options.ok()) return options;
  const std::string presets = absl::StrJoin(
      AllocConfPresets(), ", ", [](std::string* out, const AllocConfPreset& preset) { out->append(preset.name); });
  return absl::Status(options.status().code(),
                      absl::StrFormat("%s: %s (or a preset: %s)", QuoteForError(text_or_preset),
                                      options.status().message(), presets));
}

}  // namespace headroom

#include "common/quote.h"

#include <cstdint>

#include "absl/strings/str_format.h"

namespace headroom {
namespace {

// The length of the UTF-8 sequence at the start of `text` and its code
// point, or 0 when it is not a valid (shortest-form) sequence.
size_t Utf8Sequence(std::string_view text, uint32_t& code_point) {
  const auto byte = [&](size_t i) { return static_cast<unsigned char>(text[i]); };
  const unsigned char lead = byte(0);
  size_t length = 0;
  if (lead < 0x80) {
    code_point = lead;
    return 1;
  }
  if (lead >= 0xC2 && lead <= 0xDF) {
    length = 2;
    code_point = lead & 0x1F;
  } else if (lead >= 0xE0 && lead <= 0xEF) {
    length = 3;
    code_point = lead & 0x0F;
  } else if (lead >= 0xF0 && lead <= 0xF4) {
    length = 4;
    code_point = lead & 0x07;
  } else {
    return 0;
  }
  if (text.size() < length) return 0;
  for (size_t i = 1; i < length; ++i) {
    if ((byte(i) & 0xC0) != 0x80) return 0;
    code_point = (code_point << 6) | (byte(i) & 0x3F);
  }
  const bool overlong = (length == 3 && code_point < 0x800) || (length == 4 && code_point < 0x10000);
  const bool invalid = code_point > 0x10FFFF || (code_point >= 0xD800 && code_point <= 0xDFFF);
  return overlong || invalid ? 0 : length;
}

std::string Escape(std::string_view text, bool quoted) {
  std::string out;
  size_t chars = 0;
  size_t i = 0;
  while (i < text.size()) {
    if (chars == kMaxEchoedChars) {
      absl::StrAppendFormat(&out, "...%s (%d bytes)", quoted ? "'" : "", text.size());
      return out;
    }
    ++chars;
    uint32_t code_point = 0;
    const size_t length = Utf8Sequence(text.substr(i), code_point);
    if (length == 0) {
      absl::StrAppendFormat(&out, "\\x%02x", static_cast<unsigned char>(text[i]));
      ++i;
      continue;
    }
    switch (code_point) {
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\\': out += "\\\\"; break;
      case '\'':
        out += quoted ? "\\'" : "'";
        break;
      default:
        if (code_point < 0x20 || code_point == 0x7F) {
          absl::StrAppendFormat(&out, "\\x%02x", code_point);
        } else if (code_point >= 0x80 && code_point <= 0x9F) {  // C1: ESC [ to some terminals
          absl::StrAppendFormat(&out, "\\u%04x", code_point);
        } else {
          out.append(text.substr(i, length));
        }
    }
    i += length;
  }
  if (quoted) out += '\'';
  return out;
}

}  // namespace

std::string QuoteForError(std::string_view text) { return "'" + Escape(text, true); }

std::string EscapeForError(std::string_view text) { return Escape(text, false); }

}  // namespace headroom

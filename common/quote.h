// Text read from an input file, made safe to echo in an error message.
//
//   QuoteForError("llama")            -> 'llama'
//   QuoteForError("a\nb\x1b[2J")      -> 'a\nb\x1b[2J'        (escaped, one line)
//   QuoteForError(std::string(1 << 20, 'x'))
//                                     -> 'xx...' (1048576 bytes)   (80 x's, then "...")
//
// Errors are one line on a terminal (DESIGN.md, "the CLI turns it into one
// clear line"), so a name or value echoed from a file must not carry a
// newline, a terminal escape sequence or a 10 MB line into it. Control
// characters (C0, DEL, and C1 in UTF-8), bytes that are not UTF-8, the
// backslash and the quote are escaped; past kMaxEchoedChars characters the
// text is cut, with "..." and its size after it. Printable UTF-8 (names in
// any script) is kept as it is.
#ifndef HEADROOM_COMMON_QUOTE_H_
#define HEADROOM_COMMON_QUOTE_H_

#include <cstddef>
#include <string>
#include <string_view>

namespace headroom {

inline constexpr size_t kMaxEchoedChars = 80;

// The text between single quotes, escaped and cut as above.
std::string QuoteForError(std::string_view text);

// The same without the quotes, for text already set apart in its message
// (a JSON key in a field path); ordinary text comes back unchanged.
std::string EscapeForError(std::string_view text);

}  // namespace headroom

#endif  // HEADROOM_COMMON_QUOTE_H_

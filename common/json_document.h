// Parsing a JSON input document into nlohmann::json, within bounds, with
// errors that name the document:
//  - a syntax error gives the byte offset;
//  - an integer beyond 64 bits is refused as written, with its field path
//    (Note [Integers as written] in json_document.cc);
//  - arrays and objects nested deeper than kMaxJsonDepth are refused as the
//    parse reaches that level, before memory is spent on them (Note [JSON
//    nesting bound] in json_document.cc);
//  - running out of memory while parsing is ResourceExhausted naming the
//    document, not an exception.
// Files are read with ReadTextFile (common/input_file.h), whose size bound
// for each kind of input, with the nesting bound, bounds the memory a
// document takes (Note [Input bounds] there).
//
//   HEADROOM_ASSIGN_OR_RETURN(nlohmann::json doc, ParseJsonDocument(text, "config.json"));
//
// Fields of the document are then read with common/json_fields.h.
#ifndef HEADROOM_COMMON_JSON_DOCUMENT_H_
#define HEADROOM_COMMON_JSON_DOCUMENT_H_

#include <cstddef>
#include <string_view>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace headroom {

// The deepest arrays and objects may nest in an input document: `[]` is 1
// deep, `{"a": [1]}` 2. Real inputs nest at most 6 deep.
inline constexpr size_t kMaxJsonDepth = 128;

// Parses text as JSON. Errors name `document`: InvalidArgument for a syntax
// error (with the byte offset), an integer beyond 64 bits (with its path) or
// nesting beyond kMaxJsonDepth (with the byte where it goes past);
// ResourceExhausted when memory ran out.
absl::StatusOr<nlohmann::json> ParseJsonDocument(std::string_view text, std::string_view document);

}  // namespace headroom

#endif  // HEADROOM_COMMON_JSON_DOCUMENT_H_

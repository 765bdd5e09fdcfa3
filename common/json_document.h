// Parsing a JSON input document into nlohmann::json, with errors that name
// the document: a syntax error gives the byte offset, and an integer beyond
// 64 bits is refused as written, with its field path (Note [Integers as
// written] in json_document.cc).
//
//   HEADROOM_ASSIGN_OR_RETURN(nlohmann::json doc, ParseJsonDocument(text, "config.json"));
//
// Fields of the document are then read with common/json_fields.h.
#ifndef HEADROOM_COMMON_JSON_DOCUMENT_H_
#define HEADROOM_COMMON_JSON_DOCUMENT_H_

#include <string_view>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace headroom {

// Parses text as JSON; a syntax error names the document and byte offset.
absl::StatusOr<nlohmann::json> ParseJsonDocument(std::string_view text, std::string_view document);

}  // namespace headroom

#endif  // HEADROOM_COMMON_JSON_DOCUMENT_H_

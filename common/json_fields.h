// Typed, path-aware field access for nlohmann::json documents.
//
// Every parser in Headroom reads untrusted JSON (catalogs, config.json, graph
// files, snapshots). These helpers never throw: a missing or mistyped field
// becomes an InvalidArgument status naming the field by its path, e.g.
//
//   JsonPath path("gpus.json");
//   absl::StatusOr<uint64_t> bytes = RequireUint(gpu, "memory_bytes", path / "gpus" / 3);
//   // error: "gpus.json: gpus[3].memory_bytes: expected a non-negative integer, got string"
#ifndef HEADROOM_COMMON_JSON_FIELDS_H_
#define HEADROOM_COMMON_JSON_FIELDS_H_

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/input_file.h"     // ReadTextFile, for the callers that read a document's file
#include "common/json_document.h"  // ParseJsonDocument, likewise
#include "nlohmann/json.hpp"

namespace headroom {

// Where a value sits in a document: the document's name plus a JSON path.
class JsonPath {
 public:
  explicit JsonPath(std::string_view document) : document_(document) {}

  JsonPath operator/(std::string_view key) const;
  JsonPath operator/(size_t index) const;

  // "document: a.b[2].c" (or just "document" at the root).
  std::string ToString() const;
  // InvalidArgument "<path>: <message>".
  absl::Status Error(std::string_view message) const;

 private:
  std::string document_;
  std::string path_;
};

// "object", "array", "string", "number", "boolean", "null".
std::string_view JsonTypeName(const nlohmann::json& value);

// Field readers: `object` must be a JSON object (checked), `path` is the
// object's own path. Require* fail when the field is absent.
absl::StatusOr<const nlohmann::json*> RequireField(const nlohmann::json& object, std::string_view key,
                                                   const JsonPath& path);
absl::StatusOr<std::string> RequireString(const nlohmann::json& object, std::string_view key,
                                          const JsonPath& path);
absl::StatusOr<uint64_t> RequireUint(const nlohmann::json& object, std::string_view key,
                                     const JsonPath& path);
absl::StatusOr<int64_t> RequireInt(const nlohmann::json& object, std::string_view key,
                                   const JsonPath& path);
absl::StatusOr<double> RequireNumber(const nlohmann::json& object, std::string_view key,
                                     const JsonPath& path);
absl::StatusOr<bool> RequireBool(const nlohmann::json& object, std::string_view key,
                                 const JsonPath& path);

// Value readers for elements already in hand (array items, map values).
absl::StatusOr<std::string> AsString(const nlohmann::json& value, const JsonPath& path);
absl::StatusOr<uint64_t> AsUint(const nlohmann::json& value, const JsonPath& path);
absl::StatusOr<int64_t> AsInt(const nlohmann::json& value, const JsonPath& path);
absl::StatusOr<double> AsNumber(const nlohmann::json& value, const JsonPath& path);
absl::StatusOr<bool> AsBool(const nlohmann::json& value, const JsonPath& path);

}  // namespace headroom

#endif  // HEADROOM_COMMON_JSON_FIELDS_H_

#include "common/json_fields.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/quote.h"

namespace headroom {

using nlohmann::json;

JsonPath JsonPath::operator/(std::string_view key) const {
  JsonPath next = *this;
  if (!next.path_.empty()) next.path_ += '.';
  next.path_ += EscapeForError(key);  // keys come from the file: one line, cut if long
  return next;
}

JsonPath JsonPath::operator/(size_t index) const {
  JsonPath next = *this;
  absl::StrAppend(&next.path_, "[", index, "]");
  return next;
}

std::string JsonPath::ToString() const {
  return path_.empty() ? document_ : absl::StrCat(document_, ": ", path_);
}

absl::Status JsonPath::Error(std::string_view message) const {
  return absl::InvalidArgumentError(absl::StrFormat("%s: %s", ToString(), message));
}

std::string_view JsonTypeName(const json& value) {
  switch (value.type()) {
    case json::value_t::object: return "object";
    case json::value_t::array: return "array";
    case json::value_t::string: return "string";
    case json::value_t::boolean: return "boolean";
    case json::value_t::null: return "null";
    case json::value_t::number_integer:
    case json::value_t::number_unsigned:
    case json::value_t::number_float: return "number";
    default: return "binary";
  }
}

namespace {

absl::Status Mistyped(const json& value, const JsonPath& path, std::string_view expected) {
  return path.Error(absl::StrFormat("expected %s, got %s", expected, JsonTypeName(value)));
}

}  // namespace

absl::StatusOr<const json*> RequireField(const json& object, std::string_view key,
                                         const JsonPath& path) {
  if (!object.is_object()) return Mistyped(object, path, "an object");
  auto it = object.find(key);
  if (it == object.end()) return (path / key).Error("required field is missing");
  return &*it;
}

absl::StatusOr<std::string> AsString(const json& value, const JsonPath& path) {
  if (!value.is_string()) return Mistyped(value, path, "a string");
  return value.get<std::string>();
}

absl::StatusOr<uint64_t> AsUint(const json& value, const JsonPath& path) {
  if (value.is_number_unsigned()) return value.get<uint64_t>();
  if (value.is_number_integer()) {
    return path.Error(absl::StrCat("expected a non-negative integer, got ", value.get<int64_t>()));
  }
  if (value.is_number_float()) {
    const double d = value.get<double>();
    // Accept 1e9-style integral floats, as hand-written files use them.
    if (std::isfinite(d) && d >= 0 && d < 18446744073709551616.0 && d == std::floor(d)) {
      return static_cast<uint64_t>(d);
    }
    return path.Error(absl::StrCat("expected a non-negative integer, got ", value.dump()));
  }
  return Mistyped(value, path, "a non-negative integer");
}

absl::StatusOr<int64_t> AsInt(const json& value, const JsonPath& path) {
  if (value.is_number_integer() && !value.is_number_unsigned()) return value.get<int64_t>();
  if (value.is_number_unsigned()) {
    const uint64_t u = value.get<uint64_t>();
    if (u > static_cast<uint64_t>(INT64_MAX)) return path.Error("integer is too large");
    return static_cast<int64_t>(u);
  }
  if (value.is_number_float()) {
    const double d = value.get<double>();
    if (std::isfinite(d) && d == std::floor(d) && std::fabs(d) < 9.2e18) {
      return static_cast<int64_t>(d);
    }
    return path.Error(absl::StrCat("expected an integer, got ", value.dump()));
  }
  return Mistyped(value, path, "an integer");
}

absl::StatusOr<double> AsNumber(const json& value, const JsonPath& path) {
  if (!value.is_number()) return Mistyped(value, path, "a number");
  const double d = value.get<double>();
  if (!std::isfinite(d)) return path.Error("expected a finite number");
  return d;
}

absl::StatusOr<bool> AsBool(const json& value, const JsonPath& path) {
  if (!value.is_boolean()) return Mistyped(value, path, "true or false");
  return value.get<bool>();
}

#define HEADROOM_REQUIRE_VIA(Type, Name, As)                                       \
  absl::StatusOr<Type> Name(const json& object, std::string_view key,             \
                            const JsonPath& path) {                               \
    absl::StatusOr<const json*> field = RequireField(object, key, path);         \
    if (!field.ok()) return field.status();                                       \
    return As(**field, path / key);                                               \
  }

HEADROOM_REQUIRE_VIA(std::string, RequireString, AsString)
HEADROOM_REQUIRE_VIA(uint64_t, RequireUint, AsUint)
HEADROOM_REQUIRE_VIA(int64_t, RequireInt, AsInt)
HEADROOM_REQUIRE_VIA(double, RequireNumber, AsNumber)
HEADROOM_REQUIRE_VIA(bool, RequireBool, AsBool)
#undef HEADROOM_REQUIRE_VIA

}  // namespace headroom

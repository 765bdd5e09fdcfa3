#include "common/json_fields.h"

#include <sys/stat.h>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>
#include <optional>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/quote.h"
#include "common/units.h"

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

namespace {

// Note [Integers as written]: nlohmann's parser reads an integer literal
// that does not fit in 64 bits as a double, which a field reader would then
// echo as the double (18446744073709551616 as 1.8446744073709552e+19) or,
// where it is integral, accept rounded. This pass over the document's
// events finds the first such literal, as written, with its field path.
class OversizedIntegerFinder final : public nlohmann::json_sax<json> {
 public:
  explicit OversizedIntegerFinder(std::string_view document) : document_(document) {}

  // The error naming the literal, once the parse stopped at one.
  std::optional<absl::Status> found() const { return found_; }

  bool null() override { return Value(); }
  bool boolean(bool) override { return Value(); }
  bool number_integer(number_integer_t) override { return Value(); }
  bool number_unsigned(number_unsigned_t) override { return Value(); }
  bool number_float(number_float_t, const string_t& text) override {
    if (text.find_first_of(".eE") != string_t::npos) return Value();
    found_ = Path().Error(absl::StrFormat("%s is too large an integer (the range is %d to %d)", EscapeForError(text),
                                          std::numeric_limits<int64_t>::min(), std::numeric_limits<uint64_t>::max()));
    return false;
  }
  bool string(string_t&) override { return Value(); }
  bool binary(binary_t&) override { return Value(); }
  bool start_object(std::size_t) override {
    frames_.push_back({});
    return true;
  }
  bool key(string_t& key) override {
    frames_.back().key = key;
    return true;
  }
  bool end_object() override { return End(); }
  bool start_array(std::size_t) override {
    frames_.push_back({.array = true});
    return true;
  }
  bool end_array() override { return End(); }
  bool parse_error(std::size_t, const std::string&, const json::exception&) override { return false; }

 private:
  struct Frame {
    bool array = false;
    size_t index = 0;
    std::string key;
  };
  // A value has ended: the next one in an array is one further on.
  bool Value() {
    if (!frames_.empty() && frames_.back().array) ++frames_.back().index;
    return true;
  }
  bool End() {
    frames_.pop_back();
    return Value();
  }
  JsonPath Path() const {
    JsonPath path(document_);
    for (const Frame& f : frames_) path = f.array ? path / f.index : path / f.key;
    return path;
  }

  std::string_view document_;
  std::vector<Frame> frames_;
  std::optional<absl::Status> found_;
};

// Whether `text` holds 19 digits in a row: every integer literal beyond
// 64 bits does, and few documents otherwise do (a snapshot's times are 16).
bool HasLongDigitRun(std::string_view text) {
  size_t run = 0;
  for (const char c : text) {
    run = (c >= '0' && c <= '9') ? run + 1 : 0;
    if (run == 19) return true;
  }
  return false;
}

}  // namespace

absl::StatusOr<json> ParseJsonDocument(std::string_view text, std::string_view document) {
  // The callback-free, exception-free form returns a "discarded" value on error
  // but loses the position, so parse once more with exceptions for the message.
  json value = json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (!value.is_discarded()) {
    if (HasLongDigitRun(text)) {  // Note [Integers as written]
      OversizedIntegerFinder finder(document);
      (void)json::sax_parse(text.begin(), text.end(), &finder);
      if (finder.found()) return *finder.found();
    }
    return value;
  }
  try {
    value = json::parse(text.begin(), text.end());
  } catch (const json::parse_error& e) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: not valid JSON at byte %d: %s", document, e.byte, e.what()));
  } catch (const json::exception& e) {  // e.g. out_of_range: a number beyond double's range
    return absl::InvalidArgumentError(absl::StrFormat("%s: not valid JSON: %s", document, e.what()));
  }
  return absl::InvalidArgumentError(absl::StrFormat("%s: not valid JSON", document));
}

absl::StatusOr<std::string> ReadTextFile(const std::string& path, uint64_t max_bytes) {
  // stat before open: opening a FIFO for reading blocks until a writer comes.
  struct stat info {};
  if (::stat(path.c_str(), &info) != 0) {
    return absl::NotFoundError(absl::StrCat(path, ": cannot open file: ", std::strerror(errno)));
  }
  if (S_ISDIR(info.st_mode)) return absl::InvalidArgumentError(absl::StrCat(path, ": is a directory, not a file"));
  if (!S_ISREG(info.st_mode)) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": is not a regular file (a device, FIFO or socket); give the path of a file"));
  }
  auto too_large = [&](uint64_t bytes) {
    return absl::InvalidArgumentError(absl::StrFormat("%s: %d bytes is more than the %s an input file may have", path,
                                                      bytes, FormatBytes(max_bytes)));
  };
  if (static_cast<uint64_t>(info.st_size) > max_bytes) return too_large(static_cast<uint64_t>(info.st_size));
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot open file"));
  std::string contents(static_cast<size_t>(info.st_size), '\0');
  in.read(contents.data(), static_cast<std::streamsize>(contents.size()));
  if (in.bad()) return absl::DataLossError(absl::StrCat(path, ": read error"));
  contents.resize(static_cast<size_t>(in.gcount()));
  if (in) {  // the file may have grown: read the rest, still bounded
    char buffer[1 << 16];
    while (in.read(buffer, sizeof buffer) || in.gcount() > 0) {
      contents.append(buffer, static_cast<size_t>(in.gcount()));
      if (contents.size() > max_bytes) return too_large(contents.size());
    }
    if (in.bad()) return absl::DataLossError(absl::StrCat(path, ": read error"));
  }
  return contents;
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

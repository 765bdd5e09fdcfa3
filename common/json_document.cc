#include "common/json_document.h"

#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "common/json_fields.h"
#include "common/quote.h"

namespace headroom {

using nlohmann::json;

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

}  // namespace headroom

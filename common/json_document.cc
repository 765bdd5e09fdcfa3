#include "common/json_document.h"

#include <cstddef>
#include <iterator>
#include <limits>
#include <new>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_format.h"
#include "common/json_fields.h"
#include "common/quote.h"
#include "common/units.h"

namespace headroom {

using nlohmann::json;

namespace {

// Note [JSON nesting bound]
// nlohmann's parser nests without limit, and a level costs far more than its
// byte of text: an array inside an array is a json value, a vector and slots
// on the parser's stacks, so a 50 MB file of '[' took 3 GB before the parser
// found it unterminated, and a memory limit turned that into an abort with no
// message. No input Headroom reads nests more than 6 deep (a PyTorch
// snapshot's segments[i].blocks[j].frames[k]; plans, graphs, fixtures and
// configs less), so a document nested beyond kMaxJsonDepth is refused when
// the parse reaches that level, before memory is spent on it: the document
// is built here from the parser's SAX events, and the event that opens one
// level too many stops the parse.
//
// Note [Integers as written]: nlohmann's parser reads an integer literal
// that does not fit in 64 bits as a double, which a field reader would then
// echo as the double (18446744073709551616 as 1.8446744073709552e+19) or,
// where it is integral, accept rounded. The builder notes the first such
// literal, as written, with its field path; a document that holds one is
// refused once it has parsed (a syntax error anywhere is reported first).
//
// Note [Freeing a document without memory]
// nlohmann's json destructor frees an array or object through a vector of
// its children that it allocates first, so destroying a large document when
// memory has run out throws std::bad_alloc from a destructor, which
// terminates. Dismantle empties containers from the innermost out, popping
// the last child each time, which allocates nothing; it recurses at most
// kMaxJsonDepth deep. The builder keeps each open value in its stack until
// its parent holds it, so that all it built can be dismantled so. A document
// that parsed is freed by its owner, through nlohmann's destructor: if
// memory is short by then (the vector it needs is 16 bytes a child of the
// largest array or object), that still terminates.
void Dismantle(json& value) noexcept {
  if (value.is_array()) {
    auto& array = value.get_ref<json::array_t&>();
    while (!array.empty()) {
      Dismantle(array.back());
      array.pop_back();
    }
  } else if (value.is_object()) {
    auto& object = value.get_ref<json::object_t&>();
    while (!object.empty()) {
      const auto last = std::prev(object.end());
      Dismantle(last->second);
      object.erase(last);
    }
  }
}

class BoundedDocumentBuilder {
 public:
  using number_integer_t = json::number_integer_t;
  using number_unsigned_t = json::number_unsigned_t;
  using number_float_t = json::number_float_t;
  using string_t = json::string_t;
  using binary_t = json::binary_t;

  explicit BoundedDocumentBuilder(std::string_view document) : document_(document) {}

  bool null() { return Add(nullptr); }
  bool boolean(bool value) { return Add(value); }
  bool number_integer(number_integer_t value) { return Add(value); }
  bool number_unsigned(number_unsigned_t value) { return Add(value); }
  bool number_float(number_float_t value, const string_t& text) {
    // Only a literal too large for 64 bits comes as a float without '.', 'e' or 'E'.
    if (!oversized_integer_.has_value() && text.find_first_of(".eE") == string_t::npos) {
      oversized_integer_ =
          Path().Error(absl::StrFormat("%s is too large an integer (the range is %d to %d)", EscapeForError(text),
                                       std::numeric_limits<int64_t>::min(), std::numeric_limits<uint64_t>::max()));
    }
    return Add(value);
  }
  bool string(string_t& value) { return Add(value); }
  bool binary(binary_t& value) { return Add(json::binary(value)); }  // CBOR and the like; never from JSON text
  bool start_object(std::size_t) { return Open(json::value_t::object); }
  bool start_array(std::size_t) { return Open(json::value_t::array); }
  bool key(string_t& key) {
    open_.back().key = key;
    return true;
  }
  bool end_object() { return Close(); }
  bool end_array() { return Close(); }
  bool parse_error(std::size_t, const std::string&, const json::exception& e) {
    if (const auto* syntax = dynamic_cast<const json::parse_error*>(&e)) {
      error_ = absl::InvalidArgumentError(
          absl::StrFormat("%s: not valid JSON at byte %d: %s", document_, syntax->byte, syntax->what()));
    } else {  // e.g. out_of_range: a number beyond double's range
      error_ = absl::InvalidArgumentError(absl::StrFormat("%s: not valid JSON: %s", document_, e.what()));
    }
    return false;
  }

  // Whether the parse stopped at a level beyond kMaxJsonDepth.
  bool too_deep() const { return too_deep_; }
  // The syntax error the parser reported, if any.
  const std::optional<absl::Status>& error() const { return error_; }
  const std::optional<absl::Status>& oversized_integer() const { return oversized_integer_; }
  // The document, once the parse succeeded.
  json TakeDocument() && { return std::move(root_); }
  // Frees what was built, allocating nothing, for when memory ran out (Note
  // [Freeing a document without memory]).
  void Release() noexcept {
    for (; !open_.empty(); open_.pop_back()) Dismantle(open_.back().value);
    Dismantle(root_);
  }

 private:
  // An array or object still open, and for an object the key of its next value.
  struct OpenValue {
    json value;
    std::string key;
  };

  template <typename Value>
  bool Add(Value&& value) {
    if (open_.empty()) {
      root_ = json(std::forward<Value>(value));
    } else if (OpenValue& parent = open_.back(); parent.value.is_array()) {
      parent.value.emplace_back(std::forward<Value>(value));
    } else {
      parent.value[parent.key] = json(std::forward<Value>(value));  // a repeated key: the last value stays
    }
    return true;
  }
  bool Open(json::value_t type) {
    if (open_.size() >= kMaxJsonDepth) {  // Note [JSON nesting bound]
      too_deep_ = true;
      return false;
    }
    open_.push_back({.value = json(type)});
    return true;
  }
  // The value leaves open_ only once its parent has room for it (Note
  // [Freeing a document without memory]).
  bool Close() {
    json& value = open_.back().value;
    if (open_.size() == 1) {
      root_ = std::move(value);
    } else if (OpenValue& parent = open_[open_.size() - 2]; parent.value.is_array()) {
      parent.value.emplace_back(std::move(value));  // the vector moves it in once it has grown, if it must
    } else {
      json& slot = parent.value[parent.key];  // a repeated key: the last value stays
      slot = std::move(value);
    }
    open_.pop_back();
    return true;
  }
  // Where the next value goes, e.g. "doc.json: steps[1].end".
  JsonPath Path() const {
    JsonPath path(document_);
    for (const OpenValue& open : open_) path = open.value.is_array() ? path / open.value.size() : path / open.key;
    return path;
  }

  std::string_view document_;
  json root_;
  std::vector<OpenValue> open_;
  bool too_deep_ = false;
  std::optional<absl::Status> error_;
  std::optional<absl::Status> oversized_integer_;
};

// The 1-based byte offset of the '[' or '{' that opens level `depth` + 1 of
// `text`, which is valid JSON up to there: strings are skipped, so brackets
// inside them do not count. Run only for the error of a refused document.
size_t OffsetOfLevel(std::string_view text, size_t depth) {
  size_t level = 0;
  bool in_string = false;
  bool escaped = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (escaped) {
        escaped = false;
      } else if (c == '\\') {
        escaped = true;
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++level > depth) return i + 1;
    } else if ((c == ']' || c == '}') && level > 0) {
      --level;
    }
  }
  return text.size();
}

}  // namespace

absl::StatusOr<json> ParseJsonDocument(std::string_view text, std::string_view document) {
  BoundedDocumentBuilder builder(document);
  try {
    if (!json::sax_parse(text.begin(), text.end(), &builder)) {
      if (builder.too_deep()) {
        return absl::InvalidArgumentError(
            absl::StrFormat("%s: arrays and objects nested %d deep at byte %d, more than the %d levels an input may "
                            "have",
                            document, kMaxJsonDepth + 1, OffsetOfLevel(text, kMaxJsonDepth), kMaxJsonDepth));
      }
      if (builder.error().has_value()) return *builder.error();
      return absl::InvalidArgumentError(absl::StrFormat("%s: not valid JSON", document));
    }
    if (builder.oversized_integer().has_value()) return *builder.oversized_integer();
    return std::move(builder).TakeDocument();
  } catch (const std::bad_alloc&) {
    builder.Release();
    return absl::ResourceExhaustedError(absl::StrFormat("%s: out of memory parsing its %s of JSON (%d bytes)",
                                                        document, FormatBytes(text.size()), text.size()));
  }
}

}  // namespace headroom

#include "models/quantization_config.h"

#include <regex>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/name_table.h"
#include "common/quote.h"
#include "common/status_macros.h"
#include "models/config_parsing.h"

namespace headroom {
namespace {

using nlohmann::json;
using namespace models_internal;  // Present, OptionalInt, OptionalBool: config.json's field helpers

constexpr NameTable<QuantMethod, 10> kQuantMethodNames("quantization", {{
    {"none", QuantMethod::kUnquantized},
    {"awq", QuantMethod::kAwq},
    {"gptq", QuantMethod::kGptq},
    {"fp8", QuantMethod::kFp8},
    {"bitsandbytes", QuantMethod::kBitsAndBytes},
    {"compressed-tensors", QuantMethod::kCompressedTensors},
    {"mxfp4", QuantMethod::kMxfp4},
    {"awq_marlin", QuantMethod::kAwq, kAlias},
    {"gptq_marlin", QuantMethod::kGptq, kAlias},
    {"compressed_tensors", QuantMethod::kCompressedTensors, kAlias},
}});

// An optional string field: "" when it is not Present.
absl::StatusOr<std::string> StringField(const json& object, std::string_view key, const JsonPath& path) {
  if (!Present(object, key)) return std::string();
  return RequireString(object, key, path);
}

absl::Status AppendNames(const json& object, std::string_view key, const JsonPath& path,
                         std::vector<std::string>& out) {
  if (!Present(object, key)) return absl::OkStatus();
  const json& list = object[std::string(key)];
  if (!list.is_array()) return (path / key).Error(absl::StrFormat("expected an array of module names, got %s", JsonTypeName(list)));
  for (size_t i = 0; i < list.size(); ++i) {
    if (!list[i].is_string()) {
      return (path / key / i).Error(absl::StrFormat("expected a module name, got %s", JsonTypeName(list[i])));
    }
    out.push_back(list[i].get<std::string>());
  }
  return absl::OkStatus();
}

absl::Status CheckBits(int bits, std::initializer_list<int> allowed, std::string_view method, const JsonPath& path) {
  for (int b : allowed) {
    if (bits == b) return absl::OkStatus();
  }
  return path.Error(absl::StrFormat("%d-bit %s weights are not a format the engines load (%s)", bits, method,
                                    absl::StrJoin(allowed, " or ", [](std::string* out, int b) {
                                      absl::StrAppend(out, b, "-bit");
                                    })));
}

absl::Status CheckGroupSize(int64_t group_size, const JsonPath& path) {
  if (group_size == -1 || (group_size > 0 && group_size <= (int64_t{1} << 20))) return absl::OkStatus();
  return path.Error(absl::StrFormat("must be -1 (per column) or positive, got %d", group_size));
}

// compressed-tensors: the first config group's weight scheme (llm-compressor writes one group for the
// Linear layers; mixed schemes are not modelled).
absl::Status ParseCompressedTensors(const json& object, const JsonPath& path, QuantizationConfig& q) {
  HEADROOM_RETURN_IF_ERROR(AppendNames(object, "ignore", path, q.unquantized_modules));
  if (!Present(object, "config_groups") || !object["config_groups"].is_object() || object["config_groups"].empty()) {
    return (path / "config_groups").Error("expected an object with at least one group");
  }
  const auto first = object["config_groups"].begin();
  const JsonPath group_path = path / "config_groups" / first.key();
  if (!first->is_object() || !Present(*first, "weights") || !(*first)["weights"].is_object()) {
    return (group_path / "weights").Error("expected the group's weight scheme (an object)");
  }
  const json& weights = (*first)["weights"];
  const JsonPath weights_path = group_path / "weights";
  HEADROOM_ASSIGN_OR_RETURN(int64_t bits, OptionalInt(weights, "num_bits", weights_path, 8));
  q.bits = static_cast<int>(bits);
  HEADROOM_ASSIGN_OR_RETURN(std::string type, StringField(weights, "type", weights_path));
  q.float_weights = type == "float";
  HEADROOM_RETURN_IF_ERROR(CheckBits(q.bits, q.float_weights ? std::initializer_list<int>{8} : std::initializer_list<int>{4, 8},
                                     "compressed-tensors", weights_path / "num_bits"));
  HEADROOM_ASSIGN_OR_RETURN(std::string strategy, StringField(weights, "strategy", weights_path));
  if (strategy == "group") {
    HEADROOM_ASSIGN_OR_RETURN(q.group_size, OptionalInt(weights, "group_size", weights_path, 128));
    HEADROOM_RETURN_IF_ERROR(CheckGroupSize(q.group_size, weights_path / "group_size"));
  } else if (strategy == "block") {
    if (!Present(weights, "block_structure") || !weights["block_structure"].is_array() ||
        weights["block_structure"].size() != 2) {
      return (weights_path / "block_structure").Error("expected [rows, cols]");
    }
    for (const json& d : weights["block_structure"]) {
      if (!d.is_number_integer() || d.get<int64_t>() <= 0) {
        return (weights_path / "block_structure").Error("expected two positive integers");
      }
      q.weight_block.push_back(d.get<int64_t>());
    }
  }
  HEADROOM_ASSIGN_OR_RETURN(bool symmetric, OptionalBool(weights, "symmetric", weights_path, true));
  q.zero_point = !symmetric;
  q.act_order = Present(weights, "actorder") && weights["actorder"] != false;
  return absl::OkStatus();
}

// Whether `pattern` matches all of `text`, '*' standing for any run of characters.
bool GlobMatch(std::string_view pattern, std::string_view text) {
  size_t p = 0, t = 0, star = std::string_view::npos, mark = 0;
  while (t < text.size()) {
    if (p < pattern.size() && pattern[p] == '*') {
      star = p++;
      mark = t;
    } else if (p < pattern.size() && pattern[p] == text[t]) {
      ++p;
      ++t;
    } else if (star != std::string_view::npos) {
      p = star + 1;
      t = ++mark;
    } else {
      return false;
    }
  }
  while (p < pattern.size() && pattern[p] == '*') ++p;
  return p == pattern.size();
}

}  // namespace

std::string_view QuantMethodName(QuantMethod method) { return kQuantMethodNames.Name(method); }

absl::StatusOr<QuantMethod> ParseQuantMethod(std::string_view name) { return kQuantMethodNames.Parse(name); }

bool QuantizationConfig::LeavesUnquantized(std::string_view name) const {
  for (const std::string& pattern : unquantized_modules) {
    if (absl::StartsWith(pattern, "re:")) {
      if (std::regex_search(std::string(name), std::regex(pattern.substr(3)))) return true;
    } else if (GlobMatch(absl::StrCat("*", pattern, "*"), name)) {  // transformers tests `key in name`
      return true;
    }
  }
  return false;
}

absl::StatusOr<QuantizationConfig> ParseQuantizationConfig(const json& object, const JsonPath& path) {
  if (!object.is_object()) return path.Error(absl::StrFormat("expected an object, got %s", JsonTypeName(object)));
  HEADROOM_ASSIGN_OR_RETURN(std::string name, StringField(object, "quant_method", path));
  if (name.empty()) return (path / "quant_method").Error("required field is missing");
  absl::StatusOr<QuantMethod> method = ParseQuantMethod(name);
  if (!method.ok()) return (path / "quant_method").Error(std::string(method.status().message()));
  QuantizationConfig q{.method = *method};
  HEADROOM_RETURN_IF_ERROR(AppendNames(object, "modules_to_not_convert", path, q.unquantized_modules));
  switch (q.method) {
    case QuantMethod::kUnquantized:
      q.bits = 16;
      break;
    case QuantMethod::kAwq:
    case QuantMethod::kGptq: {
      HEADROOM_ASSIGN_OR_RETURN(int64_t bits, OptionalInt(object, q.method == QuantMethod::kAwq ? "w_bit" : "bits", path,
                                                       -1));
      if (bits == -1) {
        HEADROOM_ASSIGN_OR_RETURN(bits, OptionalInt(object, "bits", path, 4));
      }
      q.bits = static_cast<int>(bits);
      HEADROOM_RETURN_IF_ERROR(CheckBits(q.bits, q.method == QuantMethod::kAwq ? std::initializer_list<int>{4}
                                                                                : std::initializer_list<int>{4, 8},
                                         name, path / "bits"));
      HEADROOM_ASSIGN_OR_RETURN(int64_t q_group, OptionalInt(object, "q_group_size", path, 0));
      HEADROOM_ASSIGN_OR_RETURN(q.group_size, OptionalInt(object, "group_size", path, q_group != 0 ? q_group : 128));
      HEADROOM_RETURN_IF_ERROR(CheckGroupSize(q.group_size, path / "group_size"));
      HEADROOM_ASSIGN_OR_RETURN(q.zero_point, OptionalBool(object, "zero_point", path, true));
      HEADROOM_ASSIGN_OR_RETURN(q.act_order, OptionalBool(object, "desc_act", path, false));
      break;
    }
    case QuantMethod::kFp8: {
      q.bits = 8;
      q.float_weights = true;
      HEADROOM_RETURN_IF_ERROR(AppendNames(object, "ignored_layers", path, q.unquantized_modules));
      if (Present(object, "weight_block_size")) {
        const json& block = object["weight_block_size"];
        if (!block.is_array() || block.size() != 2) return (path / "weight_block_size").Error("expected [rows, cols]");
        for (const json& d : block) {
          if (!d.is_number_integer() || d.get<int64_t>() <= 0) {
            return (path / "weight_block_size").Error("expected two positive integers");
          }
          q.weight_block.push_back(d.get<int64_t>());
        }
      }
      break;
    }
    case QuantMethod::kBitsAndBytes: {
      HEADROOM_ASSIGN_OR_RETURN(bool four, OptionalBool(object, "load_in_4bit", path, false));
      HEADROOM_ASSIGN_OR_RETURN(bool eight, OptionalBool(object, "load_in_8bit", path, false));
      if (four == eight) return path.Error("load_in_4bit or load_in_8bit: exactly one must be true");
      q.bits = four ? 4 : 8;
      q.group_size = 64;  // bitsandbytes' blocksize for NF4/FP4 absmax
      HEADROOM_ASSIGN_OR_RETURN(q.double_quant, OptionalBool(object, "bnb_4bit_use_double_quant", path, false));
      HEADROOM_RETURN_IF_ERROR(AppendNames(object, "llm_int8_skip_modules", path, q.unquantized_modules));
      break;
    }
    case QuantMethod::kCompressedTensors:
      HEADROOM_RETURN_IF_ERROR(ParseCompressedTensors(object, path, q));
      break;
    case QuantMethod::kMxfp4:
      q.bits = 4;
      q.float_weights = true;
      q.group_size = 32;
      break;
  }
  return q;
}

}  // namespace headroom

#include "job/precision.h"

#include <string>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_format.h"

namespace headroom {
namespace {

constexpr std::pair<std::string_view, Precision> kNames[] = {
    {"fp32", Precision::kFp32},           {"tf32", Precision::kTf32},
    {"fp16-mixed", Precision::kFp16Mixed}, {"bf16-mixed", Precision::kBf16Mixed},
    {"bf16", Precision::kBf16},           {"fp16", Precision::kFp16},
    {"fp8", Precision::kFp8},             {"float32", Precision::kFp32},
    {"mixed-fp16", Precision::kFp16Mixed}, {"mixed-bf16", Precision::kBf16Mixed},
    {"amp-fp16", Precision::kFp16Mixed},  {"amp-bf16", Precision::kBf16Mixed},
    {"16-mixed", Precision::kFp16Mixed},  {"bf16-true", Precision::kBf16},
    {"pure-bf16", Precision::kBf16},      {"pure-fp16", Precision::kFp16},
    {"fp8-mixed", Precision::kFp8},
};

}  // namespace

std::string_view PrecisionName(Precision precision) {
  switch (precision) {
    case Precision::kFp32: return "fp32";
    case Precision::kTf32: return "tf32";
    case Precision::kFp16Mixed: return "fp16-mixed";
    case Precision::kBf16Mixed: return "bf16-mixed";
    case Precision::kBf16: return "bf16";
    case Precision::kFp16: return "fp16";
    case Precision::kFp8: return "fp8";
  }
  return "unknown";
}

absl::StatusOr<Precision> ParsePrecision(std::string_view name) {
  const std::string lower = absl::AsciiStrToLower(std::string(name));
  for (const auto& [n, precision] : kNames) {
    if (n == lower) return precision;
  }
  return absl::InvalidArgumentError(absl::StrFormat(
      "unknown precision '%s' (expected fp32, tf32, fp16-mixed, bf16-mixed, bf16, fp16 or fp8)",
      name));
}

PrecisionSetup SetupFor(Precision precision) {
  switch (precision) {
    case Precision::kFp32:
      return {.precision = precision};
    case Precision::kTf32:
      return {.precision = precision, .allow_tf32 = true};
    case Precision::kFp16Mixed:
      return {.precision = precision, .weight_dtype = DType::kF16, .compute_dtype = DType::kF16,
              .master_weights = true};
    case Precision::kBf16Mixed:
      return {.precision = precision, .weight_dtype = DType::kBF16, .compute_dtype = DType::kBF16,
              .master_weights = true};
    case Precision::kBf16:
      return {.precision = precision, .weight_dtype = DType::kBF16, .compute_dtype = DType::kBF16,
              .grad_dtype = DType::kBF16, .optimizer_state_dtype = DType::kBF16};
    case Precision::kFp16:
      return {.precision = precision, .weight_dtype = DType::kF16, .compute_dtype = DType::kF16,
              .grad_dtype = DType::kF16, .optimizer_state_dtype = DType::kF16};
    case Precision::kFp8:
      return {.precision = precision, .weight_dtype = DType::kBF16, .compute_dtype = DType::kBF16,
              .master_weights = true, .fp8_weight_cache_bytes_per_param = 1};
  }
  return {};
}

}  // namespace headroom

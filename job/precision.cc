#include "job/precision.h"

#include "common/name_table.h"

#include <string>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_format.h"

namespace headroom {
namespace {

constexpr NameTable<Precision, 17> kPrecisionNames("precision", {{
    {"fp32", Precision::kFp32},
    {"tf32", Precision::kTf32},
    {"fp16-mixed", Precision::kFp16Mixed},
    {"bf16-mixed", Precision::kBf16Mixed},
    {"bf16", Precision::kBf16},
    {"fp16", Precision::kFp16},
    {"fp8", Precision::kFp8},
    {"float32", Precision::kFp32, kAlias},
    {"mixed-fp16", Precision::kFp16Mixed, kAlias},
    {"mixed-bf16", Precision::kBf16Mixed, kAlias},
    {"amp-fp16", Precision::kFp16Mixed, kAlias},
    {"amp-bf16", Precision::kBf16Mixed, kAlias},
    {"16-mixed", Precision::kFp16Mixed, kAlias},
    {"bf16-true", Precision::kBf16, kAlias},
    {"pure-bf16", Precision::kBf16, kAlias},
    {"pure-fp16", Precision::kFp16, kAlias},
    {"fp8-mixed", Precision::kFp8, kAlias},
}});

}  // namespace

std::string_view PrecisionName(Precision precision) { return kPrecisionNames.Name(precision); }

absl::StatusOr<Precision> ParsePrecision(std::string_view name) { return kPrecisionNames.Parse(name); }

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

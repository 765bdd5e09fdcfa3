#include "graph/graph.h"

#include <algorithm>
#include <string>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/checked_math.h"
#include "common/name_table.h"
#include "common/quote.h"
#include "common/status_macros.h"

namespace headroom {
namespace {

constexpr NameTable<DType, 29> kDTypeNames("dtype", {{
    {"f64", DType::kF64}, {"f32", DType::kF32}, {"bf16", DType::kBF16}, {"f16", DType::kF16},
    {"f8e4m3", DType::kF8E4M3}, {"f8e5m2", DType::kF8E5M2}, {"i64", DType::kI64}, {"i32", DType::kI32},
    {"i8", DType::kI8}, {"u8", DType::kU8}, {"bool", DType::kBool}, {"nf4", DType::kNF4},
    // Other spellings users and Hugging Face configs write.
    {"float64", DType::kF64, kAlias}, {"double", DType::kF64, kAlias}, {"fp64", DType::kF64, kAlias},
    {"float32", DType::kF32, kAlias}, {"float", DType::kF32, kAlias}, {"fp32", DType::kF32, kAlias},
    {"bfloat16", DType::kBF16, kAlias}, {"float16", DType::kF16, kAlias}, {"half", DType::kF16, kAlias},
    {"fp16", DType::kF16, kAlias}, {"fp8", DType::kF8E4M3, kAlias}, {"float8_e4m3fn", DType::kF8E4M3, kAlias},
    {"float8_e5m2", DType::kF8E5M2, kAlias}, {"int64", DType::kI64, kAlias}, {"int32", DType::kI32, kAlias},
    {"int8", DType::kI8, kAlias}, {"uint8", DType::kU8, kAlias},
}});

constexpr NameTable<TensorRole, 7> kRoleNames("tensor role", {{
    {"parameter", TensorRole::kParameter},
    {"buffer", TensorRole::kBuffer},
    {"input", TensorRole::kInput},
    {"activation", TensorRole::kActivation},
    {"gradient", TensorRole::kGradient},
    {"optimizer_state", TensorRole::kOptimizerState},
    {"temporary", TensorRole::kTemporary},
}});

constexpr NameTable<Phase, 4> kPhaseNames("phase", {{
    {"forward", Phase::kForward},
    {"loss", Phase::kLoss},
    {"backward", Phase::kBackward},
    {"optimizer", Phase::kOptimizer},
}});

uint32_t DTypeBits(DType dtype) {
  switch (dtype) {
    case DType::kF64:
    case DType::kI64: return 64;
    case DType::kF32:
    case DType::kI32: return 32;
    case DType::kBF16:
    case DType::kF16: return 16;
    case DType::kF8E4M3:
    case DType::kF8E5M2:
    case DType::kI8:
    case DType::kU8:
    case DType::kBool: return 8;
    case DType::kNF4: return 4;
  }
  return 0;
}

}  // namespace

std::string_view DTypeName(DType dtype) { return kDTypeNames.Name(dtype); }

absl::StatusOr<DType> ParseDType(std::string_view name) {
  // PyTorch prints dtypes as "torch.bfloat16"; errors quote the name as given.
  const std::string lower = absl::AsciiStrToLower(std::string(name));
  if (lower.starts_with("torch.")) {
    if (absl::StatusOr<DType> dtype = kDTypeNames.Parse(name.substr(6)); dtype.ok()) return dtype;
  }
  return kDTypeNames.Parse(name);
}

uint64_t DTypeBytes(DType dtype, uint64_t elements) {
  // Saturates: Graph::CheckBounds names a tensor whose bytes reach the limit.
  const uint64_t bits = SaturatingMul(elements, DTypeBits(dtype));
  return bits == UINT64_MAX ? bits : bits / 8 + (bits % 8 != 0 ? 1 : 0);
}

bool IsFloatingPoint(DType dtype) {
  switch (dtype) {
    case DType::kF64:
    case DType::kF32:
    case DType::kBF16:
    case DType::kF16:
    case DType::kF8E4M3:
    case DType::kF8E5M2: return true;
    default: return false;
  }
}

std::string_view TensorRoleName(TensorRole role) { return kRoleNames.Name(role); }

absl::StatusOr<TensorRole> ParseTensorRole(std::string_view name) { return kRoleNames.Parse(name); }

std::string_view PhaseName(Phase phase) { return kPhaseNames.Name(phase); }
absl::StatusOr<Phase> ParsePhase(std::string_view name) { return kPhaseNames.Parse(name); }

uint64_t Tensor::elements() const {
  uint64_t n = 1;
  for (int64_t d : shape) n = SaturatingMul(n, static_cast<uint64_t>(d));
  return n;
}

uint64_t Tensor::bytes() const { return view_of == kNone ? DTypeBytes(dtype, elements()) : 0; }

TensorId Graph::AddTensor(Tensor tensor) {
  tensor.id = static_cast<TensorId>(tensors_.size());
  tensors_.push_back(std::move(tensor));
  producer_.push_back(kNone);
  return tensors_.back().id;
}

OpId Graph::AddOp(Op op) {
  op.id = static_cast<OpId>(ops_.size());
  for (TensorId out : op.outputs) {
    if (out >= 0 && static_cast<size_t>(out) < producer_.size() && producer_[out] == kNone) {
      producer_[static_cast<size_t>(out)] = op.id;
    }
  }
  ops_.push_back(std::move(op));
  return ops_.back().id;
}

uint64_t Graph::ParameterCount(bool trainable_only) const {
  uint64_t count = 0;
  for (const Tensor& t : tensors_) {
    if (t.role == TensorRole::kParameter && (!trainable_only || t.trainable)) count += t.elements();
  }
  return count;
}

absl::Status Graph::CheckBounds() const {
  if (tensors_.size() > kMaxGraphTensors) {
    return absl::OutOfRangeError(absl::StrFormat(
        "graph %s has %d tensors, more than the %d a graph may hold", QuoteForError(name_), tensors_.size(),
        kMaxGraphTensors));
  }
  if (ops_.size() > kMaxGraphOps) {
    return absl::OutOfRangeError(absl::StrFormat(
        "graph %s has %d ops, more than the %d a graph may hold", QuoteForError(name_), ops_.size(),
        kMaxGraphOps));
  }
  for (const Tensor& t : tensors_) {
    if (t.view_of != kNone) continue;
    const uint64_t bytes = t.bytes();
    if (bytes > kMaxTensorBytes) {
      return absl::OutOfRangeError(absl::StrFormat(
          "graph %s: tensor %s (%s, %s) holds %s bytes, more than the %d (1 TiB) a tensor may hold",
          QuoteForError(name_), QuoteForError(t.name), absl::StrJoin(t.shape, "x"), DTypeName(t.dtype),
          bytes == UINT64_MAX ? std::string("over 2^64") : std::to_string(bytes), kMaxTensorBytes));
    }
  }
  return absl::OkStatus();
}

absl::Status Graph::Validate() const {
  const auto n = static_cast<TensorId>(tensors_.size());
  auto bad_id = [n](TensorId id) { return id < 0 || id >= n; };
  for (const Tensor& t : tensors_) {
    for (int64_t d : t.shape) {
      if (d < 0) {
        return absl::InvalidArgumentError(
            absl::StrFormat("graph %s: tensor %s has a negative dimension", QuoteForError(name_),
                            QuoteForError(t.name)));
      }
    }
    if (t.view_of != kNone && (bad_id(t.view_of) || t.view_of >= t.id ||
                               tensors_[t.view_of].view_of != kNone)) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "graph %s: tensor %s is a view of an invalid or later tensor", QuoteForError(name_),
          QuoteForError(t.name)));
    }
  }
  HEADROOM_RETURN_IF_ERROR(CheckBounds());
  std::vector<OpId> produced_by(tensors_.size(), kNone);
  for (const Op& op : ops_) {
    for (TensorId in : op.inputs) {
      if (bad_id(in)) {
        return absl::InvalidArgumentError(
            absl::StrFormat("graph %s: op %s reads unknown tensor %d", QuoteForError(name_),
                            QuoteForError(op.name), in));
      }
      const Tensor& t = tensors_[in];
      const bool leaf = t.role == TensorRole::kParameter || t.role == TensorRole::kBuffer ||
                        t.role == TensorRole::kInput;
      const TensorId base = storage(in);
      if (!leaf && produced_by[in] == kNone && produced_by[base] == kNone) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "graph %s: op %s reads %s before any op produces it", QuoteForError(name_), QuoteForError(op.name),
            QuoteForError(t.name)));
      }
    }
    for (TensorId out : op.outputs) {
      if (bad_id(out)) {
        return absl::InvalidArgumentError(
            absl::StrFormat("graph %s: op %s writes unknown tensor %d", QuoteForError(name_),
                            QuoteForError(op.name), out));
      }
      if (produced_by[out] != kNone && !op.recompute) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "graph %s: tensor %s is produced by both %s and %s", QuoteForError(name_),
            QuoteForError(tensors_[out].name), QuoteForError(ops_[produced_by[out]].name),
            QuoteForError(op.name)));
      }
      if (produced_by[out] == kNone) produced_by[out] = op.id;
    }
    for (TensorId s : op.saved) {
      const bool own = std::find(op.inputs.begin(), op.inputs.end(), s) != op.inputs.end() ||
                       std::find(op.outputs.begin(), op.outputs.end(), s) != op.outputs.end();
      if (!own) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "graph %s: op %s saves tensor %d, which is neither its input nor its output",
            QuoteForError(name_), QuoteForError(op.name), s));
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace headroom

#include "graph/graph.h"

#include <algorithm>
#include <string>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_format.h"
#include "common/checked_math.h"
#include "common/status_macros.h"

namespace headroom {
namespace {

struct DTypeInfo {
  DType dtype;
  std::string_view name;
  uint32_t bits;
};

constexpr DTypeInfo kDTypes[] = {
    {DType::kF64, "f64", 64},    {DType::kF32, "f32", 32},       {DType::kBF16, "bf16", 16},
    {DType::kF16, "f16", 16},    {DType::kF8E4M3, "f8e4m3", 8}, {DType::kF8E5M2, "f8e5m2", 8},
    {DType::kI64, "i64", 64},    {DType::kI32, "i32", 32},       {DType::kI8, "i8", 8},
    {DType::kU8, "u8", 8},       {DType::kBool, "bool", 8},      {DType::kNF4, "nf4", 4},
};

// Other spellings users and Hugging Face configs write.
constexpr std::pair<std::string_view, DType> kDTypeAliases[] = {
    {"float64", DType::kF64}, {"double", DType::kF64},       {"fp64", DType::kF64},
    {"float32", DType::kF32}, {"float", DType::kF32},        {"fp32", DType::kF32},
    {"bfloat16", DType::kBF16}, {"float16", DType::kF16},    {"half", DType::kF16},
    {"fp16", DType::kF16},    {"fp8", DType::kF8E4M3},       {"float8_e4m3fn", DType::kF8E4M3},
    {"float8_e5m2", DType::kF8E5M2}, {"int64", DType::kI64}, {"int32", DType::kI32},
    {"int8", DType::kI8},     {"uint8", DType::kU8},         {"bool", DType::kBool},
};

constexpr std::pair<TensorRole, std::string_view> kRoles[] = {
    {TensorRole::kParameter, "parameter"},  {TensorRole::kBuffer, "buffer"},
    {TensorRole::kInput, "input"},          {TensorRole::kActivation, "activation"},
    {TensorRole::kGradient, "gradient"},    {TensorRole::kOptimizerState, "optimizer_state"},
    {TensorRole::kTemporary, "temporary"},
};

}  // namespace

std::string_view DTypeName(DType dtype) {
  for (const DTypeInfo& info : kDTypes) {
    if (info.dtype == dtype) return info.name;
  }
  return "unknown";
}

absl::StatusOr<DType> ParseDType(std::string_view name) {
  std::string lower = absl::AsciiStrToLower(std::string(name));
  if (lower.starts_with("torch.")) lower.erase(0, 6);
  for (const DTypeInfo& info : kDTypes) {
    if (info.name == lower) return info.dtype;
  }
  for (const auto& [alias, dtype] : kDTypeAliases) {
    if (alias == lower) return dtype;
  }
  return absl::InvalidArgumentError(absl::StrFormat(
      "unknown dtype '%s' (expected f64, f32, bf16, f16, f8e4m3, f8e5m2, i64, i32, i8, u8, bool or nf4)",
      name));
}

uint64_t DTypeBytes(DType dtype, uint64_t elements) {
  for (const DTypeInfo& info : kDTypes) {
    if (info.dtype == dtype) {
      const uint64_t bits = SaturatingMul(elements, info.bits);
      return bits == UINT64_MAX ? bits : bits / 8 + (bits % 8 != 0 ? 1 : 0);
    }
  }
  return 0;
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

std::string_view TensorRoleName(TensorRole role) {
  for (const auto& [r, name] : kRoles) {
    if (r == role) return name;
  }
  return "unknown";
}

absl::StatusOr<TensorRole> ParseTensorRole(std::string_view name) {
  for (const auto& [role, role_name] : kRoles) {
    if (role_name == name) return role;
  }
  return absl::InvalidArgumentError(absl::StrFormat(
      "unknown tensor role '%s' (expected parameter, buffer, input, activation, gradient, "
      "optimizer_state or temporary)", name));
}

std::string_view PhaseName(Phase phase) {
  switch (phase) {
    case Phase::kForward: return "forward";
    case Phase::kLoss: return "loss";
    case Phase::kBackward: return "backward";
    case Phase::kOptimizer: return "optimizer";
  }
  return "unknown";
}

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
        "graph '%s' has %d tensors, more than the %d a graph may hold", name_, tensors_.size(),
        kMaxGraphTensors));
  }
  if (ops_.size() > kMaxGraphOps) {
    return absl::OutOfRangeError(absl::StrFormat(
        "graph '%s' has %d ops, more than the %d a graph may hold", name_, ops_.size(), kMaxGraphOps));
  }
  for (const Tensor& t : tensors_) {
    if (t.view_of != kNone) continue;
    const uint64_t bytes = t.bytes();
    if (bytes > kMaxTensorBytes) {
      return absl::OutOfRangeError(absl::StrFormat(
          "graph '%s': tensor '%s' (%s, %s) holds %s bytes, more than the %d (1 TiB) a tensor may hold",
          name_, t.name, absl::StrJoin(t.shape, "x"), DTypeName(t.dtype),
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
            absl::StrFormat("graph '%s': tensor '%s' has a negative dimension", name_, t.name));
      }
    }
    if (t.view_of != kNone && (bad_id(t.view_of) || t.view_of >= t.id ||
                               tensors_[t.view_of].view_of != kNone)) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "graph '%s': tensor '%s' is a view of an invalid or later tensor", name_, t.name));
    }
  }
  HEADROOM_RETURN_IF_ERROR(CheckBounds());
  std::vector<OpId> produced_by(tensors_.size(), kNone);
  for (const Op& op : ops_) {
    for (TensorId in : op.inputs) {
      if (bad_id(in)) {
        return absl::InvalidArgumentError(
            absl::StrFormat("graph '%s': op '%s' reads unknown tensor %d", name_, op.name, in));
      }
      const Tensor& t = tensors_[in];
      const bool leaf = t.role == TensorRole::kParameter || t.role == TensorRole::kBuffer ||
                        t.role == TensorRole::kInput;
      const TensorId storage = t.view_of == kNone ? in : t.view_of;
      if (!leaf && produced_by[in] == kNone && produced_by[storage] == kNone) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "graph '%s': op '%s' reads '%s' before any op produces it", name_, op.name, t.name));
      }
    }
    for (TensorId out : op.outputs) {
      if (bad_id(out)) {
        return absl::InvalidArgumentError(
            absl::StrFormat("graph '%s': op '%s' writes unknown tensor %d", name_, op.name, out));
      }
      if (produced_by[out] != kNone && !op.recompute) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "graph '%s': tensor '%s' is produced by both '%s' and '%s'", name_,
            tensors_[out].name, ops_[produced_by[out]].name, op.name));
      }
      if (produced_by[out] == kNone) produced_by[out] = op.id;
    }
    for (TensorId s : op.saved) {
      const bool own = std::find(op.inputs.begin(), op.inputs.end(), s) != op.inputs.end() ||
                       std::find(op.outputs.begin(), op.outputs.end(), s) != op.outputs.end();
      if (!own) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "graph '%s': op '%s' saves tensor %d, which is neither its input nor its output",
            name_, op.name, s));
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace headroom

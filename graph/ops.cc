#include "graph/ops.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"

namespace headroom {

std::string_view ActivationName(ActivationKind kind) {
  switch (kind) {
    case ActivationKind::kGelu: return "gelu";
    case ActivationKind::kGeluTanh: return "gelu_tanh";
    case ActivationKind::kGeluNew: return "gelu_new";
    case ActivationKind::kSilu: return "silu";
    case ActivationKind::kRelu: return "relu";
    case ActivationKind::kTanh: return "tanh";
    case ActivationKind::kSigmoid: return "sigmoid";
    case ActivationKind::kQuickGelu: return "quick_gelu";
    case ActivationKind::kSoftplus: return "softplus";
  }
  return "unknown";
}
namespace {

int FloatRank(DType dtype) {
  switch (dtype) {
    case DType::kF64: return 4;
    case DType::kF32: return 3;
    case DType::kBF16:
    case DType::kF16: return 2;
    case DType::kF8E4M3:
    case DType::kF8E5M2: return 1;
    default: return 0;
  }
}

int64_t Product(const std::vector<int64_t>& shape, size_t begin, size_t end) {
  int64_t n = 1;
  for (size_t i = begin; i < end && i < shape.size(); ++i) n *= shape[i];
  return n;
}

}  // namespace

DType OpEmitter::Promote(DType a, DType b) {
  if (!IsFloatingPoint(a)) return b;
  if (!IsFloatingPoint(b)) return a;
  return FloatRank(a) >= FloatRank(b) ? a : b;
}

TensorId OpEmitter::NewTensor(std::string name, std::vector<int64_t> shape, DType dtype,
                              TensorRole role) {
  TensorId id = graph_.AddTensor(
      {.name = std::move(name), .shape = std::move(shape), .dtype = dtype, .role = role,
       .layer = layer_});
  requires_grad_.resize(graph_.num_tensors(), false);
  return id;
}

OpId OpEmitter::Emit(Op op, bool requires_grad) {
  op.phase = phase_;
  op.layer = layer_;
  op.attention_core = attention_core_;
  // Emitters that know better (gathers, collectives, in-place ops) set the
  // byte counts themselves; the default is every input read once and every
  // new output written once.
  if (op.bytes_read == 0) {
    for (TensorId in : op.inputs) {
      const Tensor& t = graph_.tensor(in);
      op.bytes_read += DTypeBytes(t.dtype, t.elements());
    }
  }
  if (op.bytes_written == 0) {
    for (TensorId out : op.outputs) {
      const Tensor& t = graph_.tensor(out);
      if (t.view_of == kNone) op.bytes_written += DTypeBytes(t.dtype, t.elements());
    }
  }
  requires_grad_.resize(graph_.num_tensors(), false);
  for (TensorId out : op.outputs) requires_grad_[static_cast<size_t>(out)] = requires_grad;
  return graph_.AddOp(std::move(op));
}

TensorId OpEmitter::Pointwise(const std::string& name, std::string kind, TensorId x, Keeps keeps,
                              double flops_per_element) {
  const Tensor xt = graph_.tensor(x);
  TensorId y = NewTensor(name + ".out", xt.shape, xt.dtype);
  const bool rg = RequiresGrad(x);
  Op op{.kind = std::move(kind), .name = name, .inputs = {x}, .outputs = {y},
        .flops = flops_per_element * static_cast<double>(xt.elements()), .compute_dtype = xt.dtype};
  if (rg) op.saved = {keeps == Keeps::kInput ? x : y};
  Emit(std::move(op), rg);
  return y;
}

TensorId OpEmitter::Parameter(std::string name, std::vector<int64_t> shape, DType dtype,
                              bool trainable) {
  TensorId id = graph_.AddTensor({.name = std::move(name), .shape = std::move(shape),
                                  .dtype = dtype, .role = TensorRole::kParameter,
                                  .layer = layer_, .trainable = trainable});
  requires_grad_.resize(graph_.num_tensors(), false);
  requires_grad_[static_cast<size_t>(id)] = trainable;
  return id;
}

TensorId OpEmitter::Buffer(std::string name, std::vector<int64_t> shape, DType dtype) {
  return NewTensor(std::move(name), std::move(shape), dtype, TensorRole::kBuffer);
}

TensorId OpEmitter::Input(std::string name, std::vector<int64_t> shape, DType dtype) {
  return NewTensor(std::move(name), std::move(shape), dtype, TensorRole::kInput);
}

bool OpEmitter::RequiresGrad(TensorId id) const {
  return id >= 0 && static_cast<size_t>(id) < requires_grad_.size() &&
         requires_grad_[static_cast<size_t>(id)];
}

TensorId OpEmitter::View(const std::string& name, TensorId x, std::vector<int64_t> shape) {
  const Tensor& src = graph_.tensor(x);
  const TensorId base = src.view_of == kNone ? x : src.view_of;
  const DType dtype = src.dtype;
  // A view of a parameter (a slice of a packed weight) is an activation over the parameter's storage, as the
  // tracer records it: no parameter of its own, with no optimizer state or gradient buffer.
  const TensorRole role =
      graph_.tensor(base).role == TensorRole::kParameter ? TensorRole::kActivation : graph_.tensor(base).role;
  TensorId v = graph_.AddTensor({.name = name, .shape = std::move(shape), .dtype = dtype, .role = role,
                                 .layer = layer_, .view_of = base});
  requires_grad_.resize(graph_.num_tensors(), false);
  Emit({.kind = "view", .name = name, .inputs = {x}, .outputs = {v},
        .compute_dtype = dtype},
       RequiresGrad(x));
  // A view moves no data.
  return v;
}

TensorId OpEmitter::Embedding(const std::string& name, TensorId ids, TensorId table) {
  std::vector<int64_t> shape = graph_.tensor(ids).shape;
  shape.push_back(graph_.tensor(table).shape.back());
  const DType dtype = graph_.tensor(table).dtype;
  TensorId out = NewTensor(name + ".out", shape, dtype);
  const bool rg = RequiresGrad(table);
  // Only the looked-up rows are read, not the whole table.
  Op op{.kind = "embedding", .name = name, .inputs = {ids, table}, .outputs = {out},
        .bytes_read = graph_.tensor(ids).bytes() + graph_.tensor(out).bytes(),
        .compute_dtype = dtype};
  if (rg) op.saved = {ids};
  Emit(std::move(op), rg);
  return out;
}

TensorId OpEmitter::Cast(const std::string& name, TensorId x, DType dtype) {
  if (graph_.tensor(x).dtype == dtype) return x;
  TensorId out = NewTensor(name, graph_.tensor(x).shape, dtype);
  Emit({.kind = "cast", .name = name, .inputs = {x}, .outputs = {out}, .compute_dtype = dtype},
       RequiresGrad(x));
  return out;
}

TensorId OpEmitter::ToCompute(const std::string& name, TensorId x) {
  if (!options_.autocast || x == kNone) return x;
  const DType dtype = graph_.tensor(x).dtype;
  if (!IsFloatingPoint(dtype) || dtype == options_.compute_dtype) return x;
  return Cast(name, x, options_.compute_dtype);
}

TensorId OpEmitter::Linear(const std::string& name, TensorId x, TensorId weight, TensorId bias,
                           TensorId x_shard) {
  const OpId weight_producer = graph_.producer(weight);
  const bool dequantized =
      weight_producer != kNone && graph_.op(weight_producer).kind == "dequantize_nf4";
  x = ToCompute(name + ".input_cast", x);
  weight = ToCompute(name + ".weight_cast", weight);
  bias = ToCompute(name + ".bias_cast", bias);
  const Tensor xt = graph_.tensor(x);
  const Tensor wt = graph_.tensor(weight);
  const int64_t in = xt.shape.back();
  // nn.Linear stores [out, in]; GPT-2's Conv1D stores [in, out].
  const int64_t out_features = wt.shape[1] == in ? wt.shape[0] : wt.shape[1];
  const int64_t rows = Product(xt.shape, 0, xt.shape.size() - 1);
  std::vector<int64_t> shape = xt.shape;
  shape.back() = out_features;
  TensorId y = NewTensor(name + ".out", shape, xt.dtype);
  Op op{.kind = "linear", .name = name, .inputs = {x, weight}, .outputs = {y},
        .flops = 2.0 * static_cast<double>(rows) * static_cast<double>(in) *
                 static_cast<double>(out_features),
        .compute_dtype = xt.dtype};
  if (bias != kNone) op.inputs.push_back(bias);
  if (x_shard != kNone) op.inputs.push_back(x_shard);
  if (RequiresGrad(weight)) op.saved.push_back(x_shard != kNone ? x_shard : x);
  if (RequiresGrad(x) && !dequantized) op.saved.push_back(weight);
  const bool rg = RequiresGrad(x) || RequiresGrad(weight) || RequiresGrad(bias);
  Emit(std::move(op), rg);
  return y;
}

TensorId OpEmitter::MatMul(const std::string& name, TensorId a, TensorId b, bool b_transposed) {
  return Gemm(name, a, b, b_transposed, kNone);
}

TensorId OpEmitter::AttentionScores(const std::string& name, TensorId q, TensorId k, int64_t heads) {
  const Tensor qt = graph_.tensor(q);
  const Tensor kt = graph_.tensor(k);
  const int64_t b = qt.shape[0], s = qt.shape[1], t = kt.shape[1], width = qt.shape[2];
  TensorId scores = NewTensor(name + ".out", {b, heads, s, t}, Promote(qt.dtype, kt.dtype));
  Op op{.kind = "attention_scores", .name = name, .inputs = {q, k}, .outputs = {scores},
        .flops = 2.0 * static_cast<double>(b) * static_cast<double>(s) * static_cast<double>(t) *
                 static_cast<double>(width),
        .compute_dtype = qt.dtype};
  if (RequiresGrad(k)) op.saved.push_back(q);
  if (RequiresGrad(q)) op.saved.push_back(k);
  Emit(std::move(op), RequiresGrad(q) || RequiresGrad(k));
  return scores;
}

TensorId OpEmitter::AttentionContext(const std::string& name, TensorId probs, TensorId v) {
  const Tensor pt = graph_.tensor(probs);
  const Tensor vt = graph_.tensor(v);
  const int64_t b = pt.shape[0], s = pt.shape[2], t = pt.shape[3], width = vt.shape[2];
  TensorId context = NewTensor(name + ".out", {b, s, width}, Promote(pt.dtype, vt.dtype));
  Op op{.kind = "attention_context", .name = name, .inputs = {probs, v}, .outputs = {context},
        .flops = 2.0 * static_cast<double>(b) * static_cast<double>(s) * static_cast<double>(t) *
                 static_cast<double>(width),
        .compute_dtype = pt.dtype};
  if (RequiresGrad(v)) op.saved.push_back(probs);
  if (RequiresGrad(probs)) op.saved.push_back(v);
  Emit(std::move(op), RequiresGrad(probs) || RequiresGrad(v));
  return context;
}

// Note [grouped_mm under autocast]
// torch._grouped_mm (and F.grouped_mm) is not an autocast op, and transformers calls it as
// grouped_mm(input.to(weight.dtype), weight, offs) (integrations/moe.py, _grouped_mm, read at 5.24; its
// custom-op fallback the same): under autocast with f32 weights the rows are cast up to f32 and the GEMM runs
// and writes in f32, and no 16-bit copy of the stacked experts is made. So the weight is never cast here.
TensorId OpEmitter::GroupedMatMul(const std::string& name, TensorId a, TensorId b, TensorId offsets,
                                  bool b_transposed) {
  const DType weight_dtype = graph_.tensor(b).dtype;
  if (graph_.tensor(a).dtype != weight_dtype) a = Cast(name + ".input_cast", a, weight_dtype);
  return Gemm(name, a, b, b_transposed, kNone, offsets);
}

TensorId OpEmitter::BaddBmm(const std::string& name, TensorId bias, TensorId a, TensorId b, bool b_transposed) {
  return Gemm(name, a, b, b_transposed, bias);
}

TensorId OpEmitter::Gemm(const std::string& name, TensorId a, TensorId b, bool b_transposed, TensorId bias,
                         TensorId group_offsets) {
  if (group_offsets == kNone) {  // Note [grouped_mm under autocast]: a grouped GEMM is not autocast
    a = ToCompute(name + ".a_cast", a);
    b = ToCompute(name + ".b_cast", b);
  }
  const Tensor at = graph_.tensor(a);
  const Tensor bt = graph_.tensor(b);
  const size_t rank = at.shape.size();
  const int64_t m = at.shape[rank - 2];
  const int64_t k = at.shape[rank - 1];
  const int64_t n = b_transposed ? bt.shape[bt.shape.size() - 2] : bt.shape.back();
  const int64_t batch = Product(at.shape, 0, rank - 2);
  std::vector<int64_t> shape = at.shape;
  shape.back() = n;
  TensorId c = NewTensor(name + ".out", shape, Promote(at.dtype, bt.dtype));
  const double product = static_cast<double>(batch) * static_cast<double>(m) * static_cast<double>(n);
  Op op{.kind = bias == kNone ? "matmul" : "baddbmm", .name = name, .inputs = {a, b}, .outputs = {c},
        .flops = 2.0 * product * static_cast<double>(k) + (bias == kNone ? 0.0 : product),
        .compute_dtype = at.dtype};
  if (bias != kNone) op.inputs.push_back(bias);
  if (RequiresGrad(b)) op.saved.push_back(a);
  if (RequiresGrad(a)) op.saved.push_back(b);
  if (group_offsets != kNone) {
    op.inputs.push_back(group_offsets);
    if (RequiresGrad(a) || RequiresGrad(b)) op.saved.push_back(group_offsets);
  }
  Emit(std::move(op), RequiresGrad(a) || RequiresGrad(b) || RequiresGrad(bias));
  return c;
}

TensorId OpEmitter::LayerNorm(const std::string& name, TensorId x, TensorId weight,
                              TensorId bias) {
  if (options_.autocast) x = Cast(name + ".input_cast", x, options_.autocast_wide_dtype);
  const Tensor xt = graph_.tensor(x);
  std::vector<int64_t> stat_shape(xt.shape.begin(), xt.shape.end() - 1);
  TensorId y = NewTensor(name + ".out", xt.shape, Promote(xt.dtype, graph_.tensor(weight).dtype));
  TensorId mean = NewTensor(name + ".mean", stat_shape, DType::kF32);
  TensorId rstd = NewTensor(name + ".rstd", stat_shape, DType::kF32);
  const bool rg = RequiresGrad(x) || RequiresGrad(weight) || RequiresGrad(bias);
  Op op{.kind = "layer_norm", .name = name, .inputs = {x, weight}, .outputs = {y, mean, rstd},
        .flops = 8.0 * static_cast<double>(xt.elements()), .compute_dtype = DType::kF32};
  if (bias != kNone) op.inputs.push_back(bias);
  if (rg) op.saved = {x, mean, rstd};
  Emit(std::move(op), rg);
  return y;
}

TensorId OpEmitter::RmsNorm(const std::string& name, TensorId x, TensorId weight) {
  const Tensor xt = graph_.tensor(x);
  std::vector<int64_t> stat_shape(xt.shape.begin(), xt.shape.end() - 1);
  TensorId y = NewTensor(name + ".out", xt.shape, Promote(xt.dtype, graph_.tensor(weight).dtype));
  TensorId rstd = NewTensor(name + ".rstd", stat_shape, DType::kF32);
  const bool rg = RequiresGrad(x) || RequiresGrad(weight);
  Op op{.kind = "rms_norm", .name = name, .inputs = {x, weight}, .outputs = {y, rstd},
        .flops = 5.0 * static_cast<double>(xt.elements()), .compute_dtype = DType::kF32};
  if (rg) op.saved = {x, rstd};
  Emit(std::move(op), rg);
  return y;
}

TensorId OpEmitter::BatchNorm(const std::string& name, TensorId x, TensorId weight,
                              TensorId bias) {
  const Tensor xt = graph_.tensor(x);
  const int64_t channels = xt.shape[1];
  TensorId y = NewTensor(name + ".out", xt.shape, xt.dtype);
  const bool rg = RequiresGrad(x) || RequiresGrad(weight) || RequiresGrad(bias);
  Op op{.kind = "batch_norm", .name = name, .inputs = {x, weight, bias}, .outputs = {y},
        .flops = 8.0 * static_cast<double>(xt.elements()), .compute_dtype = DType::kF32};
  if (options_.training) {
    TensorId mean = NewTensor(name + ".save_mean", {channels}, DType::kF32);
    TensorId invstd = NewTensor(name + ".save_invstd", {channels}, DType::kF32);
    op.outputs.push_back(mean);
    op.outputs.push_back(invstd);
    if (rg) op.saved = {x, mean, invstd};
  }
  Emit(std::move(op), rg);
  return y;
}

TensorId OpEmitter::Activation(const std::string& name, ActivationKind kind, TensorId x,
                               bool inplace) {
  const Tensor xt = graph_.tensor(x);
  const std::vector<int64_t> shape = xt.shape;
  const DType dtype = xt.dtype;
  const double elements = static_cast<double>(xt.elements());
  TensorId y;
  if (inplace) {
    const TensorId base = xt.view_of == kNone ? x : xt.view_of;
    y = graph_.AddTensor({.name = name + ".out", .shape = shape, .dtype = dtype,
                          .role = TensorRole::kActivation, .layer = layer_, .view_of = base});
  } else {
    y = NewTensor(name + ".out", shape, dtype);
  }
  const bool rg = RequiresGrad(x);
  // relu and tanh differentiate from their output, the others from their input.
  const bool saves_output =
      kind == ActivationKind::kRelu || kind == ActivationKind::kTanh || kind == ActivationKind::kSigmoid;
  const double flops_per_element = kind == ActivationKind::kRelu ? 1.0 : 8.0;
  Op op{.kind = std::string(ActivationName(kind)), .name = name, .inputs = {x}, .outputs = {y},
        .flops = flops_per_element * elements,
        .bytes_written = inplace ? DTypeBytes(dtype, graph_.tensor(x).elements()) : 0,
        .compute_dtype = dtype, .inplace = inplace};
  if (rg) op.saved = {saves_output ? y : x};
  Emit(std::move(op), rg);
  return y;
}

Op OpEmitter::Broadcasting(const std::string& name, std::string kind, TensorId a, TensorId b) {
  const Tensor at = graph_.tensor(a);
  const Tensor bt = graph_.tensor(b);
  // Broadcasting as PyTorch does: shapes align at their last dimension, a size-1 dimension stretches.
  std::vector<int64_t> shape = at.shape.size() >= bt.shape.size() ? at.shape : bt.shape;
  const std::vector<int64_t>& other = at.shape.size() >= bt.shape.size() ? bt.shape : at.shape;
  for (size_t i = 0; i < other.size(); ++i) {
    int64_t& dim = shape[shape.size() - other.size() + i];
    dim = std::max(dim, other[i]);
  }
  TensorId c = NewTensor(name + ".out", shape, Promote(at.dtype, bt.dtype));
  return {.kind = std::move(kind), .name = name, .inputs = {a, b}, .outputs = {c},
          .flops = static_cast<double>(graph_.tensor(c).elements()), .compute_dtype = graph_.tensor(c).dtype};
}

TensorId OpEmitter::Mul(const std::string& name, TensorId a, TensorId b) {
  Op op = Broadcasting(name, "mul", a, b);
  const TensorId c = op.outputs[0];
  if (RequiresGrad(a)) op.saved.push_back(b);
  if (RequiresGrad(b)) op.saved.push_back(a);
  Emit(std::move(op), RequiresGrad(a) || RequiresGrad(b));
  return c;
}

TensorId OpEmitter::Add(const std::string& name, TensorId a, TensorId b) {
  Op op = Broadcasting(name, "add", a, b);
  const TensorId c = op.outputs[0];
  Emit(std::move(op), RequiresGrad(a) || RequiresGrad(b));
  return c;
}

TensorId OpEmitter::AddInplace(const std::string& name, TensorId acc, TensorId other) {
  const Tensor at = graph_.tensor(acc);
  TensorId y = graph_.AddTensor({.name = name + ".out", .shape = at.shape, .dtype = at.dtype,
                                 .role = TensorRole::kActivation, .layer = layer_,
                                 .view_of = at.view_of == kNone ? acc : at.view_of});
  Emit({.kind = "add", .name = name, .inputs = {acc, other}, .outputs = {y},
        .flops = static_cast<double>(at.elements()),
        .bytes_written = DTypeBytes(at.dtype, at.elements()), .compute_dtype = at.dtype,
        .inplace = true},
       RequiresGrad(acc) || RequiresGrad(other));
  return y;
}

TensorId OpEmitter::Scale(const std::string& name, TensorId x) {
  const Tensor xt = graph_.tensor(x);
  TensorId y = NewTensor(name + ".out", xt.shape, xt.dtype);
  Emit({.kind = "scale", .name = name, .inputs = {x}, .outputs = {y},
        .flops = static_cast<double>(xt.elements()), .compute_dtype = xt.dtype},
       RequiresGrad(x));
  return y;
}

TensorId OpEmitter::Exp(const std::string& name, TensorId x) {
  return Pointwise(name, "exp", x, Keeps::kOutput, 1.0);
}

TensorId OpEmitter::VectorNorm(const std::string& name, TensorId x) {
  const Tensor xt = graph_.tensor(x);
  std::vector<int64_t> shape = xt.shape;
  shape.back() = 1;
  TensorId y = NewTensor(name + ".out", std::move(shape), xt.dtype);
  const bool rg = RequiresGrad(x);
  Op op{.kind = "vector_norm", .name = name, .inputs = {x}, .outputs = {y},
        .flops = 2.0 * static_cast<double>(xt.elements()), .compute_dtype = xt.dtype};
  if (rg) op.saved = {x, y};
  Emit(std::move(op), rg);
  return y;
}

TensorId OpEmitter::LogSigmoid(const std::string& name, TensorId x) {
  const Tensor xt = graph_.tensor(x);
  TensorId y = NewTensor(name + ".out", xt.shape, xt.dtype);
  // CUDA's kernel returns an empty buffer; the CPU one as large as x.
  const bool cuda = options_.runtime.kernels == Kernels::kCuda;
  TensorId buffer = NewTensor(name + ".buffer", cuda ? std::vector<int64_t>{0} : xt.shape, xt.dtype);
  const bool rg = RequiresGrad(x);
  Op op{.kind = "log_sigmoid", .name = name, .inputs = {x}, .outputs = {y, buffer},
        .flops = 4.0 * static_cast<double>(xt.elements()), .compute_dtype = xt.dtype};
  if (rg) op.saved = {x, buffer};
  Emit(std::move(op), rg);
  return y;
}

TensorId OpEmitter::MaskedScale(const std::string& name, TensorId scores) {
  const Tensor st = graph_.tensor(scores);
  TensorId y = NewTensor(name + ".out", st.shape, st.dtype);
  Emit({.kind = "masked_scale", .name = name, .inputs = {scores}, .outputs = {y},
        .flops = 2.0 * static_cast<double>(st.elements()), .compute_dtype = st.dtype},
       RequiresGrad(scores));
  return y;
}

TensorId OpEmitter::AddMask(const std::string& name, TensorId scores, DType mask_dtype) {
  const Tensor st = graph_.tensor(scores);
  TensorId y = NewTensor(name + ".out", st.shape, Promote(st.dtype, mask_dtype));
  Emit({.kind = "add_mask", .name = name, .inputs = {scores}, .outputs = {y},
        .flops = static_cast<double>(st.elements()), .compute_dtype = graph_.tensor(y).dtype},
       RequiresGrad(scores));
  return y;
}

TensorId OpEmitter::Maximum(const std::string& name, TensorId x) {
  return Pointwise(name, "maximum", x, Keeps::kInput, 1.0);
}

TensorId OpEmitter::Clamp(const std::string& name, TensorId x) {
  return Pointwise(name, "clamp", x, Keeps::kInput, 1.0);
}

OpEmitter::Selection OpEmitter::TopK(const std::string& name, std::string kind, TensorId x, int64_t k) {
  const Tensor xt = graph_.tensor(x);
  std::vector<int64_t> shape = xt.shape;
  shape.back() = k;
  TensorId values = NewTensor(name + ".values", shape, xt.dtype);
  TensorId indices = NewTensor(name + ".indices", shape, DType::kI64);
  const bool rg = RequiresGrad(x);
  Op op{.kind = std::move(kind), .name = name, .inputs = {x}, .outputs = {values, indices},
        .flops = static_cast<double>(xt.elements()), .compute_dtype = xt.dtype};
  if (rg) op.saved = {indices};
  Emit(std::move(op), rg);
  return {.values = values, .indices = indices};
}

TensorId OpEmitter::Pow(const std::string& name, TensorId x) {
  return Pointwise(name, "pow", x, Keeps::kInput, 1.0);
}

TensorId OpEmitter::MeanLastDim(const std::string& name, TensorId x) {
  const Tensor xt = graph_.tensor(x);
  std::vector<int64_t> shape = xt.shape;
  if (!shape.empty()) shape.back() = 1;
  TensorId y = NewTensor(name + ".out", shape, xt.dtype);
  const bool rg = RequiresGrad(x);
  Op op{.kind = "mean", .name = name, .inputs = {x}, .outputs = {y},
        .flops = static_cast<double>(xt.elements()), .compute_dtype = xt.dtype};
  if (rg && options_.runtime.MeanSavesInput()) op.saved = {x};
  Emit(std::move(op), rg);
  return y;
}

TensorId OpEmitter::Rsqrt(const std::string& name, TensorId x) {
  return Pointwise(name, "rsqrt", x, Keeps::kOutput, 2.0);
}

TensorId OpEmitter::Contiguous(const std::string& name, TensorId x) {
  const Tensor xt = graph_.tensor(x);
  TensorId y = NewTensor(name + ".out", xt.shape, xt.dtype);
  Emit({.kind = "contiguous", .name = name, .inputs = {x}, .outputs = {y}, .compute_dtype = xt.dtype},
       RequiresGrad(x));
  return y;
}

TensorId OpEmitter::Concat(const std::string& name, const std::vector<TensorId>& parts,
                           std::vector<int64_t> shape) {
  const DType dtype = graph_.tensor(parts.front()).dtype;
  TensorId y = NewTensor(name + ".out", std::move(shape), dtype);
  bool rg = false;
  for (TensorId part : parts) rg = rg || RequiresGrad(part);
  Emit({.kind = "cat", .name = name, .inputs = parts, .outputs = {y}, .compute_dtype = dtype}, rg);
  return y;
}

TensorId OpEmitter::Softmax(const std::string& name, TensorId x, bool force_f32) {
  // softmax(x, dtype=float32) converts x first (x.toType(float32)), except that CUDA has a kernel reading fp16
  // and writing f32 (ATen SoftMax.cpp, softmax(input, dim, dtype)); the copy lives until the softmax is done.
  const DType input_dtype = graph_.tensor(x).dtype;
  if (force_f32 && input_dtype != DType::kF32 &&
      !(options_.runtime.kernels == Kernels::kCuda && input_dtype == DType::kF16)) {
    x = Cast(name + ".to_f32", x, DType::kF32);
  }
  const Tensor xt = graph_.tensor(x);
  // CUDA autocast runs softmax in f32; PyTorch's CPU autocast leaves it in the
  // input's dtype (Note [Runtime differences]).
  const bool upcast = options_.autocast && options_.runtime.kernels == Kernels::kCuda;
  const DType dtype = force_f32 ? DType::kF32
                      : upcast  ? options_.autocast_wide_dtype
                                : xt.dtype;
  TensorId y = NewTensor(name + ".out", xt.shape, dtype);
  const bool rg = RequiresGrad(x);
  Op op{.kind = "softmax", .name = name, .inputs = {x}, .outputs = {y},
        .flops = 5.0 * static_cast<double>(xt.elements()), .compute_dtype = dtype};
  if (rg) op.saved = {y};
  Emit(std::move(op), rg);
  return y;
}

TensorId OpEmitter::Dropout(const std::string& name, TensorId x, double p) {
  if (!options_.training || p <= 0) return x;
  const Tensor xt = graph_.tensor(x);
  TensorId y = NewTensor(name + ".out", xt.shape, xt.dtype);
  TensorId mask = NewTensor(name + ".mask", xt.shape, options_.runtime.DropoutMaskDType(xt.dtype));
  const bool rg = RequiresGrad(x);
  Op op{.kind = "dropout", .name = name, .inputs = {x}, .outputs = {y, mask},
        .flops = 2.0 * static_cast<double>(xt.elements()), .compute_dtype = xt.dtype};
  if (rg) op.saved = {mask};
  Emit(std::move(op), rg);
  return y;
}

TensorId OpEmitter::Rotary(const std::string& name, TensorId x, TensorId cos, TensorId sin,
                           int64_t rotary_dims) {
  const Tensor xt = graph_.tensor(x);
  TensorId y = NewTensor(name + ".out", xt.shape, xt.dtype);
  const double rotated = static_cast<double>(xt.elements()) * static_cast<double>(rotary_dims) /
                         static_cast<double>(xt.shape.back());
  Op op{.kind = "rotary", .name = name, .inputs = {x, cos, sin}, .outputs = {y},
        .flops = 3.0 * rotated, .compute_dtype = xt.dtype};
  Emit(std::move(op), RequiresGrad(x));
  return y;
}

TensorId OpEmitter::RepeatKv(const std::string& name, TensorId x, int64_t heads) {
  const Tensor xt = graph_.tensor(x);
  std::vector<int64_t> shape = xt.shape;
  shape[1] = heads;
  TensorId y = NewTensor(name + ".out", shape, xt.dtype);
  Emit({.kind = "repeat_kv", .name = name, .inputs = {x}, .outputs = {y},
        .compute_dtype = xt.dtype},
       RequiresGrad(x));
  return y;
}

TensorId OpEmitter::Zeros(const std::string& name, std::vector<int64_t> shape, DType dtype) {
  TensorId y = NewTensor(name, std::move(shape), dtype);
  Emit({.kind = "zeros", .name = name, .outputs = {y}, .compute_dtype = dtype}, false);
  return y;
}

TensorId OpEmitter::Materialize(const std::string& name, std::string kind, const std::vector<TensorId>& inputs,
                                std::vector<int64_t> shape, DType dtype) {
  TensorId y = NewTensor(name + ".out", std::move(shape), dtype);
  bool rg = false;
  for (TensorId in : inputs) rg = rg || RequiresGrad(in);
  Emit({.kind = std::move(kind), .name = name, .inputs = inputs, .outputs = {y}, .compute_dtype = dtype}, rg);
  return y;
}

void OpEmitter::ScopeEnd(const std::string& name, std::vector<TensorId> tensors) {
  // No kernel runs: one byte read keeps Emit from charging a read of every input.
  Emit({.kind = "scope_end", .name = name, .inputs = std::move(tensors), .bytes_read = 1}, false);
}

TensorId OpEmitter::FlashAttention(const std::string& name, TensorId q, TensorId k, TensorId v,
                                   bool causal, TensorId sinks) {
  q = ToCompute(name + ".q_cast", q);
  k = ToCompute(name + ".k_cast", k);
  v = ToCompute(name + ".v_cast", v);
  const Tensor qt = graph_.tensor(q);
  const int64_t b = qt.shape[0], heads = qt.shape[1], s = qt.shape[2], d = qt.shape[3];
  const int64_t s_kv = graph_.tensor(k).shape[2];
  TensorId out = NewTensor(name + ".out", qt.shape, qt.dtype);
  TensorId lse = NewTensor(name + ".logsumexp", {b, heads, s}, DType::kF32);
  const bool rg = RequiresGrad(q) || RequiresGrad(k) || RequiresGrad(v) || RequiresGrad(sinks);
  // QK^T and PV; a causal kernel skips the blocks above the diagonal.
  double flops = 4.0 * static_cast<double>(b * heads) * static_cast<double>(s) *
                 static_cast<double>(s_kv) * static_cast<double>(d);
  if (causal) flops /= 2;
  Op op{.kind = "sdpa_flash", .name = name, .inputs = {q, k, v}, .outputs = {out, lse},
        .flops = flops, .compute_dtype = qt.dtype};
  if (rg) op.saved = {q, k, v, out, lse};
  if (sinks != kNone) {
    op.inputs.push_back(sinks);
    if (rg) op.saved.push_back(sinks);
  }
  Emit(std::move(op), rg);
  return out;
}

TensorId OpEmitter::Conv1d(const std::string& name, TensorId x, TensorId weight, TensorId bias,
                           int64_t stride, int64_t padding) {
  x = ToCompute(name + ".input_cast", x);
  weight = ToCompute(name + ".weight_cast", weight);
  bias = ToCompute(name + ".bias_cast", bias);
  const Tensor xt = graph_.tensor(x);
  const Tensor wt = graph_.tensor(weight);
  const int64_t n = xt.shape[0], length = xt.shape[2];
  const int64_t out_c = wt.shape[0], in_per_group = wt.shape[1], k = wt.shape[2];
  const int64_t out_length = (length + 2 * padding - k) / stride + 1;
  TensorId y = NewTensor(name + ".out", {n, out_c, out_length}, xt.dtype);
  Op op{.kind = "conv1d", .name = name, .inputs = {x, weight}, .outputs = {y},
        .flops = 2.0 * static_cast<double>(n * out_c * out_length) * static_cast<double>(in_per_group * k),
        .compute_dtype = xt.dtype};
  if (bias != kNone) op.inputs.push_back(bias);
  if (RequiresGrad(weight)) op.saved.push_back(x);
  if (RequiresGrad(x)) op.saved.push_back(weight);
  Emit(std::move(op), RequiresGrad(x) || RequiresGrad(weight) || RequiresGrad(bias));
  return y;
}

TensorId OpEmitter::Conv2d(const std::string& name, TensorId x, TensorId weight, TensorId bias,
                           int64_t stride, int64_t padding) {
  x = ToCompute(name + ".input_cast", x);
  weight = ToCompute(name + ".weight_cast", weight);
  bias = ToCompute(name + ".bias_cast", bias);
  const Tensor xt = graph_.tensor(x);
  const Tensor wt = graph_.tensor(weight);
  const int64_t n = xt.shape[0], h = xt.shape[2], w = xt.shape[3];
  const int64_t out_c = wt.shape[0], in_per_group = wt.shape[1], kh = wt.shape[2],
                kw = wt.shape[3];
  const int64_t ho = (h + 2 * padding - kh) / stride + 1;
  const int64_t wo = (w + 2 * padding - kw) / stride + 1;
  TensorId y = NewTensor(name + ".out", {n, out_c, ho, wo}, xt.dtype);
  Op op{.kind = "conv2d", .name = name, .inputs = {x, weight}, .outputs = {y},
        .flops = 2.0 * static_cast<double>(n * out_c * ho * wo) *
                 static_cast<double>(in_per_group * kh * kw),
        .compute_dtype = xt.dtype};
  if (bias != kNone) op.inputs.push_back(bias);
  if (RequiresGrad(weight)) op.saved.push_back(x);
  if (RequiresGrad(x)) op.saved.push_back(weight);
  Emit(std::move(op), RequiresGrad(x) || RequiresGrad(weight) || RequiresGrad(bias));
  return y;
}

OpEmitter::Scan OpEmitter::SelectiveScan(const std::string& name, TensorId delta_a, TensorId delta_b_u, TensorId c,
                                         TensorId state0, DType matmul_dtype) {
  const std::vector<int64_t> shape = graph_.tensor(delta_a).shape;  // [b, d, l, n]
  const int64_t b = shape[0], d = shape[1], l = shape[2], n = shape[3];
  const bool rg = RequiresGrad(delta_a) || RequiresGrad(delta_b_u) || RequiresGrad(c) || RequiresGrad(state0);
  Scan out{.y = NewTensor(name + ".out", {b, d, l}, matmul_dtype), .last_state = kNone};
  // Per step: a multiply-add over the state and its product with C.
  Op op{.kind = "selective_scan", .name = name, .inputs = {delta_a, delta_b_u, c, state0}, .outputs = {out.y},
        .flops = 4.0 * static_cast<double>(b * d * l * n), .compute_dtype = DType::kF32};
  if (rg && options_.training) {
    // Autograd keeps the initial state, deltaA (one storage, sliced per step), C and each step's state: the
    // next step's multiply saves it, and so does this step's matmul when it runs in f32. When the matmul runs
    // 16-bit it saves a 16-bit copy of every state instead, and the last f32 state, which no later step reads,
    // is not kept.
    const bool copies = matmul_dtype != DType::kF32;
    op.saved = {state0, delta_a, c};
    if (!copies || l > 1) {
      TensorId states = NewTensor(name + ".states", {b, d, copies ? l - 1 : l, n}, DType::kF32);
      op.outputs.push_back(states);
      op.saved.push_back(states);
    }
    if (copies) {
      TensorId state_copies = NewTensor(name + ".state_copies", shape, matmul_dtype);
      op.outputs.push_back(state_copies);
      op.saved.push_back(state_copies);
    }
  } else {
    // Each step's state replaces the last (under no_grad); the final one is what a cache keeps.
    out.last_state = NewTensor(name + ".last_state", {b, d, n}, DType::kF32);
    op.outputs.push_back(out.last_state);
  }
  Emit(std::move(op), rg);
  return out;
}

TensorId OpEmitter::MaxPool2d(const std::string& name, TensorId x, int64_t kernel,
                              int64_t stride, int64_t padding) {
  const Tensor xt = graph_.tensor(x);
  const int64_t ho = (xt.shape[2] + 2 * padding - kernel) / stride + 1;
  const int64_t wo = (xt.shape[3] + 2 * padding - kernel) / stride + 1;
  const std::vector<int64_t> shape = {xt.shape[0], xt.shape[1], ho, wo};
  const DType dtype = xt.dtype;
  TensorId y = NewTensor(name + ".out", shape, dtype);
  TensorId indices = NewTensor(name + ".indices", shape, DType::kI64);
  const bool rg = RequiresGrad(x);
  Op op{.kind = "max_pool2d", .name = name, .inputs = {x}, .outputs = {y, indices},
        .flops = static_cast<double>(graph_.tensor(y).elements() * kernel * kernel),
        .compute_dtype = dtype};
  if (rg) op.saved = {x, indices};
  Emit(std::move(op), rg);
  return y;
}

TensorId OpEmitter::AdaptiveAvgPool2d(const std::string& name, TensorId x, int64_t out_h,
                                      int64_t out_w) {
  const Tensor xt = graph_.tensor(x);
  TensorId y = NewTensor(name + ".out", {xt.shape[0], xt.shape[1], out_h, out_w}, xt.dtype);
  const bool rg = RequiresGrad(x);
  Op op{.kind = "adaptive_avg_pool2d", .name = name, .inputs = {x}, .outputs = {y},
        .flops = static_cast<double>(xt.elements()), .compute_dtype = xt.dtype};
  if (rg) op.saved = {x};
  Emit(std::move(op), rg);
  return y;
}

TensorId OpEmitter::GatherRows(const std::string& name, TensorId x, int64_t rows, TensorId index) {
  const Tensor xt = graph_.tensor(x);
  std::vector<int64_t> shape = xt.shape;
  shape[0] = rows;
  TensorId y = NewTensor(name + ".out", shape, xt.dtype);
  Op op{.kind = "gather_rows", .name = name, .inputs = {x}, .outputs = {y}, .compute_dtype = xt.dtype};
  if (index != kNone) {
    op.inputs.push_back(index);
    if (RequiresGrad(x)) op.saved.push_back(index);  // index_backward scatters the gradient by it
  }
  Emit(std::move(op), RequiresGrad(x));
  return y;
}

TensorId OpEmitter::MaskedScatter(const std::string& name, TensorId x, TensorId mask, TensorId source) {
  const Tensor xt = graph_.tensor(x);
  TensorId y = NewTensor(name + ".out", xt.shape, xt.dtype);
  const bool rg = RequiresGrad(x) || RequiresGrad(source);
  // derivatives.yaml: self's gradient is grad.masked_fill(mask, 0), source's masked_scatter_backward(grad, mask).
  Op op{.kind = "masked_scatter", .name = name, .inputs = {x, mask, source}, .outputs = {y},
        .flops = static_cast<double>(xt.elements()), .compute_dtype = xt.dtype};
  if (rg) op.saved = {mask};
  Emit(std::move(op), rg);
  return y;
}

TensorId OpEmitter::IndexAdd(const std::string& name, TensorId acc, TensorId src) {
  const Tensor at = graph_.tensor(acc);
  TensorId y = graph_.AddTensor({.name = name + ".out", .shape = at.shape, .dtype = at.dtype,
                                 .role = TensorRole::kActivation, .layer = layer_,
                                 .view_of = at.view_of == kNone ? acc : at.view_of});
  Emit({.kind = "index_add", .name = name, .inputs = {acc, src}, .outputs = {y},
        .flops = static_cast<double>(graph_.tensor(src).elements()),
        .bytes_written = graph_.tensor(src).bytes(), .compute_dtype = graph_.tensor(acc).dtype,
        .inplace = true},
       RequiresGrad(acc) || RequiresGrad(src));
  return y;
}

OpEmitter::Routing OpEmitter::RouterTopK(const std::string& name, TensorId logits, int64_t k) {
  const Tensor lt = graph_.tensor(logits);
  const int64_t tokens = lt.shape[0];
  const DType weight_dtype = lt.dtype;
  TensorId probs = NewTensor(name + ".probs", lt.shape, DType::kF32);
  TensorId weights = NewTensor(name + ".weights", {tokens, k}, weight_dtype);
  TensorId indices = NewTensor(name + ".indices", {tokens, k}, DType::kI64);
  const bool rg = RequiresGrad(logits);
  Op op{.kind = "router_topk", .name = name, .inputs = {logits},
        .outputs = {probs, weights, indices},
        .flops = 6.0 * static_cast<double>(lt.elements()), .compute_dtype = DType::kF32};
  if (rg) op.saved = {probs, indices};
  Emit(std::move(op), rg);
  return {.weights = weights, .indices = indices};
}

// Note [Cross-entropy under autocast]
// F.cross_entropy is no autocast op of its own: ATen's cross_entropy_loss
// calls log_softmax(self, class_dim, self.scalar_type()) and then nll_loss
// (aten/src/ATen/native/LossNLL.cpp). CUDA autocast leaves a log_softmax
// given a dtype alone (its fp32_set_opt_dtype policy) and casts nll_loss's
// input to f32, so 16-bit logits give 16-bit log-probabilities, saved, and an
// f32 copy of them that nll_loss saves; backward writes the f32 gradient,
// casts it back, then log_softmax's. The recorded H100 BERT step under bf16
// autocast holds exactly these blocks (validation/fixtures/cuda). The CPU
// runtime (PyTorch 1.13's CPU autocast) keeps the older model: the logits
// cast to f32 before log_softmax.
TensorId OpEmitter::CrossEntropy(const std::string& name, TensorId logits, TensorId labels) {
  const bool cuda_autocast = options_.autocast && options_.runtime.kernels == Kernels::kCuda;
  if (options_.autocast && !cuda_autocast) logits = Cast(name + ".input_cast", logits, options_.autocast_wide_dtype);
  const Tensor lt = graph_.tensor(logits);
  const bool rg = RequiresGrad(logits);
  TensorId log_probs = NewTensor(name + ".log_probs", lt.shape, lt.dtype);
  Op log_softmax{.kind = "log_softmax", .name = name + ".log_softmax", .inputs = {logits}, .outputs = {log_probs},
                 .flops = 5.0 * static_cast<double>(lt.elements()), .compute_dtype = lt.dtype};
  if (rg) log_softmax.saved = {log_probs};
  Emit(std::move(log_softmax), rg);
  if (cuda_autocast) log_probs = Cast(name + ".nll_input_cast", log_probs, options_.autocast_wide_dtype);
  TensorId loss = NewTensor(name.empty() ? "loss" : name + ".loss", {}, DType::kF32);
  Op nll{.kind = "nll_loss", .name = name, .inputs = {log_probs, labels}, .outputs = {loss},
         .flops = static_cast<double>(lt.shape.empty() ? 1 : lt.shape.front()),
         .compute_dtype = graph_.tensor(log_probs).dtype};
  if (rg) nll.saved = {log_probs, labels};
  Emit(std::move(nll), rg);
  return loss;
}

// Note [loss_parallel's cross-entropy]
// Under torch.distributed.tensor.parallel.loss_parallel each rank holds its
// vocabulary shard of the logits; log_softmax runs on the shard (its
// all-reduces exchange one value per row) and its output is saved, as in
// CrossEntropy. Backward is one function for nll_loss and log_softmax
// together (_nll_loss_and_log_softmax_backward in
// torch/distributed/tensor/parallel/loss.py, PyTorch 2.15): zeros_like(x),
// exp(x), their sum, and the sum times the output gradient, so three tensors
// of the shard's size are live at once in nll_loss's backward
// (nll_loss_parallel: the gradient and two temporaries, graph/autograd.cc);
// log_softmax's backward then only casts that gradient to the input's dtype
// (_log_softmax_backward_handler), a pass-through in the same dtype. Seen on
// llama-gqa-tp-2 (validation/fixtures/distributed): the rank's peak is in
// nll_loss_backward.
TensorId OpEmitter::LossParallelCrossEntropy(const std::string& name, TensorId logits, TensorId labels) {
  const Tensor lt = graph_.tensor(logits);
  const bool rg = RequiresGrad(logits);
  TensorId log_probs = NewTensor(name + ".log_probs", lt.shape, lt.dtype);
  Op log_softmax{.kind = "log_softmax_parallel", .name = name + ".log_softmax", .inputs = {logits},
                 .outputs = {log_probs}, .flops = 5.0 * static_cast<double>(lt.elements()), .compute_dtype = lt.dtype};
  if (rg) log_softmax.saved = {log_probs};
  Emit(std::move(log_softmax), rg);
  TensorId loss = NewTensor(name + ".loss", {}, DType::kF32);
  Op nll{.kind = "nll_loss_parallel", .name = name, .inputs = {log_probs, labels}, .outputs = {loss},
         .flops = static_cast<double>(lt.shape.empty() ? 1 : lt.shape.front()), .compute_dtype = lt.dtype};
  if (rg) nll.saved = {log_probs, labels};
  Emit(std::move(nll), rg);
  return loss;
}

TensorId OpEmitter::DequantizeNf4(const std::string& name, TensorId weight,
                                  const std::vector<TensorId>& constants,
                                  std::vector<int64_t> shape) {
  const DType dtype = options_.compute_dtype == DType::kF32 ? DType::kBF16 : options_.compute_dtype;
  TensorId w = NewTensor(name + ".dequantized", std::move(shape), dtype, TensorRole::kTemporary);
  Op op{.kind = "dequantize_nf4", .name = name, .inputs = {weight}, .outputs = {w},
        .flops = 2.0 * static_cast<double>(graph_.tensor(w).elements()), .compute_dtype = dtype};
  op.inputs.insert(op.inputs.end(), constants.begin(), constants.end());
  Emit(std::move(op), false);
  return w;
}

TensorId OpEmitter::AllReduce(const std::string& name, TensorId x, int group) {
  const Tensor xt = graph_.tensor(x);
  TensorId y = graph_.AddTensor({.name = name + ".out", .shape = xt.shape, .dtype = xt.dtype,
                                 .role = TensorRole::kActivation, .layer = layer_,
                                 .view_of = xt.view_of == kNone ? x : xt.view_of});
  // A ring all-reduce moves 2(g-1)/g of the tensor through each GPU.
  const uint64_t bytes = DTypeBytes(xt.dtype, xt.elements());
  const auto moved = static_cast<uint64_t>(2.0 * (group - 1) / group * static_cast<double>(bytes));
  Emit({.kind = "all_reduce", .name = name, .inputs = {x}, .outputs = {y},
        .bytes_read = moved, .bytes_written = moved,
        .compute_dtype = graph_.tensor(x).dtype, .inplace = true},
       RequiresGrad(x));
  return y;
}

TensorId OpEmitter::AllGather(const std::string& name, TensorId x_shard, int dim, int group) {
  const Tensor xt = graph_.tensor(x_shard);
  std::vector<int64_t> shape = xt.shape;
  shape[static_cast<size_t>(dim)] *= group;
  TensorId y = NewTensor(name + ".out", shape, xt.dtype, TensorRole::kTemporary);
  Emit({.kind = "all_gather", .name = name, .inputs = {x_shard}, .outputs = {y},
        .compute_dtype = xt.dtype},
       RequiresGrad(x_shard));
  return y;
}

TensorId OpEmitter::ReduceScatter(const std::string& name, TensorId x, int dim, int group) {
  const Tensor xt = graph_.tensor(x);
  std::vector<int64_t> shape = xt.shape;
  shape[static_cast<size_t>(dim)] /= group;
  TensorId y = NewTensor(name + ".out", shape, xt.dtype);
  Emit({.kind = "reduce_scatter", .name = name, .inputs = {x}, .outputs = {y},
        .compute_dtype = xt.dtype},
       RequiresGrad(x));
  return y;
}

}  // namespace headroom

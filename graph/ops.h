// Op emitters: append one forward op to a Graph with its FLOPs, bytes, output
// dtypes and the tensors PyTorch autograd saves for its backward.
//
// Builders (models/builders.h) are written in terms of these, and tests may
// use them to hand-build graphs. Each emitter returns the id of the op's main
// output tensor.
//
//   Graph g("mlp");
//   OpEmitter e(g, {.compute_dtype = DType::kBF16, .training = true});
//   TensorId x = e.Input("x", {8, 1024}, DType::kBF16);
//   TensorId w = e.Parameter("fc.weight", {4096, 1024}, DType::kBF16);
//   TensorId y = e.Linear("fc", x, w);        // saves x (w needs a gradient)
//   TensorId z = e.Activation("act", ActivationKind::kGelu, y);  // saves y
//
// Op kinds, their inputs (in order), outputs and saved sets. "saves X if Y"
// is Note [Saved tensors follow requires_grad] in builders.h. FLOPs count a
// multiply-add as 2; bytes are the tensors' storage read and written.
//   embedding      (ids, table) -> out                 saves ids
//   linear         (x, weight[, bias][, x_shard]) -> y  saves x if weight
//                  requires grad (x_shard instead under sequence parallel,
//                  see Note [Sequence-parallel linear]); flops 2*rows*in*out.
//                  weight is [out, in] (nn.Linear) or [in, out] (GPT-2 Conv1D,
//                  the op's attribute is implied by the shape it reads).
//   matmul         (a, b) -> c, batched a[..., m, k] @ b[..., k, n]
//                  saves a if b requires grad, b if a does; flops 2*batch*m*n*k
//   attention_scores (q [b, s, h*d], k [b, t, h*d]) -> [b, h, s, t]   saves as matmul
//   attention_context (probs [b, h, s, t], v [b, t, h*d]) -> [b, s, h*d]  saves as matmul
//   baddbmm        (a, b, bias) -> bias + a @ b in one output (Bloom's ALiBi scores)
//                  saves as matmul; the broadcast bias needs no gradient
//   cast           (x) -> y in another dtype            saves nothing
//   layer_norm     (x, weight[, bias]) -> (y, mean, rstd)  saves x, mean, rstd
//   rms_norm       (x, weight) -> (y, rstd)             saves x, rstd
//   batch_norm     (x, weight, bias) -> (y, save_mean, save_invstd)
//                  saves x, save_mean, save_invstd (running stats are buffers)
//   gelu, gelu_tanh, silu, softplus (x) -> y             saves x
//   relu, tanh     (x) -> y                             saves y (threshold_backward,
//                  tanh_backward); torchvision's ReLU(inplace=True) is in place
//   mul            (a, b) -> c                          saves b if a requires grad, a if b does
//   add            (a, b) -> c                          saves nothing (also in place)
//   scale          (x) -> y, multiply by a constant     saves nothing
//   masked_scale   (scores) -> y, scale + causal/padding mask   saves nothing
//   add_mask       (scores) -> y, + an additive mask (a constant of the hidden
//                  states' dtype; y promotes)       saves nothing; backward hands the
//                  gradient back (cast to the scores' dtype where y promoted)
//   maximum        (x) -> max(x, c), c a 0-dim constant  saves x (and c): OPT's eager
//                  clamp of its masked scores, torch.max(scores, finfo.min)
//   clamp          (x) -> x clipped to constant bounds   saves x (GPT-OSS's expert activation)
//   topk, max      (x) -> (values, indices i64) over the last dim, k of them (max: x.max(dim=-1,
//                  keepdim=True))                       saves indices (value_selecting_reduction_backward)
//   softmax        (x) -> y                             saves y
//   dropout        (x) -> (y, mask)                     saves mask: bool on CUDA, x's dtype on a CPU
//                  (Note [Runtime differences] in graph/torch_runtime.h)
//   pow            (x) -> x^c                           saves x
//   exp            (x) -> e^x                           saves y
//   vector_norm    (x) -> L2 norm over the last dim, kept  saves x, y
//   log_sigmoid    (x) -> (y, buffer)                   saves x, buffer (log_sigmoid_forward's; empty on CUDA)
//   mean           (x) -> mean over the last dim, kept  saves x before PyTorch 2.0, else nothing
//   rsqrt          (x) -> y                             saves y
//   contiguous     (x view) -> dense copy               saves nothing; its gradient is the output's
//   rotary         (x, cos, sin) -> y                   saves nothing (cos/sin are buffers)
//   sdpa_flash     (q, k, v[, sinks]) -> (out, logsumexp f32)  saves q, k, v[, sinks], out, logsumexp
//                  (sinks: per-head sink logits a kernel adds to each softmax's denominator, GPT-OSS's s_aux)
//                  (dropout inside the kernel keeps only an RNG seed)
//   conv1d, conv2d (x, weight[, bias]) -> y             saves x (if weight requires grad), weight
//                  (conv1d: Whisper's audio front end, Mamba's depthwise causal convolution)
//   selective_scan (deltaA, deltaB_u, C, state0) -> (y[, states, state copies] | y, last state)
//                  Mamba's sequential scan as one op (Note [Mamba] in models/builders/state_space.cc): in training
//                  it keeps every step's state [b, d, l, n] f32 (when the matmul runs 16-bit, their
//                  16-bit copies and all but the last f32 state) and saves them with state0, deltaA, C
//   max_pool2d     (x) -> (y, indices i64)              saves x, indices
//   adaptive_avg_pool2d (x) -> y                        saves x
//   repeat_kv      (x [b, kv, s, d]) -> [b, heads, s, d] copy (HF eager GQA)  saves nothing
//   zeros          () -> y                              saves nothing
//   repeat, gather, repeat_interleave, alibi, ... (inputs) -> y   saves nothing: tensors no gradient reaches,
//                  computed from positions and tables (Materialize; GPT-J's per-layer sin/cos, ALiBi biases)
//   gather_rows    (x) -> y, a row subset (MoE dispatch) saves nothing (indices are ints)
//   index_add      (acc, src) -> acc (in place)         saves nothing
//   router_topk    (logits) -> (probs f32, weights, indices i64), HF Mixtral's
//                  softmax(f32) + topk + renormalize   saves probs, indices
//   log_softmax    (logits) -> log_probs                saves log_probs
//   nll_loss       (log_probs, labels) -> loss          saves log_probs, labels; its backward
//                  writes a dense log_probs-sized gradient (F.cross_entropy is these two ops)
//   dequantize_nf4 (weight nf4, absmax[, nested_absmax, quant_map, nested_quant_map])
//                  -> w temporary in compute dtype      saves nothing; QLoRA's
//                  backward dequantizes again (bitsandbytes MatMul4Bit)
//   all_reduce     (x) -> x in place                    saves nothing, flops 0
//   all_gather     (x_shard) -> x                       saves nothing
//   reduce_scatter (x) -> x_shard                       saves nothing
//   view           (x) -> view of x                     allocates nothing
//   scope_end      (tensors...) -> nothing              reads its inputs (Python locals), no work
// Ops that read a "dequantize_nf4" output as their weight do not save it.
//
// Note [Sequence-parallel linear]
// With sequence parallelism the input of a column-parallel linear is
// all-gathered from sequence shards. Megatron-LM saves the shard, not the
// gathered tensor, and re-gathers it in backward (Korthikanti et al. 2022,
// Section 4.2.2). The linear therefore lists the shard as an extra last
// input and saves it; the gathered tensor is a kTemporary freed after its
// last forward use.
#ifndef HEADROOM_GRAPH_OPS_H_
#define HEADROOM_GRAPH_OPS_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "graph/graph.h"
#include "graph/torch_runtime.h"

namespace headroom {

// Elementwise nonlinearity. kGeluTanh is one tanh-approximated GELU kernel
// (HF's "gelu_pytorch_tanh"); kGeluNew is HF's "gelu_new", the same function
// written in PyTorch ops, which builders emit op by op (Note [gelu_new] in
// models/builders.cc); OpEmitter::Activation emits it as one kGeluTanh-like op.
// kQuickGelu is CLIP's x * sigmoid(1.702 x), likewise PyTorch ops that
// builders emit one by one (Note [quick_gelu]).
enum class ActivationKind : uint8_t {
  kGelu, kGeluTanh, kGeluNew, kSilu, kRelu, kTanh, kSigmoid, kQuickGelu,
  kSoftplus,  // log(1 + e^x): Mamba's time step; not an HF hidden_act
};
std::string_view ActivationName(ActivationKind kind);  // "gelu", "gelu_tanh", "silu", ...

struct EmitterOptions {
  DType compute_dtype = DType::kF32;
  // Under autocast (Note [Mixed precision is autocast] in builders.h)
  // matmul operands are cast to compute_dtype and norms/softmax/loss run f32.
  bool autocast = false;
  // The dtype autocast runs its "fp32" ops (norms, softmax, loss) in: f32
  // for torch.autocast over f32 weights; the weights' dtype for an fp8
  // recipe over 16-bit weights (Transformer Engine style).
  DType autocast_wide_dtype = DType::kF32;
  bool training = true;  // dropout is identity (no op) when false
  // The PyTorch version and kernels (Note [Runtime differences]).
  TorchRuntime runtime;
};

class OpEmitter {
 public:
  OpEmitter(Graph& graph, EmitterOptions options) : graph_(graph), options_(options) {}

  // Block index stamped on the ops and tensors emitted next (-1: none).
  void set_layer(int layer) { layer_ = layer; }
  int layer() const { return layer_; }
  void set_phase(Phase phase) { phase_ = phase; }
  // Marks the ops emitted next as eager attention's core (Op::attention_core).
  void set_attention_core(bool on) { attention_core_ = on; }
  const EmitterOptions& options() const { return options_; }
  Graph& graph() { return graph_; }

  // Leaf tensors.
  TensorId Parameter(std::string name, std::vector<int64_t> shape, DType dtype,
                     bool trainable = true);
  TensorId Buffer(std::string name, std::vector<int64_t> shape, DType dtype);
  TensorId Input(std::string name, std::vector<int64_t> shape, DType dtype);

  // Whether a gradient flows to `id` (Note [Saved tensors follow requires_grad]).
  bool RequiresGrad(TensorId id) const;

  TensorId Embedding(const std::string& name, TensorId ids, TensorId table);
  // `bias` may be kNone. `x_shard`: Note [Sequence-parallel linear].
  TensorId Linear(const std::string& name, TensorId x, TensorId weight, TensorId bias = kNone,
                  TensorId x_shard = kNone);
  // a[..., m, k] @ b[..., k, n]; `b_transposed` reads b as [..., n, k].
  TensorId MatMul(const std::string& name, TensorId a, TensorId b, bool b_transposed = false);
  // Multi-head attention's two GEMMs over token-major tensors, the head split and merge folded into the GEMM's
  // strides (one strided batched GEMM per head, as a fused kernel reads q/k/v in place): scores
  // q [b, s, heads*d] x k [b, t, heads*d] -> [b, heads, s, t] (q_h k_h^T per head), and context
  // probs [b, heads, s, t] x v [b, t, heads*d] -> [b, s, heads*d]. Saved as matmul saves its operands.
  TensorId AttentionScores(const std::string& name, TensorId q, TensorId k, int64_t heads);
  TensorId AttentionContext(const std::string& name, TensorId probs, TensorId v);
  // torch._grouped_mm(a [E, rows, k], b [E, k, n], offs): each expert's rows against its weight; autograd also
  // keeps the group offsets (int32 [E]). b_transposed: b is [E, n, k], passed as its transpose (a view).
  TensorId GroupedMatMul(const std::string& name, TensorId a, TensorId b, TensorId offsets,
                         bool b_transposed = false);
  // bias + a @ b as torch.baddbmm computes it: no separate product tensor.
  TensorId BaddBmm(const std::string& name, TensorId bias, TensorId a, TensorId b, bool b_transposed = false);
  // No-op (returns x) when x already has `dtype`.
  TensorId Cast(const std::string& name, TensorId x, DType dtype);
  // Autocast's cast of a matmul operand: Cast to compute_dtype under autocast.
  TensorId ToCompute(const std::string& name, TensorId x);
  TensorId LayerNorm(const std::string& name, TensorId x, TensorId weight, TensorId bias);
  TensorId RmsNorm(const std::string& name, TensorId x, TensorId weight);
  TensorId BatchNorm(const std::string& name, TensorId x, TensorId weight, TensorId bias);
  TensorId Activation(const std::string& name, ActivationKind kind, TensorId x,
                      bool inplace = false);
  TensorId Mul(const std::string& name, TensorId a, TensorId b);
  TensorId Add(const std::string& name, TensorId a, TensorId b);
  // acc += other (torchvision's `out += identity`): a new view of acc's storage.
  TensorId AddInplace(const std::string& name, TensorId acc, TensorId other);
  TensorId Scale(const std::string& name, TensorId x);
  TensorId MaskedScale(const std::string& name, TensorId scores);
  // scores + mask, transformers' additive attention mask, built once per forward in `mask_dtype` (so no
  // tensor of the graph): the sum has PyTorch's promoted dtype.
  TensorId AddMask(const std::string& name, TensorId scores, DType mask_dtype);
  // torch.max(x, c) with c a 0-dim constant tensor: elementwise maximum, which saves x.
  TensorId Maximum(const std::string& name, TensorId x);
  // torch.clamp(x, min, max) with constant bounds: saves x, whose backward masks the clipped elements.
  TensorId Clamp(const std::string& name, TensorId x);
  struct Selection {
    TensorId values;   // [..., k], x's dtype
    TensorId indices;  // [..., k] i64
  };
  // torch.topk(x, k, dim=-1) (`kind` "topk") or x.max(dim=-1, keepdim=True) (`kind` "max", k 1).
  Selection TopK(const std::string& name, std::string kind, TensorId x, int64_t k);
  // x to a constant power, a mean over the last dimension (kept as size 1),
  // and 1/sqrt(x): Hugging Face's eager RMSNorm and gelu_new use these.
  TensorId Pow(const std::string& name, TensorId x);
  TensorId Exp(const std::string& name, TensorId x);
  // x.norm(p=2, dim=-1, keepdim=True): CLIP and SigLIP normalize their embeddings by it.
  TensorId VectorNorm(const std::string& name, TensorId x);
  // F.logsigmoid, whose forward also returns the buffer its backward reads (SigLIP's loss).
  TensorId LogSigmoid(const std::string& name, TensorId x);
  TensorId MeanLastDim(const std::string& name, TensorId x);
  TensorId Rsqrt(const std::string& name, TensorId x);
  // x.contiguous() of a strided view: a dense copy.
  TensorId Contiguous(const std::string& name, TensorId x);
  // torch.cat of `parts` (or F.pad of one) into a new tensor of `shape`, in the first part's dtype.
  TensorId Concat(const std::string& name, const std::vector<TensorId>& parts, std::vector<int64_t> shape);
  // Output dtype: x's, f32 under autocast, or `force_f32` (HF Llama's
  // softmax(..., dtype=torch.float32)).
  TensorId Softmax(const std::string& name, TensorId x, bool force_f32 = false);
  TensorId RepeatKv(const std::string& name, TensorId x, int64_t heads);
  TensorId Zeros(const std::string& name, std::vector<int64_t> shape, DType dtype);
  // A new tensor of `shape` that an op of `kind` computes from `inputs` and
  // autograd keeps nothing for (position arithmetic over tables and indices).
  TensorId Materialize(const std::string& name, std::string kind, const std::vector<TensorId>& inputs,
                       std::vector<int64_t> shape, DType dtype);
  // An op that only reads `tensors`: a Python function's locals, alive until it returns.
  void ScopeEnd(const std::string& name, std::vector<TensorId> tensors);
  // Identity (returns x, emits nothing) when not training or p == 0.
  TensorId Dropout(const std::string& name, TensorId x, double p);
  TensorId Rotary(const std::string& name, TensorId x, TensorId cos, TensorId sin,
                  int64_t rotary_dims);
  // q [b, heads, s, d], k/v [b, kv_heads, s, d] -> out [b, heads, s, d]. `sinks` [heads]: learned sink
  // logits the kernel reads (GPT-OSS), kNone for none.
  TensorId FlashAttention(const std::string& name, TensorId q, TensorId k, TensorId v,
                          bool causal, TensorId sinks = kNone);
  // x [n, c, l], weight [out, c / groups, k] (nn.Conv1d: Whisper's audio front end, Mamba's depthwise causal
  // convolution); `padding` zeros on both ends of l.
  TensorId Conv1d(const std::string& name, TensorId x, TensorId weight, TensorId bias, int64_t stride,
                  int64_t padding);
  // x [n, c, h, w], weight [out, c/groups, kh, kw].
  TensorId Conv2d(const std::string& name, TensorId x, TensorId weight, TensorId bias,
                  int64_t stride, int64_t padding);
  struct Scan {
    TensorId y;           // [b, d, l] in `matmul_dtype`
    TensorId last_state;  // [b, d, n] f32 in inference; kNone in training (it is the last of the states)
  };
  // Mamba's recurrence state = deltaA[:, :, t] * state + deltaB_u[:, :, t]; y[:, :, t] = state @ C[:, t] for
  // t < l, as one op: deltaA and deltaB_u [b, d, l, n] f32, C [b, l, n], state0 [b, d, n]. Each step's matmul
  // runs in `matmul_dtype` (a copy of the state when that is not f32). Note [Mamba] in models/builders/state_space.cc.
  Scan SelectiveScan(const std::string& name, TensorId delta_a, TensorId delta_b_u, TensorId c, TensorId state0,
                     DType matmul_dtype);
  TensorId MaxPool2d(const std::string& name, TensorId x, int64_t kernel, int64_t stride,
                     int64_t padding);
  TensorId AdaptiveAvgPool2d(const std::string& name, TensorId x, int64_t out_h, int64_t out_w);
  // With an `index` (integer rows), x[index] as aten.index runs it, which saves the index.
  TensorId GatherRows(const std::string& name, TensorId x, int64_t rows, TensorId index = kNone);
  // x.masked_scatter(mask, source): x with the positions `mask` selects filled from source, in order (LLaVA's
  // image features into the token embeddings). A new tensor like x; autograd keeps the mask.
  TensorId MaskedScatter(const std::string& name, TensorId x, TensorId mask, TensorId source);
  // acc += src scattered by row (in place): returns a new view of acc's storage.
  TensorId IndexAdd(const std::string& name, TensorId acc, TensorId src);
  struct Routing {
    TensorId weights;  // [tokens, k], in the logits' dtype
    TensorId indices;  // [tokens, k] i64
  };
  Routing RouterTopK(const std::string& name, TensorId logits, int64_t k);
  // F.cross_entropy: log_softmax then nll_loss over logits [n, classes];
  // returns the scalar loss. Under autocast, f32 runs where the runtime's
  // autocast puts it (Note [Cross-entropy under autocast] in ops.cc).
  TensorId CrossEntropy(const std::string& name, TensorId logits, TensorId labels);
  // Cross-entropy over logits sharded by vocabulary under torch.distributed's loss_parallel.
  TensorId LossParallelCrossEntropy(const std::string& name, TensorId logits, TensorId labels);
  TensorId DequantizeNf4(const std::string& name, TensorId weight,
                         const std::vector<TensorId>& constants, std::vector<int64_t> shape);
  // Collectives over the tensor-parallel group of size `group`.
  TensorId AllReduce(const std::string& name, TensorId x, int group);
  TensorId AllGather(const std::string& name, TensorId x_shard, int dim, int group);
  TensorId ReduceScatter(const std::string& name, TensorId x, int dim, int group);
  // A view with a new shape (same elements) or a slice (fewer elements).
  TensorId View(const std::string& name, TensorId x, std::vector<int64_t> shape);

 private:
  TensorId NewTensor(std::string name, std::vector<int64_t> shape, DType dtype,
                     TensorRole role = TensorRole::kActivation);
  TensorId Gemm(const std::string& name, TensorId a, TensorId b, bool b_transposed, TensorId bias,
                TensorId group_offsets = kNone);
  OpId Emit(Op op, bool requires_grad);
  // A one-input op whose output has x's shape and dtype, costing `flops_per_element`; autograd keeps its input
  // or its output.
  enum class Keeps : uint8_t { kInput, kOutput };
  TensorId Pointwise(const std::string& name, std::string kind, TensorId x, Keeps keeps,
                     double flops_per_element);
  // The wider of two floating dtypes (type promotion of elementwise ops).
  static DType Promote(DType a, DType b);
  // A two-input elementwise op, not yet emitted: its output is a new tensor of the broadcast shape (PyTorch's
  // rule) and the promoted dtype, one flop per output element. The caller says what autograd saves.
  Op Broadcasting(const std::string& name, std::string kind, TensorId a, TensorId b);

  Graph& graph_;
  EmitterOptions options_;
  int layer_ = -1;
  Phase phase_ = Phase::kForward;
  bool attention_core_ = false;
  std::vector<bool> requires_grad_;  // by tensor id
};

}  // namespace headroom

#endif  // HEADROOM_GRAPH_OPS_H_

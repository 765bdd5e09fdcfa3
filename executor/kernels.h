// The executor's kernels: forward and backward float32 math for the ops the
// demo models use (executor/demo_models.h), on pointers the compute device
// hands out (host memory for the CPU reference, device memory for CUDA).
// Implementations: CpuKernels (executor/cpu_kernels.h), plain loops in a
// fixed order, and CudaKernels (executor/cuda/), cuBLAS GEMMs and a few
// CUDA kernels. Shapes are the graph's (graph/ops.h), row-major; "rows" is
// the product of all but the last dim. Kernels on a GPU are asynchronous:
// errors surface at the device's next Synchronize.
#ifndef HEADROOM_EXECUTOR_KERNELS_H_
#define HEADROOM_EXECUTOR_KERNELS_H_

#include <cstdint>

namespace headroom {

inline constexpr float kLayerNormEps = 1e-5f;

// Multi-head attention over token-major q/k/v [b, s, heads*d] (graph/ops.h,
// attention_scores and attention_context).
struct AttentionShape {
  int64_t batch = 0, queries = 0, keys = 0, heads = 0, head_dim = 0;
};

class ExecutorKernels {
 public:
  virtual ~ExecutorKernels() = default;

  // out[r] = table[ids[r]]; ids in [0, vocab) (the executor checks the batch).
  virtual void Embedding(const int64_t* ids, int64_t rows, const float* table, int64_t dim, float* out) const = 0;
  // dtable = 0, then dtable[ids[r]] += dy[r].
  virtual void EmbeddingBackward(const int64_t* ids, int64_t rows, const float* dy, int64_t dim, int64_t vocab,
                                 float* dtable) const = 0;

  // y = x w^T + bias, w [out, in] (nn.Linear); bias may be null.
  virtual void Linear(const float* x, int64_t rows, int64_t in, const float* w, const float* bias, int64_t out,
                      float* y) const = 0;
  virtual void LinearInputGrad(const float* dy, int64_t rows, int64_t out, const float* w, int64_t in,
                               float* dx) const = 0;
  virtual void LinearWeightGrad(const float* dy, const float* x, int64_t rows, int64_t in, int64_t out,
                                float* dw) const = 0;
  // dbias[o] = sum over rows of dy[r, o].
  virtual void BiasGrad(const float* dy, int64_t rows, int64_t out, float* dbias) const = 0;

  // scores [b, heads, s, t] = q_h k_h^T per head; context [b, s, heads*d] = probs_h v_h.
  virtual void AttentionScores(const AttentionShape& a, const float* q, const float* k, float* scores) const = 0;
  virtual void AttentionScoresQueryGrad(const AttentionShape& a, const float* dscores, const float* k,
                                        float* dq) const = 0;
  virtual void AttentionScoresKeyGrad(const AttentionShape& a, const float* dscores, const float* q,
                                      float* dk) const = 0;
  virtual void AttentionContext(const AttentionShape& a, const float* probs, const float* v,
                                float* context) const = 0;
  virtual void AttentionContextProbsGrad(const AttentionShape& a, const float* dcontext, const float* v,
                                         float* dprobs) const = 0;
  virtual void AttentionContextValueGrad(const AttentionShape& a, const float* dcontext, const float* probs,
                                         float* dv) const = 0;

  // y = x * scale, with -inf above the diagonal of each [queries, keys] matrix when causal.
  virtual void MaskedScale(const float* x, int64_t matrices, int64_t queries, int64_t keys, float scale, bool causal,
                           float* y) const = 0;
  virtual void MaskedScaleBackward(const float* dy, int64_t matrices, int64_t queries, int64_t keys, float scale,
                                   bool causal, float* dx) const = 0;

  virtual void Softmax(const float* x, int64_t rows, int64_t n, float* y) const = 0;
  virtual void SoftmaxBackward(const float* y, const float* dy, int64_t rows, int64_t n, float* dx) const = 0;
  virtual void LogSoftmax(const float* x, int64_t rows, int64_t n, float* y) const = 0;
  virtual void LogSoftmaxBackward(const float* y, const float* dy, int64_t rows, int64_t n, float* dx) const = 0;

  // loss[0] = mean negative log-likelihood of labels[r] under log_probs[r]; labels in [0, n).
  virtual void NllLoss(const float* log_probs, const int64_t* labels, int64_t rows, int64_t n, float* loss) const = 0;
  // The dense gradient of the mean: -1/rows at each label, 0 elsewhere.
  virtual void NllLossBackward(const int64_t* labels, int64_t rows, int64_t n, float* dlog_probs) const = 0;

  virtual void LayerNorm(const float* x, int64_t rows, int64_t n, const float* w, const float* bias, float* y,
                         float* mean, float* rstd) const = 0;
  virtual void LayerNormInputGrad(const float* x, const float* mean, const float* rstd, const float* w,
                                  const float* dy, int64_t rows, int64_t n, float* dx) const = 0;
  virtual void LayerNormWeightGrad(const float* x, const float* mean, const float* rstd, const float* dy,
                                   int64_t rows, int64_t n, float* dw) const = 0;

  // Exact GELU, 0.5 x (1 + erf(x / sqrt 2)).
  virtual void Gelu(const float* x, int64_t n, float* y) const = 0;
  virtual void GeluBackward(const float* x, const float* dy, int64_t n, float* dx) const = 0;

  // y[i] = a[i] + b[i % nb]: b broadcast over a's leading dims (nb divides n).
  virtual void Add(const float* a, int64_t n, const float* b, int64_t nb, float* y) const = 0;
  // db[j] = sum of dy[i] over i % nb == j: the gradient of a broadcast operand.
  virtual void ReduceBroadcast(const float* dy, int64_t n, int64_t nb, float* db) const = 0;
  // acc += x.
  virtual void AddInto(float* acc, const float* x, int64_t n) const = 0;

  // SGD with momentum as torch.optim.SGD runs it (dampening 0, no Nesterov):
  // buf = momentum * buf + grad (buf starts at zero), p -= lr * buf.
  virtual void SgdMomentum(float* p, const float* grad, float* buf, int64_t n, float lr, float momentum) const = 0;
};

}  // namespace headroom

#endif  // HEADROOM_EXECUTOR_KERNELS_H_

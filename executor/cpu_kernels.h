// The CPU reference kernels of the executor: plain float32 loops, forward and
// backward, for the ops the demo models use (executor/demo_models.h). Each is
// a pure function of its arguments, runs in a fixed order and allocates
// nothing, so a step computes bitwise the same values whatever plan runs it
// and whatever memory the allocator hands out. Shapes are the graph's
// (graph/ops.h), row-major; "rows" is the product of all but the last dim.
#ifndef HEADROOM_EXECUTOR_CPU_KERNELS_H_
#define HEADROOM_EXECUTOR_CPU_KERNELS_H_

#include <cstdint>

namespace headroom::cpu {

inline constexpr float kLayerNormEps = 1e-5f;

// out[r] = table[ids[r]]; ids must be in [0, vocab) (the caller checks).
void Embedding(const int64_t* ids, int64_t rows, const float* table, int64_t dim, float* out);
// dtable = 0, then dtable[ids[r]] += dy[r].
void EmbeddingBackward(const int64_t* ids, int64_t rows, const float* dy, int64_t dim, int64_t vocab,
                       float* dtable);

// y = x w^T + bias, w [out, in] (nn.Linear); bias may be null.
void Linear(const float* x, int64_t rows, int64_t in, const float* w, const float* bias, int64_t out, float* y);
void LinearInputGrad(const float* dy, int64_t rows, int64_t out, const float* w, int64_t in, float* dx);
void LinearWeightGrad(const float* dy, const float* x, int64_t rows, int64_t in, int64_t out, float* dw);
// dbias[o] = sum over rows of dy[r, o].
void BiasGrad(const float* dy, int64_t rows, int64_t out, float* dbias);

// Multi-head attention over token-major q/k/v [b, s, heads*d] (graph/ops.h,
// attention_scores and attention_context).
struct AttentionShape {
  int64_t batch = 0, queries = 0, keys = 0, heads = 0, head_dim = 0;
};
void AttentionScores(const AttentionShape& a, const float* q, const float* k, float* scores);
void AttentionScoresQueryGrad(const AttentionShape& a, const float* dscores, const float* k, float* dq);
void AttentionScoresKeyGrad(const AttentionShape& a, const float* dscores, const float* q, float* dk);
void AttentionContext(const AttentionShape& a, const float* probs, const float* v, float* context);
void AttentionContextProbsGrad(const AttentionShape& a, const float* dcontext, const float* v, float* dprobs);
void AttentionContextValueGrad(const AttentionShape& a, const float* dcontext, const float* probs, float* dv);

// y = x * scale, with -inf above the diagonal of each [queries, keys] matrix when causal.
void MaskedScale(const float* x, int64_t matrices, int64_t queries, int64_t keys, float scale, bool causal,
                 float* y);
void MaskedScaleBackward(const float* dy, int64_t matrices, int64_t queries, int64_t keys, float scale,
                         bool causal, float* dx);

void Softmax(const float* x, int64_t rows, int64_t n, float* y);
void SoftmaxBackward(const float* y, const float* dy, int64_t rows, int64_t n, float* dx);
void LogSoftmax(const float* x, int64_t rows, int64_t n, float* y);
void LogSoftmaxBackward(const float* y, const float* dy, int64_t rows, int64_t n, float* dx);

// Mean negative log-likelihood of labels[r] under log_probs[r]; labels in [0, n).
float NllLoss(const float* log_probs, const int64_t* labels, int64_t rows, int64_t n);
// The dense gradient of the mean: -1/rows at each label, 0 elsewhere.
void NllLossBackward(const int64_t* labels, int64_t rows, int64_t n, float* dlog_probs);

void LayerNorm(const float* x, int64_t rows, int64_t n, const float* w, const float* bias, float* y, float* mean,
               float* rstd);
void LayerNormInputGrad(const float* x, const float* mean, const float* rstd, const float* w, const float* dy,
                        int64_t rows, int64_t n, float* dx);
void LayerNormWeightGrad(const float* x, const float* mean, const float* rstd, const float* dy, int64_t rows,
                         int64_t n, float* dw);

// Exact GELU, 0.5 x (1 + erf(x / sqrt 2)).
void Gelu(const float* x, int64_t n, float* y);
void GeluBackward(const float* x, const float* dy, int64_t n, float* dx);

// y[i] = a[i] + b[i % nb]: b broadcast over a's leading dims (nb divides n).
void Add(const float* a, int64_t n, const float* b, int64_t nb, float* y);
// db[j] = sum of dy[i] over i % nb == j: the gradient of a broadcast operand.
void ReduceBroadcast(const float* dy, int64_t n, int64_t nb, float* db);
// acc += x.
void AddInto(float* acc, const float* x, int64_t n);

// SGD with momentum as torch.optim.SGD runs it (dampening 0, no Nesterov):
// buf = momentum * buf + grad (buf starts at zero), p -= lr * buf.
void SgdMomentum(float* p, const float* grad, float* buf, int64_t n, float lr, float momentum);

}  // namespace headroom::cpu

#endif  // HEADROOM_EXECUTOR_CPU_KERNELS_H_

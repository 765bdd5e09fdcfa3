// The CPU reference kernels (executor/kernels.h): plain float32 loops. Each
// is a pure function of its arguments, runs in a fixed order and allocates
// nothing, so a step computes bitwise the same values whatever plan runs it
// and whatever memory the allocator hands out.
#ifndef HEADROOM_EXECUTOR_CPU_KERNELS_H_
#define HEADROOM_EXECUTOR_CPU_KERNELS_H_

#include <cstdint>

#include "executor/kernels.h"

namespace headroom {

class CpuKernels final : public ExecutorKernels {
 public:
  void Embedding(const int64_t* ids, int64_t rows, const float* table, int64_t dim, float* out) const override;
  void EmbeddingBackward(const int64_t* ids, int64_t rows, const float* dy, int64_t dim, int64_t vocab,
                         float* dtable) const override;
  void Linear(const float* x, int64_t rows, int64_t in, const float* w, const float* bias, int64_t out,
              float* y) const override;
  void LinearInputGrad(const float* dy, int64_t rows, int64_t out, const float* w, int64_t in,
                       float* dx) const override;
  void LinearWeightGrad(const float* dy, const float* x, int64_t rows, int64_t in, int64_t out,
                        float* dw) const override;
  void BiasGrad(const float* dy, int64_t rows, int64_t out, float* dbias) const override;
  void AttentionScores(const AttentionShape& a, const float* q, const float* k, float* scores) const override;
  void AttentionScoresQueryGrad(const AttentionShape& a, const float* dscores, const float* k,
                                float* dq) const override;
  void AttentionScoresKeyGrad(const AttentionShape& a, const float* dscores, const float* q,
                              float* dk) const override;
  void AttentionContext(const AttentionShape& a, const float* probs, const float* v,
                        float* context) const override;
  void AttentionContextProbsGrad(const AttentionShape& a, const float* dcontext, const float* v,
                                 float* dprobs) const override;
  void AttentionContextValueGrad(const AttentionShape& a, const float* dcontext, const float* probs,
                                 float* dv) const override;
  void MaskedScale(const float* x, int64_t matrices, int64_t queries, int64_t keys, float scale, bool causal,
                   float* y) const override;
  void MaskedScaleBackward(const float* dy, int64_t matrices, int64_t queries, int64_t keys, float scale,
                           bool causal, float* dx) const override;
  void Softmax(const float* x, int64_t rows, int64_t n, float* y) const override;
  void SoftmaxBackward(const float* y, const float* dy, int64_t rows, int64_t n, float* dx) const override;
  void LogSoftmax(const float* x, int64_t rows, int64_t n, float* y) const override;
  void LogSoftmaxBackward(const float* y, const float* dy, int64_t rows, int64_t n, float* dx) const override;
  void NllLoss(const float* log_probs, const int64_t* labels, int64_t rows, int64_t n, float* loss) const override;
  void NllLossBackward(const int64_t* labels, int64_t rows, int64_t n, float* dlog_probs) const override;
  void LayerNorm(const float* x, int64_t rows, int64_t n, const float* w, const float* bias, float* y,
                 float* mean, float* rstd) const override;
  void LayerNormInputGrad(const float* x, const float* mean, const float* rstd, const float* w,
                          const float* dy, int64_t rows, int64_t n, float* dx) const override;
  void LayerNormWeightGrad(const float* x, const float* mean, const float* rstd, const float* dy,
                           int64_t rows, int64_t n, float* dw) const override;
  void Gelu(const float* x, int64_t n, float* y) const override;
  void GeluBackward(const float* x, const float* dy, int64_t n, float* dx) const override;
  void Add(const float* a, int64_t n, const float* b, int64_t nb, float* y) const override;
  void ReduceBroadcast(const float* dy, int64_t n, int64_t nb, float* db) const override;
  void AddInto(float* acc, const float* x, int64_t n) const override;
  void SgdMomentum(float* p, const float* grad, float* buf, int64_t n, float lr, float momentum) const override;
};

}  // namespace headroom

#endif  // HEADROOM_EXECUTOR_CPU_KERNELS_H_

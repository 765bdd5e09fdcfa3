// The executor's kernels on a GPU (executor/kernels.h): cuBLAS SGEMMs for the
// linear layers and attention (strided batched over heads, full FP32: no
// TF32), and a few CUDA kernels for the rest (row-wise softmax and layer norm,
// elementwise ops, column reductions). Everything is queued on the default
// stream; a failed launch or cuBLAS call is kept and reported by TakeError,
// which CudaComputeDevice::Synchronize calls. Embedding's backward adds with
// atomics, so it is not bitwise reproducible; everything else is.
#ifndef HEADROOM_EXECUTOR_CUDA_CUDA_KERNELS_H_
#define HEADROOM_EXECUTOR_CUDA_CUDA_KERNELS_H_

#include <cublas_v2.h>

#include <atomic>
#include <string>

#include "absl/status/status.h"
#include "executor/gemm_layout.h"
#include "executor/kernels.h"

namespace headroom {

class CudaKernels final : public ExecutorKernels {
 public:
  explicit CudaKernels(cublasHandle_t cublas) : cublas_(cublas) {}

  // The first error since the last call, if any.
  absl::Status TakeError() const;

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
  void AttentionContext(const AttentionShape& a, const float* probs, const float* v, float* context) const override;
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
  void LayerNorm(const float* x, int64_t rows, int64_t n, const float* w, const float* bias, float* y, float* mean,
                 float* rstd) const override;
  void LayerNormInputGrad(const float* x, const float* mean, const float* rstd, const float* w, const float* dy,
                          int64_t rows, int64_t n, float* dx) const override;
  void LayerNormWeightGrad(const float* x, const float* mean, const float* rstd, const float* dy, int64_t rows,
                           int64_t n, float* dw) const override;
  void Gelu(const float* x, int64_t n, float* y) const override;
  void GeluBackward(const float* x, const float* dy, int64_t n, float* dx) const override;
  void Add(const float* a, int64_t n, const float* b, int64_t nb, float* y) const override;
  void ReduceBroadcast(const float* dy, int64_t n, int64_t nb, float* db) const override;
  void AddInto(float* acc, const float* x, int64_t n) const override;
  void SgdMomentum(float* p, const float* grad, float* buf, int64_t n, float lr, float momentum) const override;

 private:
  void Run(const GemmCall& call, const float* a, const float* b, float* c) const;
  void Check(const char* what) const;  // records a launch error
  void CheckBlas(cublasStatus_t status, const char* what) const;

  cublasHandle_t cublas_;
  mutable std::atomic<bool> failed_{false};
  mutable std::string error_;  // written once, by the first failure
};

}  // namespace headroom

#endif  // HEADROOM_EXECUTOR_CUDA_CUDA_KERNELS_H_

#include "executor/cuda/cuda_kernels.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "absl/strings/str_format.h"

namespace headroom {
namespace {

constexpr int kThreads = 256;

int Blocks(int64_t n) { return static_cast<int>(std::clamp<int64_t>((n + kThreads - 1) / kThreads, 1, 65535)); }
int RowBlocks(int64_t rows) { return static_cast<int>(std::clamp<int64_t>(rows, 1, 65535)); }

#define HEADROOM_GRID_STRIDE(i, n) \
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < (n); \
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
#define HEADROOM_ROW_STRIDE(r, rows) for (int64_t r = blockIdx.x; r < (rows); r += gridDim.x)

// Sum (or max) over the block; every thread gets the result.
template <bool kMax>
__device__ float BlockReduce(float value) {
  __shared__ float shared[kThreads];
  __syncthreads();  // shared may still be read by the previous reduction
  shared[threadIdx.x] = value;
  __syncthreads();
  for (int stride = kThreads / 2; stride > 0; stride /= 2) {
    if (threadIdx.x < stride) {
      const float other = shared[threadIdx.x + stride];
      shared[threadIdx.x] = kMax ? fmaxf(shared[threadIdx.x], other) : shared[threadIdx.x] + other;
    }
    __syncthreads();
  }
  return shared[0];
}

__global__ void EmbeddingKernel(const int64_t* ids, int64_t rows, const float* table, int64_t dim, float* out) {
  HEADROOM_GRID_STRIDE(i, rows * dim) { out[i] = table[ids[i / dim] * dim + i % dim]; }
}

__global__ void EmbeddingBackwardKernel(const int64_t* ids, int64_t rows, const float* dy, int64_t dim,
                                        float* dtable) {
  HEADROOM_GRID_STRIDE(i, rows * dim) { atomicAdd(&dtable[ids[i / dim] * dim + i % dim], dy[i]); }
}

__global__ void AddBiasKernel(float* y, const float* bias, int64_t n, int64_t width) {
  HEADROOM_GRID_STRIDE(i, n) { y[i] += bias[i % width]; }
}

// out[c] = sum over rows of x[r, c], in row order.
__global__ void ColumnSumKernel(const float* x, int64_t rows, int64_t cols, float* out) {
  HEADROOM_GRID_STRIDE(c, cols) {
    float sum = 0;
    for (int64_t r = 0; r < rows; ++r) sum += x[r * cols + c];
    out[c] = sum;
  }
}

__global__ void MaskedScaleKernel(const float* x, int64_t n, int64_t queries, int64_t keys, float scale, bool causal,
                                  bool backward, float* y) {
  HEADROOM_GRID_STRIDE(i, n) {
    const int64_t j = i % keys;
    const int64_t q = (i / keys) % queries;
    const bool masked = causal && j > q;
    y[i] = masked ? (backward ? 0.0f : -INFINITY) : x[i] * scale;
  }
}

__global__ void SoftmaxKernel(const float* x, int64_t rows, int64_t n, bool log, float* y) {
  HEADROOM_ROW_STRIDE(r, rows) {
    const float* xr = x + r * n;
    float max = -INFINITY;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) max = fmaxf(max, xr[i]);
    max = BlockReduce<true>(max);
    float sum = 0;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) sum += expf(xr[i] - max);
    sum = BlockReduce<false>(sum);
    const float log_sum = max + logf(sum);
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
      y[r * n + i] = log ? xr[i] - log_sum : expf(xr[i] - max) / sum;
    }
  }
}

__global__ void SoftmaxBackwardKernel(const float* y, const float* dy, int64_t rows, int64_t n, bool log, float* dx) {
  HEADROOM_ROW_STRIDE(r, rows) {
    float reduced = 0;  // sum(y * dy) for softmax, sum(dy) for log-softmax
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) reduced += log ? dy[r * n + i] : y[r * n + i] * dy[r * n + i];
    reduced = BlockReduce<false>(reduced);
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
      const int64_t at = r * n + i;
      dx[at] = log ? dy[at] - expf(y[at]) * reduced : y[at] * (dy[at] - reduced);
    }
  }
}

__global__ void NllLossKernel(const float* log_probs, const int64_t* labels, int64_t rows, int64_t n, float* loss) {
  float sum = 0;
  for (int64_t r = threadIdx.x; r < rows; r += blockDim.x) sum -= log_probs[r * n + labels[r]];
  sum = BlockReduce<false>(sum);
  if (threadIdx.x == 0) *loss = sum / static_cast<float>(rows);
}

__global__ void NllLossBackwardKernel(const int64_t* labels, int64_t rows, int64_t n, float* dlog_probs) {
  HEADROOM_GRID_STRIDE(r, rows) { dlog_probs[r * n + labels[r]] = -1.0f / static_cast<float>(rows); }
}

__global__ void LayerNormKernel(const float* x, int64_t rows, int64_t n, const float* w, const float* bias, float* y,
                                float* mean, float* rstd) {
  HEADROOM_ROW_STRIDE(r, rows) {
    const float* xr = x + r * n;
    float sum = 0;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) sum += xr[i];
    const float mu = BlockReduce<false>(sum) / static_cast<float>(n);
    float var = 0;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) var += (xr[i] - mu) * (xr[i] - mu);
    const float inv = rsqrtf(BlockReduce<false>(var) / static_cast<float>(n) + kLayerNormEps);
    if (threadIdx.x == 0) {
      mean[r] = mu;
      rstd[r] = inv;
    }
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
      y[r * n + i] = (xr[i] - mu) * inv * w[i] + (bias != nullptr ? bias[i] : 0.0f);
    }
  }
}

__global__ void LayerNormInputGradKernel(const float* x, const float* mean, const float* rstd, const float* w,
                                         const float* dy, int64_t rows, int64_t n, float* dx) {
  HEADROOM_ROW_STRIDE(r, rows) {
    float sum_g = 0, sum_gx = 0;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
      const float g = dy[r * n + i] * w[i];
      sum_g += g;
      sum_gx += g * (x[r * n + i] - mean[r]) * rstd[r];
    }
    sum_g = BlockReduce<false>(sum_g);
    sum_gx = BlockReduce<false>(sum_gx);
    const float inv_n = 1.0f / static_cast<float>(n);
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
      const float g = dy[r * n + i] * w[i];
      const float xhat = (x[r * n + i] - mean[r]) * rstd[r];
      dx[r * n + i] = rstd[r] * (g - sum_g * inv_n - xhat * sum_gx * inv_n);
    }
  }
}

__global__ void LayerNormWeightGradKernel(const float* x, const float* mean, const float* rstd, const float* dy,
                                          int64_t rows, int64_t n, float* dw) {
  HEADROOM_GRID_STRIDE(c, n) {
    float sum = 0;
    for (int64_t r = 0; r < rows; ++r) sum += dy[r * n + c] * (x[r * n + c] - mean[r]) * rstd[r];
    dw[c] = sum;
  }
}

__global__ void GeluKernel(const float* x, int64_t n, float* y) {
  HEADROOM_GRID_STRIDE(i, n) { y[i] = 0.5f * x[i] * (1.0f + erff(x[i] * static_cast<float>(M_SQRT1_2))); }
}

__global__ void GeluBackwardKernel(const float* x, const float* dy, int64_t n, float* dx) {
  const auto inv_sqrt_2pi = static_cast<float>(0.5 * M_2_SQRTPI * M_SQRT1_2);
  HEADROOM_GRID_STRIDE(i, n) {
    const float cdf = 0.5f * (1.0f + erff(x[i] * static_cast<float>(M_SQRT1_2)));
    dx[i] = dy[i] * (cdf + x[i] * inv_sqrt_2pi * expf(-0.5f * x[i] * x[i]));
  }
}

__global__ void AddKernel(const float* a, int64_t n, const float* b, int64_t nb, float* y) {
  HEADROOM_GRID_STRIDE(i, n) { y[i] = a[i] + b[i % nb]; }
}

__global__ void AddIntoKernel(float* acc, const float* x, int64_t n) {
  HEADROOM_GRID_STRIDE(i, n) { acc[i] += x[i]; }
}

__global__ void SgdMomentumKernel(float* p, const float* grad, float* buf, int64_t n, float lr, float momentum) {
  HEADROOM_GRID_STRIDE(i, n) {
    buf[i] = momentum * buf[i] + grad[i];
    p[i] -= lr * buf[i];
  }
}

}  // namespace

absl::Status CudaKernels::TakeError() const {
  if (!failed_.load()) return absl::OkStatus();
  absl::Status error = absl::InternalError(absl::StrFormat("CUDA kernels: %s", error_));
  error_.clear();
  failed_.store(false);
  return error;
}

void CudaKernels::Check(const char* what) const {
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess && !failed_.exchange(true)) error_ = absl::StrFormat("%s: %s", what, cudaGetErrorString(e));
}

void CudaKernels::CheckBlas(cublasStatus_t status, const char* what) const {
  if (status != CUBLAS_STATUS_SUCCESS && !failed_.exchange(true)) {
    error_ = absl::StrFormat("%s: %s", what, cublasGetStatusString(status));
  }
}

void CudaKernels::Run(const GemmCall& g, const float* a, const float* b, float* c) const {
  const float one = 1, zero = 0;
  for (int64_t batch = 0; batch < g.batches; ++batch) {
    CheckBlas(cublasSgemmStridedBatched(cublas_, g.transpose_a ? CUBLAS_OP_T : CUBLAS_OP_N,
                                        g.transpose_b ? CUBLAS_OP_T : CUBLAS_OP_N, static_cast<int>(g.m),
                                        static_cast<int>(g.n), static_cast<int>(g.k), &one, a + batch * g.a_batch,
                                        static_cast<int>(g.lda), g.a_head, b + batch * g.b_batch,
                                        static_cast<int>(g.ldb), g.b_head, &zero, c + batch * g.c_batch,
                                        static_cast<int>(g.ldc), g.c_head, static_cast<int>(g.heads)),
              "cublasSgemmStridedBatched");
  }
}

// The GEMMs' layouts are executor/gemm_layout.h's.

void CudaKernels::Embedding(const int64_t* ids, int64_t rows, const float* table, int64_t dim, float* out) const {
  EmbeddingKernel<<<Blocks(rows * dim), kThreads>>>(ids, rows, table, dim, out);
  Check("embedding");
}

void CudaKernels::EmbeddingBackward(const int64_t* ids, int64_t rows, const float* dy, int64_t dim, int64_t vocab,
                                    float* dtable) const {
  cudaMemsetAsync(dtable, 0, static_cast<size_t>(vocab * dim) * sizeof(float));
  EmbeddingBackwardKernel<<<Blocks(rows * dim), kThreads>>>(ids, rows, dy, dim, dtable);
  Check("embedding backward");
}

void CudaKernels::Linear(const float* x, int64_t rows, int64_t in, const float* w, const float* bias, int64_t out,
                         float* y) const {
  Run(LinearGemm(rows, in, out), w, x, y);
  if (bias != nullptr) {
    AddBiasKernel<<<Blocks(rows * out), kThreads>>>(y, bias, rows * out, out);
    Check("linear bias");
  }
}

void CudaKernels::LinearInputGrad(const float* dy, int64_t rows, int64_t out, const float* w, int64_t in,
                                  float* dx) const {
  Run(LinearInputGradGemm(rows, in, out), w, dy, dx);
}

void CudaKernels::LinearWeightGrad(const float* dy, const float* x, int64_t rows, int64_t in, int64_t out,
                                   float* dw) const {
  Run(LinearWeightGradGemm(rows, in, out), x, dy, dw);
}

void CudaKernels::BiasGrad(const float* dy, int64_t rows, int64_t out, float* dbias) const {
  ColumnSumKernel<<<Blocks(out), kThreads>>>(dy, rows, out, dbias);
  Check("bias gradient");
}

void CudaKernels::AttentionScores(const AttentionShape& a, const float* q, const float* k, float* scores) const {
  Run(ScoresGemm(a), k, q, scores);
}

void CudaKernels::AttentionScoresQueryGrad(const AttentionShape& a, const float* dscores, const float* k,
                                           float* dq) const {
  Run(ScoresQueryGradGemm(a), k, dscores, dq);
}

void CudaKernels::AttentionScoresKeyGrad(const AttentionShape& a, const float* dscores, const float* q,
                                         float* dk) const {
  Run(ScoresKeyGradGemm(a), q, dscores, dk);
}

void CudaKernels::AttentionContext(const AttentionShape& a, const float* probs, const float* v,
                                   float* context) const {
  Run(ContextGemm(a), v, probs, context);
}

void CudaKernels::AttentionContextProbsGrad(const AttentionShape& a, const float* dcontext, const float* v,
                                            float* dprobs) const {
  Run(ContextProbsGradGemm(a), v, dcontext, dprobs);
}

void CudaKernels::AttentionContextValueGrad(const AttentionShape& a, const float* dcontext, const float* probs,
                                            float* dv) const {
  Run(ContextValueGradGemm(a), dcontext, probs, dv);
}

void CudaKernels::MaskedScale(const float* x, int64_t matrices, int64_t queries, int64_t keys, float scale,
                              bool causal, float* y) const {
  const int64_t n = matrices * queries * keys;
  MaskedScaleKernel<<<Blocks(n), kThreads>>>(x, n, queries, keys, scale, causal, false, y);
  Check("masked scale");
}

void CudaKernels::MaskedScaleBackward(const float* dy, int64_t matrices, int64_t queries, int64_t keys, float scale,
                                      bool causal, float* dx) const {
  const int64_t n = matrices * queries * keys;
  MaskedScaleKernel<<<Blocks(n), kThreads>>>(dy, n, queries, keys, scale, causal, true, dx);
  Check("masked scale backward");
}

void CudaKernels::Softmax(const float* x, int64_t rows, int64_t n, float* y) const {
  SoftmaxKernel<<<RowBlocks(rows), kThreads>>>(x, rows, n, false, y);
  Check("softmax");
}

void CudaKernels::SoftmaxBackward(const float* y, const float* dy, int64_t rows, int64_t n, float* dx) const {
  SoftmaxBackwardKernel<<<RowBlocks(rows), kThreads>>>(y, dy, rows, n, false, dx);
  Check("softmax backward");
}

void CudaKernels::LogSoftmax(const float* x, int64_t rows, int64_t n, float* y) const {
  SoftmaxKernel<<<RowBlocks(rows), kThreads>>>(x, rows, n, true, y);
  Check("log-softmax");
}

void CudaKernels::LogSoftmaxBackward(const float* y, const float* dy, int64_t rows, int64_t n, float* dx) const {
  SoftmaxBackwardKernel<<<RowBlocks(rows), kThreads>>>(y, dy, rows, n, true, dx);
  Check("log-softmax backward");
}

void CudaKernels::NllLoss(const float* log_probs, const int64_t* labels, int64_t rows, int64_t n,
                          float* loss) const {
  NllLossKernel<<<1, kThreads>>>(log_probs, labels, rows, n, loss);
  Check("nll loss");
}

void CudaKernels::NllLossBackward(const int64_t* labels, int64_t rows, int64_t n, float* dlog_probs) const {
  cudaMemsetAsync(dlog_probs, 0, static_cast<size_t>(rows * n) * sizeof(float));
  NllLossBackwardKernel<<<Blocks(rows), kThreads>>>(labels, rows, n, dlog_probs);
  Check("nll loss backward");
}

void CudaKernels::LayerNorm(const float* x, int64_t rows, int64_t n, const float* w, const float* bias, float* y,
                            float* mean, float* rstd) const {
  LayerNormKernel<<<RowBlocks(rows), kThreads>>>(x, rows, n, w, bias, y, mean, rstd);
  Check("layer norm");
}

void CudaKernels::LayerNormInputGrad(const float* x, const float* mean, const float* rstd, const float* w,
                                     const float* dy, int64_t rows, int64_t n, float* dx) const {
  LayerNormInputGradKernel<<<RowBlocks(rows), kThreads>>>(x, mean, rstd, w, dy, rows, n, dx);
  Check("layer norm input gradient");
}

void CudaKernels::LayerNormWeightGrad(const float* x, const float* mean, const float* rstd, const float* dy,
                                      int64_t rows, int64_t n, float* dw) const {
  LayerNormWeightGradKernel<<<Blocks(n), kThreads>>>(x, mean, rstd, dy, rows, n, dw);
  Check("layer norm weight gradient");
}

void CudaKernels::Gelu(const float* x, int64_t n, float* y) const {
  GeluKernel<<<Blocks(n), kThreads>>>(x, n, y);
  Check("gelu");
}

void CudaKernels::GeluBackward(const float* x, const float* dy, int64_t n, float* dx) const {
  GeluBackwardKernel<<<Blocks(n), kThreads>>>(x, dy, n, dx);
  Check("gelu backward");
}

void CudaKernels::Add(const float* a, int64_t n, const float* b, int64_t nb, float* y) const {
  AddKernel<<<Blocks(n), kThreads>>>(a, n, b, nb, y);
  Check("add");
}

void CudaKernels::ReduceBroadcast(const float* dy, int64_t n, int64_t nb, float* db) const {
  ColumnSumKernel<<<Blocks(nb), kThreads>>>(dy, n / nb, nb, db);
  Check("broadcast gradient");
}

void CudaKernels::AddInto(float* acc, const float* x, int64_t n) const {
  AddIntoKernel<<<Blocks(n), kThreads>>>(acc, x, n);
  Check("add into");
}

void CudaKernels::SgdMomentum(float* p, const float* grad, float* buf, int64_t n, float lr, float momentum) const {
  SgdMomentumKernel<<<Blocks(n), kThreads>>>(p, grad, buf, n, lr, momentum);
  Check("sgd");
}

}  // namespace headroom

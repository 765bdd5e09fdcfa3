// The executor's GEMMs as cuBLAS calls: row-major tensors seen as cuBLAS's
// column-major matrices (a row-major [r, c] with leading dimension c is the
// column-major [c, r], its transpose), attention's heads as a strided batch.
// CudaKernels issues these calls; RunGemmOnCpu evaluates one with cuBLAS's
// semantics on the CPU, so the layouts are tested on machines without a GPU
// against the CPU reference (tests/executor/gemm_layout_test.cc).
#ifndef HEADROOM_EXECUTOR_GEMM_LAYOUT_H_
#define HEADROOM_EXECUTOR_GEMM_LAYOUT_H_

#include <cstdint>

#include "executor/kernels.h"

namespace headroom {

// C = op(A) op(B), column-major, beta 0; for each of `batches` x `heads`
// products, A, B and C start `*_batch` elements further per batch and
// `*_head` further per head.
struct GemmCall {
  bool transpose_a = false, transpose_b = false;
  int64_t m = 0, n = 0, k = 0;
  int64_t lda = 0, ldb = 0, ldc = 0;
  int64_t batches = 1, heads = 1;
  int64_t a_batch = 0, b_batch = 0, c_batch = 0;
  int64_t a_head = 0, b_head = 0, c_head = 0;
};

// Linear layers, w [out, in]: y = x w^T (A = w, B = x, C = y); dx = dy w
// (A = w, B = dy, C = dx); dw = dy^T x (A = x, B = dy, C = dw).
GemmCall LinearGemm(int64_t rows, int64_t in, int64_t out);
GemmCall LinearInputGradGemm(int64_t rows, int64_t in, int64_t out);
GemmCall LinearWeightGradGemm(int64_t rows, int64_t in, int64_t out);

// Attention per head (AttentionShape): scores = q k^T (A = k, B = q);
// dq = dscores k (A = k, B = dscores); dk = dscores^T q (A = q, B = dscores);
// context = probs v (A = v, B = probs); dprobs = dcontext v^T (A = v,
// B = dcontext); dv = probs^T dcontext (A = dcontext, B = probs).
GemmCall ScoresGemm(const AttentionShape& s);
GemmCall ScoresQueryGradGemm(const AttentionShape& s);
GemmCall ScoresKeyGradGemm(const AttentionShape& s);
GemmCall ContextGemm(const AttentionShape& s);
GemmCall ContextProbsGradGemm(const AttentionShape& s);
GemmCall ContextValueGradGemm(const AttentionShape& s);

// `call` with cuBLAS's semantics, in plain loops (tests).
void RunGemmOnCpu(const GemmCall& call, const float* a, const float* b, float* c);

}  // namespace headroom

#endif  // HEADROOM_EXECUTOR_GEMM_LAYOUT_H_

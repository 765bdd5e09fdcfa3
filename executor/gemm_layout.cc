#include "executor/gemm_layout.h"

namespace headroom {

GemmCall LinearGemm(int64_t rows, int64_t in, int64_t out) {
  // y^T [out, rows] = w (as [in, out], transposed) x^T [in, rows]
  return {.transpose_a = true, .m = out, .n = rows, .k = in, .lda = in, .ldb = in, .ldc = out};
}

GemmCall LinearInputGradGemm(int64_t rows, int64_t in, int64_t out) {
  // dx^T [in, rows] = w^T [in, out] dy^T [out, rows]
  return {.m = in, .n = rows, .k = out, .lda = in, .ldb = out, .ldc = in};
}

GemmCall LinearWeightGradGemm(int64_t rows, int64_t in, int64_t out) {
  // dw^T [in, out] = x^T [in, rows] (dy^T [out, rows], transposed)
  return {.transpose_b = true, .m = in, .n = out, .k = rows, .lda = in, .ldb = out, .ldc = in};
}

// q_h, k_h, v_h (and their gradients) are d columns at h*d of row-major
// [tokens, width] blocks; scores_bh is a row-major [s, t] block.
namespace {

struct Dims {
  int64_t w, d, s, t, scores;
};
Dims DimsOf(const AttentionShape& a) {
  return {a.heads * a.head_dim, a.head_dim, a.queries, a.keys, a.heads * a.queries * a.keys};
}

}  // namespace

GemmCall ScoresGemm(const AttentionShape& a) {
  const Dims x = DimsOf(a);  // scores^T [t, s] = (k_h^T [d, t], transposed) q_h^T [d, s]
  return {.transpose_a = true, .m = x.t, .n = x.s, .k = x.d, .lda = x.w, .ldb = x.w, .ldc = x.t,
          .batches = a.batch, .heads = a.heads, .a_batch = x.t * x.w, .b_batch = x.s * x.w, .c_batch = x.scores,
          .a_head = x.d, .b_head = x.d, .c_head = x.s * x.t};
}

GemmCall ScoresQueryGradGemm(const AttentionShape& a) {
  const Dims x = DimsOf(a);  // dq_h^T [d, s] = k_h^T [d, t] dscores^T [t, s]
  return {.m = x.d, .n = x.s, .k = x.t, .lda = x.w, .ldb = x.t, .ldc = x.w,
          .batches = a.batch, .heads = a.heads, .a_batch = x.t * x.w, .b_batch = x.scores, .c_batch = x.s * x.w,
          .a_head = x.d, .b_head = x.s * x.t, .c_head = x.d};
}

GemmCall ScoresKeyGradGemm(const AttentionShape& a) {
  const Dims x = DimsOf(a);  // dk_h^T [d, t] = q_h^T [d, s] (dscores^T [t, s], transposed)
  return {.transpose_b = true, .m = x.d, .n = x.t, .k = x.s, .lda = x.w, .ldb = x.t, .ldc = x.w,
          .batches = a.batch, .heads = a.heads, .a_batch = x.s * x.w, .b_batch = x.scores, .c_batch = x.t * x.w,
          .a_head = x.d, .b_head = x.s * x.t, .c_head = x.d};
}

GemmCall ContextGemm(const AttentionShape& a) {
  const Dims x = DimsOf(a);  // context_h^T [d, s] = v_h^T [d, t] probs^T [t, s]
  return {.m = x.d, .n = x.s, .k = x.t, .lda = x.w, .ldb = x.t, .ldc = x.w,
          .batches = a.batch, .heads = a.heads, .a_batch = x.t * x.w, .b_batch = x.scores, .c_batch = x.s * x.w,
          .a_head = x.d, .b_head = x.s * x.t, .c_head = x.d};
}

GemmCall ContextProbsGradGemm(const AttentionShape& a) {
  const Dims x = DimsOf(a);  // dprobs^T [t, s] = (v_h^T [d, t], transposed) dcontext_h^T [d, s]
  return {.transpose_a = true, .m = x.t, .n = x.s, .k = x.d, .lda = x.w, .ldb = x.w, .ldc = x.t,
          .batches = a.batch, .heads = a.heads, .a_batch = x.t * x.w, .b_batch = x.s * x.w, .c_batch = x.scores,
          .a_head = x.d, .b_head = x.d, .c_head = x.s * x.t};
}

GemmCall ContextValueGradGemm(const AttentionShape& a) {
  const Dims x = DimsOf(a);  // dv_h^T [d, t] = dcontext_h^T [d, s] (probs^T [t, s], transposed)
  return {.transpose_b = true, .m = x.d, .n = x.t, .k = x.s, .lda = x.w, .ldb = x.t, .ldc = x.w,
          .batches = a.batch, .heads = a.heads, .a_batch = x.s * x.w, .b_batch = x.scores, .c_batch = x.t * x.w,
          .a_head = x.d, .b_head = x.s * x.t, .c_head = x.d};
}

void RunGemmOnCpu(const GemmCall& g, const float* a, const float* b, float* c) {
  for (int64_t batch = 0; batch < g.batches; ++batch) {
    for (int64_t head = 0; head < g.heads; ++head) {
      const float* ah = a + batch * g.a_batch + head * g.a_head;
      const float* bh = b + batch * g.b_batch + head * g.b_head;
      float* ch = c + batch * g.c_batch + head * g.c_head;
      for (int64_t i = 0; i < g.m; ++i) {
        for (int64_t j = 0; j < g.n; ++j) {
          float sum = 0;
          for (int64_t p = 0; p < g.k; ++p) {
            // Column-major element (row, col) of a matrix with leading dimension ld is at col * ld + row.
            const float av = g.transpose_a ? ah[i * g.lda + p] : ah[p * g.lda + i];
            const float bv = g.transpose_b ? bh[p * g.ldb + j] : bh[j * g.ldb + p];
            sum += av * bv;
          }
          ch[j * g.ldc + i] = sum;
        }
      }
    }
  }
}

}  // namespace headroom

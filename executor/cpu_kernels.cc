#include "executor/cpu_kernels.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace headroom {
namespace {

// Offsets into token-major [b, s, heads*d] and head-major [b, heads, s, t] tensors.
int64_t TokenAt(const AttentionShape& a, int64_t b, int64_t token, int64_t tokens, int64_t h) {
  return (b * tokens + token) * a.heads * a.head_dim + h * a.head_dim;
}
int64_t ScoreAt(const AttentionShape& a, int64_t b, int64_t h, int64_t i) {
  return ((b * a.heads + h) * a.queries + i) * a.keys;
}

}  // namespace

void CpuKernels::Embedding(const int64_t* ids, int64_t rows, const float* table, int64_t dim, float* out) const {
  for (int64_t r = 0; r < rows; ++r) std::copy_n(table + ids[r] * dim, dim, out + r * dim);
}

void CpuKernels::EmbeddingBackward(const int64_t* ids, int64_t rows, const float* dy, int64_t dim, int64_t vocab,
                                   float* dtable) const {
  std::fill_n(dtable, vocab * dim, 0.0f);
  for (int64_t r = 0; r < rows; ++r) AddInto(dtable + ids[r] * dim, dy + r * dim, dim);
}

void CpuKernels::Linear(const float* x, int64_t rows, int64_t in, const float* w, const float* bias, int64_t out,
                        float* y) const {
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t o = 0; o < out; ++o) {
      float sum = bias != nullptr ? bias[o] : 0.0f;
      for (int64_t i = 0; i < in; ++i) sum += x[r * in + i] * w[o * in + i];
      y[r * out + o] = sum;
    }
  }
}

void CpuKernels::LinearInputGrad(const float* dy, int64_t rows, int64_t out, const float* w, int64_t in,
                                 float* dx) const {
  std::fill_n(dx, rows * in, 0.0f);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t o = 0; o < out; ++o) {
      const float g = dy[r * out + o];
      for (int64_t i = 0; i < in; ++i) dx[r * in + i] += g * w[o * in + i];
    }
  }
}

void CpuKernels::LinearWeightGrad(const float* dy, const float* x, int64_t rows, int64_t in, int64_t out,
                                  float* dw) const {
  std::fill_n(dw, out * in, 0.0f);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t o = 0; o < out; ++o) {
      const float g = dy[r * out + o];
      for (int64_t i = 0; i < in; ++i) dw[o * in + i] += g * x[r * in + i];
    }
  }
}

void CpuKernels::BiasGrad(const float* dy, int64_t rows, int64_t out, float* dbias) const {
  std::fill_n(dbias, out, 0.0f);
  for (int64_t r = 0; r < rows; ++r) AddInto(dbias, dy + r * out, out);
}

void CpuKernels::AttentionScores(const AttentionShape& a, const float* q, const float* k, float* scores) const {
  for (int64_t b = 0; b < a.batch; ++b) {
    for (int64_t h = 0; h < a.heads; ++h) {
      for (int64_t i = 0; i < a.queries; ++i) {
        const float* qi = q + TokenAt(a, b, i, a.queries, h);
        float* row = scores + ScoreAt(a, b, h, i);
        for (int64_t j = 0; j < a.keys; ++j) {
          const float* kj = k + TokenAt(a, b, j, a.keys, h);
          float sum = 0;
          for (int64_t d = 0; d < a.head_dim; ++d) sum += qi[d] * kj[d];
          row[j] = sum;
        }
      }
    }
  }
}

void CpuKernels::AttentionScoresQueryGrad(const AttentionShape& a, const float* dscores, const float* k,
                                          float* dq) const {
  std::fill_n(dq, a.batch * a.queries * a.heads * a.head_dim, 0.0f);
  for (int64_t b = 0; b < a.batch; ++b) {
    for (int64_t h = 0; h < a.heads; ++h) {
      for (int64_t i = 0; i < a.queries; ++i) {
        float* dqi = dq + TokenAt(a, b, i, a.queries, h);
        const float* row = dscores + ScoreAt(a, b, h, i);
        for (int64_t j = 0; j < a.keys; ++j) {
          const float* kj = k + TokenAt(a, b, j, a.keys, h);
          for (int64_t d = 0; d < a.head_dim; ++d) dqi[d] += row[j] * kj[d];
        }
      }
    }
  }
}

void CpuKernels::AttentionScoresKeyGrad(const AttentionShape& a, const float* dscores, const float* q,
                                        float* dk) const {
  std::fill_n(dk, a.batch * a.keys * a.heads * a.head_dim, 0.0f);
  for (int64_t b = 0; b < a.batch; ++b) {
    for (int64_t h = 0; h < a.heads; ++h) {
      for (int64_t i = 0; i < a.queries; ++i) {
        const float* qi = q + TokenAt(a, b, i, a.queries, h);
        const float* row = dscores + ScoreAt(a, b, h, i);
        for (int64_t j = 0; j < a.keys; ++j) {
          float* dkj = dk + TokenAt(a, b, j, a.keys, h);
          for (int64_t d = 0; d < a.head_dim; ++d) dkj[d] += row[j] * qi[d];
        }
      }
    }
  }
}

void CpuKernels::AttentionContext(const AttentionShape& a, const float* probs, const float* v, float* context) const {
  std::fill_n(context, a.batch * a.queries * a.heads * a.head_dim, 0.0f);
  for (int64_t b = 0; b < a.batch; ++b) {
    for (int64_t h = 0; h < a.heads; ++h) {
      for (int64_t i = 0; i < a.queries; ++i) {
        float* ci = context + TokenAt(a, b, i, a.queries, h);
        const float* row = probs + ScoreAt(a, b, h, i);
        for (int64_t j = 0; j < a.keys; ++j) {
          const float* vj = v + TokenAt(a, b, j, a.keys, h);
          for (int64_t d = 0; d < a.head_dim; ++d) ci[d] += row[j] * vj[d];
        }
      }
    }
  }
}

void CpuKernels::AttentionContextProbsGrad(const AttentionShape& a, const float* dcontext, const float* v,
                                           float* dprobs) const {
  for (int64_t b = 0; b < a.batch; ++b) {
    for (int64_t h = 0; h < a.heads; ++h) {
      for (int64_t i = 0; i < a.queries; ++i) {
        const float* dci = dcontext + TokenAt(a, b, i, a.queries, h);
        float* row = dprobs + ScoreAt(a, b, h, i);
        for (int64_t j = 0; j < a.keys; ++j) {
          const float* vj = v + TokenAt(a, b, j, a.keys, h);
          float sum = 0;
          for (int64_t d = 0; d < a.head_dim; ++d) sum += dci[d] * vj[d];
          row[j] = sum;
        }
      }
    }
  }
}

void CpuKernels::AttentionContextValueGrad(const AttentionShape& a, const float* dcontext, const float* probs,
                                           float* dv) const {
  std::fill_n(dv, a.batch * a.keys * a.heads * a.head_dim, 0.0f);
  for (int64_t b = 0; b < a.batch; ++b) {
    for (int64_t h = 0; h < a.heads; ++h) {
      for (int64_t i = 0; i < a.queries; ++i) {
        const float* dci = dcontext + TokenAt(a, b, i, a.queries, h);
        const float* row = probs + ScoreAt(a, b, h, i);
        for (int64_t j = 0; j < a.keys; ++j) {
          float* dvj = dv + TokenAt(a, b, j, a.keys, h);
          for (int64_t d = 0; d < a.head_dim; ++d) dvj[d] += row[j] * dci[d];
        }
      }
    }
  }
}

void CpuKernels::MaskedScale(const float* x, int64_t matrices, int64_t queries, int64_t keys, float scale,
                             bool causal, float* y) const {
  constexpr float kMasked = -std::numeric_limits<float>::infinity();
  for (int64_t m = 0; m < matrices; ++m) {
    for (int64_t i = 0; i < queries; ++i) {
      const int64_t row = (m * queries + i) * keys;
      for (int64_t j = 0; j < keys; ++j) y[row + j] = causal && j > i ? kMasked : x[row + j] * scale;
    }
  }
}

void CpuKernels::MaskedScaleBackward(const float* dy, int64_t matrices, int64_t queries, int64_t keys, float scale,
                                     bool causal, float* dx) const {
  for (int64_t m = 0; m < matrices; ++m) {
    for (int64_t i = 0; i < queries; ++i) {
      const int64_t row = (m * queries + i) * keys;
      for (int64_t j = 0; j < keys; ++j) dx[row + j] = causal && j > i ? 0.0f : dy[row + j] * scale;
    }
  }
}

void CpuKernels::Softmax(const float* x, int64_t rows, int64_t n, float* y) const {
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * n;
    float* yr = y + r * n;
    const float max = *std::max_element(xr, xr + n);
    float sum = 0;
    for (int64_t i = 0; i < n; ++i) sum += yr[i] = std::exp(xr[i] - max);
    for (int64_t i = 0; i < n; ++i) yr[i] /= sum;
  }
}

void CpuKernels::SoftmaxBackward(const float* y, const float* dy, int64_t rows, int64_t n, float* dx) const {
  for (int64_t r = 0; r < rows; ++r) {
    float dot = 0;
    for (int64_t i = 0; i < n; ++i) dot += y[r * n + i] * dy[r * n + i];
    for (int64_t i = 0; i < n; ++i) dx[r * n + i] = y[r * n + i] * (dy[r * n + i] - dot);
  }
}

void CpuKernels::LogSoftmax(const float* x, int64_t rows, int64_t n, float* y) const {
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * n;
    const float max = *std::max_element(xr, xr + n);
    float sum = 0;
    for (int64_t i = 0; i < n; ++i) sum += std::exp(xr[i] - max);
    const float log_sum = max + std::log(sum);
    for (int64_t i = 0; i < n; ++i) y[r * n + i] = xr[i] - log_sum;
  }
}

void CpuKernels::LogSoftmaxBackward(const float* y, const float* dy, int64_t rows, int64_t n, float* dx) const {
  for (int64_t r = 0; r < rows; ++r) {
    float sum = 0;
    for (int64_t i = 0; i < n; ++i) sum += dy[r * n + i];
    for (int64_t i = 0; i < n; ++i) dx[r * n + i] = dy[r * n + i] - std::exp(y[r * n + i]) * sum;
  }
}

void CpuKernels::NllLoss(const float* log_probs, const int64_t* labels, int64_t rows, int64_t n, float* loss) const {
  double sum = 0;
  for (int64_t r = 0; r < rows; ++r) sum -= log_probs[r * n + labels[r]];
  *loss = static_cast<float>(sum / static_cast<double>(rows));
}

void CpuKernels::NllLossBackward(const int64_t* labels, int64_t rows, int64_t n, float* dlog_probs) const {
  std::fill_n(dlog_probs, rows * n, 0.0f);
  const float g = -1.0f / static_cast<float>(rows);
  for (int64_t r = 0; r < rows; ++r) dlog_probs[r * n + labels[r]] = g;
}

void CpuKernels::LayerNorm(const float* x, int64_t rows, int64_t n, const float* w, const float* bias, float* y,
                           float* mean, float* rstd) const {
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * n;
    float sum = 0;
    for (int64_t i = 0; i < n; ++i) sum += xr[i];
    const float mu = sum / static_cast<float>(n);
    float var = 0;
    for (int64_t i = 0; i < n; ++i) var += (xr[i] - mu) * (xr[i] - mu);
    const float inv = 1.0f / std::sqrt(var / static_cast<float>(n) + kLayerNormEps);
    mean[r] = mu;
    rstd[r] = inv;
    for (int64_t i = 0; i < n; ++i) y[r * n + i] = (xr[i] - mu) * inv * w[i] + (bias != nullptr ? bias[i] : 0.0f);
  }
}

void CpuKernels::LayerNormInputGrad(const float* x, const float* mean, const float* rstd, const float* w,
                                    const float* dy, int64_t rows, int64_t n, float* dx) const {
  for (int64_t r = 0; r < rows; ++r) {
    // dx = rstd * (g - mean(g) - xhat * mean(g * xhat)), g = dy * w.
    float sum_g = 0, sum_gx = 0;
    for (int64_t i = 0; i < n; ++i) {
      const float g = dy[r * n + i] * w[i];
      const float xhat = (x[r * n + i] - mean[r]) * rstd[r];
      sum_g += g;
      sum_gx += g * xhat;
    }
    const float inv_n = 1.0f / static_cast<float>(n);
    for (int64_t i = 0; i < n; ++i) {
      const float g = dy[r * n + i] * w[i];
      const float xhat = (x[r * n + i] - mean[r]) * rstd[r];
      dx[r * n + i] = rstd[r] * (g - sum_g * inv_n - xhat * sum_gx * inv_n);
    }
  }
}

void CpuKernels::LayerNormWeightGrad(const float* x, const float* mean, const float* rstd, const float* dy,
                                     int64_t rows, int64_t n, float* dw) const {
  std::fill_n(dw, n, 0.0f);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t i = 0; i < n; ++i) dw[i] += dy[r * n + i] * (x[r * n + i] - mean[r]) * rstd[r];
  }
}

void CpuKernels::Gelu(const float* x, int64_t n, float* y) const {
  for (int64_t i = 0; i < n; ++i) y[i] = 0.5f * x[i] * (1.0f + std::erf(x[i] * static_cast<float>(M_SQRT1_2)));
}

void CpuKernels::GeluBackward(const float* x, const float* dy, int64_t n, float* dx) const {
  const auto inv_sqrt_2pi = static_cast<float>(0.5 * M_2_SQRTPI * M_SQRT1_2);
  for (int64_t i = 0; i < n; ++i) {
    const float cdf = 0.5f * (1.0f + std::erf(x[i] * static_cast<float>(M_SQRT1_2)));
    const float pdf = inv_sqrt_2pi * std::exp(-0.5f * x[i] * x[i]);
    dx[i] = dy[i] * (cdf + x[i] * pdf);
  }
}

void CpuKernels::Add(const float* a, int64_t n, const float* b, int64_t nb, float* y) const {
  for (int64_t i = 0; i < n; ++i) y[i] = a[i] + b[i % nb];
}

void CpuKernels::ReduceBroadcast(const float* dy, int64_t n, int64_t nb, float* db) const {
  std::fill_n(db, nb, 0.0f);
  for (int64_t i = 0; i < n; ++i) db[i % nb] += dy[i];
}

void CpuKernels::AddInto(float* acc, const float* x, int64_t n) const {
  for (int64_t i = 0; i < n; ++i) acc[i] += x[i];
}

void CpuKernels::SgdMomentum(float* p, const float* grad, float* buf, int64_t n, float lr, float momentum) const {
  for (int64_t i = 0; i < n; ++i) {
    buf[i] = momentum * buf[i] + grad[i];
    p[i] -= lr * buf[i];
  }
}

}  // namespace headroom

// The GPU path's GEMM layouts (executor/gemm_layout.h), evaluated with
// cuBLAS's column-major semantics on the CPU, against the CPU reference
// kernels: a wrong transpose, leading dimension or stride fails here, on any
// machine, before a GPU ever runs them.
#include "executor/gemm_layout.h"

#include <cmath>
#include <vector>

#include "executor/cpu_kernels.h"
#include "gtest/gtest.h"

namespace headroom {
namespace {

std::vector<float> Values(size_t n, int seed) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = std::sin(static_cast<float>(i * 7 + static_cast<size_t>(seed) * 13) * 0.37f);
  return v;
}

void ExpectClose(const std::vector<float>& got, const std::vector<float>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) ASSERT_NEAR(got[i], want[i], 1e-4f) << "at " << i;
}

TEST(GemmLayout, LinearLayersMatchTheCpuReference) {
  const CpuKernels cpu;
  const int64_t rows = 6, in = 5, out = 3;
  const std::vector<float> x = Values(rows * in, 1), w = Values(out * in, 2), dy = Values(rows * out, 3);
  std::vector<float> want(rows * out), got(rows * out, -1);
  cpu.Linear(x.data(), rows, in, w.data(), nullptr, out, want.data());
  RunGemmOnCpu(LinearGemm(rows, in, out), w.data(), x.data(), got.data());
  ExpectClose(got, want);
  want.assign(rows * in, 0);
  got.assign(rows * in, -1);
  cpu.LinearInputGrad(dy.data(), rows, out, w.data(), in, want.data());
  RunGemmOnCpu(LinearInputGradGemm(rows, in, out), w.data(), dy.data(), got.data());
  ExpectClose(got, want);
  want.assign(out * in, 0);
  got.assign(out * in, -1);
  cpu.LinearWeightGrad(dy.data(), x.data(), rows, in, out, want.data());
  RunGemmOnCpu(LinearWeightGradGemm(rows, in, out), x.data(), dy.data(), got.data());
  ExpectClose(got, want);
}

TEST(GemmLayout, AttentionMatchesTheCpuReference) {
  const CpuKernels cpu;
  // Distinct sizes everywhere, so that any swapped dimension shows.
  const AttentionShape a{.batch = 2, .queries = 3, .keys = 4, .heads = 3, .head_dim = 5};
  const int64_t width = a.heads * a.head_dim;
  const size_t tokens_q = a.batch * a.queries * width, tokens_k = a.batch * a.keys * width;
  const size_t scores = a.batch * a.heads * a.queries * a.keys;
  const std::vector<float> q = Values(tokens_q, 4), k = Values(tokens_k, 5), v = Values(tokens_k, 6);
  const std::vector<float> p = Values(scores, 7), dscores = Values(scores, 8), dcontext = Values(tokens_q, 9);

  std::vector<float> want(scores), got(scores, -1);
  cpu.AttentionScores(a, q.data(), k.data(), want.data());
  RunGemmOnCpu(ScoresGemm(a), k.data(), q.data(), got.data());
  ExpectClose(got, want);

  want.assign(tokens_q, 0);
  got.assign(tokens_q, -1);
  cpu.AttentionScoresQueryGrad(a, dscores.data(), k.data(), want.data());
  RunGemmOnCpu(ScoresQueryGradGemm(a), k.data(), dscores.data(), got.data());
  ExpectClose(got, want);

  want.assign(tokens_k, 0);
  got.assign(tokens_k, -1);
  cpu.AttentionScoresKeyGrad(a, dscores.data(), q.data(), want.data());
  RunGemmOnCpu(ScoresKeyGradGemm(a), q.data(), dscores.data(), got.data());
  ExpectClose(got, want);

  want.assign(tokens_q, 0);
  got.assign(tokens_q, -1);
  cpu.AttentionContext(a, p.data(), v.data(), want.data());
  RunGemmOnCpu(ContextGemm(a), v.data(), p.data(), got.data());
  ExpectClose(got, want);

  want.assign(scores, 0);
  got.assign(scores, -1);
  cpu.AttentionContextProbsGrad(a, dcontext.data(), v.data(), want.data());
  RunGemmOnCpu(ContextProbsGradGemm(a), v.data(), dcontext.data(), got.data());
  ExpectClose(got, want);

  want.assign(tokens_k, 0);
  got.assign(tokens_k, -1);
  cpu.AttentionContextValueGrad(a, dcontext.data(), p.data(), want.data());
  RunGemmOnCpu(ContextValueGradGemm(a), dcontext.data(), p.data(), got.data());
  ExpectClose(got, want);
}

}  // namespace
}  // namespace headroom

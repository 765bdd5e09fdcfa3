#include "graph/torch_runtime.h"

#include <algorithm>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "graph/ops.h"
#include "gtest/gtest.h"

namespace headroom {
namespace {

using ::testing::HasSubstr;

TEST(TorchRuntime, ParsesVersionsWithTheirSuffixes) {
  absl::StatusOr<TorchRuntime> debian = ParseTorchVersion("1.13.0a0");
  ASSERT_TRUE(debian.ok()) << debian.status();
  EXPECT_EQ(debian->major, 1);
  EXPECT_EQ(debian->minor, 13);
  EXPECT_TRUE(debian->MeanSavesInput());
  EXPECT_TRUE(debian->ForeachAdamKeepsTwoTemporaries());
  absl::StatusOr<TorchRuntime> cuda = ParseTorchVersion("2.5.1+cu124");
  ASSERT_TRUE(cuda.ok()) << cuda.status();
  EXPECT_EQ(TorchVersionName(*cuda), "2.5");
  EXPECT_FALSE(cuda->MeanSavesInput());
  EXPECT_EQ(TorchVersionName(*ParseTorchVersion("2")), "2.0");
  EXPECT_EQ(TorchVersionName(TorchRuntime{}), "2.5");
}

TEST(TorchRuntime, RefusesWhatIsNotASupportedVersion) {
  for (const char* bad : {"", "abc", "two", ".5", "1.12", "0.4", "100.1"}) {
    absl::StatusOr<TorchRuntime> r = ParseTorchVersion(bad);
    EXPECT_FALSE(r.ok()) << bad;
    EXPECT_THAT(r.status().message(), HasSubstr(std::string("'") + bad + "'"));
  }
  EXPECT_FALSE(ParseKernels("tpu").ok());
  EXPECT_EQ(*ParseKernels("CPU"), Kernels::kCpu);
}

TEST(TorchRuntime, ParsesTransformersVersions) {
  absl::StatusOr<TransformersVersion> pinned = ParseTransformersVersion("4.46.3");
  ASSERT_TRUE(pinned.ok()) << pinned.status();
  EXPECT_EQ(TransformersVersionName(*pinned), "4.46");
  EXPECT_FALSE(pinned->AtLeast(4, 49));
  EXPECT_TRUE(pinned->AtLeast(4, 46));
  EXPECT_TRUE(ParseTransformersVersion("5")->AtLeast(4, 54));
  EXPECT_EQ(TransformersVersionName(TorchRuntime{}.transformers), "5.24");
  for (const char* bad : {"", "five", "3.9", "4.39", ".5"}) {
    absl::StatusOr<TransformersVersion> v = ParseTransformersVersion(bad);
    EXPECT_FALSE(v.ok()) << bad;
    EXPECT_THAT(v.status().message(), HasSubstr(std::string("'") + bad + "'"));
  }
}

// Note [Runtime differences]: CPU dropout keeps a noise tensor of the input's dtype, CUDA a bool mask.
TEST(TorchRuntime, DropoutMaskFollowsTheKernels) {
  for (Kernels kernels : {Kernels::kCuda, Kernels::kCpu}) {
    Graph g("dropout");
    OpEmitter e(g, {.compute_dtype = DType::kF32, .runtime = {.kernels = kernels}});
    const TensorId w = e.Parameter("w", {8, 8}, DType::kF32);
    const TensorId x = e.Input("x", {4, 8}, DType::kF32);
    e.Dropout("drop", e.Linear("fc", x, w), 0.1);
    const Op& drop = g.ops().back();
    ASSERT_EQ(drop.kind, "dropout");
    EXPECT_EQ(g.tensor(drop.saved[0]).dtype, kernels == Kernels::kCpu ? DType::kF32 : DType::kBool);
  }
}

// softmax(x, dtype=float32) copies x to f32 first, except for fp16 on CUDA, which has a kernel reading fp16 and
// writing f32 (ATen SoftMax.cpp); f32 scores need no copy.
TEST(TorchRuntime, SoftmaxInF32CopiesItsInputFirst) {
  for (Kernels kernels : {Kernels::kCuda, Kernels::kCpu}) {
    for (DType dtype : {DType::kBF16, DType::kF16, DType::kF32}) {
      SCOPED_TRACE(std::string(KernelsName(kernels)) + " " + std::string(DTypeName(dtype)));
      Graph g("softmax");
      OpEmitter e(g, {.compute_dtype = dtype, .runtime = {.kernels = kernels}});
      const TensorId y = e.Softmax("sm", e.Input("x", {4, 8}, dtype), /*force_f32=*/true);
      EXPECT_EQ(g.tensor(y).dtype, DType::kF32);
      const bool copies = dtype == DType::kBF16 || (dtype == DType::kF16 && kernels == Kernels::kCpu);
      ASSERT_EQ(g.num_ops(), copies ? 2u : 1u);
      if (copies) {
        EXPECT_EQ(g.op(0).kind, "cast");
        EXPECT_EQ(g.tensor(g.op(0).outputs[0]).dtype, DType::kF32);
      }
    }
  }
}

// Note [Cross-entropy under autocast]: CUDA autocast runs cross-entropy's
// log_softmax in the logits' dtype and casts its output to f32 for nll_loss;
// the CPU runtime casts the logits first. F32 logits need no cast either way.
TEST(TorchRuntime, CrossEntropyUnderAutocastCastsWhereTheRuntimeDoes) {
  for (Kernels kernels : {Kernels::kCuda, Kernels::kCpu}) {
    for (DType dtype : {DType::kBF16, DType::kF32}) {
      SCOPED_TRACE(std::string(KernelsName(kernels)) + " " + std::string(DTypeName(dtype)));
      Graph g("loss");
      OpEmitter e(g, {.compute_dtype = DType::kBF16, .autocast = true, .runtime = {.kernels = kernels}});
      const TensorId w = e.Parameter("w", {8, 16}, DType::kF32);
      const TensorId logits = e.Cast("logits", e.Linear("fc", e.Input("x", {4, 16}, DType::kF32), w), dtype);
      const size_t before = g.num_ops();
      e.CrossEntropy("loss", logits, e.Input("labels", {4}, DType::kI64));
      std::vector<std::string> kinds;
      for (size_t i = before; i < g.num_ops(); ++i) kinds.push_back(g.op(static_cast<OpId>(i)).kind);
      const Op& log_softmax = *std::ranges::find(g.ops(), "log_softmax", &Op::kind);
      const Op& nll = *std::ranges::find(g.ops(), "nll_loss", &Op::kind);
      EXPECT_EQ(g.tensor(nll.inputs[0]).dtype, DType::kF32);
      if (dtype == DType::kF32) {
        EXPECT_THAT(kinds, ::testing::ElementsAre("log_softmax", "nll_loss"));
      } else if (kernels == Kernels::kCuda) {
        EXPECT_THAT(kinds, ::testing::ElementsAre("log_softmax", "cast", "nll_loss"));
        EXPECT_EQ(g.tensor(log_softmax.outputs[0]).dtype, DType::kBF16);
        EXPECT_EQ(log_softmax.saved, std::vector<TensorId>{log_softmax.outputs[0]});
        EXPECT_EQ(nll.saved[0], nll.inputs[0]);
      } else {
        EXPECT_THAT(kinds, ::testing::ElementsAre("cast", "log_softmax", "nll_loss"));
        EXPECT_EQ(g.tensor(log_softmax.outputs[0]).dtype, DType::kF32);
      }
    }
  }
}

}  // namespace
}  // namespace headroom

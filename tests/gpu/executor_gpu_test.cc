// The executor on a GPU: every strategy's plan trains the demo models with
// cuBLAS, with gradients within a stated tolerance of the CPU reference's,
// and with the allocator's requested, allocated and reserved peaks equal to
// what the plan's replay predicts; the pinned host pool serves cudaMemcpy.
#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "allocator/cuda/cuda_device.h"
#include "executor/cuda/cuda_compute_device.h"
#include "executor/executor.h"
#include "gtest/gtest.h"
#include "planner/planner.h"
#include "tests/executor/plan_for_test.h"

namespace headroom {
namespace {

// FP32 GEMMs in another summation order, atomics in the embedding's backward:
// relative 1e-3 of the largest gradient entry, per parameter.
constexpr double kRelativeTolerance = 1e-3;

using ::headroom::testing::Planned;
using ::headroom::testing::Trained;
using ::headroom::testing::TrainForTest;

class ExecutorOnGpu : public ::testing::TestWithParam<::headroom::testing::ModelAndStrategy> {
 protected:
  void SetUp() override {
    if (cuda::CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device visible";
  }
};

TEST_P(ExecutorOnGpu, MatchesTheCpuReferenceAndThePrediction) {
  const auto& [name, strategy] = GetParam();
  const DemoModel model = name == "gpt" ? *BuildDemoGpt({.batch = 2, .seq = 16, .vocab = 32, .hidden = 32,
                                                         .heads = 4, .layers = 2})
                                        : *BuildDemoMlp({.batch = 64, .inputs = 8, .hidden = 32, .layers = 4});
  const Planned p = ::headroom::testing::PlanForTest(model, strategy, 0.25);
  absl::StatusOr<std::unique_ptr<CudaComputeDevice>> gpu = CudaComputeDevice::Create(0);
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  const Trained cuda = TrainForTest(model, p, 3, {}, std::move(*gpu));
  const Trained cpu = TrainForTest(model, p, 3, {});
  ASSERT_EQ(cuda.steps.size(), 3u);
  ASSERT_EQ(cpu.steps.size(), 3u);
  for (size_t s = 0; s < 3; ++s) {
    EXPECT_NEAR(cuda.steps[s].loss, cpu.steps[s].loss, 1e-3 * std::abs(cpu.steps[s].loss));
  }
  ASSERT_EQ(cuda.gradients.size(), cpu.gradients.size());
  for (size_t t = 0; t < cpu.gradients.size(); ++t) {
    const std::vector<float>& want = cpu.gradients[t];
    const std::vector<float>& got = cuda.gradients[t];
    ASSERT_EQ(got.size(), want.size());
    float scale = 0;
    for (float v : want) scale = std::max(scale, std::abs(v));
    for (size_t i = 0; i < want.size(); ++i) {
      ASSERT_NEAR(got[i], want[i], kRelativeTolerance * scale + 1e-7)
          << model.forward.tensor(static_cast<TensorId>(t)).name << "[" << i << "]";
    }
  }
  absl::StatusOr<Graph> scheduled = MaterializeSchedule(p.in.step, p.plan.schedule);
  absl::StatusOr<PlanReplay> predicted = ReplayPlan(p.in, *scheduled);
  ASSERT_TRUE(predicted.ok()) << predicted.status();
  // The run's statistics once the cache settles (Note [The first step in the replay]).
  ASSERT_GE(cuda.steps.size(), size_t{kStepsUntilSettled});
  const StepResult& settled = cuda.steps[kStepsUntilSettled - 1];
  EXPECT_EQ(settled.peak_requested_bytes, predicted->requested_bytes);
  EXPECT_EQ(settled.peak_allocated_bytes, predicted->allocator.peak_allocated_bytes);
  EXPECT_EQ(settled.peak_reserved_bytes, predicted->allocator.peak_reserved_bytes);
  EXPECT_EQ(settled.host_peak_bytes, p.plan.evaluation.host_peak_bytes);
}

INSTANTIATE_TEST_SUITE_P(Executor, ExecutorOnGpu, ::testing::ValuesIn(::headroom::testing::EveryModelAndStrategy()),
                         ::headroom::testing::ModelAndStrategyName);

TEST(PinnedHostPool, ServesCopiesToAndFromTheDevice) {
  if (cuda::CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device visible";
  absl::StatusOr<std::unique_ptr<CudaComputeDevice>> gpu = CudaComputeDevice::Create(0);
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  auto pool = HostPool::Create(uint64_t{64} << 20, (*gpu)->HostMemory());
  ASSERT_TRUE(pool.ok()) << pool.status();
  EXPECT_EQ((*pool)->kind(), "pinned");
  constexpr uint64_t kBytes = uint64_t{8} << 20;
  void* host = *(*pool)->Allocate(kBytes);
  std::memset(host, 0x5a, kBytes);
  const DeviceAddress device = *(*gpu)->backend().Malloc(kBytes);
  std::byte* p = *(*gpu)->KernelPointer(device, kBytes);
  ASSERT_TRUE((*gpu)->CopyToDevice(p, host, kBytes).ok());
  std::memset(host, 0, kBytes);
  ASSERT_TRUE((*gpu)->CopyToHost(host, p, kBytes).ok());
  EXPECT_EQ(static_cast<unsigned char*>(host)[kBytes - 1], 0x5a);
  ASSERT_TRUE((*gpu)->backend().Free(device).ok());
  ASSERT_TRUE((*pool)->Free(host).ok());
}

}  // namespace
}  // namespace headroom

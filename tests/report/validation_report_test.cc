// The comparison `headroom validate` makes: which of the estimate's bytes
// stand for PyTorch's allocated peak, the relative error and the tolerance,
// and the table in text, Markdown and JSON.
#include "report/validation_report.h"

#include <string>
#include <vector>

#include "absl/strings/str_split.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "hardware/gpu_catalog.h"

namespace headroom {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

const std::string kTestData = HEADROOM_REPORT_TESTDATA;

// Every category a distinct power of two, so a sum shows which were counted.
MemoryEstimate PowersOfTwo() {
  MemoryEstimate e;
  uint64_t bit = 1;
  for (uint64_t* category :
       {&e.weights, &e.master_weights, &e.gradients, &e.optimizer_state, &e.gathered_parameters,
        &e.communication_buffers, &e.fp8_weight_cache, &e.ema_weights, &e.activations, &e.activation_gradients,
        &e.temporaries, &e.kv_cache, &e.overheads.cuda_context, &e.overheads.cublas_workspace,
        &e.overheads.allocator_rounding, &e.overheads.allocator_cached}) {
    *category = bit;
    bit <<= 1;
  }
  e.peak_op = "loss";
  e.peak_phase = "loss";
  return e;
}

// Note [Estimated allocated bytes].
TEST(EstimatedFigures, AllocatorFiguresOnCudaTensorsAloneOnACpu) {
  const MemoryEstimate e = PowersOfTwo();
  const uint64_t tensors = (uint64_t{1} << 12) - 1;  // the first twelve categories
  const EstimatedStep cpu = EstimatedFigures(e, /*on_cuda=*/false);
  EXPECT_EQ(cpu.allocated_bytes, tensors);
  EXPECT_EQ(cpu.reserved_bytes, e.reserved_bytes());
  EXPECT_EQ(cpu.peak_op, "loss");
  EXPECT_EQ(cpu.peak_phase, "loss");
  const EstimatedStep cuda = EstimatedFigures(e, /*on_cuda=*/true);
  EXPECT_EQ(cuda.allocated_bytes, tensors + e.overheads.cublas_workspace + e.overheads.allocator_rounding);
  EXPECT_EQ(cuda.reserved_bytes, cuda.allocated_bytes + e.overheads.allocator_cached);
  EXPECT_EQ(e.total_bytes() - cuda.reserved_bytes, e.overheads.cuda_context);
}

TEST(RelativeError, IsSignedAndRelativeToTheMeasurement) {
  EXPECT_DOUBLE_EQ(RelativeError(106, 100), 0.06);
  EXPECT_DOUBLE_EQ(RelativeError(94, 100), -0.06);
  EXPECT_DOUBLE_EQ(RelativeError(100, 100), 0.0);
}

// The fixture's job, as its estimate_args spell it (the command line reads
// them in `headroom validate`; cli_test covers that).
JobSpec FixtureJob() {
  return JobSpec{.micro_batch = 2,
                 .seq_len = 256,
                 .precision = Precision::kFp32,
                 .optimizer = Optimizer::kAdamW,
                 .optimizer_impl = OptimizerImpl::kForLoop,
                 .attention = AttentionImpl::kEager};
}

TEST(CheckFixture, ComparesTheEstimateWithTheMeasuredPeak) {
  absl::StatusOr<ValidationFixture> fixture = LoadValidationFixture(kTestData + "/llama-mha-fp32-adamw-loop.json");
  ASSERT_TRUE(fixture.ok()) << fixture.status();
  const JobSpec job = FixtureJob();
  absl::StatusOr<MemoryEstimate> estimate = EstimateMemory(fixture->model, job, Machine{.budget = uint64_t{1} << 40});
  ASSERT_TRUE(estimate.ok()) << estimate.status();
  const uint64_t estimated = EstimatedFigures(*estimate, false).allocated_bytes;
  ASSERT_GT(estimated, 0u);

  // The measurement such that the estimate is 2% (then 5%) above it.
  fixture->measured.peak_allocated_bytes = static_cast<uint64_t>(static_cast<double>(estimated) / 1.02);
  fixture->peers = {{.tool = "accelerate", .bytes = fixture->measured.peak_allocated_bytes / 2}};
  absl::StatusOr<FixtureCheck> close = CheckFixture(*fixture, job, {.allocated = 0.03});
  ASSERT_TRUE(close.ok()) << close.status();
  EXPECT_EQ(close->name, "llama-mha-fp32-adamw-loop");
  EXPECT_EQ(close->estimated.allocated_bytes, estimated);
  EXPECT_EQ(close->estimated.peak_op, estimate->peak_op);
  EXPECT_NEAR(close->error, 0.02, 1e-6);
  EXPECT_TRUE(close->within_tolerance);
  EXPECT_TRUE(close->passed());
  EXPECT_FALSE(close->reserved_error.has_value());  // a CPU fixture
  ASSERT_EQ(close->peers.size(), 1u);
  EXPECT_NEAR(close->peers[0].error, -0.5, 1e-6);

  fixture->measured.peak_allocated_bytes = static_cast<uint64_t>(static_cast<double>(estimated) / 1.05);
  absl::StatusOr<FixtureCheck> far = CheckFixture(*fixture, job, {.allocated = 0.03});
  ASSERT_TRUE(far.ok()) << far.status();
  EXPECT_NEAR(far->error, 0.05, 1e-6);
  EXPECT_FALSE(far->within_tolerance);
  EXPECT_FALSE(far->passed());
  absl::StatusOr<FixtureCheck> wider = CheckFixture(*fixture, job, {.allocated = 0.06});
  EXPECT_TRUE(wider->passed());
}

// Note [Distributed fixtures checked]: one check per rank, each against its
// own peak; without ranks, the one check of CheckFixture.
TEST(CheckFixture, EveryRankIsCheckedAgainstTheEstimateOfOneGpu) {
  absl::StatusOr<ValidationFixture> fixture = LoadValidationFixture(kTestData + "/llama-mha-fp32-adamw-loop.json");
  ASSERT_TRUE(fixture.ok()) << fixture.status();
  const JobSpec job = FixtureJob();
  absl::StatusOr<std::vector<FixtureCheck>> single = CheckFixtureRanks(*fixture, job, {});
  ASSERT_TRUE(single.ok()) << single.status();
  ASSERT_EQ(single->size(), 1u);
  EXPECT_EQ((*single)[0].name, "llama-mha-fp32-adamw-loop");
  const uint64_t estimated = (*single)[0].estimated.allocated_bytes;

  MeasuredStep close = fixture->measured, far = fixture->measured;
  close.peak_allocated_bytes = static_cast<uint64_t>(static_cast<double>(estimated) / 1.01);
  far.peak_allocated_bytes = static_cast<uint64_t>(static_cast<double>(estimated) / 1.10);
  fixture->ranks = {close, far};
  fixture->peers = {{.tool = "accelerate", .bytes = close.peak_allocated_bytes}};
  absl::StatusOr<std::vector<FixtureCheck>> ranks = CheckFixtureRanks(*fixture, job, {.allocated = 0.03});
  ASSERT_TRUE(ranks.ok()) << ranks.status();
  ASSERT_EQ(ranks->size(), 2u);
  EXPECT_EQ((*ranks)[0].name, "llama-mha-fp32-adamw-loop rank 0");
  EXPECT_EQ((*ranks)[1].name, "llama-mha-fp32-adamw-loop rank 1");
  EXPECT_EQ((*ranks)[1].estimated.allocated_bytes, estimated);
  EXPECT_NEAR((*ranks)[0].error, 0.01, 1e-6);
  EXPECT_TRUE((*ranks)[0].passed());
  EXPECT_NEAR((*ranks)[1].error, 0.10, 1e-6);
  EXPECT_FALSE((*ranks)[1].passed());
  ASSERT_EQ((*ranks)[1].peers.size(), 1u);  // the peer's error against this rank's peak
  EXPECT_NEAR((*ranks)[1].peers[0].error, 1.10 / 1.01 - 1, 1e-3);
}

// On a CUDA fixture the estimate runs on the fixture's GPU (Note [The
// fixture's GPU]), the rounding and the cuBLAS workspaces count as allocated,
// and a measured reserved peak is compared too.
TEST(CheckFixture, CudaFixturesCompareReservedMemory) {
  absl::StatusOr<ValidationFixture> fixture = LoadValidationFixture(kTestData + "/llama-mha-fp32-adamw-loop.json");
  ASSERT_TRUE(fixture.ok()) << fixture.status();
  fixture->device = "NVIDIA H100 80GB HBM3";
  absl::StatusOr<const GpuSpec*> h100 = GpuCatalog::Builtin().Find("H100-SXM-80GB");
  ASSERT_TRUE(h100.ok()) << h100.status();
  const JobSpec job = FixtureJob();
  absl::StatusOr<MemoryEstimate> estimate =
      EstimateMemory(fixture->model, job, Machine{.gpu = *h100, .budget = uint64_t{1} << 40});
  ASSERT_TRUE(estimate.ok()) << estimate.status();
  ASSERT_GT(estimate->overheads.cublas_workspace, 0);
  ASSERT_TRUE(estimate.ok()) << estimate.status();
  const EstimatedStep figures = EstimatedFigures(*estimate, true);
  fixture->measured.peak_allocated_bytes = figures.allocated_bytes;
  fixture->measured.peak_reserved_bytes = figures.reserved_bytes;
  absl::StatusOr<FixtureCheck> check = CheckFixture(*fixture, job, {});
  ASSERT_TRUE(check.ok()) << check.status();
  EXPECT_EQ(check->estimated.allocated_bytes, figures.allocated_bytes);
  EXPECT_EQ(check->error, 0.0);
  ASSERT_TRUE(check->reserved_error.has_value());
  EXPECT_EQ(*check->reserved_error, 0.0);
  EXPECT_TRUE(check->passed());

  fixture->measured.peak_reserved_bytes = 2 * figures.reserved_bytes;
  check = CheckFixture(*fixture, job, {.reserved = 0.10});
  ASSERT_TRUE(check.ok()) << check.status();
  EXPECT_NEAR(*check->reserved_error, -0.5, 1e-9);
  EXPECT_TRUE(check->within_tolerance);
  EXPECT_FALSE(check->reserved_within_tolerance);
  EXPECT_FALSE(check->passed());
}

TEST(CheckFixture, ACudaFixtureOnAGpuTheCatalogLacksIsAnError) {
  absl::StatusOr<ValidationFixture> fixture = LoadValidationFixture(kTestData + "/llama-mha-fp32-adamw-loop.json");
  ASSERT_TRUE(fixture.ok()) << fixture.status();
  fixture->device = "NVIDIA Imaginary 7000";
  absl::StatusOr<FixtureCheck> check = CheckFixture(*fixture, FixtureJob(), {});
  ASSERT_FALSE(check.ok());
  EXPECT_THAT(check.status().message(), HasSubstr("device: unknown GPU 'NVIDIA Imaginary 7000'"));
}

FixtureCheck Check(std::string name, uint64_t measured, uint64_t estimated, double tolerance) {
  FixtureCheck check{.path = "fixtures/" + name + ".json", .name = name, .description = "a | b", .device = "cpu"};
  check.measured.peak_allocated_bytes = measured;
  check.measured.peak_op = "_log_softmax_backward_data";
  check.measured.peak_phase = "backward";
  check.estimated = {.allocated_bytes = estimated, .peak_op = "loss", .peak_phase = "loss"};
  check.error = RelativeError(estimated, measured);
  check.within_tolerance = std::abs(check.error) <= tolerance;
  return check;
}

ValidationRun TwoChecks() {
  ValidationRun run{.tolerance = {.allocated = 0.03}};
  run.checks.push_back(Check("close", 1000, 1010, 0.03));
  run.checks.push_back(Check("far", 1000, 950, 0.03));
  run.checks[1].peers = {{.tool = "accelerate", .bytes = 900, .error = -0.1}};
  return run;
}

TEST(ValidationRun, WorstAndVerdict) {
  ValidationRun run = TwoChecks();
  EXPECT_FALSE(run.all_within_tolerance());
  ASSERT_NE(run.worst(), nullptr);
  EXPECT_EQ(run.worst()->name, "far");
  run.checks.pop_back();
  EXPECT_TRUE(run.all_within_tolerance());
  EXPECT_EQ(ValidationRun{}.worst(), nullptr);
}

TEST(ValidationText, TableAndSummary) {
  const std::string text = ValidationText(TwoChecks());
  EXPECT_THAT(text, HasSubstr("fixture"));
  EXPECT_THAT(text, HasSubstr("accelerate"));
  EXPECT_THAT(text, HasSubstr("+1.0%"));
  EXPECT_THAT(text, HasSubstr("-5.0%"));
  EXPECT_THAT(text, HasSubstr("-10.0%"));  // the peer's error
  EXPECT_THAT(text, HasSubstr("backward: _log_softmax_backward_data"));
  EXPECT_THAT(text, HasSubstr("loss: loss"));
  EXPECT_THAT(text, HasSubstr("outside 3%"));
  EXPECT_THAT(text, Not(HasSubstr("reserved")));  // no fixture measured it
  EXPECT_THAT(text, HasSubstr("2 fixtures: 1 within 3% of the measured peak, 1 outside; worst far (-5.0%)\n"));
}

TEST(ValidationMarkdown, IsAGithubTable) {
  const std::string markdown = ValidationMarkdown(TwoChecks());
  std::vector<std::string> lines = absl::StrSplit(markdown, '\n');
  ASSERT_GE(lines.size(), 6u);
  EXPECT_EQ(lines[0],
            "| fixture | description | measured | estimated | error | measured peak at | estimated peak at | "
            "accelerate | verdict |");
  EXPECT_EQ(lines[1], "| --- | --- | ---: | ---: | ---: | --- | --- | ---: | --- |");
  // A pipe in a cell is escaped; a fixture without a peer's figure has a blank cell.
  EXPECT_EQ(lines[2],
            "| close | a \\| b | 1000 B | 1010 B | +1.0% | backward: _log_softmax_backward_data | loss: loss |  | "
            "ok |");
  EXPECT_EQ(lines[3],
            "| far | a \\| b | 1000 B | 950 B | -5.0% | backward: _log_softmax_backward_data | loss: loss | -10.0% | "
            "outside 3% |");
  EXPECT_EQ(lines[4], "");
  EXPECT_EQ(lines[5], "2 fixtures: 1 within 3% of the measured peak, 1 outside; worst far (-5.0%).");
}

TEST(ValidationJson, HasExactFigures) {
  ValidationRun run = TwoChecks();
  run.errors.push_back({.path = "fixtures/bad.json", .message = "fixtures/bad.json: name: required field is missing"});
  const nlohmann::json j = ValidationJson(run);
  EXPECT_EQ(j["schema_version"], 1);
  EXPECT_DOUBLE_EQ(j["tolerance"].get<double>(), 0.03);
  ASSERT_EQ(j["fixtures"].size(), 2u);
  EXPECT_EQ(j["fixtures"][1]["name"], "far");
  EXPECT_EQ(j["fixtures"][1]["measured"]["peak_allocated_bytes"], 1000u);
  EXPECT_EQ(j["fixtures"][1]["estimated"]["allocated_bytes"], 950u);
  EXPECT_DOUBLE_EQ(j["fixtures"][1]["error"].get<double>(), -0.05);
  EXPECT_EQ(j["fixtures"][1]["within_tolerance"], false);
  EXPECT_EQ(j["fixtures"][1]["peers"]["accelerate"]["bytes"], 900u);
  EXPECT_EQ(j["errors"][0]["path"], "fixtures/bad.json");
  EXPECT_EQ(j["summary"]["fixtures"], 2u);
  EXPECT_EQ(j["summary"]["within_tolerance"], 1u);
  EXPECT_EQ(j["summary"]["worst_fixture"], "far");
  EXPECT_EQ(j["summary"]["passed"], false);
}

}  // namespace
}  // namespace headroom

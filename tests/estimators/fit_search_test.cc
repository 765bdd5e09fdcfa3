// Fix generators say up front whether they apply; estimating one that does
// never swallows an error (estimators/fit_search.cc, Note [Fix applicability]).
#include "estimators/fit_search.h"

#include <algorithm>

#include "estimators/estimate_stages.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace headroom {
namespace {

using ::testing::HasSubstr;

LoadedModel FromConfig(const char* json) {
  absl::StatusOr<ModelConfig> config = ParseHfConfig(json, "test.json");
  EXPECT_TRUE(config.ok()) << config.status();
  return {.name = "test.json", .kind = ModelSourceKind::kConfigFile, .config = *config};
}

bool HasChange(const std::vector<Fix>& fixes, std::string_view words) {
  return std::any_of(fixes.begin(), fixes.end(),
                     [&](const Fix& f) { return f.change.find(words) != std::string::npos; });
}

// LoRA is built for transformers only: on an MLP the generator does not
// apply (before, the builder's error was read as "not applicable").
TEST(RankFixes, LoraDoesNotApplyToAnMlpAndNothingFails) {
  const LoadedModel mlp = FromConfig(
      R"({"architectures": ["MlpChain"], "input_size": 4096, "layer_sizes": [8192, 8192, 10]})");
  const Machine machine{.budget = uint64_t{1536} << 20};
  JobSpec job{.micro_batch = 64};
  absl::StatusOr<MemoryEstimate> base = EstimateMemory(mlp, job, machine);
  ASSERT_TRUE(base.ok()) << base.status();
  ASSERT_FALSE(base->fits());
  absl::StatusOr<std::vector<Fix>> fixes = RankFixes(mlp, job, machine, *base);
  ASSERT_TRUE(fixes.ok()) << fixes.status();
  EXPECT_FALSE(fixes->empty());
  EXPECT_FALSE(HasChange(*fixes, "LoRA"));
  for (const Fix& fix : *fixes) {
    absl::StatusOr<MemoryEstimate> again = EstimateMemory(mlp, fix.job, machine);
    ASSERT_TRUE(again.ok()) << fix.change << ": " << again.status();
    EXPECT_EQ(again->total_bytes(), fix.estimate.total_bytes()) << fix.change << ": the job is the whole change";
  }
}

// An EMA copy on the GPU that tips the job over: moving it to host memory
// is an exact fix, which requests exactly its bytes less (what the
// allocator reserves for the rest is its own replay); without an EMA on the
// GPU the fix does not apply.
TEST(RankFixes, EmaCopyMovesToHostMemory) {
  const LoadedModel mlp = FromConfig(
      R"({"architectures": ["MlpChain"], "input_size": 4096, "layer_sizes": [8192, 8192, 10]})");
  JobSpec job{.micro_batch = 8, .ema = EmaPlacement::kGpu};
  absl::StatusOr<MemoryEstimate> with_ema = EstimateMemory(mlp, job, Machine{.budget = uint64_t{1} << 40});
  ASSERT_TRUE(with_ema.ok()) << with_ema.status();
  ASSERT_GT(with_ema->ema_weights, 0u);
  const Machine machine{.budget = with_ema->total_bytes() - with_ema->ema_weights / 2};
  absl::StatusOr<MemoryEstimate> base = EstimateMemory(mlp, job, machine);
  ASSERT_TRUE(base.ok()) << base.status();
  ASSERT_FALSE(base->fits());
  absl::StatusOr<std::vector<Fix>> fixes = RankFixes(mlp, job, machine, *base);
  ASSERT_TRUE(fixes.ok()) << fixes.status();
  const auto fix = std::find_if(fixes->begin(), fixes->end(),
                                [](const Fix& f) { return f.change == "EMA copy of the weights in host memory"; });
  ASSERT_NE(fix, fixes->end());
  EXPECT_EQ(fix->kind, FixKind::kExact);
  EXPECT_EQ(fix->estimate.requested_bytes(), base->requested_bytes() - base->ema_weights);
  EXPECT_LT(fix->estimate.total_bytes(), base->total_bytes());
  EXPECT_EQ(fix->estimate.host_bytes, base->host_bytes + base->ema_weights);

  job.ema = EmaPlacement::kOff;
  absl::StatusOr<MemoryEstimate> plain = EstimateMemory(mlp, job, machine);
  ASSERT_TRUE(plain.ok()) << plain.status();
  absl::StatusOr<std::vector<Fix>> none = RankFixes(mlp, job, machine, *plain);
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_FALSE(HasChange(*none, "EMA"));
}

// Inference adds tensor-parallel ranks only while they divide GPT-2's 12
// heads: 2 and 4 are tried, 8 is not applicable, so the search stops there
// instead of reading the builder's error as "does not fit".
TEST(RankFixes, MoreGpusStopWhereTensorParallelNoLongerDividesTheHeads) {
  absl::StatusOr<LoadedModel> gpt2 = LoadModel("gpt2");
  ASSERT_TRUE(gpt2.ok());
  JobSpec job;
  job.training = false;
  job.micro_batch = 64;
  job.context = 1024;
  const Machine tight{.budget = uint64_t{600} << 20};
  absl::StatusOr<MemoryEstimate> base = EstimateMemory(*gpt2, job, tight);
  ASSERT_TRUE(base.ok()) << base.status();
  absl::StatusOr<std::vector<Fix>> fixes = RankFixes(*gpt2, job, tight, *base);
  ASSERT_TRUE(fixes.ok()) << fixes.status();
  for (const Fix& fix : *fixes) {
    if (fix.kind == FixKind::kMoreGpus) {
      EXPECT_LE(fix.job.layout.tensor_parallel, 4) << fix.change;
    }
  }
  JobSpec eight = job;
  eight.layout.gpus = eight.layout.tensor_parallel = 8;
  absl::StatusOr<MemoryEstimate> invalid = EstimateMemory(*gpt2, eight, tight);
  EXPECT_FALSE(invalid.ok());
}

// FindLimits probes past the size bounds on a big budget: those probes do
// not fit, they are not errors.
TEST(FindLimits, ProbesBeyondTheSizeBoundsDoNotFit) {
  absl::StatusOr<LoadedModel> gpt2 = LoadModel("gpt2");
  ASSERT_TRUE(gpt2.ok());
  JobSpec job{.micro_batch = 1};
  absl::StatusOr<FitLimits> limits = FindLimits(*gpt2, job, Machine{.budget = uint64_t{1} << 50});
  ASSERT_TRUE(limits.ok()) << limits.status();
  EXPECT_EQ(limits->max_micro_batch, 1024);
}

// The library names the layout field; the command line maps it to its flag.
TEST(CheckJobAgainstModel, NamesTheLayoutFieldAndTheConfigField) {
  absl::StatusOr<LoadedModel> mixtral = LoadModel("mixtral-8x7b");
  ASSERT_TRUE(mixtral.ok());
  JobSpec job;
  job.layout.gpus = 4;
  job.layout.expert_parallel = 4;
  EXPECT_TRUE(CheckJobAgainstModel(*mixtral, job).ok());
  job.layout.gpus = job.layout.expert_parallel = 3;
  EXPECT_THAT(CheckJobAgainstModel(*mixtral, job).message(), HasSubstr("expert_parallel 3 does not divide num_local_experts (8)"));
  job.layout = {.gpus = 64, .pipeline_parallel = 64};
  EXPECT_THAT(CheckJobAgainstModel(*mixtral, job).message(),
              HasSubstr("pipeline_parallel 64: more pipeline stages than the model's 32 layers"));
  job.layout = {.gpus = 32, .pipeline_parallel = 32};
  EXPECT_TRUE(CheckJobAgainstModel(*mixtral, job).ok());
}

}  // namespace
}  // namespace headroom

// `headroom estimate --engine vllm|sglang`: the engines' flags, the JSON a
// user scripts against, one-line errors naming the flag, every preset
// answering, and the start-up figures vLLM printed on real GPUs
// (validation/fixtures/serving).
#include <algorithm>
#include <cmath>
#include <fstream>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/cli/run_command.h"

namespace headroom {
namespace {

using ::headroom::testing::RunHeadroom;
using ::headroom::testing::WriteTempFile;
using ::testing::HasSubstr;

nlohmann::json ServingJson(const std::vector<std::string>& args) {
  std::vector<std::string> all = {"estimate", "--json"};
  all.insert(all.end(), args.begin(), args.end());
  auto r = RunHeadroom(all);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  return nlohmann::json::parse(r.out.empty() ? "{}" : r.out);
}

TEST(ServingCli, TheJsonCarriesEveryFigurePerGpu) {
  const nlohmann::json j = ServingJson({"--engine", "vllm", "--model", "llama-3-8b", "--gpu", "h100"});
  EXPECT_EQ(j["engine"], "vllm");
  EXPECT_EQ(j["engine_version"], "0.34.0");
  EXPECT_EQ(j["max_model_len"], 8192);  // the model's own
  ASSERT_EQ(j["gpus"].size(), 1u);
  const nlohmann::json& g = j["gpus"][0];
  for (const char* key : {"engine", "engine_version", "budget_bytes", "weights_bytes", "activation_peak_bytes",
                          "non_torch_bytes", "cuda_graph_bytes", "kv_cache_bytes", "kv_block_bytes", "gpu_blocks",
                          "kv_cache_tokens", "max_concurrency", "max_model_len_that_fits", "starts", "error"}) {
    EXPECT_TRUE(g.contains(key)) << key;
  }
  EXPECT_EQ(g["starts"], true);
  EXPECT_TRUE(g["error"].is_null());
  // A block of every layer: 32 layers x 64 tokens x 8 KV heads x 2 x 128 x 2 bytes.
  EXPECT_EQ(g["kv_block_bytes"], 32u * 64 * 8 * 2 * 128 * 2);
  EXPECT_EQ(g["gpu_blocks"], g["kv_cache_bytes"].get<int64_t>() / g["kv_block_bytes"].get<int64_t>());
  EXPECT_DOUBLE_EQ(g["max_concurrency"].get<double>(), g["gpu_blocks"].get<double>() / (8192 / 64));
}

TEST(ServingCli, AnEraCountsAsItsReleaseDid) {
  // 0.6.3 counts every layer's block as V0 did, 16 tokens to a block, 90% of the GPU.
  const nlohmann::json old = ServingJson({"--engine", "vllm@0.6.3", "--model", "llama-3-8b", "--gpu", "h100"});
  EXPECT_EQ(old["block_size"], 16);
  EXPECT_DOUBLE_EQ(old["gpu_memory_utilization"].get<double>(), 0.9);
  EXPECT_EQ(old["gpus"][0]["cuda_graph_bytes"].get<uint64_t>() > 0, true);
  const nlohmann::json eager =
      ServingJson({"--engine", "vllm@0.20.0", "--model", "llama-3-8b", "--gpu", "h100", "--enforce-eager"});
  const nlohmann::json graphs = ServingJson({"--engine", "vllm@0.20.0", "--model", "llama-3-8b", "--gpu", "h100"});
  // Before 0.20 the graphs must fit beside the cache: at 0.99 of a 24 GB card they do not.
  const nlohmann::json tight = ServingJson({"--engine", "vllm@0.6.3", "--model", "llama-3-8b", "--gpu", "rtx-4090",
                                            "--gpu-memory-utilization", "0.99", "--max-model-len", "4096"});
  EXPECT_EQ(tight["starts"], true);
  EXPECT_THAT(tight["gpus"][0]["warning"].get<std::string>(), HasSubstr("CUDA graphs"));
  EXPECT_TRUE(ServingJson({"--engine", "vllm@0.6.3", "--model", "llama-3-8b", "--gpu", "rtx-4090", "--max-model-len",
                           "4096"})["gpus"][0]["warning"]
                  .is_null());
  // From 0.20 the graphs come out of the cache.
  EXPECT_EQ(eager["gpus"][0]["kv_cache_bytes"].get<int64_t>() - graphs["gpus"][0]["kv_cache_bytes"].get<int64_t>(),
            graphs["gpus"][0]["cuda_graph_bytes"].get<int64_t>());
}

TEST(ServingCli, TooLongARequestGetsTheEnginesErrorAndTheLengthThatFits) {
  auto r = RunHeadroom({"estimate", "--engine", "vllm", "--model", "qwen3-8b", "--gpu", "l4", "--max-model-len", "40960"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("DOES NOT START: To serve at least one request with the model's max seq len (40960)"));
  EXPECT_THAT(r.out, HasSubstr("the estimated maximum model length is"));
  EXPECT_THAT(r.out, HasSubstr("--kv-cache-dtype fp8"));  // a fix
}

TEST(ServingCli, AbsurdFlagsAreOneLineNamingTheFlag) {
  struct Case {
    std::vector<std::string> args;
    std::string message;
  };
  const std::vector<Case> cases = {
      {{"--gpu-memory-utilization", "0"}, "--gpu-memory-utilization: must be above 0 and at most 1, got 0"},
      {{"--gpu-memory-utilization", "1.5"}, "--gpu-memory-utilization: must be above 0 and at most 1, got 1.5"},
      {{"--max-model-len", "200000"}, "--max-model-len: 200000 is longer than the model's 8192"},
      {{"--tensor-parallel-size", "3"},
       "--tensor-parallel-size: Total number of attention heads (32) must be divisible by tensor parallel size (3)."},
      {{"--quantization", "int3"}, "--quantization: unknown quantization 'int3'"},
      {{"--quantization", "awq"}, "--quantization: awq needs a checkpoint quantized that way"},
      {{"--kv-cache-dtype", "fp4"}, "--kv-cache-dtype: 'fp4' is not one Headroom sizes"},
      {{"--context-length", "4096"}, "--context-length: a flag of the other engine; vLLM's is --max-model-len"},
      {{"--max-num-seqs", "0"}, "--max-num-seqs: must be at least 1, got 0"},
      {{"--block-size", "0"}, "--block-size: must be 1 to 4096, got 0"},
      {{"--dtype", "int8"}, "--dtype: unknown dtype 'int8'"},
      {{"--concurrency", "0"}, "--concurrency: must be 1 to 16777216, got 0"},
  };
  for (const Case& c : cases) {
    std::vector<std::string> args = {"estimate", "--engine", "vllm", "--model", "llama-3-8b", "--gpu", "h100"};
    args.insert(args.end(), c.args.begin(), c.args.end());
    auto r = RunHeadroom(args);
    EXPECT_EQ(r.exit_code, 2) << c.args[0];
    EXPECT_THAT(r.err, HasSubstr(c.message)) << c.args[0];
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
    EXPECT_TRUE(r.out.empty());
  }
  auto r = RunHeadroom({"estimate", "--model", "llama-3-8b", "--gpu", "h100", "--max-model-len", "4096"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("needs --engine vllm or sglang"));
  r = RunHeadroom({"estimate", "--engine", "vllm@0.1.0", "--model", "llama-3-8b", "--gpu", "h100"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("--engine: 'vllm@0.1.0': vLLM releases from 0.2.0 on are known"));
  r = RunHeadroom({"estimate", "--engine", "sglang", "--model", "llama-3-8b", "--gpu", "h100", "--max-model-len", "9"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("--max-model-len: a flag of the other engine; SGLang's is --context-length"));
  r = RunHeadroom({"estimate", "--engine", "sglang", "--model", "llama-3-8b", "--budget", "1GiB"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("--mem-fraction-static: SGLang's default for a GPU of 1.00 GiB comes to"));
  r = RunHeadroom({"estimate", "--engine", "vllm", "--model", "llama-3-8b", "--budget", "1000000TiB"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("--budget: 1000000.00 TiB is one GPU's memory for a serving engine; at most 64 TiB"));
  r = RunHeadroom({"estimate", "--engine", "tgi", "--model", "llama-3-8b", "--gpu", "h100"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("unknown engine 'tgi'"));
}

TEST(ServingCli, EveryPresetAnswersForBothEngines) {
  for (const std::string& engine : {std::string("vllm"), std::string("sglang"), std::string("vllm@0.6.3")}) {
    for (const char* preset : {"gpt2", "llama-3-8b", "mistral-7b", "gemma-2-9b", "gemma-3-1b", "deepseek-v2-lite",
                               "deepseek-v3", "mixtral-8x7b", "qwen3-30b-a3b", "gpt-oss-20b", "llava-1.5-7b",
                               "llama-4-scout-17b-16e", "mamba-2.8b", "phi-3-mini-4k", "bert-large", "t5-v1-1-base",
                               "resnet50"}) {
      auto r = RunHeadroom({"estimate", "--engine", engine, "--model", preset, "--gpu", "h100", "--no-search"});
      SCOPED_TRACE(engine + " " + preset);
      if (r.exit_code == 0) {
        EXPECT_THAT(r.out, HasSubstr("verdict: "));
      } else {
        // Encoders, CNNs and (for some engines) Mamba are refused in one line naming why.
        EXPECT_EQ(r.exit_code, 2);
        EXPECT_THAT(r.err, HasSubstr("--engine: "));
        EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1);
      }
    }
  }
}

TEST(ServingCli, SglangSizesItsTokenPool) {
  const nlohmann::json j = ServingJson({"--engine", "sglang", "--model", "llama-3-8b", "--gpu", "h100"});
  EXPECT_EQ(j["engine"], "sglang");
  EXPECT_EQ(j["page_size"], 1);
  // A token of every layer: 32 x 8 KV heads x (128 + 128) x 2 bytes.
  EXPECT_DOUBLE_EQ(j["gpus"][0]["cell_bytes"].get<double>(), 32.0 * 8 * 256 * 2);
  EXPECT_EQ(j["max_total_num_tokens"].get<int64_t>(), j["gpus"][0]["kv_cache_bytes"].get<int64_t>() / (32 * 8 * 256 * 2));
  EXPECT_GT(j["mem_fraction_static"].get<double>(), 0.8);
}

// Note [Serving start-up logs]: each case of validation/fixtures/serving/vllm-startup-logs.json is a start-up
// vLLM printed on a real GPU; the KV cache Headroom predicts must be within 5% of it and the verdict the same,
// or the case names why not (known_miss), which must still miss.
TEST(ServingCli, VllmStartupLogsFromRealGpus) {
  std::ifstream in(std::string(HEADROOM_SOURCE_DIR) + "/validation/fixtures/serving/vllm-startup-logs.json");
  ASSERT_TRUE(in.good());
  const nlohmann::json doc = nlohmann::json::parse(in);
  int checked = 0;
  for (const nlohmann::json& c : doc["cases"]) {
    SCOPED_TRACE(c["name"].get<std::string>());
    std::vector<std::string> args;
    if (c.contains("config")) {
      args = {"--model", WriteTempFile("serving_config.json", doc["configs"][c["config"].get<std::string>()].dump())};
    } else {
      args = {"--model", c["model"].get<std::string>()};
    }
    for (const nlohmann::json& a : c["args"]) args.push_back(a.get<std::string>());
    args.push_back("--no-search");
    const nlohmann::json j = ServingJson(args);
    const nlohmann::json& reported = c["reported"];
    double predicted = 0, measured = 0;
    if (reported.contains("kv_cache_bytes")) {
      predicted = j["gpus"][0]["kv_cache_bytes"].get<double>();
      measured = reported["kv_cache_bytes"].get<double>();
    } else if (reported.contains("gpu_blocks")) {
      predicted = j["gpu_blocks"].get<double>();
      measured = reported["gpu_blocks"].get<double>();
    } else {
      predicted = j["kv_cache_tokens"].get<double>();
      measured = reported["kv_cache_tokens"].get<double>();
    }
    const double error = predicted / measured - 1;
    if (c.contains("known_miss")) {
      EXPECT_GT(std::abs(error), 0.05) << "now within 5%: drop the known_miss";
    } else {
      EXPECT_LE(std::abs(error), 0.05) << "predicted " << predicted << ", vLLM " << measured;
      EXPECT_EQ(j["starts"], reported["starts"]);
    }
    ++checked;
  }
  EXPECT_GE(checked, 7);
}

}  // namespace
}  // namespace headroom

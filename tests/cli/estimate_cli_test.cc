// `headroom estimate`: the verdict, the JSON object, the emitted framework
// settings and the error paths (one line naming the field, exit code 2).
#include <algorithm>
#include <string>
#include <utility>
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

size_t Lines(const std::string& s) { return static_cast<size_t>(std::count(s.begin(), s.end(), '\n')); }

// The README's main job: Llama-3-8B full fine-tuning in bf16 mixed precision
// with AdamW does not fit one H100 80GB (18+ bytes per parameter is 134 GiB
// before activations); the fixes that do fit are listed with their flags.
TEST(EstimateCli, Llama3FullFineTuneDoesNotFitOneH100) {
  auto r = RunHeadroom({"estimate", "--model", "llama-3-8b", "--precision", "bf16-mixed", "--optimizer",
                        "adamw", "--gpu", "H100-80GB"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("8.03 B parameters"));
  EXPECT_THAT(r.out, HasSubstr("verdict: DOES NOT FIT: short by"));
  EXPECT_THAT(r.out, HasSubstr("cheapest changes that make it fit"));
  EXPECT_THAT(r.out, HasSubstr("--offload optimizer"));
  EXPECT_THAT(r.out, HasSubstr("--lora-rank 16"));
  EXPECT_THAT(r.out, HasSubstr("no micro-batch fits"));
}

// How the step is written: a Trainer-style loop drops the logits before backward, a fused RMSNorm keeps
// one tensor less per norm, and PyTorch 1.13's CPU kernels keep more (Note [Runtime differences]).
TEST(EstimateCli, HowTheStepIsWrittenChangesTheActivations) {
  auto activations = [](std::vector<std::string> extra) {
    // LoRA with SGD: the activations, not the gradients or the optimizer, make the peak.
    std::vector<std::string> args = {"estimate", "--model", "llama-2-7b", "--seq", "2048", "--lora-rank", "16",
                                     "--optimizer", "sgd", "--budget", "1TiB", "--json"};
    args.insert(args.end(), extra.begin(), extra.end());
    auto r = RunHeadroom(args);
    EXPECT_EQ(r.exit_code, 0) << r.err;
    return nlohmann::json::parse(r.out)["allocated_bytes"].get<uint64_t>();
  };
  const uint64_t hand = activations({});
  EXPECT_LT(activations({"--loop", "trainer"}), hand);
  EXPECT_LT(activations({"--rms-norm", "fused"}), hand);
  EXPECT_EQ(activations({"--rms-norm", "eager"}), hand);
  // Megatron's layouts run fused norms unless told otherwise.
  const uint64_t megatron = activations({"--gpus", "2", "--tp", "2"});
  EXPECT_EQ(megatron, activations({"--gpus", "2", "--tp", "2", "--rms-norm", "fused"}));
  EXPECT_LT(megatron, activations({"--gpus", "2", "--tp", "2", "--rms-norm", "eager"}));
  EXPECT_GT(activations({"--torch", "1.13", "--kernels", "cpu"}), hand);
  for (const auto& [flag, value] : {std::pair<std::string, std::string>{"--loop", "script"},
                                    {"--rms-norm", "apex"}, {"--torch", "1.12"}, {"--kernels", "tpu"},
                                    {"--transformers", "3.0"}}) {
    auto r = RunHeadroom({"estimate", "--model", "gpt2", flag, value});
    EXPECT_EQ(r.exit_code, 2) << flag;
    EXPECT_THAT(r.err, HasSubstr(flag)) << r.err;
  }
}

// Gemma 2 serves half its layers from a 4096-token window (Note [Sliding-window KV cache]): 21 full layers
// hold 32768 tokens and 21 sliding ones 4096 + one straddling block of 16, 8 KV heads of 256 in bf16.
TEST(EstimateCli, Gemma2KvCacheHoldsTheWindowInSlidingLayers) {
  auto r = RunHeadroom({"estimate", "--model", "gemma-2-9b", "--inference", "--context", "32768", "--micro-batch",
                        "4", "--budget", "1TiB", "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const uint64_t token_bytes = 2u * 8 * 256 * 2;
  EXPECT_EQ(nlohmann::json::parse(r.out)["bytes"]["kv_cache"].get<uint64_t>(),
            4u * (21 * 32768 + 21 * (4096 + 16)) * token_bytes);
}

// DeepSeek-V3 caches one latent of 512 + 64 values per token and layer (Note [MLA KV cache]), not 2 x 128
// heads x 192: 61 layers x 32768 tokens x 576 x 2 bytes per sequence, 2.1 GiB.
TEST(EstimateCli, LatentAttentionCachesTheLatent) {
  auto r = RunHeadroom({"estimate", "--model", "deepseek-v3", "--inference", "--context", "32768", "--micro-batch",
                        "2", "--seq", "1", "--budget", "4TiB", "--no-search", "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(nlohmann::json::parse(r.out)["bytes"]["kv_cache"].get<uint64_t>(), 2ull * 61 * 32768 * 576 * 2);
}

// [13]: a DeepSeek job that does not fit ended the whole estimate with "lora target module 'v_proj' matches no
// Linear", from the fix search's LoRA candidate; its latent attention takes adapters on q_proj and kv_b_proj.
TEST(EstimateCli, DeepseekThatDoesNotFitListsItsFixes) {
  auto r = RunHeadroom({"estimate", "--model", "deepseek-v2-lite", "--gpu", "h100", "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const nlohmann::json report = nlohmann::json::parse(r.out);
  bool lora = false;
  for (const nlohmann::json& fix : report["fixes"]) {
    lora = lora || fix["flags"].get<std::string>().find("--lora-rank 16") != std::string::npos;
  }
  EXPECT_TRUE(lora) << r.out;
}

// Mamba keeps no KV cache: inference holds MambaCache's conv_state [b, 5120, 4] and ssm_state [b, 5120, 16] for
// each of 64 layers, in the model's dtype, whatever --context says (Note [Recurrent state]); training holds none.
TEST(EstimateCli, MambaHoldsARecurrentStateInsteadOfAKvCache) {
  for (const char* context : {"0", "32768"}) {
    auto r = RunHeadroom({"estimate", "--model", "mamba-2.8b", "--inference", "--precision", "bf16", "--context",
                          context, "--micro-batch", "4", "--seq", "256", "--budget", "1TiB", "--no-search",
                          "--json"});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const nlohmann::json bytes = nlohmann::json::parse(r.out)["bytes"];
    EXPECT_EQ(bytes["recurrent_state"].get<uint64_t>(), 64ull * 4 * 5120 * (4 + 16) * 2) << context;
    EXPECT_FALSE(bytes.contains("kv_cache")) << bytes.dump();
  }
  auto text = RunHeadroom({"estimate", "--model", "mamba-2.8b", "--inference", "--precision", "bf16", "--seq", "256",
                           "--budget", "1TiB", "--no-search"});
  ASSERT_EQ(text.exit_code, 0) << text.err;
  EXPECT_THAT(text.out, HasSubstr("recurrent state (conv + SSM)"));
  EXPECT_THAT(text.out, ::testing::Not(HasSubstr("KV cache")));
  auto training = RunHeadroom({"estimate", "--model", "mamba-2.8b", "--precision", "bf16-mixed", "--seq", "256",
                               "--budget", "1TiB", "--no-search", "--json"});
  ASSERT_EQ(training.exit_code, 0) << training.err;
  EXPECT_FALSE(nlohmann::json::parse(training.out)["bytes"].contains("recurrent_state"));
}

// T5 runs eager attention unless told otherwise (it has no flash path) and reads --target-seq decoder tokens;
// a decoder-only model has no second sequence.
TEST(EstimateCli, EncoderDecodersTakeATargetSequence) {
  auto r = RunHeadroom({"estimate", "--model", "t5-v1_1-base", "--gpu", "h100", "--seq", "512", "--target-seq", "128",
                        "--no-search", "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const nlohmann::json doc = nlohmann::json::parse(r.out);
  EXPECT_EQ(doc["setup"]["attention"], "eager");
  // transformers 5 ties v1.1's head to the shared embedding; 4.46 kept the checkpoint's own (Note [transformers
  // versions]).
  EXPECT_EQ(doc["model"]["parameters"], 222'903'552u);
  auto hf446 = RunHeadroom({"estimate", "--model", "t5-v1_1-base", "--gpu", "h100", "--seq", "512", "--target-seq",
                            "128", "--no-search", "--json", "--transformers", "4.46"});
  ASSERT_EQ(hf446.exit_code, 0) << hf446.err;
  EXPECT_EQ(nlohmann::json::parse(hf446.out)["model"]["parameters"], 247'577'856u);
  auto longer = RunHeadroom({"estimate", "--model", "t5-v1_1-base", "--gpu", "h100", "--seq", "512", "--target-seq",
                             "512", "--no-search", "--json"});
  ASSERT_EQ(longer.exit_code, 0) << longer.err;
  EXPECT_GT(nlohmann::json::parse(longer.out)["bytes"]["activations"].get<uint64_t>(),
            doc["bytes"]["activations"].get<uint64_t>());
  auto flash = RunHeadroom({"estimate", "--model", "t5-v1_1-base", "--gpu", "h100", "--attention", "flash"});
  EXPECT_EQ(flash.exit_code, 2);
  EXPECT_THAT(flash.err, HasSubstr("no flash attention path"));
  auto decoder = RunHeadroom({"estimate", "--model", "gpt2", "--gpu", "h100", "--target-seq", "16"});
  EXPECT_EQ(decoder.exit_code, 2);
  EXPECT_THAT(decoder.err, HasSubstr("--target-seq 16: gpt2 has no decoder of its own"));
}

// Whisper's encoder reads its 30 s of log-mel frames whatever the job says; --seq (or --target-seq) is the
// decoder's tokens. Generating caches, in each of the 32 decoder blocks, 20 heads x 64 of keys and values in bf16
// for the --context tokens (448: 28 blocks of 16) and for the 1500 encoder positions (94 blocks, 1504 tokens)
// (Note [Encoder-decoder KV cache]).
TEST(EstimateCli, WhisperDecodesTheJobsTokensAndCachesTheAudio) {
  auto r = RunHeadroom({"estimate", "--model", "whisper-large-v3", "--gpu", "h100", "--seq", "128", "--no-search",
                        "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const nlohmann::json doc = nlohmann::json::parse(r.out);
  EXPECT_EQ(doc["model"]["parameters"], 1'543'490'560u);
  auto longer = RunHeadroom({"estimate", "--model", "whisper-large-v3", "--gpu", "h100", "--target-seq", "448",
                             "--no-search", "--json"});
  ASSERT_EQ(longer.exit_code, 0) << longer.err;
  EXPECT_GT(nlohmann::json::parse(longer.out)["bytes"]["activations"].get<uint64_t>(),
            doc["bytes"]["activations"].get<uint64_t>());
  auto both = RunHeadroom({"estimate", "--model", "whisper-large-v3", "--gpu", "h100", "--seq", "128",
                           "--target-seq", "64"});
  EXPECT_EQ(both.exit_code, 2);
  EXPECT_THAT(both.err, HasSubstr("2 x max_source_positions (1500)"));
  auto too_long = RunHeadroom({"estimate", "--model", "whisper-large-v3", "--gpu", "h100", "--seq", "449"});
  EXPECT_EQ(too_long.exit_code, 2);
  EXPECT_THAT(too_long.err, HasSubstr("max_target_positions (448)"));
  auto serve = RunHeadroom({"estimate", "--model", "whisper-large-v3", "--inference", "--context", "448", "--seq",
                            "4", "--micro-batch", "2", "--kv-dtype", "bf16", "--kv-block-size", "16", "--gpu", "h100",
                            "--no-search", "--json"});
  ASSERT_EQ(serve.exit_code, 0) << serve.err;
  EXPECT_EQ(nlohmann::json::parse(serve.out)["bytes"]["kv_cache"].get<uint64_t>(),
            2ull * 32 * (448 + 1504) * (2 * 20 * 64 * 2));
}

TEST(EstimateCli, LoraFitsWithLimits) {
  auto r = RunHeadroom({"estimate", "--model", "llama-3-8b", "--gpu", "h100", "--lora-rank", "16"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("verdict: FITS with"));
  EXPECT_THAT(r.out, HasSubstr("largest micro-batch"));
  EXPECT_THAT(r.out, HasSubstr("longest sequence"));
}

// Inference loads 16-bit weights unless told otherwise: 6.74 B parameters in
// bf16 are 13.5 GB; the KV cache of 8 x 4096 tokens is 0.5 MiB per token.
TEST(EstimateCli, InferenceDefaultsToBf16WeightsAndCountsTheKvCache) {
  auto r = RunHeadroom({"estimate", "--model", "llama-2-7b", "--inference", "--context", "4096",
                        "--micro-batch", "8", "--gpu", "L40S", "--no-search", "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto doc = nlohmann::json::parse(r.out);
  EXPECT_EQ(doc["setup"]["precision"], "bf16");
  // Weights include the model's buffers: the rotary cos/sin tables, 2 MiB here.
  EXPECT_EQ(doc["bytes"]["weights"], 2 * 6'738'415'616ull + 2 * 4096 * 128 * 2);
  EXPECT_EQ(doc["bytes"]["kv_cache"], 8ull * 4096 * 512 * 1024);
}

// The estimate's reserved bytes are a replay of its allocation sequence
// (estimators/step_replay.h): --trace-out writes that sequence, and
// `headroom replay` of it with the same configuration reports the same
// allocated and reserved peaks; the nvidia-smi total adds the CUDA context.
TEST(EstimateCli, TraceOutReplaysToTheSameReservedPeak) {
  for (const std::string conf : {"pytorch-default", "expandable"}) {
    SCOPED_TRACE(conf);
    const std::string trace = WriteTempFile("gpt2-" + conf + ".rmm.csv", "");
    auto e = RunHeadroom({"estimate", "--model", "gpt2", "--gpu", "t4", "--micro-batch", "4", "--alloc-conf", conf,
                          "--trace-out", trace, "--no-search", "--json"});
    ASSERT_EQ(e.exit_code, 0) << e.err;
    const nlohmann::json estimate = nlohmann::json::parse(e.out);
    auto r = RunHeadroom({"replay", trace, "--conf", conf, "--capacity", "16GiB", "--json"});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const nlohmann::json run = nlohmann::json::parse(r.out)["runs"][0];
    EXPECT_EQ(run["peak_reserved_bytes"], estimate["reserved_bytes"]);
    EXPECT_EQ(run["peak_allocated_bytes"], estimate["allocated_bytes"]);
    EXPECT_EQ(estimate["total_bytes"].get<uint64_t>(),
              estimate["reserved_bytes"].get<uint64_t>() + estimate["bytes"]["cuda_context"].get<uint64_t>());
    EXPECT_EQ(estimate["reserved_bytes"].get<uint64_t>() - estimate["allocated_bytes"].get<uint64_t>(),
              estimate["bytes"]["allocator_cached"].get<uint64_t>());
  }
}

// --graph-out writes the forward graph the estimate built; estimating that file again gives the same bytes,
// since the step is derived from the forward graph either way.
TEST(EstimateCli, GraphOutWritesTheForwardGraph) {
  const std::string graph = WriteTempFile("gpt2-forward.graph.json", "");
  const std::vector<std::string> setup = {"--gpu", "t4", "--precision", "fp32", "--micro-batch", "2",
                                          "--seq", "128", "--no-search", "--json"};
  std::vector<std::string> built = {"estimate", "--model", "gpt2", "--graph-out", graph};
  built.insert(built.end(), setup.begin(), setup.end());
  auto e = RunHeadroom(built);
  ASSERT_EQ(e.exit_code, 0) << e.err;
  std::vector<std::string> reread = {"estimate", "--model", graph};
  reread.insert(reread.end(), setup.begin(), setup.end());
  auto r = RunHeadroom(reread);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const nlohmann::json a = nlohmann::json::parse(e.out), b = nlohmann::json::parse(r.out);
  EXPECT_EQ(a["model"]["parameters"], b["model"]["parameters"]);
  EXPECT_EQ(a["bytes"]["activations"], b["bytes"]["activations"]);
  EXPECT_EQ(a["allocated_bytes"], b["allocated_bytes"]);
  auto bad = RunHeadroom({"estimate", "--model", "gpt2", "--gpu", "t4", "--graph-out", "/nonexistent/dir/g.json"});
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_THAT(bad.err, HasSubstr("--graph-out /nonexistent/dir/g.json: cannot write: No such file or directory"));
}

// --alloc-conf changes what the allocator reserves, not what the job
// requests; it is shown in the report.
TEST(EstimateCli, AllocConfChangesReservedBytesOnly) {
  auto run = [](const std::string& conf) {
    auto r = RunHeadroom({"estimate", "--model", "gpt2", "--gpu", "t4", "--micro-batch", "8", "--alloc-conf", conf,
                          "--no-search", "--json"});
    EXPECT_EQ(r.exit_code, 0) << r.err;
    return nlohmann::json::parse(r.out);
  };
  const nlohmann::json native = run("pytorch-default"), expandable = run("expandable_segments:True");
  EXPECT_EQ(native["alloc_conf"], "pytorch-default");
  EXPECT_EQ(expandable["alloc_conf"], "expandable_segments:True");
  for (const char* key : {"weights", "activations", "optimizer_state"}) {
    EXPECT_EQ(native["bytes"][key], expandable["bytes"][key]) << key;
  }
  EXPECT_LE(expandable["reserved_bytes"].get<uint64_t>(), native["reserved_bytes"].get<uint64_t>());
  auto text = RunHeadroom({"estimate", "--model", "gpt2", "--gpu", "t4", "--alloc-conf", "expandable", "--no-search"});
  ASSERT_EQ(text.exit_code, 0) << text.err;
  EXPECT_THAT(text.out, HasSubstr("reserved at the peak"));
  EXPECT_THAT(text.out, HasSubstr("total (nvidia-smi)"));
  EXPECT_THAT(text.out, HasSubstr("allocator cache (reserved, unused)"));
  EXPECT_THAT(text.out, HasSubstr("--alloc-conf expandable_segments:True"));
  auto bad_plan = RunHeadroom({"plan", "--model", "gpt2", "--budget", "80%", "--alloc-conf", "max_split_size_mb:1"});
  EXPECT_EQ(bad_plan.exit_code, 2);
  EXPECT_THAT(bad_plan.err, HasSubstr("--alloc-conf 'max_split_size_mb:1'"));
}

// A node-link graph is taken as given; the report says the setup flags do not
// reshape it.
TEST(EstimateCli, FixedGraphSaysSetupFlagsDoNotApply) {
  const std::string graph = WriteTempFile("tiny.nx.json", R"({"directed": true, "multigraph": false,
    "graph": {}, "nodes": [{"id": 0, "name": "a", "backward": false, "cost_cpu": 1, "cost_ram": 1024},
                            {"id": 1, "name": "a_grad", "backward": true, "cost_cpu": 1, "cost_ram": 2048}],
    "links": [{"source": 0, "target": 1}]})");
  auto r = RunHeadroom({"estimate", "--model", graph, "--budget", "1GiB", "--no-search"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("a fixed graph"));
  EXPECT_THAT(r.out, HasSubstr("verdict: FITS"));
}

TEST(EstimateCli, JsonIsTheDocumentedObject) {
  auto r = RunHeadroom({"estimate", "--model", "llama-3-8b", "--gpu", "H100-80GB", "--json", "--breakdown"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["schema_version"], 1);
  EXPECT_FALSE(j["fits"].get<bool>());
  EXPECT_EQ(j["capacity_bytes"], 85899345920ull);
  uint64_t sum = 0;
  for (const auto& [key, value] : j["bytes"].items()) sum += value.get<uint64_t>();
  EXPECT_EQ(sum, j["total_bytes"].get<uint64_t>());
  EXPECT_EQ(j["spare_bytes"].get<int64_t>(),
            static_cast<int64_t>(j["capacity_bytes"].get<uint64_t>()) - static_cast<int64_t>(sum));
  EXPECT_EQ(j["model"]["parameters"], 8030261248ull);
  EXPECT_GT(j["fixes"].size(), 0u);
  EXPECT_TRUE(j["fixes"][0].contains("flags"));
  EXPECT_EQ(j["limits"]["max_micro_batch"], 0);
  EXPECT_TRUE(j.contains("largest_live"));
}

TEST(EstimateCli, BreakdownNamesThePeak) {
  auto r = RunHeadroom({"estimate", "--model", "gpt2", "--gpu", "a100", "--micro-batch", "8", "--seq", "1024",
                        "--breakdown", "--no-search"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("largest tensors live at the peak"));
  EXPECT_THAT(r.out, HasSubstr("activation"));
}

TEST(EstimateCli, BudgetInsteadOfGpu) {
  auto r = RunHeadroom({"estimate", "--model", "gpt2", "--budget", "1GiB", "--no-search"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("budget 1.00 GiB"));
  EXPECT_THAT(r.out, HasSubstr("DOES NOT FIT"));
}

TEST(EstimateCli, EmitDeepSpeedAndFsdp) {
  auto ds = RunHeadroom({"estimate", "--model", "llama-3-8b", "--gpu", "h100", "--gpus", "8", "--zero", "3",
                         "--offload", "optimizer", "--emit", "deepspeed"});
  ASSERT_EQ(ds.exit_code, 0) << ds.err;
  const auto j = nlohmann::json::parse(ds.out);
  EXPECT_EQ(j["zero_optimization"]["stage"], 3);
  EXPECT_EQ(j["zero_optimization"]["offload_optimizer"]["device"], "cpu");
  EXPECT_TRUE(j["bf16"]["enabled"].get<bool>());
  auto fsdp = RunHeadroom({"estimate", "--model", "llama-3-8b", "--gpu", "h100", "--gpus", "16", "--fsdp",
                           "hybrid", "--emit", "fsdp"});
  ASSERT_EQ(fsdp.exit_code, 0) << fsdp.err;
  EXPECT_THAT(fsdp.out, HasSubstr("ShardingStrategy.HYBRID_SHARD"));
  EXPECT_THAT(fsdp.out, HasSubstr("LlamaDecoderLayer"));
  EXPECT_THAT(fsdp.out, HasSubstr("torchrun --nnodes=2 --nproc_per_node=8"));
  auto grad_op = RunHeadroom({"estimate", "--model", "llama-3-8b", "--gpu", "h100", "--gpus", "8", "--fsdp",
                              "grad-op", "--emit", "fsdp"});
  ASSERT_EQ(grad_op.exit_code, 0) << grad_op.err;
  EXPECT_THAT(grad_op.out, HasSubstr("ShardingStrategy.SHARD_GRAD_OP"));
  auto unknown = RunHeadroom({"estimate", "--model", "llama-3-8b", "--gpu", "h100", "--gpus", "8", "--fsdp", "half"});
  EXPECT_EQ(unknown.exit_code, 2);
  EXPECT_THAT(unknown.err, HasSubstr("--fsdp"));
  EXPECT_THAT(unknown.err, HasSubstr("grad-op"));
}

TEST(EstimateCli, Zero3OnEightGpusFits) {
  auto r = RunHeadroom({"estimate", "--model", "llama-3-8b", "--gpu", "h100", "--gpus", "8", "--zero", "3",
                        "--json", "--no-search"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_TRUE(j["fits"].get<bool>());
  EXPECT_EQ(j["framework"], "deepspeed");
  EXPECT_GT(j["bytes"]["gathered_parameters"].get<uint64_t>(), 0u);
}

struct BadInput {
  std::vector<std::string> args;
  const char* message;
};

// Each case, after `prefix`, exits 2 with one line on stderr holding its message.
void ExpectEachRefused(const std::vector<std::string>& prefix, const std::vector<BadInput>& cases) {
  for (const BadInput& c : cases) {
    std::vector<std::string> args = prefix;
    args.insert(args.end(), c.args.begin(), c.args.end());
    auto r = RunHeadroom(args);
    EXPECT_EQ(r.exit_code, 2) << c.message << ": " << r.out;
    EXPECT_THAT(r.err, HasSubstr(c.message));
    EXPECT_EQ(Lines(r.err), 1u) << r.err;
  }
}

TEST(EstimateCli, BadInputExitsTwoNamingTheField) {
  const std::string bad_arch = WriteTempFile(
      "bad_arch.json", R"({"architectures": ["RwkvForCausalLM"], "model_type": "rwkv"})");
  const std::string malformed = WriteTempFile("malformed.json", R"({"architectures": ["LlamaForCausalLM"], )");
  const std::string incomplete = WriteTempFile(
      "incomplete.json", R"({"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 32000})");
  const std::vector<BadInput> cases = {
      {{"--model", bad_arch, "--gpu", "h100"}, "RwkvForCausalLM"},
      {{"--model", malformed, "--gpu", "h100"}, "malformed.json"},
      {{"--model", incomplete, "--gpu", "h100"}, "hidden_size"},
      {{"--model", "llama-3-8b", "--gpu", "h100", "--gpus", "3", "--tp", "3"}, "num_attention_heads"},
      {{"--model", "llama-3-8b", "--gpu", "h100", "--micro-batch", "0"}, "--micro-batch"},
      {{"--model", "llama-3-8b", "--gpu", "h100", "--micro-batch", "-2"}, "--micro-batch"},
      {{"--model", "llama-3-8b", "--gpu", "h100", "--seq", "-1"}, "--seq"},
      {{"--model", "llama-3-8b", "--gpu", "h100", "--grad-accum", "0"}, "--grad-accum"},
      {{"--model", "llama-3-8b", "--gpu", "h100", "--gpus", "0"}, "--gpus"},
      {{"--model", "llama-3-8b", "--budget", "0"}, "--budget"},
      {{"--model", "llama-3-8b", "--budget", "-5GiB"}, "--budget"},
      {{"--model", "llama-3-8b"}, "--gpu or --budget"},
      {{"--model", "llama-3-8b", "--gpu", "h100", "--precision", "fp12"}, "precision 'fp12'"},
      {{"--model", "llama-3-8b", "--gpu", "h100", "--optimizer", "adagrad"}, "optimizer 'adagrad'"},
      {{"--model", "llama-3-8b", "--gpu", "h100", "--offload", "optimizer"}, "--offload"},
      {{"--model", "llama-3-8b", "--gpu", "h100", "--inference", "--context", "-3"}, "--context"},
      {{"--model", "llama-3-7b", "--gpu", "h100"}, "llama-3-8b"},
      {{"--model", "llama-3-8b", "--gpu", "h100", "--emit", "megatron"}, "--emit"},
  };
  ExpectEachRefused({"estimate"}, cases);
}

// Values the flag parser accepts but no job has: each is refused with one
// line naming the flag, never estimated (they used to give confident answers).
TEST(EstimateCli, AbsurdSetupsAreRefusedNamingTheFlag) {
  const std::vector<BadInput> cases = {
      {{"--alloc-conf", "expandable_segments:Maybe"}, "--alloc-conf 'expandable_segments:Maybe'"},
      {{"--alloc-conf", "best-fit"}, "--alloc-conf 'best-fit': "},
      {{"--lora-rank", "8", "--lora-alpha", "nan"}, "--lora-alpha: must be a positive number, got nan"},
      {{"--inference", "--checkpoint", "full"}, "--checkpoint: activation checkpointing ('full') applies to training"},
      {{"--seq", "0"}, "--seq: must be at least 1 (leave it out for the model's default), got 0"},
      {{"--inference", "--grad-accum", "4"}, "--grad-accum: gradient accumulation applies to training"},
      {{"--micro-batch", "1125899906842624"}, "--micro-batch: must be at most 1048576"},
      {{"--inference", "--context", "4503599627370496"}, "--context: must be at most 16777216"},
      {{"--gpus", "2000000"}, "--gpus: must be at most 1048576"},
      // tp x pp is 2^40: no int overflow on the way to the message.
      {{"--gpus", "8", "--tp", "1048576", "--pp", "1048576"},
       "--gpus: 8 GPUs cannot be split into tensor parallel 1048576 x pipeline parallel 1048576 groups"},
      {{"--zero", "7"}, "--zero: ZeRO stage must be 0-3"},
      {{"--fsdp", "partial"}, "--fsdp: unknown FSDP sharding strategy 'partial'"},
      {{"--attention", "magic"}, "--attention: unknown attention 'magic' (expected flash or eager)"},
      {{"--head", "regression"}, "--head: unknown encoder head 'regression'"},
      {{"--sp"}, "--sp: sequence parallelism needs a tensor-parallel degree above 1"},
      {{"--ema", "disk"}, "--ema: unknown EMA placement 'disk'"},
      {{"--inference", "--ema", "gpu"}, "--ema: an EMA of the weights is kept while training"},
      {{"--gpus", "2", "--pp", "2", "--pp-stage", "2"}, "--pp-stage: stage 2 does not exist; the pipeline's stages are 0 to 1 (--pp 2)"},
      {{"--gpus", "2", "--pp", "2", "--pp-schedule", "zero-bubble"},
       "--pp-schedule: unknown pipeline schedule 'zero-bubble'"},
  };
  ExpectEachRefused({"estimate", "--model", "gpt2", "--gpu", "t4"}, cases);
}

// A GPU added with --catalog is usable by estimate, as by `headroom gpus`.
TEST(EstimateCli, FindsTheGpuInACatalogFile) {
  const std::string catalog = std::string(HEADROOM_SOURCE_DIR) + "/data/gpus.json";
  auto r = RunHeadroom({"estimate", "--model", "gpt2", "--catalog", catalog, "--gpu", "t4", "--no-search"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("GPU:    T4"));
  auto missing = RunHeadroom({"estimate", "--model", "gpt2", "--catalog", catalog + ".absent", "--gpu", "t4"});
  EXPECT_EQ(missing.exit_code, 2);
  EXPECT_THAT(missing.err, HasSubstr("gpus.json.absent"));
}

// --checkpoint sqrt-n plans segments of ceil(sqrt(layers)) layers (4 of
// GPT-2's 12): fewer activations than none, and a plan of its own. (Whether
// it keeps less than full depends on the size: full keeps 12 layer inputs
// and replays one layer at a time, sqrt-n keeps 3 and replays 4 layers at
// once; here, with gelu_new's f32 tensors under CUDA autocast, the replay
// of 4 layers weighs more.)
TEST(EstimateCli, SqrtNCheckpointingIsItsOwnPlan) {
  auto activations = [](const std::string& mode) {
    auto r = RunHeadroom({"estimate", "--model", "gpt2", "--gpu", "t4", "--micro-batch", "8", "--attention",
                          "eager", "--checkpoint", mode, "--json", "--no-search"});
    EXPECT_EQ(r.exit_code, 0) << r.err;
    return nlohmann::json::parse(r.out)["bytes"]["activations"].get<uint64_t>();
  };
  const uint64_t none = activations("none"), sqrt_n = activations("sqrt-n"), full = activations("full");
  EXPECT_LT(sqrt_n, none);
  EXPECT_NE(sqrt_n, full);
}

// Absurd input gets a clear error, never a confident wrong answer: sizes
// that would wrap 64-bit byte counts, and layouts the model cannot take,
// exit 2 with one line naming the flags and config fields at fault
// (graph/graph.h Note [Size bounds], models/model_config.h Note [Model size bounds]).
TEST(EstimateCli, AbsurdSizesAndLayoutsExitTwoNamingTheInput) {
  const std::string mlp = WriteTempFile(
      "huge_mlp.json", R"({"architectures": ["MlpChain"], "input_size": 2147483648, "layer_sizes": [2147483648, 10]})");
  const std::string llama = WriteTempFile(
      "huge_llama.json", R"({"architectures": ["LlamaForCausalLM"], "hidden_size": 2147483648,
        "intermediate_size": 2147483648, "vocab_size": 2147483648, "num_hidden_layers": 2, "num_attention_heads": 1})");
  const std::string deep = WriteTempFile(
      "deep.json", R"({"architectures": ["GPT2LMHeadModel"], "vocab_size": 50257, "n_embd": 768, "n_layer": 1000000000,
        "n_head": 12, "n_positions": 1024})");
  auto node_link = [](const std::string& name, const std::string& cost_ram) {
    return WriteTempFile(name, R"({"directed": true, "multigraph": false, "graph": {}, "nodes": [
        {"id": 0, "name": "a", "backward": false, "cost_cpu": 1, "cost_ram": 1024},
        {"id": 1, "name": "big", "backward": false, "cost_cpu": 1, "cost_ram": )" + cost_ram + R"(},
        {"id": 2, "name": "big_grad", "backward": true, "cost_cpu": 1, "cost_ram": 1024}],
      "links": [{"source": 0, "target": 1}, {"source": 1, "target": 2}]})");
  };
  const std::string ram62 = node_link("ram62.nx.json", "4611686018427387904");
  const std::string ram63 = node_link("ram63.nx.json", "9223372036854775808");
  const std::vector<BadInput> cases = {
      // Within the flags' own bounds (micro-batch 2^20, sequence and context
      // 2^24; AbsurdSetupsAreRefusedNamingTheFlag), their products are bounded too.
      {{"--model", "gpt2", "--gpu", "t4", "--micro-batch", "1048576"},
       "--micro-batch 1048576 x --seq 1024 x n_embd 768 x 4 bytes"},
      {{"--model", "llama-3-8b", "--gpu", "h100", "--micro-batch", "1048576", "--seq", "16777216"},
       "more than the 1099511627776 (1 TiB)"},
      {{"--model", "llama-2-7b", "--gpu", "h100", "--inference", "--micro-batch", "256", "--context", "16777216"},
       "--micro-batch 256 x --context 16777216 x num_hidden_layers 32"},
      {{"--model", mlp, "--gpu", "t4"}, "huge_mlp.json: input_size x layer_sizes[0] (2147483648 x 2147483648)"},
      {{"--model", llama, "--gpu", "t4"}, "huge_llama.json: vocab_size x hidden_size"},
      {{"--model", deep, "--gpu", "t4"}, "deep.json: n_layer: must be between 1 and 4096, got 1000000000"},
      {{"--model", ram62, "--budget", "1GiB"}, "ram62.nx.json: nodes[1].cost_ram: 4611686018427387904 (node 'big')"},
      {{"--model", ram63, "--budget", "1GiB"}, "ram63.nx.json: nodes[1].cost_ram"},
      {{"--model", "llama-3-8b", "--gpu", "h100", "--gpus", "100", "--pp", "100"},
       "--pp 100: more pipeline stages than the model's 32 layers (num_hidden_layers)"},
      {{"--model", "mixtral-8x7b", "--gpu", "h100", "--gpus", "3", "--ep", "3"},
       "--ep 3 does not divide num_local_experts (8)"},
      // A capacity or a total beyond 2^62 bytes would make spare_bytes wrap.
      {{"--model", "gpt2", "--budget", "15000000TiB", "--no-search"}, "capacity (--budget or the GPU's memory)"},
      {{"--model", "gpt2", "--budget", "1GiB", "--cuda-context", "16000000TiB", "--no-search"},
       "(--cuda-context: 17592186044416000000)"},
  };
  ExpectEachRefused({"estimate"}, cases);
}

// Names read from a file are quoted, escaped and cut in errors: a newline or
// a terminal escape in a config once went to the terminal as it was.
TEST(EstimateCli, NamesFromFilesAreQuotedInErrors) {
  const std::string escaped = WriteTempFile(
      "escaped_type.json", R"({"model_type": "llama\nheadroom: ok\u001b[2J"})");
  auto r = RunHeadroom({"estimate", "--model", escaped, "--gpu", "h100"});
  EXPECT_EQ(r.exit_code, 2) << r.out;
  EXPECT_THAT(r.err, HasSubstr(R"(unsupported model_type 'llama\nheadroom: ok\x1b[2J')"));
  EXPECT_EQ(Lines(r.err), 1u) << r.err;
  const std::string long_arch = WriteTempFile(
      "long_arch.json", R"({"architectures": [")" + std::string(1 << 20, 'A') + R"("], "model_type": "x"})");
  auto cut = RunHeadroom({"estimate", "--model", long_arch, "--gpu", "h100"});
  EXPECT_EQ(cut.exit_code, 2);
  EXPECT_THAT(cut.err, HasSubstr("'" + std::string(80, 'A') + "...' (1048576 bytes)"));
  EXPECT_LT(cut.err.size(), 4096u);  // the list of supported architectures, and 80 of the A's
}

}  // namespace
}  // namespace headroom

// `headroom plan --emit FORMAT`: every format prints settings for a GPT-2
// plan, the output follows the plan (a uniform plan is Hugging Face's
// switch), and the errors are one line naming the input.
#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/str_replace.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/cli/run_command.h"

namespace headroom {
namespace {

using ::headroom::testing::RunHeadroom;
using ::headroom::testing::WriteTempFile;
using ::testing::HasSubstr;
using ::testing::Not;

TEST(PlanEmitCli, EveryFormatForGpt2AtSixtyPercent) {
  struct Case {
    std::string format;
    std::string expect;
  };
  const Case cases[] = {
      {"torch", "def apply_plan(model):"},
      {"hf", "model.gradient_checkpointing_enable("},
      {"megatron", "# headroom plan --emit megatron: gpt2, chen-greedy plan; these settings peak at"},
      {"deepspeed", "\"activation_checkpointing\": {"},
      {"torch-budget", "torch._functorch.config.activation_memory_budget = 0."},
  };
  for (const Case& c : cases) {
    auto r = RunHeadroom({"plan", "--model", "gpt2", "--attention", "eager", "--budget", "60%", "--strategy",
                          "chen-greedy", "--emit", c.format});
    ASSERT_EQ(r.exit_code, 0) << c.format << "\n" << r.err;
    EXPECT_THAT(r.out, HasSubstr(c.expect)) << c.format;
    EXPECT_THAT(r.out, HasSubstr("12 layers.")) << c.format;
    EXPECT_THAT(r.out, Not(HasSubstr("strategy:"))) << c.format;  // settings instead of the report
  }
}

// Hugging Face's switch is printed whenever the plan checkpoints every layer
// ([10]: chen-greedy's at 60% does, each layer keeping part of its
// activations), with the peak of what the switch runs; nothing to enable for
// store-all, and a plain statement where layers keep everything.
TEST(PlanEmitCli, HfPrintsTheSwitchWhereEveryLayerIsCheckpointedAndItsPeak) {
  auto keep = RunHeadroom({"plan", "--model", "gpt2", "--budget", "100%", "--strategy", "store-all", "--emit", "hf"});
  ASSERT_EQ(keep.exit_code, 0) << keep.err;
  EXPECT_THAT(keep.out, HasSubstr("leave gradient checkpointing off"));
  auto greedy = RunHeadroom({"plan", "--model", "gpt2", "--attention", "eager", "--budget", "60%", "--strategy",
                             "chen-greedy", "--emit", "hf"});
  ASSERT_EQ(greedy.exit_code, 0) << greedy.err;
  EXPECT_THAT(greedy.out, HasSubstr("model.gradient_checkpointing_enable("));
  EXPECT_THAT(greedy.out, HasSubstr("these settings peak at"));
  auto some = RunHeadroom({"plan", "--model", "gpt2", "--attention", "eager", "--budget", "90%", "--strategy",
                           "chain-dp", "--emit", "hf"});
  ASSERT_EQ(some.exit_code, 0) << some.err;
  EXPECT_THAT(some.out, HasSubstr("it cannot express this plan"));
  EXPECT_THAT(some.out, HasSubstr("it sets nothing for this plan"));
  EXPECT_THAT(some.out, Not(HasSubstr("model.gradient_checkpointing_enable(")));
}

TEST(PlanEmitCli, LlamaTorchSnippetNamesItsLayers) {
  auto r = RunHeadroom({"plan", "--model", "llama-2-7b", "--attention", "eager", "--budget", "60%", "--strategy",
                        "chen-greedy", "--emit", "torch"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("\"model.layers.31\""));
  EXPECT_THAT(r.out, HasSubstr("32 layers."));
}

// The default strategy (hybrid) mixes keeping, replaying and offloading per
// layer: whatever it chooses, the torch snippet offloads exactly the layers
// the header names, and megatron's flags cannot express an offload.
TEST(PlanEmitCli, HybridPlanOffloadsTheLayersItNames) {
  const std::vector<std::string> args = {"plan", "--model", "gpt2", "--attention", "eager", "--budget", "60%",
                                         "--emit"};
  std::vector<std::string> torch = args, megatron = args;
  torch.push_back("torch");
  megatron.push_back("megatron");
  auto t = RunHeadroom(torch);
  ASSERT_EQ(t.exit_code, 0) << t.err;
  EXPECT_THAT(t.out, HasSubstr(": gpt2, hybrid, peak"));
  const bool offloads = t.out.find("Offload: none.") == std::string::npos;
  EXPECT_EQ(t.out.find("OFFLOAD = [\n") != std::string::npos, offloads) << t.out;
  auto m = RunHeadroom(megatron);
  ASSERT_EQ(m.exit_code, 0) << m.err;
  if (offloads) {
    EXPECT_THAT(m.out, HasSubstr("Cannot be expressed: the activations of"));
  }
}

TEST(PlanEmitCli, EmitsALoadedPlan) {
  const std::string path = WriteTempFile("gpt2-emit.plan.json", "");
  const std::vector<std::string> setup = {"plan", "--model", "gpt2", "--attention", "eager", "--budget", "60%",
                                          "--strategy", "sqrt-n"};
  std::vector<std::string> out_args = setup, load_args = setup, emit_args = setup;
  out_args.insert(out_args.end(), {"--out", path});
  load_args.insert(load_args.end(), {"--load", path, "--emit", "megatron"});
  emit_args.insert(emit_args.end(), {"--emit", "megatron"});
  ASSERT_EQ(RunHeadroom(out_args).exit_code, 0);
  auto planned = RunHeadroom(emit_args);
  ASSERT_EQ(planned.exit_code, 0) << planned.err;
  auto loaded = RunHeadroom(load_args);
  ASSERT_EQ(loaded.exit_code, 0) << loaded.err;
  EXPECT_THAT(loaded.out, HasSubstr("--recompute-method uniform --recompute-num-layers 2\n"));
  // Same settings below the title line.
  auto body = [](const std::string& s) { return s.substr(s.find("12 layers.")); };
  EXPECT_EQ(body(planned.out), body(loaded.out));
}

// With --emit, --out writes the schedule the printed settings run: loaded back, it is a plan whose peak is the one
// the settings' line gave (Note [Emitted settings' peak]).
TEST(PlanEmitCli, OutWithEmitWritesWhatTheSettingsRun) {
  const std::string path = WriteTempFile("gpt2-settings.plan.json", "");
  const std::vector<std::string> setup = {"plan", "--model", "gpt2", "--attention", "eager", "--budget", "60%",
                                          "--strategy", "sqrt-n", "--kernels", "cpu"};
  std::vector<std::string> emit_args = setup, load_args = setup;
  emit_args.insert(emit_args.end(), {"--emit", "hf", "--out", path});
  load_args.insert(load_args.end(), {"--load", path, "--emit", "hf"});
  auto emitted = RunHeadroom(emit_args);
  ASSERT_EQ(emitted.exit_code, 0) << emitted.err;
  auto loaded = RunHeadroom(load_args);
  ASSERT_EQ(loaded.exit_code, 0) << loaded.err;
  // The settings' schedule is one checkpoint per layer: its own peak and the switch's are one figure.
  const std::string text = absl::StrReplaceAll(loaded.out, {{"\n# ", " "}});  // the title wraps at 100 columns
  const std::string line = text.substr(0, text.find("for a budget"));
  const size_t at = line.find("peak at ");
  ASSERT_NE(at, std::string::npos) << loaded.out;
  const std::string settings = line.substr(at + 8, line.find(" (the plan: ") - at - 8);
  EXPECT_THAT(line, HasSubstr("(the plan: " + settings + ")"));
  EXPECT_THAT(absl::StrReplaceAll(emitted.out, {{"\n# ", " "}}), HasSubstr("peak at " + settings));
  auto not_modeled = RunHeadroom({"plan", "--model", "gpt2", "--budget", "60%", "--strategy", "sqrt-n", "--emit",
                                  "torch-budget", "--out", path});
  EXPECT_EQ(not_modeled.exit_code, 2);
  EXPECT_THAT(not_modeled.err, HasSubstr("--out with --emit torch-budget: what these settings run is not modeled"));
}

TEST(PlanEmitCli, ErrorsAreOneLineNamingTheInput) {
  const std::string node_link = WriteTempFile("two_nodes.nx.json", R"({
    "directed": true, "multigraph": false, "graph": {},
    "nodes": [{"id": 0, "name": "f", "cost_cpu": 1, "cost_ram": 4096, "backward": false},
              {"id": 1, "name": "g", "cost_cpu": 1, "cost_ram": 4096, "backward": false},
              {"id": 2, "name": "b", "cost_cpu": 1, "cost_ram": 4096, "backward": true}],
    "links": [{"source": 0, "target": 1}, {"source": 1, "target": 2}, {"source": 0, "target": 2}]})");
  struct Case {
    std::vector<std::string> args;
    std::string message;
  };
  const Case cases[] = {
      {{"plan", "--model", "gpt2", "--budget", "60%", "--emit", "onnx"}, "--emit: unknown emit format 'onnx'"},
      {{"plan", "--model", "gpt2", "--budget", "60%", "--emit", "torch", "--compare"}, "drop --compare"},
      {{"plan", "--model", "gpt2", "--budget", "60%", "--emit", "torch", "--json"}, "drop --json"},
      {{"plan", "--model", "resnet50", "--budget", "90%", "--emit", "torch"},
       "--emit needs a transformer stack; resnet50 is a CNN"},
      {{"plan", "--model", node_link, "--budget", "100%", "--strategy", "store-all", "--emit", "torch"},
       "--emit needs a transformer stack; this graph has no layers"},
  };
  for (const Case& c : cases) {
    auto r = RunHeadroom(c.args);
    EXPECT_EQ(r.exit_code, 2) << c.message << "\n" << r.err;
    EXPECT_THAT(r.err, HasSubstr(c.message));
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
    EXPECT_TRUE(r.out.empty()) << r.out;
  }
}

}  // namespace
}  // namespace headroom

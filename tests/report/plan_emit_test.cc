// Each emit format on plans it can and cannot express: the settings it
// prints for the named checkpoint modes, and the statement of what it
// cannot express for the others.
#include "report/plan_emit.h"

#include <sstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/report/stack_plans.h"

namespace headroom {
namespace {

using ::headroom::testing::Classified;
using ::headroom::testing::Gpt2Step;
using ::headroom::testing::HybridSchedule;
using ::headroom::testing::LayersSchedule;
using ::headroom::testing::ModeSchedule;
using ::testing::HasSubstr;
using ::testing::Not;

// Comments come wrapped at 100 columns; tests read them as one line.
std::string Unwrapped(std::string text) {
  for (size_t at = text.find("\n# "); at != std::string::npos; at = text.find("\n# ", at)) {
    const size_t line_start = text.rfind('\n', at - 1);
    const bool in_comment = text.compare(line_start == std::string::npos ? 0 : line_start + 1, 1, "#") == 0;
    if (in_comment) {
      text.replace(at, 3, " ");
    } else {
      ++at;
    }
  }
  return text;
}

std::string Emit(EmitFormat format, const Schedule& schedule) {
  return Unwrapped(EmitPlan(format, Classified(schedule), {.title = "gpt2 test plan", .model_type = "gpt2"}));
}

// The JSON object at the start of the deepspeed format's output.
nlohmann::json DeepSpeedJson(const std::string& text) {
  std::istringstream in(text);
  std::string json, line;
  while (std::getline(in, line) && !line.starts_with("#")) json += line + "\n";
  return nlohmann::json::parse(json);
}

TEST(EmitFormat, ParsesNamesAndRefusesOthers) {
  EXPECT_EQ(*ParseEmitFormat("torch-budget"), EmitFormat::kTorchBudget);
  EXPECT_EQ(*ParseEmitFormat("DeepSpeed"), EmitFormat::kDeepSpeed);
  for (EmitFormat f : {EmitFormat::kTorch, EmitFormat::kHf, EmitFormat::kMegatron, EmitFormat::kDeepSpeed,
                       EmitFormat::kTorchBudget}) {
    EXPECT_EQ(*ParseEmitFormat(EmitFormatName(f)), f);
  }
  absl::StatusOr<EmitFormat> bad = ParseEmitFormat("onnx");
  EXPECT_THAT(bad.status().message(), HasSubstr("unknown emit format 'onnx'"));
}

TEST(EmitPlan, EveryFormatNamesThePlanAndItsLayers) {
  for (EmitFormat f : {EmitFormat::kTorch, EmitFormat::kHf, EmitFormat::kMegatron, EmitFormat::kDeepSpeed,
                       EmitFormat::kTorchBudget}) {
    const std::string out = EmitPlan(f, Classified(ModeSchedule(CheckpointMode::kFull)), {.title = "gpt2 test plan"});
    EXPECT_THAT(out, HasSubstr(absl::StrCat("# headroom plan --emit ", std::string(EmitFormatName(f)),
                                            ": gpt2 test plan")));
    EXPECT_THAT(Unwrapped(out), HasSubstr("4 layers. Full checkpoint: 0-3. Selective (attention core): none."));
    std::istringstream in(out);
    for (std::string line; std::getline(in, line);) EXPECT_LE(line.size(), 120u) << line;
  }
}

TEST(EmitTorch, FullCheckpointWrapsEveryLayer) {
  const std::string out = Emit(EmitFormat::kTorch, ModeSchedule(CheckpointMode::kFull));
  EXPECT_THAT(out, HasSubstr("\"transformer.h.0\", \"transformer.h.1\", \"transformer.h.2\", \"transformer.h.3\","));
  EXPECT_THAT(out, HasSubstr("functools.partial(checkpoint, layer.forward, use_reentrant=False)"));
  EXPECT_THAT(out, HasSubstr("OFFLOAD = []"));
  EXPECT_THAT(out, HasSubstr("SELECTIVE = []"));
  EXPECT_THAT(out, Not(HasSubstr("AttentionInterface")));
  EXPECT_THAT(out, Not(HasSubstr("one segment")));
}

TEST(EmitTorch, SelectiveCheckpointsTheAttentionFunction) {
  const std::string out = Emit(EmitFormat::kTorch, ModeSchedule(CheckpointMode::kSelective));
  EXPECT_THAT(out, HasSubstr("CHECKPOINT = []"));  // no layer is checkpointed whole
  // The selective blocks are marked by module (an encoder-decoder numbers its attention layers per stack).
  EXPECT_THAT(out, HasSubstr("\"transformer.h.0\", \"transformer.h.1\", \"transformer.h.2\", \"transformer.h.3\","));
  EXPECT_THAT(out, HasSubstr("module.headroom_selective = True"));
  EXPECT_THAT(out, HasSubstr("if module.training and getattr(module, \"headroom_selective\", False):"));
  EXPECT_THAT(out, HasSubstr("from transformers import AttentionInterface"));
  EXPECT_THAT(out, HasSubstr("from transformers.models.gpt2.modeling_gpt2 import eager_attention_forward"));
  EXPECT_THAT(out, HasSubstr("AttentionInterface.register(\"headroom_selective\", selective_attention)"));
  EXPECT_THAT(out, HasSubstr("QK^T, scale and mask, softmax, dropout on the probabilities, probs @ V"));
}

// Gemma3ForCausalLM's model_type is gemma3_text; its attention function is in transformers.models.gemma3.
TEST(EmitTorch, SelectiveImportsGemma3sAttentionFromItsPackage) {
  const std::string out = Unwrapped(EmitPlan(EmitFormat::kTorch, Classified(ModeSchedule(CheckpointMode::kSelective)),
                                             {.title = "gemma 3", .model_type = "gemma3_text"}));
  EXPECT_THAT(out, HasSubstr("from transformers.models.gemma3.modeling_gemma3 import eager_attention_forward"));
}

TEST(EmitTorch, MultiLayerSegmentsSayWhatPerLayerWrappingAdds) {
  const std::string out = Emit(EmitFormat::kTorch, ModeSchedule(CheckpointMode::kEveryK, 2));
  EXPECT_THAT(out, HasSubstr("replays layers 0-1, 2-3 as one segment each"));
  EXPECT_THAT(out, HasSubstr("more than the plan"));
}

TEST(EmitTorch, OffloadedLayersRunUnderSaveOnCpu) {
  const StackPlan plan = Classified(HybridSchedule());
  const std::string out = Unwrapped(EmitPlan(EmitFormat::kTorch, plan, {.title = "hybrid", .model_type = "gpt2"}));
  EXPECT_THAT(out, HasSubstr("torch.autograd.graph.save_on_cpu(pin_memory=True)"));
  for (int layer : plan.LayersWith(LayerTreatment::kOffload)) {
    EXPECT_THAT(out, HasSubstr(absl::StrCat("\"transformer.h.", layer, "\"")));
  }
}

TEST(EmitTorch, KeepAllSaysThereIsNothingToDo) {
  const std::string out = Emit(EmitFormat::kTorch, StoreAllSchedule(Gpt2Step()));
  EXPECT_THAT(out, HasSubstr("nothing to checkpoint or offload"));
  EXPECT_THAT(out, Not(HasSubstr("import torch")));
}

TEST(EmitHf, UniformPlanIsTheSwitch) {
  const std::string out = Emit(EmitFormat::kHf, ModeSchedule(CheckpointMode::kFull));
  EXPECT_THAT(out, HasSubstr("model.gradient_checkpointing_enable("));
  EXPECT_THAT(out, Not(HasSubstr("cannot")));
}

// [10]: a plan that checkpoints every layer is what the switch runs, whatever
// else it does (segments of layers here); the notes say how the plan differs.
TEST(EmitHf, EveryLayerCheckpointedIsTheSwitchWithTheDepartures) {
  const std::string out = Emit(EmitFormat::kHf, ModeSchedule(CheckpointMode::kEveryK, 2));
  EXPECT_THAT(out, HasSubstr("model.gradient_checkpointing_enable("));
  EXPECT_THAT(out, HasSubstr("where the plan does more or less (below), the switch's peak is the one above"));
}

TEST(EmitHf, OtherPlansCannotBeExpressed) {
  struct Case {
    Schedule schedule;
    std::string why;
  };
  const Case cases[] = {
      {ModeSchedule(CheckpointMode::kSelective), "layers 0-3 replay only the attention core"},
      {LayersSchedule({0, 1}), "layers 2-3 keep their activations"},
      {HybridSchedule(), "offload to host memory"},
  };
  for (const Case& c : cases) {
    const std::string out = Emit(EmitFormat::kHf, c.schedule);
    EXPECT_THAT(out, HasSubstr("it cannot express this plan"));
    EXPECT_THAT(out, HasSubstr(c.why));
    EXPECT_THAT(out, HasSubstr("Use --emit torch"));
    EXPECT_THAT(out, Not(HasSubstr("model.gradient_checkpointing_enable(")));
  }
  EXPECT_THAT(Emit(EmitFormat::kHf, StoreAllSchedule(Gpt2Step())), HasSubstr("leave gradient checkpointing off"));
}

TEST(EmitMegatron, FlagsForThePlansTheyExpress) {
  EXPECT_THAT(Emit(EmitFormat::kMegatron, ModeSchedule(CheckpointMode::kFull)),
              HasSubstr("--recompute-granularity full --recompute-method uniform --recompute-num-layers 1\n"));
  EXPECT_THAT(Emit(EmitFormat::kMegatron, ModeSchedule(CheckpointMode::kEveryK, 2)),
              HasSubstr("--recompute-granularity full --recompute-method uniform --recompute-num-layers 2\n"));
  EXPECT_THAT(Emit(EmitFormat::kMegatron, ModeSchedule(CheckpointMode::kEveryK, 3)),
              HasSubstr("--recompute-method uniform --recompute-num-layers 3\n"));  // chunks of 3 and 1
  const std::string block = Emit(EmitFormat::kMegatron, LayersSchedule({0, 1}));
  EXPECT_THAT(block, HasSubstr("--recompute-granularity full --recompute-method block --recompute-num-layers 2\n"));
  EXPECT_THAT(block, HasSubstr("layers 2-3 keep their activations"));
  EXPECT_THAT(Emit(EmitFormat::kMegatron, LayersSchedule({0, 1, 2})),
              HasSubstr("--recompute-num-layers 3\n# block: the first 3 layers of the stage are recomputed, each "
                        "from its own input; layer 3 keeps its activations."));
  EXPECT_THAT(Emit(EmitFormat::kMegatron, ModeSchedule(CheckpointMode::kSelective)),
              HasSubstr("--recompute-granularity selective\n"));
  EXPECT_THAT(Emit(EmitFormat::kMegatron, StoreAllSchedule(Gpt2Step())),
              HasSubstr("leave --recompute-granularity unset"));
}

TEST(EmitMegatron, SaysWhatItCannotExpress) {
  const std::string scattered = Emit(EmitFormat::kMegatron, LayersSchedule({1, 3}));
  EXPECT_THAT(scattered, HasSubstr("Cannot be expressed: the plan checkpoints layers 1, 3;"));
  EXPECT_THAT(scattered, Not(HasSubstr("\n--recompute-granularity")));
  const std::string hybrid = Emit(EmitFormat::kMegatron, HybridSchedule());
  EXPECT_THAT(hybrid, HasSubstr("Cannot be expressed: the activations of"));
  EXPECT_THAT(hybrid, HasSubstr("the recompute flags do not offload"));
}

TEST(EmitDeepSpeed, BlockCountsThePlansSegments) {
  const nlohmann::json full = DeepSpeedJson(Emit(EmitFormat::kDeepSpeed, ModeSchedule(CheckpointMode::kFull)));
  const nlohmann::json& ac = full["activation_checkpointing"];
  EXPECT_EQ(ac["number_checkpoints"], 4);
  EXPECT_EQ(ac["cpu_checkpointing"], false);
  EXPECT_EQ(ac["partition_activations"], false);
  EXPECT_EQ(ac["contiguous_memory_optimization"], false);
  EXPECT_EQ(ac["synchronize_checkpoint_boundary"], false);
  EXPECT_EQ(ac["profile"], false);
  const std::string every2 = Emit(EmitFormat::kDeepSpeed, ModeSchedule(CheckpointMode::kEveryK, 2));
  EXPECT_EQ(DeepSpeedJson(every2)["activation_checkpointing"]["number_checkpoints"], 2);
  EXPECT_THAT(every2, HasSubstr("Call it once per segment of the plan, 2 in all: layers 0-1, 2-3."));
  EXPECT_TRUE(DeepSpeedJson(Emit(EmitFormat::kDeepSpeed, StoreAllSchedule(Gpt2Step())))
                  ["activation_checkpointing"]["number_checkpoints"].is_null());
}

TEST(EmitDeepSpeed, CpuCheckpointingWhenSegmentInputsAreOffloaded) {
  StackPlan plan = Classified(ModeSchedule(CheckpointMode::kFull));
  EXPECT_EQ(DeepSpeedActivationCheckpointing(plan)["activation_checkpointing"]["cpu_checkpointing"], false);
  plan.segments[1].input_offloaded = true;
  EXPECT_EQ(DeepSpeedActivationCheckpointing(plan)["activation_checkpointing"]["cpu_checkpointing"], true);
}

TEST(EmitDeepSpeed, SaysWhatItCannotExpress) {
  EXPECT_THAT(Emit(EmitFormat::kDeepSpeed, ModeSchedule(CheckpointMode::kSelective)),
              HasSubstr("Cannot be expressed: selective recomputation of the attention core in layers 0-3"));
  EXPECT_THAT(Emit(EmitFormat::kDeepSpeed, HybridSchedule()), HasSubstr("Cannot be expressed: offloading"));
}

TEST(EmitTorchBudget, FractionOfSavedBytesKept) {
  const StackPlan store_all = Classified(StoreAllSchedule(Gpt2Step()));
  const StackPlan selective = Classified(ModeSchedule(CheckpointMode::kSelective));
  const StackPlan full = Classified(ModeSchedule(CheckpointMode::kFull));
  EXPECT_EQ(ActivationMemoryBudget(store_all), 1.0);
  EXPECT_LT(ActivationMemoryBudget(selective), 1.0);
  EXPECT_LT(ActivationMemoryBudget(full), ActivationMemoryBudget(selective));
  EXPECT_GE(ActivationMemoryBudget(full), 0.0);
  // Rounded down: never more than the plan keeps.
  EXPECT_LE(ActivationMemoryBudget(full),
            static_cast<double>(full.all.kept) / static_cast<double>(full.all.total()));
  const std::string out = Unwrapped(EmitPlan(EmitFormat::kTorchBudget, full, {.title = "t"}));
  EXPECT_THAT(out, HasSubstr(absl::StrFormat("torch._functorch.config.activation_memory_budget = %.2f\n",
                                             ActivationMemoryBudget(full))));
  EXPECT_THAT(out, HasSubstr("model = torch.compile(model)"));
  EXPECT_THAT(EmitPlan(EmitFormat::kTorchBudget, store_all, {.title = "t"}), HasSubstr("nothing to set"));
  EXPECT_THAT(Emit(EmitFormat::kTorchBudget, HybridSchedule()), HasSubstr("count as not kept"));
}

}  // namespace
}  // namespace headroom

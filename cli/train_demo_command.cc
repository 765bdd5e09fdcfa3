// `headroom train-demo [--model gpt|mlp] [--budget BYTES|N%] [--strategy S |
// --plan FILE] [--steps N]`: trains a demo model on the CPU reference under a
// plan the budget forces, beside the same steps without one, and prints the
// loss, predicted against measured memory, and the plan's time overhead
// (executor/train_demo.h). --graph-out writes the model's graph JSON, which
// `headroom plan` reads to make a plan file for --plan.
#include <cmath>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "allocator/alloc_conf.h"
#include "cli/command.h"
#include "cli/job_flags.h"
#include "cli/output_files.h"
#include "common/json_fields.h"
#include "common/quote.h"
#include "common/status_macros.h"
#include "executor/train_demo.h"
#include "models/graph_json.h"

namespace headroom::cli {
namespace {

struct TrainDemoFlags {
  std::string model = "gpt";
  // Unset means the model's default; a value given is checked, so `--layers 0`
  // is refused rather than read as "not given".
  std::optional<int64_t> layers, hidden, heads, seq, batch, vocab;
  std::string budget;  // default: 60%, or the plan file's
  std::string strategy = "hybrid";
  std::string plan;
  std::string alloc_conf;
  int steps = 20;
  float lr = ExecutorOptions{}.learning_rate;
  std::string graph_out;
  bool json = false;
};

absl::StatusOr<DemoModel> BuildModel(const TrainDemoFlags& f) {
  for (const auto& [flag, value] : {std::pair{"--layers", f.layers}, std::pair{"--hidden", f.hidden},
                                    std::pair{"--heads", f.heads}, std::pair{"--seq", f.seq},
                                    std::pair{"--vocab", f.vocab}, std::pair{"--batch", f.batch}}) {
    if (value && *value < 1) {
      return absl::InvalidArgumentError(absl::StrFormat("%s %d: must be 1 or more", flag, *value));
    }
  }
  if (f.model == "gpt") {
    const DemoGptOptions d;
    return BuildDemoGpt({.batch = f.batch.value_or(d.batch), .seq = f.seq.value_or(d.seq),
                         .vocab = f.vocab.value_or(d.vocab), .hidden = f.hidden.value_or(d.hidden),
                         .heads = f.heads.value_or(d.heads), .layers = f.layers.value_or(d.layers)});
  }
  if (f.model == "mlp") {
    if (f.heads || f.seq || f.vocab) {
      return absl::InvalidArgumentError("--heads, --seq, --vocab: the MLP has none; they apply to --model gpt");
    }
    const DemoMlpOptions d;
    return BuildDemoMlp({.batch = f.batch.value_or(d.batch), .hidden = f.hidden.value_or(d.hidden),
                         .layers = f.layers.value_or(d.layers)});
  }
  return absl::InvalidArgumentError(
      absl::StrFormat("--model %s: the demo trains 'gpt' or 'mlp'", QuoteForError(f.model)));
}

absl::Status RunTrainDemoCommand(const TrainDemoFlags& f, std::ostream& out) {
  if (!(f.lr >= 0 && std::isfinite(f.lr))) {
    return absl::InvalidArgumentError(absl::StrFormat("--lr: %g is not a finite, non-negative learning rate", f.lr));
  }
  HEADROOM_RETURN_IF_ERROR(CheckOutputFiles({{"--graph-out", f.graph_out}}, {{"--plan", f.plan}}));
  HEADROOM_ASSIGN_OR_RETURN(const DemoModel model, BuildModel(f));
  TrainDemoOptions options{.steps = f.steps, .executor = {.learning_rate = f.lr}};
  absl::StatusOr<AllocatorOptions> allocator = ResolveAllocConf(f.alloc_conf);
  if (!allocator.ok()) return absl::InvalidArgumentError(absl::StrCat("--alloc-conf ", allocator.status().message()));
  options.job = DemoJob(*allocator);
  if (!f.plan.empty()) {
    HEADROOM_ASSIGN_OR_RETURN(const std::string text, ReadTextFile(f.plan, kPlanFile));
    HEADROOM_ASSIGN_OR_RETURN(options.plan_file, ParsePlanFile(text, f.plan));
    options.plan_source = f.plan;
    options.budget_bytes = options.plan_file->budget_bytes;
  } else {
    absl::StatusOr<Strategy> strategy = ParseStrategy(f.strategy);
    if (!strategy.ok()) return absl::InvalidArgumentError(absl::StrCat("--strategy: ", strategy.status().message()));
    options.strategy = *strategy;
  }
  if (f.budget.empty()) {
    // 60% of the store-all peak, or the plan file's budget.
  } else if (f.budget.ends_with('%')) {
    HEADROOM_ASSIGN_OR_RETURN(options.budget_fraction, ParseBudgetShareFlag(f.budget));
    options.budget_bytes.reset();
  } else {
    HEADROOM_ASSIGN_OR_RETURN(options.budget_bytes, ParseBudgetFlag(f.budget));
  }
  if (!f.graph_out.empty()) {
    HEADROOM_RETURN_IF_ERROR(WriteTextFile(f.graph_out, SaveGraphJson(model.forward), "--graph-out"));
  }
  HEADROOM_ASSIGN_OR_RETURN(const TrainDemoReport report, RunTrainDemo(model, options));
  if (f.json) {
    out << TrainDemoJson(report).dump(2) << "\n";
  } else {
    out << FormatTrainDemo(report);
  }
  return absl::OkStatus();
}

}  // namespace

Subcommand AddTrainDemoCommand(CLI::App& root) {
  auto f = std::make_shared<TrainDemoFlags>();
  CLI::App* app = root.add_subcommand(
      "train-demo", "Train a demo model on the CPU reference under a plan, and check the plan's predictions");
  app->add_option("--model", f->model, "gpt (a small GPT-style transformer, default) or mlp");
  app->add_option("--layers", f->layers, "Blocks (gpt: 4) or hidden layers (mlp: 3)");
  app->add_option("--hidden", f->hidden, "Hidden size (gpt: 64, mlp: 128)");
  app->add_option("--heads", f->heads, "Attention heads (gpt: 4)");
  app->add_option("--seq", f->seq, "Tokens per sequence (gpt: 32)");
  app->add_option("--vocab", f->vocab, "Vocabulary (gpt: 64)");
  app->add_option("--batch", f->batch, "Sequences (gpt: 4) or samples (mlp: 512) per step");
  app->add_option("--budget", f->budget,
                  "Bytes for the planned tensors (activations, gradients, temporaries), or N% of the store-all "
                  "peak (default 60%, or the --plan file's budget)");
  app->add_option("--strategy", f->strategy, "Planner strategy (default hybrid; see 'headroom plan --compare')");
  app->add_option("--plan", f->plan,
                  "Run this plan file ('headroom plan <graph-out file> --precision fp32 --optimizer sgd-momentum "
                  "--out FILE') instead of planning");
  app->add_option("--steps", f->steps, "Training steps (default 20)");
  app->add_option("--lr", f->lr, "SGD learning rate (momentum 0.9)");
  app->add_option("--alloc-conf", f->alloc_conf, "Caching allocator configuration (PYTORCH_CUDA_ALLOC_CONF syntax)");
  AddOutputOption(*app, "--graph-out", f->graph_out, "Write the model's forward graph as Headroom graph JSON");
  app->add_flag("--json", f->json, "Print a JSON object (exact bytes)");
  return {app, [f](std::ostream& out) { return RunTrainDemoCommand(*f, out); }};
}

}  // namespace headroom::cli

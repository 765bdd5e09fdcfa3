// `headroom estimate --model M [setup flags] --gpu NAME | --budget BYTES`:
// the per-GPU memory budget of a training or inference job, the verdict,
// the largest micro-batch and longest sequence that fit, and the cheapest
// changes that make it fit (estimators/memory_estimate.h, fit_search.h;
// printed by report/estimate_report.h). --trace-out writes the allocation
// sequence the estimate replayed through the caching allocator as an RMM
// CSV trace, for `headroom replay`. --graph-out writes the model's forward
// graph (what the builder made, or the graph file as read) as graph JSON
// (models/GRAPH_FORMAT.md), to compare with a traced one or edit by hand.
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "cli/command.h"
#include "cli/job_flags.h"
#include "cli/output_files.h"
#include "cli/serving_flags.h"
#include "common/status_macros.h"
#include "common/units.h"
#include "estimators/estimate_stages.h"
#include "estimators/fit_search.h"
#include "estimators/memory_estimate.h"
#include "hardware/gpu_catalog.h"
#include "models/graph_json.h"
#include "models/model_source.h"
#include "report/emit_config.h"
#include "replay/graph_trace.h"
#include "report/estimate_report.h"
#include "report/serving_report.h"
#include "serving/serving_estimate.h"

namespace headroom::cli {
namespace {

struct EstimateFlags {
  std::string model;
  std::string gpu;
  std::string catalog;
  std::string budget;
  JobFlags job;
  ServingFlags serving;
  bool json = false;
  bool breakdown = false;
  bool no_search = false;
  std::string emit;
  std::string trace_out;
  std::string graph_out;
};

absl::Status WriteForwardGraph(const LoadedModel& model, const JobSpec& job, const std::string& path) {
  absl::StatusOr<Graph> forward = BuildForwardGraph(model, job, ResolveSetup(model, job));
  if (!forward.ok()) return InFlagTerms(forward.status());
  return WriteTextFile(path, SaveGraphJson(*forward), "--graph-out");
}

// The GPU and budget; `catalog` holds a catalog read from --catalog, which
// machine.gpu may point into.
absl::StatusOr<Machine> ToMachine(const EstimateFlags& flags, std::optional<GpuCatalog>& catalog) {
  Machine machine;
  HEADROOM_ASSIGN_OR_RETURN(machine.gpu, FindGpuFlag(flags.gpu, flags.catalog, catalog));
  if (!flags.budget.empty()) {
    HEADROOM_ASSIGN_OR_RETURN(machine.budget, ParseBudgetFlag(flags.budget));
  }
  if (machine.gpu == nullptr && !machine.budget) {
    return absl::InvalidArgumentError("--gpu or --budget: name a GPU (see 'headroom gpus') or give a byte budget");
  }
  return machine;
}

// --engine: what the serving engine holds per GPU and whether it starts (serving/serving_estimate.h).
absl::Status RunServing(const EstimateFlags& flags, std::ostream& out) {
  int tp = flags.job.tp, pp = flags.job.pp;
  if (flags.job.gpus != 1) {
    // --gpus: the engine's GPUs, tensor-parallel unless --tp/--pp say otherwise.
    if (tp == 1 && pp == 1 && !flags.serving.tensor_parallel_size && !flags.serving.pipeline_parallel_size) {
      tp = flags.job.gpus;
    } else if (flags.job.gpus != flags.serving.tensor_parallel_size.value_or(tp) *
                                      flags.serving.pipeline_parallel_size.value_or(pp)) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "--gpus %d: one engine runs on tensor x pipeline parallel GPUs (%d x %d here); for replicas, size one",
          flags.job.gpus, flags.serving.tensor_parallel_size.value_or(tp),
          flags.serving.pipeline_parallel_size.value_or(pp)));
    }
  }
  HEADROOM_ASSIGN_OR_RETURN(ServingOptions options, ToServingOptions(flags.serving, tp, pp));
  std::optional<GpuCatalog> catalog;
  ServingMachine machine;
  HEADROOM_ASSIGN_OR_RETURN(machine.gpu, FindGpuFlag(flags.gpu, flags.catalog, catalog));
  if (!flags.budget.empty()) {
    HEADROOM_ASSIGN_OR_RETURN(machine.total_bytes, ParseBudgetFlag(flags.budget));
  }
  if (machine.gpu == nullptr && !machine.total_bytes) {
    return absl::InvalidArgumentError(
        "--gpu or --budget: name a GPU (see 'headroom gpus') or give the GPU's memory as the CUDA runtime reports it");
  }
  HEADROOM_ASSIGN_OR_RETURN(LoadedModel model, LoadModel(flags.model));
  HEADROOM_ASSIGN_OR_RETURN(ServingEstimate e, EstimateServing(model, options, machine));
  const std::vector<ServingFix> fixes = flags.no_search ? std::vector<ServingFix>{}
                                                        : ServingFixes(model, options, machine, e);
  if (flags.json) {
    out << ServingJson(e, fixes).dump(2) << "\n";
  } else {
    out << ServingText(e, fixes, options.wanted_concurrency);
  }
  return absl::OkStatus();
}

absl::Status RunEstimate(const EstimateFlags& flags, std::ostream& out) {
  if (!flags.serving.engine.empty()) return RunServing(flags, out);
  if (AnyServingFlag(flags.serving)) {
    return absl::InvalidArgumentError(
        "a serving engine's flag (--max-model-len, --gpu-memory-utilization, ...) needs --engine vllm or sglang");
  }
  HEADROOM_ASSIGN_OR_RETURN(JobSpec job, ToJob(flags.job));
  HEADROOM_RETURN_IF_ERROR(CheckOutputFiles({{"--trace-out", flags.trace_out}, {"--graph-out", flags.graph_out}},
                                            {{"--model", flags.model}, {"--catalog", flags.catalog}}));
  std::optional<GpuCatalog> catalog;
  HEADROOM_ASSIGN_OR_RETURN(Machine machine, ToMachine(flags, catalog));
  std::optional<ConfigFormat> emit;
  if (!flags.emit.empty()) {
    absl::StatusOr<ConfigFormat> format = ParseConfigFormat(flags.emit);
    if (!format.ok()) return absl::InvalidArgumentError(absl::StrCat("--emit: ", format.status().message()));
    emit = *format;
  }
  HEADROOM_ASSIGN_OR_RETURN(LoadedModel model, LoadModel(flags.model));
  ApplyModelDefaults(flags.job, model, job);
  AllocationTrace replayed;
  absl::StatusOr<MemoryEstimate> estimated =
      EstimateMemory(model, job, machine, flags.trace_out.empty() ? nullptr : &replayed);
  if (!estimated.ok()) return InFlagTerms(estimated.status());
  const MemoryEstimate& e = *estimated;
  if (!flags.trace_out.empty()) {
    HEADROOM_RETURN_IF_ERROR(WriteTextFile(flags.trace_out, FormatRmmLog(replayed), "--trace-out"));
  }
  if (!flags.graph_out.empty()) HEADROOM_RETURN_IF_ERROR(WriteForwardGraph(model, job, flags.graph_out));
  if (emit) {
    out << EmitConfig(*emit, job, model);
    return absl::OkStatus();
  }

  EstimateReport report{.model = &model, .job = &job, .machine = &machine, .estimate = &e,
                        .searched = !flags.no_search, .breakdown = flags.breakdown};
  if (!flags.no_search) {
    absl::StatusOr<FitLimits> limits = FindLimits(model, job, machine);
    if (!limits.ok()) return InFlagTerms(limits.status());
    report.limits = *limits;
    if (!e.fits()) {
      absl::StatusOr<std::vector<Fix>> fixes = RankFixes(model, job, machine, e);
      if (!fixes.ok()) return InFlagTerms(fixes.status());
      report.fixes = *std::move(fixes);
    }
  }
  for (const Fix& fix : report.fixes) report.fix_flags.push_back(FlagsForChange(job, fix.job));
  if (flags.json) {
    out << EstimateJson(report).dump(2) << "\n";
  } else {
    out << EstimateText(report);
  }
  return absl::OkStatus();
}

}  // namespace

Subcommand AddEstimateCommand(CLI::App& root) {
  auto f = std::make_shared<EstimateFlags>();
  CLI::App* app = root.add_subcommand(
      "estimate", "Will this job fit on this GPU? Per-GPU memory at the step's peak, verdict and fixes");
  app->add_option("--model", f->model, "Preset name (llama-3-8b, ...), config.json path or graph JSON path")
      ->required();
  app->add_option("--gpu", f->gpu, "GPU name from the catalog (headroom gpus), e.g. H100-80GB");
  app->add_option("--catalog", f->catalog, "Find --gpu in this catalog file instead of the built-in one");
  app->add_option("--budget", f->budget, "Memory budget per GPU instead of a catalog GPU, e.g. 24GiB");
  AddJobFlags(*app, f->job);
  AddServingFlags(*app, f->serving);
  app->add_flag("--json", f->json, "Print a JSON object (exact bytes)");
  app->add_flag("--breakdown", f->breakdown, "List the largest tensors live at the peak");
  app->add_flag("--no-search", f->no_search, "Skip the limits search and the fixes");
  app->add_option("--emit", f->emit, "Print framework settings instead: deepspeed or fsdp");
  AddOutputOption(*app, "--trace-out", f->trace_out,
                  "Write the allocation sequence replayed for reserved memory as an RMM CSV trace "
                  "('headroom replay FILE')");
  AddOutputOption(*app, "--graph-out", f->graph_out,
                  "Write the model's forward graph (before backward and the optimizer are derived) as graph JSON");
  return {app, [f](std::ostream& out) { return RunEstimate(*f, out); }};
}

}  // namespace headroom::cli

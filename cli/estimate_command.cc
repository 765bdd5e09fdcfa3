// `headroom estimate --model M [setup flags] --gpu NAME | --budget BYTES`:
// the per-GPU memory budget of a training or inference job, the verdict,
// the largest micro-batch and longest sequence that fit, and the cheapest
// changes that make it fit (estimators/memory_estimate.h, fit_search.h).
#include <cstdio>
#include <iostream>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "cli/command.h"
#include "common/status_macros.h"
#include "common/text_table.h"
#include "common/units.h"
#include "report/emit_config.h"
#include "estimators/fit_search.h"
#include "estimators/memory_estimate.h"
#include "hardware/gpu_catalog.h"
#include "models/model_source.h"

namespace headroom::cli {
namespace {

struct EstimateFlags {
  std::string model;
  std::string gpu;
  std::string budget;
  int gpus = 1;
  int tp = 1;
  bool sp = false;
  int pp = 1;
  int ep = 1;
  int zero = -1;
  std::string fsdp;
  int shard_group = 8;
  std::string offload = "none";
  std::string precision;  // empty: bf16-mixed for training, bf16 for inference
  std::string optimizer = "adamw";
  std::string optimizer_impl = "foreach";
  int64_t micro_batch = 1;
  int64_t seq = 0;
  int64_t grad_accum = 1;
  std::string attention = "flash";
  std::string checkpoint = "none";
  int checkpoint_every = 1;
  int64_t lora_rank = 0;
  double lora_alpha = 0;
  std::string lora_targets;
  bool qlora = false;
  bool inference = false;
  int64_t context = 0;
  int64_t kv_block_size = 16;
  std::string kv_dtype;
  std::string cuda_context;
  int streams = 1;
  double fragmentation = 0.25;
  bool keep_grads = false;
  std::string head;
  bool json = false;
  bool breakdown = false;
  bool no_search = false;
  std::string emit;
};

absl::StatusOr<JobSpec> ToJob(const EstimateFlags& f) {
  JobSpec job;
  job.training = !f.inference;
  job.micro_batch = f.micro_batch;
  job.seq_len = f.seq;
  job.grad_accum = f.grad_accum;
  if (f.micro_batch < 1) {
    return absl::InvalidArgumentError(absl::StrFormat("--micro-batch: must be at least 1, got %d", f.micro_batch));
  }
  if (f.seq < 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("--seq: must be at least 1 (leave it out for the model's default), got %d", f.seq));
  }
  // Training defaults to autocast mixed precision; inference servers load
  // 16-bit weights, so inference defaults to pure bf16.
  const std::string precision = !f.precision.empty() ? f.precision : f.inference ? "bf16" : "bf16-mixed";
  HEADROOM_ASSIGN_OR_RETURN(job.precision, ParsePrecision(precision));
  HEADROOM_ASSIGN_OR_RETURN(job.optimizer, ParseOptimizer(f.optimizer));
  HEADROOM_ASSIGN_OR_RETURN(job.optimizer_impl, ParseOptimizerImpl(f.optimizer_impl));
  if (f.attention == "flash" || f.attention == "sdpa") {
    job.attention = AttentionImpl::kFlash;
  } else if (f.attention == "eager") {
    job.attention = AttentionImpl::kEager;
  } else {
    return absl::InvalidArgumentError(
        absl::StrFormat("--attention: unknown '%s' (expected flash or eager)", f.attention));
  }
  absl::StatusOr<CheckpointMode> mode = ParseCheckpointMode(f.checkpoint);
  if (!mode.ok()) return absl::InvalidArgumentError(absl::StrCat("--checkpoint: ", mode.status().message()));
  job.checkpoint = *mode;
  job.checkpoint_every = f.checkpoint_every;
  if (f.checkpoint_every > 1 && job.checkpoint == CheckpointMode::kOff) job.checkpoint = CheckpointMode::kEveryK;

  if (f.lora_rank < 0) {
    return absl::InvalidArgumentError(absl::StrFormat("--lora-rank: must be positive, got %d", f.lora_rank));
  }
  if (f.qlora && f.lora_rank == 0) {
    return absl::InvalidArgumentError("--qlora: needs --lora-rank (e.g. --lora-rank 16)");
  }
  job.lora.rank = f.lora_rank;
  job.lora.alpha = f.lora_alpha > 0 ? f.lora_alpha : 2.0 * static_cast<double>(f.lora_rank);
  if (!f.lora_targets.empty()) {
    for (absl::string_view t : absl::StrSplit(f.lora_targets, ',', absl::SkipEmpty())) {
      job.lora.target_modules.emplace_back(t);
    }
  }
  job.lora.quantize_base_nf4 = f.qlora;

  ParallelLayout& layout = job.layout;
  layout.gpus = f.gpus;
  layout.tensor_parallel = f.tp;
  layout.sequence_parallel = f.sp;
  layout.pipeline_parallel = f.pp;
  layout.expert_parallel = f.ep;
  layout.hybrid_shard_group = f.shard_group;
  if (f.zero >= 0 && !f.fsdp.empty()) {
    return absl::InvalidArgumentError("--zero and --fsdp: choose one sharding framework");
  }
  if (f.zero == 0) layout.deepspeed_stage0 = true;
  if (f.zero > 0) {
    if (f.zero > 3) return absl::InvalidArgumentError(absl::StrFormat("--zero: stage must be 0-3, got %d", f.zero));
    layout.sharding = f.zero == 1 ? Sharding::kZero1 : f.zero == 2 ? Sharding::kZero2 : Sharding::kZero3;
  }
  if (!f.fsdp.empty()) {
    if (f.fsdp == "full") {
      layout.sharding = Sharding::kFsdpFull;
    } else if (f.fsdp == "hybrid") {
      layout.sharding = Sharding::kFsdpHybrid;
    } else {
      return absl::InvalidArgumentError(absl::StrFormat("--fsdp: unknown '%s' (expected full or hybrid)", f.fsdp));
    }
  }
  if (f.offload == "optimizer") {
    layout.offload_optimizer = true;
  } else if (f.offload == "params" || f.offload == "all") {
    layout.offload_optimizer = layout.offload_params = true;
  } else if (f.offload != "none") {
    return absl::InvalidArgumentError(
        absl::StrFormat("--offload: unknown '%s' (expected none, optimizer or all)", f.offload));
  }

  job.context = f.context;
  job.kv_block_size = f.kv_block_size;
  if (!f.kv_dtype.empty()) {
    absl::StatusOr<DType> d = ParseDType(f.kv_dtype);
    if (!d.ok()) return absl::InvalidArgumentError(absl::StrCat("--kv-dtype: ", d.status().message()));
    job.kv_dtype = *d;
  }
  if (f.context > 0 && !f.inference) {
    return absl::InvalidArgumentError("--context: a KV cache is for inference; add --inference");
  }
  if (!f.cuda_context.empty()) {
    absl::StatusOr<uint64_t> bytes = ParseBytes(f.cuda_context);
    if (!bytes.ok()) return absl::InvalidArgumentError(absl::StrCat("--cuda-context: ", bytes.status().message()));
    job.overheads.cuda_context = *bytes;
  }
  job.overheads.streams = f.streams;
  job.overheads.fragmentation_fraction = f.fragmentation;
  job.keep_gradients = f.keep_grads;
  if (!f.head.empty()) {
    if (f.head == "classification") {
      job.encoder_head = EncoderHead::kSequenceClassification;
    } else if (f.head == "mlm") {
      job.encoder_head = EncoderHead::kMaskedLm;
    } else {
      return absl::InvalidArgumentError(absl::StrFormat("--head: unknown '%s' (expected classification or mlm)", f.head));
    }
  }
  return job;
}

std::string Share(uint64_t part, uint64_t total) {
  return total == 0 ? "-" : absl::StrFormat("%.1f%%", 100.0 * static_cast<double>(part) / static_cast<double>(total));
}

std::string Params(uint64_t n) {
  if (n >= 1000000000) return absl::StrFormat("%.2f B", static_cast<double>(n) / 1e9);
  if (n >= 1000000) return absl::StrFormat("%.1f M", static_cast<double>(n) / 1e6);
  return absl::StrCat(n);
}

std::string Seconds(double s) {
  if (s <= 0) return "-";
  if (s < 1) return absl::StrFormat("%.0f ms", s * 1e3);
  return absl::StrFormat("%.2f s", s);
}

std::string Shape(const std::vector<int64_t>& shape) { return absl::StrCat("[", absl::StrJoin(shape, ", "), "]"); }

std::string SetupLine(const JobSpec& job, const MemoryEstimate& e) {
  std::string mode = job.training ? (job.lora.enabled() ? (job.lora.quantize_base_nf4 ? "QLoRA" : "LoRA")
                                                        : "full training")
                                  : "inference";
  std::string s = absl::StrFormat("%s, %s, ", mode, PrecisionName(job.precision));
  if (job.training) {
    absl::StrAppend(&s, std::string(OptimizerName(job.optimizer)), " (",
                    std::string(OptimizerImplName(job.optimizer_impl)), "), ");
  }
  absl::StrAppend(&s, "micro-batch ", job.micro_batch);
  if (e.seq_len > 0) absl::StrAppend(&s, " x seq ", e.seq_len);
  if (job.training) {
    absl::StrAppend(&s, ", grad-accum ", job.grad_accum, ", ", std::string(AttentionImplName(job.attention)),
                    " attention, checkpointing ", std::string(CheckpointModeName(job.checkpoint)));
  } else if (job.context > 0) {
    absl::StrAppend(&s, ", KV cache for ", job.context, " tokens");
  }
  return s;
}

nlohmann::json EstimateJson(const MemoryEstimate& e) {
  nlohmann::json bytes = nlohmann::json::object();
  for (const BudgetRow& row : e.rows()) bytes[row.key] = row.bytes;
  nlohmann::json j = {
      {"total_bytes", e.total_bytes()},
      {"capacity_bytes", e.capacity},
      {"fits", e.fits()},
      {"spare_bytes", e.spare_bytes()},
      {"bytes", bytes},
      {"host_bytes", e.host_bytes},
      {"framework", e.framework},
      {"pipeline_stage", e.pipeline_stage},
      {"step_seconds", e.step_seconds},
  };
  return j;
}

void PrintTable(const MemoryEstimate& e, std::ostream& out) {
  TextTable table({"category", "bytes", "share"}, {Align::kLeft, Align::kRight, Align::kRight});
  const uint64_t total = e.total_bytes();
  for (const BudgetRow& row : e.rows()) table.AddRow({row.label, FormatBytes(row.bytes), Share(row.bytes, total)});
  table.AddSeparator();
  table.AddRow({"total at the peak", FormatBytes(total), "100.0%"});
  table.AddRow({"GPU memory", FormatBytes(e.capacity), ""});
  out << table.Render();
}

absl::Status RunEstimate(const EstimateFlags& flags, std::ostream& out) {
  HEADROOM_ASSIGN_OR_RETURN(JobSpec job, ToJob(flags));
  Machine machine;
  if (!flags.gpu.empty()) {
    HEADROOM_ASSIGN_OR_RETURN(machine.gpu, GpuCatalog::Builtin().Find(flags.gpu));
  }
  if (!flags.budget.empty()) {
    absl::StatusOr<uint64_t> budget = ParseBytes(flags.budget);
    if (!budget.ok()) return absl::InvalidArgumentError(absl::StrCat("--budget: ", budget.status().message()));
    if (*budget == 0) return absl::InvalidArgumentError("--budget: must be positive");
    machine.budget = *budget;
  }
  if (machine.gpu == nullptr && !machine.budget) {
    return absl::InvalidArgumentError("--gpu or --budget: name a GPU (see 'headroom gpus') or give a byte budget");
  }
  HEADROOM_ASSIGN_OR_RETURN(LoadedModel model, LoadModel(flags.model));
  HEADROOM_ASSIGN_OR_RETURN(MemoryEstimate e, EstimateMemory(model, job, machine));

  if (flags.emit == "deepspeed") {
    out << DeepSpeedConfig(job).dump(2) << "\n";
    return absl::OkStatus();
  }
  if (flags.emit == "fsdp") {
    out << FsdpSettings(job, BlockClassFor(model.config ? model.config->architecture : ""));
    return absl::OkStatus();
  }
  if (!flags.emit.empty()) {
    return absl::InvalidArgumentError(absl::StrFormat("--emit: unknown '%s' (expected deepspeed or fsdp)", flags.emit));
  }

  std::optional<FitLimits> limits;
  std::vector<Fix> fixes;
  if (!flags.no_search) {
    HEADROOM_ASSIGN_OR_RETURN(limits, FindLimits(model, job, machine));
    if (!e.fits()) {
      HEADROOM_ASSIGN_OR_RETURN(fixes, RankFixes(model, job, machine, e));
    }
  }

  const std::string arch = model.config ? model.config->architecture : "graph";
  if (flags.json) {
    nlohmann::json j = EstimateJson(e);
    j["schema_version"] = 1;
    j["model"] = {{"name", model.name}, {"architecture", arch}, {"parameters", e.parameters},
                  {"trainable_parameters", e.trainable_parameters}};
    j["setup"] = {{"training", job.training}, {"precision", PrecisionName(job.precision)},
                  {"optimizer", OptimizerName(job.optimizer)},
                  {"optimizer_impl", OptimizerImplName(job.optimizer_impl)},
                  {"micro_batch", job.micro_batch}, {"seq_len", e.seq_len},
                  {"grad_accum", job.grad_accum}, {"attention", AttentionImplName(job.attention)},
                  {"checkpoint", CheckpointModeName(job.checkpoint)},
                  {"layout", job.layout.Describe()}, {"gpus", job.layout.gpus}};
    j["gpu"] = machine.gpu != nullptr ? nlohmann::json(machine.gpu->name) : nlohmann::json(nullptr);
    j["cuda_context_source"] = e.overheads.cuda_context_source;
    j["peak"] = {{"op", e.peak_op}, {"phase", e.peak_phase}};
    if (limits) {
      j["limits"] = {{"max_micro_batch", limits->max_micro_batch},
                     {"max_micro_batch_capped", limits->micro_batch_capped},
                     {"max_seq_len", limits->max_seq_len},
                     {"max_seq_len_capped", limits->seq_len_capped}};
    }
    nlohmann::json fj = nlohmann::json::array();
    for (const Fix& fix : fixes) {
      fj.push_back({{"change", fix.change}, {"flags", fix.flags}, {"kind", FixKindName(fix.kind)},
                    {"total_bytes", fix.estimate.total_bytes()}, {"spare_bytes", fix.estimate.spare_bytes()},
                    {"host_bytes", fix.estimate.host_bytes}, {"gpus", fix.job.layout.gpus},
                    {"step_seconds", fix.step_seconds}, {"relative_time_per_sample", fix.relative_time},
                    {"note", fix.note}});
    }
    j["fixes"] = fj;
    if (flags.breakdown) {
      nlohmann::json live = nlohmann::json::array();
      for (const LiveTensorInfo& t : e.largest_live) {
        live.push_back({{"name", t.name}, {"role", t.role}, {"dtype", t.dtype}, {"shape", t.shape}, {"bytes", t.bytes}});
      }
      j["largest_live"] = live;
    }
    out << j.dump(2) << "\n";
    return absl::OkStatus();
  }

  out << absl::StrFormat("model:  %s (%s, %s parameters%s", model.name, arch, Params(e.parameters),
                         job.layout.tensor_parallel > 1 ? " per tensor-parallel rank" : "");
  if (job.training && e.trainable_parameters != e.parameters) out << ", " << Params(e.trainable_parameters) << " trainable";
  out << ")\n";
  if (model.config) {
    out << "setup:  " << SetupLine(job, e) << "\n";
  } else {
    out << "setup:  a fixed graph: its tensors, dtypes and shapes are taken as given (precision, "
           "batch and sequence flags do not apply)\n";
  }
  out << "layout: " << job.layout.Describe() << " [" << e.framework << "]";
  if (job.layout.pipeline_parallel > 1) out << ", worst stage " << e.pipeline_stage;
  out << "\n";
  out << "GPU:    "
      << (machine.gpu != nullptr ? absl::StrFormat("%s, %s", machine.gpu->name, FormatBytes(machine.gpu->memory_bytes))
                                 : std::string("(none)"));
  if (machine.budget) out << "; budget " << FormatBytes(*machine.budget);
  out << "\n\n";
  PrintTable(e, out);
  if (e.host_bytes > 0) out << "host memory (offloaded, per GPU rank): " << FormatBytes(e.host_bytes) << "\n";
  out << "\n";
  if (e.fits()) {
    out << "verdict: FITS with " << FormatBytes(static_cast<uint64_t>(e.spare_bytes())) << " to spare\n";
  } else {
    out << absl::StrFormat("verdict: DOES NOT FIT: short by %s (needs %.2fx this GPU's memory)\n",
                           FormatBytes(static_cast<uint64_t>(-e.spare_bytes())),
                           static_cast<double>(e.total_bytes()) / static_cast<double>(e.capacity));
  }
  out << "peak:    " << e.peak_op << " (" << e.peak_phase << ")";
  if (e.step_seconds > 0) out << "; roofline step time " << Seconds(e.step_seconds);
  out << "\n";
  if (limits) {
    out << "limits:  ";
    if (limits->max_micro_batch == 0) {
      out << "no micro-batch fits";
    } else {
      out << "largest micro-batch " << limits->max_micro_batch << (limits->micro_batch_capped ? "+" : "");
    }
    if (limits->has_sequence) {
      out << " at seq " << e.seq_len << "; ";
      if (limits->max_seq_len == 0) {
        out << "no sequence length fits";
      } else {
        out << "longest sequence " << limits->max_seq_len
            << (limits->seq_len_capped ? " (the model's maximum)" : "");
      }
      out << " at micro-batch " << job.micro_batch;
    }
    out << "\n";
  }
  if (!fixes.empty()) {
    out << "\ncheapest changes that make it fit (best first):\n";
    TextTable table({"#", "change", "kind", "peak/GPU", "spare", "host/GPU", "time/sample"},
                    {Align::kRight, Align::kLeft, Align::kLeft, Align::kRight, Align::kRight, Align::kRight,
                     Align::kRight});
    std::string how;
    int rank = 0;
    for (const Fix& fix : fixes) {
      if (++rank > 8) break;
      std::string time = fix.relative_time > 0 ? absl::StrFormat("%+.0f%%", (fix.relative_time - 1) * 100) : "-";
      table.AddRow({absl::StrCat(rank), fix.change, std::string(FixKindName(fix.kind)),
                    FormatBytes(fix.estimate.total_bytes()),
                    FormatBytes(static_cast<uint64_t>(fix.estimate.spare_bytes())),
                    fix.estimate.host_bytes > 0 ? FormatBytes(fix.estimate.host_bytes) : "-", time});
      absl::StrAppend(&how, absl::StrFormat("  %d: %s", rank, fix.flags));
      if (!fix.note.empty()) absl::StrAppend(&how, "   (", fix.note, ")");
      absl::StrAppend(&how, "\n");
    }
    out << table.Render() << "flags:\n" << how;
    out << "time/sample: roofline step time per sample relative to the current setup; kinds: exact = same\n"
           "training, approximate = changed numerics, different job = trains something else, more GPUs.\n";
  } else if (!e.fits() && !flags.no_search) {
    out << "\nno single change in the search (checkpointing, micro-batch, 8-bit optimizer, ZeRO/FSDP,\n"
           "offload, LoRA/QLoRA, up to 1024 GPUs) makes it fit.\n";
  }
  if (flags.breakdown) {
    out << "\nlargest tensors live at the peak (" << e.peak_op << "):\n";
    TextTable live({"tensor", "role", "dtype", "shape", "bytes"},
                   {Align::kLeft, Align::kLeft, Align::kLeft, Align::kLeft, Align::kRight});
    for (const LiveTensorInfo& t : e.largest_live) {
      live.AddRow({t.name, t.role, t.dtype, Shape(t.shape), FormatBytes(t.bytes)});
    }
    out << live.Render();
  }
  out << "\nIncludes the CUDA context (" << FormatBytes(e.overheads.cuda_context)
      << ", --cuda-context to override) and a "
      << absl::StrFormat("%.0f%%", flags.fragmentation * 100)
      << " fragmentation allowance on dynamic bytes (--fragmentation).\n";
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
  app->add_option("--budget", f->budget, "Memory budget per GPU instead of a catalog GPU, e.g. 24GiB");
  app->add_option("--gpus", f->gpus, "Total GPUs (data parallel = gpus / (tp * pp))");
  app->add_option("--tp", f->tp, "Tensor parallel degree");
  app->add_flag("--sp", f->sp, "Sequence parallel (with --tp)");
  app->add_option("--pp", f->pp, "Pipeline parallel degree (1F1B)");
  app->add_option("--ep", f->ep, "Expert parallel degree (MoE)");
  app->add_option("--zero", f->zero, "DeepSpeed ZeRO stage 0-3");
  app->add_option("--fsdp", f->fsdp, "FSDP sharding: full or hybrid");
  app->add_option("--shard-group", f->shard_group, "GPUs per FSDP hybrid shard group (default 8)");
  app->add_option("--offload", f->offload, "CPU offload: none, optimizer or all (parameters too)");
  app->add_option("--precision", f->precision, "fp32, tf32, fp16-mixed, bf16-mixed (training default), bf16 (inference default), fp16, fp8");
  app->add_option("--optimizer", f->optimizer, "adamw (default), adam8bit, sgd-momentum, sgd, adafactor, lion");
  app->add_option("--optimizer-impl", f->optimizer_impl, "foreach (PyTorch default), for-loop or fused");
  app->add_option("--micro-batch,--batch", f->micro_batch, "Samples per GPU per forward/backward (default 1)");
  app->add_option("--seq", f->seq, "Sequence length (default: the model's maximum, at most 4096)");
  app->add_option("--grad-accum", f->grad_accum, "Micro-batches per optimizer step (default 1)");
  app->add_option("--attention", f->attention, "flash (default) or eager");
  app->add_option("--checkpoint", f->checkpoint, "Activation checkpointing: none, full, every-k, selective");
  app->add_option("--checkpoint-every", f->checkpoint_every, "Layers per checkpointed segment (every-k)");
  app->add_option("--lora-rank", f->lora_rank, "LoRA rank (0: full fine-tuning)");
  app->add_option("--lora-alpha", f->lora_alpha, "LoRA alpha (default 2 x rank)");
  app->add_option("--lora-targets", f->lora_targets, "Comma-separated target modules (default: q/v projections)");
  app->add_flag("--qlora", f->qlora, "NF4 base weights with double quantization (QLoRA)");
  app->add_flag("--inference", f->inference, "Inference instead of training");
  app->add_option("--context", f->context, "Inference: KV-cache tokens per sequence");
  app->add_option("--kv-block-size", f->kv_block_size, "Paged KV block size in tokens (vLLM: 16; 0: contiguous)");
  app->add_option("--kv-dtype", f->kv_dtype, "KV cache dtype (default: compute dtype), e.g. fp8");
  app->add_option("--cuda-context", f->cuda_context, "CUDA context size, e.g. 1343MiB (default per GPU generation)");
  app->add_option("--streams", f->streams, "Compute streams, each with a cuBLAS workspace (default 1)");
  app->add_option("--fragmentation", f->fragmentation, "Fragmentation allowance as a fraction of dynamic bytes (0.25)");
  app->add_flag("--keep-grads", f->keep_grads, "zero_grad(set_to_none=False): gradients stay between steps");
  app->add_option("--head", f->head, "Encoders: classification or mlm head");
  app->add_flag("--json", f->json, "Print a JSON object (exact bytes)");
  app->add_flag("--breakdown", f->breakdown, "List the largest tensors live at the peak");
  app->add_flag("--no-search", f->no_search, "Skip the limits search and the fixes");
  app->add_option("--emit", f->emit, "Print framework settings instead: deepspeed or fsdp");
  return {app, [f](std::ostream& out) { return RunEstimate(*f, out); }};
}

}  // namespace headroom::cli

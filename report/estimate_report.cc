#include "report/estimate_report.h"

#include <cstdint>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/text_table.h"
#include "common/units.h"

namespace headroom {
namespace {

// At most this many fixes are listed in the text report (JSON has all).
constexpr int kFixesShown = 8;

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

std::string Architecture(const LoadedModel& model) { return model.config ? model.config->architecture : "graph"; }

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

// model, setup, layout and GPU lines.
void WriteHeader(const EstimateReport& r, std::ostream& out) {
  const LoadedModel& model = *r.model;
  const JobSpec& job = *r.job;
  const MemoryEstimate& e = *r.estimate;
  out << absl::StrFormat("model:  %s (%s, %s parameters%s", model.name, Architecture(model), Params(e.parameters),
                         job.layout.tensor_parallel > 1 ? " per tensor-parallel rank" : "");
  if (job.training && e.trainable_parameters != e.parameters) {
    out << ", " << Params(e.trainable_parameters) << " trainable";
  }
  out << ")\n";
  if (model.config && !model.config->architecture_from.empty()) {
    out << "class:  " << ArchitectureChoice(*model.config) << "\n";
  }
  if (model.config) {
    out << "setup:  " << SetupLine(job, e) << "\n";
  } else {
    out << "setup:  a fixed graph: its tensors, dtypes and shapes are taken as given (precision, "
           "batch and sequence flags do not apply)\n";
  }
  out << "layout: " << job.layout.Describe() << " [" << e.framework << "]";
  if (job.layout.pipeline_parallel > 1) {
    out << ", stage " << e.pipeline_stage
        << (job.layout.pipeline_stage < 0 ? " (the fullest)" : "") << " under "
        << PipelineScheduleName(job.layout.pipeline_schedule);
  }
  out << "\n";
  const Machine& machine = *r.machine;
  out << "GPU:    "
      << (machine.gpu != nullptr ? absl::StrFormat("%s, %s", machine.gpu->name, FormatBytes(machine.gpu->memory_bytes))
                                 : std::string("(none)"));
  if (machine.budget) out << "; budget " << FormatBytes(*machine.budget);
  out << "\n\n";
}

// The allocator configuration as --alloc-conf takes it.
std::string AllocConfLabel(const MemoryEstimate& e) { return e.alloc_conf.empty() ? "pytorch-default" : e.alloc_conf; }

void WriteBudget(const MemoryEstimate& e, std::ostream& out) {
  TextTable table({"category", "bytes", "share"}, {Align::kLeft, Align::kRight, Align::kRight});
  const uint64_t total = e.total_bytes();
  for (const BudgetRow& row : e.rows()) table.AddRow({row.label, FormatBytes(row.bytes), Share(row.bytes, total)});
  table.AddSeparator();
  table.AddRow({"allocated at the peak", FormatBytes(e.allocated_bytes()), Share(e.allocated_bytes(), total)});
  table.AddRow({"reserved at the peak", FormatBytes(e.reserved_bytes()), Share(e.reserved_bytes(), total)});
  table.AddRow({"total (nvidia-smi)", FormatBytes(total), "100.0%"});
  table.AddRow({"GPU memory", FormatBytes(e.capacity), ""});
  out << table.Render();
  if (e.host_bytes > 0) out << "host memory (offloaded, per GPU rank): " << FormatBytes(e.host_bytes) << "\n";
  out << "\n";
}

// Each pipeline stage's allocated peak, when more than one was replayed: all of them up to eight stages, else
// the first, the fullest and the last.
void WriteStages(const MemoryEstimate& e, std::ostream& out) {
  const std::vector<StagePeak>& stages = e.pipeline_stages;
  if (stages.size() < 2) return;
  std::vector<std::string> items;
  for (size_t i = 0; i < stages.size(); ++i) {
    const StagePeak& s = stages[i];
    if (stages.size() > 8 && i != 0 && i + 1 != stages.size() && s.stage != e.pipeline_stage) continue;
    items.push_back(absl::StrFormat("%d: %s (%d in flight)", s.stage, FormatBytes(s.allocated_bytes), s.in_flight));
  }
  out << "stages:  allocated at each stage's peak: " << absl::StrJoin(items, ", ") << (stages.size() > 8 ? ", ..." : "")
      << "\n";
}

void WriteVerdict(const EstimateReport& r, std::ostream& out) {
  const MemoryEstimate& e = *r.estimate;
  if (e.fits()) {
    out << "verdict: FITS with " << FormatBytes(static_cast<uint64_t>(e.spare_bytes())) << " to spare\n";
  } else if (e.spare_bytes() >= 0) {
    // Note [Replay capacity]: the configuration's own limits ran out first.
    out << "verdict: DOES NOT FIT: the allocator runs out within the limits of --alloc-conf " << AllocConfLabel(e)
        << "\n";
  } else {
    out << absl::StrFormat("verdict: DOES NOT FIT: short by %s (needs %.2fx this GPU's memory)\n",
                           FormatBytes(static_cast<uint64_t>(-e.spare_bytes())),
                           static_cast<double>(e.total_bytes()) / static_cast<double>(e.capacity));
  }
  out << "peak:    " << e.peak_op << " (" << e.peak_phase << ")";
  if (e.step_seconds > 0) out << "; roofline step time " << Seconds(e.step_seconds);
  out << "\n";
  WriteStages(e, out);
  if (!r.limits) return;
  const FitLimits& limits = *r.limits;
  out << "limits:  ";
  if (limits.fixed_shape) {
    out << "not searched: a graph's batch and sequence length are the ones it was built or traced with\n";
    return;
  }
  if (limits.max_micro_batch == 0) {
    out << "no micro-batch fits";
  } else {
    out << "largest micro-batch " << limits.max_micro_batch << (limits.micro_batch_capped ? "+" : "");
  }
  if (limits.has_sequence) {
    out << " at seq " << e.seq_len << "; ";
    if (limits.max_seq_len == 0) {
      out << "no sequence length fits";
    } else {
      out << "longest sequence " << limits.max_seq_len << (limits.seq_len_capped ? " (the model's maximum)" : "");
    }
    out << " at micro-batch " << r.job->micro_batch;
  }
  out << "\n";
}

void WriteFixes(const EstimateReport& r, std::ostream& out) {
  if (r.fixes.empty()) {
    if (!r.estimate->fits() && r.searched) {
      out << "\nno single change in the search (checkpointing, micro-batch, 8-bit optimizer, ZeRO/FSDP,\n"
             "offload, LoRA/QLoRA, up to 1024 GPUs) makes it fit.\n";
    }
    return;
  }
  out << "\ncheapest changes that make it fit (best first):\n";
  TextTable table({"#", "change", "kind", "peak/GPU", "spare", "host/GPU", "time/sample"},
                  {Align::kRight, Align::kLeft, Align::kLeft, Align::kRight, Align::kRight, Align::kRight,
                   Align::kRight});
  std::string how;
  for (int rank = 1; rank <= static_cast<int>(r.fixes.size()) && rank <= kFixesShown; ++rank) {
    const Fix& fix = r.fixes[static_cast<size_t>(rank - 1)];
    std::string time = fix.relative_time > 0 ? absl::StrFormat("%+.0f%%", (fix.relative_time - 1) * 100) : "-";
    table.AddRow({absl::StrCat(rank), fix.change, std::string(FixKindName(fix.kind)),
                  FormatBytes(fix.estimate.total_bytes()),
                  FormatBytes(static_cast<uint64_t>(fix.estimate.spare_bytes())),
                  fix.estimate.host_bytes > 0 ? FormatBytes(fix.estimate.host_bytes) : "-", time});
    absl::StrAppend(&how, absl::StrFormat("  %d: %s", rank, r.fix_flags[static_cast<size_t>(rank - 1)]));
    if (!fix.note.empty()) absl::StrAppend(&how, "   (", fix.note, ")");
    absl::StrAppend(&how, "\n");
  }
  out << table.Render() << "flags:\n" << how;
  out << "time/sample: roofline step time per sample relative to the current setup; kinds: exact = same\n"
         "training, approximate = changed numerics, different job = trains something else, more GPUs.\n";
}

void WriteBreakdown(const MemoryEstimate& e, std::ostream& out) {
  out << "\nlargest tensors live at the peak (" << e.peak_op << "):\n";
  TextTable live({"tensor", "role", "dtype", "shape", "bytes"},
                 {Align::kLeft, Align::kLeft, Align::kLeft, Align::kLeft, Align::kRight});
  for (const LiveTensorInfo& t : e.largest_live) {
    live.AddRow({t.name, t.role, t.dtype, Shape(t.shape), FormatBytes(t.bytes)});
  }
  out << live.Render();
}

}  // namespace

std::string EstimateText(const EstimateReport& r) {
  std::ostringstream out;
  const MemoryEstimate& e = *r.estimate;
  WriteHeader(r, out);
  WriteBudget(e, out);
  WriteVerdict(r, out);
  WriteFixes(r, out);
  if (r.breakdown) WriteBreakdown(e, out);
  out << "\nIncludes the CUDA context (" << FormatBytes(e.overheads.cuda_context)
      << ", --cuda-context to override). Allocated and reserved bytes replay the step\n"
         "through PyTorch's caching allocator policy with --alloc-conf "
      << AllocConfLabel(e) << ".\n";
  return out.str();
}

namespace {

nlohmann::json PipelineStagesJson(const MemoryEstimate& e) {
  nlohmann::json stages = nlohmann::json::array();
  for (const StagePeak& s : e.pipeline_stages) {
    stages.push_back({{"stage", s.stage},
                      {"in_flight", s.in_flight},
                      {"allocated_bytes", s.allocated_bytes},
                      {"reserved_bytes", s.reserved_bytes},
                      {"peak", {{"op", s.peak_op}, {"phase", s.peak_phase}}}});
  }
  return stages;
}

}  // namespace

nlohmann::json EstimateJson(const EstimateReport& r) {
  const MemoryEstimate& e = *r.estimate;
  const JobSpec& job = *r.job;
  nlohmann::json bytes = nlohmann::json::object();
  for (const BudgetRow& row : e.rows()) bytes[row.key] = row.bytes;
  nlohmann::json j = {
      {"total_bytes", e.total_bytes()},
      {"allocated_bytes", e.allocated_bytes()},
      {"reserved_bytes", e.reserved_bytes()},
      {"alloc_conf", AllocConfLabel(e)},
      {"capacity_bytes", e.capacity},
      {"fits", e.fits()},
      {"spare_bytes", e.spare_bytes()},
      {"bytes", bytes},
      {"host_bytes", e.host_bytes},
      {"framework", e.framework},
      {"pipeline_stage", e.pipeline_stage},
      {"pipeline_stages", PipelineStagesJson(e)},
      {"step_seconds", e.step_seconds},
  };
  j["schema_version"] = 1;
  j["model"] = {{"name", r.model->name}, {"architecture", Architecture(*r.model)}, {"parameters", e.parameters},
                {"trainable_parameters", e.trainable_parameters}};
  if (r.model->config && !r.model->config->architecture_from.empty()) {
    j["model"]["architecture_from"] = r.model->config->architecture_from;
  }
  j["setup"] = {{"training", job.training}, {"precision", PrecisionName(job.precision)},
                {"optimizer", OptimizerName(job.optimizer)},
                {"optimizer_impl", OptimizerImplName(job.optimizer_impl)},
                {"micro_batch", job.micro_batch}, {"seq_len", e.seq_len},
                {"grad_accum", job.grad_accum}, {"attention", AttentionImplName(job.attention)},
                {"checkpoint", CheckpointModeName(job.checkpoint)},
                {"layout", job.layout.Describe()}, {"gpus", job.layout.gpus}};
  j["gpu"] = r.machine->gpu != nullptr ? nlohmann::json(r.machine->gpu->name) : nlohmann::json(nullptr);
  j["cuda_context_source"] = e.overheads.cuda_context_source;
  j["peak"] = {{"op", e.peak_op}, {"phase", e.peak_phase}};
  if (r.limits && !r.limits->fixed_shape) {
    j["limits"] = {{"max_micro_batch", r.limits->max_micro_batch},
                   {"max_micro_batch_capped", r.limits->micro_batch_capped},
                   {"max_seq_len", r.limits->max_seq_len},
                   {"max_seq_len_capped", r.limits->seq_len_capped}};
  }
  nlohmann::json fixes = nlohmann::json::array();
  for (size_t i = 0; i < r.fixes.size(); ++i) {
    const Fix& fix = r.fixes[i];
    fixes.push_back({{"change", fix.change}, {"flags", r.fix_flags[i]}, {"kind", FixKindName(fix.kind)},
                     {"total_bytes", fix.estimate.total_bytes()}, {"spare_bytes", fix.estimate.spare_bytes()},
                     {"host_bytes", fix.estimate.host_bytes}, {"gpus", fix.job.layout.gpus},
                     {"step_seconds", fix.step_seconds}, {"relative_time_per_sample", fix.relative_time},
                     {"note", fix.note}});
  }
  j["fixes"] = fixes;
  if (r.breakdown) {
    nlohmann::json live = nlohmann::json::array();
    for (const LiveTensorInfo& t : e.largest_live) {
      live.push_back({{"name", t.name}, {"role", t.role}, {"dtype", t.dtype}, {"shape", t.shape}, {"bytes", t.bytes}});
    }
    j["largest_live"] = live;
  }
  return j;
}

}  // namespace headroom

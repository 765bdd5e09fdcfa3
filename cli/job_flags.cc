#include "cli/job_flags.h"

#include <cctype>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "allocator/alloc_conf.h"
#include "common/quote.h"
#include "common/status_macros.h"
#include "common/units.h"

namespace headroom::cli {
namespace {

// JobSpec fields (as the libraries name them in errors) and their flags.
constexpr std::pair<std::string_view, std::string_view> kFieldFlags[] = {
    {"micro_batch", "--micro-batch"},
    {"seq_len", "--seq"},
    {"target_seq_len", "--target-seq"},
    {"grad_accum", "--grad-accum"},
    {"precision", "--precision"},
    {"optimizer", "--optimizer"},
    {"optimizer_impl", "--optimizer-impl"},
    {"ema", "--ema"},
    {"attention", "--attention"},
    {"checkpoint", "--checkpoint"},
    {"checkpoint_every", "--checkpoint-every"},
    {"lora.rank", "--lora-rank"},
    {"lora.alpha", "--lora-alpha"},
    {"lora.target_modules", "--lora-targets"},
    {"lora.quantize_base_nf4", "--qlora"},
    {"training", "--inference"},
    {"context", "--context"},
    {"kv_block_size", "--kv-block-size"},
    {"kv_dtype", "--kv-dtype"},
    {"overheads.cuda_context", "--cuda-context"},
    {"overheads.streams", "--streams"},
    {"keep_gradients", "--keep-grads"},
    {"encoder_head", "--head"},
    {"images", "--images"},
    {"vlm_trainable", "--vlm-train"},
    {"gpus", "--gpus"},
    {"tensor_parallel", "--tp"},
    {"sequence_parallel", "--sp"},
    {"pipeline_parallel", "--pp"},
    {"pipeline_schedule", "--pp-schedule"},
    {"pipeline_stage", "--pp-stage"},
    {"torch_parallel", "--torch-parallel"},
    {"expert_parallel", "--ep"},
    {"sharding", "--zero or --fsdp"},
    {"hybrid_shard_group", "--shard-group"},
    {"offload", "--offload"},
};

// A library parser's error as an error of `flag`.
template <typename T>
absl::StatusOr<T> ForFlag(std::string_view flag, absl::StatusOr<T> parsed) {
  if (!parsed.ok()) {
    return absl::InvalidArgumentError(std::string(flag) + ": " + std::string(parsed.status().message()));
  }
  return parsed;
}

absl::Status SetLayout(const JobFlags& f, ParallelLayout& layout) {
  layout.gpus = f.gpus;
  layout.tensor_parallel = f.tp;
  layout.sequence_parallel = f.sp;
  layout.pipeline_parallel = f.pp;
  HEADROOM_ASSIGN_OR_RETURN(layout.pipeline_schedule, ForFlag("--pp-schedule", ParsePipelineSchedule(f.pp_schedule)));
  layout.pipeline_stage = f.pp_stage;
  layout.torch_parallel = f.torch_parallel;
  layout.expert_parallel = f.ep;
  layout.hybrid_shard_group = f.shard_group;
  if (f.zero && !f.fsdp.empty()) {
    return absl::InvalidArgumentError("--zero and --fsdp: choose one sharding framework");
  }
  if (f.zero) {
    HEADROOM_ASSIGN_OR_RETURN(layout.sharding, ForFlag("--zero", ZeroStageSharding(*f.zero)));
    layout.deepspeed_stage0 = *f.zero == 0;
  }
  if (!f.fsdp.empty()) {
    HEADROOM_ASSIGN_OR_RETURN(layout.sharding, ForFlag("--fsdp", ParseFsdpStrategy(f.fsdp)));
  }
  HEADROOM_ASSIGN_OR_RETURN(Offload offload, ForFlag("--offload", ParseOffload(f.offload)));
  layout.set_offload(offload);
  return absl::OkStatus();
}

}  // namespace

void AddJobFlags(CLI::App& app, JobFlags& f) {
  app.add_option("--gpus", f.gpus, "Total GPUs (data parallel = gpus / (tp * pp))");
  app.add_option("--tp", f.tp, "Tensor parallel degree");
  app.add_flag("--sp", f.sp, "Sequence parallel (with --tp)");
  app.add_option("--pp", f.pp, "Pipeline parallel degree");
  app.add_option("--pp-schedule", f.pp_schedule,
                 "Pipeline schedule: 1f1b (default; stage s holds min(pp - s, grad-accum) micro-batches) or gpipe "
                 "(every forward before any backward: each stage holds all grad-accum micro-batches)");
  app.add_option("--pp-stage", f.pp_stage,
                 "The pipeline stage (0 first) whose GPU to estimate or plan (default: the fullest)");
  app.add_flag("--torch-parallel", f.torch_parallel,
               "--tp, --pp and --zero 1 as torch.distributed runs them (DTensor parallelize_module with "
               "loss_parallel, pipelining, ZeroRedundancyOptimizer over DDP) rather than Megatron-LM or DeepSpeed: "
               "the model's own modules and PyTorch's gradients");
  app.add_option("--ep", f.ep, "Expert parallel degree (MoE)");
  app.add_option("--zero", f.zero, "DeepSpeed ZeRO stage 0-3");
  app.add_option("--fsdp", f.fsdp,
                 "FSDP sharding: full, hybrid or grad-op (SHARD_GRAD_OP; FSDP2's reshard_after_forward=False)");
  app.add_option("--shard-group", f.shard_group, "GPUs per FSDP hybrid shard group (default 8)");
  app.add_option("--offload", f.offload, "CPU offload: none, optimizer or all (parameters too)");
  app.add_option("--precision", f.precision,
                 "fp32, tf32, fp16-mixed, bf16-mixed (training default), bf16 (inference default), fp16, fp8");
  app.add_option("--optimizer", f.optimizer, "adamw (default), adam8bit, sgd-momentum, sgd, adafactor, lion");
  app.add_option("--optimizer-impl", f.optimizer_impl, "foreach (PyTorch default), for-loop or fused");
  app.add_option("--ema", f.ema, "An EMA copy of the trainable weights: none (default), gpu or cpu (host memory)");
  app.add_option("--micro-batch,--batch", f.micro_batch, "Samples per GPU per forward/backward (default 1)");
  app.add_option("--seq", f.seq,
                 "Sequence length (default: the model's maximum, at most 4096); Whisper: the decoder's tokens, its "
                 "encoder always reads the config's 30 s of log-mel frames");
  app.add_option("--target-seq", f.target_seq,
                 "Encoder-decoders (T5, BART, Whisper): the decoder's tokens (default: --seq)");
  app.add_option("--grad-accum", f.grad_accum, "Micro-batches per optimizer step (default 1)");
  app.add_option("--attention", f.attention, "flash (default) or eager");
  app.add_option("--checkpoint", f.checkpoint, "Activation checkpointing: none, full, every-k, selective, sqrt-n");
  app.add_option("--checkpoint-every", f.checkpoint_every, "Layers per checkpointed segment (every-k)");
  app.add_option("--lora-rank", f.lora_rank, "LoRA rank (0: full fine-tuning)");
  app.add_option("--lora-alpha", f.lora_alpha, "LoRA alpha (default 2 x rank)");
  app.add_option("--lora-targets", f.lora_targets, "Comma-separated target modules (default: q/v projections)");
  app.add_flag("--qlora", f.qlora, "NF4 base weights with double quantization (QLoRA)");
  app.add_flag("--inference", f.inference, "Inference instead of training");
  app.add_option("--context", f.context, "Inference: KV-cache tokens per sequence");
  app.add_option("--kv-block-size", f.kv_block_size, "Paged KV block size in tokens (vLLM: 16; 0: contiguous)");
  app.add_option("--kv-dtype", f.kv_dtype, "KV cache dtype (default: compute dtype), e.g. fp8");
  app.add_option("--cuda-context", f.cuda_context, "CUDA context size, e.g. 1343MiB (default per GPU generation)");
  app.add_option("--streams", f.streams, "Compute streams, each with a cuBLAS workspace (default 1)");
  app.add_option("--alloc-conf", f.alloc_conf,
                 "Caching allocator configuration replayed for reserved memory: a PYTORCH_CUDA_ALLOC_CONF string "
                 "or a preset (pytorch-default, expandable, max-split-512, power2-4, gc-0.8, headroom)")
      ->default_str("pytorch-default");
  app.add_flag("--keep-grads", f.keep_grads, "zero_grad(set_to_none=False): gradients stay between steps");
  app.add_option("--head", f.head, "Encoders: classification or mlm head");
  app.add_option("--images", f.images,
                 "Vision-language models (LLaVA): images per sequence, whose tokens --seq counts (default 1)");
  app.add_option("--vlm-train", f.vlm_train,
                 "Vision-language models: what trains, projector+lm (default: vision tower frozen), projector "
                 "or all");
  app.add_option("--loop", f.loop,
                 "hand (default: the loop holds the outputs through backward and the step) or trainer "
                 "(Hugging Face Trainer drops them before backward)");
  app.add_option("--rms-norm", f.rms_norm,
                 "RMSNorm: eager (Hugging Face) or fused (one kernel); default fused under --tp/--pp (Megatron)");
  app.add_option("--torch", f.torch_version, "PyTorch version that runs the step, e.g. 2.5 (default) or 1.13");
  app.add_option("--kernels", f.kernels, "cuda (default) or cpu: whose kernels run the ops (validation on a CPU)");
  app.add_flag("--emulated-host", f.emulated_host,
               "with --kernels cpu: offloaded tensors go to host memory kept apart from the ops' memory, as "
               "headroom.plan(offload=True) does on a CPU to measure what a GPU would hold; plans may offload");
  app.add_option("--transformers", f.transformers_version,
                 "Hugging Face transformers version whose modeling code runs the model, e.g. 5.24 (default) or "
                 "4.46");
}

void ApplyModelDefaults(const JobFlags& flags, const LoadedModel& model, JobSpec& job) {
  if (flags.attention.empty() && model.config && !HasFlashAttentionPath(*model.config)) {
    job.attention = AttentionImpl::kEager;
  }
}

absl::StatusOr<JobSpec> ToJob(const JobFlags& f) {
  JobSpec job;
  job.training = !f.inference;
  job.micro_batch = f.micro_batch;
  if (f.seq) {
    // JobSpec::seq_len 0 means the model's default, so an explicit 0 is refused here.
    if (*f.seq < 1) {
      return absl::InvalidArgumentError(
          absl::StrFormat("--seq: must be at least 1 (leave it out for the model's default), got %d", *f.seq));
    }
    job.seq_len = *f.seq;
  }
  job.target_seq_len = f.target_seq;
  job.grad_accum = f.grad_accum;
  // Training defaults to autocast mixed precision; inference servers load
  // 16-bit weights, so inference defaults to pure bf16.
  const std::string precision = !f.precision.empty() ? f.precision : f.inference ? "bf16" : "bf16-mixed";
  HEADROOM_ASSIGN_OR_RETURN(job.precision, ForFlag("--precision", ParsePrecision(precision)));
  HEADROOM_ASSIGN_OR_RETURN(job.optimizer, ForFlag("--optimizer", ParseOptimizer(f.optimizer)));
  HEADROOM_ASSIGN_OR_RETURN(job.optimizer_impl, ForFlag("--optimizer-impl", ParseOptimizerImpl(f.optimizer_impl)));
  HEADROOM_ASSIGN_OR_RETURN(job.ema, ForFlag("--ema", ParseEmaPlacement(f.ema)));
  HEADROOM_ASSIGN_OR_RETURN(job.attention,
                            ForFlag("--attention", ParseAttentionImpl(f.attention.empty() ? "flash" : f.attention)));
  HEADROOM_ASSIGN_OR_RETURN(job.checkpoint, ForFlag("--checkpoint", ParseCheckpointMode(f.checkpoint)));
  job.checkpoint_every = f.checkpoint_every;
  if (f.checkpoint_every > 1 && job.checkpoint == CheckpointMode::kOff) job.checkpoint = CheckpointMode::kEveryK;

  job.lora.rank = f.lora_rank;
  job.lora.alpha = f.lora_alpha.value_or(2.0 * static_cast<double>(f.lora_rank));
  for (absl::string_view t : absl::StrSplit(f.lora_targets, ',', absl::SkipEmpty())) {
    job.lora.target_modules.emplace_back(t);
  }
  job.lora.quantize_base_nf4 = f.qlora;
  HEADROOM_RETURN_IF_ERROR(SetLayout(f, job.layout));

  job.context = f.context;
  job.kv_block_size = f.kv_block_size;
  if (!f.kv_dtype.empty()) {
    HEADROOM_ASSIGN_OR_RETURN(job.kv_dtype, ForFlag("--kv-dtype", ParseDType(f.kv_dtype)));
  }
  if (!f.cuda_context.empty()) {
    HEADROOM_ASSIGN_OR_RETURN(job.overheads.cuda_context, ForFlag("--cuda-context", ParseBytes(f.cuda_context)));
  }
  job.overheads.streams = f.streams;
  absl::StatusOr<AllocatorOptions> allocator = ResolveAllocConf(f.alloc_conf);
  if (!allocator.ok()) return absl::InvalidArgumentError(absl::StrCat("--alloc-conf ", allocator.status().message()));
  job.allocator = *allocator;
  job.keep_gradients = f.keep_grads;
  if (!f.head.empty()) {
    HEADROOM_ASSIGN_OR_RETURN(job.encoder_head, ForFlag("--head", ParseEncoderHead(f.head)));
  }
  job.images = f.images;
  HEADROOM_ASSIGN_OR_RETURN(job.vlm_trainable, ForFlag("--vlm-train", ParseVlmTrainable(f.vlm_train)));
  HEADROOM_ASSIGN_OR_RETURN(job.loop, ForFlag("--loop", ParseTrainingLoop(f.loop)));
  if (!f.rms_norm.empty()) {
    HEADROOM_ASSIGN_OR_RETURN(job.rms_norm, ForFlag("--rms-norm", ParseRmsNormImpl(f.rms_norm)));
  }
  if (!f.torch_version.empty()) {
    HEADROOM_ASSIGN_OR_RETURN(job.runtime, ForFlag("--torch", ParseTorchVersion(f.torch_version)));
  }
  HEADROOM_ASSIGN_OR_RETURN(job.runtime.kernels, ForFlag("--kernels", ParseKernels(f.kernels)));
  if (f.emulated_host && job.runtime.kernels != Kernels::kCpu) {
    return absl::InvalidArgumentError("--emulated-host: only with --kernels cpu (a GPU's host memory is apart already)");
  }
  job.runtime.emulated_host = f.emulated_host;
  if (!f.transformers_version.empty()) {
    HEADROOM_ASSIGN_OR_RETURN(job.runtime.transformers,
                              ForFlag("--transformers", ParseTransformersVersion(f.transformers_version)));
  }
  HEADROOM_RETURN_IF_ERROR(InFlagTerms(ValidateJob(job)));
  return job;
}

namespace {

// Whether `c` may be part of a name, so that a field inside a longer name
// ("gpus.json", "layer_sizes") is left alone.
bool IsNameChar(char c) {
  return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '.' || c == '-' || c == '/';
}

}  // namespace

absl::Status InFlagTerms(const absl::Status& status) {
  std::string message(status.message());
  for (const auto& [field, flag] : kFieldFlags) {
    for (size_t at = message.find(field); at != std::string::npos; at = message.find(field, at)) {
      const size_t end = at + field.size();
      const bool whole = (at == 0 || !IsNameChar(message[at - 1])) && end < message.size();
      const bool number_follows = message[end] == ' ' && end + 1 < message.size() &&
                                  std::isdigit(static_cast<unsigned char>(message[end + 1]));
      const bool names_value = whole && (message[end] == ':' || number_follows);
      if (!names_value) {
        at = end;
        continue;
      }
      message.replace(at, field.size(), flag);
      at += flag.size();
    }
  }
  return absl::Status(status.code(), message);
}

std::string FlagsForChange(const JobSpec& from, const JobSpec& to) {
  std::vector<std::string> flags;
  auto word = [&](bool changed, std::string_view flag, std::string_view value) {
    if (changed) flags.push_back(std::string(flag) + " " + std::string(value));
  };
  auto number = [&](bool changed, std::string_view flag, int64_t value) {
    word(changed, flag, std::to_string(value));
  };
  const ParallelLayout &a = from.layout, &b = to.layout;
  number(a.gpus != b.gpus, "--gpus", b.gpus);
  number(a.tensor_parallel != b.tensor_parallel, "--tp", b.tensor_parallel);
  if (b.sequence_parallel && !a.sequence_parallel) flags.emplace_back("--sp");
  number(a.pipeline_parallel != b.pipeline_parallel, "--pp", b.pipeline_parallel);
  number(a.expert_parallel != b.expert_parallel, "--ep", b.expert_parallel);
  if (a.sharding != b.sharding || a.deepspeed_stage0 != b.deepspeed_stage0) {
    if (IsFsdp(b.sharding)) {
      word(true, "--fsdp", FsdpStrategyName(b.sharding));
    } else {
      number(true, "--zero", ZeroStage(b.sharding));
    }
  }
  word(a.offload() != b.offload(), "--offload", OffloadName(b.offload()));
  number(from.micro_batch != to.micro_batch, "--micro-batch", to.micro_batch);
  number(from.grad_accum != to.grad_accum, "--grad-accum", to.grad_accum);
  number(from.seq_len != to.seq_len, "--seq", to.seq_len);
  word(from.checkpoint != to.checkpoint, "--checkpoint", CheckpointModeName(to.checkpoint));
  number(from.checkpoint_every != to.checkpoint_every, "--checkpoint-every", to.checkpoint_every);
  word(from.attention != to.attention, "--attention", AttentionImplName(to.attention));
  word(from.precision != to.precision, "--precision", PrecisionName(to.precision));
  word(from.optimizer != to.optimizer, "--optimizer", OptimizerName(to.optimizer));
  word(from.optimizer_impl != to.optimizer_impl, "--optimizer-impl", OptimizerImplName(to.optimizer_impl));
  word(from.ema != to.ema, "--ema", EmaPlacementName(to.ema));
  // fp8 is the flag's documented spelling of the e4m3 format.
  word(from.kv_dtype != to.kv_dtype && to.kv_dtype, "--kv-dtype",
       to.kv_dtype == DType::kF8E4M3 ? "fp8" : DTypeName(to.kv_dtype.value_or(DType::kF32)));
  number(from.lora.rank != to.lora.rank, "--lora-rank", to.lora.rank);
  // --lora-alpha defaults to twice the rank.
  const double default_alpha = 2.0 * static_cast<double>(to.lora.rank);
  if (to.lora.enabled() && to.lora.alpha != from.lora.alpha && to.lora.alpha != default_alpha) {
    flags.push_back(absl::StrFormat("--lora-alpha %g", to.lora.alpha));
  }
  if (to.lora.quantize_base_nf4 && !from.lora.quantize_base_nf4) flags.emplace_back("--qlora");
  return absl::StrJoin(flags, " ");
}

absl::StatusOr<const GpuSpec*> FindGpuFlag(const std::string& gpu, const std::string& catalog_path,
                                           std::optional<GpuCatalog>& catalog) {
  if (!catalog_path.empty()) {
    HEADROOM_ASSIGN_OR_RETURN(catalog, GpuCatalog::LoadFile(catalog_path));
  }
  if (gpu.empty()) return nullptr;
  return (catalog ? *catalog : GpuCatalog::Builtin()).Find(gpu);
}

absl::StatusOr<uint64_t> ParseBudgetFlag(const std::string& text) {
  absl::StatusOr<uint64_t> budget = ParseBytes(text);
  if (!budget.ok()) return absl::InvalidArgumentError(absl::StrCat("--budget: ", budget.status().message()));
  if (*budget == 0) return absl::InvalidArgumentError("--budget: must be positive");
  return *budget;
}

absl::StatusOr<double> ParseBudgetShareFlag(const std::string& text) {
  double percent = 0;
  if (!text.ends_with('%') || !absl::SimpleAtod(text.substr(0, text.size() - 1), &percent) || !(percent > 0) ||
      percent > 1000) {
    return absl::InvalidArgumentError(
        absl::StrFormat("--budget: %s is not a percentage of the store-all peak in (0, 1000]", QuoteForError(text)));
  }
  return percent / 100;
}

}  // namespace headroom::cli

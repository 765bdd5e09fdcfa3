#include "estimators/estimate_stages.h"

#include <algorithm>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_format.h"
#include "common/checked_math.h"
#include "common/quote.h"
#include "common/status_macros.h"
#include "estimators/memory_estimate.h"
#include "estimators/optimizer_state.h"
#include "graph/training_step.h"
#include "hardware/cost_model.h"
#include "models/builders.h"
#include "models/model_config.h"
#include "planner/checkpoint_mode_plan.h"

namespace headroom {
namespace {

// Layers of a forward graph: one more than the largest block index of a parameter.
int LayersOf(const Graph& forward) {
  int layers = 0;
  for (const Tensor& t : forward.tensors()) {
    if (t.role == TensorRole::kParameter) layers = std::max(layers, t.layer + 1);
  }
  return layers;
}

std::string_view LayersField(const ModelConfig& c) {
  if (c.family == ModelFamily::kMlp) return "layer_sizes entries";
  if (c.family == ModelFamily::kCnn) return "blocks";
  return FieldNamesOf(c).layers;
}

absl::Status CheckPipelineStages(int stages, int layers, std::string_view layers_field) {
  if (stages <= 1 || stages <= layers) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrFormat(
      "pipeline_parallel %d: more pipeline stages than the model's %d layers (%s); each stage needs at least one",
      stages, layers, layers_field));
}

// One activation of `rows` x `width` elements at 4 bytes (the widest dtype an
// activation takes: fp32 norms, softmax and logits), named by its factors.
absl::Status CheckActivation(uint64_t rows, std::string_view rows_named, uint64_t width,
                             std::string_view width_named) {
  const uint64_t bytes = SaturatingMul(SaturatingMul(rows, width), 4);
  if (bytes <= kMaxTensorBytes) return absl::OkStatus();
  return absl::OutOfRangeError(absl::StrFormat(
      "%s x %s x 4 bytes: an activation of %s bytes, more than the %d (1 TiB) a tensor may hold",
      rows_named, width_named, bytes == UINT64_MAX ? std::string("over 2^64") : std::to_string(bytes),
      kMaxTensorBytes));
}

// The widest activations a builder makes from batch, sequence and the
// config's widths (Note [Size bounds] in graph/graph.h); bounding them first
// also keeps the builders' int64 shape products far from overflow.
absl::Status CheckActivationSizes(const ModelConfig& c, const JobSpec& job, int64_t seq_len) {
  const auto batch = static_cast<uint64_t>(job.micro_batch);
  const std::string batch_named = absl::StrFormat("micro_batch %d", job.micro_batch);
  if (c.family == ModelFamily::kMlp) {
    int64_t widest = c.mlp_input_size;
    for (int64_t size : c.mlp_layer_sizes) widest = std::max(widest, size);
    return CheckActivation(batch, batch_named, static_cast<uint64_t>(widest),
                           absl::StrFormat("the widest layer (%d)", widest));
  }
  if (c.family == ModelFamily::kCnn) {
    // vgg16's first convolutions keep 64 channels at full resolution.
    const auto pixels = static_cast<uint64_t>(c.image_size * c.image_size);
    return CheckActivation(batch, batch_named, 64 * pixels,
                           absl::StrFormat("64 channels x %d x %d pixels", c.image_size, c.image_size));
  }
  if (c.model_type == "whisper") {
    // The audio encoder's widest activations: its first convolution's output over every frame, and eager
    // attention's scores over the encoder's positions.
    const uint64_t frames = SaturatingMul(batch, 2 * static_cast<uint64_t>(c.source_positions));
    const std::string frames_named = absl::StrFormat("%s x 2 x max_source_positions %d", batch_named,
                                                     c.source_positions);
    HEADROOM_RETURN_IF_ERROR(CheckActivation(frames, frames_named, static_cast<uint64_t>(c.hidden_size),
                                             absl::StrFormat("d_model %d", c.hidden_size)));
    if (job.attention == AttentionImpl::kEager) {
      HEADROOM_RETURN_IF_ERROR(CheckActivation(
          frames, frames_named, SaturatingMul(static_cast<uint64_t>(c.num_heads), c.source_positions),
          absl::StrFormat("encoder_attention_heads %d x max_source_positions %d (eager attention scores)",
                          c.num_heads, c.source_positions)));
    }
  }
  if (c.family == ModelFamily::kContrastive) {
    HEADROOM_RETURN_IF_ERROR(CheckActivationSizes(c.text_tower(), job, seq_len));
    return CheckActivationSizes(c.vision_tower(), job, c.vision_tower().image_tokens());
  }
  if (c.family == ModelFamily::kVisionLanguage) {
    // LLaVA's vision tower sees micro_batch x images images (Note [LLaVA] in models/builders/vision.cc).
    HEADROOM_RETURN_IF_ERROR(CheckActivationSizes(c.text_tower(), job, seq_len));
    JobSpec images = job;
    images.micro_batch = job.micro_batch * job.images;  // both bounded by ValidateJob: at most 2^44
    return job.images == 0 ? absl::OkStatus()
                           : CheckActivationSizes(c.vision_tower(), images, c.vision_tower().image_tokens());
  }
  const auto t = static_cast<uint64_t>(job.layout.tensor_parallel);
  const uint64_t tokens = SaturatingMul(batch, static_cast<uint64_t>(seq_len));
  // A vision transformer's tokens come from its image (Note [Vision transformer configs]).
  const std::string tokens_named =
      c.family == ModelFamily::kVision
          ? absl::StrFormat("%s x ((image_size %d / patch_size %d)^2%s tokens)", batch_named, c.image_size,
                            c.patch_size, c.class_token ? " + 1" : "")
          : absl::StrFormat("%s x seq_len %d", batch_named, seq_len);
  const ConfigFieldNames fields = FieldNamesOf(c);
  const std::string_view inner = fields.intermediate;
  const struct {
    uint64_t width;
    std::string named;
  } widths[] = {
      {static_cast<uint64_t>(c.hidden_size), absl::StrFormat("%s %d", fields.hidden, c.hidden_size)},
      {static_cast<uint64_t>(c.intermediate_size) / t,
       absl::StrFormat("%s %d / tensor_parallel %d", inner, c.intermediate_size, t)},
      {CeilDiv(static_cast<uint64_t>(c.vocab_size), t),
       absl::StrFormat("vocab_size %d / tensor_parallel %d", c.vocab_size, t)},
      {SaturatingMul(static_cast<uint64_t>(c.num_heads) / t, static_cast<uint64_t>(c.head_dim)),
       absl::StrFormat("%s %d / tensor_parallel %d x head_dim %d", fields.heads, c.num_heads, t, c.head_dim)},
  };
  for (const auto& [width, named] : widths) {
    HEADROOM_RETURN_IF_ERROR(CheckActivation(tokens, tokens_named, width, named));
  }
  if (c.family == ModelFamily::kStateSpace) {
    // Mamba's deltaA, deltaB and step states: batch x seq x intermediate_size x state_size, f32 (Note [Mamba]).
    return CheckActivation(tokens, tokens_named,
                           SaturatingMul(static_cast<uint64_t>(c.intermediate_size),
                                         static_cast<uint64_t>(c.ssm_state_size)),
                           absl::StrFormat("intermediate_size %d x state_size %d", c.intermediate_size,
                                           c.ssm_state_size));
  }
  if (job.attention == AttentionImpl::kEager) {
    // Eager attention's scores: batch x heads x seq x seq.
    HEADROOM_RETURN_IF_ERROR(CheckActivation(
        tokens, tokens_named, SaturatingMul(static_cast<uint64_t>(c.num_heads) / t, static_cast<uint64_t>(seq_len)),
        absl::StrFormat("%s %d / tensor_parallel %d x seq_len %d (eager attention scores)", fields.heads,
                        c.num_heads, t, seq_len)));
  }
  return absl::OkStatus();
}

}  // namespace

std::string_view FrameworkName(Framework framework) {
  switch (framework) {
    case Framework::kAutocast: return "pytorch-autocast";
    case Framework::kPytorch: return "pytorch";
    case Framework::kDeepSpeed: return "deepspeed";
    case Framework::kFsdp: return "fsdp";
    case Framework::kMegatron: return "megatron";
  }
  return "pytorch";
}

EstimateSetup ResolveSetup(const LoadedModel& model, const JobSpec& job) {
  EstimateSetup setup;
  const ParallelLayout& layout = job.layout;
  // Note [Which framework a setup means].
  const bool amp = job.precision == Precision::kBf16Mixed || job.precision == Precision::kFp16Mixed;
  if (layout.deepspeed()) {
    setup.framework = Framework::kDeepSpeed;
  } else if (IsFsdp(layout.sharding)) {
    setup.framework = Framework::kFsdp;
  } else if ((layout.tensor_parallel > 1 || layout.pipeline_parallel > 1) && !layout.torch_parallel) {
    setup.framework = Framework::kMegatron;
  } else if (amp && !job.lora.enabled()) {
    setup.framework = Framework::kAutocast;
  } else {
    setup.framework = Framework::kPytorch;
  }
  setup.precision = SetupFor(job.precision);
  setup.autocast = setup.framework == Framework::kAutocast;
  if (setup.autocast) {
    // fp32 parameters are the masters; autocast's 16-bit copies are graph tensors.
    setup.precision.weight_dtype = DType::kF32;
    setup.precision.master_weights = false;
  }
  setup.gradients_outlive_step = job.keep_gradients || setup.framework == Framework::kDeepSpeed ||
                                 setup.framework == Framework::kFsdp || setup.framework == Framework::kMegatron;
  setup.persistent_gradients = job.grad_accum > 1 || setup.gradients_outlive_step;
  setup.seq_len = ResolveSeqLen(model, job);
  return setup;
}

absl::Status CheckJobAgainstModel(const LoadedModel& model, const JobSpec& job) {
  const ParallelLayout& layout = job.layout;
  if (model.graph && !model.config) {
    // A graph file: its parameter count bounds the model states (Note [Model size bounds]).
    if (model.graph->ParameterCount() > kMaxParameters) {
      return absl::OutOfRangeError(absl::StrFormat(
          "%s: the graph has %d parameters, more than the %d a model may have", model.name,
          model.graph->ParameterCount(), kMaxParameters));
    }
    return CheckPipelineStages(layout.pipeline_parallel, LayersOf(*model.graph), "blocks with parameters");
  }
  if (job.target_seq_len > 0 && (!model.config || model.config->family != ModelFamily::kEncoderDecoder)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "target_seq_len %d: %s has no decoder of its own (encoder-decoders such as T5 do)", job.target_seq_len,
        model.name));
  }
  if (!model.config) return absl::OkStatus();
  const ModelConfig& c = *model.config;
  if (c.family == ModelFamily::kEncoderDecoder && layout.pipeline_parallel > 1) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "pipeline_parallel %d: pipelines over an encoder-decoder (%s) are not modelled", layout.pipeline_parallel,
        c.architecture));
  }
  HEADROOM_RETURN_IF_ERROR(CheckPipelineStages(layout.pipeline_parallel, static_cast<int>(c.num_layers),
                                               LayersField(c)));
  if (layout.expert_parallel > 1) {
    if (!c.is_moe()) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "expert_parallel %d: the model has no experts to spread (expert parallelism needs a mixture-of-experts "
          "model)",
          layout.expert_parallel));
    }
    if (c.num_experts % layout.expert_parallel != 0) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "expert_parallel %d does not divide num_local_experts (%d): every rank must hold the same number of experts",
          layout.expert_parallel, c.num_experts));
    }
  }
  if (c.model_type == "whisper" && job.seq_len > 0 && job.target_seq_len > 0 && job.seq_len != job.target_seq_len) {
    // Note [Whisper] in models/builders/encoder_decoder.cc: the encoder's frames are fixed, so both name the decoder's
    // tokens.
    return absl::InvalidArgumentError(absl::StrFormat(
        "seq_len %d and target_seq_len %d: %s's encoder always reads 2 x max_source_positions (%d) = %d log-mel "
        "frames; both name its decoder's tokens, so give one (or equal values)",
        job.seq_len, job.target_seq_len, c.architecture, c.source_positions, 2 * c.source_positions));
  }
  const int64_t seq_len = ResolveSeqLen(model, job);
  if (c.family == ModelFamily::kVision && job.seq_len > 0 && job.seq_len != seq_len) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "seq_len %d: %s attends over its image's %d tokens ((image_size %d / patch_size %d)^2 + 1); set "
        "image_size in the config instead",
        job.seq_len, c.architecture, seq_len, c.image_size, c.patch_size));
  }
  return CheckActivationSizes(c, job, seq_len > 0 ? seq_len : 1);
}

absl::StatusOr<Graph> BuildForwardGraph(const LoadedModel& model, const JobSpec& job, const EstimateSetup& setup) {
  if (!model.config) {
    if (model.graph) return *model.graph;
    return absl::InvalidArgumentError(absl::StrFormat("model '%s' has neither a config nor a graph", model.name));
  }
  const ParallelLayout& layout = job.layout;
  BuildOptions build{.batch = job.micro_batch,
                     .seq_len = setup.seq_len > 0 ? setup.seq_len : 1,
                     .images = job.images,
                     .vlm_trainable = job.vlm_trainable,
                     .target_seq_len = job.target_seq_len,
                     .param_dtype = setup.autocast ? DType::kF32 : setup.precision.weight_dtype,
                     .compute_dtype = setup.precision.compute_dtype,
                     .attention = job.attention,
                     .training = job.training,
                     .tensor_parallel = layout.tensor_parallel,
                     .sequence_parallel = layout.sequence_parallel,
                     .dtensor = layout.tensor_parallel > 1 && layout.torch_parallel,
                     .expert_parallel = layout.expert_parallel,
                     .lora = job.lora,
                     .rms_norm = job.rms_norm.value_or(setup.framework == Framework::kMegatron
                                                           ? RmsNormImpl::kFused
                                                           : RmsNormImpl::kEager),
                     .runtime = job.runtime};
  ModelConfig config = *model.config;
  if (job.encoder_head && config.family == ModelFamily::kEncoder) {
    config.encoder_head = *job.encoder_head;
    // BertForSequenceClassification pools; the masked-LM model does not.
    config.encoder_pooler = config.encoder_head != EncoderHead::kMaskedLm && config.model_type == "bert";
  }
  return BuildModelGraph(config, build);
}

bool HasBackward(const Graph& graph) {
  for (const Op& op : graph.ops()) {
    if (op.phase == Phase::kBackward) return true;
  }
  return false;
}

bool IsWholeStep(const LoadedModel& model, const Graph& forward) {
  return model.graph && (model.kind == ModelSourceKind::kNodeLinkFile || HasBackward(forward));
}

absl::StatusOr<Graph> BuildStep(const Graph& forward, const JobSpec& job, const EstimateSetup& setup) {
  // The planner owns what a checkpoint mode means (planner/checkpoint_mode_plan.h).
  CheckpointPlan plan;
  if (job.training) {
    HEADROOM_ASSIGN_OR_RETURN(plan, PlanForMode(forward, job.checkpoint, job.checkpoint_every));
  }
  StepOptions options{.training = job.training,
                      .checkpoint = std::move(plan),
                      // Note [Gradients in the first backward] in memory_estimate.h: not yet in the first.
                      .gradients_preexist = job.training && job.grad_accum > 1 && setup.persistent_gradients,
                      .optimizer_step = job.training,
                      .hold_model_outputs = job.training && job.loop == TrainingLoop::kHand,
                      .autocast_weight_cache = job.training && setup.autocast,
                      .softmax_backward_holds_product = job.runtime.SoftmaxBackwardHoldsProduct(),
                      .optimizer_state_bytes_per_element =
                          static_cast<uint32_t>(OptimizerStateBytesPerParam(job.optimizer))};
  if (!setup.autocast && job.training) options.parameter_gradient_dtype = setup.precision.grad_dtype;
  return BuildTrainingStep(forward, options);
}

PeakAttribution AttributePeak(const Graph& step, const EstimateSetup& setup) {
  // Note [Gradients: resident or by liveness].
  const ProfileOptions profile_options{.count_parameter_gradients = !setup.persistent_gradients,
                                       .max_live_at_peak = 16};
  PeakAttribution out;
  out.profile = ProfileMemory(step, profile_options);
  const MemoryProfile& profile = out.profile;
  auto role_bytes = [&](TensorRole role) {
    auto it = profile.bytes_by_role_at_peak.find(role);
    return it == profile.bytes_by_role_at_peak.end() ? uint64_t{0} : it->second;
  };
  out.activations = role_bytes(TensorRole::kActivation) + role_bytes(TensorRole::kInput);
  out.parameter_gradients = profile.parameter_gradient_bytes_at_peak;
  out.activation_gradients = profile.activation_gradient_bytes_at_peak;
  out.temporaries = role_bytes(TensorRole::kTemporary);
  const OpId peak = profile.peak_op;
  if (peak != kNone && setup.autocast) {
    const std::vector<TensorLifetime> lifetimes = ComputeLifetimes(step, profile_options);
    for (const Tensor& t : step.tensors()) {
      const TensorLifetime& life = lifetimes[static_cast<size_t>(t.id)];
      if (life.first > life.last || life.first > peak || life.last < peak) continue;
      const OpId producer = step.producer(t.id);
      if (producer == kNone) continue;
      const Op& op = step.op(producer);
      if (op.kind == "cast" && !op.inputs.empty() && step.tensor(op.inputs[0]).role == TensorRole::kParameter) {
        out.autocast_copies += t.bytes();
      }
    }
  }
  out.autocast_copies = std::min(out.autocast_copies, out.activations);
  out.activations -= out.autocast_copies;
  return out;
}

absl::StatusOr<ModelStates> StageModelStates(const Graph& forward, const JobSpec& job, const EstimateSetup& setup,
                                             int stage) {
  return EstimateModelStates(forward, {.precision = setup.precision,
                                       .optimizer = job.optimizer,
                                       .layout = job.layout,
                                       .ema = job.ema,
                                       .training = job.training,
                                       .pipeline_stage = stage});
}

// Note [Pipeline stage step]
// With --pp P the planner plans, and the estimate's allocator replay
// replays, each stage (Note [Pipeline 1F1B] in memory_estimate.h) as its
// GPU runs it:
//  - its ops are those of its layers (PipelineStageOf), plus, on the first
//    stage, the ops before the first layer (embeddings, masks) and, on the
//    last, those after the last layer (final norm, head, loss);
//  - a tensor it reads that another stage made arrives from it: an input of
//    the stage (so, like the batch, live throughout; the gradient sent back
//    for it is not modelled), and so is a constant made once on the first
//    stage (a causal mask, rotary tables), which each stage makes itself;
//  - a stage before the last ends in a stand-in loss ("pipeline.send", a sum
//    over its outputs that later stages read), whose backward allocates the
//    gradient the next stage sends back, the size of those outputs;
//  - layers are renumbered from 0, so layer-wise strategies see the stage's
//    own stack; op names (module paths) stay.
// The micro-batches in flight (1F1B: min(P - stage, --grad-accum)) are
// PlanProblem::in_flight (Note [Pipeline in-flight] in planner/plan.h) and
// the replay's warm-up (Note [Pipeline warm-up in the replay] in
// estimators/step_replay.h).
absl::StatusOr<Graph> PipelineStageForward(const Graph& forward, int stage, int stages) {
  int num_layers = 0;
  OpId first_block_op = kNone;
  for (const Op& op : forward.ops()) {
    num_layers = std::max(num_layers, op.layer + 1);
    if (op.layer >= 0 && first_block_op == kNone) first_block_op = op.id;
  }
  if (num_layers < stages) {
    return absl::InvalidArgumentError(
        absl::StrFormat("--pp: %d pipeline stages for %d layers; a stage needs a layer", stages, num_layers));
  }
  auto stage_of = [&](const Op& op) {
    return PipelineStageOf(op.layer, first_block_op == kNone || op.id < first_block_op, num_layers, stages);
  };
  int first_layer = num_layers;
  for (const Op& op : forward.ops()) {
    if (op.layer >= 0 && stage_of(op) == stage) first_layer = std::min(first_layer, op.layer);
  }
  Graph out(absl::StrFormat("%s (pipeline stage %d of %d)", forward.name(), stage, stages));
  std::vector<TensorId> mapped(forward.num_tensors(), kNone);
  std::vector<bool> made_here(forward.num_tensors(), false);
  for (const Op& op : forward.ops()) {
    if (stage_of(op) != stage) continue;
    for (TensorId t : op.outputs) made_here[static_cast<size_t>(t)] = true;
  }
  auto renumber = [&](int layer) { return layer >= 0 ? layer - first_layer : layer; };
  std::function<TensorId(TensorId)> map = [&](TensorId id) {
    if (mapped[static_cast<size_t>(id)] != kNone) return mapped[static_cast<size_t>(id)];
    Tensor t = forward.tensor(id);
    t.layer = renumber(t.layer);
    if (!made_here[static_cast<size_t>(id)] && forward.producer(id) != kNone) {
      // Made by another stage: it arrives as an input, whole.
      if (t.view_of != kNone) {  // the base arrives, not the view
        t.shape = forward.tensor(t.view_of).shape;
        t.dtype = forward.tensor(t.view_of).dtype;
      }
      t.view_of = kNone;
      t.role = TensorRole::kInput;
    } else if (t.view_of != kNone) {
      t.view_of = map(t.view_of);
    }
    const TensorId added = out.AddTensor(std::move(t));
    mapped[static_cast<size_t>(id)] = added;
    return added;
  };
  std::vector<TensorId> sent;  // outputs of layer ops that a later stage reads
  for (const Op& op : forward.ops()) {
    const int s = stage_of(op);
    if (s > stage) {
      for (TensorId in : op.inputs) {
        const OpId p = forward.producer(in);
        if (p != kNone && stage_of(forward.op(p)) == stage && forward.op(p).layer >= 0 &&
            std::find(sent.begin(), sent.end(), in) == sent.end()) {
          sent.push_back(in);
        }
      }
      continue;
    }
    if (s != stage) continue;
    Op copy = op;
    for (TensorId& t : copy.inputs) t = map(t);
    for (TensorId& t : copy.outputs) t = map(t);
    for (TensorId& t : copy.saved) t = map(t);
    copy.layer = renumber(copy.layer);
    out.AddOp(std::move(copy));
  }
  if (stage < stages - 1) {
    if (sent.empty()) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "--pp: stage %d of %s sends nothing to the next stage; its layers do not form a pipeline", stage,
          QuoteForError(forward.name())));
    }
    Op send{.kind = "sum", .name = "pipeline.send", .phase = Phase::kLoss};
    for (TensorId t : sent) send.inputs.push_back(mapped[static_cast<size_t>(t)]);
    send.outputs.push_back(out.AddTensor({.name = "pipeline.send.out", .shape = {}, .dtype = DType::kF32}));
    out.AddOp(std::move(send));
  }
  return out;
}

OptimizerTemporaries OptimizerStepTemporaries(const Graph& forward, const JobSpec& job, const EstimateSetup& setup) {
  // Note [Optimizer step transients].
  OptimizerTemporaries out;
  // Adafactor has no multi-tensor implementation: it always runs one parameter at a time.
  out.together = job.optimizer_impl == OptimizerImpl::kForeach && job.optimizer != Optimizer::kAdafactor;
  const bool has_transient = job.training && job.optimizer != Optimizer::kSgd &&
                             job.optimizer != Optimizer::kSgdMomentum &&
                             job.optimizer_impl != OptimizerImpl::kFused && !job.layout.offload_optimizer &&
                             setup.framework != Framework::kDeepSpeed;
  if (!has_transient) return out;
  const DType state_dtype = setup.precision.master_weights ? DType::kF32 : setup.precision.optimizer_state_dtype;
  // The loop keeps two temporaries of one parameter at once; foreach one list (two before PyTorch 2.0).
  const uint64_t copies = out.together && !job.runtime.ForeachAdamKeepsTwoTemporaries() ? 1 : 2;
  out.tensors = static_cast<int>(copies);
  // foreach's list holds this rank's shards; the loop's one-parameter temporary is charged whole.
  const auto shards = static_cast<uint64_t>(out.together ? job.layout.shard_group() : 1);
  for (const Tensor& t : forward.tensors()) {
    if (t.role != TensorRole::kParameter || !t.trainable) continue;
    out.bytes.push_back(copies * CeilDiv(DTypeBytes(state_dtype, t.elements()), shards));
  }
  return out;
}

Overheads EstimateJobOverheads(const Machine& machine, const JobSpec& job) {
  // Note [CUDA context], Note [cuBLAS workspace in the replay].
  if (machine.gpu != nullptr) {
    Overheads out = EstimateOverheads(*machine.gpu, job.overheads);
    out.cublas_workspace *= static_cast<uint64_t>(CublasHandles(job));
    return out;
  }
  Overheads out;
  out.cuda_context = job.overheads.cuda_context.value_or(CudaContextFor("").bytes);
  out.cuda_context_source = job.overheads.cuda_context ? "--cuda-context" : CudaContextFor("").source;
  return out;
}

StepSeconds EstimateJobStepTime(const Graph& step, const Machine& machine, const JobSpec& job,
                                const EstimateSetup& setup) {
  if (machine.gpu == nullptr) return {};
  const CostModelOptions cost{.allow_tf32 = setup.precision.allow_tf32};
  const StepTime time = EstimateStepTimeBreakdown(step, *machine.gpu, cost);
  double optimizer = 0;
  if (auto it = time.seconds_by_phase.find(Phase::kOptimizer); it != time.seconds_by_phase.end()) {
    optimizer = it->second;
  }
  const double micro = time.seconds - optimizer;
  const auto m = static_cast<double>(job.grad_accum);
  const auto p = static_cast<double>(job.layout.pipeline_parallel);
  // 1F1B: m micro-batches through p stages take (m + p - 1) stage slots.
  return {.step = micro * (m + p - 1) / p + optimizer / p, .recompute = time.recompute_seconds * m / p};
}

}  // namespace headroom

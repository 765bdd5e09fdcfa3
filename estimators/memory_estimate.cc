#include "estimators/memory_estimate.h"

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_format.h"
#include "allocator/alloc_conf.h"
#include "common/checked_math.h"
#include "common/status_macros.h"
#include "common/units.h"
#include "estimators/estimate_stages.h"
#include "estimators/kv_cache.h"
#include "estimators/model_states.h"
#include "estimators/step_replay.h"
#include "graph/liveness.h"
#include "hardware/cost_model.h"

namespace headroom {
namespace {

// Note [Encoder-decoder KV cache]
// Generating from an encoder-decoder (T5, BART, Whisper) caches, in every decoder block, the keys and values
// of its self-attention over the tokens generated so far (`context`) and those of its cross-attention over
// the encoder's output, which are computed once from it and reused at every step (transformers'
// EncoderDecoderCache: a self_attention_cache and a cross_attention_cache; vLLM's encoder-decoder runner
// likewise keeps a cross-attention block table per sequence). The encoder's tokens are seq_len, or for Whisper
// its max_source_positions (1500) audio positions whatever the text (Note [Whisper] in
// models/builders/encoder_decoder.cc).
// Both caches take the same dtype and paging.

// KV cache for inference of decoders and encoder-decoders; 0 otherwise.
absl::StatusOr<uint64_t> KvCacheFor(const LoadedModel& model, const JobSpec& job, const EstimateSetup& setup) {
  if (job.training || job.context <= 0 || !model.config) return 0;
  const bool encoder_decoder = model.config->family == ModelFamily::kEncoderDecoder;
  const bool vision_language = model.config->family == ModelFamily::kVisionLanguage;
  if (model.config->family != ModelFamily::kDecoder && !encoder_decoder && !vision_language) return 0;
  // LLaVA's cache is its language model's, over text and image tokens alike (Note [LLaVA] in
  // models/builders/vision.cc).
  const ModelConfig& c = vision_language ? model.config->text_tower() : *model.config;
  KvCacheOptions kv{.num_layers = encoder_decoder ? c.decoder_layers : c.num_layers,
                    .num_kv_heads = std::max<int64_t>(1, c.num_kv_heads / job.layout.tensor_parallel),
                    .head_dim = c.head_dim,
                    .dtype = job.kv_dtype.value_or(setup.precision.compute_dtype),
                    .context_tokens = job.context,
                    .batch = job.micro_batch,
                    .block_size = job.kv_block_size,
                    .latent_dim = c.is_mla() ? c.kv_lora_rank + c.qk_rope_head_dim : 0};
  for (int64_t layer = 0; layer < c.num_layers; ++layer) kv.sliding_layers += c.is_sliding_layer(layer) ? 1 : 0;
  kv.sliding_window = kv.sliding_layers > 0 ? c.sliding_window : 0;
  HEADROOM_RETURN_IF_ERROR(ValidateKvCache(kv));
  if (!encoder_decoder) return KvCacheBytes(kv);
  // Note [Encoder-decoder KV cache].
  KvCacheOptions cross = kv;
  cross.context_tokens = c.model_type == "whisper" ? c.source_positions : std::max<int64_t>(1, setup.seq_len);
  HEADROOM_RETURN_IF_ERROR(ValidateKvCache(cross));
  return KvCacheBytes(kv) + KvCacheBytes(cross);  // each at most 2^50 (Note [KV cache bound])
}

// Note [Recurrent state]: MambaCache's conv_states and ssm_states, two blocks; none otherwise.
std::vector<uint64_t> RecurrentStateFor(const LoadedModel& model, const JobSpec& job, const EstimateSetup& setup) {
  if (job.training || !model.config || model.config->family != ModelFamily::kStateSpace || !model.config->use_cache) {
    return {};
  }
  const ModelConfig& c = *model.config;
  const DType dtype = setup.precision.weight_dtype;  // the embeddings' (autocast keeps them f32)
  // Saturating: an absurd product is then refused by CheckTotal, never wrapped.
  const uint64_t rows = SaturatingMul(static_cast<uint64_t>(c.num_layers) * static_cast<uint64_t>(c.intermediate_size),
                                      static_cast<uint64_t>(job.micro_batch));
  return {DTypeBytes(dtype, SaturatingMul(rows, static_cast<uint64_t>(c.conv_kernel))),
          DTypeBytes(dtype, SaturatingMul(rows, static_cast<uint64_t>(c.ssm_state_size)))};
}

// Note [Checked totals]
// Every category is below 2^62 (estimate_stages.h), but user flags add their
// own terms (--cuda-context, the pipeline's in-flight count), so the total is
// summed once with overflow checks; MemoryEstimate::total_bytes() can then
// add without them. The total and the capacity are also bounded by
// kMaxEstimateBytes (2^62 bytes, 4 EiB), so spare_bytes() is exact in int64.
constexpr uint64_t kMaxEstimateBytes = uint64_t{1} << 62;

absl::Status CheckTotal(const MemoryEstimate& e) {
  uint64_t total = 0;
  const std::vector<BudgetRow> rows = e.rows();
  const BudgetRow* largest = nullptr;
  for (const BudgetRow& row : rows) {
    HEADROOM_ASSIGN_OR_RETURN(total, CheckedAdd(total, row.bytes, absl::StrFormat("total bytes (%s)", row.key)));
    if (largest == nullptr || row.bytes > largest->bytes) largest = &row;
  }
  if (total > kMaxEstimateBytes) {
    return absl::OutOfRangeError(absl::StrFormat(
        "the estimate totals %d bytes (%s: %d), more than the %d (4 EiB) an estimate may reach", total,
        // A user-set context names its JobSpec field (the command line shows its flag).
        largest->key == "cuda_context" && e.overheads.cuda_context_source == "--cuda-context"
            ? "overheads.cuda_context"
            : largest->key,
        largest->bytes, kMaxEstimateBytes));
  }
  if (e.capacity > kMaxEstimateBytes) {
    return absl::OutOfRangeError(absl::StrFormat(
        "capacity (--budget or the GPU's memory) of %d bytes is more than the %d (4 EiB) an estimate may compare with",
        e.capacity, kMaxEstimateBytes));
  }
  return absl::OkStatus();
}

// The estimate of one GPU: `step` on `forward` (pipeline stage `stage`'s own under --pp, the whole step's
// without), holding `states` and `in_flight` micro-batches.
absl::StatusOr<MemoryEstimate> EstimateStage(const LoadedModel& model, const JobSpec& job, const Machine& machine,
                                             const EstimateSetup& setup, const Graph& forward, const Graph& step,
                                             const ModelStates& states, int stage, int in_flight,
                                             AllocationTrace* replayed) {
  MemoryEstimate out;
  out.framework = std::string(FrameworkName(setup.framework));
  out.seq_len = setup.seq_len;
  out.pipeline_stage = stage;
  out.host_bytes = states.host_bytes;
  out.parameters = states.model_parameters;
  out.trainable_parameters = states.trainable_parameters;
  out.capacity = machine.capacity();
  out.overheads = EstimateJobOverheads(machine, job);
  HEADROOM_ASSIGN_OR_RETURN(const uint64_t kv_cache, KvCacheFor(model, job, setup));
  // Note [Allocator replay]: resident state, the step, the optimizer's temporaries.
  const ResidentExtras extras{
      .kv_cache = kv_cache,
      .kv_cache_layers = !model.config ? 1
                         : model.config->family == ModelFamily::kEncoderDecoder
                             ? static_cast<int>(model.config->decoder_layers)
                         : model.config->family == ModelFamily::kVisionLanguage
                             ? static_cast<int>(model.config->text_tower().num_layers)
                             : static_cast<int>(model.config->num_layers),
      // Note [KV cache in the forward]: transformers' DynamicCache; a decoder's layers only.
      .kv_cache_in_forward = job.kv_block_size == 0 && model.config && model.config->family == ModelFamily::kDecoder,
      .recurrent_state = RecurrentStateFor(model, job, setup),
      .cublas_workspace = machine.gpu != nullptr ? machine.gpu->cublas_workspace_bytes : 0,
      .streams = job.overheads.streams,
      .cublas_handles = CublasHandles(job)};
  const std::vector<ResidentBlock> resident = ResidentBlocks(forward, states, job, setup, extras);
  OptimizerTemporaries temporaries = OptimizerStepTemporaries(forward, job, setup);
  // Note [Gradients: resident or by liveness].
  const ProfileOptions profile{.count_parameter_gradients = !setup.persistent_gradients};
  HEADROOM_ASSIGN_OR_RETURN(StepAllocations sequence,
                            BuildStepAllocations(step, resident,
                                                 {.profile = profile,
                                                  .autocast = setup.autocast,
                                                  .in_flight = in_flight,
                                                  .optimizer_temporaries = std::move(temporaries)}));
  const uint64_t device_bytes =
      out.capacity > out.overheads.cuda_context ? out.capacity - out.overheads.cuda_context : 0;
  HEADROOM_ASSIGN_OR_RETURN(const AllocatorReplay replay, ReplayAllocations(sequence, job.allocator, device_bytes));

  auto at_peak = [&](BudgetCategory category) { return sequence.bytes_at_peak[CategoryIndex(category)]; };
  out.weights = at_peak(BudgetCategory::kWeights);
  out.master_weights = at_peak(BudgetCategory::kMasterWeights);
  out.gradients = at_peak(BudgetCategory::kGradients);
  out.optimizer_state = at_peak(BudgetCategory::kOptimizerState);
  out.gathered_parameters = at_peak(BudgetCategory::kGatheredParameters);
  out.communication_buffers = at_peak(BudgetCategory::kCommunicationBuffers);
  out.fp8_weight_cache = at_peak(BudgetCategory::kFp8WeightCache);
  out.ema_weights = at_peak(BudgetCategory::kEmaWeights);
  out.activations = at_peak(BudgetCategory::kActivations);
  out.activation_gradients = at_peak(BudgetCategory::kActivationGradients);
  out.temporaries = at_peak(BudgetCategory::kTemporaries);
  out.kv_cache = at_peak(BudgetCategory::kKvCache);
  out.recurrent_state = at_peak(BudgetCategory::kRecurrentState);
  out.overheads.cublas_workspace = at_peak(BudgetCategory::kCublasWorkspace);
  // Note [Allocator rounding and cache].
  out.overheads.allocator_rounding = replay.peak_allocated_bytes - sequence.peak_bytes;
  out.overheads.allocator_cached = replay.peak_reserved_bytes - replay.peak_allocated_bytes;
  out.alloc_conf = FormatAllocConf(job.allocator);
  out.allocator_out_of_memory = replay.out_of_memory;
  HEADROOM_RETURN_IF_ERROR(CheckTotal(out));

  if (sequence.peak_at_optimizer_temporaries) {
    out.peak_op = absl::StrFormat("optimizer step (%s %s)", OptimizerName(job.optimizer),
                                  OptimizerImplName(job.optimizer_impl));
    out.peak_phase = "optimizer";
  } else if (sequence.peak_op != kNone) {
    const Op& op = step.op(sequence.peak_op);
    out.peak_op = op.name.empty() ? op.kind : op.name;
    out.peak_phase = std::string(PhaseName(op.phase));
    for (TensorId id : sequence.largest_live) {
      const Tensor& t = step.tensor(id);
      out.largest_live.push_back({.name = t.name,
                                  .role = std::string(TensorRoleName(t.role)),
                                  .dtype = std::string(DTypeName(t.dtype)),
                                  .shape = t.shape,
                                  .bytes = t.bytes()});
    }
  } else {
    out.peak_op = "before the step";
    out.peak_phase = "resident state only";
  }
  if (replayed != nullptr) *replayed = std::move(sequence.trace);

  return out;
}

}  // namespace

uint64_t MemoryEstimate::allocated_bytes() const {
  // Note [Checked totals]: EstimateMemory has checked that this cannot wrap.
  return weights + master_weights + gradients + optimizer_state + gathered_parameters + communication_buffers +
         fp8_weight_cache + ema_weights + activations + activation_gradients + temporaries + kv_cache +
         recurrent_state +
         overheads.cublas_workspace + overheads.allocator_rounding;
}

std::vector<BudgetRow> MemoryEstimate::rows() const {
  std::vector<BudgetRow> all = {
      {"weights", "weights", weights, ""},
      {"master_weights", "master weights (fp32)", master_weights, ""},
      {"gradients", "gradients", gradients, ""},
      {"optimizer_state", "optimizer state", optimizer_state, ""},
      {"gathered_parameters", "gathered layer (ZeRO-3/FSDP)", gathered_parameters, ""},
      {"communication_buffers", "DDP gradient buckets", communication_buffers, ""},
      {"fp8_weight_cache", "fp8 weight copies", fp8_weight_cache, ""},
      {"ema_weights", "EMA weights", ema_weights, ""},
      {"activations", "activations", activations, ""},
      {"activation_gradients", "activation gradients", activation_gradients, ""},
      {"temporaries", "temporaries", temporaries, ""},
      {"kv_cache", "KV cache", kv_cache, ""},
      {"recurrent_state", "recurrent state (conv + SSM)", recurrent_state, ""},
      {"cublas_workspace", "cuBLAS workspace", overheads.cublas_workspace, ""},
      {"allocator_rounding", "allocator rounding", overheads.allocator_rounding, ""},
      {"allocator_cached", "allocator cache (reserved, unused)", overheads.allocator_cached, ""},
      {"cuda_context", "CUDA context", overheads.cuda_context, overheads.cuda_context_source},
  };
  std::vector<BudgetRow> out;
  for (BudgetRow& row : all) {
    const bool core = row.key == "weights" || row.key == "activations" || row.key == "allocator_cached" ||
                      row.key == "cuda_context";
    if (row.bytes > 0 || core) out.push_back(std::move(row));
  }
  return out;
}

int64_t ResolveSeqLen(const LoadedModel& model, const JobSpec& job) {
  // A vision transformer's sequence is its image's patches (and class token), not a job setting.
  if (model.config && model.config->family == ModelFamily::kVision) return model.config->image_tokens();
  if (job.seq_len > 0) return job.seq_len;
  if (!model.config) return 0;
  const bool towers = model.config->family == ModelFamily::kContrastive ||
                      model.config->family == ModelFamily::kVisionLanguage;
  const ModelConfig& c = towers ? model.config->text_tower() : *model.config;
  if (c.family != ModelFamily::kDecoder && c.family != ModelFamily::kEncoder &&
      c.family != ModelFamily::kEncoderDecoder && c.family != ModelFamily::kStateSpace) {
    return 0;
  }
  const int64_t max_pos = c.max_position_embeddings > 0 ? c.max_position_embeddings : 4096;
  return std::min<int64_t>(max_pos, 4096);
}

absl::StatusOr<MemoryEstimate> EstimateMemory(const LoadedModel& model, const JobSpec& job,
                                              const Machine& machine, AllocationTrace* replayed) {
  HEADROOM_RETURN_IF_ERROR(ValidateJob(job));
  HEADROOM_RETURN_IF_ERROR(CheckJobAgainstModel(model, job));
  const EstimateSetup setup = ResolveSetup(model, job);

  HEADROOM_ASSIGN_OR_RETURN(const Graph forward, BuildForwardGraph(model, job, setup));
  const bool whole_step = IsWholeStep(model, forward);
  Graph step;
  if (whole_step) {
    step = forward;  // a graph file of a whole step is taken as given
  } else {
    HEADROOM_ASSIGN_OR_RETURN(step, BuildStep(forward, job, setup));
  }
  const StepSeconds time = EstimateJobStepTime(step, machine, job, setup);

  const int stages = job.layout.pipeline_parallel;
  MemoryEstimate out;
  if (stages == 1) {
    HEADROOM_ASSIGN_OR_RETURN(const ModelStates states, StageModelStates(forward, job, setup, 0));
    HEADROOM_ASSIGN_OR_RETURN(out, EstimateStage(model, job, machine, setup, forward, step, states, 0, 1, replayed));
  } else {
    if (whole_step) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "pipeline_parallel %d: a graph file with its own backward, or a node-link graph, cannot be cut into "
          "pipeline stages",
          stages));
    }
    // Note [Pipeline 1F1B]: each stage's own step is replayed; the estimate is the fullest stage's.
    const int first = job.layout.pipeline_stage >= 0 ? job.layout.pipeline_stage : 0;
    const int last = job.layout.pipeline_stage >= 0 ? job.layout.pipeline_stage : stages - 1;
    std::vector<StagePeak> peaks;
    for (int s = first; s <= last; ++s) {
      HEADROOM_ASSIGN_OR_RETURN(const Graph stage_forward, PipelineStageForward(forward, s, stages));
      HEADROOM_ASSIGN_OR_RETURN(const ModelStates states, StageModelStates(forward, job, setup, s));
      // Note [Gradients in the first backward] in memory_estimate.h: the first backward, and the later ones.
      const int in_flight = job.layout.MicroBatchesInFlight(s, job.grad_accum);
      std::vector<std::pair<int, EstimateSetup>> moments;
      if (setup.gradients_outlive_step || job.grad_accum > in_flight) {
        moments.push_back({in_flight, setup});  // the later backwards hold as many micro-batches, and gradients
      } else {
        EstimateSetup first_backward = setup;
        first_backward.persistent_gradients = false;
        moments.push_back({in_flight, first_backward});
        if (in_flight > 1) moments.push_back({in_flight - 1, setup});
      }
      MemoryEstimate fullest;
      AllocationTrace fullest_trace;
      for (size_t i = 0; i < moments.size(); ++i) {
        const auto& [held, moment_setup] = moments[i];
        HEADROOM_ASSIGN_OR_RETURN(const Graph stage_step, BuildStep(stage_forward, job, moment_setup));
        AllocationTrace trace;
        HEADROOM_ASSIGN_OR_RETURN(MemoryEstimate e,
                                  EstimateStage(model, job, machine, moment_setup, stage_forward, stage_step, states,
                                                s, held, replayed != nullptr ? &trace : nullptr));
        if (i == 0 || e.total_bytes() > fullest.total_bytes()) {
          fullest = std::move(e);
          fullest_trace = std::move(trace);
        }
      }
      const StagePeak peak{.stage = s,
                           .in_flight = in_flight,
                           .allocated_bytes = fullest.allocated_bytes(),
                           .reserved_bytes = fullest.reserved_bytes(),
                           .peak_op = fullest.peak_op,
                           .peak_phase = fullest.peak_phase};
      if (s == first || fullest.total_bytes() > out.total_bytes()) {
        out = std::move(fullest);
        if (replayed != nullptr) *replayed = std::move(fullest_trace);
      }
      peaks.push_back(peak);
    }
    out.pipeline_stages = std::move(peaks);
  }
  out.step_seconds = time.step;
  out.recompute_seconds = time.recompute;
  return out;
}

}  // namespace headroom

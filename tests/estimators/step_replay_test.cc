// The allocator replay stage of an estimate (estimators/step_replay.h): its
// sequence peaks where ProfileMemory does, EstimateMemory's allocated and
// reserved bytes are the replay's, and the allocator's policy and
// configuration show in the reserved bytes.
#include "estimators/step_replay.h"

#include <algorithm>
#include <map>
#include <numeric>
#include <utility>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "allocator/alloc_conf.h"
#include "common/units.h"
#include "estimators/memory_estimate.h"
#include "gmock/gmock.h"
#include "graph/liveness.h"
#include "hardware/gpu_catalog.h"
#include "gtest/gtest.h"
#include "replay/trace_replay.h"

namespace headroom {
namespace {

using ::testing::StartsWith;

constexpr uint64_t kRoomy = uint64_t{80} << 30;

LoadedModel Gpt2() {
  absl::StatusOr<LoadedModel> model = LoadModel("gpt2");
  EXPECT_TRUE(model.ok()) << model.status();
  return model.ok() ? *std::move(model) : LoadedModel{};
}

uint64_t Sum(const CategoryBytes& bytes) { return std::accumulate(bytes.begin(), bytes.end(), uint64_t{0}); }

// The step's tensors alone (no resident state, no optimizer temporaries)
// peak exactly where and as high as ProfileMemory says, with the bytes
// AttributePeak gives each role.
TEST(StepAllocations, TheStepAlonePeaksAsProfileMemoryAccounts) {
  const LoadedModel gpt2 = Gpt2();
  const JobSpec job;
  const EstimateSetup setup = ResolveSetup(gpt2, job);
  absl::StatusOr<Graph> forward = BuildForwardGraph(gpt2, job, setup);
  ASSERT_TRUE(forward.ok()) << forward.status();
  absl::StatusOr<Graph> step = BuildStep(*forward, job, setup);
  ASSERT_TRUE(step.ok()) << step.status();
  const PeakAttribution peak = AttributePeak(*step, setup);
  const ProfileOptions profile{.count_parameter_gradients = !setup.persistent_gradients};
  absl::StatusOr<StepAllocations> sequence =
      BuildStepAllocations(*step, {}, {.profile = profile, .autocast = setup.autocast});
  ASSERT_TRUE(sequence.ok()) << sequence.status();
  EXPECT_EQ(sequence->peak_bytes, peak.profile.peak_bytes);
  EXPECT_EQ(sequence->peak_op, peak.profile.peak_op);
  auto at_peak = [&](BudgetCategory c) { return sequence->bytes_at_peak[CategoryIndex(c)]; };
  EXPECT_EQ(at_peak(BudgetCategory::kActivations), peak.activations);
  EXPECT_EQ(at_peak(BudgetCategory::kWeights), peak.autocast_copies);
  EXPECT_EQ(at_peak(BudgetCategory::kGradients), peak.parameter_gradients);
  EXPECT_EQ(at_peak(BudgetCategory::kActivationGradients), peak.activation_gradients);
  EXPECT_EQ(at_peak(BudgetCategory::kTemporaries), peak.temporaries);
  EXPECT_EQ(Sum(sequence->bytes_at_peak), sequence->peak_bytes);
  ASSERT_FALSE(sequence->largest_live.empty());
  EXPECT_EQ(sequence->largest_live[0], peak.profile.live_at_peak[0]);

  // The replay of the trace sees the same peak; allocated and reserved are at least it.
  absl::StatusOr<ReplayResult> replay = ReplayTrace(sequence->trace, {.strict = true});
  ASSERT_TRUE(replay.ok()) << replay.status();
  EXPECT_EQ(replay->peak_live_bytes, sequence->peak_bytes);
  EXPECT_EQ(replay->allocations, replay->frees);
  EXPECT_GE(replay->peak_allocated_bytes, replay->peak_live_bytes);
  EXPECT_GE(replay->peak_reserved_bytes, replay->peak_allocated_bytes);

  // Resident blocks come first and stay: they add to the peak, in their categories.
  const std::vector<ResidentBlock> resident = {{.bytes = 3 * kMiB, .category = BudgetCategory::kOptimizerState},
                                               {.bytes = 5 * kMiB, .category = BudgetCategory::kWeights}};
  absl::StatusOr<StepAllocations> with_state =
      BuildStepAllocations(*step, resident, {.profile = profile, .autocast = setup.autocast});
  ASSERT_TRUE(with_state.ok()) << with_state.status();
  EXPECT_EQ(with_state->peak_bytes, sequence->peak_bytes + 8 * kMiB);
  EXPECT_EQ(with_state->bytes_at_peak[CategoryIndex(BudgetCategory::kOptimizerState)], 3 * kMiB);
  EXPECT_EQ(with_state->peak_op, sequence->peak_op);
}

// EstimateMemory's allocated and reserved bytes are those of replaying the
// sequence it built; its rows sum to the nvidia-smi figure.
TEST(EstimateMemory, AllocatedAndReservedAreTheReplays) {
  const LoadedModel gpt2 = Gpt2();
  for (const char* conf : {"", "expandable_segments:True", "max_split_size_mb:64"}) {
    SCOPED_TRACE(conf);
    JobSpec job{.micro_batch = 4};
    absl::StatusOr<AllocatorOptions> allocator = ParseAllocConf(conf);
    ASSERT_TRUE(allocator.ok()) << allocator.status();
    job.allocator = *allocator;
    AllocationTrace trace;
    absl::StatusOr<MemoryEstimate> e = EstimateMemory(gpt2, job, {.budget = kRoomy}, &trace);
    ASSERT_TRUE(e.ok()) << e.status();
    absl::StatusOr<ReplayResult> replay =
        ReplayTrace(trace, {.capacity_bytes = kRoomy, .allocator = *allocator, .strict = true});
    ASSERT_TRUE(replay.ok()) << replay.status();
    EXPECT_EQ(e->allocated_bytes(), replay->peak_allocated_bytes);
    EXPECT_EQ(e->reserved_bytes(), replay->peak_reserved_bytes);
    EXPECT_EQ(e->total_bytes(), replay->peak_reserved_bytes + e->overheads.cuda_context);
    EXPECT_EQ(e->allocated_bytes() - e->overheads.allocator_rounding, replay->peak_live_bytes);
    EXPECT_GE(e->reserved_bytes(), e->allocated_bytes());
    uint64_t rows = 0;
    for (const BudgetRow& row : e->rows()) rows += row.bytes;
    EXPECT_EQ(rows, e->total_bytes());
    EXPECT_EQ(e->alloc_conf, conf);
    EXPECT_TRUE(e->fits());
  }
}

// Note [cuBLAS handle per thread]: training holds a workspace for the Python
// thread's handle and one for the autograd thread's, inference only the first;
// each is a block the replay allocates, on the GPU's workspace size.
TEST(EstimateMemory, TrainingHoldsTwoCublasWorkspacesInferenceOne) {
  const LoadedModel gpt2 = Gpt2();
  absl::StatusOr<const GpuSpec*> h100 = GpuCatalog::Builtin().Find("H100-SXM-80GB");
  ASSERT_TRUE(h100.ok()) << h100.status();
  JobSpec inference{.training = false, .precision = Precision::kBf16};
  for (const auto& [job, handles] : {std::pair{JobSpec{}, 2}, std::pair{inference, 1}}) {
    AllocationTrace trace;
    absl::StatusOr<MemoryEstimate> e = EstimateMemory(gpt2, job, {.gpu = *h100, .budget = kRoomy}, &trace);
    ASSERT_TRUE(e.ok()) << e.status();
    EXPECT_EQ(e->overheads.cublas_workspace, handles * (*h100)->cublas_workspace_bytes);
    const auto workspaces = std::count_if(trace.events.begin(), trace.events.end(), [&](const TraceEvent& event) {
      return event.op == TraceOp::kAllocate && event.size == (*h100)->cublas_workspace_bytes;
    });
    EXPECT_EQ(workspaces, handles);
  }
}

// The resident state is the model states, whatever the framework: its
// blocks sum to each category's bytes.
TEST(EstimateMemory, ResidentBlocksSumToTheModelStates) {
  const LoadedModel gpt2 = Gpt2();
  JobSpec plain;
  JobSpec zero3{.keep_gradients = true};
  zero3.layout = {.gpus = 4, .sharding = Sharding::kZero3};
  JobSpec megatron{.grad_accum = 4, .ema = EmaPlacement::kGpu};
  megatron.layout = {.gpus = 2, .tensor_parallel = 2};
  for (const JobSpec& job : {plain, zero3, megatron}) {
    const EstimateSetup setup = ResolveSetup(gpt2, job);
    absl::StatusOr<Graph> forward = BuildForwardGraph(gpt2, job, setup);
    ASSERT_TRUE(forward.ok()) << forward.status();
    absl::StatusOr<ModelStates> states = EstimateModelStates(
        *forward, {.precision = setup.precision, .optimizer = job.optimizer, .layout = job.layout, .ema = job.ema});
    ASSERT_TRUE(states.ok()) << states.status();
    const std::vector<ResidentBlock> blocks =
        ResidentBlocks(*forward, *states, job, setup, {.cublas_workspace = 4 * kMiB, .streams = 2});
    CategoryBytes sum{};
    for (const ResidentBlock& b : blocks) sum[CategoryIndex(b.category)] += b.bytes;
    EXPECT_EQ(sum[CategoryIndex(BudgetCategory::kWeights)], states->weights + states->buffers);
    EXPECT_EQ(sum[CategoryIndex(BudgetCategory::kOptimizerState)], states->optimizer_state);
    EXPECT_EQ(sum[CategoryIndex(BudgetCategory::kMasterWeights)], states->master_weights);
    EXPECT_EQ(sum[CategoryIndex(BudgetCategory::kGradients)], setup.persistent_gradients ? states->gradients : 0);
    EXPECT_EQ(sum[CategoryIndex(BudgetCategory::kEmaWeights)], states->ema_weights);
    EXPECT_EQ(sum[CategoryIndex(BudgetCategory::kGatheredParameters)], states->gathered_parameters);
    EXPECT_EQ(sum[CategoryIndex(BudgetCategory::kCommunicationBuffers)], states->communication_buffers);
    EXPECT_EQ(sum[CategoryIndex(BudgetCategory::kCublasWorkspace)], 8 * kMiB);
  }
  // Plain PyTorch: one weight block per parameter and buffer (GPT-2's causal
  // masks), each its own size, and two AdamW moments per parameter.
  const EstimateSetup setup = ResolveSetup(gpt2, plain);
  absl::StatusOr<Graph> forward = BuildForwardGraph(gpt2, plain, setup);
  ASSERT_TRUE(forward.ok()) << forward.status();
  absl::StatusOr<ModelStates> states = EstimateModelStates(*forward, {.precision = setup.precision});
  ASSERT_TRUE(states.ok()) << states.status();
  std::vector<uint64_t> parameters_and_buffers, weights, moments;
  size_t parameters = 0;
  for (TensorRole role : {TensorRole::kParameter, TensorRole::kBuffer}) {  // parameters first, then buffers
    for (const Tensor& t : forward->tensors()) {
      if (t.role == role) parameters_and_buffers.push_back(t.bytes());
    }
  }
  for (const Tensor& t : forward->tensors()) parameters += t.role == TensorRole::kParameter ? 1 : 0;
  for (const ResidentBlock& b : ResidentBlocks(*forward, *states, plain, setup, {})) {
    if (b.category == BudgetCategory::kWeights) weights.push_back(b.bytes);
    if (b.category == BudgetCategory::kOptimizerState) moments.push_back(b.bytes);
  }
  EXPECT_EQ(weights, parameters_and_buffers);
  EXPECT_EQ(moments.size(), 2 * parameters);
}

// Three ops: a 12 MiB tensor dies before a 14 MiB one is made. PyTorch's
// default policy cannot put the second in the first's 12 MiB segment and
// reserves both; expandable segments grow one segment in 20 MiB pages and
// reserve no more than the pages the largest live set needs.
// Note [FSDP units in the step]: GPT-2 peaks at the loss's backward, where
// FULL_SHARD holds the root unit and the last block (prefetched for
// backward) gathered, SHARD_GRAD_OP the root and every block, and no
// gradient exists yet; each unit's bytes are its parameters' own.
TEST(EstimateMemory, FsdpUnitsAreGatheredWhileTheyRun) {
  const LoadedModel gpt2 = Gpt2();
  JobSpec full;
  full.layout = {.gpus = 2, .sharding = Sharding::kFsdpFull};
  JobSpec grad_op = full;
  grad_op.layout.sharding = Sharding::kFsdpGradOp;
  const EstimateSetup setup = ResolveSetup(gpt2, full);
  absl::StatusOr<Graph> forward = BuildForwardGraph(gpt2, full, setup);
  ASSERT_TRUE(forward.ok()) << forward.status();
  std::map<int, uint64_t> unit_bytes;
  for (const Tensor& t : forward->tensors()) {
    if (t.role != TensorRole::kParameter) continue;
    unit_bytes[std::max(t.layer, -1)] += DTypeBytes(setup.precision.weight_dtype, t.elements());
  }
  const int last_block = unit_bytes.rbegin()->first;
  ASSERT_EQ(last_block, 11);

  absl::StatusOr<MemoryEstimate> sharded = EstimateMemory(gpt2, full, Machine{.budget = kRoomy});
  ASSERT_TRUE(sharded.ok()) << sharded.status();
  EXPECT_EQ(sharded->peak_op, "loss.log_softmax.backward");
  EXPECT_EQ(sharded->gathered_parameters, unit_bytes[-1] + unit_bytes[last_block]);
  EXPECT_EQ(sharded->gradients, 0u);

  absl::StatusOr<MemoryEstimate> kept = EstimateMemory(gpt2, grad_op, Machine{.budget = kRoomy});
  ASSERT_TRUE(kept.ok()) << kept.status();
  uint64_t every_unit = 0;
  for (const auto& [unit, bytes] : unit_bytes) every_unit += bytes;
  EXPECT_EQ(kept->gathered_parameters, every_unit);
  EXPECT_EQ(kept->activations, sharded->activations);

  // With accumulation the gradient shards stay between micro-batches: resident.
  JobSpec accumulating = full;
  accumulating.grad_accum = 4;
  absl::StatusOr<MemoryEstimate> accumulated = EstimateMemory(gpt2, accumulating, Machine{.budget = kRoomy});
  ASSERT_TRUE(accumulated.ok()) << accumulated.status();
  EXPECT_GT(accumulated->gradients, 0u);
}

TEST(ReplayAllocations, ExpandableSegmentsReserveNoMoreThanNeeded) {
  Graph g("grow");
  const TensorId x = g.AddTensor({.name = "x", .shape = {16}, .role = TensorRole::kInput});
  const TensorId a = g.AddTensor({.name = "a", .shape = {3 * 1024 * 1024}});  // 12 MiB
  const TensorId s = g.AddTensor({.name = "s", .shape = {1}});
  const TensorId b = g.AddTensor({.name = "b", .shape = {3584 * 1024}});      // 14 MiB
  const TensorId y = g.AddTensor({.name = "y", .shape = {1}});
  g.AddOp({.kind = "linear", .name = "make_a", .inputs = {x}, .outputs = {a}});
  g.AddOp({.kind = "sum", .name = "reduce_a", .inputs = {a}, .outputs = {s}});
  g.AddOp({.kind = "linear", .name = "make_b", .inputs = {s}, .outputs = {b}});
  g.AddOp({.kind = "sum", .name = "reduce_b", .inputs = {b}, .outputs = {y}});
  absl::StatusOr<StepAllocations> sequence = BuildStepAllocations(g, {}, {});
  ASSERT_TRUE(sequence.ok()) << sequence.status();
  EXPECT_EQ(sequence->peak_bytes, ProfileMemory(g).peak_bytes);

  absl::StatusOr<AllocatorReplay> native = ReplayAllocations(*sequence, {}, kRoomy);
  ASSERT_TRUE(native.ok()) << native.status();
  absl::StatusOr<AllocatorReplay> expandable = ReplayAllocations(*sequence, {.expandable_segments = true}, kRoomy);
  ASSERT_TRUE(expandable.ok()) << expandable.status();
  // Small tensors take one 2 MiB small-pool segment under either policy.
  EXPECT_EQ(native->peak_reserved_bytes, 12 * kMiB + 14 * kMiB + 2 * kMiB);
  EXPECT_EQ(expandable->peak_reserved_bytes, 20 * kMiB + 2 * kMiB);
  EXPECT_FALSE(native->out_of_memory);
  EXPECT_FALSE(expandable->out_of_memory);
  for (const AllocatorReplay& r : {*native, *expandable}) {
    EXPECT_GE(r.peak_allocated_bytes, sequence->peak_bytes);
    EXPECT_GE(r.peak_reserved_bytes, r.peak_allocated_bytes);
  }

  // On a device too small for the default policy's two segments the replay
  // runs short (Note [Replay capacity]) and reports what it would need;
  // expandable segments fit.
  absl::StatusOr<AllocatorReplay> tight = ReplayAllocations(*sequence, {}, 24 * kMiB);
  ASSERT_TRUE(tight.ok()) << tight.status();
  EXPECT_TRUE(tight->out_of_memory);
  EXPECT_EQ(tight->peak_reserved_bytes, native->peak_reserved_bytes);
  absl::StatusOr<AllocatorReplay> tight_expandable =
      ReplayAllocations(*sequence, {.expandable_segments = true}, 24 * kMiB);
  ASSERT_TRUE(tight_expandable.ok()) << tight_expandable.status();
  EXPECT_FALSE(tight_expandable->out_of_memory);
}

// Note [Pipeline warm-up in the replay]: each other micro-batch in flight
// holds what its forward leaves for backward; the peak is the step's own,
// higher by those held bytes.
TEST(StepAllocations, InFlightMicroBatchesHoldTheirSavedTensors) {
  const LoadedModel gpt2 = Gpt2();
  const JobSpec job;
  const EstimateSetup setup = ResolveSetup(gpt2, job);
  absl::StatusOr<Graph> forward = BuildForwardGraph(gpt2, job, setup);
  ASSERT_TRUE(forward.ok()) << forward.status();
  absl::StatusOr<Graph> step = BuildStep(*forward, job, setup);
  ASSERT_TRUE(step.ok()) << step.status();
  const ProfileOptions profile{.count_parameter_gradients = false};
  const std::vector<TensorLifetime> life = ComputeLifetimes(*step, profile);
  OpId forward_end = 0;
  while (step->op(forward_end + 1).phase != Phase::kBackward) ++forward_end;
  uint64_t held = 0;
  for (const Tensor& t : step->tensors()) {
    const TensorLifetime& l = life[static_cast<size_t>(t.id)];
    if (l.first <= l.last && l.first <= forward_end && l.last > forward_end) held += t.bytes();
  }
  ASSERT_GT(held, 0u);
  absl::StatusOr<StepAllocations> one = BuildStepAllocations(*step, {}, {.profile = profile});
  absl::StatusOr<StepAllocations> three = BuildStepAllocations(*step, {}, {.profile = profile, .in_flight = 3});
  ASSERT_TRUE(one.ok() && three.ok());
  EXPECT_EQ(three->peak_bytes, one->peak_bytes + 2 * held);
  EXPECT_EQ(three->peak_op, one->peak_op);
  EXPECT_FALSE(three->peak_in_warm_up);
  absl::StatusOr<ReplayResult> replay = ReplayTrace(three->trace, {.strict = true});
  ASSERT_TRUE(replay.ok()) << replay.status();
  EXPECT_EQ(replay->allocations, replay->frees);
  EXPECT_EQ(replay->peak_live_bytes, three->peak_bytes);
}

// Note [KV cache in the forward]: a contiguous cache's keys and values are
// allocated at each layer's first attention op, in layer order; a paged one,
// or one whose layers the forward's attention does not match, before the step.
TEST(StepAllocations, AContiguousKvCacheFillsAsTheForwardRuns) {
  const LoadedModel gpt2 = Gpt2();  // 12 layers
  const JobSpec job{.training = false, .seq_len = 128, .context = 128, .kv_block_size = 0};
  const EstimateSetup setup = ResolveSetup(gpt2, job);
  absl::StatusOr<Graph> forward = BuildForwardGraph(gpt2, job, setup);
  ASSERT_TRUE(forward.ok()) << forward.status();
  absl::StatusOr<Graph> step = BuildStep(*forward, job, setup);
  ASSERT_TRUE(step.ok()) << step.status();
  constexpr uint64_t kTensor = 777777;  // a size no step tensor has
  // The allocation times (op indices; 0 before the step) of the cache's blocks.
  auto cache_times = [&](bool in_forward, int layers) {
    const std::vector<ResidentBlock> resident =
        ResidentBlocks(*forward, ModelStates{}, job, setup,
                       {.kv_cache = 2 * 12 * kTensor, .kv_cache_layers = layers, .kv_cache_in_forward = in_forward});
    absl::StatusOr<StepAllocations> sequence = BuildStepAllocations(*step, resident, {});
    EXPECT_TRUE(sequence.ok()) << sequence.status();
    std::vector<uint64_t> times;
    for (const TraceEvent& e : sequence->trace.events) {
      if (e.op == TraceOp::kAllocate && e.size == kTensor) times.push_back(e.time_ns);
    }
    return times;
  };
  const std::vector<uint64_t> filled = cache_times(/*in_forward=*/true, 12);
  ASSERT_EQ(filled.size(), 24u);  // keys and values of each layer
  for (size_t layer = 0; layer < 12; ++layer) {
    EXPECT_EQ(filled[2 * layer + 1], filled[2 * layer]);
    EXPECT_EQ(step->op(static_cast<OpId>(filled[2 * layer])).name,
              absl::StrFormat("transformer.h.%d.attn_core.sdpa", layer));  // flash attention, the default
  }
  EXPECT_THAT(cache_times(/*in_forward=*/false, 12), ::testing::Each(0u));  // paged: 12 blocks of twice the size
  EXPECT_THAT(cache_times(/*in_forward=*/true, 5), ::testing::Each(0u));    // 5 cached layers, 12 in the forward
}

// Note [Optimizer step transients]: at a short sequence GPT-2's foreach
// AdamW step (all gradients and a state-sized copy) is the peak; fused
// AdamW allocates nothing there, and the forward/backward peak is reported.
TEST(EstimateMemory, TheOptimizerStepIsThePeakWhenItsTemporariesAreTheLargest) {
  const LoadedModel gpt2 = Gpt2();
  JobSpec job{.seq_len = 64};
  absl::StatusOr<MemoryEstimate> foreach = EstimateMemory(gpt2, job, {.budget = kRoomy});
  ASSERT_TRUE(foreach.ok()) << foreach.status();
  EXPECT_EQ(foreach->peak_op, "optimizer step (adamw foreach)");
  EXPECT_EQ(foreach->peak_phase, "optimizer");
  EXPECT_EQ(foreach->temporaries, foreach->optimizer_state / 2);  // one fp32 copy of the moments' size
  job.optimizer_impl = OptimizerImpl::kFused;
  absl::StatusOr<MemoryEstimate> fused = EstimateMemory(gpt2, job, {.budget = kRoomy});
  ASSERT_TRUE(fused.ok()) << fused.status();
  EXPECT_NE(fused->peak_phase, "optimizer");
  EXPECT_LT(fused->total_bytes(), foreach->total_bytes());
}

// --pp on a graph file that holds its own backward is refused, as `plan` refuses it.
TEST(EstimateMemory, PipelineStagesOfAWholeStepGraphAreRefused) {
  const LoadedModel gpt2 = Gpt2();
  const EstimateSetup setup = ResolveSetup(gpt2, {});
  absl::StatusOr<Graph> forward = BuildForwardGraph(gpt2, {}, setup);
  ASSERT_TRUE(forward.ok()) << forward.status();
  absl::StatusOr<Graph> step = BuildStep(*forward, {}, setup);
  ASSERT_TRUE(step.ok()) << step.status();
  const LoadedModel file{.name = "step.json", .kind = ModelSourceKind::kGraphFile, .graph = *step};
  JobSpec job;
  job.layout = {.gpus = 2, .pipeline_parallel = 2};
  absl::StatusOr<MemoryEstimate> e = EstimateMemory(file, job, {.budget = kRoomy});
  ASSERT_FALSE(e.ok());
  EXPECT_THAT(std::string(e.status().message()), StartsWith("pipeline_parallel 2: a graph file with its own backward"));
}

// Note [Pipeline 1F1B]: every stage is replayed and the estimate is the fullest; --pp-stage estimates one
// stage, with the figures the list gives it. GPipe holds every micro-batch on every stage, so each stage
// needs more than under 1F1B, the last stage most of all (one micro-batch under 1F1B, all of them here).
TEST(EstimateMemory, EveryPipelineStageIsReplayed) {
  const LoadedModel gpt2 = Gpt2();
  JobSpec job;
  job.layout = {.gpus = 2, .pipeline_parallel = 2};
  job.grad_accum = 4;
  absl::StatusOr<MemoryEstimate> all = EstimateMemory(gpt2, job, {.budget = kRoomy});
  ASSERT_TRUE(all.ok()) << all.status();
  ASSERT_EQ(all->pipeline_stages.size(), 2u);
  EXPECT_EQ(all->pipeline_stages[0].in_flight, 2);
  EXPECT_EQ(all->pipeline_stages[1].in_flight, 1);
  for (const StagePeak& stage : all->pipeline_stages) {
    EXPECT_LE(stage.allocated_bytes, all->allocated_bytes());
    job.layout.pipeline_stage = stage.stage;
    absl::StatusOr<MemoryEstimate> one = EstimateMemory(gpt2, job, {.budget = kRoomy});
    ASSERT_TRUE(one.ok()) << one.status();
    EXPECT_EQ(one->pipeline_stage, stage.stage);
    ASSERT_EQ(one->pipeline_stages.size(), 1u);
    EXPECT_EQ(one->allocated_bytes(), stage.allocated_bytes);
    EXPECT_EQ(one->peak_op, stage.peak_op);
  }
  EXPECT_EQ(all->allocated_bytes(), all->pipeline_stages[all->pipeline_stage].allocated_bytes);

  job.layout.pipeline_stage = -1;
  job.layout.pipeline_schedule = PipelineSchedule::kGPipe;
  absl::StatusOr<MemoryEstimate> gpipe = EstimateMemory(gpt2, job, {.budget = kRoomy});
  ASSERT_TRUE(gpipe.ok()) << gpipe.status();
  ASSERT_EQ(gpipe->pipeline_stages.size(), 2u);
  for (int s = 0; s < 2; ++s) {
    EXPECT_EQ(gpipe->pipeline_stages[s].in_flight, 4);
    EXPECT_GT(gpipe->pipeline_stages[s].allocated_bytes, all->pipeline_stages[s].allocated_bytes);
  }
}

// Note [Gradients in the first backward]: under GPipe with PyTorch's own gradients (--torch-parallel), the
// peak is the first backward, where the gradients are made as it runs: fewer of them are live at the peak
// than the stage's whole gradient buffer, which Megatron's layout holds throughout.
TEST(EstimateMemory, GpipeFirstBackwardMakesItsGradients) {
  const LoadedModel gpt2 = Gpt2();
  JobSpec job;
  job.layout = {.gpus = 2, .pipeline_parallel = 2, .pipeline_schedule = PipelineSchedule::kGPipe};
  job.grad_accum = 4;
  absl::StatusOr<MemoryEstimate> megatron = EstimateMemory(gpt2, job, {.budget = kRoomy});
  ASSERT_TRUE(megatron.ok()) << megatron.status();
  job.layout.torch_parallel = true;
  job.precision = Precision::kFp32;
  absl::StatusOr<MemoryEstimate> torch = EstimateMemory(gpt2, job, {.budget = kRoomy});
  ASSERT_TRUE(torch.ok()) << torch.status();
  EXPECT_EQ(torch->framework, "pytorch");
  EXPECT_EQ(torch->peak_phase, "backward");
  job.precision = Precision::kFp32;
  job.layout.torch_parallel = false;
  absl::StatusOr<MemoryEstimate> megatron_fp32 = EstimateMemory(gpt2, job, {.budget = kRoomy});
  ASSERT_TRUE(megatron_fp32.ok()) << megatron_fp32.status();
  EXPECT_EQ(megatron_fp32->framework, "megatron");
  EXPECT_LT(torch->gradients, megatron_fp32->gradients);
  EXPECT_GT(megatron->gradients, 0u);
}

// Note [loss_parallel's cross-entropy]: under --tp with --torch-parallel, nll_loss's backward writes the
// gradient of the logits' shard beside two temporaries of its size, and log_softmax's backward hands it on.
TEST(BuildStep, LossParallelBackwardIsOneFunction) {
  const LoadedModel gpt2 = Gpt2();
  JobSpec job;
  job.layout = {.gpus = 2, .tensor_parallel = 2, .torch_parallel = true};
  job.precision = Precision::kFp32;
  const EstimateSetup setup = ResolveSetup(gpt2, job);
  absl::StatusOr<Graph> forward = BuildForwardGraph(gpt2, job, setup);
  ASSERT_TRUE(forward.ok()) << forward.status();
  absl::StatusOr<Graph> step = BuildStep(*forward, job, setup);
  ASSERT_TRUE(step.ok()) << step.status();
  const Op* nll = nullptr;
  const Op* log_softmax = nullptr;
  for (const Op& op : step->ops()) {
    if (op.kind == "nll_loss_parallel_backward") nll = &op;
    if (op.kind == "log_softmax_parallel_backward") log_softmax = &op;
  }
  ASSERT_NE(nll, nullptr);
  ASSERT_NE(log_softmax, nullptr);
  ASSERT_EQ(nll->outputs.size(), 3u);
  const Tensor& grad = step->tensor(nll->outputs[0]);
  EXPECT_EQ(grad.shape.back(), 50257 / 2 + 1);  // the head's vocabulary shard
  for (TensorId t : nll->outputs) EXPECT_EQ(step->tensor(t).bytes(), grad.bytes());
  ASSERT_EQ(log_softmax->outputs.size(), 1u);
  EXPECT_EQ(step->tensor(log_softmax->outputs[0]).view_of, nll->outputs[0]);
}

// BuildOptions::dtensor: under sequence parallelism a DTensor Linear saves the gathered input; Megatron's
// saves its sequence shard and gathers it again in backward.
TEST(BuildStep, SequenceParallelLinearsSaveWhatTheirRuntimeKeeps) {
  const LoadedModel gpt2 = Gpt2();
  for (bool torch_parallel : {false, true}) {
    JobSpec job;
    job.layout = {.gpus = 2, .tensor_parallel = 2, .sequence_parallel = true, .torch_parallel = torch_parallel};
    const EstimateSetup setup = ResolveSetup(gpt2, job);
    absl::StatusOr<Graph> forward = BuildForwardGraph(gpt2, job, setup);
    ASSERT_TRUE(forward.ok()) << forward.status();
    const Op* fc = nullptr;
    for (const Op& op : forward->ops()) {
      if (op.name == "transformer.h.0.mlp.c_fc") fc = &op;
    }
    ASSERT_NE(fc, nullptr);
    ASSERT_FALSE(fc->saved.empty());
    const Tensor& saved = forward->tensor(fc->saved.front());
    EXPECT_EQ(saved.shape[1], torch_parallel ? 1024 : 512) << (torch_parallel ? "DTensor" : "Megatron");
  }
}

}  // namespace
}  // namespace headroom

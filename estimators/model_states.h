// Model states on one GPU: weights, fp32 master weights, gradients and
// optimizer state, after ZeRO/FSDP sharding, tensor/pipeline/expert
// parallelism and CPU offload.
//
//   absl::StatusOr<ModelStates> states = EstimateModelStates(forward_graph, {
//       .precision = SetupFor(Precision::kBf16Mixed),
//       .optimizer = Optimizer::kAdamW,
//       .layout = {.gpus = 8, .sharding = Sharding::kZero2}});
//   states->gpu_bytes()   // 2P + 18P/8 for DeepSpeed ZeRO-2 with mixed AdamW
//
// The graph is one tensor-parallel shard's forward pass (models/builders.h
// divides shapes by the TP degree), so TP needs no further division here.
// Parameters are classified by name and layer: names containing ".experts."
// are MoE experts (split over expert parallel ranks); parameters with
// layer >= 0 belong to transformer blocks and are spread evenly over the
// pipeline stages; embeddings (layer -1, before the first block) sit on the
// first stage and the rest (final norm, LM head) on the last.
//
// Invariants: every byte count is per GPU; host_bytes is what that GPU's rank
// keeps in host memory; frozen parameters (trainable == false, LoRA bases)
// carry weights only; quantized parameters (NF4, int8) keep their own dtype.
//
// Note [DeepSpeed gradient buffers]
// DeepSpeed's ZeRO optimizer keeps a 16-bit gradient (reduced in buckets)
// and an fp32 gradient partition next to the fp32 master and moments: its
// estimators count 2 + 18 bytes per parameter, "18 = 2_grads_16bit +
// 4_grads_32bit + 4_params_32bit + 8_optimizer_states_32bit" (DeepSpeed
// deepspeed/runtime/zero/stage_1_and_2.py, estimate_zero2_model_states_mem_needs:
// GPU 2P + 18P/N; stage3.py, estimate_zero3_model_states_mem_needs: GPU
// 4 * largest_layer + 18P/N, where largest_layer is the largest module's own
// parameters and 4 bytes are its gathered 16-bit parameters and gradients).
// Stage 3 reduce-scatters each layer's 16-bit gradients straight into the
// fp32 partition, so its 18P/N is 2 (16-bit parameters) + 4 + 4 + 8 with no
// resident 16-bit gradient buffer. We follow that accounting whenever ZeRO is on. PyTorch AMP, FSDP and
// Megatron accumulate straight into fp32 gradients (18 bytes in all).
//
// Note [DDP gradient buckets]
// PyTorch DDP copies gradients into its all-reduce buckets unless
// gradient_as_bucket_view=True, so plain data parallel keeps a second
// gradient-sized buffer ("the saved memory size will be equal to the total
// gradients size", torch.nn.parallel.DistributedDataParallel documentation).
//
// Note [FSDP gathered units]
// FSDP all-gathers one wrapped unit (a transformer block under the usual
// transformer auto-wrap policy; the remaining parameters form the root unit)
// before using it and, with the default BACKWARD_PRE prefetch, the next one
// while the current one computes: gathered_parameters bounds that by two of
// the largest unit's unsharded parameters plus one unit of unsharded
// gradients. It is the figure where one number stands for the step (the
// fullest pipeline stage, the planner's fixed bytes); the estimate's replay
// gathers and frees each unit at the ops that do (Note [FSDP units in the
// step] in estimators/step_replay.h).
#ifndef HEADROOM_ESTIMATORS_MODEL_STATES_H_
#define HEADROOM_ESTIMATORS_MODEL_STATES_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "estimators/optimizer_state.h"
#include "job/parallel_layout.h"
#include "job/precision.h"
#include "graph/graph.h"

namespace headroom {

struct ModelStateOptions {
  PrecisionSetup precision;
  Optimizer optimizer = Optimizer::kAdamW;
  ParallelLayout layout;
  EmaPlacement ema = EmaPlacement::kOff;  // Note [EMA weights] (job/optimizer.h)
  bool training = true;  // false: weights and buffers only
  // Pipeline stage to report; -1 picks the stage with the most model-state bytes.
  int pipeline_stage = -1;
};

struct ModelStates {
  uint64_t weights = 0;          // resident parameters (sharded share under ZeRO-3/FSDP)
  uint64_t buffers = 0;          // non-trainable model state (quantization constants, tables)
  uint64_t master_weights = 0;   // fp32 copies next to 16-bit weights
  uint64_t gradients = 0;        // gradient buffers (see Note [DeepSpeed gradient buffers])
  uint64_t optimizer_state = 0;  // moments
  uint64_t communication_buffers = 0;  // DDP buckets (Note [DDP gradient buckets])
  uint64_t gathered_parameters = 0;    // ZeRO-3/FSDP unsharded layer(s) in use
  uint64_t fp8_weight_cache = 0;       // Transformer Engine fp8 weight copies
  uint64_t ema_weights = 0;            // an EMA copy of the trainable weights on the GPU
  uint64_t host_bytes = 0;             // offloaded to host memory by this rank (an EMA on the CPU too)

  uint64_t parameters = 0;            // elements held by this GPU's stage/shard before ZeRO
  uint64_t trainable_parameters = 0;
  uint64_t model_parameters = 0;      // elements of the whole graph (one TP shard)
  uint64_t largest_module_parameters = 0;
  std::string largest_module;
  int pipeline_stage = 0;

  uint64_t gpu_bytes() const {
    return weights + buffers + master_weights + gradients + optimizer_state +
           communication_buffers + gathered_parameters + fp8_weight_cache + ema_weights;
  }
};

absl::StatusOr<ModelStates> EstimateModelStates(const Graph& forward,
                                                const ModelStateOptions& options);

// The pipeline stage (0-based) that holds a parameter of block `layer` when
// `num_layers` blocks are split evenly over `stages` stages; parameters
// outside blocks (layer -1) go to the first stage when the graph uses them
// before its first block (embeddings) and to the last otherwise.
int PipelineStageOf(int layer, bool before_first_block, int num_layers, int stages);

// Parameter elements of the largest module: parameters grouped by their name
// without the last component ("...q_proj.weight" and "...q_proj.bias" form
// "...q_proj"), as DeepSpeed's model_to_params counts a module's own
// (non-recursive) parameters. `name` receives the module's name.
uint64_t LargestModuleParameters(const Graph& forward, std::string* name = nullptr);

// The share of parameter `t` one GPU holds before sharding: 1 / the expert
// parallel degree for one of transformers 4's per-expert modules (a name with
// ".experts.<n>."), else 1 (stacked experts are built at a rank's share).
double ParameterShare(const Tensor& t, const ParallelLayout& layout);

}  // namespace headroom

#endif  // HEADROOM_ESTIMATORS_MODEL_STATES_H_

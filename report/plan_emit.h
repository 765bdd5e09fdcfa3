// The framework settings that realize a plan on a transformer stack, as
// `headroom plan --emit FORMAT` prints them: per layer, what to checkpoint,
// recompute selectively or offload (report/layer_plan.h says which), written
// for PyTorch, Hugging Face, Megatron-LM, DeepSpeed or torch.compile's
// memory budget. Where a format cannot express the plan, the output says so
// and what part, rather than print the nearest setting as if it were the plan.
//
//   HEADROOM_ASSIGN_OR_RETURN(StackPlan stack, ClassifyStack(step, result.schedule));
//   std::cout << EmitPlan(EmitFormat::kMegatron, stack, {.title = "gpt2, chen-greedy"});
//
// Note [Emit formats]
//  - torch: a Python snippet. Fully checkpointed layers get their forward
//    wrapped in torch.utils.checkpoint.checkpoint (non-reentrant), one
//    layer per checkpoint: a plan segment of k layers keeps only its first
//    layer's input, wrapping each layer keeps all k inputs, and the snippet
//    says how many bytes that adds. Offloaded layers run their forward under
//    torch.autograd.graph.save_on_cpu(pin_memory=True). Selective layers
//    replay only the attention core; no Hugging Face module holds just the
//    core (`self_attn` also holds the q/k/v and output projections), so the
//    snippet checkpoints the attention function through transformers'
//    AttentionInterface, for the listed layers only, and registers the
//    eager causal mask for it with AttentionMaskInterface (transformers 4.53
//    and later build none for an attention implementation they do not know).
//    Offloaded layers are refused at run time on a CPU, where save_on_cpu's
//    copies would stay in the same memory.
//  - hf: model.gradient_checkpointing_enable() whenever every layer is fully
//    checkpointed (the departures from one checkpoint per layer noted),
//    else a statement that the switch cannot express the plan.
//  - megatron: --recompute-granularity/--recompute-method/
//    --recompute-num-layers. full+uniform N: every layer, in chunks of N
//    layers from the first (the last chunk may be shorter); full+block N:
//    the first N layers, each on its own, the rest keep everything;
//    selective: the attention core of every layer. Other plans: which part
//    the flags cannot express.
//  - deepspeed: the activation_checkpointing block of a DeepSpeed config.
//    It configures deepspeed.checkpointing.checkpoint, which the model code
//    calls on the layers to checkpoint; number_checkpoints is the plan's
//    segment count, cpu_checkpointing is set when the plan keeps segment
//    inputs in host memory (deepspeed/runtime/activation_checkpointing/
//    checkpointing.py copies checkpoint inputs to the CPU with it, with or
//    without partition_activations); partition_activations and
//    contiguous_memory_optimization only matter under model parallelism and
//    stay off, as do the synchronize and profile switches.
//  - torch-budget: torch._functorch.config.activation_memory_budget, see
//    Note [Activation memory budget].
//
// Note [Activation memory budget]
// PyTorch's partitioner reads the budget as (saved - min) / (max - min),
// with max the bytes its runtime-optimized min-cut saves and min the bytes
// of the compiled region's inputs (torch/_functorch/partitioners.py,
// choose_saved_values_set), and solves a knapsack for the least
// recomputation under it. Headroom's equivalent is the fraction of the
// store-all step's saved-tensor bytes (report/layer_plan.h) that the plan
// keeps on the device through the forward-backward boundary:
// StackPlan::all.kept / StackPlan::all.total(), rounded down to 0.01. With
// the whole model compiled, min is the token ids (about 0) and max is at most
// store-all's bytes (the min-cut also replays cheap pointwise ops), so the
// same fraction keeps at most the plan's bytes. The partitioner picks its
// own tensors and only recomputes: offloaded bytes count as not kept, and
// what it replays differs from the plan.
#ifndef HEADROOM_REPORT_PLAN_EMIT_H_
#define HEADROOM_REPORT_PLAN_EMIT_H_

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"
#include "planner/selective_checkpoint.h"
#include "report/layer_plan.h"

namespace headroom {

enum class EmitFormat : uint8_t { kTorch, kHf, kMegatron, kDeepSpeed, kTorchBudget };
std::string_view EmitFormatName(EmitFormat format);  // "torch", "hf", "megatron", "deepspeed", "torch-budget"
absl::StatusOr<EmitFormat> ParseEmitFormat(std::string_view name);

struct EmitContext {
  // What the plan is, and the peak of what the settings run, for the first
  // comment line ("gpt2, chen-greedy, ...").
  std::string title;
  // Hugging Face model_type ("llama", "gpt2"): the module the selective
  // snippet imports eager_attention_forward from. Empty when unknown.
  std::string model_type;
  // The step draws random numbers (dropout): a compiler that recomputes them
  // must draw the same ones.
  bool has_random_ops = false;
};

// Note [Emitted settings' peak]
// Each format prints the peak of what its settings run, not of the plan they
// approximate: the checkpoints the settings make, as regions of the step's
// forward ops, realized as PyTorch runs them (RealizeFullCheckpoints in
// planner/selective_checkpoint.h) and evaluated. torch: each fully
// checkpointed layer, and each selective layer's attention core (the
// attention function); hf: every layer, when it prints
// gradient_checkpointing_enable(); megatron: its chunks (uniform), its first
// layers (block) or every layer's attention core (selective). Where the
// settings offload (torch's save_on_cpu layers, DeepSpeed's checkpointing in
// the model's own code) or a compiler chooses (torch-budget), what runs is not
// modeled: Unimplemented says why, and the output gives the plan's peak as
// the plan's. So does a format that cannot express the plan (it prints no
// settings).
absl::StatusOr<std::vector<CheckpointRegion>> SettingsRegions(EmitFormat format, const StackPlan& plan,
                                                              const Graph& step);

// The settings of `format` for `plan` (Note [Emit formats]).
std::string EmitPlan(EmitFormat format, const StackPlan& plan, const EmitContext& context);

// The deepspeed format's JSON block: {"activation_checkpointing": {...}}.
nlohmann::json DeepSpeedActivationCheckpointing(const StackPlan& plan);

// Note [Activation memory budget]: the kept fraction in [0, 1], rounded down to 0.01.
double ActivationMemoryBudget(const StackPlan& plan);

}  // namespace headroom

#endif  // HEADROOM_REPORT_PLAN_EMIT_H_

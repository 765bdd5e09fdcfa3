// Model builders: turn a ModelConfig into the forward graph of one training
// (or inference) step on ONE GPU's shard.
//
//   absl::StatusOr<ModelConfig> config = LoadPresetConfig("llama-3-8b");
//   absl::StatusOr<Graph> forward = BuildModelGraph(*config, {
//       .batch = 1, .seq_len = 4096, .param_dtype = DType::kBF16,
//       .compute_dtype = DType::kBF16, .attention = AttentionImpl::kFlash});
//   // then BuildTrainingStep(*forward, ...) (graph/training_step.h)
//
// What the graph holds:
//  - parameters named as in the Hugging Face state dict
//    ("model.layers.3.self_attn.q_proj.weight", "transformer.h.0.attn.c_attn.bias"),
//    with `layer` = block index (-1 for embeddings, final norm, head); shapes
//    are the shard's under tensor parallelism;
//  - forward ops in program order, each with flops, bytes_read/written,
//    compute_dtype, layer and the tensors PyTorch autograd saves for its
//    backward (graph/ops.h documents each op kind);
//  - when training, the loss ops (phase kLoss) ending in a scalar "loss".
//
// Invariants: the result passes Graph::Validate(); ParameterCount() equals
// the real model's (for tensor parallel t > 1, the shard's); the graph is
// deterministic for given inputs.
//
// Note [Saved tensors follow requires_grad]
// PyTorch saves an input of a matmul only when the OTHER operand needs a
// gradient (derivatives.yaml: mm's mat1 is saved for mat2's gradient). So a
// linear whose weight is frozen (LoRA, QLoRA) saves nothing of its input,
// and ops before the first trainable parameter record nothing at all. The
// builder tracks requires_grad (a tensor requires grad iff a trainable
// parameter reaches it) and emits saved sets accordingly; graph/autograd.h
// derives the same predicate to decide which ops get a backward.
//
// Note [Mixed precision is autocast]
// param_dtype f32 with a 16-bit compute_dtype models torch.autocast: matmul
// and convolution inputs (weights included) are cast to compute_dtype by a
// "cast" op whose output the matmul saves; layer_norm, softmax and the loss
// run in f32 (autocast's fp32 op list); elementwise ops take the wider input
// dtype. param_dtype == compute_dtype is "pure" precision with no casts.
// A 16-bit param_dtype with f32 compute is rejected.
//
// Note [MoE routing]
// Mixtral layers route each token to experts_per_token of num_experts
// experts. The builder assumes perfectly balanced routing: every expert
// receives batch*seq*top_k/num_experts tokens (rounded up). Real routing is
// skewed; the average is what the auxiliary load-balancing loss drives
// toward, and the estimate's activation memory scales with it linearly.
//
// Note [Headless encoders]
// BertModel/RobertaModel have no task head. Inference builds the body (and
// pooler). Training needs a loss, so the builder attaches a sequence
// classification head (dropout, Linear(hidden, num_labels), cross-entropy
// on the pooled output) as AutoModelForSequenceClassification does, which is
// how such checkpoints are fine-tuned. Its parameters are named
// "classifier.weight"/"classifier.bias".
#ifndef HEADROOM_MODELS_BUILDERS_H_
#define HEADROOM_MODELS_BUILDERS_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "graph/graph.h"
#include "graph/torch_runtime.h"
#include "models/model_config.h"

namespace headroom {

enum class AttentionImpl : uint8_t {
  kEager,  // matmul, scale+mask, softmax, dropout, matmul: O(s^2) saved
  kFlash,  // one scaled_dot_product_attention flash kernel: q,k,v,out,logsumexp saved
};
std::string_view AttentionImplName(AttentionImpl impl);  // "eager", "flash"
// Also accepts "sdpa" for kFlash (PyTorch's scaled_dot_product_attention).
absl::StatusOr<AttentionImpl> ParseAttentionImpl(std::string_view name);
// Whether the model's attention can run as one flash kernel: not T5's, which
// adds a position bias to its scores. Jobs default to flash where it can.
bool HasFlashAttentionPath(const ModelConfig& config);

// How RMSNorm runs (Note [Eager RMSNorm] in builders.cc).
enum class RmsNormImpl : uint8_t {
  kEager,  // Hugging Face's LlamaRMSNorm in PyTorch ops: also saves the normalized tensor
  kFused,  // one kernel (apex, Liger, Transformer Engine, Megatron): saves x and rstd
};
std::string_view RmsNormImplName(RmsNormImpl impl);  // "eager", "fused"
absl::StatusOr<RmsNormImpl> ParseRmsNormImpl(std::string_view name);

// LoRA (Hu et al. 2021) and QLoRA (Dettmers et al. 2023) adapters.
struct LoraOptions {
  int64_t rank = 0;  // 0: no adapters
  double alpha = 16;
  double dropout = 0;  // lora_dropout, applied to the adapter's input
  // Leaf module names as PEFT's target_modules: "q_proj", "v_proj", "c_attn",
  // "query", "dense_h_to_4h", "w1" ... Empty: the attention query and value
  // projections of the architecture (PEFT's defaults).
  std::vector<std::string> target_modules;
  // QLoRA: base Linear weights of the transformer blocks stored as NF4 with
  // blockwise absmax constants (block 64); with double quantization the
  // absmax values are themselves 8-bit with an f32 constant per 256 of
  // them. The constants are kBuffer tensors named "<weight>.absmax",
  // "<weight>.nested_absmax", "<weight>.quant_map", "<weight>.nested_quant_map".
  bool quantize_base_nf4 = false;
  bool double_quant = true;
  int64_t quant_block_size = 64;
  int64_t nested_block_size = 256;

  bool enabled() const { return rank > 0; }
};

// Which parts of a vision-language model (LLaVA) train; Note [LLaVA] in builders/vision.cc.
enum class VlmTrainable : uint8_t {
  kProjectorAndLanguage,  // LLaVA-1.5's visual instruction tuning, the default: the vision tower frozen
  kProjector,             // LLaVA-1.5's feature-alignment pretraining: the projector alone
  kAll,                   // every parameter, as a plain loop over transformers' model (all requires_grad) trains
};
std::string_view VlmTrainableName(VlmTrainable trainable);  // "projector+lm", "projector", "all"
absl::StatusOr<VlmTrainable> ParseVlmTrainable(std::string_view name);

struct BuildOptions {
  int64_t batch = 1;
  // Tokens per sequence (transformers); ignored for CNNs, MLPs and vision
  // transformers, whose sequence is their image's patches; the text tower's
  // tokens for CLIP and SigLIP; LLaVA's language-model tokens, text and
  // image tokens together (each image fills image_feature_tokens() of them).
  // Must not exceed max_position_embeddings for learned positions.
  int64_t seq_len = 512;
  // Vision-language models (LLaVA): images per sequence (0: text only) and what trains.
  int64_t images = 1;
  VlmTrainable vlm_trainable = VlmTrainable::kProjectorAndLanguage;
  // Encoder-decoders: the decoder's tokens (0: seq_len).
  int64_t target_seq_len = 0;
  DType param_dtype = DType::kF32;
  DType compute_dtype = DType::kF32;
  AttentionImpl attention = AttentionImpl::kEager;
  bool training = true;  // dropout active, loss built
  // Megatron tensor parallelism: heads, kv heads, intermediate size and the
  // vocabulary are split t ways (each must divide; otherwise an error naming
  // the config field). Embedding and row-parallel outputs get an all_reduce.
  int tensor_parallel = 1;
  // Korthikanti et al. 2022 sequence parallelism (needs tensor_parallel > 1):
  // norms and dropouts work on seq_len/t tokens; all_gather before and
  // reduce_scatter after each parallel region.
  bool sequence_parallel = false;
  // Tensor parallelism by DTensor (torch.distributed's parallelize_module) rather than Megatron's layers;
  // needs tensor_parallel > 1. The loss runs on vocabulary shards under loss_parallel (Note
  // [loss_parallel's cross-entropy] in graph/ops.cc), and under sequence parallelism a Linear saves the
  // gathered input it computes with, as autograd keeps it, where Megatron saves its shard and gathers it
  // again in backward.
  bool dtensor = false;
  // Expert parallelism: the graph holds this rank's 1/expert_parallel of transformers 5's stacked experts and
  // the all-to-alls that bring them their rows (Note [Expert parallelism in the graph] in
  // models/builders/decoder.cc); transformers 4's per-expert modules are all built.
  int expert_parallel = 1;
  LoraOptions lora;
  RmsNormImpl rms_norm = RmsNormImpl::kEager;
  // The PyTorch version and kernels that run the step (graph/torch_runtime.h).
  TorchRuntime runtime;
};

// Builds the forward (+ loss) graph. Errors (InvalidArgument) name the
// offending option or config field: non-positive batch/seq_len, heads not
// divisible by tensor_parallel, seq_len beyond max_position_embeddings, an
// unknown LoRA target, LoRA on a CNN, ...
absl::StatusOr<Graph> BuildModelGraph(const ModelConfig& config, const BuildOptions& options);

}  // namespace headroom

#endif  // HEADROOM_MODELS_BUILDERS_H_

// The weights a serving engine holds on one GPU: the model's parameters as
// the engine loads them (quantized formats as their checkpoints store them,
// the vocabulary padded and split, tensor-parallel shards, the layers of one
// pipeline stage).
//
//   absl::StatusOr<EngineWeights> w = WeightsAsLoaded(config, forward, {.tensor_parallel = 2, ...});
//   w->bytes;   // what "Model loading took X GiB" reports, less the allocator's rounding
//
// Note [Weights as engines load them]
// Parameters are the model graph's (models/builders.h, Hugging Face names and
// shapes), placed as vLLM's layers place them (vllm/model_executor/layers/
// linear.py, vocab_parallel_embedding.py; SGLang's layers follow the same
// split):
//  - the embedding and the LM head: the vocabulary padded to a multiple of 64
//    (DEFAULT_VOCAB_PADDING_SIZE), split over tensor-parallel ranks; a tied
//    head shares the embedding, except on the last of several pipeline stages,
//    which loads a copy;
//  - a linear layer's weight: split over ranks (column or row parallel alike
//    in bytes), except the key and value projections when the ranks
//    outnumber the KV heads: each rank then holds whole heads, replicated;
//  - 1-D parameters (norms, biases) and a mixture of experts' router: whole on
//    every rank;
//  - under pipeline parallelism a stage holds its layers (vllm/distributed/
//    utils.py get_pp_indices: an uneven remainder goes to the stages before
//    the last), the first stage the embeddings, the last the final norm and
//    the head.
// Quantized checkpoints (vllm/model_executor/layers/quantization/, 0.34;
// create_weights of each method) store the linear layers of the blocks, per
// weight of N outputs and K inputs (K in groups of G):
//  - AWQ: int4 values packed 8 to an int32, fp16 scales and packed int32 zeros
//    per group: N K / 2 + 2 N K / G + N K / (2 G) bytes;
//  - GPTQ (4 or 8 bits b): N K b / 8, scales 2 N K / G, zeros N K b / (8 G),
//    and until 0.20 a g_idx of K int32 (always with act-order);
//  - FP8: one byte a weight, fp32 scales per tensor or per weight block;
//  - bitsandbytes (removed in 0.28): 4-bit, N K / 2 and an absmax per 64
//    (fp32, or 8-bit with an fp32 per 256 of them under double quantization);
//    8-bit, N K and an fp32 scale per row;
//  - compressed-tensors W8A8 (int8 or fp8): N K and an fp32 scale per output;
//    W4A16: N K / 2, scales 2 N K / G, zero points when asymmetric;
//  - MXFP4 (GPT-OSS's experts): N K / 2 and one e8m0 scale per 32.
// Embeddings, heads, norms, routers and what the checkpoint lists as
// unconverted (modules_to_not_convert, ignore) stay in the model's dtype.
#ifndef HEADROOM_SERVING_ENGINE_WEIGHTS_H_
#define HEADROOM_SERVING_ENGINE_WEIGHTS_H_

#include <cstdint>
#include <utility>

#include "absl/status/statusor.h"
#include "graph/graph.h"
#include "models/model_config.h"
#include "models/quantization_config.h"

namespace headroom {

// vLLM's split of `layers` over `stages` pipeline stages: [first, end) of `stage`.
std::pair<int, int> PipelineStageLayers(int layers, int stage, int stages);

struct WeightOptions {
  int tensor_parallel = 1;
  int pipeline_parallel = 1;
  int stage = 0;
  int64_t dtype_bytes = 2;       // the engine's model dtype (--dtype)
  QuantizationConfig quantization;  // what the engine loads (the checkpoint's, or --quantization's)
  bool gptq_g_idx = true;        // the release's GPTQ layers hold a g_idx (Note [Weights as engines load them])
};

struct EngineWeights {
  uint64_t bytes = 0;
  uint64_t quantized_bytes = 0;  // of which in the quantized format
  uint64_t parameters = 0;       // on this GPU
};

// `forward` is the model's forward graph on one GPU without tensor parallelism (its parameters named and
// shaped as Hugging Face's).
absl::StatusOr<EngineWeights> WeightsAsLoaded(const ModelConfig& config, const Graph& forward,
                                              const WeightOptions& options);

}  // namespace headroom

#endif  // HEADROOM_SERVING_ENGINE_WEIGHTS_H_

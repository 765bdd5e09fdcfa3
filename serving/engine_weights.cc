#include "serving/engine_weights.h"

#include <algorithm>
#include <string_view>
#include <vector>


namespace headroom {
namespace {

uint64_t CeilDivU(uint64_t a, uint64_t b) { return (a + b - 1) / b; }

bool NameHas(std::string_view name, std::initializer_list<std::string_view> parts) {
  for (std::string_view part : parts) {
    if (name.find(part) != std::string_view::npos) return true;
  }
  return false;
}

// Bytes of one quantized weight of `elements` values on this rank, `k` of them along the input
// (Note [Weights as engines load them]).
uint64_t QuantizedBytes(const QuantizationConfig& q, uint64_t elements, uint64_t n, uint64_t k, bool g_idx) {
  const uint64_t group = q.group_size > 0 ? static_cast<uint64_t>(q.group_size) : k;
  const uint64_t groups = CeilDivU(elements, group);  // scales: one per group of a column
  switch (q.method) {
    case QuantMethod::kAwq:
      return elements / 2 + 2 * groups + groups / 2;
    case QuantMethod::kGptq:
      return elements * q.bits / 8 + 2 * groups + groups * q.bits / 8 + ((g_idx || q.act_order) ? 4 * k : 0);
    case QuantMethod::kFp8: {
      if (q.weight_block.size() == 2) {
        return elements + 4 * CeilDivU(n, q.weight_block[0]) * CeilDivU(k, q.weight_block[1]) * (elements / (n * k));
      }
      return elements + 4;
    }
    case QuantMethod::kBitsAndBytes:
      if (q.bits == 8) return elements + 4 * n;
      return elements / 2 + (q.double_quant ? CeilDivU(elements, 64) + 4 * CeilDivU(elements, 64 * 256)
                                            : 4 * CeilDivU(elements, 64));
    case QuantMethod::kCompressedTensors:
      if (q.bits == 8) return elements + 4 * n;
      return elements / 2 + 2 * groups + (q.zero_point ? groups / 2 : 0) + 16 + (q.act_order ? 4 * k : 0);
    case QuantMethod::kMxfp4:
      return elements / 2 + CeilDivU(elements, 32);
    case QuantMethod::kUnquantized:
      break;
  }
  return elements * 2;
}

}  // namespace

std::pair<int, int> PipelineStageLayers(int layers, int stage, int stages) {
  std::vector<int> partitions(static_cast<size_t>(stages), layers / stages);
  const int remainder = layers % stages;
  for (int i = 2; i < remainder + 2; ++i) ++partitions[static_cast<size_t>(stages - i)];
  int first = 0;
  for (int s = 0; s < stage; ++s) first += partitions[static_cast<size_t>(s)];
  return {first, first + partitions[static_cast<size_t>(stage)]};
}

absl::StatusOr<EngineWeights> WeightsAsLoaded(const ModelConfig& config, const Graph& forward,
                                              const WeightOptions& o) {
  const ModelConfig& text = config.family == ModelFamily::kVisionLanguage ? config.text_tower() : config;
  const auto tp = static_cast<uint64_t>(o.tensor_parallel);
  const auto [first_layer, end_layer] = PipelineStageLayers(static_cast<int>(text.num_layers), o.stage,
                                                            o.pipeline_parallel);
  const bool first_stage = o.stage == 0;
  const bool last_stage = o.stage == o.pipeline_parallel - 1;
  const uint64_t vocab = static_cast<uint64_t>(text.vocab_size);
  const uint64_t padded_vocab = CeilDivU(vocab, 64) * 64;
  const int64_t head_dim = text.head_dim > 0 ? text.head_dim : (text.num_heads > 0 ? text.hidden_size / text.num_heads : 0);
  const auto kv_heads = static_cast<uint64_t>(text.num_kv_heads);
  const bool kv_replicated = kv_heads > 0 && tp > kv_heads;

  EngineWeights out;
  for (size_t id = 0; id < forward.num_tensors(); ++id) {
    const Tensor& t = forward.tensor(static_cast<TensorId>(id));
    if (t.role != TensorRole::kParameter || t.view_of != kNone) continue;
    const std::string_view name = t.name;
    uint64_t elements = t.elements();
    const bool in_vision = NameHas(name, {"vision_tower", "multi_modal_projector"});
    // Which stage holds it.
    const bool vocab_sized = !t.shape.empty() && static_cast<uint64_t>(t.shape[0]) == vocab && t.shape.size() == 2 &&
                             !in_vision;
    const bool head = vocab_sized && NameHas(name, {"lm_head", "embed_out", "output"});
    bool here;
    if (t.layer >= 0 && !in_vision) {
      here = t.layer >= first_layer && t.layer < end_layer;
    } else if (vocab_sized) {
      here = head ? last_stage : first_stage;
    } else if (in_vision) {
      here = first_stage;
    } else {
      here = NameHas(name, {"norm", "ln_f"}) ? last_stage : first_stage;
    }
    if (!here) continue;
    out.parameters += elements;
    if (vocab_sized) {
      // Vocab-parallel: padded rows over the ranks.
      const uint64_t width = elements / vocab;
      const uint64_t rows = CeilDivU(padded_vocab, tp);
      out.bytes += rows * width * static_cast<uint64_t>(o.dtype_bytes);
      continue;
    }
    if (t.shape.size() < 2) {
      out.bytes += elements * static_cast<uint64_t>(o.dtype_bytes);
      continue;
    }
    const bool router = text.is_moe() && static_cast<uint64_t>(t.shape[0]) == static_cast<uint64_t>(text.num_experts) &&
                        t.shape.size() == 2;
    if (router) {
      out.bytes += elements * static_cast<uint64_t>(o.dtype_bytes);
      continue;
    }
    // This rank's share; key/value projections replicated when the ranks outnumber the KV heads.
    uint64_t rank_elements = CeilDivU(elements, tp);
    const uint64_t kv_width = kv_heads * static_cast<uint64_t>(head_dim);
    if (kv_replicated && head_dim > 0) {
      if (NameHas(name, {"k_proj", "v_proj"})) {
        rank_elements = elements / kv_heads;  // one head's rows
      } else if (NameHas(name, {"qkv_proj", "c_attn", "query_key_value", "Wqkv", "W_pack"})) {
        const uint64_t q_width = static_cast<uint64_t>(text.num_heads * head_dim);
        const uint64_t other = elements / (q_width + 2 * kv_width);
        rank_elements = other * (q_width / tp + 2 * static_cast<uint64_t>(head_dim));
      }
    }
    const bool quantize = o.quantization.quantized() && t.layer >= 0 && !in_vision &&
                          !o.quantization.LeavesUnquantized(name) && !NameHas(name, {"norm"});
    if (!quantize) {
      out.bytes += rank_elements * static_cast<uint64_t>(o.dtype_bytes);
      continue;
    }
    // Hugging Face's Linear weight is [out, in]; GPT-2's Conv1D is [in, out]; experts [E, out, in].
    const uint64_t k_full = static_cast<uint64_t>(t.shape.back());
    const uint64_t n = std::max<uint64_t>(1, rank_elements / k_full);
    const uint64_t q = QuantizedBytes(o.quantization, rank_elements, n, k_full, o.gptq_g_idx);
    out.bytes += q;
    out.quantized_bytes += q;
  }
  // A tied head: the embedding serves as the head, except on the last of several stages, which loads a copy.
  if (text.tie_word_embeddings && o.pipeline_parallel > 1 && last_stage && !first_stage) {
    out.bytes += CeilDivU(padded_vocab, tp) * static_cast<uint64_t>(text.hidden_size) * static_cast<uint64_t>(o.dtype_bytes);
  }
  return out;
}

}  // namespace headroom

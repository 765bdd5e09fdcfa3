#include "serving/profile_run.h"

#include <algorithm>

namespace headroom {
namespace {

// Bytes per sampler row and vocabulary entry beyond the model-dtype logits (Note [vLLM profile run]).
int64_t SamplerExtraBytes(const EngineRelease& r, int64_t d) {
  if (!r.AtLeast(0, 3)) return 4 * d + 19;
  if (!r.AtLeast(0, 6)) return 4 * d + 18;
  if (!r.AtLeast(0, 11)) return 30;
  if (!r.AtLeast(0, 17)) return 26;
  return 12;
}

// Byte counts of the formulas, formed in double: absurd configs give huge figures rather than wrapped ones.
uint64_t Bytes(double bytes) { return bytes >= 0x1p62 ? uint64_t{1} << 62 : static_cast<uint64_t>(bytes); }

}  // namespace

ProfileRun VllmProfileRun(const ModelConfig& config, const ProfileRunOptions& o) {
  const ModelConfig& c = config.family == ModelFamily::kVisionLanguage ? config.text_tower() : config;
  const EngineRelease& r = o.release;
  const bool v1 = r.AtLeast(0, 8);
  const int64_t tp = o.tensor_parallel;
  const int64_t d = o.dtype_bytes;
  const int64_t t = o.tokens;
  const int64_t h_size = c.hidden_size;
  ProfileRun run;
  run.rows = v1 ? std::min(t, o.max_num_seqs) : o.max_num_seqs;

  // Widths per token of the attention and MLP phases (elements).
  int64_t attention = 0;
  if (c.family == ModelFamily::kStateSpace) {
    attention = 2 * h_size + 3 * (c.intermediate_size / tp);  // in_proj's x and z, the conv's output
  } else if (c.is_mla()) {
    const int64_t heads = c.num_heads / tp;
    attention = 2 * h_size + heads * (c.qk_nope_head_dim + c.qk_rope_head_dim) + c.kv_lora_rank + c.qk_rope_head_dim +
                heads * c.v_head_dim + h_size;
  } else if (c.num_heads > 0) {
    const int64_t hd = c.head_dim > 0 ? c.head_dim : h_size / c.num_heads;
    const int64_t heads = c.num_heads / tp;
    const int64_t kv = std::max<int64_t>(1, c.num_kv_heads / tp);
    attention = 2 * h_size + (heads + 2 * kv) * hd + heads * hd + h_size;
  }
  int64_t mlp = 0;
  if (c.intermediate_size > 0 && c.family != ModelFamily::kStateSpace) {
    const int64_t i = c.intermediate_size / tp;
    mlp = r.AtLeast(0, 6, 5) ? 2 * h_size + std::max(3 * i, i + h_size) : 3 * h_size + 3 * i;
  }
  if (tp > 1) {
    attention += h_size;
    mlp += mlp > 0 ? h_size : 0;
  }
  const auto f = [](int64_t x) { return static_cast<double>(x); };
  uint64_t forward = Bytes(f(d) * f(t) * f(std::max(attention, mlp)));
  if (c.is_moe()) {
    const int64_t expert = c.moe_intermediate_size > 0 ? c.moe_intermediate_size : c.intermediate_size;
    const int64_t n = 2 * expert / tp;
    const int64_t width = r.AtLeast(0, 8) ? std::max(n, h_size) + n / 2 : n + n / 2 + h_size;
    int64_t chunk = t;
    if (r.AtLeast(0, 6) && !r.AtLeast(0, 15)) chunk = std::min<int64_t>(t, 32768);
    if (r.AtLeast(0, 15) && !r.AtLeast(0, 18)) chunk = std::min<int64_t>(t, 16384);
    const uint64_t moe = Bytes(f(d) * f(t) * 3 * f(h_size) + f(d) * f(chunk) * f(c.experts_per_token) * f(width) +
                               f(t) * f(c.num_experts) * f(d + 4) + 8 * f(t) * f(c.experts_per_token));
    forward = std::max(forward, moe);
  }
  run.forward_bytes = forward;
  if (o.samples && c.vocab_size > 0) {
    const int64_t vocab = c.vocab_size;
    const int64_t padded = (vocab + 63) / 64 * 64;
    const bool holds_output = !(r.AtLeast(0, 8) && !r.AtLeast(0, 9));  // V1 0.8.0 frees it first
    run.sampler_bytes = Bytes((holds_output ? f(d) * f(t) * f(h_size) : 0) +
                              f(run.rows) * (f(d) * f(padded) + f(SamplerExtraBytes(r, d)) * f(vocab)));
  }
  run.peak_bytes = std::max(run.forward_bytes, run.sampler_bytes);
  return run;
}

int64_t VllmCudaGraphSizes(const EngineRelease& release, int64_t max_num_seqs, int64_t max_num_batched_tokens) {
  const bool v1 = release.AtLeast(0, 8);
  const int64_t largest = v1 ? std::min<int64_t>({2 * max_num_seqs, 512, max_num_batched_tokens})
                             : std::min<int64_t>(max_num_seqs, 256);
  int64_t sizes = 0;
  for (int64_t s : {1, 2, 4}) sizes += s <= largest ? 1 : 0;
  for (int64_t s = 8; s < 256 && s <= largest; s += 8) ++sizes;
  if (!v1) return sizes + (largest >= 256 ? 1 : 0);
  for (int64_t s = 256; s <= largest; s += 16) ++sizes;
  return sizes;
}

}  // namespace headroom

#include "serving/kv_cache_layout.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/checked_math.h"

namespace headroom {
namespace {

int64_t CeilDivI(int64_t a, int64_t b) { return (a + b - 1) / b; }

// a x b for counts and sizes (both >= 0), saturating below 2^63 so that absurd inputs compare as huge instead of
// wrapping (they lose no exactness where a real engine's figures live).
int64_t Mul(int64_t a, int64_t b) {
  return static_cast<int64_t>(std::min<uint64_t>(SaturatingMul(static_cast<uint64_t>(a), static_cast<uint64_t>(b)),
                                                 uint64_t{1} << 62));
}

// One layer's most bytes for one request at `max_model_len` (max_memory_usage_bytes in
// vllm/v1/kv_cache_interface.py, 0.34).
uint64_t MaxBytesPerRequest(const KvLayer& l, int64_t max_model_len, int64_t tokens_in_flight, const VllmRules& rules) {
  const uint64_t page = l.PageBytes();
  switch (l.kind) {
    case KvLayerKind::kFull:
    case KvLayerKind::kMla:
      return SaturatingMul(static_cast<uint64_t>(CeilDivI(max_model_len, l.block_size)), page);
    case KvLayerKind::kSlidingWindow: {
      const int64_t tokens = std::min(l.window - 1 + tokens_in_flight, max_model_len);
      return SaturatingMul(static_cast<uint64_t>(CeilDivI(tokens, l.block_size) + 1), page);
    }
    case KvLayerKind::kChunkedLocal: {
      const int64_t tokens = std::min(l.window + tokens_in_flight, max_model_len);
      return SaturatingMul(static_cast<uint64_t>(CeilDivI(tokens, l.block_size)), page);
    }
    case KvLayerKind::kMamba:
      (void)rules;
      return page;
  }
  return page;
}

// Python's str(round(x, 2)): "16.0", "10.72", "0.5". Both Python's round and printf's %.2f round the exact
// binary value, ties to even (5.625 -> 5.62).
std::string PythonRound2(double x) {
  std::string s = absl::StrFormat("%.2f", x);
  while (s.back() == '0' && s[s.size() - 2] != '.') s.pop_back();
  return s;
}

// The hint vLLM 0.34 puts in its start-up errors (v1/core/kv_cache_planning.py).
std::string Hint(const VllmKvOptions& o) {
  if (!o.rules.extensible_kv_cache || !o.extensible_hint) {
    return "Try increasing `gpu_memory_utilization` when initializing the engine (this flag also controls CPU "
           "memory reservation on the CPU backend, despite its name).";
  }
  if (o.utilization < 1.0) {
    return absl::StrFormat(
        "The KV cache gets what is left after the model and its activations within `gpu_memory_utilization`=%s; "
        "increase it (with the extensible KV cache it defaults to 1.0) or decrease `max_model_len` or "
        "`max_num_seqs`.",
        PythonRound2(o.utilization));
  }
  return "The extensible KV cache already takes all device memory left after the model and its activations; "
         "decrease `max_model_len` or `max_num_seqs`, or the model needs a device with more memory.";
}

const char kDocs[] =
    " See https://docs.vllm.ai/en/latest/configuration/conserving_memory/ for more details.";

std::string NoMemoryError(const VllmKvOptions& o) {
  if (o.rules.extensible_kv_cache) return absl::StrCat("No available memory for the cache blocks. ", Hint(o), kDocs);
  return absl::StrCat("No available memory for the cache blocks. Try increasing `gpu_memory_utilization` when "
                      "initializing the engine.",
                      o.rules.docs_link ? kDocs : "");
}

}  // namespace

std::string_view KvLayerKindName(KvLayerKind kind) {
  switch (kind) {
    case KvLayerKind::kFull: return "full";
    case KvLayerKind::kSlidingWindow: return "sliding";
    case KvLayerKind::kChunkedLocal: return "chunked_local";
    case KvLayerKind::kMla: return "mla";
    case KvLayerKind::kMamba: return "mamba";
  }
  return "full";
}

uint64_t KvLayer::PageBytes() const {
  if (kind == KvLayerKind::kMamba) return state_bytes;
  return SaturatingMul(SaturatingMul(static_cast<uint64_t>(block_size), static_cast<uint64_t>(num_kv_heads)),
                       SaturatingMul(static_cast<uint64_t>(head_size + head_size_v), static_cast<uint64_t>(dtype_bytes)));
}

bool KvLayer::SameSpec(const KvLayer& o) const {
  return kind == o.kind && num_kv_heads == o.num_kv_heads && head_size == o.head_size &&
         head_size_v == o.head_size_v && dtype_bytes == o.dtype_bytes && block_size == o.block_size &&
         window == o.window && state_bytes == o.state_bytes;
}

std::string VllmGib(double bytes) { return PythonRound2(bytes / static_cast<double>(uint64_t{1} << 30)); }

std::vector<KvLayer> KvLayersOf(const ModelConfig& c, const KvLayerOptions& o) {
  const ModelConfig& text = c.family == ModelFamily::kVisionLanguage ? c.text_tower() : c;
  const int end = o.end_layer < 0 ? static_cast<int>(text.num_layers) : o.end_layer;
  std::vector<KvLayer> out;
  for (int i = o.first_layer; i < end; ++i) {
    KvLayer l{.layer = i, .dtype_bytes = o.dtype_bytes, .block_size = o.block_size};
    if (text.family == ModelFamily::kStateSpace) {
      // Mamba: conv state [intermediate / tp, conv_kernel - 1] and SSM state [intermediate / tp, state_size].
      const uint64_t width = static_cast<uint64_t>(text.intermediate_size / o.tensor_parallel);
      l.kind = KvLayerKind::kMamba;
      l.state_bytes = DTypeBytes(o.state_dtype, width * static_cast<uint64_t>(text.conv_kernel - 1 + text.ssm_state_size));
      out.push_back(l);
      continue;
    }
    if (text.is_mla()) {
      l.kind = KvLayerKind::kMla;
      l.num_kv_heads = 1;
      l.head_size = text.kv_lora_rank + text.qk_rope_head_dim;
      l.head_size_v = 0;
      out.push_back(l);
      continue;
    }
    const int64_t head_dim = text.head_dim > 0 ? text.head_dim : text.hidden_size / text.num_heads;
    l.num_kv_heads = std::max<int64_t>(1, text.num_kv_heads / o.tensor_parallel);
    l.head_size = head_dim;
    l.head_size_v = head_dim;
    if (o.windows && text.is_sliding_layer(i)) {
      l.kind = text.model_type == "llama4" ? KvLayerKind::kChunkedLocal : KvLayerKind::kSlidingWindow;
      l.window = text.sliding_window;
    }
    out.push_back(l);
  }
  return out;
}

absl::StatusOr<VllmKvCache> SizeVllmKvCache(const std::vector<KvLayer>& input, int64_t available,
                                            const VllmKvOptions& o) {
  VllmKvCache kv;
  const VllmRules& rules = o.rules;
  const int64_t in_flight = rules.extensible_kv_cache
                                ? (o.pipeline_parallel + (o.async_scheduling ? 1 : 0)) * o.max_num_batched_tokens
                                : o.max_num_batched_tokens;
  std::vector<KvLayer> layers = input;
  if (!rules.hybrid_groups) {
    for (KvLayer& l : layers) {
      if (l.kind == KvLayerKind::kSlidingWindow || l.kind == KvLayerKind::kChunkedLocal) {
        l.kind = KvLayerKind::kFull;
        l.window = 0;
      }
    }
  }
  if (layers.empty()) {
    return absl::InvalidArgumentError("the model has no layer that holds a KV cache or state on this GPU");
  }
  // Per-request blocks of a group, for a length (Note [vLLM KV blocks]).
  auto blocks_for = [&](const KvGroup& g, int64_t len) -> int64_t {
    const uint64_t page = g.spec.PageBytes();
    const uint64_t bytes = MaxBytesPerRequest(g.spec, len, in_flight, rules);
    return static_cast<int64_t>(std::min<uint64_t>(bytes / page + (bytes % page != 0 ? 1 : 0), uint64_t{1} << 50));
  };
  bool all_same = true;
  for (const KvLayer& l : layers) all_same &= l.SameSpec(layers.front());
  if (!rules.v1) {
    // V0: one block of every layer.
    KvGroup g{.spec = layers.front()};
    for (const KvLayer& l : layers) g.layers.push_back(l.layer);
    kv.bytes_per_block = g.spec.PageBytes() * layers.size();
    kv.groups.push_back(std::move(g));
  } else if (all_same || !rules.hybrid_groups) {
    KvGroup g{.spec = layers.front()};
    for (const KvLayer& l : layers) g.layers.push_back(l.layer);
    kv.bytes_per_block = g.spec.PageBytes() * layers.size();
    kv.groups.push_back(std::move(g));
  } else {
    // Same kind, different pages (a uniform-type group), or a hybrid: unify the pages, then group.
    bool one_kind = true;
    for (const KvLayer& l : layers) {
      one_kind &= l.kind == layers.front().kind && l.window == layers.front().window &&
                  l.block_size == layers.front().block_size;
    }
    if (one_kind) {
      KvGroup g{.spec = layers.front()};
      uint64_t sum = 0;
      for (const KvLayer& l : layers) {
        g.layers.push_back(l.layer);
        sum += l.PageBytes();
        if (l.PageBytes() > g.spec.PageBytes()) g.spec = l;
      }
      kv.bytes_per_block = sum;
      kv.groups.push_back(std::move(g));
    } else {
      uint64_t max_page = 0;
      for (const KvLayer& l : layers) max_page = std::max(max_page, l.PageBytes());
      for (KvLayer& l : layers) {
        const uint64_t page = l.PageBytes();
        if (page == max_page) continue;
        if (l.kind == KvLayerKind::kMamba || max_page % page != 0) {
          return absl::UnimplementedError(absl::StrFormat(
              "layer %d's KV page (%d bytes) does not divide the largest (%d bytes); vLLM cannot group this model's "
              "layers either (NotImplementedError in unify_kv_cache_spec_page_size)",
              l.layer, page, max_page));
        }
        l.block_size *= static_cast<int64_t>(max_page / page);
      }
      // Buckets of equal specs, in first-seen order.
      std::vector<std::pair<KvLayer, std::vector<int>>> buckets;
      for (const KvLayer& l : layers) {
        auto it = std::find_if(buckets.begin(), buckets.end(), [&](const auto& b) { return b.first.SameSpec(l); });
        if (it == buckets.end()) {
          buckets.push_back({l, {l.layer}});
        } else {
          it->second.push_back(l.layer);
        }
      }
      size_t fewest = SIZE_MAX, most = 0;
      for (const auto& [spec, ids] : buckets) {
        fewest = std::min(fewest, ids.size());
        most = std::max(most, ids.size());
      }
      const size_t group_size = static_cast<double>(most) < 1.5 * static_cast<double>(fewest) ? most : fewest;
      for (const auto& [spec, ids] : buckets) {
        const size_t groups = (ids.size() + group_size - 1) / group_size;
        for (size_t g = 0; g < groups; ++g) {
          KvGroup group{.spec = spec};
          for (size_t i = g; i < ids.size(); i += groups) group.layers.push_back(ids[i]);
          group.padding = static_cast<int>(group_size - group.layers.size());
          kv.groups.push_back(std::move(group));
        }
      }
      kv.bytes_per_block = group_size * max_page;
    }
  }
  for (const KvGroup& g : kv.groups) {
    if (g.spec.PageBytes() == 0 || g.spec.PageBytes() > (uint64_t{1} << 50)) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "layer %d's KV page is %d bytes on this GPU; a page holds at least one value and at most 1 PiB",
          g.layers.front(), g.spec.PageBytes()));
    }
  }
  if (kv.bytes_per_block > (uint64_t{1} << 55)) {
    return absl::InvalidArgumentError("a KV block of every layer would exceed 2^55 bytes");
  }
  kv.block_size = kv.groups.front().spec.block_size;
  for (const KvGroup& g : kv.groups) kv.block_size = std::min(kv.block_size, g.spec.block_size);

  // One request's blocks at a length: per group (uniform-type group: the most any of its layers needs).
  auto request_blocks = [&](int64_t len) -> int64_t {
    int64_t blocks = 0;
    for (const KvGroup& g : kv.groups) blocks += blocks_for(g, len);
    return blocks;
  };
  const int64_t block_bytes = static_cast<int64_t>(kv.bytes_per_block);
  if (o.num_gpu_blocks_override) available = Mul(*o.num_gpu_blocks_override, block_bytes);
  kv.num_blocks = available > 0 ? available / block_bytes : 0;
  kv.blocks_per_request = request_blocks(o.max_model_len);
  kv.bytes_per_request = static_cast<uint64_t>(Mul(kv.blocks_per_request, block_bytes));

  if (!rules.v1) {
    // V0 (worker.py raise_if_cache_size_invalid): blocks x block_size tokens against max_model_len.
    kv.tokens = Mul(kv.num_blocks, kv.block_size);
    kv.max_concurrency = static_cast<double>(kv.tokens) / static_cast<double>(o.max_model_len);
    kv.max_model_len_that_fits = std::min(kv.tokens, o.max_model_len);
    if (kv.num_blocks <= 0) {
      kv.error = NoMemoryError(o);
    } else if (o.max_model_len > kv.tokens) {
      kv.error = absl::StrFormat(
          "The model's max seq len (%d) is larger than the maximum number of tokens that can be stored in KV cache "
          "(%d). Try increasing `gpu_memory_utilization` or decreasing `max_model_len` when initializing the engine.",
          o.max_model_len, kv.tokens);
    }
    return kv;
  }

  const int64_t check = available - (rules.null_block ? block_bytes : 0);
  // The longest length one request can have within `check` bytes (binary search, as vLLM's).
  auto longest = [&]() -> int64_t {
    if (check <= 0) return 0;
    int64_t lo = 1, hi = o.max_model_len, best = 0;
    while (lo <= hi) {
      const int64_t mid = lo + (hi - lo) / 2;
      if (Mul(request_blocks(mid), block_bytes) <= check) {
        best = mid;
        lo = mid + 1;
      } else {
        hi = mid - 1;
      }
    }
    return best;
  };
  kv.max_model_len_that_fits = longest();
  const int64_t needed = Mul(kv.blocks_per_request, block_bytes);
  if (check <= 0) {
    kv.error = NoMemoryError(o);
  } else if (needed > check) {
    const std::string possessive = rules.model_spelled ? "model's" : "models's";
    if (!rules.estimates_max_len) {
      kv.error = absl::StrFormat(
          "To serve at least one request with the %s max seq len (%d), (%.2f GB KV cache is needed, which is larger "
          "than the available KV cache memory (%.2f GB). Try increasing `gpu_memory_utilization` or decreasing "
          "`max_model_len` when initializing the engine.",
          possessive, o.max_model_len, static_cast<double>(needed) / 1073741824.0,
          static_cast<double>(check) / 1073741824.0);
    } else {
      const std::string estimate =
          kv.max_model_len_that_fits > 0
              ? absl::StrFormat("Based on the available memory, the estimated maximum model length is %d. ",
                                kv.max_model_len_that_fits)
              : "";
      const std::string head = absl::StrFormat(
          "To serve at least one request with the %s max seq len (%d), (%s GiB KV cache is needed, which is larger "
          "than the available KV cache memory (%s GiB). %s",
          possessive, o.max_model_len, VllmGib(static_cast<double>(needed)), VllmGib(static_cast<double>(check)),
          estimate);
      if (rules.extensible_kv_cache) {
        kv.error = absl::StrCat(head, Hint(o), " Decreasing `max_model_len` also reduces what is needed.", kDocs);
      } else {
        kv.error = absl::StrCat(head,
                                "Try increasing `gpu_memory_utilization` or decreasing `max_model_len` when "
                                "initializing the engine.",
                                rules.docs_link ? kDocs : "");
      }
    }
  }
  if (rules.tokens_from_concurrency) {
    kv.max_concurrency = static_cast<double>(kv.num_blocks) / static_cast<double>(kv.blocks_per_request);
    kv.tokens = static_cast<int64_t>(kv.max_concurrency * static_cast<double>(o.max_model_len));
  } else {
    kv.tokens = Mul(kv.num_blocks / static_cast<int64_t>(kv.groups.size()), kv.block_size);
    kv.max_concurrency = static_cast<double>(kv.tokens) / static_cast<double>(o.max_model_len);
  }
  return kv;
}

SglangKvCache SizeSglangKvCache(const std::vector<KvLayer>& layers, int64_t available, int64_t page_size,
                                int64_t context_length, std::optional<int64_t> max_running_requests) {
  SglangKvCache kv;
  uint64_t full = 0, sliding = 0;
  int64_t window = 0;
  for (const KvLayer& l : layers) {
    if (l.kind == KvLayerKind::kMamba) continue;
    const auto per_token = static_cast<uint64_t>(l.num_kv_heads * (l.head_size + l.head_size_v) * l.dtype_bytes);
    if (l.kind == KvLayerKind::kSlidingWindow) {
      sliding += per_token;
      window = l.window;
    } else {
      full += per_token;
    }
  }
  kv.cell_bytes = static_cast<double>(full) + 0.8 * static_cast<double>(sliding);
  if (full + sliding == 0) {
    kv.error = "no layer holds a KV cache";
    return kv;
  }
  if (sliding == 0) {
    const int64_t tokens = available > 0 ? available / static_cast<int64_t>(full) : 0;
    kv.max_total_tokens = tokens / page_size * page_size;
  } else {
    // HybridSWAPoolConfigurator: a full pool and a sliding pool of swa_full_tokens_ratio (0.8) of its tokens.
    const double cell = kv.cell_bytes;
    const auto tokens = available > 0 ? static_cast<int64_t>(std::floor(static_cast<double>(available) / cell)) : 0;
    kv.max_total_tokens = tokens / page_size * page_size;
    kv.swa_tokens = static_cast<int64_t>(static_cast<double>(kv.max_total_tokens) * 0.8) / page_size * page_size;
    if (kv.max_total_tokens > 0 && window + page_size >= kv.swa_tokens) {
      kv.error = absl::StrFormat(
          "SWA pool (%d tokens) cannot hold even one request: the prefill admission floor is sliding_window_size (%d) "
          "+ page_size (%d). Increase --swa-full-tokens-ratio or the total KV budget.",
          kv.swa_tokens, window, page_size);
      return kv;
    }
  }
  if (kv.max_total_tokens <= 0) {
    kv.error = "Not enough memory. Please try to increase --mem-fraction-static.";
    return kv;
  }
  // KVCacheConfigurator.resolve_max_num_reqs.
  const int64_t estimate =
      std::clamp<int64_t>(static_cast<int64_t>(static_cast<double>(kv.max_total_tokens) /
                                               static_cast<double>(context_length) * 512),
                          2048, 4096);
  kv.max_running_requests = std::min(max_running_requests.value_or(estimate), kv.max_total_tokens / 2);
  kv.max_concurrency = static_cast<double>(kv.max_total_tokens) / static_cast<double>(context_length);
  return kv;
}

}  // namespace headroom

#include "serving/engine.h"

#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "common/quote.h"

namespace headroom {

std::string_view EngineName(Engine engine) { return engine == Engine::kVllm ? "vllm" : "sglang"; }

std::string EngineRelease::Version() const { return absl::StrFormat("%d.%d.%d", major, minor, patch); }

std::string EngineRelease::Name() const {
  return absl::StrFormat("%s %s", engine == Engine::kVllm ? "vLLM" : "SGLang", Version());
}

absl::StatusOr<EngineRelease> ParseEngine(std::string_view spec) {
  const size_t at = spec.find('@');
  std::vector<std::string_view> parts = {spec.substr(0, at)};
  if (at != std::string_view::npos) parts.push_back(spec.substr(at + 1));
  EngineRelease release;
  if (parts[0] == "vllm") {
    release = kCurrentVllm;
  } else if (parts[0] == "sglang") {
    release = kCurrentSglang;
  } else {
    return absl::InvalidArgumentError(
        absl::StrFormat("unknown engine %s (expected vllm or sglang, optionally @VERSION: vllm@0.6.3)",
                        QuoteForError(parts[0])));
  }
  if (parts.size() == 1) return release;
  // "0.6.4", "0.6.4.post1", "v0.6.3": major.minor[.patch], then anything (a post or dev tag) ignored.
  std::string_view version = parts[1];
  if (!version.empty() && version[0] == 'v') version.remove_prefix(1);
  std::vector<std::string> numbers;
  for (size_t start = 0;;) {
    const size_t dot = version.find('.', start);
    numbers.emplace_back(version.substr(start, dot == std::string_view::npos ? std::string_view::npos : dot - start));
    if (dot == std::string_view::npos) break;
    start = dot + 1;
  }
  int fields[3] = {0, 0, 0};
  bool ok = numbers.size() >= 2;
  for (size_t i = 0; ok && i < numbers.size() && i < 3; ++i) {
    ok = absl::SimpleAtoi(numbers[i], &fields[i]) && fields[i] >= 0 && fields[i] < 10000;
  }
  if (!ok) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: expected a release as MAJOR.MINOR[.PATCH] after '@' (vllm@0.6.3)", QuoteForError(spec)));
  }
  release.major = fields[0];
  release.minor = fields[1];
  release.patch = fields[2];
  const EngineRelease current = release.engine == Engine::kVllm ? kCurrentVllm : kCurrentSglang;
  if (release.engine == Engine::kSglang) {
    if (release.major != current.major || release.minor != current.minor || release.patch != current.patch) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s: Headroom has SGLang's sizing rules as of %s only (read from that release's code); use --engine "
          "sglang",
          QuoteForError(spec), current.Version()));
    }
    return release;
  }
  if (!release.AtLeast(kOldestVllm.major, kOldestVllm.minor)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: vLLM releases from %s on are known", QuoteForError(spec), kOldestVllm.Version()));
  }
  if (release.AtLeast(current.major, current.minor + 1)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: the newest vLLM release Headroom has read is %s; a later one may count differently",
        QuoteForError(spec), current.Version()));
  }
  return release;
}

VllmRules VllmRulesOf(const EngineRelease& r) {
  VllmRules rules;
  rules.v1 = r.AtLeast(0, 8);
  if (!r.AtLeast(0, 3)) {
    rules.profile = VllmProfile::kDeviceUsed;
  } else if (!r.AtLeast(0, 6, 4)) {
    rules.profile = VllmProfile::kFreeDrop;
  } else if (!r.AtLeast(0, 6, 5) || (rules.v1 && !r.AtLeast(0, 11))) {
    rules.profile = VllmProfile::kTorchPeakAndNonTorch;
  } else {
    rules.profile = VllmProfile::kBaselineIncrease;
  }
  rules.ceil_request = r.AtLeast(0, 15);
  rules.free_memory_check = r.AtLeast(0, 11);
  rules.subtracts_cuda_graphs = r.AtLeast(0, 20);
  rules.extensible_kv_cache = r.AtLeast(0, 34);
  rules.default_utilization = rules.extensible_kv_cache ? 1.0 : r.AtLeast(0, 20) ? 0.92 : 0.9;
  rules.default_block_size = r.AtLeast(0, 34) ? 64 : 16;
  rules.hybrid_groups = r.AtLeast(0, 11);
  rules.attention_layers_only = r.AtLeast(0, 6, 3);
  rules.null_block = r.AtLeast(0, 29);
  rules.tokens_from_concurrency = r.AtLeast(0, 21);
  rules.check_per_request = rules.v1;
  rules.estimates_max_len = r.AtLeast(0, 11);
  rules.model_spelled = r.AtLeast(0, 22);
  rules.docs_link = r.AtLeast(0, 15);
  rules.bitsandbytes = !r.AtLeast(0, 28);
  rules.gptq_g_idx = !r.AtLeast(0, 21);
  rules.tier_160gib = r.AtLeast(0, 34);
  rules.memory_tiers = r.AtLeast(0, 11);
  return rules;
}

}  // namespace headroom

#include "graph/torch_runtime.h"

#include <charconv>

#include "absl/strings/str_format.h"
#include "common/name_table.h"
#include "common/quote.h"

namespace headroom {
namespace {

constexpr NameTable<Kernels, 2> kKernelsNames("kernels", {{
    {"cuda", Kernels::kCuda},
    {"cpu", Kernels::kCpu},
}});

// Reads the leading decimal number of `text` into `out`; the rest is returned.
std::string_view LeadingNumber(std::string_view text, int& out, bool& ok) {
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), out);
  ok = ec == std::errc() && end != text.data();
  return text.substr(static_cast<size_t>(end - text.data()));
}

// "MAJOR.MINOR" or "MAJOR" with anything after the minor number ignored.
bool ParseMajorMinor(std::string_view version, int& major, int& minor) {
  bool ok = false;
  std::string_view rest = LeadingNumber(version, major, ok);
  minor = 0;
  if (ok && rest.starts_with('.')) LeadingNumber(rest.substr(1), minor, ok);
  return ok;
}

}  // namespace

std::string_view KernelsName(Kernels kernels) { return kKernelsNames.Name(kernels); }
absl::StatusOr<Kernels> ParseKernels(std::string_view name) { return kKernelsNames.Parse(name); }

absl::StatusOr<TorchRuntime> ParseTorchVersion(std::string_view version) {
  TorchRuntime r;
  if (!ParseMajorMinor(version, r.major, r.minor)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("PyTorch version %s is not MAJOR.MINOR (e.g. 2.5 or 1.13)", QuoteForError(version)));
  }
  if (r.major < 1 || r.major > 99 || (r.major == 1 && r.minor < 13) || r.minor > 999) {
    return absl::InvalidArgumentError(
        absl::StrFormat("PyTorch version %s is not supported (1.13 or later)", QuoteForError(version)));
  }
  return r;
}

std::string TorchVersionName(const TorchRuntime& runtime) {
  return absl::StrFormat("%d.%d", runtime.major, runtime.minor);
}

absl::StatusOr<TransformersVersion> ParseTransformersVersion(std::string_view version) {
  TransformersVersion v;
  if (!ParseMajorMinor(version, v.major, v.minor)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("transformers version %s is not MAJOR.MINOR (e.g. 5.24 or 4.46)", QuoteForError(version)));
  }
  if (v.major < 4 || v.major > 99 || (v.major == 4 && v.minor < 40) || v.minor > 999) {
    return absl::InvalidArgumentError(
        absl::StrFormat("transformers version %s is not supported (4.40 or later)", QuoteForError(version)));
  }
  return v;
}

std::string TransformersVersionName(const TransformersVersion& version) {
  return absl::StrFormat("%d.%d", version.major, version.minor);
}

}  // namespace headroom

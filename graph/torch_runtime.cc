#include "graph/torch_runtime.h"

#include <charconv>

#include "absl/strings/str_format.h"
#include "common/name_table.h"

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

}  // namespace

std::string_view KernelsName(Kernels kernels) { return kKernelsNames.Name(kernels); }
absl::StatusOr<Kernels> ParseKernels(std::string_view name) { return kKernelsNames.Parse(name); }

absl::StatusOr<TorchRuntime> ParseTorchVersion(std::string_view version) {
  TorchRuntime r;
  bool ok = false;
  std::string_view rest = LeadingNumber(version, r.major, ok);
  r.minor = 0;
  if (ok && rest.starts_with('.')) rest = LeadingNumber(rest.substr(1), r.minor, ok);
  if (!ok) {
    return absl::InvalidArgumentError(
        absl::StrFormat("PyTorch version '%s' is not MAJOR.MINOR (e.g. 2.5 or 1.13)", version));
  }
  if (r.major < 1 || r.major > 99 || (r.major == 1 && r.minor < 13) || r.minor > 999) {
    return absl::InvalidArgumentError(
        absl::StrFormat("PyTorch version '%s' is not supported (1.13 or later)", version));
  }
  return r;
}

std::string TorchVersionName(const TorchRuntime& runtime) {
  return absl::StrFormat("%d.%d", runtime.major, runtime.minor);
}

}  // namespace headroom

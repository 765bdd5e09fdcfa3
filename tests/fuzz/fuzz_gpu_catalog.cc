// Any byte string given to the catalog parser yields a catalog or an error,
// never a crash; a parsed catalog answers lookups for all of its own names.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "hardware/gpu_catalog.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view text(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<headroom::GpuCatalog> catalog = headroom::GpuCatalog::Parse(text, "fuzz");
  if (!catalog.ok()) return 0;
  for (const headroom::GpuSpec& gpu : catalog->gpus()) {
    if (!catalog->Find(gpu.name).ok()) __builtin_trap();
    (void)headroom::GpuSpecToJson(gpu);
  }
  (void)catalog->Find(text.substr(0, 32));
  return 0;
}

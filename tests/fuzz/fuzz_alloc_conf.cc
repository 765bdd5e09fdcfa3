// HEADROOM_ALLOC_CONF parsing accepts or rejects any string; what it accepts
// formats back to a string that parses to the same options.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "allocator/alloc_conf.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view text(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<headroom::AllocatorOptions> options = headroom::ParseAllocConf(text);
  if (!options.ok()) return 0;
  const std::string canonical = headroom::FormatAllocConf(*options);
  absl::StatusOr<headroom::AllocatorOptions> again = headroom::ParseAllocConf(canonical);
  if (!again.ok() || headroom::FormatAllocConf(*again) != canonical) __builtin_trap();
  return 0;
}

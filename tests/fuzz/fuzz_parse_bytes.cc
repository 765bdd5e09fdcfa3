// ParseBytes accepts or rejects any string; accepted values format back.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "common/units.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view text(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<uint64_t> bytes = headroom::ParseBytes(text);
  if (bytes.ok()) (void)headroom::FormatBytes(*bytes);
  return 0;
}

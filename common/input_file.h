// Reading an input file (a model, graph, plan, catalog, fixture or trace)
// whole into memory, refusing what is not a regular file or is too large.
//
//   HEADROOM_ASSIGN_OR_RETURN(std::string text, ReadTextFile(path));
#ifndef HEADROOM_COMMON_INPUT_FILE_H_
#define HEADROOM_COMMON_INPUT_FILE_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"

namespace headroom {

// Every input file (model configs, graphs, catalogs, traces) is read whole
// into memory; this bound keeps a wrong path (a disk image, /dev/zero) from
// exhausting it. The largest real inputs, multi-GB PyTorch snapshots
// excepted, are tens of MB.
inline constexpr uint64_t kMaxTextFileBytes = uint64_t{1} << 30;

// Reads a whole regular file of at most `max_bytes`. Errors name the
// path: NotFound when it does not exist or cannot be opened,
// InvalidArgument when it is a directory ("is a directory"), not a regular
// file ("is not a regular file": a FIFO, socket or device, which is never
// opened, so a FIFO with no writer cannot block) or too large.
absl::StatusOr<std::string> ReadTextFile(const std::string& path, uint64_t max_bytes = kMaxTextFileBytes);

}  // namespace headroom

#endif  // HEADROOM_COMMON_INPUT_FILE_H_

// Writing an output file so that a failure never costs the previous one.
//
//   absl::Status written = ReplaceFileContents("plan.json", text);
//   // error: "plan.json: cannot write: No space left on device"
//
// Note [Output files replaced whole]: a regular file (or a path that does not
// exist yet) is written to a temporary file in the same folder, flushed to
// disk, and renamed over the path, so a full disk or a killed process leaves
// either the old file or the new one, never a truncated mix. A path that is
// not a regular file (/dev/stdout, /dev/null, a FIFO) cannot be replaced
// without destroying what it is, so it is written in place. A symbolic link
// is followed: the file it names is replaced, the link kept.
#ifndef HEADROOM_COMMON_FILE_WRITE_H_
#define HEADROOM_COMMON_FILE_WRITE_H_

#include <string>
#include <string_view>

#include "absl/status/status.h"

namespace headroom {

// Replaces the contents of `path` with `text` (Note [Output files replaced
// whole]). Errors are InvalidArgument naming the path and the system's
// reason (strerror), e.g. "out/plan.json: cannot write: No such file or
// directory"; on error no temporary file is left behind.
absl::Status ReplaceFileContents(const std::string& path, std::string_view text);

}  // namespace headroom

#endif  // HEADROOM_COMMON_FILE_WRITE_H_

#include "common/input_file.h"

#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <new>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/units.h"

namespace headroom {

absl::StatusOr<std::string> ReadTextFile(const std::string& path, const InputFileKind& kind) {
  // stat before open: opening a FIFO for reading blocks until a writer comes.
  struct stat info {};
  if (::stat(path.c_str(), &info) != 0) {
    return absl::NotFoundError(absl::StrCat(path, ": cannot open file: ", std::strerror(errno)));
  }
  if (S_ISDIR(info.st_mode)) return absl::InvalidArgumentError(absl::StrCat(path, ": is a directory, not a file"));
  if (!S_ISREG(info.st_mode)) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": is not a regular file (a device, FIFO or socket); give the path of a file"));
  }
  // Note [Input bounds] in input_file.h.
  auto too_large = [&](uint64_t bytes) {
    return absl::InvalidArgumentError(absl::StrFormat("%s: %d bytes is more than the %s %s may have", path, bytes,
                                                      FormatBytes(kind.max_bytes), kind.noun));
  };
  if (static_cast<uint64_t>(info.st_size) > kind.max_bytes) return too_large(static_cast<uint64_t>(info.st_size));
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot open file"));
  try {
    std::string contents(static_cast<size_t>(info.st_size), '\0');
    in.read(contents.data(), static_cast<std::streamsize>(contents.size()));
    if (in.bad()) return absl::DataLossError(absl::StrCat(path, ": read error"));
    contents.resize(static_cast<size_t>(in.gcount()));
    if (in) {  // the file may have grown: read the rest, still bounded
      char buffer[1 << 16];
      while (in.read(buffer, sizeof buffer) || in.gcount() > 0) {
        contents.append(buffer, static_cast<size_t>(in.gcount()));
        if (contents.size() > kind.max_bytes) return too_large(contents.size());
      }
      if (in.bad()) return absl::DataLossError(absl::StrCat(path, ": read error"));
    }
    return contents;
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError(
        absl::StrFormat("%s: out of memory reading its %d bytes", path, static_cast<uint64_t>(info.st_size)));
  }
}

}  // namespace headroom

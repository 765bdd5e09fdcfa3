#include "common/file_write.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"

namespace headroom {
namespace {

absl::Status CannotWrite(const std::string& path, int error) {
  return absl::InvalidArgumentError(absl::StrCat(path, ": cannot write: ", std::strerror(error)));
}

// All of `text` to `fd`; the errno of the first failure, or 0.
int WriteAll(int fd, std::string_view text) {
  while (!text.empty()) {
    const ssize_t n = ::write(fd, text.data(), text.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      return errno;
    }
    text.remove_prefix(static_cast<size_t>(n));
  }
  return 0;
}

// A device or FIFO: there is nothing to replace, only a stream to write to.
absl::Status WriteInPlace(const std::string& path, std::string_view text) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CLOEXEC);
  if (fd < 0) return CannotWrite(path, errno);
  int error = WriteAll(fd, text);
  if (::close(fd) != 0 && error == 0) error = errno;
  return error == 0 ? absl::OkStatus() : CannotWrite(path, error);
}

}  // namespace

absl::Status ReplaceFileContents(const std::string& path, std::string_view text) {
  if (path.empty()) return absl::InvalidArgumentError("an empty path names no file");
  std::string target = path;
  mode_t mode = 0;
  struct stat info {};
  if (::stat(path.c_str(), &info) == 0) {  // follows a symbolic link
    if (S_ISDIR(info.st_mode)) return absl::InvalidArgumentError(absl::StrCat(path, ": is a directory, not a file"));
    if (!S_ISREG(info.st_mode)) return WriteInPlace(path, text);
    // rename() would replace a file its owner made read-only; writing it in place would not.
    if (::access(path.c_str(), W_OK) != 0) return CannotWrite(path, errno);
    mode = info.st_mode & 07777;
    if (char* resolved = ::realpath(path.c_str(), nullptr)) {
      target = resolved;
      std::free(resolved);
    }
  } else if (errno == ENOENT) {
    const mode_t mask = ::umask(0);  // the only way to read the mask is to set it
    ::umask(mask);
    mode = 0666 & ~mask;
  } else {
    return CannotWrite(path, errno);
  }

  // Beside the target, so that the rename stays within one file system.
  const std::string pattern = target + ".tmp-XXXXXX";
  std::vector<char> temp(pattern.begin(), pattern.end());
  temp.push_back('\0');
  const int fd = ::mkstemp(temp.data());
  if (fd < 0) return CannotWrite(path, errno);
  int error = ::fchmod(fd, mode) != 0 ? errno : 0;  // mkstemp makes it 0600
  if (error == 0) error = WriteAll(fd, text);
  // A file system with delayed allocation reports a full disk here, not at write().
  if (error == 0 && ::fsync(fd) != 0) error = errno;
  if (::close(fd) != 0 && error == 0) error = errno;
  if (error == 0 && ::rename(temp.data(), target.c_str()) != 0) error = errno;
  if (error != 0) {
    ::unlink(temp.data());
    return CannotWrite(path, error);
  }
  return absl::OkStatus();
}

}  // namespace headroom

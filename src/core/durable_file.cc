// Durable file IO (durable_file.h).
#include "miles/durable_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace miles {

namespace {
// Runs `body(fd)` on a new file at `path`, then fsyncs and closes it.
template <typename Body>
Status with_new_file(const std::string& path, Body body) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return errno_error("cannot create", path);
  Status s = body(fd);
  if (s.ok() && ::fsync(fd) != 0) s = errno_error("fsync failed", path);
  if (::close(fd) != 0 && s.ok()) s = errno_error("close failed", path);
  return s;
}
}  // namespace

Status errno_error(const std::string& what, const std::string& path) {
  return Status::Error(path + ": " + what + ": " + std::strerror(errno));
}

Status write_all(int fd, const void* data, size_t n, const std::string& path) {
  const auto* p = static_cast<const uint8_t*>(data);
  while (n > 0) {
    const ssize_t w = ::write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return errno_error("write failed", path);
    p += w;
    n -= static_cast<size_t>(w);
  }
  return Status::Ok();
}

Status write_file_synced(const std::string& path, const void* data, size_t n) {
  return with_new_file(path, [&](int fd) { return write_all(fd, data, n, path); });
}

Status copy_file_synced(const std::string& from, const std::string& to) {
  const int in = ::open(from.c_str(), O_RDONLY | O_CLOEXEC);
  if (in < 0) return errno_error("cannot open", from);
  Status s = with_new_file(to, [&](int fd) {
    char buf[1 << 16];
    for (;;) {
      const ssize_t r = ::read(in, buf, sizeof buf);
      if (r < 0 && errno == EINTR) continue;
      if (r < 0) return errno_error("read failed", from);
      if (r == 0) return Status::Ok();
      MILES_RETURN_IF_ERROR(write_all(fd, buf, static_cast<size_t>(r), to));
    }
  });
  ::close(in);
  return s;
}

Status sync_dir(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return errno_error("cannot open directory to fsync", dir);
  const int rc = ::fsync(fd);
  ::close(fd);
  return rc == 0 ? Status::Ok() : errno_error("fsync of directory failed", dir);
}

Result<std::vector<uint8_t>> read_file_bytes(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return errno_error("cannot open", path);
  std::vector<uint8_t> out;
  uint8_t buf[1 << 16];
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      Status s = errno_error("read failed", path);
      ::close(fd);
      return s;
    }
    if (n == 0) break;
    out.insert(out.end(), buf, buf + n);
  }
  ::close(fd);
  return out;
}

}  // namespace miles

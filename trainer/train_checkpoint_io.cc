// Durable file IO for trainer checkpoints, and SHA-256 through OpenSSL's EVP interface.
#include "trainer/train_checkpoint_io.h"

#include <fcntl.h>
#include <openssl/evp.h>
#include <unistd.h>

#include <bit>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "miles/check.h"
#include "miles/train_checkpoint.h"

namespace miles {
namespace ckpt {
namespace {

Status errno_error(const std::string& what, const std::string& path) {
  return Status::Error(path + ": " + what + ": " + std::strerror(errno));
}

Status write_all(int fd, const char* p, size_t n, const std::string& path) {
  while (n > 0) {
    const ssize_t w = ::write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return errno_error("write failed", path);
    p += w;
    n -= static_cast<size_t>(w);
  }
  return Status::Ok();
}

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

Status write_file_synced(const std::string& path, const std::string& text) {
  return with_new_file(path, [&](int fd) { return write_all(fd, text.data(), text.size(), path); });
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

Result<std::string> read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status::Error(path + ": cannot open");
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) return Status::Error(path + ": read error");
  return text.str();
}

}  // namespace ckpt

std::string bytes_sha256(const void* data, size_t size) {
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  MILES_CHECK(EVP_Digest(data, size, md, &len, EVP_sha256(), nullptr) == 1, "EVP_Digest failed");
  static const char kHex[] = "0123456789abcdef";
  std::string hex(2 * len, '0');
  for (unsigned int i = 0; i < len; ++i) {
    hex[2 * i] = kHex[md[i] >> 4];
    hex[2 * i + 1] = kHex[md[i] & 15];
  }
  return hex;
}

std::string tensor_sha256(std::span<const float> values) {
  static_assert(std::endian::native == std::endian::little, "hashes are of little-endian bytes");
  return bytes_sha256(values.data(), values.size_bytes());
}

}  // namespace miles

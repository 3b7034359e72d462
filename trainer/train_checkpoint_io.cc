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
#include "miles/durable_file.h"
#include "miles/trainer/train_checkpoint.h"

namespace miles {
namespace ckpt {
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

// xxh3-128 (libxxhash's XXH3_128bits: the default secret, seed 0), the checksum every tensor of a
// weight version carries, as 32 hex digits, high half first (xxhsum -H2's canonical form).
//
// Our own loop over the library's constants, for what its loop cannot do: hash bytes while moving
// them (Xxh3Stream::copy: a receiver reads each byte from memory once, and the copy's stores
// bypass the cache; on Zen 2 copy + hash of 512 MB take 0.050 s in one pass against 0.082 s for
// memcpy then the library's hash, memcpy alone 0.043 s), reading ahead (software prefetch: a
// buffer not in cache hashes at 12.9 GB/s, the library's AVX2 loop 11.6). The AVX2 loop where the
// CPU has it (kernels::detect_isa, so MILES_ISA=scalar forces the scalar one), the scalar loop
// otherwise; inputs of at most 240 bytes, and the final merge, are the library's. Tests hold every
// path, split every way, equal to XXH3_128bits.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace miles::weight_sync_detail {

class Xxh3Stream {
 public:
  enum class Path { kScalar, kAvx2 };
  Xxh3Stream();  // the best path this CPU has
  explicit Xxh3Stream(Path path);

  // Hashes the next n bytes.
  void update(const void* p, size_t n);
  // Copies the next n bytes from `from` to `to` (not overlapping) and hashes them, in one pass
  // over memory. The stores stream past the cache (for a destination not read again soon).
  void copy(void* to, const void* from, size_t n);
  // The hash of every byte handed over so far (the stream can go on).
  std::string hex() const;
  uint64_t bytes() const { return len_; }

 private:
  void consume(const uint8_t* from, uint8_t* to, size_t n);
  void stripes(const uint8_t* from, uint8_t* to, size_t count);

  Path path_;
  alignas(32) uint64_t acc_[8];
  uint64_t len_ = 0;
  int in_block_ = 0;  // stripes accumulated since the last scramble
  // A stripe (64 bytes) is accumulated once a byte follows it: the last one is the final stripe's.
  uint8_t pending_[64];
  size_t pending_n_ = 0;
  uint8_t prev_[64];   // the stripe accumulated last (the final stripe's bytes before pending_)
  uint8_t head_[240];  // the first 240 bytes: a short input's hash is the library's
};

// The hash of one buffer, as 32 hex digits.
std::string xxh3_hex(const void* data, size_t n);

}  // namespace miles::weight_sync_detail

// xxh3-128 over bytes handed over piece by piece, in order: the same 32 hex digits (high half first,
// xxhsum -H2's canonical form) as miles::xxh3_128_hex of their concatenation. The receivers of the
// broadcast and the disk-delta reader hash each piece while it is still in cache.
#pragma once

#include <xxh_x86dispatch.h>
#include <xxhash.h>

#include <cstddef>
#include <cstdio>
#include <string>

#include "miles/check.h"

namespace miles::weight_sync_detail {

class Xxh3Stream {
 public:
  Xxh3Stream() : state_(XXH3_createState()) {
    MILES_CHECK(state_ != nullptr);
    XXH3_128bits_reset(state_);
  }
  ~Xxh3Stream() { XXH3_freeState(state_); }
  Xxh3Stream(const Xxh3Stream&) = delete;
  Xxh3Stream& operator=(const Xxh3Stream&) = delete;
  void update(const void* p, size_t n) { XXH3_128bits_update_dispatch(state_, p, n); }
  std::string hex() const {
    const XXH128_hash_t h = XXH3_128bits_digest(state_);
    char buf[33];
    std::snprintf(buf, sizeof buf, "%016llx%016llx", static_cast<unsigned long long>(h.high64),
                  static_cast<unsigned long long>(h.low64));
    return buf;
  }

 private:
  XXH3_state_t* state_;
};

}  // namespace miles::weight_sync_detail

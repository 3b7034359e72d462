// xxh3-128 in stripes (xxh3.h). The long-input algorithm: eight 64-bit accumulators; each 64-byte
// stripe k of a block adds, per lane i, the data word to lane i^1 and the product of the two
// 32-bit halves of (data ^ secret word k + i) to lane i; every 16 stripes (a block) the
// accumulators are scrambled with the secret's last 64 bytes. The stripes before the input's last
// byte are the body; the input's last 64 bytes are one more stripe (another secret offset); then
// the library merges the accumulators into the two halves.
#define XXH_INLINE_ALL
#include "weight_sync/xxh3.h"

#include <immintrin.h>
#include <xxhash.h>

#include <algorithm>
#include <cstdio>
#include <cstring>

#include "miles/kernels.h"

namespace miles::weight_sync_detail {

namespace {

constexpr size_t kStripe = 64;
constexpr int kStripesPerBlock = 16;  // (the default secret's 192 bytes − 64) / 8
constexpr size_t kSecretBytes = sizeof(XXH3_kSecret);
static_assert(kSecretBytes == 192);
const uint8_t* const kScrambleKey = XXH3_kSecret + kSecretBytes - kStripe;
const uint8_t* const kLastStripeKey = XXH3_kSecret + kSecretBytes - kStripe - 7;
constexpr size_t kPrefetch = 1024;  // bytes ahead of the stripe being hashed

uint64_t read64(const uint8_t* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
  return v;  // little-endian (x86)
}

// ---- scalar ---------------------------------------------------------------------------------
void stripe_scalar(uint64_t* acc, const uint8_t* in, const uint8_t* key) {
  for (int i = 0; i < 8; ++i) {
    const uint64_t data = read64(in + 8 * i), mixed = data ^ read64(key + 8 * i);
    acc[i ^ 1] += data;
    acc[i] += (mixed & 0xFFFFFFFFull) * (mixed >> 32);
  }
}

void scramble_scalar(uint64_t* acc) {
  for (int i = 0; i < 8; ++i) {
    uint64_t a = acc[i];
    a ^= a >> 47;
    a ^= read64(kScrambleKey + 8 * i);
    acc[i] = a * XXH_PRIME32_1;
  }
}

void stripes_scalar(uint64_t* acc, int& in_block, const uint8_t* from, uint8_t* to, size_t count) {
  if (to) std::memcpy(to, from, count * kStripe);
  for (size_t s = 0; s < count; ++s, from += kStripe) {
    stripe_scalar(acc, from, XXH3_kSecret + 8 * in_block);
    if (++in_block == kStripesPerBlock) {
      scramble_scalar(acc);
      in_block = 0;
    }
  }
}

// ---- AVX2 -----------------------------------------------------------------------------------
enum class Store { kNone, kStream32, kStream16, kPlain };

template <Store kStore>
__attribute__((target("avx2"))) inline void stripe_avx2(__m256i& a0, __m256i& a1, const uint8_t* in,
                                                        uint8_t* out, const uint8_t* key) {
  const __m256i d0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(in));
  const __m256i d1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(in + 32));
  if constexpr (kStore == Store::kStream32) {
    _mm256_stream_si256(reinterpret_cast<__m256i*>(out), d0);
    _mm256_stream_si256(reinterpret_cast<__m256i*>(out + 32), d1);
  } else if constexpr (kStore == Store::kStream16) {
    _mm_stream_si128(reinterpret_cast<__m128i*>(out), _mm256_castsi256_si128(d0));
    _mm_stream_si128(reinterpret_cast<__m128i*>(out + 16), _mm256_extracti128_si256(d0, 1));
    _mm_stream_si128(reinterpret_cast<__m128i*>(out + 32), _mm256_castsi256_si128(d1));
    _mm_stream_si128(reinterpret_cast<__m128i*>(out + 48), _mm256_extracti128_si256(d1, 1));
  } else if constexpr (kStore == Store::kPlain) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out), d0);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + 32), d1);
  }
  const __m256i m0 =
      _mm256_xor_si256(d0, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(key)));
  const __m256i m1 =
      _mm256_xor_si256(d1, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(key + 32)));
  // Each lane's low half times its high half; the data words swapped within 128-bit pairs (i^1).
  const __m256i p0 = _mm256_mul_epu32(m0, _mm256_shuffle_epi32(m0, _MM_SHUFFLE(0, 3, 0, 1)));
  const __m256i p1 = _mm256_mul_epu32(m1, _mm256_shuffle_epi32(m1, _MM_SHUFFLE(0, 3, 0, 1)));
  a0 =
      _mm256_add_epi64(_mm256_add_epi64(a0, _mm256_shuffle_epi32(d0, _MM_SHUFFLE(1, 0, 3, 2))), p0);
  a1 =
      _mm256_add_epi64(_mm256_add_epi64(a1, _mm256_shuffle_epi32(d1, _MM_SHUFFLE(1, 0, 3, 2))), p1);
}

__attribute__((target("avx2"))) inline __m256i scramble_lane_avx2(__m256i a, const uint8_t* key) {
  const __m256i prime = _mm256_set1_epi32(static_cast<int>(XXH_PRIME32_1));
  a = _mm256_xor_si256(a, _mm256_srli_epi64(a, 47));
  a = _mm256_xor_si256(a, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(key)));
  const __m256i lo = _mm256_mul_epu32(a, prime);
  const __m256i hi = _mm256_mul_epu32(_mm256_shuffle_epi32(a, _MM_SHUFFLE(0, 3, 0, 1)), prime);
  return _mm256_add_epi64(lo, _mm256_slli_epi64(hi, 32));  // a × prime mod 2^64
}

template <Store kStore>
__attribute__((target("avx2"))) void stripes_avx2(uint64_t* acc, int& in_block, const uint8_t* from,
                                                  uint8_t* to, size_t count) {
  __m256i a0 = _mm256_load_si256(reinterpret_cast<const __m256i*>(acc));
  __m256i a1 = _mm256_load_si256(reinterpret_cast<const __m256i*>(acc + 4));
  int k = in_block;
  for (size_t s = 0; s < count; ++s, from += kStripe) {
    _mm_prefetch(reinterpret_cast<const char*>(from + kPrefetch), _MM_HINT_T0);
    stripe_avx2<kStore>(a0, a1, from, to, XXH3_kSecret + 8 * k);
    if constexpr (kStore != Store::kNone) to += kStripe;
    if (++k == kStripesPerBlock) {
      a0 = scramble_lane_avx2(a0, kScrambleKey);
      a1 = scramble_lane_avx2(a1, kScrambleKey + 32);
      k = 0;
    }
  }
  if constexpr (kStore == Store::kStream32 || kStore == Store::kStream16) _mm_sfence();
  in_block = k;
  _mm256_store_si256(reinterpret_cast<__m256i*>(acc), a0);
  _mm256_store_si256(reinterpret_cast<__m256i*>(acc + 4), a1);
}

}  // namespace

Xxh3Stream::Xxh3Stream()
    : Xxh3Stream(kernels::detect_isa() == kernels::Isa::kScalar ? Path::kScalar : Path::kAvx2) {}

Xxh3Stream::Xxh3Stream(Path path) : path_(path) {
  const uint64_t init[8] = {XXH_PRIME32_3, XXH_PRIME64_1, XXH_PRIME64_2, XXH_PRIME64_3,
                            XXH_PRIME64_4, XXH_PRIME32_2, XXH_PRIME64_5, XXH_PRIME32_1};
  std::memcpy(acc_, init, sizeof acc_);
}

void Xxh3Stream::update(const void* p, size_t n) {
  consume(static_cast<const uint8_t*>(p), nullptr, n);
}

void Xxh3Stream::copy(void* to, const void* from, size_t n) {
  consume(static_cast<const uint8_t*>(from), static_cast<uint8_t*>(to), n);
}

void Xxh3Stream::stripes(const uint8_t* from, uint8_t* to, size_t count) {
  if (path_ == Path::kScalar) return stripes_scalar(acc_, in_block_, from, to, count);
  const auto at = reinterpret_cast<uintptr_t>(to);
  if (!to) return stripes_avx2<Store::kNone>(acc_, in_block_, from, to, count);
  if (at % 32 == 0) return stripes_avx2<Store::kStream32>(acc_, in_block_, from, to, count);
  if (at % 16 == 0) return stripes_avx2<Store::kStream16>(acc_, in_block_, from, to, count);
  return stripes_avx2<Store::kPlain>(acc_, in_block_, from, to, count);
}

// The bytes go, in order: into head_ while the input is short; a stripe is accumulated once a
// byte follows it (from pending_ when it was split between calls, else straight from `from`); the
// last 1–64 bytes wait in pending_.
void Xxh3Stream::consume(const uint8_t* from, uint8_t* to, size_t n) {
  if (n == 0) return;
  if (len_ < sizeof head_)
    std::memcpy(head_ + len_, from, std::min<size_t>(n, sizeof head_ - len_));
  len_ += n;
  if (pending_n_ + n <= kStripe) {
    std::memcpy(pending_ + pending_n_, from, n);
    if (to) std::memcpy(to, from, n);
    pending_n_ += n;
    return;
  }
  size_t i = 0;
  if (pending_n_ > 0) {  // completes the pending stripe, which a byte now follows
    i = kStripe - pending_n_;
    std::memcpy(pending_ + pending_n_, from, i);
    if (to) std::memcpy(to, from, i);
    stripes(pending_, nullptr, 1);
    std::memcpy(prev_, pending_, kStripe);
  }
  const size_t body = (n - i - 1) / kStripe;  // stripes with a byte after them (n − i ≥ 1)
  if (body > 0) {
    stripes(from + i, to ? to + i : nullptr, body);
    i += body * kStripe;
    std::memcpy(prev_, from + i - kStripe, kStripe);
  }
  pending_n_ = n - i;
  std::memcpy(pending_, from + i, pending_n_);
  if (to) std::memcpy(to + i, from + i, pending_n_);
}

std::string Xxh3Stream::hex() const {
  XXH128_hash_t h;
  if (len_ <= sizeof head_) {
    h = XXH3_128bits(head_, len_);
  } else {
    // The input's last 64 bytes: the end of the stripe accumulated last, then pending_.
    uint8_t last[kStripe];
    std::memcpy(last, prev_ + pending_n_, kStripe - pending_n_);
    std::memcpy(last + kStripe - pending_n_, pending_, pending_n_);
    alignas(32) uint64_t acc[8];
    std::memcpy(acc, acc_, sizeof acc);
    stripe_scalar(acc, last, kLastStripeKey);
    h.low64 = XXH3_mergeAccs(acc, XXH3_kSecret + XXH_SECRET_MERGEACCS_START, len_ * XXH_PRIME64_1);
    h.high64 =
        XXH3_mergeAccs(acc, XXH3_kSecret + kSecretBytes - kStripe - XXH_SECRET_MERGEACCS_START,
                       ~(len_ * XXH_PRIME64_2));
  }
  char buf[33];
  std::snprintf(buf, sizeof buf, "%016llx%016llx", static_cast<unsigned long long>(h.high64),
                static_cast<unsigned long long>(h.low64));
  return buf;
}

std::string xxh3_hex(const void* data, size_t n) {
  Xxh3Stream h;
  h.update(data, n);
  return h.hex();
}

}  // namespace miles::weight_sync_detail

// ggml block layouts and their float32 decoding.
//
// Why: GGUF checkpoints store most weights in ggml's block-quantised types. Each decoder below
// walks one block of the layout ggml-common.h defines and evaluates exactly the float operations
// (and their order) of ggml's reference dequantiser, so its output is bitwise that of ggml and of
// the `gguf` Python package (tests/gguf_test.cc checks this against fixtures that package wrote).
// Every load goes through memcpy: blocks have no alignment in the file.
#include "checkpoint/gguf_dequant.h"

#include <bit>
#include <cstring>

#include "miles/check.h"
#include "miles/gguf.h"

namespace miles::gguf {
namespace {

static_assert(std::endian::native == std::endian::little,
              "GGUF decoding assumes a little-endian host");

constexpr int64_t kQK = 32;     // elements per block of the legacy types (Q4_0 ... Q8_0, IQ4_NL)
constexpr int64_t kQK_K = 256;  // elements per super-block of the k-quants

uint16_t load_u16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}

float load_half(const uint8_t* p) { return half_to_float(load_u16(p)); }

uint32_t load_u32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

// llama.cpp's non-linear 4-bit code book of IQ4_NL and IQ4_XS (kvalues_iq4nl).
constexpr int8_t kIq4nlValues[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                     1,    13,   25,  38,  53,  69,  89,  113};

// block_q4_0 (18 bytes): half d; uint8 qs[16]. Element j is the low nibble of qs[j], element j + 16
// the high nibble; value (q - 8) * d.
void q4_0(const uint8_t* b, float* y) {
  const float d = load_half(b);
  const uint8_t* qs = b + 2;
  for (int j = 0; j < kQK / 2; ++j) {
    y[j] = static_cast<float>((qs[j] & 0x0f) - 8) * d;
    y[j + kQK / 2] = static_cast<float>((qs[j] >> 4) - 8) * d;
  }
}

// block_q4_1 (20 bytes): half d; half m; uint8 qs[16]; nibbles as Q4_0, value q * d + m.
void q4_1(const uint8_t* b, float* y) {
  const float d = load_half(b);
  const float m = load_half(b + 2);
  const uint8_t* qs = b + 4;
  for (int j = 0; j < kQK / 2; ++j) {
    y[j] = static_cast<float>(qs[j] & 0x0f) * d + m;
    y[j + kQK / 2] = static_cast<float>(qs[j] >> 4) * d + m;
  }
}

// block_q5_0 (22 bytes): half d; uint8 qh[4]; uint8 qs[16]. Element j < 16 is the low nibble of
// qs[j] with bit j of qh (read as a little-endian uint32) as its fifth bit, element j + 16 the high
// nibble of qs[j] with bit j + 16; value (q - 16) * d.
void q5_0(const uint8_t* b, float* y) {
  const float d = load_half(b);
  const uint32_t qh = load_u32(b + 2);
  const uint8_t* qs = b + 6;
  for (int j = 0; j < kQK / 2; ++j) {
    const int x0 = static_cast<int>((qs[j] & 0x0f) | (((qh >> j) << 4) & 0x10)) - 16;
    const int x1 = static_cast<int>((qs[j] >> 4) | ((qh >> (j + 12)) & 0x10)) - 16;
    y[j] = static_cast<float>(x0) * d;
    y[j + kQK / 2] = static_cast<float>(x1) * d;
  }
}

// block_q5_1 (24 bytes): half d; half m; uint8 qh[4]; uint8 qs[16]; bits as Q5_0, value q * d + m.
void q5_1(const uint8_t* b, float* y) {
  const float d = load_half(b);
  const float m = load_half(b + 2);
  const uint32_t qh = load_u32(b + 4);
  const uint8_t* qs = b + 8;
  for (int j = 0; j < kQK / 2; ++j) {
    const uint32_t x0 = (qs[j] & 0x0f) | (((qh >> j) << 4) & 0x10);
    const uint32_t x1 = (qs[j] >> 4) | ((qh >> (j + 12)) & 0x10);
    y[j] = static_cast<float>(x0) * d + m;
    y[j + kQK / 2] = static_cast<float>(x1) * d + m;
  }
}

// block_q8_0 (34 bytes): half d; int8 qs[32]; value q * d.
void q8_0(const uint8_t* b, float* y) {
  const float d = load_half(b);
  for (int j = 0; j < kQK; ++j) y[j] = static_cast<float>(static_cast<int8_t>(b[2 + j])) * d;
}

// The 6-bit scale and min of sub-block j (0..7) packed in the 12 scale bytes of a Q4_K block:
// bytes 0-3 hold scales 0-3 (low 6 bits) and the top 2 bits of scales 4-7; bytes 4-7 the same for
// the mins; bytes 8-11 the low 4 bits of scale (low nibble) and min (high nibble) 4-7.
void q4_k_scale_min(int j, const uint8_t* s, uint8_t* scale, uint8_t* min) {
  if (j < 4) {
    *scale = s[j] & 63;
    *min = s[j + 4] & 63;
  } else {
    *scale = static_cast<uint8_t>((s[j + 4] & 0x0f) | ((s[j - 4] >> 6) << 4));
    *min = static_cast<uint8_t>((s[j + 4] >> 4) | ((s[j] >> 6) << 4));
  }
}

// block_q2_K (84 bytes): uint8 scales[16]; uint8 qs[64]; half d; half dmin. Two halves of 128; in
// half h, element 16s + l (s = 0..7, l < 16) is bits 2(s / 2), 2(s / 2) + 1 of
// qs[32h + 16(s % 2) + l]; its sub-block 8h + s has scale (low nibble) and min (high nibble) in
// scales[8h + s]; value (d * scale) * q - (dmin * min).
void q2_k(const uint8_t* b, float* y) {
  const uint8_t* scales = b;
  const uint8_t* qs = b + 16;
  const float d = load_half(b + 80);
  const float dmin = load_half(b + 82);
  for (int s = 0; s < 16; ++s, y += 16) {
    const float dl = d * static_cast<float>(scales[s] & 0x0f);
    const float ml = dmin * static_cast<float>(scales[s] >> 4);
    const uint8_t* q = qs + 32 * (s / 8) + 16 * (s % 2);
    const int shift = 2 * ((s % 8) / 2);
    for (int l = 0; l < 16; ++l) y[l] = dl * static_cast<float>((q[l] >> shift) & 3) - ml;
  }
}

// block_q3_K (110 bytes): uint8 hmask[32]; uint8 qs[64]; uint8 scales[12]; half d. Sixteen
// sub-blocks of 16: sub-block s = 8h + t (t = 0..7) takes its low 2 bits from bits 2(t / 2),
// 2(t / 2) + 1 of qs[32h + 16(t % 2) + l] and subtracts 4 where bit s / 2 of hmask[16(s % 2) + l]
// is clear. Its 6-bit scale: low 4 bits from byte s (s < 8) or the high nibble of byte s - 8, top
// 2 bits from bits 2(s / 4), 2(s / 4) + 1 of byte 8 + s % 4; value (d * (scale - 32)) * q.
void q3_k(const uint8_t* b, float* y) {
  const uint8_t* hmask = b;
  const uint8_t* qs = b + 32;
  const uint8_t* sc = b + 96;
  const float d = load_half(b + 108);
  for (int s = 0; s < 16; ++s, y += 16) {
    const int low = s < 8 ? (sc[s] & 0x0f) : (sc[s - 8] >> 4);
    const int high = (sc[8 + s % 4] >> (2 * (s / 4))) & 3;
    const float dl = d * static_cast<float>((low | (high << 4)) - 32);
    const uint8_t* q = qs + 32 * (s / 8) + 16 * ((s % 8) % 2);
    const uint8_t* hm = hmask + 16 * (s % 2);
    const int shift = 2 * ((s % 8) / 2);
    const int bit = s / 2;
    for (int l = 0; l < 16; ++l) {
      const int v = ((q[l] >> shift) & 3) - (((hm[l] >> bit) & 1) ? 0 : 4);
      y[l] = dl * static_cast<float>(v);
    }
  }
}

// block_q4_K (144 bytes): half d; half dmin; uint8 scales[12]; uint8 qs[128]. Eight sub-blocks of
// 32: sub-block 2i is the low nibbles of qs[32i, 32i + 32), sub-block 2i + 1 their high nibbles;
// value (d * scale) * q - (dmin * min).
void q4_k(const uint8_t* b, float* y) {
  const float d = load_half(b);
  const float dmin = load_half(b + 2);
  const uint8_t* scales = b + 4;
  const uint8_t* qs = b + 16;
  for (int i = 0; i < 4; ++i) {
    uint8_t sc, m;
    q4_k_scale_min(2 * i, scales, &sc, &m);
    const float d1 = d * static_cast<float>(sc), m1 = dmin * static_cast<float>(m);
    q4_k_scale_min(2 * i + 1, scales, &sc, &m);
    const float d2 = d * static_cast<float>(sc), m2 = dmin * static_cast<float>(m);
    const uint8_t* q = qs + 32 * i;
    float* out = y + 64 * i;
    for (int l = 0; l < 32; ++l) out[l] = d1 * static_cast<float>(q[l] & 0x0f) - m1;
    for (int l = 0; l < 32; ++l) out[32 + l] = d2 * static_cast<float>(q[l] >> 4) - m2;
  }
}

// block_q5_K (176 bytes): half d; half dmin; uint8 scales[12] (as Q4_K); uint8 qh[32]; uint8
// qs[128]. Nibbles as Q4_K; sub-block j's fifth bit is bit j of qh[l]; value
// (d * scale) * q - (dmin * min).
void q5_k(const uint8_t* b, float* y) {
  const float d = load_half(b);
  const float dmin = load_half(b + 2);
  const uint8_t* scales = b + 4;
  const uint8_t* qh = b + 16;
  const uint8_t* qs = b + 48;
  for (int j = 0; j < 8; ++j, y += 32) {
    uint8_t sc, m;
    q4_k_scale_min(j, scales, &sc, &m);
    const float dl = d * static_cast<float>(sc), ml = dmin * static_cast<float>(m);
    const uint8_t* q = qs + 32 * (j / 2);
    const int shift = 4 * (j % 2);
    for (int l = 0; l < 32; ++l) {
      const int v = ((q[l] >> shift) & 0x0f) | (((qh[l] >> j) & 1) << 4);
      y[l] = dl * static_cast<float>(v) - ml;
    }
  }
}

// block_q6_K (210 bytes): uint8 ql[128] (low 4 bits); uint8 qh[64] (high 2 bits); int8 scales[16];
// half d. Two halves of 128; in half h, element l + 32k (k = 0..3, l < 32) takes its low bits from
// ql[64h + l + 32(k & 1)] (low nibble for k < 2, high for k >= 2) and its high bits from bits 2k,
// 2k+1 of qh[32h + l]; value (d * scale) * (q - 32), scale = scales[8h + l / 16 + 2k].
void q6_k(const uint8_t* b, float* y) {
  const uint8_t* ql = b;
  const uint8_t* qh = b + 128;
  const auto* sc = reinterpret_cast<const int8_t*>(b + 192);
  const float d = load_half(b + 208);
  for (int h = 0; h < 2; ++h, ql += 64, qh += 32, sc += 8, y += 128) {
    for (int l = 0; l < 32; ++l) {
      const int is = l / 16;
      const int q1 = ((ql[l] & 0x0f) | ((qh[l] & 3) << 4)) - 32;
      const int q2 = ((ql[l + 32] & 0x0f) | (((qh[l] >> 2) & 3) << 4)) - 32;
      const int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
      const int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
      y[l] = d * static_cast<float>(sc[is]) * static_cast<float>(q1);
      y[l + 32] = d * static_cast<float>(sc[is + 2]) * static_cast<float>(q2);
      y[l + 64] = d * static_cast<float>(sc[is + 4]) * static_cast<float>(q3);
      y[l + 96] = d * static_cast<float>(sc[is + 6]) * static_cast<float>(q4);
    }
  }
}

// block_iq4_nl (18 bytes): half d; uint8 qs[16]; nibbles as Q4_0, value d * kvalues[q].
void iq4_nl(const uint8_t* b, float* y) {
  const float d = load_half(b);
  const uint8_t* qs = b + 2;
  for (int j = 0; j < kQK / 2; ++j) {
    y[j] = d * static_cast<float>(kIq4nlValues[qs[j] & 0x0f]);
    y[j + kQK / 2] = d * static_cast<float>(kIq4nlValues[qs[j] >> 4]);
  }
}

// block_iq4_xs (136 bytes): half d; uint16 scales_h; uint8 scales_l[4]; uint8 qs[128]. Eight
// sub-blocks of 32 laid out as IQ4_NL blocks; sub-block i's 6-bit scale is nibble i % 2 of
// scales_l[i / 2] with bits 2i, 2i + 1 of scales_h on top; value (d * (scale - 32)) * kvalues[q].
void iq4_xs(const uint8_t* b, float* y) {
  const float d = load_half(b);
  const uint16_t scales_h = load_u16(b + 2);
  const uint8_t* scales_l = b + 4;
  const uint8_t* qs = b + 8;
  for (int i = 0; i < 8; ++i, y += 32, qs += 16) {
    const int ls = ((scales_l[i / 2] >> (4 * (i % 2))) & 0x0f) | (((scales_h >> (2 * i)) & 3) << 4);
    const float dl = d * static_cast<float>(ls - 32);
    for (int j = 0; j < 16; ++j) {
      y[j] = dl * static_cast<float>(kIq4nlValues[qs[j] & 0x0f]);
      y[j + 16] = dl * static_cast<float>(kIq4nlValues[qs[j] >> 4]);
    }
  }
}

struct Entry {
  uint32_t type;
  GgmlTypeTraits traits;
};

// ggml's type numbers and block geometry (ggml.h / ggml.c type_traits; gaps are retired types).
constexpr Entry kTypes[] = {
    {0, {"F32", 1, 4, true}},          {1, {"F16", 1, 2, true}},
    {2, {"Q4_0", 32, 18, true}},       {3, {"Q4_1", 32, 20, true}},
    {6, {"Q5_0", 32, 22, true}},       {7, {"Q5_1", 32, 24, true}},
    {8, {"Q8_0", 32, 34, true}},       {9, {"Q8_1", 32, 40, false}},
    {10, {"Q2_K", 256, 84, true}},     {11, {"Q3_K", 256, 110, true}},
    {12, {"Q4_K", 256, 144, true}},    {13, {"Q5_K", 256, 176, true}},
    {14, {"Q6_K", 256, 210, true}},    {15, {"Q8_K", 256, 292, false}},
    {16, {"IQ2_XXS", 256, 66, false}}, {17, {"IQ2_XS", 256, 74, false}},
    {18, {"IQ3_XXS", 256, 98, false}}, {19, {"IQ1_S", 256, 50, false}},
    {20, {"IQ4_NL", 32, 18, true}},    {21, {"IQ3_S", 256, 110, false}},
    {22, {"IQ2_S", 256, 82, false}},   {23, {"IQ4_XS", 256, 136, true}},
    {24, {"I8", 1, 1, false}},         {25, {"I16", 1, 2, false}},
    {26, {"I32", 1, 4, false}},        {27, {"I64", 1, 8, false}},
    {28, {"F64", 1, 8, false}},        {29, {"IQ1_M", 256, 56, false}},
    {30, {"BF16", 1, 2, true}},        {34, {"TQ1_0", 256, 54, false}},
    {35, {"TQ2_0", 256, 66, false}},   {39, {"MXFP4", 32, 17, false}},
    {40, {"NVFP4", 64, 36, false}},    {41, {"Q1_0", 128, 18, false}},
};

}  // namespace

float half_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  uint32_t bits;
  if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (mant << 13);  // inf, or NaN with its payload
  } else if (exp != 0) {
    bits = sign | ((exp + 112) << 23) | (mant << 13);
  } else if (mant == 0) {
    bits = sign;
  } else {  // subnormal: normalise
    uint32_t e = 113;
    while ((mant & 0x400u) == 0) {
      mant <<= 1;
      --e;
    }
    bits = sign | (e << 23) | ((mant & 0x3ffu) << 13);
  }
  return std::bit_cast<float>(bits);
}

std::optional<GgmlTypeTraits> ggml_type_traits(uint32_t type) {
  for (const Entry& e : kTypes)
    if (e.type == type) return e.traits;
  return std::nullopt;
}

std::string ggml_type_name(uint32_t type) {
  const auto t = ggml_type_traits(type);
  return t ? std::string(t->name) : "type " + std::to_string(type);
}

std::string dequantizable_type_names() {
  std::string s;
  for (const Entry& e : kTypes)
    if (e.traits.dequantizable) s += (s.empty() ? "" : ", ") + std::string(e.traits.name);
  return s;
}

void dequantize_blocks(uint32_t type, const uint8_t* src, int64_t n_blocks, float* dst) {
  const auto traits = ggml_type_traits(type);
  MILES_CHECK(traits && traits->dequantizable, "dequantize_blocks called for an undecodable type");
  const int64_t bb = traits->block_bytes, be = traits->block_elems;
  using T = GgmlType;
  switch (static_cast<T>(type)) {
    case T::kF32:
      std::memcpy(dst, src, static_cast<size_t>(n_blocks) * 4);
      return;
    case T::kF16:
      for (int64_t i = 0; i < n_blocks; ++i) dst[i] = load_half(src + 2 * i);
      return;
    case T::kBF16:
      for (int64_t i = 0; i < n_blocks; ++i)
        dst[i] = std::bit_cast<float>(static_cast<uint32_t>(load_u16(src + 2 * i)) << 16);
      return;
    default:
      break;
  }
  void (*block)(const uint8_t*, float*) = nullptr;
  switch (static_cast<T>(type)) {
    case T::kQ4_0:
      block = q4_0;
      break;
    case T::kQ4_1:
      block = q4_1;
      break;
    case T::kQ5_0:
      block = q5_0;
      break;
    case T::kQ5_1:
      block = q5_1;
      break;
    case T::kQ8_0:
      block = q8_0;
      break;
    case T::kQ2_K:
      block = q2_k;
      break;
    case T::kQ3_K:
      block = q3_k;
      break;
    case T::kQ4_K:
      block = q4_k;
      break;
    case T::kQ5_K:
      block = q5_k;
      break;
    case T::kQ6_K:
      block = q6_k;
      break;
    case T::kIQ4_NL:
      block = iq4_nl;
      break;
    case T::kIQ4_XS:
      block = iq4_xs;
      break;
    default:
      break;
  }
  MILES_CHECK(block != nullptr, "a dequantizable type without a block decoder");
  for (int64_t i = 0; i < n_blocks; ++i) block(src + i * bb, dst + i * be);
}

}  // namespace miles::gguf

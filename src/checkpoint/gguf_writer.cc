// gguf_metadata_image: a tensor-less GGUF v3 image of some metadata (gguf.h), the layout
// gguf_file.cc reads: "GGUF", u32 version, u64 tensor count (0), u64 key count, then per key its
// u64-length-prefixed name, u32 type and value (arrays: u32 element type, u64 count, elements),
// little-endian; no data section (a file without tensors needs no padding).
#include <cstring>

#include "miles/gguf.h"

namespace miles {
namespace {

template <typename T>
void put(std::string& out, T v) {
  char b[sizeof(T)];
  std::memcpy(b, &v, sizeof(T));
  out.append(b, sizeof(T));
}

void put_string(std::string& out, const std::string& s) {
  put<uint64_t>(out, s.size());
  out += s;
}

void put_int(std::string& out, GgufType t, int64_t v) {
  switch (t) {
    case GgufType::kU8:
    case GgufType::kI8:
    case GgufType::kBool:
      put<uint8_t>(out, static_cast<uint8_t>(v));
      return;
    case GgufType::kU16:
    case GgufType::kI16:
      put<uint16_t>(out, static_cast<uint16_t>(v));
      return;
    case GgufType::kU32:
    case GgufType::kI32:
      put<uint32_t>(out, static_cast<uint32_t>(v));
      return;
    default:  // kU64, kI64
      put<uint64_t>(out, static_cast<uint64_t>(v));
  }
}

void put_float(std::string& out, GgufType t, double v) {
  if (t == GgufType::kF32) {
    put<float>(out, static_cast<float>(v));
  } else {
    put<double>(out, v);
  }
}

bool is_float(GgufType t) { return t == GgufType::kF32 || t == GgufType::kF64; }

}  // namespace

std::string gguf_metadata_image(const std::map<std::string, GgufValue>& metadata) {
  std::string out = "GGUF";
  put<uint32_t>(out, 3);
  put<uint64_t>(out, 0);
  put<uint64_t>(out, metadata.size());
  for (const auto& [key, v] : metadata) {
    put_string(out, key);
    put<uint32_t>(out, static_cast<uint32_t>(v.type));
    if (v.type == GgufType::kString) {
      put_string(out, v.s);
    } else if (v.type == GgufType::kArray) {
      put<uint32_t>(out, static_cast<uint32_t>(v.elem));
      if (v.elem == GgufType::kString) {
        put<uint64_t>(out, v.strings.size());
        for (const std::string& e : v.strings) put_string(out, e);
      } else if (is_float(v.elem)) {
        put<uint64_t>(out, v.floats.size());
        for (double e : v.floats) put_float(out, v.elem, e);
      } else {
        put<uint64_t>(out, v.ints.size());
        for (int64_t e : v.ints) put_int(out, v.elem, e);
      }
    } else if (is_float(v.type)) {
      put_float(out, v.type, v.f);
    } else {
      put_int(out, v.type, v.i);
    }
  }
  return out;
}

}  // namespace miles

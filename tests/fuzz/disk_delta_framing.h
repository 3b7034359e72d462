// The fuzz input format of fuzz_disk_delta.cc, shared with the seed writer
// (make_disk_delta_seeds.cc): one or two disk-delta version directories in one byte string.
//
// Why: the reader takes a directory of files, libFuzzer gives one buffer. Each version is
//   u32 (little endian) manifest length, manifest.json bytes, u32 data length, tensors.zst bytes;
// the first is weight_v000001, a second (optional) weight_v000002. A length past the end of the
// input takes what is left, so that mutations keep their bytes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace miles::fuzz {

struct VersionFiles {
  std::string manifest;  // manifest.json
  std::string data;      // tensors.zst
};

inline std::string_view take_chunk(std::string_view& in) {
  uint32_t n = 0;
  for (size_t i = 0; i < 4 && i < in.size(); ++i)
    n |= static_cast<uint32_t>(static_cast<uint8_t>(in[i])) << (8 * i);
  in.remove_prefix(in.size() < 4 ? in.size() : 4);
  const std::string_view chunk = in.substr(0, n);
  in.remove_prefix(chunk.size());
  return chunk;
}

// At most two versions; empty input: none.
inline std::vector<VersionFiles> unframe(std::string_view in) {
  std::vector<VersionFiles> out;
  while (!in.empty() && out.size() < 2) {
    VersionFiles v;
    v.manifest = take_chunk(in);
    v.data = take_chunk(in);
    out.push_back(std::move(v));
  }
  return out;
}

inline void append_chunk(std::string& out, std::string_view chunk) {
  for (size_t i = 0; i < 4; ++i) out += static_cast<char>((chunk.size() >> (8 * i)) & 0xff);
  out += chunk;
}

inline std::string frame(const std::vector<VersionFiles>& versions) {
  std::string out;
  for (const VersionFiles& v : versions) {
    append_chunk(out, v.manifest);
    append_chunk(out, v.data);
  }
  return out;
}

}  // namespace miles::fuzz

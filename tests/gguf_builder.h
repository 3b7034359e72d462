// GgufBuilder: writes GGUF images byte by byte for tests, including deliberately broken ones.
//
// Why: the reader's error paths need files that lie (counts, lengths, offsets, types) in exactly
// one place; the `gguf` Python package cannot write those. Valid images follow the format: header,
// key / value pairs, tensor infos, padding to the alignment, tensor data at aligned offsets.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

namespace miles::test {

class GgufBuilder {
 public:
  // Raw little-endian writers into a byte vector.
  static void put_u8(std::vector<uint8_t>& b, uint8_t v) { b.push_back(v); }
  static void put_u32(std::vector<uint8_t>& b, uint32_t v) { put(b, &v, 4); }
  static void put_u64(std::vector<uint8_t>& b, uint64_t v) { put(b, &v, 8); }
  static void put_f32(std::vector<uint8_t>& b, float v) { put(b, &v, 4); }
  static void put_str(std::vector<uint8_t>& b, const std::string& s) {
    put_u64(b, s.size());
    put(b, s.data(), s.size());
  }
  static void put(std::vector<uint8_t>& b, const void* p, size_t n) {
    const auto* c = static_cast<const uint8_t*>(p);
    b.insert(b.end(), c, c + n);
  }

  explicit GgufBuilder(uint32_t version = 3) : version_(version) {}

  // A key with its value type and the value's encoded bytes (anything, for lies).
  GgufBuilder& kv_raw(const std::string& key, uint32_t type, std::vector<uint8_t> value) {
    put_str(kv_, key);
    put_u32(kv_, type);
    kv_.insert(kv_.end(), value.begin(), value.end());
    ++kv_count_;
    return *this;
  }
  GgufBuilder& kv_u32(const std::string& key, uint32_t v) {
    std::vector<uint8_t> b;
    put_u32(b, v);
    return kv_raw(key, 4, b);
  }
  GgufBuilder& kv_f32(const std::string& key, float v) {
    std::vector<uint8_t> b;
    put_f32(b, v);
    return kv_raw(key, 6, b);
  }
  GgufBuilder& kv_bool(const std::string& key, bool v) { return kv_raw(key, 7, {uint8_t(v)}); }
  GgufBuilder& kv_str(const std::string& key, const std::string& v) {
    std::vector<uint8_t> b;
    put_str(b, v);
    return kv_raw(key, 8, b);
  }
  GgufBuilder& kv_strs(const std::string& key, const std::vector<std::string>& v) {
    std::vector<uint8_t> b;
    put_u32(b, 8);
    put_u64(b, v.size());
    for (const auto& s : v) put_str(b, s);
    return kv_raw(key, 9, b);
  }
  GgufBuilder& kv_i32s(const std::string& key, const std::vector<int32_t>& v) {
    std::vector<uint8_t> b;
    put_u32(b, 5);
    put_u64(b, v.size());
    for (int32_t x : v) put(b, &x, 4);
    return kv_raw(key, 9, b);
  }

  // A tensor: ggml ne (fastest first), type, data bytes. offset < 0: the next aligned offset.
  GgufBuilder& tensor(const std::string& name, std::vector<uint64_t> ne, uint32_t type,
                      std::vector<uint8_t> data, int64_t offset = -1) {
    tensors_.push_back({name, std::move(ne), type, std::move(data), offset});
    return *this;
  }
  // F32 tensor from values.
  GgufBuilder& tensor_f32(const std::string& name, std::vector<uint64_t> ne,
                          const std::vector<float>& v) {
    std::vector<uint8_t> b(v.size() * 4);
    std::memcpy(b.data(), v.data(), b.size());
    return tensor(name, std::move(ne), 0, std::move(b));
  }

  GgufBuilder& alignment(uint32_t a) {
    alignment_ = a;
    return kv_u32("general.alignment", a);
  }
  GgufBuilder& lie_tensor_count(uint64_t n) {
    tensor_count_ = n;
    return *this;
  }
  GgufBuilder& lie_kv_count(uint64_t n) {
    kv_count_lie_ = n;
    return *this;
  }

  std::vector<uint8_t> build() const {
    std::vector<uint8_t> b = {'G', 'G', 'U', 'F'};
    put_u32(b, version_);
    put_u64(b, tensor_count_ != UINT64_MAX ? tensor_count_ : tensors_.size());
    put_u64(b, kv_count_lie_ != UINT64_MAX ? kv_count_lie_ : kv_count_);
    b.insert(b.end(), kv_.begin(), kv_.end());
    std::vector<uint64_t> offsets;
    uint64_t next = 0;
    for (const auto& t : tensors_) {
      const uint64_t off = t.offset >= 0 ? static_cast<uint64_t>(t.offset) : next;
      offsets.push_back(off);
      next = std::max(next, pad(off + t.data.size()));
      put_str(b, t.name);
      put_u32(b, static_cast<uint32_t>(t.ne.size()));
      for (uint64_t n : t.ne) put_u64(b, n);
      put_u32(b, t.type);
      put_u64(b, off);
    }
    if (tensors_.empty()) return b;
    b.resize(pad(b.size()), 0);
    const size_t data_start = b.size();
    for (size_t i = 0; i < tensors_.size(); ++i) {
      const auto& d = tensors_[i].data;
      if (d.empty()) continue;  // a lying offset with no bytes behind it
      if (data_start + offsets[i] + d.size() > b.size())
        b.resize(data_start + offsets[i] + d.size());
      std::memcpy(b.data() + data_start + offsets[i], d.data(), d.size());
    }
    b.resize(data_start + pad(b.size() - data_start), 0);
    return b;
  }

 private:
  struct T {
    std::string name;
    std::vector<uint64_t> ne;
    uint32_t type;
    std::vector<uint8_t> data;
    int64_t offset;
  };
  uint64_t pad(uint64_t n) const { return (n + alignment_ - 1) / alignment_ * alignment_; }

  uint32_t version_;
  uint32_t alignment_ = 32;
  std::vector<uint8_t> kv_;
  uint64_t kv_count_ = 0;
  uint64_t kv_count_lie_ = UINT64_MAX;
  uint64_t tensor_count_ = UINT64_MAX;
  std::vector<T> tensors_;
};

}  // namespace miles::test

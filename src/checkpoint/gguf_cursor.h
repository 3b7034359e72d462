// Private to src/checkpoint: the byte cursor the GGUF reader parses with, and the metadata half of
// the reader (gguf_metadata.cc) that gguf_file.cc calls.
//
// Why: every read of an untrusted GGUF image goes through one bounds-checked cursor whose errors
// carry the file name and the current key or tensor ("t.gguf: metadata key 'k': ...").
#pragma once

#include <cstdint>
#include <cstring>
#include <map>
#include <string>

#include "miles/gguf.h"

namespace miles::gguf {

// Sequential little-endian reads over [data, data + size); `what` says where a short read happened.
class Cursor {
 public:
  Cursor(const uint8_t* data, size_t size, const std::string& source)
      : data_(data), size_(size), source_(source) {}

  uint64_t pos() const { return pos_; }
  uint64_t left() const { return size_ - pos_; }
  void set_context(std::string context) { context_ = std::move(context); }

  Status error(const std::string& what) const {
    return Status::Error(source_ + ": " + context_ + what);
  }

  template <typename T>
  Status read(T* out, const char* what) {
    if (left() < sizeof(T))
      return error(std::string(what) + " at byte " + std::to_string(pos_) +
                   " is cut off: " + std::to_string(sizeof(T)) + " bytes needed, " +
                   std::to_string(left()) + " left in the " + std::to_string(size_) + "-byte file");
    std::memcpy(out, data_ + pos_, sizeof(T));
    pos_ += sizeof(T);
    return Status::Ok();
  }

  Status read_string(std::string* out, const char* what) {
    uint64_t n = 0;
    MILES_RETURN_IF_ERROR(read(&n, what));
    if (n > left())
      return error(std::string(what) + " has length " + std::to_string(n) + " at byte " +
                   std::to_string(pos_ - 8) + ", past the end of the file (" +
                   std::to_string(left()) + " bytes left)");
    out->assign(reinterpret_cast<const char*>(data_ + pos_), n);
    pos_ += n;
    return Status::Ok();
  }

  // Checks that `count` items of at least `min_bytes` each can fit in the bytes left.
  Status check_count(uint64_t count, uint64_t min_bytes, const std::string& what) const {
    if (count > left() / min_bytes)
      return error(what + " " + std::to_string(count) + " at byte " + std::to_string(pos_) +
                   " cannot fit in the " + std::to_string(left()) + " bytes left of the file");
    return Status::Ok();
  }

 private:
  const uint8_t* data_;
  uint64_t size_;
  uint64_t pos_ = 0;
  const std::string& source_;
  std::string context_;
};

// kv_count key / value pairs: keys unique and non-empty, values of known types, arrays flat.
Result<std::map<std::string, GgufValue>> read_metadata(Cursor& c, uint64_t count);

// "u32", "array of string": a value's type for error messages.
std::string describe(const GgufValue& v);

}  // namespace miles::gguf

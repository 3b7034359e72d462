// MappedFile: a whole file memory-mapped read-only, owned through a shared_ptr.
//
// Why: checkpoint readers hand out Tensor views straight into the file's pages; each view holds the
// shared_ptr, so the mapping lives exactly as long as the last tensor that points into it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "miles/status.h"

namespace miles {

class MappedFile {
 public:
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  // Maps `path` (a regular file) read-only; an empty file maps to data() == nullptr, size() == 0.
  static Result<std::shared_ptr<const MappedFile>> open(const std::string& path);

  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  MappedFile() = default;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
  std::string path_;
};

}  // namespace miles

// write_safetensors: one file, written atomically.
//
// Why: the trainer overwrites checkpoints that a crashed or concurrent reader must never see half
// written. Bytes go to `path.tmp.<pid>`, are fsynced, renamed over `path`, and the directory is
// fsynced; any failure removes the temporary file. The header lists tensors in the caller's order
// with their data contiguous in that order, and is padded with spaces to a multiple of 8 bytes so
// that the data buffer starts 8-byte aligned (as the reference writer does).
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <set>

#include "miles/checkpoint.h"
#include "miles/durable_file.h"
#include "nlohmann/json.hpp"

namespace miles {
namespace {

Result<std::string> make_header(const std::vector<std::pair<std::string, Tensor>>& tensors,
                                const std::map<std::string, std::string>& metadata,
                                const std::string& path) {
  nlohmann::ordered_json h = nlohmann::ordered_json::object();
  if (!metadata.empty()) h["__metadata__"] = metadata;
  std::set<std::string> seen;
  uint64_t offset = 0;
  for (const auto& [name, t] : tensors) {
    if (name == "__metadata__" || !seen.insert(name).second)
      return Status::Error(path + ": tensor name '" + name + "' is reserved or given twice");
    if (!t.defined()) return Status::Error(path + ": tensor '" + name + "' has no data");
    const uint64_t end = offset + static_cast<uint64_t>(t.nbytes());
    h[name] = {{"dtype", std::string(dtype_name(t.dtype()))},
               {"shape", t.shape()},
               {"data_offsets", {offset, end}}};
    offset = end;
  }
  std::string text = h.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  return text;
}

Status write_file(int fd, const std::string& header,
                  const std::vector<std::pair<std::string, Tensor>>& tensors,
                  const std::string& path) {
  uint8_t len[8];
  for (int i = 0; i < 8; ++i)
    len[i] = static_cast<uint8_t>(static_cast<uint64_t>(header.size()) >> (8 * i));
  MILES_RETURN_IF_ERROR(write_all(fd, len, 8, path));
  MILES_RETURN_IF_ERROR(write_all(fd, header.data(), header.size(), path));
  for (const auto& [name, t] : tensors)
    MILES_RETURN_IF_ERROR(write_all(fd, t.raw(), static_cast<size_t>(t.nbytes()), path));
  if (::fsync(fd) != 0) return errno_error("fsync failed", path);
  return Status::Ok();
}

Status sync_directory(const std::string& path) {
  std::string dir = std::filesystem::path(path).parent_path().string();
  return sync_dir(dir.empty() ? "." : dir);
}

}  // namespace

Status write_safetensors(const std::string& path,
                         const std::vector<std::pair<std::string, Tensor>>& tensors,
                         const std::map<std::string, std::string>& metadata) {
  MILES_ASSIGN_OR_RETURN(const std::string header, make_header(tensors, metadata, path));
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return errno_error("cannot create", tmp);
  Status s = write_file(fd, header, tensors, tmp);
  if (::close(fd) != 0 && s.ok()) s = errno_error("close failed", tmp);
  if (s.ok() && ::rename(tmp.c_str(), path.c_str()) != 0)
    s = errno_error("cannot rename " + tmp + " to", path);
  if (!s.ok()) {
    ::unlink(tmp.c_str());
    return s;
  }
  return sync_directory(path);
}

}  // namespace miles

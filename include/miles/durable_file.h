// Durable file IO: whole-file writes that are fsynced, directory fsyncs, whole-file reads — the
// pieces of every atomic publish (write into a temporary, fsync, rename, fsync the parent).
//
// Why: checkpoints, safetensors files and weight-sync versions must never become visible half
// written; one implementation of the POSIX details (EINTR, short writes, errno in the message).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "miles/status.h"

namespace miles {

// "PATH: WHAT: strerror(errno)".
Status errno_error(const std::string& what, const std::string& path);
// Writes all n bytes to fd (retrying short writes and EINTR); `path` names the file in errors.
Status write_all(int fd, const void* data, size_t n, const std::string& path);
// Creates (or truncates) `path`, writes the bytes, fsyncs and closes it.
Status write_file_synced(const std::string& path, const void* data, size_t n);
inline Status write_file_synced(const std::string& path, const std::string& text) {
  return write_file_synced(path, text.data(), text.size());
}
// Copies `from` to `to` and fsyncs the copy.
Status copy_file_synced(const std::string& from, const std::string& to);
// fsyncs the directory itself (so that created and renamed entries are durable).
Status sync_dir(const std::string& dir);
// The whole file; errors name it.
Result<std::vector<uint8_t>> read_file_bytes(const std::string& path);

}  // namespace miles

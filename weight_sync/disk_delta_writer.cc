// DiskDeltaWriter: publishes weight versions as full or delta directories, atomically.
//
// Phases of one publish: check the version and the tensors → choose full or delta → encode each
// tensor against the snapshot (full / xor / overwrite / unchanged) and compress it → write the data
// file and the manifest into `weight_vN.tmp-*`, fsync files and directory → rename → fsync the
// parent → LATEST → the snapshot becomes these tensors. Any failure before the rename removes the
// temporary directory and keeps the snapshot.
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <set>

#include "miles/weight_sync/disk_delta.h"
#include "weight_sync/disk_delta_format.h"
#include "weight_sync/for_each_tensor.h"

namespace miles {
namespace dd = disk_delta;
namespace {

Status check_tensors(const WeightSet& tensors) {
  std::set<std::string> names;
  for (const NamedTensor& t : tensors) {
    if (t.name.empty()) return Status::Error("a tensor has an empty name");
    if (!names.insert(t.name).second) return Status::Error("tensor '" + t.name + "' appears twice");
    if (t.dtype.empty()) return Status::Error("tensor '" + t.name + "' has no dtype");
    for (int64_t d : t.shape)
      if (d < 0) return Status::Error("tensor '" + t.name + "' has a negative dimension");
    if (dd::dtype_bytes(t.dtype) == 0) continue;
    const std::optional<uint64_t> need = dd::nbytes_of(t.dtype, t.shape);
    if (!need)
      return Status::Error("tensor '" + t.name + "': its dtype " + t.dtype +
                           " and shape need more than 2^64 bytes");
    if (*need != t.bytes.size())
      return Status::Error("tensor '" + t.name + "' has " + std::to_string(t.bytes.size()) +
                           " bytes, its dtype " + t.dtype + " and shape need " +
                           std::to_string(*need));
  }
  return Status::Ok();
}

// Same names, order, dtypes, shapes and sizes: a delta can describe the change.
bool same_layout(const WeightSet& a, const WeightSet& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (a[i].name != b[i].name || a[i].dtype != b[i].dtype || a[i].shape != b[i].shape ||
        a[i].bytes.size() != b[i].bytes.size())
      return false;
  return true;
}

// Tensor i's manifest entry (without its offset) and its compressed frame (none when unchanged).
struct Encoded {
  dd::ManifestTensor m;
  std::vector<uint8_t> frame;
};

Result<Encoded> encode_tensor(const NamedTensor& t, const NamedTensor* base, DeltaEncoding enc,
                              const std::string& known_xxh3, int zstd_level,
                              DeltaCompression compression) {
  Encoded e{{t.name, t.dtype, t.shape, dd::TensorEncoding::kFull, dd::TensorLayout::kBytes,
             t.bytes.size(), 0, 0, known_xxh3.empty() ? dd::xxh3_128_hex(t.bytes) : known_xxh3},
            {}};
  const uint8_t* base_bytes = nullptr;
  e.m.layout = dd::layout_for(t.dtype);
  if (base == nullptr) {
  } else if (base->bytes == t.bytes) {
    e.m.encoding = dd::TensorEncoding::kUnchanged;
    return e;
  } else if (enc == DeltaEncoding::kOverwrite) {
    e.m.encoding = dd::TensorEncoding::kOverwrite;
  } else {
    // difference needs elements of 2 bytes or more in byte planes; a tensor of bytes gets xor.
    e.m.encoding = enc == DeltaEncoding::kDifference && e.m.layout == dd::TensorLayout::kBytePlanes
                       ? dd::TensorEncoding::kDifference
                       : dd::TensorEncoding::kXor;
    base_bytes = base->bytes.data();
  }
  // Encoded and compressed a block at a time: nothing of the tensor's size beside the frame.
  MILES_ASSIGN_OR_RETURN(e.m.compressed_bytes,
                         dd::zstd_encode_append(t.bytes, base_bytes, e.m.encoding, e.m.layout,
                                                dd::dtype_bytes(t.dtype), zstd_level, e.frame,
                                                compression == DeltaCompression::kFast));
  return e;
}

std::string tmp_dir_name(const std::string& dir, int64_t version) {
  static std::atomic<int64_t> counter{0};
  return (std::filesystem::path(dir) /
          (dd::version_dir_name(version) + ".tmp-" + std::to_string(::getpid()) + "-" +
           std::to_string(counter++)))
      .string();
}

// Writes the version's two files into `tmp` and fsyncs them and the directory.
Status write_version_files(const std::string& tmp, const dd::Manifest& manifest,
                           const std::vector<uint8_t>& data) {
  std::error_code ec;
  if (!std::filesystem::create_directory(tmp, ec))
    return Status::Error("cannot create " + tmp + ": " + (ec ? ec.message() : "exists"));
  MILES_RETURN_IF_ERROR(dd::write_file_synced(tmp + "/" + dd::kDataFile, data));
  const std::string json = dd::manifest_to_json(manifest);
  MILES_RETURN_IF_ERROR(dd::write_file_synced(
      tmp + "/" + dd::kManifestFile, {reinterpret_cast<const uint8_t*>(json.data()), json.size()}));
  return dd::fsync_dir(tmp);
}

Status write_latest(const std::string& dir, int64_t version) {
  const std::string text = std::to_string(version) + "\n";
  const std::string tmp = dir + "/" + dd::kLatestFile + ".tmp-" + std::to_string(::getpid());
  MILES_RETURN_IF_ERROR(
      dd::write_file_synced(tmp, {reinterpret_cast<const uint8_t*>(text.data()), text.size()}));
  const std::string path = dir + "/" + dd::kLatestFile;
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    ::unlink(tmp.c_str());
    return Status::Error("cannot rename " + tmp + " to " + path);
  }
  return dd::fsync_dir(dir);
}

}  // namespace

DiskDeltaWriter::DiskDeltaWriter(std::string dir, DiskDeltaOptions options)
    : dir_(std::move(dir)), options_(std::move(options)) {
  MILES_CHECK(options_.full_every >= 1, "full_every must be at least 1");
}

Result<PublishStats> DiskDeltaWriter::publish(int64_t version, const WeightSet& tensors) {
  const auto t0 = std::chrono::steady_clock::now();
  const std::string ctx = "publishing " + dd::version_dir_name(version) + " in " + dir_;
  // Phase 1: the version and the tensors.
  std::error_code ec;
  std::filesystem::create_directories(dir_, ec);
  if (ec) return Status::Error(ctx + ": cannot create the directory: " + ec.message());
  MILES_ASSIGN_OR_RETURN(std::vector<int64_t> existing, dd::list_versions(dir_));
  if (version < 0) return Status::Error(ctx + ": versions are non-negative");
  if (!existing.empty() && version <= existing.back())
    return Status::Error(ctx + ": version " + std::to_string(version) +
                         (std::binary_search(existing.begin(), existing.end(), version)
                              ? " is already published"
                              : " is older than the latest published") +
                         " (latest is " + std::to_string(existing.back()) +
                         "); versions must increase");
  MILES_RETURN_IF_ERROR(check_tensors(tensors).with_context(ctx));

  // Phase 2: full or delta. A delta needs this writer's snapshot to be the newest version on disk.
  const bool full = !last_version_ || publishes_ % options_.full_every == 0 || existing.empty() ||
                    existing.back() != *last_version_ || !same_layout(snapshot_, tensors);
  dd::Manifest manifest;
  manifest.version = version;
  if (!full) manifest.base_version = *last_version_;

  // Phase 3: encode and compress every tensor on its own (for_each_tensor: the machine's cores),
  // then lay the frames out in tensor order in one data buffer.
  std::vector<Encoded> encoded(tensors.size());
  std::vector<std::string> known(tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i)
    if (options_.known_xxh3) known[i] = options_.known_xxh3(tensors[i].name);
  MILES_RETURN_IF_ERROR(
      weight_sync_detail::for_each_tensor(tensors.size(), [&](size_t i) -> Status {
        MILES_ASSIGN_OR_RETURN(
            encoded[i], encode_tensor(tensors[i], full ? nullptr : &snapshot_[i], options_.encoding,
                                      known[i], options_.zstd_level, options_.compression));
        return Status::Ok();
      }).with_context(ctx));
  std::vector<uint8_t> data;
  PublishStats stats;
  for (size_t i = 0; i < tensors.size(); ++i) {
    dd::ManifestTensor& m = encoded[i].m;
    if (m.encoding != dd::TensorEncoding::kUnchanged) {
      m.offset = data.size();
      data.insert(data.end(), encoded[i].frame.begin(), encoded[i].frame.end());
      std::vector<uint8_t>().swap(encoded[i].frame);
      ++stats.tensors_stored;
    }
    stats.raw_bytes += static_cast<int64_t>(tensors[i].bytes.size());
    manifest.tensors.push_back(std::move(m));
  }
  manifest.data_bytes = data.size();

  // Phase 4: write into a temporary directory, then rename it into place.
  const std::string tmp = tmp_dir_name(dir_, version);
  const std::string final_dir = dir_ + "/" + dd::version_dir_name(version);
  Status s = write_version_files(tmp, manifest, data);
  if (s.ok() && options_.before_rename) options_.before_rename(tmp);
  if (s.ok() && ::rename(tmp.c_str(), final_dir.c_str()) != 0)
    s = Status::Error("cannot rename " + tmp + " to " + final_dir);
  if (!s.ok()) {
    std::filesystem::remove_all(tmp, ec);
    return s.with_context(ctx);
  }
  MILES_RETURN_IF_ERROR(dd::fsync_dir(dir_).with_context(ctx));
  if (options_.write_latest) MILES_RETURN_IF_ERROR(write_latest(dir_, version).with_context(ctx));

  // Phase 5: the snapshot is now this version.
  snapshot_ = tensors;
  last_version_ = version;
  publishes_ = full ? 1 : publishes_ + 1;
  stats.version = version;
  stats.base_version = manifest.base_version;
  stats.tensors = static_cast<int64_t>(tensors.size());
  stats.bytes_written = static_cast<int64_t>(data.size() + dd::manifest_to_json(manifest).size());
  stats.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return stats;
}

Result<int64_t> prune_versions(const std::string& dir, int64_t oldest_kept) {
  const std::string ctx =
      "pruning weight versions below " + std::to_string(oldest_kept) + " in " + dir;
  std::error_code missing;
  if (!std::filesystem::exists(dir, missing)) return int64_t{0};  // nothing published yet
  DiskDeltaReader reader(dir);
  auto base = reader.full_version_at_or_below(oldest_kept);
  if (!base.ok()) return base.status().with_context(ctx);
  if (!*base) return int64_t{0};
  MILES_ASSIGN_OR_RETURN(std::vector<int64_t> versions, reader.versions());
  int64_t removed = 0;
  for (const int64_t v : versions) {
    if (v >= **base) break;
    const std::string path = dir + "/" + dd::version_dir_name(v);
    const std::string gone = tmp_dir_name(dir, v);
    if (::rename(path.c_str(), gone.c_str()) != 0)
      return Status::Error("cannot rename " + path + " to " + gone).with_context(ctx);
    std::error_code ec;
    std::filesystem::remove_all(gone, ec);
    if (ec) return Status::Error("cannot remove " + gone + ": " + ec.message()).with_context(ctx);
    ++removed;
  }
  return removed;
}

}  // namespace miles

// DiskDeltaReader: resolves the chain of versions that leads to a target and applies it, verifying
// every tensor's checksum after every step.
//
// Phases: resolve the chain (walk base_version links back from the target until the caller's
// version or a full version; a missing link is an error) → apply each version in order to the
// working set (read and size-check the data file, check names / dtypes / shapes against the base,
// decode each frame, xor or overwrite) → verify every tensor's xxh3-128 → swap the tensors that
// changed into the caller's set. Nothing the caller holds changes unless every step succeeded.
// The working set copies a tensor of the caller's only when a version changes it, just before it
// is decoded into (so in cache, on the thread that decodes it); the others are read in place.
#include <algorithm>
#include <filesystem>
#include <limits>

#include "miles/huge_pages.h"
#include "miles/weight_sync/disk_delta.h"
#include "weight_sync/disk_delta_format.h"
#include "weight_sync/for_each_tensor.h"
#include "weight_sync/xxh3.h"

namespace miles {
namespace dd = disk_delta;
namespace {

std::string version_path(const std::string& dir, int64_t v) {
  return dir + "/" + dd::version_dir_name(v);
}

Result<dd::Manifest> read_manifest(const std::string& dir, int64_t version,
                                   const std::string& role) {
  const std::string vdir = version_path(dir, version);
  std::error_code ec;
  if (!std::filesystem::is_directory(vdir, ec))
    return Status::Error("version " + std::to_string(version) + role + " is missing: no " + vdir);
  const std::string path = vdir + "/" + dd::kManifestFile;
  MILES_ASSIGN_OR_RETURN(std::vector<uint8_t> bytes, dd::read_file(path));
  MILES_ASSIGN_OR_RETURN(dd::Manifest m,
                         dd::manifest_from_json(std::string(bytes.begin(), bytes.end()), path));
  if (m.version != version)
    return Status::Error(path + ": names version " + std::to_string(m.version) + ", expected " +
                         std::to_string(version));
  return m;
}

// The manifests from the start of the chain to `target`, oldest first. The chain starts at a full
// version, or at the version right after `from` when its base is `from`.
Result<std::vector<dd::Manifest>> resolve_chain(const std::string& dir, int64_t target,
                                                std::optional<int64_t> from) {
  std::vector<dd::Manifest> chain;
  MILES_ASSIGN_OR_RETURN(dd::Manifest m, read_manifest(dir, target, ""));
  for (;;) {
    const int64_t v = m.version;
    const std::optional<int64_t> base = m.base_version;
    chain.push_back(std::move(m));
    if (!base || (from && *base == *from)) break;
    if (from && *base < *from)
      return Status::Error("version " + std::to_string(v) + " is based on version " +
                           std::to_string(*base) + ", older than the current version " +
                           std::to_string(*from) + ": no chain from " + std::to_string(*from) +
                           " to " + std::to_string(target));
    MILES_ASSIGN_OR_RETURN(
        m, read_manifest(dir, *base, " (base of version " + std::to_string(v) + ")"));
  }
  std::reverse(chain.begin(), chain.end());
  return chain;
}

// The data file of a version, opened and checked against the manifest's size; a short file names
// the first tensor whose frame it cuts. Frames are read from it one tensor at a time.
Result<dd::DataFile> open_data(const std::string& vdir, const dd::Manifest& m) {
  const std::string path = vdir + "/" + dd::kDataFile;
  MILES_ASSIGN_OR_RETURN(dd::DataFile data, dd::DataFile::open(path));
  if (data.size() == m.data_bytes) return data;
  std::string first;
  for (const auto& t : m.tensors)
    if (t.compressed_bytes > 0 && t.offset + t.compressed_bytes > data.size()) {
      first = ", cutting tensor '" + t.name + "'";
      break;
    }
  return Status::Error(path + " has " + std::to_string(data.size()) +
                       " bytes, the manifest expects " + std::to_string(m.data_bytes) +
                       (data.size() < m.data_bytes ? " (truncated" + first + ")" : ""));
}

// The weights a chain is applied to: tensor i is the caller's (`base`, only ever read) until a
// version changes it, from then on a copy of its own (own[i], owned[i] = 1). Without a base (a
// full version) every tensor is its own.
struct Working {
  const WeightSet* base = nullptr;
  WeightSet own;                  // every tensor's name, dtype and shape; bytes where owned
  std::vector<uint8_t> owned;     // per tensor (not vector<bool>: threads write neighbours)
  std::vector<std::string> sums;  // per tensor: the xxh3-128 its bytes were verified to have
  const NamedTensor& at(size_t i) const { return owned[i] ? own[i] : (*base)[i]; }

  static Working over(const WeightSet& base) {
    Working w{&base, {}, std::vector<uint8_t>(base.size(), 0), {}};
    for (const NamedTensor& t : base) w.own.push_back(NamedTensor{t.name, t.dtype, t.shape, {}});
    return w;
  }
  // The tensors as they now are into `set`: the owned ones swapped in (set is the base or, after
  // a full version, replaced).
  void commit(WeightSet& set, std::vector<std::string>* checksums) {
    if (checksums) *checksums = std::move(sums);
    if (base == nullptr) {
      set = std::move(own);
      return;
    }
    for (size_t i = 0; i < own.size(); ++i)
      if (owned[i]) set[i].bytes.swap(own[i].bytes);
  }
};

Status check_layout(const Working& w, const dd::Manifest& m, const std::string& where) {
  if (w.own.size() != m.tensors.size())
    return Status::Error(where + ": " + std::to_string(m.tensors.size()) +
                         " tensors, the base has " + std::to_string(w.own.size()));
  for (size_t i = 0; i < w.own.size(); ++i) {
    const dd::ManifestTensor& t = m.tensors[i];
    const NamedTensor& b = w.at(i);
    if (b.name != t.name || b.dtype != t.dtype || b.shape != t.shape || b.bytes.size() != t.nbytes)
      return Status::Error(where + ": tensor " + std::to_string(i) + " '" + t.name +
                           "' does not match the base's '" + b.name + "' (name, dtype or shape)");
  }
  return Status::Ok();
}

// `v` of `n` bytes (a copy of `from`'s, or zeros), its fresh storage advised to be huge pages
// first: a version's tensors are hundreds of MB written once, and with 2 MiB pages they fault 512
// times less often (an advance 10-15 % faster in a harness; within noise in bench sync,
// docs/benchmarks.md).
void sized_on_huge_pages(std::vector<uint8_t>& v, size_t n, const uint8_t* from) {
  if (v.capacity() < n) {
    std::vector<uint8_t>().swap(v);
    v.reserve(n);
    huge_pages::advise(v.data(), v.capacity());
  }
  if (from)
    v.assign(from, from + n);
  else
    v.resize(n);
}

// One tensor's frame read from `data` and decoded into `out` (a full or overwrite frame replaces
// it, a difference or xor frame is applied to it, in place), hashing each decoded piece while it is
// in cache; returns the hash of the final bytes.
Result<std::string> apply_tensor(const dd::DataFile& data, const dd::ManifestTensor& t,
                                 const std::string& where, std::vector<uint8_t>& out) {
  const std::string at = where + ", " + dd::kDataFile + ", tensor '" + t.name + "'";
  weight_sync_detail::Xxh3Stream hash;
  // The manifest holds every frame inside the data file, whose size open_data checked, and nbytes
  // to what the frame can decode to (the decoder checks the frame's header against it first).
  if (!dd::applies_to_base(t.encoding)) sized_on_huge_pages(out, t.nbytes, nullptr);
  MILES_RETURN_IF_ERROR(dd::zstd_decode_pieces(data.chunks(t.offset, t.compressed_bytes), out,
                                               t.encoding, t.layout, dd::dtype_bytes(t.dtype),
                                               [&](std::span<const uint8_t> piece) {
                                                 hash.update(piece.data(), piece.size());
                                               })
                            .with_context(at));
  return hash.hex();
}

// Applies one version to `w` (replacing it for a full version), verifying every checksum.
Status apply_version(const std::string& dir, const dd::Manifest& m, Working& w) {
  const std::string vdir = version_path(dir, m.version);
  const std::string where = "version " + std::to_string(m.version) + " (" + vdir + ")";
  MILES_ASSIGN_OR_RETURN(const dd::DataFile data, open_data(vdir, m));
  if (m.is_full()) {
    w = Working{nullptr, {}, std::vector<uint8_t>(m.tensors.size(), 1), {}};
    for (const auto& t : m.tensors) w.own.push_back(NamedTensor{t.name, t.dtype, t.shape, {}});
  } else {
    MILES_RETURN_IF_ERROR(check_layout(w, m, where));
  }
  w.sums.assign(m.tensors.size(), {});
  // Every tensor on its own (for_each_tensor): read its frame, decode, apply, verify. A tensor of
  // the base that this version changes is copied first (overwritten: only sized).
  return weight_sync_detail::for_each_tensor(m.tensors.size(), [&](size_t i) -> Status {
    const dd::ManifestTensor& t = m.tensors[i];
    std::string got;
    if (t.encoding == dd::TensorEncoding::kUnchanged) {
      got = weight_sync_detail::xxh3_hex(w.at(i).bytes.data(), w.at(i).bytes.size());
    } else {
      if (!w.owned[i] && dd::applies_to_base(t.encoding)) {
        const std::vector<uint8_t>& from = w.at(i).bytes;
        sized_on_huge_pages(w.own[i].bytes, from.size(), from.data());
      }
      w.owned[i] = 1;
      MILES_ASSIGN_OR_RETURN(got, apply_tensor(data, t, where, w.own[i].bytes));
    }
    if (got != t.xxh3_128)
      return Status::Error(where + ": checksum mismatch for tensor '" + t.name + "' (" +
                           std::string(dd::encoding_name(t.encoding)) + "): manifest says " +
                           t.xxh3_128 + ", the applied bytes hash to " + got);
    w.sums[i] = std::move(got);
    return Status::Ok();
  });
}

}  // namespace

Result<std::vector<int64_t>> DiskDeltaReader::versions() const { return dd::list_versions(dir_); }

Result<int64_t> DiskDeltaReader::latest_version() const {
  MILES_ASSIGN_OR_RETURN(std::vector<int64_t> vs, versions());
  if (vs.empty()) return Status::Error("no published weight version in " + dir_);
  return vs.back();
}

Result<int64_t> DiskDeltaReader::latest_full_version() const {
  MILES_ASSIGN_OR_RETURN(const std::optional<int64_t> full,
                         full_version_at_or_below(std::numeric_limits<int64_t>::max()));
  if (!full) return Status::Error("no full weight version in " + dir_);
  return *full;
}

Result<std::optional<int64_t>> DiskDeltaReader::full_version_at_or_below(int64_t version) const {
  MILES_ASSIGN_OR_RETURN(std::vector<int64_t> vs, versions());
  for (auto it = vs.rbegin(); it != vs.rend(); ++it) {
    if (*it > version) continue;
    MILES_ASSIGN_OR_RETURN(dd::Manifest m, read_manifest(dir_, *it, ""));
    if (m.is_full()) return std::optional<int64_t>(*it);
  }
  return std::optional<int64_t>();
}

Result<WeightSet> DiskDeltaReader::load(int64_t target, std::vector<std::string>* checksums) const {
  MILES_ASSIGN_OR_RETURN(std::vector<dd::Manifest> chain,
                         resolve_chain(dir_, target, std::nullopt));
  Working w;  // the chain starts at a full version: no base
  for (const dd::Manifest& m : chain)
    MILES_RETURN_IF_ERROR(
        apply_version(dir_, m, w).with_context("loading version " + std::to_string(target)));
  WeightSet set;
  w.commit(set, checksums);
  return set;
}

Status DiskDeltaReader::advance(WeightSet& current, int64_t current_version, int64_t target,
                                std::vector<std::string>* checksums) const {
  const std::string ctx = "advancing from version " + std::to_string(current_version) + " to " +
                          std::to_string(target) + " in " + dir_;
  if (target == current_version) {
    if (checksums) {
      checksums->clear();
      for (const NamedTensor& t : current)
        checksums->push_back(weight_sync_detail::xxh3_hex(t.bytes.data(), t.bytes.size()));
    }
    return Status::Ok();
  }
  if (target < current_version) return Status::Error(ctx + ": the target is older");
  auto chain = resolve_chain(dir_, target, current_version);
  if (!chain.ok()) return chain.status().with_context(ctx);
  // The current weights are read, never written, until every version has applied and verified.
  Working w = Working::over(current);
  for (const dd::Manifest& m : *chain)
    MILES_RETURN_IF_ERROR(apply_version(dir_, m, w).with_context(ctx));
  w.commit(current, checksums);
  return Status::Ok();
}

}  // namespace miles

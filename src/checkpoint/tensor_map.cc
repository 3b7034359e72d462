// TensorMap: named tensors with the file each came from, and the checked lookup the model uses.
//
// Why: a model loader asks for "this name, this shape"; when the checkpoint disagrees the user must
// learn which tensor, which file and which shapes, not see an out-of-bounds read later.
#include <filesystem>
#include <set>

#include "miles/checkpoint.h"

namespace miles {

// Inserting an existing name replaces it; readers that must reject duplicates check contains()
// first.
void TensorMap::insert(std::string name, Tensor tensor, std::string source_file) {
  tensors_.insert_or_assign(std::move(name), Entry{std::move(tensor), std::move(source_file)});
}

const Tensor* TensorMap::find(const std::string& name) const {
  auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : &it->second.tensor;
}

const std::string& TensorMap::source(const std::string& name) const {
  static const std::string kNone;
  auto it = tensors_.find(name);
  return it == tensors_.end() ? kNone : it->second.source;
}

std::vector<std::string> TensorMap::names() const {
  std::vector<std::string> out;
  out.reserve(tensors_.size());
  for (const auto& [name, entry] : tensors_) out.push_back(name);
  return out;
}

namespace {
// Where the tensors came from: the one file, the one directory holding all files, or a list.
std::string describe_sources(const std::set<std::string>& files) {
  std::set<std::string> dirs;
  for (const auto& file : files) dirs.insert(std::filesystem::path(file).parent_path().string());
  if (files.empty()) return "an empty tensor map";
  if (files.size() == 1) return *files.begin();
  if (dirs.size() == 1) return *dirs.begin();
  std::string s;
  for (const auto& f : files) s += (s.empty() ? "" : ", ") + f;
  return s;
}
}  // namespace

Result<Tensor> TensorMap::get(const std::string& name, const std::vector<int64_t>& shape) const {
  auto it = tensors_.find(name);
  if (it == tensors_.end()) {
    std::set<std::string> files;
    for (const auto& [n, e] : tensors_) files.insert(e.source);
    return Status::Error("tensor '" + name + "' missing from " + describe_sources(files));
  }
  const Tensor& t = it->second.tensor;
  if (t.shape() != shape) {
    const std::string expected = Tensor::view(t.dtype(), shape, nullptr, nullptr).shape_string();
    return Status::Error("tensor '" + name + "' in " + it->second.source + " has shape " +
                         t.shape_string() + ", expected " + expected);
  }
  return t;
}

}  // namespace miles

// Draft head versions on disk (include/miles/weight_sync/draft_files.h).
#include "miles/weight_sync/draft_files.h"

#include <algorithm>
#include <filesystem>
#include <vector>

namespace miles {

namespace fs = std::filesystem;

std::string draft_head_path(const std::string& dir, int64_t version) {
  return dir + "/draft/" + std::to_string(version) + ".safetensors";
}

Status write_draft_head(const std::string& dir, int64_t version, const DraftHead& head, int keep) {
  std::error_code ec;
  fs::create_directories(dir + "/draft", ec);
  if (ec) return Status::Error("cannot create " + dir + "/draft: " + ec.message());
  const TensorMap m = head.as_tensor_map();
  std::vector<std::pair<std::string, Tensor>> tensors;
  for (const std::string& n : m.names()) tensors.emplace_back(n, *m.find(n));
  MILES_RETURN_IF_ERROR(write_safetensors(draft_head_path(dir, version), tensors,
                                          {{"version", std::to_string(version)}}));
  // The newest `keep` versions stay.
  std::vector<int64_t> versions;
  for (const auto& e : fs::directory_iterator(dir + "/draft", ec)) {
    const std::string name = e.path().filename().string();
    const size_t dot = name.find(".safetensors");
    if (dot == std::string::npos || dot == 0 || dot + 12 != name.size()) continue;
    if (!std::all_of(name.begin(), name.begin() + dot, ::isdigit)) continue;
    versions.push_back(std::stoll(name.substr(0, dot)));
  }
  std::sort(versions.begin(), versions.end());
  for (size_t i = 0; i + keep < versions.size(); ++i)
    fs::remove(draft_head_path(dir, versions[i]), ec);
  return Status::Ok();
}

Result<std::shared_ptr<const DraftHead>> read_draft_head(const std::string& dir, int64_t version,
                                                         const ModelConfig& policy,
                                                         const TensorMap& policy_weights) {
  const std::string path = draft_head_path(dir, version);
  std::error_code ec;
  if (!fs::exists(path, ec)) return std::shared_ptr<const DraftHead>();
  MILES_ASSIGN_OR_RETURN(TensorMap m, read_safetensors(path));
  const Tensor* v = m.find("draft.vocab");
  if (v == nullptr || v->dtype() != DType::kI32 || v->ndim() != 1)
    return Status::Error(path + ": no int32 vector draft.vocab");
  std::vector<int32_t> vocab(v->data<int32_t>(), v->data<int32_t>() + v->numel());
  MILES_ASSIGN_OR_RETURN(std::unique_ptr<DraftHead> head,
                         DraftHead::from_weights(policy, policy_weights, m, std::move(vocab)));
  return std::shared_ptr<const DraftHead>(std::move(head));
}

}  // namespace miles

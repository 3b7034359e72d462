// read_hf_weights: the tensors of an HF model directory, single-file or sharded with an index.
//
// Why: HF shards large checkpoints as model-0000k-of-0000n.safetensors plus
// model.safetensors.index.json ({"weight_map": {tensor: shard}}). The index and the shards must
// agree: every listed tensor is in its shard, no tensor is in two shards, every shard exists. Each
// shard is mapped once; tensors stay views into the mappings.
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "miles/checkpoint.h"
#include "miles/json_text.h"
#include "nlohmann/json.hpp"

namespace miles {
namespace {

using json = nlohmann::json;
namespace fs = std::filesystem;

// weight_map of the index, grouped by shard file name.
Result<std::map<std::string, std::set<std::string>>> read_index(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status::Error(path + ": cannot open");
  std::ostringstream text;
  text << in.rdbuf();
  auto parsed = parse_json_text(text.str());
  if (!parsed.ok()) return Status::Error(path + ": not valid JSON: " + parsed.message());
  json& j = *parsed;
  if (!j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object())
    return Status::Error(path + ": needs a 'weight_map' object");
  std::map<std::string, std::set<std::string>> shards;
  for (const auto& [name, shard] : j["weight_map"].items()) {
    if (!shard.is_string())
      return Status::Error(path + ": weight_map entry of tensor '" + name + "' is not a string");
    const std::string file = shard.get<std::string>();
    // A shard is a plain file name beside the index: no directories, no way out of `dir`.
    if (file.empty() || file.find('/') != std::string::npos || file == "." || file == "..")
      return Status::Error(path + ": tensor '" + name + "' maps to invalid shard name '" + file +
                           "'");
    shards[file].insert(name);
  }
  return shards;
}

Result<TensorMap> read_sharded(const std::string& dir, const std::string& index_path) {
  MILES_ASSIGN_OR_RETURN(auto shards, read_index(index_path));
  TensorMap out;
  for (const auto& [file, listed] : shards) {
    const std::string path = (fs::path(dir) / file).string();
    std::error_code ec;
    if (!fs::is_regular_file(path, ec))
      return Status::Error(index_path + ": shard " + path + " (holding tensor '" + *listed.begin() +
                           "') does not exist");
    MILES_ASSIGN_OR_RETURN(TensorMap shard, read_safetensors(path));
    for (const std::string& name : listed)
      if (!shard.contains(name))
        return Status::Error("tensor '" + name + "' listed in " + index_path + " is missing from " +
                             path);
    for (const std::string& name : shard.names()) {
      if (out.contains(name))
        return Status::Error("tensor '" + name + "' is defined in both " + out.source(name) +
                             " and " + path);
      out.insert(name, *shard.find(name), path);
    }
  }
  return out;
}

}  // namespace

Result<TensorMap> read_hf_weights(const std::string& dir) {
  const std::string single = (fs::path(dir) / "model.safetensors").string();
  const std::string index = (fs::path(dir) / "model.safetensors.index.json").string();
  std::error_code ec;
  if (fs::exists(single, ec)) return read_safetensors(single);  // transformers' preference too
  if (fs::exists(index, ec)) return read_sharded(dir, index);
  return Status::Error(dir + ": neither model.safetensors nor model.safetensors.index.json found");
}

}  // namespace miles

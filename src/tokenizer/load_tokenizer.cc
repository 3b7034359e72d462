// load_tokenizer: recognises a tokenizer's format from its path and hands it to that format's
// reader.
//
// Why: callers (CLI, rollout engine) hold a path from a config, not a format. Recognition happens
// once, here: a directory means the tokenizer.json inside it (else a tokenizer.gguf), a .json file
// is a Hugging Face tokenizer, the GGUF magic means GGUF metadata, anything else is a llama2.c
// tokenizer file.
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>

#include "miles/tokenizer.h"

namespace miles {
namespace {

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

bool starts_with_gguf_magic(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  char magic[4] = {};
  return f.read(magic, 4) && std::memcmp(magic, "GGUF", 4) == 0;
}

}  // namespace

Result<std::unique_ptr<Tokenizer>> load_tokenizer(const std::string& path,
                                                  int32_t vocab_size_hint) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::exists(path, ec)) return Status::Error(path + ": no such tokenizer file or directory");
  if (fs::is_directory(path, ec)) {
    const fs::path json = fs::path(path) / "tokenizer.json";
    if (fs::exists(json, ec)) return load_hf_tokenizer(json.string());
    // miles convert's vocabulary-only GGUF, for vocabularies tokenizer.json cannot express yet
    const fs::path vocab = fs::path(path) / "tokenizer.gguf";
    if (fs::exists(vocab, ec)) return load_gguf_tokenizer(vocab.string());
    return Status::Error(path +
                         ": is a directory without tokenizer.json (or tokenizer.gguf); pass a "
                         "tokenizer.json, a GGUF file or a llama2.c tokenizer .bin file");
  }
  if (ends_with(path, ".json")) return load_hf_tokenizer(path);
  if (starts_with_gguf_magic(path)) return load_gguf_tokenizer(path);
  return load_llama2c_tokenizer(path, vocab_size_hint < 0 ? 0 : vocab_size_hint);
}

}  // namespace miles

namespace miles {

std::string decode_text(const Tokenizer& tok, std::span<const int32_t> ids, bool skip_special) {
  if (!skip_special) return tok.decode(ids);
  std::vector<int32_t> kept;
  kept.reserve(ids.size());
  for (int32_t id : ids)
    if (!tok.is_special(id)) kept.push_back(id);
  return tok.decode(kept);
}

}  // namespace miles

// load_tokenizer: recognises a tokenizer's format from its path and hands it to that format's
// reader.
//
// Why: callers (CLI, rollout engine) hold a path from a config, not a format. Recognition happens
// once, here, so that adding the Hugging Face tokenizer.json and GGUF readers later changes no
// caller. Formats recognised but not read yet are refused with an error that says so, instead of a
// parse error from the llama2.c reader.
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
    if (fs::exists(fs::path(path) / "tokenizer.json", ec))
      return Status::Error(
          path +
          ": Hugging Face tokenizer directories (tokenizer.json) are not supported "
          "yet; pass a llama2.c tokenizer .bin file");
    return Status::Error(
        path +
        ": is a directory without a supported tokenizer; pass a llama2.c tokenizer "
        ".bin file (tokenizer.json directories are not supported yet)");
  }
  if (ends_with(path, ".json"))
    return Status::Error(
        path +
        ": Hugging Face tokenizer.json files are not supported yet; pass a llama2.c "
        "tokenizer .bin file");
  if (starts_with_gguf_magic(path))
    return Status::Error(path +
                         ": GGUF tokenizers are not supported yet; pass a llama2.c tokenizer "
                         ".bin file");
  return load_llama2c_tokenizer(path, vocab_size_hint < 0 ? 0 : vocab_size_hint);
}

}  // namespace miles

// Tokenizer discovery next to a model, and the CLI's error exit.
#include "cli/model_files.h"

#include <spdlog/spdlog.h>

#include <cstdio>
#include <filesystem>

namespace miles::cli {

Result<std::unique_ptr<Tokenizer>> find_tokenizer(const std::string& model_path,
                                                  const std::string& tokenizer_path,
                                                  int32_t vocab_size) {
  namespace fs = std::filesystem;
  if (!tokenizer_path.empty()) return load_tokenizer(tokenizer_path, vocab_size);
  std::error_code ec;
  if (fs::is_directory(model_path, ec)) return load_tokenizer(model_path, vocab_size);
  const fs::path dir = fs::path(model_path).parent_path();
  for (const std::string& name : {"tok" + std::to_string(vocab_size) + ".bin", std::string("tokenizer.bin")}) {
    if (fs::exists(dir / name, ec)) return load_tokenizer((dir / name).string(), vocab_size);
  }
  return Status::Error("no tokenizer found beside " + model_path + " (looked for tok" +
                       std::to_string(vocab_size) + ".bin and tokenizer.bin); pass --tokenizer PATH");
}

int fail(const char* command, const std::string& message) {
  spdlog::error("miles {}: {}", command, message);
  return 1;
}

}  // namespace miles::cli

// convert_gguf: a GGUF file -> an HF directory, written atomically.
//
// Why: `miles convert` must never leave a half-written model directory that a later `miles
// generate` would load. Every file is written into a temporary sibling directory (same file
// system), fsynced, and the directory is renamed into place last; on any error the temporary
// directory is removed. An existing out_dir is replaced only when asked
// (ConvertOptions::overwrite), also by renames.
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "miles/checkpoint.h"
#include "miles/convert.h"
#include "miles/gguf.h"
#include "miles/tokenizer.h"
#include "model/gguf_convert_arch.h"

namespace miles {
namespace {

namespace fs = std::filesystem;

Status write_text(const fs::path& path, const std::string& text) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return Status::Error(path.string() + ": cannot create: " + std::strerror(errno));
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const std::string why = std::strerror(errno);
      ::close(fd);
      return Status::Error(path.string() + ": write failed: " + why);
    }
    done += static_cast<size_t>(n);
  }
  const bool synced = ::fsync(fd) == 0;
  const std::string why = std::strerror(errno);
  if (::close(fd) != 0 || !synced) return Status::Error(path.string() + ": fsync failed: " + why);
  return Status::Ok();
}

// tokenizer.json + tokenizer_config.json, or where the tokenizer.json writer cannot express the
// vocabulary but miles' GGUF tokenizer reads it (SentencePiece: Gemma 3, Phi-3, Llama 2), the
// file's tokenizer.* metadata as a vocabulary-only tokenizer.gguf. Neither: the writer's error.
Result<std::string> write_tokenizer(const GgufFile& f, const fs::path& dir) {
  Result<HfTokenizerFiles> tok = gguf_tokenizer_files(f);
  if (tok.ok()) {
    MILES_RETURN_IF_ERROR(write_text(dir / "tokenizer.json", tok->tokenizer_json));
    MILES_RETURN_IF_ERROR(write_text(dir / "tokenizer_config.json", tok->tokenizer_config_json));
    return std::string("tokenizer.json");
  }
  if (!gguf_tokenizer(f).ok()) return tok.status();
  std::map<std::string, GgufValue> vocab;
  for (const auto& [key, value] : f.metadata())
    if (key.starts_with("tokenizer.")) vocab.emplace(key, value);
  MILES_RETURN_IF_ERROR(write_text(dir / "tokenizer.gguf", gguf_metadata_image(vocab)));
  return std::string("tokenizer.gguf");
}

// All files of the HF directory into `dir` (which exists and is empty).
Result<ConvertSummary> write_files(const GgufFile& f, const fs::path& dir) {
  MILES_ASSIGN_OR_RETURN(const gguf::GgufArch arch, gguf::read_gguf_arch(f));
  MILES_ASSIGN_OR_RETURN(const std::string config, gguf_config_json(f));
  MILES_ASSIGN_OR_RETURN(const std::string generation, gguf_generation_config_json(f));
  ConvertSummary s;
  MILES_ASSIGN_OR_RETURN(s.tokenizer_file, write_tokenizer(f, dir));
  MILES_ASSIGN_OR_RETURN(const auto tensors, gguf_hf_tensors(f));
  MILES_RETURN_IF_ERROR(write_text(dir / "config.json", config));
  MILES_RETURN_IF_ERROR(write_text(dir / "generation_config.json", generation));
  const std::string source = fs::path(f.path()).filename().string();
  MILES_RETURN_IF_ERROR(write_safetensors((dir / "model.safetensors").string(), tensors,
                                          {{"format", "pt"}, {"converted_from", source}}));
  s.architecture = arch.hf_class;
  s.tensors = static_cast<int64_t>(tensors.size());
  for (const auto& [name, t] : tensors) s.parameters += t.numel();
  return s;
}

// Syncs a directory's entries (the renames) to disk; best effort.
void sync_dir(const fs::path& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return;
  (void)::fsync(fd);
  ::close(fd);
}

}  // namespace

Result<ConvertSummary> convert_gguf(const std::string& gguf_path, const std::string& out_dir,
                                    const ConvertOptions& options) {
  std::error_code ec;
  fs::path out = fs::absolute(fs::path(out_dir), ec).lexically_normal();
  if (!ec && out.filename().empty()) out = out.parent_path();  // "dir/" names dir
  if (ec || out.filename().empty() || out == out.root_path())
    return Status::Error("output directory '" + out_dir + "' is not a usable path");
  if (fs::exists(out, ec) && !options.overwrite)
    return Status::Error(out.string() + " already exists (pass --force to replace it)");
  MILES_ASSIGN_OR_RETURN(const GgufFile f, GgufFile::open(gguf_path));

  const fs::path parent = out.parent_path();
  fs::create_directories(parent, ec);
  if (ec) return Status::Error(parent.string() + ": cannot create: " + ec.message());
  const std::string tag = std::to_string(::getpid());
  const fs::path tmp = parent / ("." + out.filename().string() + ".tmp-" + tag);
  fs::remove_all(tmp, ec);
  if (!fs::create_directory(tmp, ec) || ec)
    return Status::Error(tmp.string() + ": cannot create: " + ec.message());

  auto summary = write_files(f, tmp);
  if (!summary.ok()) {
    fs::remove_all(tmp, ec);
    return summary.status();
  }
  const fs::path old = parent / ("." + out.filename().string() + ".old-" + tag);
  const bool replacing = fs::exists(out, ec);
  if (replacing) {
    fs::rename(out, old, ec);
    if (ec) {
      fs::remove_all(tmp, ec);
      return Status::Error(out.string() +
                           ": cannot move the existing directory aside: " + ec.message());
    }
  }
  fs::rename(tmp, out, ec);
  if (ec) {
    const std::string why = ec.message();
    if (replacing) fs::rename(old, out, ec);
    fs::remove_all(tmp, ec);
    return Status::Error(out.string() +
                         ": cannot rename the converted directory into place: " + why);
  }
  if (replacing) fs::remove_all(old, ec);
  sync_dir(parent);
  return summary;
}

}  // namespace miles

// `miles tokenize`: text to ids and ids to exact bytes with any supported tokenizer, and a
// throughput measurement (--bench) that scripts/bench_tokenizer_hf.py compares with HF.
//
// Why in the CLI: the ids a model sees are the contract between rollout and trainer; being able to
// print them for a string, from a shell, with the same code the engine runs, is the quickest way
// to check a tokenizer against a reference.
#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "cli/commands.h"
#include "cli/model_files.h"
#include "miles/tokenizer.h"

namespace miles::cli {
namespace {

struct TokenizeOptions {
  std::string tokenizer, text, ids, file;
  bool has_text = false, has_ids = false, has_file = false;
  bool add_special = false, no_parse_special = false, bench = false;
  int32_t vocab_size = 0;
  int repeat = 1;
};

Result<std::vector<int32_t>> parse_ids(const std::string& text, int32_t vocab) {
  std::vector<int32_t> ids;
  std::istringstream in(text);
  std::string word;
  while (in >> word) {
    size_t used = 0;
    long long v = -1;
    try {
      v = std::stoll(word, &used);
    } catch (...) {
      used = 0;
    }
    if (used != word.size()) return Status::Error("--ids: '" + word + "' is not a token id");
    if (v < 0 || v >= vocab)
      return Status::Error("--ids: " + word + " is outside the vocabulary [0, " +
                           std::to_string(vocab) + ")");
    ids.push_back(static_cast<int32_t>(v));
  }
  return ids;
}

Result<std::string> read_input(const TokenizeOptions& o) {
  if (!o.has_file) return o.text;
  std::ifstream f(o.file, std::ios::binary);
  if (!f) return Status::Error(o.file + ": cannot open");
  std::ostringstream s;
  s << f.rdbuf();
  return s.str();
}

// Encodes `text` line by line (each line with its '\n') `repeat` times; prints one JSON line.
void bench(const Tokenizer& t, const std::string& text, const EncodeOptions& eo, int repeat) {
  std::vector<std::string_view> lines;
  for (size_t i = 0; i < text.size();) {
    size_t nl = text.find('\n', i);
    nl = nl == std::string::npos ? text.size() : nl + 1;
    lines.emplace_back(text.data() + i, nl - i);
    i = nl;
  }
  double best = 1e30;
  size_t tokens = 0;
  for (int r = 0; r < repeat; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    size_t n = 0;
    for (const std::string_view line : lines) n += t.encode_with(line, eo).size();
    const std::chrono::duration<double> dt = std::chrono::steady_clock::now() - t0;
    best = std::min(best, dt.count());
    tokens = n;
  }
  std::printf(
      "{\"bytes\": %zu, \"lines\": %zu, \"tokens\": %zu, \"seconds\": %.6f, "
      "\"mb_per_s\": %.3f}\n",
      text.size(), lines.size(), tokens, best, text.size() / 1e6 / best);
}

int run_tokenize(const TokenizeOptions& o) {
  const int inputs = o.has_text + o.has_ids + o.has_file;
  if (inputs != 1) return fail("tokenize", "give exactly one of --text, --ids, --file");
  auto tok = load_tokenizer(o.tokenizer, o.vocab_size);
  if (!tok.ok()) return fail("tokenize", tok.message());
  const Tokenizer& t = **tok;
  if (o.has_ids) {
    auto ids = parse_ids(o.ids, t.vocab_size());
    if (!ids.ok()) return fail("tokenize", ids.message());
    const std::string bytes = t.decode(*ids);
    std::fwrite(bytes.data(), 1, bytes.size(), stdout);
    return 0;
  }
  auto text = read_input(o);
  if (!text.ok()) return fail("tokenize", text.message());
  const EncodeOptions eo{o.add_special, !o.no_parse_special};
  if (o.bench) {
    bench(t, *text, eo, std::max(1, o.repeat));
    return 0;
  }
  const std::vector<int32_t> ids = t.encode_with(*text, eo);
  std::string out;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i) out.push_back(' ');
    out += std::to_string(ids[i]);
  }
  out.push_back('\n');
  std::fwrite(out.data(), 1, out.size(), stdout);
  return 0;
}

}  // namespace

void register_tokenize(CLI::App& app) {
  auto o = std::make_shared<TokenizeOptions>();
  CLI::App* sub = app.add_subcommand(
      "tokenize", "Print the token ids of a text, or the exact bytes of token ids");
  sub->add_option("--tokenizer", o->tokenizer,
                  "tokenizer.json, HF directory, GGUF file or llama2.c tokenizer .bin")
      ->required();
  CLI::Option* text = sub->add_option("--text", o->text, "text to encode");
  CLI::Option* file = sub->add_option("--file", o->file, "file whose bytes to encode");
  CLI::Option* ids = sub->add_option("--ids", o->ids, "token ids to decode, space-separated");
  sub->add_flag("--add-special", o->add_special, "add BOS etc. as the tokenizer's template says");
  sub->add_flag("--no-parse-special", o->no_parse_special,
                "treat the text of special tokens (<|im_start|>) as ordinary text");
  sub->add_flag("--bench", o->bench,
                "encode --file / --text line by line and print bytes, tokens and MB/s");
  sub->add_option("--repeat", o->repeat, "--bench: runs, the fastest is reported")
      ->capture_default_str();
  sub->add_option("--vocab-size", o->vocab_size,
                  "llama2.c tokenizers: entries to read (0 = until the end of the file)");
  sub->callback([o, text, file, ids] {
    o->has_text = text->count() > 0;
    o->has_file = file->count() > 0;
    o->has_ids = ids->count() > 0;
    if (int rc = run_tokenize(*o); rc != 0) throw CLI::RuntimeError(rc);
  });
}

}  // namespace miles::cli

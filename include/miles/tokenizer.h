// Tokenizer: text <-> token ids, one interface for every tokenizer format.
//
// Why: the rollout engine, the CLI and the trainer's data path must agree on the ids of a text and
// on the bytes of a sequence of ids. They see only this interface; the format behind it (llama2.c's
// tokenizer .bin, Hugging Face tokenizer.json byte-level BPE, GGUF vocabularies) is chosen once, at
// load time, by load_tokenizer. Encoding gives the reference implementation's ids (HF `tokenizers`
// for tokenizer.json, llama.cpp for GGUF, run.c for llama2.c). Decoding is byte-exact: the strings
// returned hold raw bytes (byte-level and byte-fallback pieces become the bytes they stand for),
// which need not be valid UTF-8 piece by piece, only once concatenated.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "miles/status.h"

namespace miles {

// note: every id passed to decode / decode_piece / token_text must be in [0, vocab_size()) (callers
// check ids that come from users); an id outside aborts with MILES_CHECK. prev_id may be -1 ("no
// previous").
struct EncodeOptions {
  // Add what the format puts around a sequence (llama2.c and SentencePiece: BOS; tokenizer.json:
  // its post-processor's tokens, none for Qwen3; GGUF: BOS / EOS as add_bos_token says).
  bool add_special = false;
  // Recognise the text of special (control) added tokens such as <|im_start|>. false leaves that
  // text to the ordinary tokenizer (HF split_special_tokens=True, llama.cpp parse_special=false);
  // non-special added tokens match either way.
  bool parse_special = true;
};

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;

  // Ids of `text` (any bytes). add_special: prepend the BOS token (and whatever else the format's
  // template adds; llama2.c adds only BOS, never EOS). Special tokens in the text are recognised.
  virtual std::vector<int32_t> encode(std::string_view text, bool add_special) const = 0;
  // The same with every option spelled out (formats without added tokens ignore parse_special).
  virtual std::vector<int32_t> encode_with(std::string_view text,
                                           const EncodeOptions& options) const {
    return encode(text, options.add_special);
  }
  // The exact bytes of a sequence: the concatenation of decode_piece(ids[i-1], ids[i]) with -1
  // before the first id. llama2.c: BOS and EOS decode to nothing. tokenizer.json and GGUF: every
  // token decodes to its text, added and special ones included (HF skip_special_tokens=False),
  // so decode(encode(x)) == x (but for WordPiece, whose words are lowercased and stripped of
  // accents).
  virtual std::string decode(std::span<const int32_t> ids) const {
    std::string out;  // the streamed pieces, each after its predecessor (-1 first)
    int32_t prev = -1;
    for (const int32_t id : ids) {
      out += decode_piece(prev, id);
      prev = id;
    }
    return out;
  }
  // The bytes printed when streaming `id` after `prev_id` (llama2.c: a piece that follows BOS loses
  // its leading space, a `<0xNN>` piece becomes the raw byte NN, BOS and EOS print nothing).
  virtual std::string decode_piece(int32_t prev_id, int32_t id) const = 0;

  // A special (control) token, which HF's decode(skip_special_tokens=True) leaves out: HF added
  // tokens marked special (and BOS / EOS), GGUF control and unknown tokens, llama2.c's BOS and EOS.
  virtual bool is_special(int32_t id) const { return id == bos_id() || id == eos_id(); }

  virtual int32_t vocab_size() const = 0;
  virtual int32_t bos_id() const = 0;  // -1 when none
  virtual int32_t eos_id() const = 0;  // -1 when none
  // The vocabulary entry of `id` as stored (llama2.c: "\n<s>\n" for BOS, "<0x0A>" for a byte
  // piece).
  virtual std::string token_text(int32_t id) const = 0;
};

// decode(ids) without the special tokens when skip_special (HF's skip_special_tokens).
std::string decode_text(const Tokenizer& tok, std::span<const int32_t> ids, bool skip_special);

// A llama2.c tokenizer file (tokenizer.bin / tok512.bin, as written by llama2.c's tokenizer.py):
// int32 max_token_length, then per id: float32 score, int32 len, len bytes. The file has no entry
// count: `vocab_size` (from the model header) says how many entries it holds, and the file must end
// right after them; vocab_size 0 reads entries until the end of the file. Ids 0, 1, 2 are <unk>,
// BOS, EOS; ids 3..258 the byte-fallback pieces <0x00>..<0xFF>. Encoding is run.c's `encode`
// exactly (see src/tokenizer/llama2c_tokenizer.cc); errors name the file and the entry.
Result<std::unique_ptr<Tokenizer>> load_llama2c_tokenizer(const std::string& path,
                                                          int32_t vocab_size);
// The same, from the file's bytes already in memory; `source` names them in errors (tests,
// fuzzers).
Result<std::unique_ptr<Tokenizer>> parse_llama2c_tokenizer(std::string_view bytes,
                                                           const std::string& source,
                                                           int32_t vocab_size);

// A Hugging Face tokenizer.json with a BPE model (byte-level or not; byte_fallback, ignore_merges,
// unk_token, fuse_unk): normalizers NFC, NFD, NFKC, NFKD, Lowercase, Replace, Prepend, Strip and
// Sequence; pre-tokenizers Split (any regex, run by Oniguruma as HF runs it, or a literal),
// ByteLevel, Digits, Metaspace, Whitespace, WhitespaceSplit, Punctuation, BertPreTokenizer,
// CharDelimiterSplit and Sequence; ByteLevel, TemplateProcessing, Roberta and Bert post-processors;
// decoders ByteLevel, Metaspace, Replace, ByteFallback, Fuse, Strip and Sequence; added tokens.
// Anything else is refused with an error naming the file and the field.
Result<std::unique_ptr<Tokenizer>> load_hf_tokenizer(const std::string& path);
// The same from the file's bytes; `source` names them in errors (tests, fuzzers).
Result<std::unique_ptr<Tokenizer>> parse_hf_tokenizer(std::string_view json,
                                                      const std::string& source);

class GgufFile;
// The tokenizer in a GGUF file's metadata, encoding as llama.cpp does: tokenizer.ggml.model
// "gpt2" (byte-level BPE; every tokenizer.ggml.pre name llama.cpp knows, from its name -> regex
// table, except the few it splits with hand-written code), "gemma4" (BPE over escaped spaces and
// raw UTF-8, byte fallback) or "llama" (SentencePiece-style: scores, byte fallback <0xNN>, a space
// prefix).
Result<std::unique_ptr<Tokenizer>> load_gguf_tokenizer(const std::string& path);
Result<std::unique_ptr<Tokenizer>> gguf_tokenizer(const GgufFile& file);

// Any supported tokenizer, recognised from `path`: a tokenizer.json, a directory holding one, a
// GGUF file (by its magic) or a llama2.c tokenizer file (vocab_size_hint as
// load_llama2c_tokenizer's vocab_size, <= 0 to read entries until the end of the file).
Result<std::unique_ptr<Tokenizer>> load_tokenizer(const std::string& path, int32_t vocab_size_hint);

}  // namespace miles

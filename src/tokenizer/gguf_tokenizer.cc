// Tokenizers from GGUF metadata (tokenizer.ggml.*), configured as llama.cpp configures them.
//
// Why llama.cpp's reading: a GGUF names its pre-tokenizer (tokenizer.ggml.pre) instead of spelling
// it out, and the meaning of each name is llama.cpp's (gguf_pre_tokenizer.h: its regexes, whether
// merges are ignored, whether BOS is added by default). There is no normalizer (llama.cpp applies
// none to BPE vocabularies), and added tokens are the entries typed control, user-defined or
// unknown, matched longest first. Errors name the file and the key.
#include <spdlog/spdlog.h>

#include <string_view>
#include <unordered_map>
#include <unordered_set>

#include "miles/gguf.h"
#include "miles/tokenizer.h"
#include "tokenizer/bpe_tokenizer.h"
#include "tokenizer/byte_level.h"
#include "tokenizer/decoder.h"
#include "tokenizer/gguf_pre_tokenizer.h"
#include "tokenizer/spm_tokenizer.h"
#include "tokenizer/wordpiece.h"

namespace miles {
namespace {

using tokenizer::PreTokenizerStep;

constexpr int64_t kMaxVocab = 1 << 22;

Status key_error(const GgufFile& f, const std::string& key, const std::string& message) {
  return Status::Error(f.path() + ": " + key + ": " + message);
}

// An optional integer key: fallback when absent.
Result<int64_t> optional_int(const GgufFile& f, const std::string& key, int64_t fallback) {
  if (!f.find(key)) return fallback;
  return f.get_int(key);
}
Result<bool> optional_bool(const GgufFile& f, const std::string& key, bool fallback) {
  if (!f.find(key)) return fallback;
  return f.get_bool(key);
}

Result<int32_t> token_id_key(const GgufFile& f, const std::string& key, int64_t vocab) {
  MILES_ASSIGN_OR_RETURN(const int64_t id, optional_int(f, key, -1));
  if (id < -1 || id >= vocab)
    return key_error(
        f, key,
        std::to_string(id) + " is not a token id (vocabulary of " + std::to_string(vocab) + ")");
  return static_cast<int32_t>(id);
}

// The pre-tokenizer tokenizer.ggml.pre names, from llama.cpp's table (gguf_pre_tokenizer.h): each
// regex an Isolated split.
Result<std::vector<PreTokenizerStep>> pre_tokenizer_for(const GgufFile& f, const std::string& pre,
                                                        tokenizer::GgufPreTokenizer* def) {
  auto found = tokenizer::gguf_pre_tokenizer(pre);
  if (!found.ok()) return key_error(f, "tokenizer.ggml.pre", found.message());
  *def = std::move(found).value();
  std::vector<PreTokenizerStep> steps;
  if (def->escaped_spaces) {  // llama_escape_whitespace: every space becomes U+2581
    PreTokenizerStep s;
    s.kind = PreTokenizerStep::Kind::kMetaspace;
    s.literal = "\xE2\x96\x81";
    s.prepend = tokenizer::PrependScheme::kNever;
    s.split = false;
    steps.push_back(std::move(s));
  }
  for (const std::string_view regex : def->regexes) {
    PreTokenizerStep s;
    s.kind = PreTokenizerStep::Kind::kSplitRegex;
    auto re = tokenizer::SplitRegex::compile(regex);  // a test compiles every pattern of the table
    if (!re.ok()) return key_error(f, "tokenizer.ggml.pre", re.message());
    s.regex = std::move(re).value();
    steps.push_back(std::move(s));
  }
  return steps;
}

Result<std::vector<int32_t>> token_types(const GgufFile& f, size_t n) {
  std::vector<int32_t> types(n, tokenizer::kTokenNormal);
  if (!f.find("tokenizer.ggml.token_type")) return types;
  MILES_ASSIGN_OR_RETURN(const auto raw, f.get_ints("tokenizer.ggml.token_type"));
  if (raw.size() != n)
    return key_error(f, "tokenizer.ggml.token_type",
                     std::to_string(raw.size()) + " entries for " + std::to_string(n) + " tokens");
  for (size_t i = 0; i < n; ++i) types[i] = static_cast<int32_t>(raw[i]);
  return types;
}

// llama.cpp's corrections of the stored types by token text (llama-vocab.cpp, "auto-detect
// special tokens by text" and the end-of-generation list): a token whose text marks the end of a
// turn or of the text, or a fill-in-the-middle role (when the GGUF names no token for that role),
// is a control token whatever its stored type, so that parse_special=false leaves its text to the
// ordinary tokenizer; "</s>" stays normal beside Gemma 4's and PLaMo's own end markers, and
// gpt-oss's channel tokens are user-defined. Where llama.cpp takes the first of several FIM
// candidates in hash order, every candidate is taken here.
void apply_llama_cpp_types(const GgufFile& f, const std::vector<std::string>& tokens,
                           std::vector<int32_t>& types) {
  static const std::unordered_set<std::string_view> kEndOfGeneration = {"<|eot_id|>",
                                                                        "<|im_end|>",
                                                                        "<|end|>",
                                                                        "<|return|>",
                                                                        "<|call|>",
                                                                        "<|flush|>",
                                                                        "<|calls|>",
                                                                        "<end_of_turn>",
                                                                        "<|endoftext|>",
                                                                        "</s>",
                                                                        "<|eom_id|>",
                                                                        "<EOT>",
                                                                        "_<EOT>",
                                                                        "[EOT]",
                                                                        "[EOS]",
                                                                        "<|end_of_text|>",
                                                                        "<end_of_utterance>",
                                                                        "<eos>",
                                                                        "<turn|>",
                                                                        "<|tool_response>",
                                                                        "<｜end▁of▁sentence｜>",
                                                                        "[e~["};
  struct Role {
    const char* key;
    std::vector<std::string_view> texts;
  };
  static const Role kFim[] = {
      {"tokenizer.ggml.fim_pre_token_id",
       {"<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<｜fim▁begin｜>", "<PRE>", "▁<PRE>",
        "<|code_prefix|>", "<|prefix|>"}},
      {"tokenizer.ggml.fim_suf_token_id",
       {"<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<｜fim▁hole｜>", "<SUF>", "▁<SUF>",
        "<|code_suffix|>", "<|suffix|>"}},
      {"tokenizer.ggml.fim_mid_token_id",
       {"<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<｜fim▁end｜>", "<MID>", "▁<MID>",
        "<|code_middle|>", "<|middle|>"}},
      {"tokenizer.ggml.fim_pad_token_id",
       {"<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"}},
      {"tokenizer.ggml.fim_rep_token_id",
       {"<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"}},
      {"tokenizer.ggml.fim_sep_token_id", {"<|file_sep|>"}},
  };
  std::unordered_map<std::string_view, size_t> id_of;
  for (size_t id = 0; id < tokens.size(); ++id) id_of[tokens[id]] = id;  // later ids win
  auto promote = [&](std::string_view text) {
    auto it = id_of.find(text);
    if (it != id_of.end()) types[it->second] = tokenizer::kTokenControl;
  };
  for (const std::string_view text : kEndOfGeneration) promote(text);
  for (const Role& r : kFim)
    if (!f.find(r.key))
      for (const std::string_view text : r.texts) promote(text);
  if (id_of.count("</s>") && (id_of.count("<|tool_response>") || id_of.count("<|plamo:eos|>")))
    types[id_of["</s>"]] = tokenizer::kTokenNormal;
  for (const std::string_view text : {"<|channel|>", "<|message|>", "<|start|>", "<|constrain|>"})
    if (auto it = id_of.find(text); it != id_of.end())
      types[it->second] = tokenizer::kTokenUserDefined;
}

// BPE vocabularies: "gpt2" (byte-level) and "gemma4" (whose pre-tokenizer llama.cpp fixes to
// "gemma4": escaped spaces, raw UTF-8 symbols, <0xNN> byte tokens).
Result<std::unique_ptr<Tokenizer>> gpt2_tokenizer(const GgufFile& f,
                                                  std::vector<std::string> tokens,
                                                  std::vector<int32_t> types, bool gemma4) {
  tokenizer::BpeTokenizerSpec spec;
  const auto n = static_cast<int64_t>(tokens.size());
  std::string pre;  // llama.cpp reads a missing name as "default"
  if (gemma4) {
    pre = "gemma4";
  } else if (f.find("tokenizer.ggml.pre")) {
    MILES_ASSIGN_OR_RETURN(pre, f.get_string("tokenizer.ggml.pre"));
  } else {
    spdlog::warn("{}: no tokenizer.ggml.pre; using llama.cpp's \"default\" pre-tokenizer",
                 f.path());
  }
  tokenizer::GgufPreTokenizer def;
  MILES_ASSIGN_OR_RETURN(spec.pre_tokenizer, pre_tokenizer_for(f, pre, &def));
  spec.options.ignore_merges = def.ignore_merges;
  spec.options.newline_words_whole = def.newline_words_whole;
  spec.options.byte_level = !def.escaped_spaces;
  spec.options.byte_fallback = def.escaped_spaces;
  std::unordered_map<std::string, int32_t> lookup;  // as stored; later ids win (llama.cpp)
  for (int32_t id = 0; id < n; ++id) lookup[tokens[id]] = id;
  MILES_ASSIGN_OR_RETURN(const auto merges, f.get_strings("tokenizer.ggml.merges"));
  spec.merges.reserve(merges.size());
  for (size_t r = 0; r < merges.size(); ++r) {
    const std::string& m = merges[r];
    const size_t sp = m.find(' ', 1);
    const std::string key = "tokenizer.ggml.merges[" + std::to_string(r) + "]";
    if (sp == std::string::npos) return key_error(f, key, "\"" + m + "\" has no space");
    const std::string parts[3] = {m.substr(0, sp), m.substr(sp + 1),
                                  m.substr(0, sp) + m.substr(sp + 1)};
    int32_t ids[3];
    for (int k = 0; k < 3; ++k) {
      auto it = lookup.find(parts[k]);
      if (it == lookup.end())
        return key_error(f, key, "token \"" + parts[k] + "\" is not in tokenizer.ggml.tokens");
      ids[k] = it->second;
    }
    spec.merges.push_back({ids[0], ids[1], ids[2]});
  }
  spec.token_text = tokens;
  spec.token_bytes.resize(tokens.size());
  for (const auto& [text, id] : lookup) {
    std::string bytes;
    if (def.escaped_spaces) {
      spec.model_vocab.emplace_back(text, id);
    } else if (tokenizer::byte_level_decode(text, &bytes)) {
      spec.model_vocab.emplace_back(bytes, id);
    }
  }
  // llama.cpp's token_to_piece: normal tokens through the byte-level map (or with U+2581 as a
  // space), byte tokens as their byte, the rest as stored.
  std::vector<tokenizer::DecoderStep> unescape(2);
  unescape[0].kind = tokenizer::DecoderStep::Kind::kReplace;
  unescape[0].from = "\xE2\x96\x81";
  unescape[0].to = " ";
  unescape[1].kind = tokenizer::DecoderStep::Kind::kByteFallback;
  for (int32_t id = 0; id < n; ++id) {
    const int32_t t = types[id];
    std::string bytes;
    const bool normal = t == tokenizer::kTokenNormal;
    if (def.escaped_spaces) {
      spec.token_bytes[id] = normal || t == tokenizer::kTokenByte
                                 ? tokenizer::decode_token(unescape, tokens[id], false)
                                 : tokens[id];
    } else {
      spec.token_bytes[id] =
          normal && tokenizer::byte_level_decode(tokens[id], &bytes) ? bytes : tokens[id];
    }
    if (tokenizer::is_added_type(t))
      spec.added_tokens.push_back({tokens[id], id, t != tokenizer::kTokenUserDefined});
  }
  spec.added_strategy = tokenizer::AddedTokenMatcher::Strategy::kLongestFirst;
  MILES_ASSIGN_OR_RETURN(spec.bos_id, token_id_key(f, "tokenizer.ggml.bos_token_id", n));
  MILES_ASSIGN_OR_RETURN(spec.eos_id, token_id_key(f, "tokenizer.ggml.eos_token_id", n));
  MILES_ASSIGN_OR_RETURN(const bool add_bos,
                         optional_bool(f, "tokenizer.ggml.add_bos_token", def.add_bos));
  MILES_ASSIGN_OR_RETURN(const bool add_eos,
                         optional_bool(f, "tokenizer.ggml.add_eos_token", false));
  if (add_bos && spec.bos_id >= 0) spec.prefix.push_back(spec.bos_id);
  if (add_eos && spec.eos_id >= 0) spec.suffix.push_back(spec.eos_id);
  return tokenizer::make_bpe_tokenizer(std::move(spec));
}

Result<std::unique_ptr<Tokenizer>> llama_tokenizer(const GgufFile& f,
                                                   std::vector<std::string> tokens,
                                                   std::vector<int32_t> types) {
  tokenizer::SpmSpec spec;
  const auto n = static_cast<int64_t>(tokens.size());
  MILES_ASSIGN_OR_RETURN(const auto scores, f.get_floats("tokenizer.ggml.scores"));
  if (static_cast<int64_t>(scores.size()) != n)
    return key_error(
        f, "tokenizer.ggml.scores",
        std::to_string(scores.size()) + " entries for " + std::to_string(n) + " tokens");
  spec.scores.assign(scores.begin(), scores.end());
  spec.pieces = std::move(tokens);
  spec.types = std::move(types);
  MILES_ASSIGN_OR_RETURN(spec.bos_id, token_id_key(f, "tokenizer.ggml.bos_token_id", n));
  MILES_ASSIGN_OR_RETURN(spec.eos_id, token_id_key(f, "tokenizer.ggml.eos_token_id", n));
  MILES_ASSIGN_OR_RETURN(spec.unk_id, token_id_key(f, "tokenizer.ggml.unknown_token_id", n));
  MILES_ASSIGN_OR_RETURN(spec.add_bos, optional_bool(f, "tokenizer.ggml.add_bos_token", true));
  MILES_ASSIGN_OR_RETURN(spec.add_eos, optional_bool(f, "tokenizer.ggml.add_eos_token", false));
  MILES_ASSIGN_OR_RETURN(spec.add_space_prefix,
                         optional_bool(f, "tokenizer.ggml.add_space_prefix", true));
  return tokenizer::make_spm_tokenizer(std::move(spec));
}

// "bert": WordPiece ([CLS] and [SEP] around a sequence, as llama.cpp adds them).
Result<std::unique_ptr<Tokenizer>> bert_tokenizer(const GgufFile& f,
                                                  std::vector<std::string> tokens,
                                                  std::vector<int32_t> types) {
  tokenizer::WordPieceSpec spec;
  const auto n = static_cast<int64_t>(tokens.size());
  spec.pieces = std::move(tokens);
  spec.types = std::move(types);
  MILES_ASSIGN_OR_RETURN(spec.unk_id, token_id_key(f, "tokenizer.ggml.unknown_token_id", n));
  // [CLS] / [SEP] under their own keys (llama.cpp's BERT converter), else as BOS / EOS.
  MILES_ASSIGN_OR_RETURN(spec.bos_id, token_id_key(f, "tokenizer.ggml.cls_token_id", n));
  if (spec.bos_id < 0) {
    MILES_ASSIGN_OR_RETURN(spec.bos_id, token_id_key(f, "tokenizer.ggml.bos_token_id", n));
  }
  MILES_ASSIGN_OR_RETURN(spec.eos_id, token_id_key(f, "tokenizer.ggml.seperator_token_id", n));
  if (spec.eos_id < 0) {
    MILES_ASSIGN_OR_RETURN(spec.eos_id, token_id_key(f, "tokenizer.ggml.eos_token_id", n));
  }
  MILES_ASSIGN_OR_RETURN(spec.add_bos, optional_bool(f, "tokenizer.ggml.add_bos_token", true));
  MILES_ASSIGN_OR_RETURN(spec.add_eos, optional_bool(f, "tokenizer.ggml.add_eos_token", true));
  return tokenizer::make_wordpiece_tokenizer(std::move(spec));
}

}  // namespace

Result<std::unique_ptr<Tokenizer>> gguf_tokenizer(const GgufFile& f) {
  MILES_ASSIGN_OR_RETURN(const std::string model, f.get_string("tokenizer.ggml.model"));
  MILES_ASSIGN_OR_RETURN(auto tokens, f.get_strings("tokenizer.ggml.tokens"));
  if (tokens.empty() || static_cast<int64_t>(tokens.size()) > kMaxVocab)
    return key_error(f, "tokenizer.ggml.tokens",
                     std::to_string(tokens.size()) + " tokens (expected 1 to 2^22)");
  MILES_ASSIGN_OR_RETURN(auto types, token_types(f, tokens.size()));
  apply_llama_cpp_types(f, tokens, types);
  if (model == "gpt2" || model == "gemma4")
    return gpt2_tokenizer(f, std::move(tokens), std::move(types), model == "gemma4");
  if (model == "llama") return llama_tokenizer(f, std::move(tokens), std::move(types));
  if (model == "bert") return bert_tokenizer(f, std::move(tokens), std::move(types));
  return key_error(f, "tokenizer.ggml.model",
                   "\"" + model + "\" is not supported (gpt2, gemma4, llama, bert)");
}

Result<std::unique_ptr<Tokenizer>> load_gguf_tokenizer(const std::string& path) {
  MILES_ASSIGN_OR_RETURN(const GgufFile f, GgufFile::open(path));
  return gguf_tokenizer(f);
}

}  // namespace miles

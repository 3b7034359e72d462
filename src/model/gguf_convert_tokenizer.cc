// GGUF `tokenizer.*` metadata -> tokenizer.json + tokenizer_config.json (byte-level BPE).
//
// Why: a GGUF has no tokenizer.json; llama.cpp stores the vocabulary, merges, token types and a
// pre-tokenizer name. We rebuild the HF file transformers' own GGUF conversion builds (a BPE model
// over the GPT-2 byte alphabet, control tokens as special added tokens, a ByteLevel decoder), with
// the pre-tokenizer llama.cpp applies for the stated `tokenizer.ggml.pre`: for "smollm" that splits
// every digit first (llama.cpp's LLAMA_VOCAB_PRE_TYPE_SMOLLM and SmolLM2's published
// tokenizer.json; transformers' GGUF path uses plain GPT-2 splitting, which gives the same ids on
// this vocabulary as it has no multi-digit tokens). Anything else (SentencePiece vocabularies,
// unknown pre-tokenizers, merges naming tokens that are not in the vocabulary) is an error naming
// the key.
#include <array>
#include <unordered_map>

#include "miles/convert.h"
#include "nlohmann/json.hpp"

namespace miles {
namespace {

using ojson = nlohmann::ordered_json;

constexpr int64_t kTokenControl = 3;      // llama.cpp LLAMA_TOKEN_TYPE_CONTROL
constexpr int64_t kTokenUserDefined = 4;  // LLAMA_TOKEN_TYPE_USER_DEFINED

// GPT-2's byte -> code point table: printable bytes map to themselves, the rest to 256 + n.
uint32_t byte_char(uint8_t b) {
  static const auto table = [] {
    std::array<uint32_t, 256> t{};
    uint32_t next = 256;
    for (uint32_t c = 0; c < 256; ++c) {
      const bool printable = (c >= 33 && c <= 126) || (c >= 161 && c <= 172) || (c >= 174);
      t[c] = printable ? c : next++;
    }
    return t;
  }();
  return table[b];
}

bool in_byte_alphabet(uint32_t cp) {
  return (cp >= 33 && cp <= 126) || (cp >= 161 && cp <= 172) || (cp >= 174 && cp <= 323);
}

void append_utf8(uint32_t cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

// True when `s` is valid UTF-8 whose every code point is in the byte alphabet (so it is already a
// byte-level spelling). Only 1- and 2-byte sequences can be in the alphabet (code points < 324).
bool spelled_in_byte_alphabet(const std::string& s) {
  if (s.empty()) return false;
  for (size_t i = 0; i < s.size();) {
    const auto c = static_cast<uint8_t>(s[i]);
    uint32_t cp;
    if (c < 0x80) {
      cp = c;
      i += 1;
    } else if ((c & 0xE0) == 0xC0 && i + 1 < s.size() &&
               (static_cast<uint8_t>(s[i + 1]) & 0xC0) == 0x80) {
      cp = ((c & 0x1Fu) << 6) | (static_cast<uint8_t>(s[i + 1]) & 0x3Fu);
      if (cp < 0x80) return false;  // overlong
      i += 2;
    } else {
      return false;
    }
    if (!in_byte_alphabet(cp)) return false;
  }
  return true;
}

// The byte-level spelling of raw bytes (what a vocabulary entry outside the alphabet becomes).
std::string respell(const std::string& raw) {
  std::string out;
  for (char ch : raw) append_utf8(byte_char(static_cast<uint8_t>(ch)), &out);
  return out;
}

Status key_error(const GgufFile& f, const std::string& key, const std::string& what) {
  return Status::Error(f.path() + ": metadata key '" + key + "' " + what);
}

ojson byte_level(bool use_regex) {
  return {{"type", "ByteLevel"},
          {"add_prefix_space", false},
          {"trim_offsets", true},
          {"use_regex", use_regex}};
}

ojson split_then_bytes(const char* regex) {
  return {{"type", "Sequence"},
          {"pretokenizers",
           {{{"type", "Split"},
             {"pattern", {{"Regex", regex}}},
             {"behavior", "Isolated"},
             {"invert", false}},
            byte_level(false)}}};
}

// llama.cpp's pre-tokenizer for `tokenizer.ggml.pre`, spelled as an HF pre_tokenizer; for the
// Llama-3 one llama.cpp (tokenizer_ignore_merges) and Llama 3's own tokenizer.json also look a
// whole pre-token up in the vocabulary before merging.
struct PreTokenizer {
  ojson json;
  bool ignore_merges = false;
};

// The Llama-3 split (GPT-4's: digits in runs of up to three).
constexpr const char* kLlama3Split =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

Result<PreTokenizer> pre_tokenizer(const GgufFile& f) {
  std::string pre = "default";
  if (f.find("tokenizer.ggml.pre")) {
    MILES_ASSIGN_OR_RETURN(pre, f.get_string("tokenizer.ggml.pre"));
  }
  if (pre == "default" || pre == "gpt-2" || pre == "gpt2") return PreTokenizer{byte_level(true)};
  if (pre == "smollm")
    return PreTokenizer{ojson{
        {"type", "Sequence"},
        {"pretokenizers", {{{"type", "Digits"}, {"individual_digits", true}}, byte_level(true)}}}};
  if (pre == "qwen2" || pre == "deepseek-r1-qwen")
    return PreTokenizer{split_then_bytes(
        R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)")};
  if (pre == "llama-bpe" || pre == "llama3" || pre == "llama-v3")
    return PreTokenizer{split_then_bytes(kLlama3Split), true};
  // GLM-4, GLM-4.5 / 4.6 and ChatGLM-4: the same split; glm4 / glm5 also look a whole pre-token up
  // first (as miles' own reading of the GGUF does: tokenizer/gguf_pre_tokenizer.cc, from the
  // llama.cpp it follows), chatglm-bpe merges only.
  if (pre == "glm4" || pre == "glm5") return PreTokenizer{split_then_bytes(kLlama3Split), true};
  if (pre == "chatglm-bpe") return PreTokenizer{split_then_bytes(kLlama3Split), false};
  return key_error(
      f, "tokenizer.ggml.pre",
      "is '" + pre +
          "', a pre-tokenizer miles convert does not know (supported: default, "
          "gpt-2, smollm, qwen2, deepseek-r1-qwen, llama-bpe, glm4, glm5, chatglm-bpe)");
}

struct Vocab {
  std::vector<std::string> tokens;  // as stored
  std::vector<int64_t> types;       // one per token (1 = normal when the file has none)
  ojson vocab = ojson::object();    // byte-level spelling -> id, in first-appearance order
  std::unordered_map<std::string, size_t> spellings;  // spelling -> its entry in `vocab`
};

Result<Vocab> read_vocab(const GgufFile& f) {
  Vocab v;
  MILES_ASSIGN_OR_RETURN(v.tokens, f.get_strings("tokenizer.ggml.tokens"));
  if (v.tokens.empty()) return key_error(f, "tokenizer.ggml.tokens", "is empty");
  v.types.assign(v.tokens.size(), 1);
  if (f.find("tokenizer.ggml.token_type")) {
    MILES_ASSIGN_OR_RETURN(v.types, f.get_ints("tokenizer.ggml.token_type"));
    if (v.types.size() != v.tokens.size())
      return key_error(f, "tokenizer.ggml.token_type",
                       "has " + std::to_string(v.types.size()) + " entries for " +
                           std::to_string(v.tokens.size()) + " tokens");
  }
  for (size_t id = 0; id < v.tokens.size(); ++id) {
    const std::string& t = v.tokens[id];
    const std::string spelled = spelled_in_byte_alphabet(t) ? t : respell(t);
    // ordered_json's own insert searches linearly (quadratic for 150k tokens), so entries go
    // straight into its underlying vector, deduplicated here: a repeated spelling keeps its first
    // place and the later id, as a Python dict (transformers) does.
    auto& entries = static_cast<ojson::object_t::Container&>(v.vocab.get_ref<ojson::object_t&>());
    auto [it, fresh] = v.spellings.emplace(spelled, entries.size());
    if (fresh) {
      entries.emplace_back(spelled, id);
    } else {
      entries[it->second].second = id;
    }
  }
  return v;
}

Result<ojson> read_merges(const GgufFile& f, const Vocab& v) {
  MILES_ASSIGN_OR_RETURN(const auto merges, f.get_strings("tokenizer.ggml.merges"));
  ojson out = ojson::array();
  for (size_t i = 0; i < merges.size(); ++i) {
    const std::string& m = merges[i];
    const size_t space = m.find(' ');
    const std::string where = "entry " + std::to_string(i) + " ('" + m + "') ";
    if (space == std::string::npos || space == 0 || space + 1 == m.size() ||
        m.find(' ', space + 1) != std::string::npos)
      return key_error(f, "tokenizer.ggml.merges", where + "is not two tokens joined by a space");
    const std::string a = m.substr(0, space), b = m.substr(space + 1);
    for (const std::string& t : {a, b, a + b})
      if (!v.spellings.count(t))
        return key_error(f, "tokenizer.ggml.merges",
                         where + "uses '" + t + "', which is not in tokenizer.ggml.tokens");
    out.push_back({a, b});
  }
  return out;
}

// Control tokens spelled in the byte alphabet become special added tokens; user-defined ones plain
// added tokens (a control token outside the alphabet is a llama.cpp mislabel, as transformers
// notes).
ojson added_tokens(const Vocab& v) {
  ojson out = ojson::array();
  for (size_t id = 0; id < v.tokens.size(); ++id) {
    const int64_t type = v.types[id];
    if ((type != kTokenControl && type != kTokenUserDefined) ||
        !spelled_in_byte_alphabet(v.tokens[id]))
      continue;
    out.push_back({{"id", id},
                   {"content", v.tokens[id]},
                   {"single_word", false},
                   {"lstrip", false},
                   {"rstrip", false},
                   {"normalized", false},
                   {"special", type == kTokenControl}});
  }
  return out;
}

Result<bool> bool_or(const GgufFile& f, const std::string& key, bool fallback) {
  if (!f.find(key)) return fallback;
  return f.get_bool(key);
}

// tokenizer.ggml.<name>_token_id, or -1 when absent; an id outside the token list is an error.
struct SpecialIds {
  int64_t bos = -1, eos = -1, pad = -1, unk = -1;
};

Result<SpecialIds> read_special_ids(const GgufFile& f, const Vocab& v) {
  SpecialIds ids;
  const std::pair<const char*, int64_t*> keys[] = {{"tokenizer.ggml.bos_token_id", &ids.bos},
                                                   {"tokenizer.ggml.eos_token_id", &ids.eos},
                                                   {"tokenizer.ggml.padding_token_id", &ids.pad},
                                                   {"tokenizer.ggml.unknown_token_id", &ids.unk}};
  for (const auto& [key, out] : keys) {
    if (!f.find(key)) continue;
    MILES_ASSIGN_OR_RETURN(*out, f.get_int(key));
    if (*out < 0 || *out >= static_cast<int64_t>(v.tokens.size()))
      return key_error(f, key,
                       "is " + std::to_string(*out) + ", outside the " +
                           std::to_string(v.tokens.size()) + "-token list");
  }
  return ids;
}

// BOS / EOS added by encode(add_special_tokens=True), from tokenizer.ggml.add_{bos,eos}_token.
ojson post_processor(const Vocab& v, const SpecialIds& a, bool add_bos, bool add_eos) {
  if ((!add_bos || a.bos < 0) && (!add_eos || a.eos < 0)) return nullptr;
  ojson single = ojson::array(), pair = ojson::array(), specials = ojson::object();
  auto special = [&](int64_t id) {
    const std::string& t = v.tokens[id];
    specials[t] = {{"id", t}, {"ids", {id}}, {"tokens", {t}}};
    return ojson{{"SpecialToken", {{"id", t}, {"type_id", 0}}}};
  };
  if (add_bos && a.bos >= 0) single.push_back(special(a.bos));
  single.push_back({{"Sequence", {{"id", "A"}, {"type_id", 0}}}});
  if (add_eos && a.eos >= 0) single.push_back(special(a.eos));
  pair = single;
  if (add_bos && a.bos >= 0) pair.push_back(special(a.bos));
  pair.push_back({{"Sequence", {{"id", "B"}, {"type_id", 1}}}});
  if (add_eos && a.eos >= 0) pair.push_back(special(a.eos));
  return {{"type", "TemplateProcessing"},
          {"single", single},
          {"pair", pair},
          {"special_tokens", specials}};
}

Result<std::string> dump(const ojson& j, const GgufFile& f, const char* what) {
  try {
    return j.dump(2) + "\n";
  } catch (const nlohmann::json::exception& e) {  // invalid UTF-8 in a metadata string
    return Status::Error(f.path() + ": cannot write " + what + ": " + e.what());
  }
}

}  // namespace

Result<HfTokenizerFiles> gguf_tokenizer_files(const GgufFile& f) {
  MILES_ASSIGN_OR_RETURN(const std::string model, f.get_string("tokenizer.ggml.model"));
  if (model != "gpt2")
    return key_error(
        f, "tokenizer.ggml.model",
        "is '" + model + "'; miles convert only writes byte-level BPE tokenizers ('gpt2')");
  MILES_ASSIGN_OR_RETURN(const Vocab v, read_vocab(f));
  MILES_ASSIGN_OR_RETURN(ojson merges, read_merges(f, v));
  MILES_ASSIGN_OR_RETURN(PreTokenizer pre, pre_tokenizer(f));
  MILES_ASSIGN_OR_RETURN(const bool add_bos, bool_or(f, "tokenizer.ggml.add_bos_token", false));
  MILES_ASSIGN_OR_RETURN(const bool add_eos, bool_or(f, "tokenizer.ggml.add_eos_token", false));
  MILES_ASSIGN_OR_RETURN(const SpecialIds a, read_special_ids(f, v));

  ojson tok;
  tok["version"] = "1.0";
  tok["truncation"] = nullptr;
  tok["padding"] = nullptr;
  tok["added_tokens"] = added_tokens(v);
  tok["normalizer"] = nullptr;
  tok["pre_tokenizer"] = std::move(pre.json);
  tok["post_processor"] = post_processor(v, a, add_bos, add_eos);
  tok["decoder"] = {{"type", "ByteLevel"},
                    {"add_prefix_space", true},
                    {"trim_offsets", true},
                    {"use_regex", true}};
  tok["model"] = {{"type", "BPE"},
                  {"dropout", nullptr},
                  {"unk_token", nullptr},
                  {"continuing_subword_prefix", ""},
                  {"end_of_word_suffix", ""},
                  {"fuse_unk", false},
                  {"byte_fallback", false},
                  {"ignore_merges", pre.ignore_merges},
                  {"vocab", v.vocab},
                  {"merges", std::move(merges)}};

  ojson cfg;
  cfg["tokenizer_class"] = "PreTrainedTokenizerFast";
  cfg["add_bos_token"] = add_bos;
  cfg["add_eos_token"] = add_eos;
  const std::pair<const char*, int64_t> specials[] = {
      {"bos_token", a.bos}, {"eos_token", a.eos}, {"pad_token", a.pad}, {"unk_token", a.unk}};
  for (const auto& [key, id] : specials)
    if (id >= 0) cfg[key] = v.tokens[id];
  cfg["clean_up_tokenization_spaces"] = false;
  if (f.find("general.architecture")) {
    MILES_ASSIGN_OR_RETURN(const std::string arch, f.get_string("general.architecture"));
    if (f.find(arch + ".context_length")) {
      MILES_ASSIGN_OR_RETURN(cfg["model_max_length"], f.get_int(arch + ".context_length"));
    }
  }
  if (f.find("tokenizer.chat_template")) {
    MILES_ASSIGN_OR_RETURN(cfg["chat_template"], f.get_string("tokenizer.chat_template"));
  }

  HfTokenizerFiles out;
  MILES_ASSIGN_OR_RETURN(out.tokenizer_json, dump(tok, f, "tokenizer.json"));
  MILES_ASSIGN_OR_RETURN(out.tokenizer_config_json, dump(cfg, f, "tokenizer_config.json"));
  return out;
}

}  // namespace miles

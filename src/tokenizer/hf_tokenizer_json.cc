// Reading a Hugging Face tokenizer.json into a BpeTokenizerSpec: the model, normalizers
// (normalizer.h), pre-tokenizers (pre_tokenizer.h; Split patterns through regex.h), post-processor,
// decoders (decoder.h) and added tokens.
//
// Why strict: a tokenizer that silently ignores a part it does not understand gives wrong ids
// without any error. Every part HF would run is either reproduced exactly or refused with an
// error naming the file and the field ("tokenizer.json: pre_tokenizer.pretokenizers[0].pattern:
// ..."). Added tokens get their ids as HF's deserializer gives them (the vocabulary's id when the
// content is a vocabulary entry, else the next free id in file order), whatever the file says.
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <unordered_map>

#include "miles/json_text.h"
#include "tokenizer/bpe_tokenizer.h"
#include "tokenizer/byte_level.h"
#include "tokenizer/decoder.h"
#include "tokenizer/unicode.h"

namespace miles {
namespace {

using json = nlohmann::json;
using tokenizer::PreTokenizerStep;
using tokenizer::SplitBehavior;

constexpr int64_t kMaxIdGap = 1 << 16;  // ids may leave at most this many unused slots

class Reader {
 public:
  explicit Reader(std::string source) : source_(std::move(source)) {}

  Status error(const std::string& field, const std::string& message) const {
    return Status::Error(source_ + ": " + field + ": " + message);
  }
  // obj[key] when present and not null, else nullptr; obj must be an object.
  static const json* find(const json& obj, const char* key) {
    auto it = obj.find(key);
    return it == obj.end() || it->is_null() ? nullptr : &*it;
  }
  Result<bool> get_bool(const json& obj, const char* key, const std::string& field,
                        bool fallback) const {
    const json* v = find(obj, key);
    if (!v) return fallback;
    if (!v->is_boolean()) return error(field + "." + key, "expected true or false");
    return v->get<bool>();
  }
  Result<std::string> get_string(const json& obj, const char* key, const std::string& field) const {
    const json* v = find(obj, key);
    if (!v || !v->is_string()) return error(field + "." + key, "expected a string");
    return v->get<std::string>();
  }
  Result<std::string> type_of(const json& obj, const std::string& field) const {
    if (!obj.is_object()) return error(field, "expected an object");
    return get_string(obj, "type", field);
  }

  Status parse_model(const json& m, tokenizer::BpeTokenizerSpec& spec,
                     std::unordered_map<std::string, int32_t>& vocab, bool byte_level) const;
  Status parse_normalizer(const json& n, const std::string& field,
                          std::vector<tokenizer::NormalizerStep>& steps) const;
  Status parse_decoder(const json& d, const std::string& field,
                       std::vector<tokenizer::DecoderStep>& steps, bool* byte_level) const;
  Status parse_pre_tokenizer(const json& p, const std::string& field,
                             std::vector<PreTokenizerStep>& steps) const;
  Status parse_post_processor(const json& p, const std::string& field,
                              tokenizer::BpeTokenizerSpec& spec) const;
  Status parse_added_tokens(const json& a, const std::unordered_map<std::string, int32_t>& vocab,
                            tokenizer::BpeTokenizerSpec& spec) const;

 private:
  Result<int32_t> special_id(const json& pair, const std::string& field) const;
  // A Replace / Split pattern: {"String": s} or {"Regex": r}; exactly one of literal / regex set.
  Status parse_pattern(const json& p, const std::string& field, std::string* literal,
                       std::shared_ptr<const tokenizer::SplitRegex>* regex) const;
  // A one-character string field (Metaspace's replacement, Strip's content).
  Result<std::string> get_char(const json& obj, const char* key, const std::string& field) const;
  std::string source_;
};

Result<SplitBehavior> behavior_from(const std::string& s) {
  if (s == "Removed") return SplitBehavior::kRemoved;
  if (s == "Isolated") return SplitBehavior::kIsolated;
  if (s == "MergedWithPrevious") return SplitBehavior::kMergedWithPrevious;
  if (s == "MergedWithNext") return SplitBehavior::kMergedWithNext;
  if (s == "Contiguous") return SplitBehavior::kContiguous;
  return Status::Error("unknown behavior \"" + s + "\"");
}

Status Reader::parse_model(const json& m, tokenizer::BpeTokenizerSpec& spec,
                           std::unordered_map<std::string, int32_t>& vocab, bool byte_level) const {
  if (!m.is_object()) return error("model", "expected an object");
  if (const json* t = find(m, "type"); t && (!t->is_string() || *t != "BPE"))
    return error("model.type", "\"" + (t->is_string() ? t->get<std::string>() : t->dump()) +
                                   "\" is not supported (only \"BPE\")");
  const json* v = find(m, "vocab");
  if (!v || !v->is_object()) return error("model.vocab", "expected an object of token -> id");
  int64_t max_id = -1;
  for (auto it = v->begin(); it != v->end(); ++it) {
    if (!it->is_number_integer() || it->get<int64_t>() < 0 || it->get<int64_t>() > INT32_MAX)
      return error("model.vocab[\"" + it.key() + "\"]", "expected an id in [0, 2^31)");
    max_id = std::max<int64_t>(max_id, it->get<int64_t>());
  }
  if (max_id >= static_cast<int64_t>(v->size()) + kMaxIdGap)
    return error("model.vocab", "ids reach " + std::to_string(max_id) + " with only " +
                                    std::to_string(v->size()) + " entries");
  std::vector<const std::string*> by_id(static_cast<size_t>(max_id + 1), nullptr);
  vocab.reserve(v->size());
  for (auto it = v->begin(); it != v->end(); ++it) {
    const auto id = static_cast<int32_t>(it->get<int64_t>());
    if (by_id[id])
      return error("model.vocab", "id " + std::to_string(id) + " is given to both \"" + *by_id[id] +
                                      "\" and \"" + it.key() + "\"");
    by_id[id] = &it.key();
    vocab.emplace(it.key(), id);
  }
  if (const json* d = find(m, "dropout"); d && (!d->is_number() || d->get<double>() != 0.0))
    return error("model.dropout", "BPE dropout is random; only null or 0 is supported");
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    const json* s = find(m, key);
    if (s && (!s->is_string() || !s->get<std::string>().empty()))
      return error(std::string("model.") + key, "a non-empty value is not supported");
  }
  MILES_ASSIGN_OR_RETURN(spec.options.byte_fallback, get_bool(m, "byte_fallback", "model", false));
  MILES_ASSIGN_OR_RETURN(spec.options.ignore_merges, get_bool(m, "ignore_merges", "model", false));
  MILES_ASSIGN_OR_RETURN(spec.options.fuse_unk, get_bool(m, "fuse_unk", "model", false));
  spec.options.byte_level = byte_level;
  if (const json* u = find(m, "unk_token")) {
    if (!u->is_string()) return error("model.unk_token", "expected a string");
    auto it = vocab.find(u->get<std::string>());
    if (it == vocab.end())
      return error("model.unk_token", "\"" + u->get<std::string>() + "\" is not in model.vocab");
    spec.options.unk_id = it->second;
  }
  // Merges: ["a b", ...] (lines starting with "#version" skipped) or [["a", "b"], ...].
  const json* merges = find(m, "merges");
  if (!merges || !merges->is_array()) return error("model.merges", "expected an array");
  spec.merges.reserve(merges->size());
  for (size_t i = 0; i < merges->size(); ++i) {
    const json& e = (*merges)[i];
    const std::string field = "model.merges[" + std::to_string(i) + "]";
    std::string a, b;
    if (e.is_string()) {
      const std::string line = e.get<std::string>();
      if (line.rfind("#version", 0) == 0) continue;
      const size_t sp = line.find(' ');
      if (sp == std::string::npos || line.find(' ', sp + 1) != std::string::npos)
        return error(field, "\"" + line + "\" is not two tokens separated by one space");
      a = line.substr(0, sp);
      b = line.substr(sp + 1);
    } else if (e.is_array() && e.size() == 2 && e[0].is_string() && e[1].is_string()) {
      a = e[0].get<std::string>();
      b = e[1].get<std::string>();
    } else {
      return error(field, "expected \"a b\" or [\"a\", \"b\"]");
    }
    int32_t ids[3];
    const std::string names[3] = {a, b, a + b};
    for (int k = 0; k < 3; ++k) {
      auto it = vocab.find(names[k]);
      if (it == vocab.end())
        return error(field, "token \"" + names[k] + "\" is not in model.vocab");
      ids[k] = it->second;
    }
    spec.merges.push_back({ids[0], ids[1], ids[2]});
  }
  // Per-id text and bytes; the model's own view of each token.
  spec.token_text.assign(static_cast<size_t>(max_id + 1), "");
  spec.token_bytes.assign(static_cast<size_t>(max_id + 1), "");
  spec.model_vocab.reserve(vocab.size());
  for (const auto& [text, id] : vocab) {
    spec.token_text[id] = text;
    std::string bytes;
    const bool mapped = tokenizer::byte_level_decode(text, &bytes);
    if (!byte_level) {
      spec.model_vocab.emplace_back(text, id);
    } else if (mapped) {
      spec.model_vocab.emplace_back(bytes, id);
    }
    spec.token_bytes[id] = mapped && byte_level ? bytes : text;
  }
  return Status::Ok();
}

Status Reader::parse_pattern(const json& p, const std::string& field, std::string* literal,
                             std::shared_ptr<const tokenizer::SplitRegex>* regex) const {
  if (!p.is_object()) return error(field, "expected {\"Regex\": ...} or {\"String\": ...}");
  if (const json* rx = find(p, "Regex")) {
    if (!rx->is_string()) return error(field + ".Regex", "expected a string");
    auto re = tokenizer::SplitRegex::compile(rx->get<std::string>());
    if (!re.ok()) return error(field + ".Regex", re.message());
    *regex = std::move(re).value();
    return Status::Ok();
  }
  if (const json* lit = find(p, "String")) {
    if (!lit->is_string() || lit->get<std::string>().empty())
      return error(field + ".String", "expected a non-empty string");
    *literal = lit->get<std::string>();
    return Status::Ok();
  }
  return error(field, "expected {\"Regex\": ...} or {\"String\": ...}");
}

Result<std::string> Reader::get_char(const json& obj, const char* key,
                                     const std::string& field) const {
  const json* v = find(obj, key);
  if (!v || !v->is_string()) return error(field + "." + key, "expected a string");
  const std::string& c = v->get_ref<const std::string&>();
  uint32_t cp = unicode::kInvalid;
  const int len = c.empty() ? 0 : unicode::decode_utf8(c.data(), c.size(), &cp);
  if (len != static_cast<int>(c.size()) || cp == unicode::kInvalid)
    return error(field + "." + key, "expected one character");
  return c;
}

Status Reader::parse_normalizer(const json& n, const std::string& field,
                                std::vector<tokenizer::NormalizerStep>& steps) const {
  using Kind = tokenizer::NormalizerStep::Kind;
  MILES_ASSIGN_OR_RETURN(const std::string type, type_of(n, field));
  tokenizer::NormalizerStep step;
  if (type == "Sequence") {
    const json* list = find(n, "normalizers");
    if (!list || !list->is_array()) return error(field + ".normalizers", "expected an array");
    for (size_t i = 0; i < list->size(); ++i)
      MILES_RETURN_IF_ERROR(
          parse_normalizer((*list)[i], field + ".normalizers[" + std::to_string(i) + "]", steps));
    return Status::Ok();
  } else if (type == "NFC" || type == "NFD" || type == "NFKC" || type == "NFKD") {
    step.kind = type == "NFC"    ? Kind::kNfc
                : type == "NFD"  ? Kind::kNfd
                : type == "NFKC" ? Kind::kNfkc
                                 : Kind::kNfkd;
  } else if (type == "Lowercase") {
    step.kind = Kind::kLowercase;
  } else if (type == "Replace") {
    step.kind = Kind::kReplace;
    const json* pat = find(n, "pattern");
    if (!pat) return error(field + ".pattern", "missing");
    MILES_RETURN_IF_ERROR(parse_pattern(*pat, field + ".pattern", &step.literal, &step.regex));
    MILES_ASSIGN_OR_RETURN(step.content, get_string(n, "content", field));
  } else if (type == "Prepend") {
    step.kind = Kind::kPrepend;
    MILES_ASSIGN_OR_RETURN(step.literal, get_string(n, "prepend", field));
  } else if (type == "Strip") {
    step.kind = Kind::kStrip;
    MILES_ASSIGN_OR_RETURN(step.strip_left, get_bool(n, "strip_left", field, false));
    MILES_ASSIGN_OR_RETURN(step.strip_right, get_bool(n, "strip_right", field, false));
  } else {
    return error(field + ".type",
                 "normalizer \"" + type +
                     "\" is not supported (NFC, NFD, NFKC, NFKD, Lowercase, Replace, Prepend, "
                     "Strip, Sequence)");
  }
  steps.push_back(std::move(step));
  return Status::Ok();
}

Status Reader::parse_pre_tokenizer(const json& p, const std::string& field,
                                   std::vector<PreTokenizerStep>& steps) const {
  MILES_ASSIGN_OR_RETURN(const std::string type, type_of(p, field));
  PreTokenizerStep step;
  if (type == "Sequence") {
    const json* list = find(p, "pretokenizers");
    if (!list || !list->is_array()) return error(field + ".pretokenizers", "expected an array");
    for (size_t i = 0; i < list->size(); ++i)
      MILES_RETURN_IF_ERROR(parse_pre_tokenizer(
          (*list)[i], field + ".pretokenizers[" + std::to_string(i) + "]", steps));
    return Status::Ok();
  }
  if (type == "ByteLevel") {
    step.kind = PreTokenizerStep::Kind::kByteLevel;
    MILES_ASSIGN_OR_RETURN(step.add_prefix_space, get_bool(p, "add_prefix_space", field, true));
    MILES_ASSIGN_OR_RETURN(step.use_regex, get_bool(p, "use_regex", field, true));
  } else if (type == "Digits") {
    step.kind = PreTokenizerStep::Kind::kDigits;
    MILES_ASSIGN_OR_RETURN(step.individual_digits, get_bool(p, "individual_digits", field, false));
  } else if (type == "Metaspace") {
    step.kind = PreTokenizerStep::Kind::kMetaspace;
    MILES_ASSIGN_OR_RETURN(step.literal, get_char(p, "replacement", field));
    MILES_ASSIGN_OR_RETURN(step.split, get_bool(p, "split", field, true));
    if (const json* scheme = find(p, "prepend_scheme")) {
      const std::string v = scheme->is_string() ? scheme->get<std::string>() : "";
      if (v == "always") {
        step.prepend = tokenizer::PrependScheme::kAlways;
      } else if (v == "first") {
        step.prepend = tokenizer::PrependScheme::kFirst;
      } else if (v == "never") {
        step.prepend = tokenizer::PrependScheme::kNever;
      } else {
        return error(field + ".prepend_scheme", "expected \"always\", \"first\" or \"never\"");
      }
    } else {  // files older than prepend_scheme: add_prefix_space
      MILES_ASSIGN_OR_RETURN(const bool add, get_bool(p, "add_prefix_space", field, true));
      step.prepend = add ? tokenizer::PrependScheme::kAlways : tokenizer::PrependScheme::kNever;
    }
  } else if (type == "Whitespace") {
    step.kind = PreTokenizerStep::Kind::kWhitespace;
  } else if (type == "WhitespaceSplit") {
    step.kind = PreTokenizerStep::Kind::kWhitespaceSplit;
  } else if (type == "Punctuation") {
    step.kind = PreTokenizerStep::Kind::kPunctuation;
    step.behavior = SplitBehavior::kIsolated;
    if (find(p, "behavior")) {
      MILES_ASSIGN_OR_RETURN(const std::string behavior, get_string(p, "behavior", field));
      auto b = behavior_from(behavior);
      if (!b.ok()) return error(field + ".behavior", b.message());
      step.behavior = *b;
    }
  } else if (type == "BertPreTokenizer") {  // HF: whitespace split, then punctuation isolated
    step.kind = PreTokenizerStep::Kind::kWhitespaceSplit;
    steps.push_back(step);
    step.kind = PreTokenizerStep::Kind::kPunctuation;
    step.behavior = SplitBehavior::kIsolated;
  } else if (type == "CharDelimiterSplit") {
    step.kind = PreTokenizerStep::Kind::kSplitString;
    MILES_ASSIGN_OR_RETURN(step.literal, get_char(p, "delimiter", field));
    step.behavior = SplitBehavior::kRemoved;
  } else if (type == "Split") {
    const json* pat = find(p, "pattern");
    if (!pat) return error(field + ".pattern", "missing");
    MILES_RETURN_IF_ERROR(parse_pattern(*pat, field + ".pattern", &step.literal, &step.regex));
    step.kind =
        step.regex ? PreTokenizerStep::Kind::kSplitRegex : PreTokenizerStep::Kind::kSplitString;
    MILES_ASSIGN_OR_RETURN(const std::string behavior, get_string(p, "behavior", field));
    auto b = behavior_from(behavior);
    if (!b.ok()) return error(field + ".behavior", b.message());
    step.behavior = *b;
    MILES_ASSIGN_OR_RETURN(step.invert, get_bool(p, "invert", field, false));
  } else {
    return error(field + ".type",
                 "pre-tokenizer \"" + type +
                     "\" is not supported (Sequence, Split, ByteLevel, Digits, Metaspace, "
                     "Whitespace, WhitespaceSplit, Punctuation, BertPreTokenizer, "
                     "CharDelimiterSplit)");
  }
  steps.push_back(std::move(step));
  return Status::Ok();
}

Status Reader::parse_decoder(const json& d, const std::string& field,
                             std::vector<tokenizer::DecoderStep>& steps, bool* byte_level) const {
  using Kind = tokenizer::DecoderStep::Kind;
  MILES_ASSIGN_OR_RETURN(const std::string type, type_of(d, field));
  tokenizer::DecoderStep step;
  if (type == "Sequence") {
    const json* list = find(d, "decoders");
    if (!list || !list->is_array()) return error(field + ".decoders", "expected an array");
    for (size_t i = 0; i < list->size(); ++i)
      MILES_RETURN_IF_ERROR(parse_decoder(
          (*list)[i], field + ".decoders[" + std::to_string(i) + "]", steps, byte_level));
    return Status::Ok();
  }
  if (type == "ByteLevel") {
    *byte_level = true;
    return Status::Ok();
  }
  if (type == "Replace") {
    step.kind = Kind::kReplace;
    const json* pat = find(d, "pattern");
    if (!pat) return error(field + ".pattern", "missing");
    std::shared_ptr<const tokenizer::SplitRegex> regex;
    MILES_RETURN_IF_ERROR(parse_pattern(*pat, field + ".pattern", &step.from, &regex));
    if (regex) return error(field + ".pattern.Regex", "a Regex pattern is not supported here");
    MILES_ASSIGN_OR_RETURN(step.to, get_string(d, "content", field));
  } else if (type == "ByteFallback") {
    step.kind = Kind::kByteFallback;
  } else if (type == "Fuse") {
    step.kind = Kind::kFuse;
  } else if (type == "Strip") {
    step.kind = Kind::kStrip;
    MILES_ASSIGN_OR_RETURN(step.from, get_char(d, "content", field));
    for (auto [key, out] : {std::pair{"start", &step.start}, std::pair{"stop", &step.stop}}) {
      const json* v = find(d, key);
      if (!v || !v->is_number_integer() || v->get<int64_t>() < 0 || v->get<int64_t>() > 64)
        return error(field + "." + key, "expected a count in [0, 64]");
      *out = static_cast<int>(v->get<int64_t>());
    }
  } else if (type == "Metaspace") {
    step.kind = Kind::kMetaspace;
    MILES_ASSIGN_OR_RETURN(step.replacement, get_char(d, "replacement", field));
    if (const json* scheme = find(d, "prepend_scheme")) {
      if (!scheme->is_string() || (*scheme != "always" && *scheme != "first" && *scheme != "never"))
        return error(field + ".prepend_scheme", "expected \"always\", \"first\" or \"never\"");
      step.prepend = *scheme != "never";
    } else {
      MILES_ASSIGN_OR_RETURN(step.prepend, get_bool(d, "add_prefix_space", field, true));
    }
  } else {
    return error(field + ".type", "decoder \"" + type +
                                      "\" is not supported (ByteLevel, Replace, ByteFallback, "
                                      "Fuse, Strip, Metaspace, Sequence)");
  }
  // The shapes decode_token runs exactly: per-token steps, one Fuse, then only a Strip of at most
  // one leading character; never mixed with ByteLevel.
  bool fused = false;
  for (const tokenizer::DecoderStep& s : steps) fused = fused || s.kind == Kind::kFuse;
  if (fused && step.kind == Kind::kFuse) return error(field, "a second Fuse is not supported");
  if (fused && step.kind != Kind::kStrip)
    return error(field, "a " + type + " decoder after Fuse is not supported");
  if (fused && (step.start > 1 || step.stop != 0))
    return error(field, "Strip after Fuse is supported with start <= 1 and stop 0 only");
  steps.push_back(std::move(step));
  return Status::Ok();
}

// ["<s>", 1] as Roberta / Bert post-processors spell a special token.
Result<int32_t> Reader::special_id(const json& pair, const std::string& field) const {
  if (!pair.is_array() || pair.size() != 2 || !pair[1].is_number_integer() ||
      pair[1].get<int64_t>() < 0 || pair[1].get<int64_t>() > INT32_MAX)
    return error(field, "expected [\"token\", id]");
  return static_cast<int32_t>(pair[1].get<int64_t>());
}

Status Reader::parse_post_processor(const json& p, const std::string& field,
                                    tokenizer::BpeTokenizerSpec& spec) const {
  MILES_ASSIGN_OR_RETURN(const std::string type, type_of(p, field));
  if (type == "ByteLevel") return Status::Ok();  // offsets only
  if (type == "Sequence") {
    const json* list = find(p, "processors");
    if (!list || !list->is_array()) return error(field + ".processors", "expected an array");
    for (size_t i = 0; i < list->size(); ++i)
      MILES_RETURN_IF_ERROR(
          parse_post_processor((*list)[i], field + ".processors[" + std::to_string(i) + "]", spec));
    return Status::Ok();
  }
  if (type == "RobertaProcessing" || type == "BertProcessing") {
    const json* cls = find(p, "cls");
    const json* sep = find(p, "sep");
    if (!cls || !sep) return error(field, "expected \"cls\" and \"sep\"");
    MILES_ASSIGN_OR_RETURN(const int32_t c, special_id(*cls, field + ".cls"));
    MILES_ASSIGN_OR_RETURN(const int32_t s, special_id(*sep, field + ".sep"));
    spec.prefix.push_back(c);
    spec.suffix.insert(spec.suffix.begin(), s);
    return Status::Ok();
  }
  if (type != "TemplateProcessing")
    return error(field + ".type", "post-processor \"" + type + "\" is not supported");
  const json* single = find(p, "single");
  const json* specials = find(p, "special_tokens");
  if (!single || !single->is_array()) return error(field + ".single", "expected an array");
  std::vector<int32_t> before, after;
  bool seen_sequence = false;
  for (size_t i = 0; i < single->size(); ++i) {
    const json& piece = (*single)[i];
    const std::string f = field + ".single[" + std::to_string(i) + "]";
    if (piece.is_object() && find(piece, "Sequence")) {
      seen_sequence = true;
      continue;
    }
    const json* st = piece.is_object() ? find(piece, "SpecialToken") : nullptr;
    if (!st || !st->is_object()) return error(f, "expected {\"Sequence\"} or {\"SpecialToken\"}");
    MILES_ASSIGN_OR_RETURN(const std::string name, get_string(*st, "id", f + ".SpecialToken"));
    const json* entry = specials && specials->is_object() ? find(*specials, name.c_str()) : nullptr;
    const json* ids = entry && entry->is_object() ? find(*entry, "ids") : nullptr;
    if (!ids || !ids->is_array())
      return error(field + ".special_tokens", "no ids for \"" + name + "\"");
    for (const json& id : *ids) {
      if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() > INT32_MAX)
        return error(field + ".special_tokens[\"" + name + "\"].ids", "expected ids");
      (seen_sequence ? after : before).push_back(static_cast<int32_t>(id.get<int64_t>()));
    }
  }
  spec.prefix.insert(spec.prefix.end(), before.begin(), before.end());
  spec.suffix.insert(spec.suffix.begin(), after.begin(), after.end());
  return Status::Ok();
}

Status Reader::parse_added_tokens(const json& a,
                                  const std::unordered_map<std::string, int32_t>& vocab,
                                  tokenizer::BpeTokenizerSpec& spec) const {
  if (!a.is_array()) return error("added_tokens", "expected an array");
  std::unordered_map<std::string, int32_t> added;  // content -> id
  std::unordered_map<int32_t, size_t> slot;        // id -> index in spec.added_tokens
  int64_t next_id = static_cast<int64_t>(vocab.size());
  for (size_t i = 0; i < a.size(); ++i) {
    const json& t = a[i];
    const std::string field = "added_tokens[" + std::to_string(i) + "]";
    if (!t.is_object()) return error(field, "expected an object");
    const json* id = find(t, "id");
    if (!id || !id->is_number_integer() || id->get<int64_t>() < 0 || id->get<int64_t>() > INT32_MAX)
      return error(field + ".id", "expected an id in [0, 2^31)");
    tokenizer::AddedToken tok;
    MILES_ASSIGN_OR_RETURN(tok.content, get_string(t, "content", field));
    MILES_ASSIGN_OR_RETURN(tok.special, get_bool(t, "special", field, false));
    MILES_ASSIGN_OR_RETURN(tok.single_word, get_bool(t, "single_word", field, false));
    MILES_ASSIGN_OR_RETURN(tok.lstrip, get_bool(t, "lstrip", field, false));
    MILES_ASSIGN_OR_RETURN(tok.rstrip, get_bool(t, "rstrip", field, false));
    MILES_ASSIGN_OR_RETURN(tok.normalized, get_bool(t, "normalized", field, !tok.special));
    if (tok.content.empty()) continue;  // HF ignores empty tokens
    const std::string content = tok.content;
    if (auto it = added.find(content); it != added.end()) {
      tok.id = it->second;
    } else if (auto v = vocab.find(content); v != vocab.end()) {
      tok.id = v->second;
    } else {
      if (next_id > INT32_MAX) return error(field, "too many added tokens");
      tok.id = static_cast<int32_t>(next_id++);
    }
    next_id = std::max<int64_t>(next_id, int64_t{tok.id} + 1);
    added[content] = tok.id;
    if (tok.normalized && !spec.normalizer.empty()) {  // HF matches (and decodes) it normalized
      std::string buffer;
      tok.content = std::string(spec.normalizer.run(content, buffer));
    }
    if (auto s = slot.find(tok.id); s != slot.end()) {
      spec.added_tokens[s->second] = tok;  // the last definition of an id wins
    } else {
      slot.emplace(tok.id, spec.added_tokens.size());
      spec.added_tokens.push_back(tok);
    }
  }
  const int64_t max_id = next_id - 1;
  if (max_id >= static_cast<int64_t>(spec.token_text.size()) + kMaxIdGap)
    return error("added_tokens", "ids reach " + std::to_string(max_id));
  if (max_id >= static_cast<int64_t>(spec.token_text.size())) {
    spec.token_text.resize(static_cast<size_t>(max_id + 1));
    spec.token_bytes.resize(static_cast<size_t>(max_id + 1));
  }
  for (const tokenizer::AddedToken& t : spec.added_tokens) {
    spec.token_text[t.id] = t.content;
    spec.token_bytes[t.id] = t.content;  // the text it matched, exactly
  }
  return Status::Ok();
}

bool has_byte_level(const json& pre) {
  if (!pre.is_object()) return false;
  auto t = pre.find("type");
  if (t == pre.end() || !t->is_string()) return false;
  if (*t == "ByteLevel") return true;
  auto list = pre.find("pretokenizers");
  if (*t == "Sequence" && list != pre.end() && list->is_array())
    for (const json& p : *list)
      if (has_byte_level(p)) return true;
  return false;
}

// bos_token / eos_token of a tokenizer_config.json ("<s>" or {"content": "<s>"}): the id, or -1.
int32_t config_token_id(const json& config, const char* key, const tokenizer::BpeTokenizerSpec& s,
                        const std::unordered_map<std::string, int32_t>& vocab) {
  const json* v = Reader::find(config, key);
  if (v && v->is_object()) v = Reader::find(*v, "content");
  if (!v || !v->is_string()) return -1;
  const std::string name = v->get<std::string>();
  for (const tokenizer::AddedToken& t : s.added_tokens)
    if (t.content == name) return t.id;
  auto it = vocab.find(name);
  return it == vocab.end() ? -1 : it->second;
}

Result<std::unique_ptr<Tokenizer>> parse_with_config(std::string_view text,
                                                     const std::string& source,
                                                     const json* config) {
  const Reader r(source);
  auto parsed = parse_json_text(text);
  if (!parsed.ok()) return Status::Error(source + ": not valid JSON: " + parsed.message());
  const json& j = *parsed;
  if (!j.is_object()) return r.error("(top level)", "expected an object");
  tokenizer::BpeTokenizerSpec spec;
  const json* model = Reader::find(j, "model");
  if (!model) return r.error("model", "missing");
  const json* pre = Reader::find(j, "pre_tokenizer");
  const bool byte_level = pre && has_byte_level(*pre);
  std::unordered_map<std::string, int32_t> vocab;
  MILES_RETURN_IF_ERROR(r.parse_model(*model, spec, vocab, byte_level));
  if (const json* n = Reader::find(j, "normalizer")) {
    std::vector<tokenizer::NormalizerStep> steps;
    MILES_RETURN_IF_ERROR(r.parse_normalizer(*n, "normalizer", steps));
    spec.normalizer = tokenizer::Normalizer(std::move(steps));
  }
  if (pre) MILES_RETURN_IF_ERROR(r.parse_pre_tokenizer(*pre, "pre_tokenizer", spec.pre_tokenizer));
  if (const json* p = Reader::find(j, "post_processor"))
    MILES_RETURN_IF_ERROR(r.parse_post_processor(*p, "post_processor", spec));
  std::vector<tokenizer::DecoderStep> decoder;
  if (const json* d = Reader::find(j, "decoder")) {
    bool byte_level_decoder = false;
    MILES_RETURN_IF_ERROR(r.parse_decoder(*d, "decoder", decoder, &byte_level_decoder));
    if (byte_level_decoder && !decoder.empty())
      return r.error("decoder", "ByteLevel together with other decoders is not supported");
  }
  if (const json* a = Reader::find(j, "added_tokens"))
    MILES_RETURN_IF_ERROR(r.parse_added_tokens(*a, vocab, spec));
  if (!decoder.empty()) {  // every id's bytes through the chain (added tokens too, as HF)
    bool first_differs = false;
    for (const tokenizer::DecoderStep& s : decoder)
      first_differs = first_differs || s.kind == tokenizer::DecoderStep::Kind::kStrip ||
                      (s.kind == tokenizer::DecoderStep::Kind::kMetaspace && s.prepend);
    for (size_t id = 0; id < spec.token_text.size(); ++id) {
      spec.token_bytes[id] = tokenizer::decode_token(decoder, spec.token_text[id], false);
      if (first_differs)
        spec.first_token_bytes.push_back(
            tokenizer::decode_token(decoder, spec.token_text[id], true));
    }
  }
  const auto n = static_cast<int64_t>(spec.token_text.size());
  for (const int32_t id : spec.prefix)
    if (id >= n) return r.error("post_processor", "token id " + std::to_string(id) + " is unknown");
  for (const int32_t id : spec.suffix)
    if (id >= n) return r.error("post_processor", "token id " + std::to_string(id) + " is unknown");
  if (!spec.prefix.empty()) spec.bos_id = spec.prefix.front();
  if (!spec.suffix.empty()) spec.eos_id = spec.suffix.back();
  if (config && config->is_object()) {
    if (spec.bos_id < 0) spec.bos_id = config_token_id(*config, "bos_token", spec, vocab);
    if (spec.eos_id < 0) spec.eos_id = config_token_id(*config, "eos_token", spec, vocab);
  }
  return tokenizer::make_bpe_tokenizer(std::move(spec));
}

bool read_file(const std::string& path, std::string* out) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return false;
  std::ostringstream text;
  text << f.rdbuf();
  *out = text.str();
  return true;
}

}  // namespace

Result<std::unique_ptr<Tokenizer>> parse_hf_tokenizer(std::string_view text,
                                                      const std::string& source) {
  return parse_with_config(text, source, nullptr);
}

// tokenizer_config.json beside the file, when present and valid, names BOS and EOS (HF's
// post-processor often adds neither: Qwen3's EOS <|im_end|> is known only from there).
Result<std::unique_ptr<Tokenizer>> load_hf_tokenizer(const std::string& path) {
  std::string text, config_text;
  if (!read_file(path, &text)) return Status::Error(path + ": cannot open tokenizer file");
  const std::filesystem::path config_path =
      std::filesystem::path(path).parent_path() / "tokenizer_config.json";
  json config;
  if (read_file(config_path.string(), &config_text)) config = parse_json_or_discarded(config_text);
  return parse_with_config(text, path, config.is_discarded() ? nullptr : &config);
}

}  // namespace miles

// llama.cpp's pre-tokenizers as data: every tokenizer.ggml.pre name llama.cpp's vocabulary loader
// (llama-vocab.cpp as vendored by llama-cpp-python 0.3.36) knows, mapped to the regexes its BPE
// tokenizer splits with and the options the name sets (see gguf_pre_tokenizer.h).
//
// Where llama.cpp quotes the model's original tokenizer.json regex beside an "adapted" one
// (rewritten for std::regex: (?i:...) spelled as [sS] classes, possessive quantifiers made greedy),
// the table holds the original: it is what the model was trained with, and it is what HF
// `tokenizers` runs. llama.cpp's GPT-2 regex lacks the final `|\s+` of the original; split as
// llama.cpp splits (a whitespace code point no alternative matches becomes a piece of its own) the
// two cut every text the same way, so the table holds the original, which has a scanner. DBRX,
// Smaug and ChatGLM-4 get the Llama-3 regex (llama.cpp spells only its adapted form for them).
// Names that share a definition share its array.
#include "tokenizer/gguf_pre_tokenizer.h"

#include <span>
#include <string>

namespace miles::tokenizer {
namespace {

constexpr std::string_view kDefault[] = {
    R"re([\p{P}\$\+<=>\^~\|]+)re",
    R"re('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)re",
    R"re(\p{N}+)re",
    R"re([0-9][0-9][0-9])re",
};
constexpr std::string_view kMinicpm5[] = {
    R"re(\p{N}{1,3})re",
    R"re((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}+| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)re",
};
constexpr std::string_view kLlama3[] = {
    R"re((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)re",
};
constexpr std::string_view kDeepseekLlm[] = {
    R"re([\r\n])re",
    R"re(\s?[A-Za-zµÀ-ÖØ-öø-ƺƼ-ƿǄ-ʓʕ-ʯͰ-ͳͶͷͻ-ͽͿΆΈ-ΊΌΎ-ΡΣ-ϵϷ-ҁҊ-ԯԱ-ՖႠ-ჅᎠ-Ᏽᏸ-ᏽᲐ-ᲺᲽ-Ჿᴀ-ᴫᵫ-ᵷᵹ-ᶚḀ-ἕἘ-Ἕἠ-ὅὈ-Ὅὐ-ὗὙὛὝὟ-ώᾀ-ᾴᾶ-ᾼιῂ-ῄῆ-ῌῐ-ΐῖ-Ίῠ-Ῥῲ-ῴῶ-ῼℂℇℊ-ℓℕℙ-ℝℤΩℨK-ℭℯ-ℴℹℼ-ℿⅅ-ⅉⅎↃↄⰀ-ⱻⱾ-ⳤⳫ-ⳮⳲⳳꙀ-ꙭꚀ-ꚛꜢ-ꝯꝱ-ꞇꞋ-ꞎꭰ-ꮿﬀ-ﬆﬓ-ﬗＡ-Ｚａ-ｚ𐐀-𐑏𐒰-𐓓𐓘-𐓻𐲀-𐲲𐳀-𐳲𑢠-𑣟𞤀-𞥃]+)re",
    R"re(\s?[!-/:-~！-／：-～‘-‟　-。]+)re",
    R"re(\s+$)re",
    R"re([一-龥ࠀ-一가-퟿]+)re",
    R"re(\p{N}+)re",
};
constexpr std::string_view kDeepseekCoder[] = {
    R"re([\r\n])re", R"re(\s?\p{L}+)re", R"re(\s?\p{P}+)re", R"re([一-龥ࠀ-一가-퟿]+)re",
    R"re(\p{N})re",
};
constexpr std::string_view kDeepseek3Llm[] = {
    R"re(\p{N}{1,3})re",
    R"re([一-龥぀-ゟ゠-ヿ]+)re",
    R"re([!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)re",
};
constexpr std::string_view kSpark25[] = {
    R"re(\p{N}{1,3})re",
    R"re([一-龥぀-ゟ゠-ヿ]+)re",
    R"re([!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+|[\r\n]|\s+(?!\S)|\s+)re",
    R"re(\p{N})re",
};
constexpr std::string_view kYoutu[] = {
    R"re([가-힣ㄱ-ㆎ]+|[！…“”‘’—：；，、-〿︰-﹏]+|[ㄅ-ㄯ]+|[一-龥぀-ゟ゠-ヿ]+)re",
    R"re([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)re",
};
constexpr std::string_view kFalcon[] = {
    R"re([\p{P}\$\+<=>\^~\|`]+)re",
    R"re('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)re",
    R"re([0-9][0-9][0-9])re",
};
constexpr std::string_view kGpt2[] = {
    R"re('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)re",
};
constexpr std::string_view kStarcoder[] = {
    R"re(\p{N})re",
    R"re('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)re",
};
constexpr std::string_view kJais2[] = {
    R"re((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s{512}(?!\S)|\s{256}(?!\S)|\s{128}(?!\S)|\s{64}(?!\S)|\s{32}(?!\S)|\s{16}(?!\S)|\s{8}(?!\S)|\s{4}(?!\S)|\s{1,2}(?!\S)|\s{1})re",
};
constexpr std::string_view kQwen2[] = {
    R"re((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)re",
};
constexpr std::string_view kQwen35[] = {
    R"re((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)re",
};
constexpr std::string_view kPoro[] = {
    R"re( ?[^(\s|.,!?…。，、।۔،)]+)re",
};
constexpr std::string_view kViking[] = {
    R"re( ?[^(\s|.,!?…。，、।۔،)]+)re",
    R"re(\p{N})re",
};
constexpr std::string_view kTekken[] = {
    R"re([^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+|[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)re",
};
constexpr std::string_view kExaoneMoe[] = {
    R"re((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?(?:\p{L}\p{M}*(?: \p{L}\p{M}*)*)+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]?|\s*[\r\n]|\s+(?!\S)|\s+)re",
};
constexpr std::string_view kChameleon[] = {
    R"re(<sentinel:[0-9]+>)re",
    R"re((IMGIMG)((A|B|C|D|E|F|G|H|I){1,4})Z)re",
    R"re(([\t\n]|    |  ))re",
    R"re(\p{N})re",
    R"re([\p{P}!-/:-@\[-`{-~])re",
    R"re('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)re",
};
constexpr std::string_view kGpt4o[] = {
    R"re([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)re",
};
constexpr std::string_view kGraniteEmbMulti[] = {
    R"re([^\r\n\p{L}\p{N}]?((?=[\p{L}\p{M}])([^a-z]))*((?=[\p{L}\p{M}])([^A-Z]))+(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|[^\r\n\p{L}\p{N}]?((?=[\p{L}\p{M}])([^a-z]))+((?=[\p{L}\p{M}])([^A-Z]))*(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)re",
};
constexpr std::string_view kTinyAya[] = {
    R"re(\d{1,3}(?=(?:\d{3})*\b))re",
    R"re([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)re",
};
constexpr std::string_view kSuperbpe[] = {
    R"re(\p{N}+)re",
    R"re((?=(\d{3})+(?!\d)))re",
};
constexpr std::string_view kBailingmoe[] = {
    R"re('(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]++[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+)re",
};
constexpr std::string_view kSeedCoder[] = {
    R"re((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1}| ?[^\s\p{L}\p{N}\r\n]+|\s*[\r\n]+|\s+(?!\S)|\s+)re",
};
constexpr std::string_view kUfakzeka[] = {
    R"re([^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)re",
};
constexpr std::string_view kLaguna[] = {
    R"re([^\n]+|[\n]+)re",
    R"re((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)re",
};

constexpr std::string_view kLines[] = {R"re([^\n]+|[\n]+)re"};

// How an escaped-spaces (SentencePiece-style) BPE name works; kNo for byte-level BPE.
enum class Escaped { kNo, kYes, kYesNewlineWords };

struct Entry {
  std::string_view name;
  std::span<const std::string_view> regexes;  // empty: refused
  bool ignore_merges, add_bos;
  std::string_view refusal;
  Escaped escaped = Escaped::kNo;
};

const Entry kEntries[] = {
    {"default", kDefault, false, false, {}},
    {"minicpm5", kMinicpm5, true, false, {}},
    {"llama3", kLlama3, true, true, {}},
    {"llama-v3", kLlama3, true, true, {}},
    {"llama-bpe", kLlama3, true, true, {}},
    {"falcon3", kLlama3, true, true, {}},
    {"falcon-h1", kLlama3, true, true, {}},
    {"pixtral", kLlama3, true, true, {}},
    {"midm-2.0", kLlama3, true, true, {}},
    {"lfm2", kLlama3, true, true, {}},
    {"jina-v5-nano", kLlama3, true, true, {}},
    {"deepseek-llm", kDeepseekLlm, false, false, {}},
    {"deepseek-coder", kDeepseekCoder, false, false, {}},
    {"deepseek-v3", kDeepseek3Llm, false, false, {}},
    {"spark2_5", kSpark25, false, false, {}},
    {"youtu", kYoutu, true, false, {}},
    {"falcon", kFalcon, false, false, {}},
    {"mpt", kGpt2, false, false, {}},
    {"starcoder", kStarcoder, false, false, {}},
    {"gpt-2", kGpt2, false, false, {}},
    {"phi-2", kGpt2, false, false, {}},
    {"jina-es", kGpt2, false, false, {}},
    {"jina-de", kGpt2, false, false, {}},
    {"gigachat", kGpt2, false, false, {}},
    {"jina-v2-es", kGpt2, false, false, {}},
    {"jina-v2-de", kGpt2, false, false, {}},
    {"a.x-4.0", kGpt2, false, false, {}},
    {"mellum", kGpt2, false, false, {}},
    {"modern-bert", kGpt2, false, false, {}},
    {"exaone4", kGpt2, false, false, {}},
    {"jais-2", kJais2, false, false, {}},
    {"refact", kStarcoder, false, false, {}},
    {"command-r", kStarcoder, false, false, {}},
    {"qwen2", kQwen2, false, false, {}},
    {"deepseek-r1-qwen", kQwen2, false, false, {}},
    {"kormo", kQwen2, false, false, {}},
    {"f2llmv2", kQwen2, false, false, {}},
    {"megrez", kQwen2, false, false, {}},
    {"qwen35", kQwen35, false, false, {}},
    {"stablelm2", kQwen2, false, false, {}},
    {"olmo", kGpt2, false, false, {}},
    {"dbrx", kLlama3, false, false, {}},
    {"smaug-bpe", kLlama3, false, false, {}},
    {"poro-chat", kPoro, false, false, {}},
    {"chatglm-bpe", kLlama3, false, false, {}},
    {"glm4", kLlama3, true, false, {}},
    {"glm5", kLlama3, true, false, {}},
    {"viking", kViking, false, false, {}},
    {"jais", kGpt2, false, false, {}},
    {"tekken", kTekken, true, true, {}},
    {"smollm", kStarcoder, false, false, {}},
    {"codeshell", kStarcoder, false, false, {}},
    {"bloom", kPoro, false, false, {}},
    {"gpt3-finnish", kPoro, false, false, {}},
    {"exaone", kStarcoder, false, false, {}},
    {"exaone-moe", kExaoneMoe, false, false, {}},
    {"chameleon", kChameleon, false, true, {}},
    {"minerva-7b", kStarcoder, false, false, {}},
    {"gpt-4o", kGpt4o, false, false, {}},
    {"llama4", kGpt4o, false, false, {}},
    {"kanana2", kGpt4o, false, false, {}},
    {"talkie", kGpt4o, false, false, {}},
    {"granite-embed-multi-97m", kGraniteEmbMulti, true, false, {}},
    {"tiny_aya", kTinyAya, false, false, {}},
    {"cohere2moe", kTinyAya, false, false, {}},
    {"superbpe", kSuperbpe, false, false, {}},
    {"trillion", kGpt2, false, false, {}},
    {"granite-docling", kGpt2, false, false, {}},
    {"bailingmoe", kBailingmoe, false, false, {}},
    {"bailingmoe2", kBailingmoe, false, false, {}},
    {"llada-moe", kBailingmoe, false, false, {}},
    {"seed-coder", kSeedCoder, false, false, {}},
    {"hunyuan", kQwen2, false, false, {}},
    {"hunyuan-dense", kDeepseek3Llm, false, false, {}},
    {"hy_v4", kDeepseek3Llm, false, false, {}},
    {"joyai-llm", kDeepseek3Llm, false, false, {}},
    {"ufakzeka", kUfakzeka, false, false, {}},
    {"grok-2", kQwen2, false, false, {}},
    {"laguna", kLaguna, false, false, {}},
    {"minimax-m2", kGpt4o, false, false, {}},
    {"solar-open", kQwen2, false, false, {}},
    {"mellum2", kStarcoder, false, false, {}},
    {"kimi-k2",
     {},
     false,
     false,
     "llama.cpp splits it with hand-written code (unicode.cpp), not a regex"},
    {"afmoe",
     {},
     false,
     false,
     "llama.cpp splits its digits with hand-written code (unicode.cpp), not a regex"},
    {"gemma4", kLines, false, false, {}, Escaped::kYesNewlineWords},
    {"granite-embed-multi-311m", kLines, false, false, {}, Escaped::kYesNewlineWords},
    {"sarvam-moe", kLines, false, false, {}, Escaped::kYes},
    {"whitespace",
     {},
     false,
     false,
     "llama.cpp tokenizes it with a session of its own (whitespace dropped, optional lowercasing), "
     "not implemented"},
    // llama.cpp also sets add_sep for these embedding vocabularies; its tokenizer never appends
    // SEP to BPE text (its embedding and rerank callers do), so the ids are the GPT-2 ones.
    {"jina-v1-en", kGpt2, false, false, {}},
    {"jina-v2-code", kGpt2, false, false, {}},
    {"roberta-bpe", kGpt2, false, false, {}},
};

}  // namespace

Result<GgufPreTokenizer> gguf_pre_tokenizer(std::string_view name) {
  if (name.empty()) name = "default";  // llama.cpp: a missing name means "default"
  for (const Entry& e : kEntries) {
    if (e.name != name) continue;
    if (e.regexes.empty())
      return Status::Error("pre-tokenizer \"" + std::string(name) +
                           "\" is not supported: " + std::string(e.refusal));
    return GgufPreTokenizer{{e.regexes.begin(), e.regexes.end()},
                            e.ignore_merges,
                            e.add_bos,
                            e.escaped != Escaped::kNo,
                            e.escaped == Escaped::kYesNewlineWords};
  }
  return Status::Error("pre-tokenizer \"" + std::string(name) + "\" is unknown to llama.cpp");
}

std::vector<std::string_view> gguf_pre_tokenizer_names() {
  std::vector<std::string_view> names;
  for (const Entry& e : kEntries) names.push_back(e.name);
  return names;
}

}  // namespace miles::tokenizer

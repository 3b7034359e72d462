// Pre-tokenization: cutting normalized text into the words that BPE encodes one by one.
//
// Why its own piece: HF composes pre-tokenizers (Sequence of Split, ByteLevel, Digits, Metaspace,
// Punctuation, Whitespace, ...), each
// cutting every piece the previous one produced, with a "behavior" deciding what happens to the
// delimiters. PreTokenizer reproduces that composition exactly and streams the final pieces to a
// callback, without materialising the intermediate lists for the whole text.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/regex.h"

namespace miles::tokenizer {

// HF's SplitDelimiterBehavior.
enum class SplitBehavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };

// HF's Metaspace PrependScheme: when the replacement is put in front of a piece.
enum class PrependScheme { kAlways, kFirst, kNever };

struct PreTokenizerStep {
  enum class Kind {
    kSplitRegex,
    kSplitString,
    kByteLevel,
    kDigits,
    kMetaspace,        // spaces become `literal`, prepended as `prepend`, split before each one
    kWhitespace,       // runs of \w and runs of [^\w\s] (HF's \w+|[^\w\s]+), whitespace dropped
    kWhitespaceSplit,  // runs of non-whitespace, whitespace dropped
    kPunctuation,      // each punctuation code point a delimiter, cut with `behavior`
  };
  Kind kind = Kind::kSplitRegex;
  std::shared_ptr<const SplitRegex> regex;  // kSplitRegex
  std::string literal;  // kSplitString: the delimiter (non-empty); kMetaspace: the replacement
  SplitBehavior behavior = SplitBehavior::kIsolated;  // kSplitRegex, kSplitString
  bool invert = false;                                // kSplitRegex, kSplitString
  bool add_prefix_space = false;                      // kByteLevel
  bool use_regex = true;                              // kByteLevel: split with the GPT-2 pattern
  bool individual_digits = false;                     // kDigits: each digit alone (else runs)
  PrependScheme prepend = PrependScheme::kAlways;     // kMetaspace
  bool split = true;                                  // kMetaspace: cut before each replacement
};

// A callable taking one piece (a reference to a callable that outlives the call).
class PieceSink {
 public:
  template <typename F>
  PieceSink(F& f)  // NOLINT(google-explicit-constructor)
      : obj_(&f), call_([](void* o, std::string_view s) { (*static_cast<F*>(o))(s); }) {}
  void operator()(std::string_view s) const { call_(obj_, s); }

 private:
  void* obj_;
  void (*call_)(void*, std::string_view);
};

class PreTokenizer {
 public:
  PreTokenizer() = default;
  explicit PreTokenizer(std::vector<PreTokenizerStep> steps) : steps_(std::move(steps)) {}

  // Calls sink on every non-empty piece of `text`, in order. A piece points into `text` or into
  // a buffer that lives until sink returns. `at_start`: the text starts the input (HF: its
  // original offset is 0), which Metaspace's PrependScheme kFirst asks.
  void run(std::string_view text, PieceSink sink, bool at_start = true) const;
  bool has_byte_level() const;

 private:
  void apply(size_t step, std::string_view piece, bool at_start, PieceSink sink,
             std::vector<std::vector<Span>>& scratch) const;
  std::vector<PreTokenizerStep> steps_;
};

// The pieces HF keeps when `parts` (spans tiling a text, each flagged as a delimiter match or
// not) are cut with `behavior`; empty pieces are dropped. Exposed for tests.
void apply_behavior(const std::vector<Part>& parts, SplitBehavior behavior, std::vector<Span>& out);

}  // namespace miles::tokenizer

// Split regexes: any pattern of a tokenizer.json Split pre-tokenizer or of llama.cpp's
// pre-tokenizer table, matched exactly as HF `tokenizers` matches it.
//
// Why Oniguruma: HF `tokenizers` compiles every Split pattern with Oniguruma (the `onig` crate:
// UTF-8, ONIG_OPTION_NONE, Oniguruma's default syntax) and its find_iter. Running the same engine
// makes its dialect ours for free: (?i:...) with Unicode case folding (U+017F folds to s),
// \p{...} classes with Oniguruma's Unicode tables, possessive and atomic groups, look-behind, `$`
// as a Ruby-style end-of-line anchor. PCRE2 would be the other choice (faster with its JIT, also in
// Debian), but it is a different dialect: its `$` matches only at the end (or before a final
// newline), \h, \R and \X differ, class and case-folding tables follow PCRE2's own Unicode
// version, and each difference is a tokenizer whose ids differ from HF's without an error.
// Debian bookworm packages Oniguruma 6.9.8 (libonig-dev); see "Unicode versions" below.
//
// Fast paths: the GPT-2, Llama-3 and Qwen2 patterns (the bulk of real use) run through the
// hand-written scanners of split_pattern.h, a few times faster than Oniguruma, and the digit
// patterns of llama.cpp's table (\p{N}, \p{N}+, \p{N}{1,3}) through a class-run scan;
// tests/tokenizer_regex_test.cc proves each identical to Oniguruma on the corpus and random text.
//
// Unicode versions: the fast paths use the classes of unicode.h, measured from HF `tokenizers`
// 0.23, whose bundled Oniguruma has Unicode 16 data. Debian bookworm's Oniguruma 6.9.8 has Unicode
// 14 data: the two disagree on exactly the 9392 code points that are unassigned in Unicode 14 and
// letters, digits or spaces in HF's tables (tests/tokenizer_regex_test.cc counts them). A pattern
// without a fast path sees those as unassigned, where HF 0.23 sees Unicode 16's classes.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "miles/status.h"
#include "tokenizer/split_pattern.h"

namespace miles::tokenizer {

class SplitRegex {
 public:
  enum class Engine {
    kFastest,    // a scanner when the pattern has one, else Oniguruma
    kOniguruma,  // always Oniguruma (tests compare the two)
  };
  // The compiled pattern; a pattern Oniguruma refuses is an error naming the pattern and
  // Oniguruma's reason.
  static Result<std::shared_ptr<const SplitRegex>> compile(std::string_view pattern,
                                                           Engine engine = Engine::kFastest);
  ~SplitRegex();
  SplitRegex(const SplitRegex&) = delete;
  SplitRegex& operator=(const SplitRegex&) = delete;

  // HF's Pattern::find_matches: appends the matches of the pattern in `text` (non-empty) and the
  // gaps between them, in order, tiling the text. Matches come from Oniguruma's find_iter (the
  // `onig` crate's: an empty match right after a match is skipped, and the search goes on one code
  // point further), so empty matches appear as empty parts, as in HF. Bytes of `text` that are not
  // well-formed UTF-8 (HF never sees them) are matched as U+FFFD, each on its own.
  void find_parts(std::string_view text, std::vector<Part>& out) const;

  // The scanner, when this pattern runs on one (its matches tile every text).
  const std::optional<SplitPattern>& scanner() const { return scanner_; }
  // Whether the pattern runs on a fast path (a scanner or a class-run scan), not Oniguruma.
  bool fast() const { return scanner_ || run_max_ > 0; }
  const std::string& pattern() const { return pattern_; }

 private:
  SplitRegex() = default;
  void onig_parts(std::string_view text, std::vector<Part>& out) const;
  void number_runs(std::string_view text, std::vector<Part>& out) const;

  std::string pattern_;
  std::optional<SplitPattern> scanner_;
  size_t run_max_ = 0;    // > 0: \p{N} runs of at most this many code points (SIZE_MAX: +)
  void* onig_ = nullptr;  // regex_t*, compiled once; searching it is thread-safe
};

}  // namespace miles::tokenizer

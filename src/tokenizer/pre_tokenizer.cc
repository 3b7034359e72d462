// PreTokenizer: HF's Split / ByteLevel / Digits composition, depth first (see pre_tokenizer.h).
//
// Why depth first: each step cuts one piece and hands every sub-piece straight to the next step,
// so the only memory is one span list per step, reused for the whole text. The cutting rules are
// HF's NormalizedString::split: a pattern tiles the piece into matches and non-matches, `invert`
// swaps the two, the behavior merges or drops them, and empty pieces vanish.
#include "tokenizer/pre_tokenizer.h"

#include <algorithm>

#include "tokenizer/unicode.h"

namespace miles::tokenizer {
namespace {

// Parts of `piece` for a literal delimiter (non-overlapping, left to right).
void literal_parts(std::string_view piece, std::string_view delim, std::vector<Part>& parts) {
  size_t prev = 0;
  for (size_t at = piece.find(delim); at != std::string_view::npos;
       at = piece.find(delim, at + delim.size())) {
    if (at > prev) parts.push_back({{prev, at}, false});
    parts.push_back({{at, at + delim.size()}, true});
    prev = at + delim.size();
  }
  if (prev < piece.size()) parts.push_back({{prev, piece.size()}, false});
}

// Parts of `piece` for HF's char-predicate pattern "is numeric": each digit is a match, the runs
// between them are non-matches.
void digit_parts(std::string_view piece, std::vector<Part>& parts) {
  size_t prev = 0;
  for (size_t i = 0; i < piece.size();) {
    uint32_t cp;
    const int len = unicode::decode_utf8(piece.data() + i, piece.size() - i, &cp);
    if (unicode::flags(cp) & unicode::kDigit) {
      if (prev < i) parts.push_back({{prev, i}, false});
      parts.push_back({{i, i + len}, true});
      prev = i + len;
    }
    i += len;
  }
  if (prev < piece.size()) parts.push_back({{prev, piece.size()}, false});
}

}  // namespace

void apply_behavior(const std::vector<Part>& parts, SplitBehavior behavior,
                    std::vector<Span>& out) {
  const size_t first = out.size();
  bool previous_match = false;
  switch (behavior) {
    case SplitBehavior::kIsolated:
      for (const Part& p : parts) out.push_back(p.span);
      break;
    case SplitBehavior::kRemoved:
      for (const Part& p : parts)
        if (!p.is_match) out.push_back(p.span);
      break;
    case SplitBehavior::kContiguous:
      for (const Part& p : parts) {
        if (p.is_match == previous_match && out.size() > first) {
          out.back().end = p.span.end;
        } else {
          out.push_back(p.span);
        }
        previous_match = p.is_match;
      }
      break;
    case SplitBehavior::kMergedWithPrevious:
      for (const Part& p : parts) {
        if (p.is_match && !previous_match && out.size() > first) {
          out.back().end = p.span.end;
        } else {
          out.push_back(p.span);
        }
        previous_match = p.is_match;
      }
      break;
    case SplitBehavior::kMergedWithNext:
      for (size_t k = parts.size(); k-- > 0;) {
        const Part& p = parts[k];
        if (p.is_match && !previous_match && out.size() > first) {
          out.back().begin = p.span.begin;
        } else {
          out.push_back(p.span);
        }
        previous_match = p.is_match;
      }
      std::reverse(out.begin() + static_cast<std::ptrdiff_t>(first), out.end());
      break;
  }
  // Drop empty pieces.
  size_t kept = first;
  for (size_t k = first; k < out.size(); ++k)
    if (out[k].end > out[k].begin) out[kept++] = out[k];
  out.resize(kept);
}

bool PreTokenizer::has_byte_level() const {
  for (const PreTokenizerStep& s : steps_)
    if (s.kind == PreTokenizerStep::Kind::kByteLevel) return true;
  return false;
}

void PreTokenizer::run(std::string_view text, PieceSink sink) const {
  std::vector<std::vector<Span>> scratch(steps_.size());
  apply(0, text, sink, scratch);
}

void PreTokenizer::apply(size_t step, std::string_view piece, PieceSink sink,
                         std::vector<std::vector<Span>>& scratch) const {
  if (piece.empty()) return;
  if (step == steps_.size()) {
    sink(piece);
    return;
  }
  const PreTokenizerStep& s = steps_[step];
  std::vector<Span>& pieces = scratch[step];
  pieces.clear();
  std::string prefixed;  // ByteLevel's added space lives here
  std::string_view text = piece;
  switch (s.kind) {
    case PreTokenizerStep::Kind::kByteLevel:
      if (s.add_prefix_space && piece[0] != ' ') {
        prefixed.reserve(piece.size() + 1);
        prefixed.push_back(' ');
        prefixed.append(piece);
        text = prefixed;
      }
      if (!s.use_regex) {
        apply(step + 1, text, sink, scratch);
        return;
      }
      find_matches(SplitPattern::kGpt2, text, pieces);  // tiles the text: Isolated keeps all
      break;
    case PreTokenizerStep::Kind::kSplitRegex:
      if (s.behavior == SplitBehavior::kIsolated) {
        find_matches(s.pattern, text, pieces);  // matches tile the text, invert changes nothing
      } else {
        std::vector<Span> matches;
        find_matches(s.pattern, text, matches);
        std::vector<Part> parts;
        parts.reserve(matches.size());
        for (const Span& m : matches) parts.push_back({m, !s.invert});
        apply_behavior(parts, s.behavior, pieces);
      }
      break;
    case PreTokenizerStep::Kind::kSplitString:
    case PreTokenizerStep::Kind::kDigits: {
      std::vector<Part> parts;
      if (s.kind == PreTokenizerStep::Kind::kDigits) {
        digit_parts(text, parts);
      } else {
        literal_parts(text, s.literal, parts);
        if (s.invert)
          for (Part& p : parts) p.is_match = !p.is_match;
      }
      const SplitBehavior b =
          s.kind == PreTokenizerStep::Kind::kDigits
              ? (s.individual_digits ? SplitBehavior::kIsolated : SplitBehavior::kContiguous)
              : s.behavior;
      apply_behavior(parts, b, pieces);
      break;
    }
  }
  for (size_t k = 0; k < pieces.size(); ++k) {
    const Span sp = scratch[step][k];  // scratch[step] is not touched by deeper steps
    apply(step + 1, text.substr(sp.begin, sp.end - sp.begin), sink, scratch);
  }
}

}  // namespace miles::tokenizer

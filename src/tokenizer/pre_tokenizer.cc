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

// Parts of `piece` for one of HF's char-predicate patterns ("is numeric", "is punctuation"): each
// code point with `flag` is a match, the runs between them are non-matches.
void char_parts(std::string_view piece, uint8_t flag, std::vector<Part>& parts) {
  size_t prev = 0;
  for (size_t i = 0; i < piece.size();) {
    uint32_t cp;
    const int len = unicode::decode_utf8(piece.data() + i, piece.size() - i, &cp);
    if (unicode::flags(cp) & flag) {
      if (prev < i) parts.push_back({{prev, i}, false});
      parts.push_back({{i, i + len}, true});
      prev = i + len;
    }
    i += len;
  }
  if (prev < piece.size()) parts.push_back({{prev, piece.size()}, false});
}

// HF's Whitespace (`\w+|[^\w\s]+`, the matches kept) when `split_words`, else WhitespaceSplit
// (the runs between White_Space code points).
void whitespace_pieces(std::string_view piece, bool split_words, std::vector<Span>& out) {
  enum { kNone, kWordRun, kOtherRun } run = kNone;
  size_t start = 0;
  for (size_t i = 0; i < piece.size();) {
    uint32_t cp;
    const int len = unicode::decode_utf8(piece.data() + i, piece.size() - i, &cp);
    const uint8_t f = unicode::flags(cp);
    const auto kind = f & unicode::kSpace                  ? kNone
                      : !split_words || f & unicode::kWord ? kWordRun
                                                           : kOtherRun;
    if (kind != run) {
      if (run != kNone) out.push_back({start, i});
      start = i;
      run = kind;
    }
    i += len;
  }
  if (run != kNone) out.push_back({start, piece.size()});
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

void PreTokenizer::run(std::string_view text, PieceSink sink, bool at_start) const {
  std::vector<std::vector<Span>> scratch(steps_.size());
  apply(0, text, at_start, sink, scratch);
}

void PreTokenizer::apply(size_t step, std::string_view piece, bool at_start, PieceSink sink,
                         std::vector<std::vector<Span>>& scratch) const {
  if (piece.empty()) return;
  if (step == steps_.size()) {
    sink(piece);
    return;
  }
  const PreTokenizerStep& s = steps_[step];
  std::vector<Span>& pieces = scratch[step];
  pieces.clear();
  std::string prefixed;  // ByteLevel's added space, Metaspace's rewritten text live here
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
        apply(step + 1, text, at_start, sink, scratch);
        return;
      }
      find_matches(SplitPattern::kGpt2, text, pieces);  // tiles the text: Isolated keeps all
      break;
    case PreTokenizerStep::Kind::kSplitRegex:
      if (s.regex->scanner() && s.behavior == SplitBehavior::kIsolated) {
        find_matches(*s.regex->scanner(), text, pieces);  // tiles the text, invert changes nothing
      } else {
        std::vector<Part> parts;
        s.regex->find_parts(text, parts);
        if (s.invert)
          for (Part& p : parts) p.is_match = !p.is_match;
        apply_behavior(parts, s.behavior, pieces);
      }
      break;
    case PreTokenizerStep::Kind::kMetaspace: {
      const std::string_view rep = s.literal;
      const bool starts = piece[0] == ' ' || piece.substr(0, rep.size()) == rep;
      if (s.prepend == PrependScheme::kAlways || (s.prepend == PrependScheme::kFirst && at_start))
        if (!starts) prefixed = rep;
      for (const char c : piece) {
        if (c == ' ') {
          prefixed.append(rep);
        } else {
          prefixed.push_back(c);
        }
      }
      text = prefixed;
      if (!s.split) {
        apply(step + 1, text, at_start, sink, scratch);
        return;
      }
      std::vector<Part> parts;
      literal_parts(text, rep, parts);
      apply_behavior(parts, SplitBehavior::kMergedWithNext, pieces);
      break;
    }
    case PreTokenizerStep::Kind::kWhitespace:
    case PreTokenizerStep::Kind::kWhitespaceSplit:
      whitespace_pieces(text, s.kind == PreTokenizerStep::Kind::kWhitespace, pieces);
      break;
    case PreTokenizerStep::Kind::kSplitString:
    case PreTokenizerStep::Kind::kPunctuation:
    case PreTokenizerStep::Kind::kDigits: {
      std::vector<Part> parts;
      if (s.kind == PreTokenizerStep::Kind::kDigits) {
        char_parts(text, unicode::kDigit, parts);
      } else if (s.kind == PreTokenizerStep::Kind::kPunctuation) {
        char_parts(text, unicode::kPunct, parts);
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
    apply(step + 1, text.substr(sp.begin, sp.end - sp.begin), at_start && sp.begin == 0, sink,
          scratch);
  }
}

}  // namespace miles::tokenizer

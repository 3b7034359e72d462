// The Unicode tables of llama.cpp's WordPiece pre-processing (gen_wordpiece_tables.py).
#pragma once

#include <cstddef>
#include <cstdint>

namespace miles::wordpiece::detail {

// {first, last, value}, sorted and disjoint: kFlags' value is the class bits (wordpiece.h),
// kLower's the offset to the lowercase code point, kNfd's the base code point itself.
struct Range {
  uint32_t first, last;
  int32_t value;
};
extern const Range kFlags[];
extern const size_t kFlagsSize;
extern const Range kLower[];
extern const size_t kLowerSize;
extern const Range kNfd[];
extern const size_t kNfdSize;

}  // namespace miles::wordpiece::detail

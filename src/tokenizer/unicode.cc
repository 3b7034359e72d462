// Class lookups and NFC over the generated tables (unicode_tables.cc).
//
// Why this shape: flags() runs once per code point of every text, so the range list is expanded
// once into a two-stage table (a block index per 128 code points, then shared blocks). NFC is the
// textbook algorithm (full canonical decomposition, canonical ordering, canonical composition with
// blocking; Hangul algorithmically), run only over the stretches that the quick check cannot
// clear: text between two "boundary" code points (flag kNfcCheck clear) never interacts with text
// outside them, so everything else is copied unchanged.
#include "tokenizer/unicode.h"

#include <algorithm>
#include <vector>

#include "miles/check.h"

namespace miles::unicode {
namespace {

constexpr uint32_t kBlockBits = 7;
constexpr uint32_t kBlockSize = 1u << kBlockBits;
constexpr uint32_t kCodeSpace = 0x110000;

struct FlagTable {
  std::vector<uint16_t> stage1;  // [kCodeSpace / kBlockSize] block index
  std::vector<uint8_t> blocks;   // [distinct blocks * kBlockSize] flags
};

FlagTable build_flag_table() {
  std::vector<uint8_t> all(kCodeSpace, 0);
  for (size_t i = 0; i < detail::kFlagRangeCount; ++i) {
    const detail::FlagRange& r = detail::kFlagRanges[i];
    MILES_CHECK(r.first <= r.last && r.last < kCodeSpace);
    std::fill(all.begin() + r.first, all.begin() + r.last + 1, r.flags);
  }
  FlagTable t;
  t.stage1.resize(kCodeSpace / kBlockSize);
  std::vector<std::string> seen;  // distinct blocks, as bytes
  for (uint32_t b = 0; b < kCodeSpace / kBlockSize; ++b) {
    std::string block(reinterpret_cast<const char*>(all.data()) + b * kBlockSize, kBlockSize);
    auto it = std::find(seen.begin(), seen.end(), block);
    if (it == seen.end()) {
      seen.push_back(block);
      it = seen.end() - 1;
    }
    t.stage1[b] = static_cast<uint16_t>(it - seen.begin());
  }
  for (const std::string& s : seen) t.blocks.insert(t.blocks.end(), s.begin(), s.end());
  return t;
}

// ---- NFC ---------------------------------------------------------------------------------------

constexpr uint32_t kSBase = 0xAC00, kLBase = 0x1100, kVBase = 0x1161, kTBase = 0x11A7;
constexpr uint32_t kLCount = 19, kVCount = 21, kTCount = 28, kNCount = kVCount * kTCount,
                   kSCount = kLCount * kNCount;
// Ill-formed bytes travel through the algorithm as this bit plus the byte: ccc 0, composes with
// nothing, written back as the raw byte.
constexpr uint32_t kRawByte = 0x80000000u;

uint8_t ccc(uint32_t cp) {
  if (cp & kRawByte) return 0;
  const detail::CccEntry* end = detail::kCcc + detail::kCccCount;
  const detail::CccEntry* it = std::lower_bound(
      detail::kCcc, end, cp, [](const detail::CccEntry& e, uint32_t c) { return e.cp < c; });
  return it != end && it->cp == cp ? it->ccc : 0;
}

// The entry of `cp` in a sorted DecompEntry table, or null.
const detail::DecompEntry* find_entry(const detail::DecompEntry* table, size_t n, uint32_t cp) {
  const detail::DecompEntry* end = table + n;
  const detail::DecompEntry* it = std::lower_bound(
      table, end, cp, [](const detail::DecompEntry& e, uint32_t c) { return e.cp < c; });
  return it != end && it->cp == cp ? it : nullptr;
}

void decompose(uint32_t cp, std::vector<uint32_t>& out, bool compat = false) {
  if (cp >= kSBase && cp < kSBase + kSCount) {
    const uint32_t s = cp - kSBase;
    out.push_back(kLBase + s / kNCount);
    out.push_back(kVBase + (s % kNCount) / kTCount);
    if (s % kTCount != 0) out.push_back(kTBase + s % kTCount);
    return;
  }
  const detail::DecompEntry* it = nullptr;
  if (compat) it = find_entry(detail::kCompatDecomp, detail::kCompatDecompCount, cp);
  if (!it) it = find_entry(detail::kDecomp, detail::kDecompCount, cp);
  if (it) {
    out.insert(out.end(), detail::kDecompPool + it->offset,
               detail::kDecompPool + it->offset + it->length);
  } else {
    out.push_back(cp);
  }
}

// The primary composite of (a, b), or 0.
uint32_t compose(uint32_t a, uint32_t b) {
  if (a >= kLBase && a < kLBase + kLCount && b >= kVBase && b < kVBase + kVCount)
    return kSBase + ((a - kLBase) * kVCount + (b - kVBase)) * kTCount;
  if (a >= kSBase && a < kSBase + kSCount && (a - kSBase) % kTCount == 0 && b > kTBase &&
      b < kTBase + kTCount)
    return a + (b - kTBase);
  const detail::ComposeEntry* end = detail::kCompose + detail::kComposeCount;
  const detail::ComposeEntry* it =
      std::lower_bound(detail::kCompose, end, std::pair(a, b),
                       [](const detail::ComposeEntry& e, std::pair<uint32_t, uint32_t> k) {
                         return e.first < k.first || (e.first == k.first && e.second < k.second);
                       });
  return it != end && it->first == a && it->second == b ? it->composite : 0;
}

// A normal form of a stretch that starts and ends at boundaries, appended to out: full
// decomposition (compatibility too when `compat`), canonical ordering, then canonical composition
// when `compose`.
void normalize_stretch(std::string_view s, bool compat, bool compose_after, std::string& out) {
  std::vector<uint32_t> cps;
  for (size_t i = 0; i < s.size();) {
    uint32_t cp;
    const int len = decode_utf8(s.data() + i, s.size() - i, &cp);
    if (cp == kInvalid) {
      cps.push_back(kRawByte | static_cast<uint8_t>(s[i]));
    } else {
      decompose(cp, cps, compat);
    }
    i += len;
  }
  // Canonical ordering: stable sort of every run of non-starters by ccc.
  for (size_t i = 0; i < cps.size();) {
    if (ccc(cps[i]) == 0) {
      ++i;
      continue;
    }
    size_t j = i;
    while (j < cps.size() && ccc(cps[j]) != 0) ++j;
    std::stable_sort(cps.begin() + i, cps.begin() + j,
                     [](uint32_t a, uint32_t b) { return ccc(a) < ccc(b); });
    i = j;
  }
  if (!compose_after) {
    for (const uint32_t c : cps) {
      if (c & kRawByte) {
        out.push_back(static_cast<char>(c & 0xFF));
      } else {
        append_utf8(c, out);
      }
    }
    return;
  }
  // Canonical composition: a character joins the last starter unless a character between them
  // is a starter or has a ccc >= its own.
  std::vector<uint32_t> res;
  res.reserve(cps.size());
  int64_t starter = -1;
  int last_ccc = -1;  // ccc of the previous character kept after the starter; -1: none
  for (const uint32_t c : cps) {
    const int cc = ccc(c);
    if (starter >= 0 && !(c & kRawByte) && !(res[starter] & kRawByte)) {
      const bool blocked = last_ccc != -1 && (last_ccc == 0 || last_ccc >= cc);
      if (!blocked) {
        if (const uint32_t comp = compose(res[starter], c)) {
          res[starter] = comp;
          continue;
        }
      }
    }
    if (cc == 0) {
      starter = static_cast<int64_t>(res.size());
      last_ccc = -1;
    } else {
      last_ccc = cc;
    }
    res.push_back(c);
  }
  for (const uint32_t c : res) {
    if (c & kRawByte) {
      out.push_back(static_cast<char>(c & 0xFF));
    } else {
      append_utf8(c, out);
    }
  }
}

}  // namespace

namespace detail {
uint8_t flags_from_table(uint32_t cp) {
  static const FlagTable table = build_flag_table();
  if (cp >= kCodeSpace) return 0;
  return table.blocks[(static_cast<uint32_t>(table.stage1[cp >> kBlockBits]) << kBlockBits) |
                      (cp & (kBlockSize - 1))];
}
}  // namespace detail

void append_utf8(uint32_t cp, std::string& out) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

bool is_nfc_quick(std::string_view text) {
  for (size_t i = 0; i < text.size();) {
    if (static_cast<uint8_t>(text[i]) < 0x80) {
      ++i;
      continue;
    }
    uint32_t cp;
    i += decode_utf8(text.data() + i, text.size() - i, &cp);
    if (flags(cp) & kNfcCheck) return false;
  }
  return true;
}

std::string to_nfc(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  size_t copied = 0;      // text[0, copied) is in `out`
  size_t last_start = 0;  // start of the last boundary code point seen
  for (size_t i = 0; i < text.size();) {
    if (static_cast<uint8_t>(text[i]) < 0x80) {
      last_start = i++;
      continue;
    }
    uint32_t cp;
    const int len = decode_utf8(text.data() + i, text.size() - i, &cp);
    if (!(flags(cp) & kNfcCheck)) {
      last_start = i;
      i += len;
      continue;
    }
    // A stretch from the last boundary before i (it may compose with what follows) to the next
    // boundary after i.
    const size_t begin = std::max(copied, last_start);
    size_t end = i + len;
    while (end < text.size()) {
      uint32_t next;
      const int l = decode_utf8(text.data() + end, text.size() - end, &next);
      if (!(flags(next) & kNfcCheck)) break;
      end += l;
    }
    out.append(text.substr(copied, begin - copied));
    normalize_stretch(text.substr(begin, end - begin), false, true, out);
    copied = end;
    last_start = end;
    i = end;
  }
  out.append(text.substr(copied));
  return out;
}

// NFD, NFKD and NFKC have no quick check here: text with any non-ASCII byte (ASCII is invariant in
// every form) is normalized whole.
std::string normalize(std::string_view text, NormalForm form) {
  if (form == NormalForm::kNfc) return to_nfc(text);
  bool ascii = true;
  for (const char c : text) ascii = ascii && static_cast<uint8_t>(c) < 0x80;
  if (ascii) return std::string(text);
  std::string out;
  out.reserve(text.size() + text.size() / 4);
  normalize_stretch(text, form != NormalForm::kNfd, form == NormalForm::kNfkc, out);
  return out;
}

std::string to_lower(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size();) {
    const auto b = static_cast<uint8_t>(text[i]);
    if (b < 0x80) {
      out.push_back(b >= 'A' && b <= 'Z' ? static_cast<char>(b + 32) : static_cast<char>(b));
      ++i;
      continue;
    }
    uint32_t cp;
    const int len = decode_utf8(text.data() + i, text.size() - i, &cp);
    const detail::DecompEntry* e =
        cp == kInvalid ? nullptr : find_entry(detail::kLowercase, detail::kLowercaseCount, cp);
    if (e) {
      for (uint8_t k = 0; k < e->length; ++k) append_utf8(detail::kDecompPool[e->offset + k], out);
    } else {
      out.append(text.substr(i, len));
    }
    i += len;
  }
  return out;
}

}  // namespace miles::unicode

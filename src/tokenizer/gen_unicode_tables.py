#!/usr/bin/env python3
"""Writes src/tokenizer/unicode_tables.cc: the Unicode data the tokenizers need, as Hugging Face
`tokenizers` sees it.

Why probe instead of reading one Unicode database: HF `tokenizers` (the reference our ids must
equal) takes its character classes from three places with three Unicode versions — Oniguruma's
\\p{L} / \\p{N} / \\s in Split regexes (Unicode 16 in tokenizers 0.23), Rust's char::is_numeric in the
Digits pre-tokenizer and Rust regex's \\w for single_word added tokens (newer still), and
unicode-normalization-alignments for NFC (Unicode 9). So the classes are measured from the
installed `tokenizers` itself, and NFC data comes from Python's unicodedata with every character
that HF's older normaliser does not know (measured the same way) left out.

Run with the reference venv:  /root/.venvs/miles-ref/bin/python src/tokenizer/gen_unicode_tables.py
"""
import os
import sys
import unicodedata as ud

import tokenizers
from tokenizers import AddedToken, Regex, Tokenizer, models, normalizers, pre_tokenizers

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "unicode_tables.cc")
CPS = [c for c in range(0x110000) if not 0xD800 <= c <= 0xDFFF]
ALL = "".join(map(chr, CPS))

# Flag bits; keep in sync with unicode.h.
LETTER, NUMBER, SPACE, WORD, DIGIT, NFC_CHECK, PUNCT = 1, 2, 4, 8, 16, 32, 64


def regex_class(rx):
    """Code points that the Oniguruma regex `rx` (one character) matches."""
    kept = set()
    for _, (a, b) in pre_tokenizers.Split(Regex(rx), "removed").pre_tokenize_str(ALL):
        kept.update(range(a, b))
    return {CPS[i] for i in range(len(CPS)) if i not in kept}


def digits_class():
    """Code points that the Digits pre-tokenizer isolates (Rust char::is_numeric)."""
    text = "".join("a" + chr(c) for c in CPS)  # a non-digit run swallows every non-digit c
    pieces = pre_tokenizers.Digits(individual_digits=True).pre_tokenize_str(text)
    return {CPS[a // 2] for _, (a, b) in pieces if b - a == 1 and a % 2 == 1}


def punct_class():
    """Code points the Punctuation pre-tokenizer cuts at (ASCII or Unicode punctuation)."""
    kept = set()
    for _, (a, b) in pre_tokenizers.Punctuation("removed").pre_tokenize_str(ALL):
        kept.update(range(a, b))
    return {CPS[i] for i in range(len(CPS)) if i not in kept}


def word_class():
    """Code points Rust regex's \\w accepts: probed through a single_word added token."""
    t = Tokenizer(models.WordLevel({"[UNK]": 0}, unk_token="[UNK]"))
    t.add_tokens([AddedToken("x", single_word=True)])
    cand = [c for c in CPS if c != ord("x")]
    enc = t.encode("".join(" " + chr(c) + "x " for c in cand))
    matched = {a for i, (a, _) in zip(enc.ids, enc.offsets) if i == 1}
    return {c for k, c in enumerate(cand) if 4 * k + 2 not in matched} | {ord("x")}


def batch_normalize(norm, strings):
    sep = "\x00"
    out = norm.normalize_str(sep.join(strings)).split(sep)
    assert len(out) == len(strings)
    return out


def hf_unknown_to_normaliser():
    """Characters with canonical data in Python's Unicode that HF's normaliser does not have."""
    cps = [c for c in CPS if c != 0]
    nfd = batch_normalize(normalizers.NFD(), [chr(c) for c in cps])
    unknown = {c for c, d in zip(cps, nfd) if d != ud.normalize("NFD", chr(c)) and d == chr(c)}
    marks = [c for c in cps if ud.combining(chr(c))]
    # Reordering against U+0334 (ccc 1) and U+0345 (ccc 240) reveals a ccc HF does not know.
    a = batch_normalize(normalizers.NFD(), [chr(c) + "\u0334" for c in marks])
    b = batch_normalize(normalizers.NFD(), ["\u0345" + chr(c) for c in marks])
    for c, x, y in zip(marks, a, b):
        if x != ud.normalize("NFD", chr(c) + "\u0334") or y != ud.normalize("NFD", "\u0345" + chr(c)):
            unknown.add(c)
    return unknown


def full_decomposition(c, unknown):
    d = ud.decomposition(chr(c))
    if not d or d.startswith("<") or c in unknown:
        return [c]
    out = []
    for part in d.split():
        out.extend(full_decomposition(int(part, 16), unknown))
    return out


def hf_per_character(norm):
    """{code point: HF's `norm` of that one character} where it changes the character."""
    cps = [c for c in CPS if c != 0 and not 0xAC00 <= c <= 0xD7A3]  # Hangul: algorithmic
    out = batch_normalize(norm, [chr(c) for c in cps])
    return {c: [ord(x) for x in n] for c, n in zip(cps, out) if n != chr(c)}


def main():
    print("tokenizers", tokenizers.__version__, "python unicodedata", ud.unidata_version)
    # NFKD of each character as HF computes it (its compatibility data is Unicode 9 as well), kept
    # where it differs from the canonical decomposition; Lowercase: Rust's char::to_lowercase.
    compat_all = hf_per_character(normalizers.NFKD())
    lower = hf_per_character(normalizers.Lowercase())
    unknown = hf_unknown_to_normaliser()
    ccc = {c: ud.combining(chr(c)) for c in CPS if ud.combining(chr(c)) and c not in unknown}
    decomp = {}
    for c in CPS:
        if 0xAC00 <= c <= 0xD7A3:
            continue  # Hangul syllables decompose algorithmically
        d = full_decomposition(c, unknown)
        if d != [c]:
            decomp[c] = d
    compose = {}
    for c in CPS:
        d = ud.decomposition(chr(c))
        if not d or d.startswith("<") or c in unknown or 0xAC00 <= c <= 0xD7A3:
            continue
        parts = [int(p, 16) for p in d.split()]
        if len(parts) == 2 and ud.normalize("NFC", chr(parts[0]) + chr(parts[1])) == chr(c):
            compose[(parts[0], parts[1])] = c
    hf_nfc = batch_normalize(normalizers.NFC(), [chr(c) for c in CPS if c != 0])
    nfc_changes = {c for c, n in zip([c for c in CPS if c != 0], hf_nfc) if n != chr(c)}
    seconds = {s for (_, s) in compose} | set(range(0x1161, 0x1176)) | set(range(0x11A8, 0x11C3))
    # A character whose decomposition starts with one that combines backward is no boundary either.
    backward = {c for c, d in decomp.items() if d[0] in seconds or d[0] in ccc}
    nfc_check = set(ccc) | nfc_changes | seconds | backward

    classes = [(LETTER, regex_class(r"\p{L}")), (NUMBER, regex_class(r"\p{N}")),
               (SPACE, regex_class(r"\s")), (WORD, word_class()), (DIGIT, digits_class()),
               (NFC_CHECK, nfc_check), (PUNCT, punct_class())]
    flags = {}
    for bit, members in classes:
        for c in members:
            flags[c] = flags.get(c, 0) | bit
    ranges = []
    for c in sorted(flags):
        if ranges and ranges[-1][1] == c - 1 and ranges[-1][2] == flags[c]:
            ranges[-1][1] = c
        else:
            ranges.append([c, c, flags[c]])

    pool, decomp_rows = [], []
    for c in sorted(decomp):
        decomp_rows.append((c, len(pool), len(decomp[c])))
        pool.extend(decomp[c])
    compat = {c: d for c, d in compat_all.items() if d != decomp.get(c, [c])}
    compat_rows = []
    for c in sorted(compat):
        compat_rows.append((c, len(pool), len(compat[c])))
        pool.extend(compat[c])
    lower_rows = []
    for c in sorted(lower):
        lower_rows.append((c, len(pool), len(lower[c])))
        pool.extend(lower[c])

    def rows(items, per_line):
        lines = []
        for i in range(0, len(items), per_line):
            lines.append("    " + " ".join(items[i:i + per_line]))
        return "\n".join(lines)

    with open(OUT, "w") as f:
        f.write(f"""// GENERATED by src/tokenizer/gen_unicode_tables.py from HF tokenizers {tokenizers.__version__} and
// Python's unicodedata {ud.unidata_version}; do not edit. See unicode.h for what the tables mean.
//
// Why generated: the character classes must be the ones HF `tokenizers` uses (measured from it),
// and NFC must be HF's (Unicode 9) normaliser; no system library has exactly that.
// clang-format off
#include "tokenizer/unicode.h"

namespace miles::unicode::detail {{

// {{first, last, flags}}: code points not listed have flags 0.
const FlagRange kFlagRanges[] = {{
{rows([f"{{0x{a:X},0x{b:X},{v}}}," for a, b, v in ranges], 6)}
}};
const size_t kFlagRangeCount = sizeof(kFlagRanges) / sizeof(kFlagRanges[0]);

// {{code point, canonical combining class}}, ccc != 0 only.
const CccEntry kCcc[] = {{
{rows([f"{{0x{c:X},{v}}}," for c, v in sorted(ccc.items())], 8)}
}};
const size_t kCccCount = sizeof(kCcc) / sizeof(kCcc[0]);

// {{code point, offset into kDecompPool, length}}: full canonical decompositions (Hangul excluded).
const DecompEntry kDecomp[] = {{
{rows([f"{{0x{c:X},{o},{n}}}," for c, o, n in decomp_rows], 6)}
}};
const size_t kDecompCount = sizeof(kDecomp) / sizeof(kDecomp[0]);

// The same shape for HF's NFKD of a character where it differs from the canonical decomposition
// (full compatibility decompositions, canonically ordered), and for Rust's char::to_lowercase.
const DecompEntry kCompatDecomp[] = {{
{rows([f"{{0x{c:X},{o},{n}}}," for c, o, n in compat_rows], 6)}
}};
const size_t kCompatDecompCount = sizeof(kCompatDecomp) / sizeof(kCompatDecomp[0]);
const DecompEntry kLowercase[] = {{
{rows([f"{{0x{c:X},{o},{n}}}," for c, o, n in lower_rows], 6)}
}};
const size_t kLowercaseCount = sizeof(kLowercase) / sizeof(kLowercase[0]);
const uint32_t kDecompPool[] = {{
{rows([f"0x{c:X}," for c in pool], 10)}
}};

// {{first, second, composite}} sorted by (first, second): primary composites (Hangul excluded).
const ComposeEntry kCompose[] = {{
{rows([f"{{0x{a:X},0x{b:X},0x{c:X}}}," for (a, b), c in sorted(compose.items())], 4)}
}};
const size_t kComposeCount = sizeof(kCompose) / sizeof(kCompose[0]);

}}  // namespace miles::unicode::detail
""")
    print(f"wrote {OUT}: {len(ranges)} flag ranges, {len(ccc)} ccc, {len(decomp)} decompositions, "
          f"{len(compose)} compositions, {len(compat)} compatibility decompositions, "
          f"{len(lower)} lowercase mappings, {len(unknown)} characters unknown to HF's normaliser")


if __name__ == "__main__":
    sys.exit(main())

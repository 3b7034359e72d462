#!/usr/bin/env python3
"""Tokenizer throughput: `miles tokenize --bench` against HF `tokenizers`, single-threaded.

    /root/.venvs/miles-ref/bin/python scripts/bench_tokenizer_hf.py \
        [--tokenizer ../shared/tokenizers/qwen3/tokenizer.json] [--miles build/bin/miles] \
        [--mb 10] [--repeat 3]

Builds a deterministic mixed text (English prose, code, CJK, emoji, numbers; ~10 MB), then
encodes it with both tokenizers the same way: line by line, each line with its '\\n', no special
tokens added. HF runs `encode_batch` over all lines with TOKENIZERS_PARALLELISM=false (one
thread, no per-line Python overhead); miles runs `tokenize --file F --bench`, which encodes the
same lines in a loop. Each side reports its fastest of --repeat runs, excluding loading. Token
counts must be identical; the script prints both throughputs and the ratio.

--oniguruma benchmarks the same tokenizer with every Split regex wrapped as (?:REGEX), which
matches exactly as REGEX but has no hand-written scanner in miles: the throughput of miles'
Oniguruma path against HF's (which always runs Oniguruma).
"""
import argparse
import json
import os
import random
import subprocess
import sys
import time

os.environ["TOKENIZERS_PARALLELISM"] = "false"
os.environ["RAYON_NUM_THREADS"] = "1"
from tokenizers import Tokenizer  # noqa: E402  (after the environment is set)

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..")

WORDS = ("the of and to in is was for that with as on by at from his her they this which be "
         "have had not are but or an were been their one all would there what so up out if about "
         "who get which go me when make can like time no just him know take people into year your "
         "good some could them see other than then now look only come its over think also back "
         "after use two how our work first well way even new want because any these give day most "
         "us tokenizer model training reward policy gradient sequence batch rollout engine").split()
CODE = [
    "def {f}(x, y={n}):\n    return [i * {n} for i in range(x) if i % 3 == 0]\n",
    "for (int i = 0; i < {n}; ++i) {{\n    sum += values[i] * weights[i];  // {f}\n}}\n",
    "const {f} = async (req, res) => {{ res.json({{ id: {n}, ok: true }}); }};\n",
    "SELECT {f}, COUNT(*) FROM events WHERE ts > {n} GROUP BY {f};\n",
    "    if self.{f} is None:\n        raise ValueError(f\"bad value: {{self.{f}!r}}\")\n",
]
CJK = "的一是不了人我在有他这中大来上个国到说们为子和你地出会也时要就可以对生能而那得于着下自之年过发后作里用道行所然家种事成方多经么去法学如都同现当没动面起看定天分还进好小部其些主样理心她本前开但因只从想实日"
KANA = "あいうえおかきくけこさしすせそたちつてとなにぬねのはひふへほまみむめもやゆよらりるれろわをんアイウエオカキクケコ"
HANGUL = "가나다라마바사아자차카타파하한국어텍스트입니다"
EMOJI = ["😀", "🚀", "🦙", "👍🏽", "👨‍👩‍👧‍👦", "🇺🇸", "❤️", "✅", "🤖", "🎉"]


def make_text(megabytes, seed=1234):
    rng = random.Random(seed)
    lines, size = [], 0
    while size < megabytes * 1_000_000:
        kind = rng.random()
        if kind < 0.45:
            words = [rng.choice(WORDS) for _ in range(rng.randint(8, 30))]
            words[0] = words[0].capitalize()
            line = " ".join(words) + rng.choice([".", "!", "?", ",", ";"]) + "\n"
        elif kind < 0.65:
            line = rng.choice(CODE).format(f=rng.choice(WORDS) + "_" + rng.choice(WORDS),
                                           n=rng.randint(0, 99999))
        elif kind < 0.80:
            alphabet = rng.choice([CJK, CJK, KANA, HANGUL])
            line = "".join(rng.choice(alphabet) for _ in range(rng.randint(10, 60))) + "。\n"
        elif kind < 0.90:
            line = " ".join(rng.choice(WORDS) + rng.choice(EMOJI) for _ in range(rng.randint(3, 12)))
            line += "\n"
        else:
            line = ", ".join(str(rng.randint(0, 10 ** rng.randint(1, 9))) + "." + str(rng.randint(0, 99))
                             for _ in range(rng.randint(3, 15))) + "\n"
        lines.append(line)
        size += len(line.encode())
    return "".join(lines)


def bench_hf(tokenizer_path, lines, repeat):
    tok = Tokenizer.from_file(tokenizer_path)
    best, count = float("inf"), 0
    for _ in range(repeat):
        t0 = time.perf_counter()
        encs = tok.encode_batch(lines, add_special_tokens=False)
        best = min(best, time.perf_counter() - t0)
        count = sum(len(e.ids) for e in encs)
    return best, count


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tokenizer", default=os.path.join(ROOT, "..", "shared", "tokenizers", "qwen3",
                                                        "tokenizer.json"))
    ap.add_argument("--miles", default=os.path.join(ROOT, "build", "bin", "miles"))
    ap.add_argument("--text", default="/tmp/miles_bench_tokenizer.txt", help="where to write the text")
    ap.add_argument("--mb", type=float, default=10.0)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--oniguruma", action="store_true",
                    help="wrap every Split regex as (?:...) so that miles runs it through Oniguruma")
    args = ap.parse_args()
    if args.oniguruma:
        with open(args.tokenizer, encoding="utf-8") as f:
            j = json.load(f)

        def wrap(p):
            if isinstance(p, dict):
                if p.get("type") == "Split" and "Regex" in p.get("pattern", {}):
                    p["pattern"]["Regex"] = "(?:" + p["pattern"]["Regex"] + ")"
                for v in p.values():
                    wrap(v)
            elif isinstance(p, list):
                for v in p:
                    wrap(v)
        wrap(j["pre_tokenizer"])
        args.tokenizer = "/tmp/miles_bench_tokenizer_onig.json"
        with open(args.tokenizer, "w", encoding="utf-8") as f:
            json.dump(j, f, ensure_ascii=False)

    text = make_text(args.mb)
    with open(args.text, "w", encoding="utf-8") as f:
        f.write(text)
    data = text.encode()
    lines = text.splitlines(keepends=True)
    print(f"text: {args.text}, {len(data) / 1e6:.2f} MB, {len(lines)} lines (encoded one by one)")

    hf_s, hf_tokens = bench_hf(args.tokenizer, lines, args.repeat)
    out = subprocess.run([args.miles, "tokenize", "--tokenizer", args.tokenizer, "--file", args.text,
                          "--bench", "--repeat", str(args.repeat)],
                         capture_output=True, text=True, check=True)
    ours = json.loads(out.stdout)
    hf_mbs = len(data) / 1e6 / hf_s
    print(f"HF tokenizers (1 thread, encode_batch): {hf_mbs:8.2f} MB/s  {hf_tokens} tokens")
    print(f"miles tokenize --bench:                 {ours['mb_per_s']:8.2f} MB/s  {ours['tokens']} tokens")
    print(f"ratio miles / HF: {ours['mb_per_s'] / hf_mbs:.2f}x")
    if ours["tokens"] != hf_tokens or ours["bytes"] != len(data):
        print("ERROR: token or byte counts differ", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

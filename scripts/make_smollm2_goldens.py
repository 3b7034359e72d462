#!/usr/bin/env python3
"""Make tests/data/smollm2/goldens.safetensors: transformers' float32 logits for SmolLM2-135M-Instruct.

transformers loads the same GGUF that scripts/get_models.sh converts for miles
(AutoModelForCausalLM.from_pretrained(dir, gguf_file=...): its own dequantisation and q/k
un-permutation, computed in float32 on CPU), so tests/smollm2_test.cc compares two independent
implementations on the same weights. Token ids come from transformers' tokenizer built from the same GGUF.

Contents (keys; P = prompt index 0..2, T_P its length, V = 49152):
  prompt{P}.ids             int32 [T_P]
  prompt{P}.logits_last     float32 [2, V]   full logits of the last two positions
  prompt{P}.probe_logits    float32 [T_P, 256]  logits of every position at the 256 `probe_ids`
  probe_ids                 int32 [256]      fixed vocabulary ids (seeded), plus each row's argmax below
  prompt{P}.argmax          int32 [T_P]      argmax of every position
  answer.ids                int32 [N]        transformers' greedy continuation of prompt 0 (the ChatML
                                             question), up to 24 tokens, stopping at <|im_end|>
Metadata: versions, the GGUF sha256, the prompts' texts and the answer's text.

Run scripts/get_models.sh first (it caches the GGUF in models/.cache), then:
    /root/.venvs/miles-ref/bin/python scripts/make_smollm2_goldens.py
With --check-tokenizer DIR it also compares DIR/tokenizer.json (written by `miles convert`) with
transformers' GGUF tokenizer on the prompts and a set of other strings, and prints the result.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.metadata
import sys
from pathlib import Path

import numpy as np
import torch
import transformers
from transformers import AutoModelForCausalLM, AutoTokenizer

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_gguf_fixtures import save_safetensors  # noqa: E402  (same folder)

ROOT = Path(__file__).resolve().parent.parent
GGUF = ROOT / "models" / ".cache" / "SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
OUT = ROOT / "tests" / "data" / "smollm2" / "goldens.safetensors"

PROMPTS = [
    "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n",
    "The quick brown fox jumps over the lazy dog. In 2024, 17 scientists counted 365 foxes.",
    "def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + ",
]
EXTRA_TOKENIZER_STRINGS = [
    "", " ", "  leading spaces", "trailing  ", "tabs\tand\nnewlines\r\n", "3.14159 and 1,000,000",
    "caf\u00e9 na\u00efve \u00fcber \u65e5\u672c\u8a9e \U0001F600", "<|im_start|>system\nhi<|im_end|>",
    "don't you'll we've I'M", "x" * 50, "a\u00a0b", "<|endoftext|>tail",
]


def check_tokenizer(tok, directory: Path) -> int:
    from tokenizers import Tokenizer

    ours = Tokenizer.from_file(str(directory / "tokenizer.json"))
    bad = 0
    for text in PROMPTS + EXTRA_TOKENIZER_STRINGS:
        want = tok(text, add_special_tokens=True)["input_ids"]
        got = ours.encode(text, add_special_tokens=True).ids
        ok = want == got and ours.decode(got, skip_special_tokens=False) == tok.decode(want)
        bad += not ok
        print(("ok  " if ok else "DIFF") + f" {text[:40]!r}: {len(want)} tokens" +
              ("" if ok else f"\n     transformers {want}\n     miles        {got}"))
    print(f"tokenizer check: {bad} differences")
    return bad


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gguf", type=Path, default=GGUF)
    ap.add_argument("--check-tokenizer", type=Path, help="a directory written by `miles convert`")
    args = ap.parse_args()
    data = args.gguf.read_bytes()
    digest = hashlib.sha256(data).hexdigest()
    if digest != GGUF_SHA256:
        print(f"{args.gguf}: sha256 {digest}, expected {GGUF_SHA256}", file=sys.stderr)
        return 1
    del data

    torch.manual_seed(0)
    torch.set_num_threads(1)
    directory, name = str(args.gguf.parent), args.gguf.name
    tok = AutoTokenizer.from_pretrained(directory, gguf_file=name)
    if args.check_tokenizer:
        return 1 if check_tokenizer(tok, args.check_tokenizer) else 0
    model = AutoModelForCausalLM.from_pretrained(directory, gguf_file=name, dtype=torch.float32)
    model.eval()
    vocab = model.config.vocab_size

    rng = np.random.default_rng(20250302)
    probe = np.sort(rng.choice(vocab, size=256, replace=False)).astype(np.int32)
    tensors: dict[str, np.ndarray] = {"probe_ids": probe}
    meta = {
        "gguf_sha256": GGUF_SHA256,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "gguf": importlib.metadata.version("gguf"),
    }
    for p, text in enumerate(PROMPTS):
        ids = tok(text, add_special_tokens=True)["input_ids"]
        with torch.no_grad():
            logits = model(torch.tensor([ids])).logits[0].numpy().astype(np.float32)
        tensors[f"prompt{p}.ids"] = np.array(ids, dtype=np.int32)
        tensors[f"prompt{p}.logits_last"] = np.ascontiguousarray(logits[-2:])
        tensors[f"prompt{p}.probe_logits"] = np.ascontiguousarray(logits[:, probe])
        tensors[f"prompt{p}.argmax"] = logits.argmax(axis=1).astype(np.int32)
        meta[f"prompt{p}"] = text

    eos = tok.convert_tokens_to_ids("<|im_end|>")
    ids = list(tensors["prompt0.ids"])
    answer: list[int] = []
    with torch.no_grad():
        for _ in range(24):  # greedy, full recompute: no cache subtleties
            nxt = int(model(torch.tensor([ids + answer])).logits[0, -1].argmax())
            answer.append(nxt)
            if nxt == eos:
                break
    tensors["answer.ids"] = np.array(answer, dtype=np.int32)
    meta["answer"] = tok.decode(answer)
    OUT.parent.mkdir(parents=True, exist_ok=True)
    save_safetensors(OUT, tensors, meta)
    print(f"wrote {OUT} ({OUT.stat().st_size} bytes); answer: {meta['answer']!r}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

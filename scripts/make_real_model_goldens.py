#!/usr/bin/env python3
"""Make the real models' goldens: transformers' float32 logits for SmolLM2-135M-Instruct
(tests/data/smollm2/goldens.safetensors, --model smollm2) and Gemma-3-270M
(tests/data/gemma3_270m/goldens.safetensors, --model gemma3).

transformers loads the same GGUF that scripts/get_models.sh converts for miles
(AutoModelForCausalLM.from_pretrained(dir, gguf_file=...): its own dequantisation, q/k
un-permutation and Gemma's norm − 1, computed in float32 on CPU), so tests/smollm2_test.cc and
tests/gemma3_270m_test.cc compare two independent implementations on the same weights. Token ids
come from transformers' tokenizer built from the same GGUF.

Contents (keys; P = prompt index 0..2, T_P its length, V the vocabulary):
  prompt{P}.ids             int32 [T_P]
  prompt{P}.logits_last     float32 [2, V / S]  logits of the last two positions at ids 0, S, 2S, ..
  last_stride               int32 [1]        S, when not 1 (Gemma: 32, so the goldens stay small)
  prompt{P}.probe_logits    float32 [T_P, 256]  logits of every position at the 256 `probe_ids`
  probe_ids                 int32 [256]      fixed vocabulary ids (seeded), plus each row's argmax below
  prompt{P}.argmax          int32 [T_P]      argmax of every position
  answer.ids                int32 [N]        transformers' greedy continuation of prompt 0 (SmolLM2: a
                                             ChatML question; Gemma: "The capital of France is"), up
                                             to 24 tokens, stopping at <|im_end|> / <eos>
Metadata: versions, the GGUF sha256, the prompts' texts and the answer's text.

Run scripts/get_models.sh [gemma3] first (it caches the GGUF in models/.cache), then, with torch and
transformers (the golden venv):
    python scripts/make_real_model_goldens.py [--model smollm2|gemma3]
With --check-tokenizer DIR it also compares DIR/tokenizer.json (written by `miles convert`) with
transformers' GGUF tokenizer on the prompts and a set of other strings, and prints the result.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.metadata
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import transformers
from transformers import AutoModelForCausalLM, AutoTokenizer

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_gguf_fixtures import save_safetensors  # noqa: E402  (same folder)

ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Preset:
    gguf: Path
    sha256: str
    out: Path
    prompts: list[str]
    stop: str  # the token greedy decoding of prompt 0 stops at
    extra_strings: list[str]
    last_stride: int = 1  # logits_last keeps every last_stride-th vocabulary id (small goldens)


PRESETS = {
    "smollm2": Preset(
        gguf=ROOT / "models" / ".cache" / "SmolLM2-135M-Instruct.Q4_1.gguf",
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        out=ROOT / "tests" / "data" / "smollm2" / "goldens.safetensors",
        prompts=[
            "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n",
            "The quick brown fox jumps over the lazy dog. In 2024, 17 scientists counted 365 foxes.",
            "def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + ",
        ],
        stop="<|im_end|>",
        extra_strings=["<|im_start|>system\nhi<|im_end|>", "<|endoftext|>tail"],
    ),
    # Gemma-3-270M (base): plain-text prompts, BOS added by the tokenizer; greedy stops at <eos>.
    "gemma3": Preset(
        gguf=ROOT / "models" / ".cache" / "gemma-3-270m-q4_k_m.gguf",
        sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        out=ROOT / "tests" / "data" / "gemma3_270m" / "goldens.safetensors",
        prompts=[
            "The capital of France is",
            "The quick brown fox jumps over the lazy dog. In 2024, 17 scientists counted 365 foxes.",
            "def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + ",
        ],
        stop="<eos>",
        extra_strings=["<start_of_turn>user\nhi<end_of_turn>", "<eos>tail"],
        last_stride=32,
    ),
}
EXTRA_TOKENIZER_STRINGS = [
    "", " ", "  leading spaces", "trailing  ", "tabs\tand\nnewlines\r\n", "3.14159 and 1,000,000",
    "caf\u00e9 na\u00efve \u00fcber \u65e5\u672c\u8a9e \U0001F600", "don't you'll we've I'M", "x" * 50, "a\u00a0b",
]


def check_tokenizer(tok, directory: Path, preset: Preset) -> int:
    from tokenizers import Tokenizer

    ours = Tokenizer.from_file(str(directory / "tokenizer.json"))
    bad = 0
    for text in preset.prompts + EXTRA_TOKENIZER_STRINGS + preset.extra_strings:
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
    ap.add_argument("--model", choices=sorted(PRESETS), default="smollm2")
    ap.add_argument("--gguf", type=Path, help="default: the preset's file in models/.cache")
    ap.add_argument("--check-tokenizer", type=Path, help="a directory written by `miles convert`")
    args = ap.parse_args()
    preset = PRESETS[args.model]
    gguf = args.gguf or preset.gguf
    data = gguf.read_bytes()
    digest = hashlib.sha256(data).hexdigest()
    if digest != preset.sha256:
        print(f"{gguf}: sha256 {digest}, expected {preset.sha256}", file=sys.stderr)
        return 1
    del data

    torch.manual_seed(0)
    torch.set_num_threads(1)
    directory, name = str(gguf.parent), gguf.name
    tok = AutoTokenizer.from_pretrained(directory, gguf_file=name)
    if args.check_tokenizer:
        return 1 if check_tokenizer(tok, args.check_tokenizer, preset) else 0
    model = AutoModelForCausalLM.from_pretrained(directory, gguf_file=name, dtype=torch.float32)
    model.eval()
    vocab = model.config.vocab_size

    rng = np.random.default_rng(20250302)
    probe = np.sort(rng.choice(vocab, size=256, replace=False)).astype(np.int32)
    tensors: dict[str, np.ndarray] = {"probe_ids": probe}
    if preset.last_stride > 1:
        tensors["last_stride"] = np.array([preset.last_stride], dtype=np.int32)
    meta = {
        "gguf_sha256": preset.sha256,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "gguf": importlib.metadata.version("gguf"),
    }
    for p, text in enumerate(preset.prompts):
        ids = tok(text, add_special_tokens=True)["input_ids"]
        with torch.no_grad():
            logits = model(torch.tensor([ids])).logits[0].numpy().astype(np.float32)
        tensors[f"prompt{p}.ids"] = np.array(ids, dtype=np.int32)
        tensors[f"prompt{p}.logits_last"] = np.ascontiguousarray(logits[-2:, ::preset.last_stride])
        tensors[f"prompt{p}.probe_logits"] = np.ascontiguousarray(logits[:, probe])
        tensors[f"prompt{p}.argmax"] = logits.argmax(axis=1).astype(np.int32)
        meta[f"prompt{p}"] = text

    eos = tok.convert_tokens_to_ids(preset.stop)
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
    preset.out.parent.mkdir(parents=True, exist_ok=True)
    save_safetensors(preset.out, tensors, meta)
    print(f"wrote {preset.out} ({preset.out.stat().st_size} bytes); answer: {meta['answer']!r}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

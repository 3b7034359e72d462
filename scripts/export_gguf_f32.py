#!/usr/bin/env python3
"""Export a Llama model that miles runs to a float32 GGUF that llama.cpp runs: same weights, same precision.

Why: `scripts/bench_llamacpp.py` compares miles with llama.cpp, and that comparison only means something
when both run the same model at the same precision. miles computes in float32, so this writes every
tensor as F32 (GGUF file type ALL_F32), and the benchmark checks the logits of the two agree.

Two sources:
  --hf-dir DIR      an HF Llama directory (config.json + model.safetensors, e.g. what `miles convert`
                    writes). HF stores q/k rows in half-split rotary order; llama.cpp's `llama`
                    architecture wants the original interleaved pairs, so q_proj and k_proj are
                    reordered with the inverse of HF's permutation — the same reordering llama.cpp's
                    convert_hf_to_gguf.py applies (per head group: rows viewed as [2, head_dim / 2]
                    are transposed to [head_dim / 2, 2]; k uses the KV head count).
  --llama2c FILE    a llama2.c checkpoint (legacy or version-1 "ak42" export), whose q/k rows are
                    already interleaved: copied as they are. Tokenizer: --llama2c-tokenizer tok*.bin.
Tokenizer metadata (tokenizer.*) is copied from --tokenizer-gguf when given (e.g. the original SmolLM2
GGUF that scripts/get_models.sh caches in models/.cache), else rebuilt from the llama2.c tokenizer.

Run with the reference venv (numpy, safetensors, gguf):
    /root/.venvs/miles-ref/bin/python scripts/export_gguf_f32.py --hf-dir models/smollm2-135m-instruct \
        --tokenizer-gguf models/.cache/SmolLM2-135M-Instruct.Q4_1.gguf --out /tmp/smollm2-f32.gguf
"""

from __future__ import annotations

import argparse
import json
import struct
import sys
from pathlib import Path

import numpy as np


def die(msg: str) -> None:
    print(f"export_gguf_f32.py: error: {msg}", file=sys.stderr)
    sys.exit(1)


def hf_to_interleaved(w: np.ndarray, n_head: int) -> np.ndarray:
    """Inverse of HF's rotary permutation: per head, rows [x0..x(d/2-1), y0..] -> [x0, y0, x1, y1, ...]."""
    rows = w.shape[0]
    if rows % (2 * n_head):
        die(f"cannot reorder {rows} rows into {n_head} heads of rotary pairs")
    return w.reshape(n_head, 2, rows // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


# ---- model sources: (hparams, [(gguf name, float32 array)]) -----------------------------------------


def read_hf_dir(d: Path):
    from safetensors.numpy import load_file

    cfg = json.loads((d / "config.json").read_text())
    if cfg.get("model_type") != "llama":
        die(f"{d}/config.json: model_type {cfg.get('model_type')!r}; only llama is exported")
    files = sorted(d.glob("*.safetensors"))
    if not files:
        die(f"no *.safetensors in {d}")
    src = {}
    for f in files:
        src.update(load_file(f))
    n_head, n_kv = cfg["num_attention_heads"], cfg.get("num_key_value_heads", cfg["num_attention_heads"])
    hp = {
        "n_vocab": cfg["vocab_size"],
        "n_embd": cfg["hidden_size"],
        "n_ff": cfg["intermediate_size"],
        "n_layer": cfg["num_hidden_layers"],
        "n_head": n_head,
        "n_kv": n_kv,
        "head_dim": cfg.get("head_dim") or cfg["hidden_size"] // n_head,
        "ctx": cfg["max_position_embeddings"],
        "eps": cfg["rms_norm_eps"],
        "rope_theta": cfg.get("rope_theta", 10000.0),
        "name": d.name,
    }
    if cfg.get("rope_scaling"):
        die(f"{d}/config.json: rope_scaling is not exported")
    per_layer = {
        "input_layernorm.weight": "attn_norm.weight",
        "self_attn.q_proj.weight": "attn_q.weight",
        "self_attn.k_proj.weight": "attn_k.weight",
        "self_attn.v_proj.weight": "attn_v.weight",
        "self_attn.o_proj.weight": "attn_output.weight",
        "post_attention_layernorm.weight": "ffn_norm.weight",
        "mlp.gate_proj.weight": "ffn_gate.weight",
        "mlp.up_proj.weight": "ffn_up.weight",
        "mlp.down_proj.weight": "ffn_down.weight",
    }
    out = [("token_embd.weight", src.pop("model.embed_tokens.weight"))]
    for i in range(hp["n_layer"]):
        for hf, gg in per_layer.items():
            w = src.pop(f"model.layers.{i}.{hf}")
            if hf.startswith("self_attn.q_proj"):
                w = hf_to_interleaved(w, n_head)
            elif hf.startswith("self_attn.k_proj"):
                w = hf_to_interleaved(w, n_kv)
            out.append((f"blk.{i}.{gg}", w))
    out.append(("output_norm.weight", src.pop("model.norm.weight")))
    if "lm_head.weight" in src:
        lm = src.pop("lm_head.weight")
        if not cfg.get("tie_word_embeddings", False):
            out.append(("output.weight", lm))
    src = {k: v for k, v in src.items() if "rotary_emb" not in k}
    if src:
        die(f"tensors not exported: {sorted(src)[:5]}")
    return hp, out


def read_llama2c(path: Path):
    data = path.read_bytes()
    v1 = struct.unpack_from("<I", data, 0)[0] == 0x616B3432  # "ak42" as a little-endian uint32
    if v1:
        version = struct.unpack_from("<i", data, 4)[0]
        if version != 1:
            die(f"{path}: llama2.c export version {version}; only version 1 (float32) is exported")
        dim, hidden, n_layer, n_head, n_kv, vocab, ctx = struct.unpack_from("<7i", data, 8)
        shared = data[36] != 0
        off = 256
    else:
        dim, hidden, n_layer, n_head, n_kv, vocab, ctx = struct.unpack_from("<7i", data, 0)
        shared = vocab > 0
        vocab = abs(vocab)
        off = 28
    hs = dim // n_head
    w = np.frombuffer(data, dtype="<f4", offset=off)
    pos = 0

    def take(*shape):
        nonlocal pos
        n = int(np.prod(shape))
        a = w[pos : pos + n].reshape(shape).astype(np.float32)
        pos += n
        return a

    if v1:  # version 1: norms first, then the matrices
        attn_norm, ffn_norm, out_norm = take(n_layer, dim), take(n_layer, dim), take(dim)
        emb = take(vocab, dim)
        wq, wk = take(n_layer, n_head * hs, dim), take(n_layer, n_kv * hs, dim)
        wv, wo = take(n_layer, n_kv * hs, dim), take(n_layer, dim, n_head * hs)
        w1, w2, w3 = take(n_layer, hidden, dim), take(n_layer, dim, hidden), take(n_layer, hidden, dim)
    else:  # legacy run.c order
        emb, attn_norm = take(vocab, dim), take(n_layer, dim)
        wq, wk = take(n_layer, n_head * hs, dim), take(n_layer, n_kv * hs, dim)
        wv, wo = take(n_layer, n_kv * hs, dim), take(n_layer, dim, n_head * hs)
        ffn_norm = take(n_layer, dim)
        w1, w2, w3 = take(n_layer, hidden, dim), take(n_layer, dim, hidden), take(n_layer, hidden, dim)
        out_norm = take(dim)
        take(ctx, hs // 2), take(ctx, hs // 2)  # run.c's precomputed rotary tables: unused
    cls = None if shared else take(vocab, dim)
    out = [("token_embd.weight", emb)]
    for i in range(n_layer):
        for name, t in [("attn_norm", attn_norm), ("attn_q", wq), ("attn_k", wk), ("attn_v", wv),
                        ("attn_output", wo), ("ffn_norm", ffn_norm), ("ffn_gate", w1),
                        ("ffn_down", w2), ("ffn_up", w3)]:
            out.append((f"blk.{i}.{name}.weight", t[i]))
    out.append(("output_norm.weight", out_norm))
    if cls is not None:
        out.append(("output.weight", cls))
    hp = {"n_vocab": vocab, "n_embd": dim, "n_ff": hidden, "n_layer": n_layer, "n_head": n_head,
          "n_kv": n_kv, "head_dim": hs, "ctx": ctx, "eps": 1e-5, "rope_theta": 10000.0,
          "name": path.stem}
    return hp, out


# ---- tokenizers ---------------------------------------------------------------------------------------


def copy_tokenizer(writer, gguf_path: Path, n_vocab: int) -> None:
    import gguf

    reader = gguf.GGUFReader(gguf_path)
    copied = 0
    for key, field in reader.fields.items():
        if not key.startswith("tokenizer."):
            continue
        types = field.types
        sub = types[1] if types[0] == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(key, field.contents(), types[0], sub_type=sub)
        copied += 1
    tokens = reader.fields.get("tokenizer.ggml.tokens")
    if tokens is None or len(tokens.contents()) != n_vocab:
        die(f"{gguf_path}: its tokenizer does not have {n_vocab} tokens")
    print(f"export_gguf_f32.py: copied {copied} tokenizer fields from {gguf_path}")


def llama2c_tokenizer(writer, path: Path, n_vocab: int) -> None:
    """A llama2.c tok*.bin (sentencepiece pieces with '▁' written as ' ') as a GGUF `llama` vocab."""
    import gguf

    data = path.read_bytes()
    off = 4
    tokens, scores, types = [], [], []
    for i in range(n_vocab):
        score, n = struct.unpack_from("<fi", data, off)
        off += 8
        piece = data[off : off + n].decode("utf-8")
        off += n
        kind = gguf.TokenType.NORMAL
        if i == 0:
            kind = gguf.TokenType.UNKNOWN
        elif i in (1, 2):
            piece = "<s>" if i == 1 else "</s>"
            kind = gguf.TokenType.CONTROL
        elif len(piece) == 6 and piece.startswith("<0x") and piece.endswith(">"):
            kind = gguf.TokenType.BYTE
        else:
            piece = piece.replace(" ", "\u2581")
        tokens.append(piece)
        scores.append(score)
        types.append(kind)
    if off != len(data):
        die(f"{path}: {len(data) - off} bytes left after {n_vocab} tokens")
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores(scores)
    writer.add_token_types(types)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_unk_token_id(0)
    writer.add_add_bos_token(True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--hf-dir", type=Path)
    src.add_argument("--llama2c", type=Path)
    ap.add_argument("--llama2c-tokenizer", type=Path, help="tok*.bin for --llama2c")
    ap.add_argument("--tokenizer-gguf", type=Path, help="copy tokenizer.* from this GGUF")
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args()

    import gguf

    hp, tensors = read_hf_dir(a.hf_dir) if a.hf_dir else read_llama2c(a.llama2c)
    tmp = a.out.with_suffix(a.out.suffix + ".tmp")
    w = gguf.GGUFWriter(tmp, "llama")
    w.add_name(hp["name"])
    w.add_context_length(hp["ctx"])
    w.add_embedding_length(hp["n_embd"])
    w.add_block_count(hp["n_layer"])
    w.add_feed_forward_length(hp["n_ff"])
    w.add_head_count(hp["n_head"])
    w.add_head_count_kv(hp["n_kv"])
    w.add_layer_norm_rms_eps(hp["eps"])
    w.add_rope_freq_base(hp["rope_theta"])
    w.add_rope_dimension_count(hp["head_dim"])
    w.add_key_length(hp["head_dim"])
    w.add_value_length(hp["head_dim"])
    w.add_vocab_size(hp["n_vocab"])
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    if a.tokenizer_gguf:
        copy_tokenizer(w, a.tokenizer_gguf, hp["n_vocab"])
    elif a.llama2c_tokenizer:
        llama2c_tokenizer(w, a.llama2c_tokenizer, hp["n_vocab"])
    else:
        die("give --tokenizer-gguf or --llama2c-tokenizer (llama.cpp needs a vocabulary)")
    params = 0
    for name, t in tensors:
        t = np.ascontiguousarray(t, dtype=np.float32)
        params += t.size
        w.add_tensor(name, t)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    tmp.replace(a.out)
    print(f"export_gguf_f32.py: wrote {a.out} ({len(tensors)} tensors, "
          f"{params / 1e6:.2f} M float32 parameters)")


if __name__ == "__main__":
    main()

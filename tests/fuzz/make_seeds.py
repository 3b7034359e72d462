#!/usr/bin/env python3
"""Writes the committed seed corpora under tests/fuzz/corpus/ (run from anywhere; stdlib only).

Seeds are tiny valid files, so that the fuzzers start from inputs that reach deep into the parsers:
safetensors images with every dtype, metadata and a zero-size tensor, and llama2.c checkpoints in
both formats (plus, when ../shared is present, the first bytes of stories260K.bin).
"""
import json
import os
import struct

HERE = os.path.dirname(os.path.abspath(__file__))


def safetensors(tensors, metadata=None):
    header, data = {}, b""
    if metadata:
        header["__metadata__"] = metadata
    for name, dtype, shape, payload in tensors:
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(data), len(data) + len(payload)]}
        data += payload
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text + data


def floats(n, scale=0.01):
    return struct.pack(f"<{n}f", *[scale * (i % 17 - 8) for i in range(n)])


def llama2c(v1, dim=8, hidden=12, layers=1, heads=2, kv_heads=1, vocab=4, seq_len=4, shared=True):
    hs, kv = dim // heads, kv_heads * dim // heads
    sizes = dict(att=layers * dim, ffn=layers * dim, final=dim, emb=vocab * dim, wq=layers * dim * dim,
                 wk=layers * kv * dim, wv=layers * kv * dim, wo=layers * dim * dim, w1=layers * hidden * dim,
                 w2=layers * dim * hidden, w3=layers * hidden * dim, freq=seq_len * hs // 2)
    if v1:
        order = ["att", "ffn", "final", "emb", "wq", "wk", "wv", "wo", "w1", "w2", "w3"]
        head = struct.pack("<Ii7iB", 0x616B3432, 1, dim, hidden, layers, heads, kv_heads, vocab, seq_len,
                           1 if shared else 0)
        head += b"\0" * (256 - len(head))
    else:
        order = ["emb", "att", "wq", "wk", "wv", "wo", "ffn", "w1", "w2", "w3", "final", "freq", "freq"]
        head = struct.pack("<7i", dim, hidden, layers, heads, kv_heads, vocab if shared else -vocab, seq_len)
    body = b"".join(floats(sizes[k]) for k in order)
    if not shared:
        body += floats(sizes["emb"], 0.02)
    return head + body


def write(sub, name, data):
    os.makedirs(os.path.join(HERE, "corpus", sub), exist_ok=True)
    with open(os.path.join(HERE, "corpus", sub, name), "wb") as f:
        f.write(data)


write("safetensors", "all_dtypes", safetensors([
    ("f32", "F32", [2, 3], floats(6)),
    ("bf16", "BF16", [3], b"\x80\x3f\x00\x40\x40\x40"),
    ("f16", "F16", [2], b"\x00\x3c\x00\xc0"),
    ("i32", "I32", [2], struct.pack("<2i", -1, 7)),
    ("empty", "F32", [0, 4], b""),
    ("u8", "U8", [1], b"\x05"),
], {"format": "pt"}))
write("safetensors", "one_tensor", safetensors([("model.norm.weight", "F32", [4], floats(4))]))
write("safetensors", "empty_header", safetensors([]))
write("llama2c", "v1_shared", llama2c(True))
write("llama2c", "v1_wcls", llama2c(True, shared=False))
write("llama2c", "legacy_shared", llama2c(False))
write("llama2c", "legacy_wcls", llama2c(False, shared=False, layers=2))
stories = os.path.join(HERE, "..", "..", "..", "shared", "models", "stories260K", "stories260K.bin")
if os.path.exists(stories):
    with open(stories, "rb") as f:
        write("llama2c", "stories260K_head", f.read(512))

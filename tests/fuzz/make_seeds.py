#!/usr/bin/env python3
"""Writes the committed seed corpora under tests/fuzz/corpus/ (run from anywhere; stdlib only).

Seeds are tiny valid files, so that the fuzzers start from inputs that reach deep into the parsers:
safetensors images with every dtype, metadata and a zero-size tensor, llama2.c checkpoints in both
formats (plus, when ../shared is present, the first bytes of stories260K.bin), the chat templates of
tests/data/chat (Qwen3's and SmolLM2's, and the interpreter's feature cases), and gRPC request
messages (a type byte, then the protobuf encoding; fuzz_grpc_messages.cc). corpus/disk_delta is
written by make_disk_delta_seeds.cc instead (zstd frames).
"""
import json
import os
import re
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


# Protobuf wire format (https://protobuf.dev/programming-guides/encoding/): enough for the seeds.
def varint(n):
    n &= (1 << 64) - 1  # negative int32/int64 values take ten bytes
    out = b""
    while True:
        b, n = n & 0x7F, n >> 7
        out += bytes([b | (0x80 if n else 0)])
        if not n:
            return out


def pb_varint(field, n):
    return varint(field << 3) + varint(n)


def pb_bytes(field, data):
    data = data.encode() if isinstance(data, str) else data
    return varint(field << 3 | 2) + varint(len(data)) + data


def pb_float(field, x):
    return varint(field << 3 | 5) + struct.pack("<f", x)


def pb_packed(field, values):
    return pb_bytes(field, b"".join(varint(v) for v in values))


def write(sub, name, data):
    os.makedirs(os.path.join(HERE, "corpus", sub), exist_ok=True)
    with open(os.path.join(HERE, "corpus", sub, name), "wb") as f:
        f.write(data)


# Dictionaries (libFuzzer -dict): the field names the engine's request parsers know, read from
# their sources, so that the fuzzers put every known key (and its value types) into the bodies
# they grow rather than hoping to spell one byte by byte.
def write_dict(name, sources):
    words = set()
    for src in sources:
        with open(os.path.join(HERE, "..", "..", src)) as f:
            words.update(re.findall(r'"([a-z][a-z0-9_]{1,40})"', f.read()))
    os.makedirs(os.path.join(HERE, "dict"), exist_ok=True)
    with open(os.path.join(HERE, "dict", name + ".dict"), "w") as f:
        f.write("# Written by make_seeds.py from " + ", ".join(sources) + ".\n")
        for w in sorted(words):  # as a key and as a string value ("type": "text")
            f.write('"\\"%s\\":"\n"\\"%s\\""\n' % (w, w))


write_dict("api_bodies", ["rollout/generate_api.cc", "rollout/openai_api.cc",
                          "rollout/tool_calls.cc", "weight_sync/route_bodies.cc"])
write_dict("sessions", ["rollout/openai_api.cc", "rollout/sessions.cc", "rollout/http_sessions.cc",
                        "rollout/chat_render.cc"])


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

chat = os.path.join(HERE, "..", "data", "chat")
with open(os.path.join(chat, "chat_goldens.json")) as f:
    for name, t in json.load(f)["templates"].items():
        write("jinja", name + ".jinja", t["source"].encode())
with open(os.path.join(chat, "jinja_cases.json")) as f:
    for case in json.load(f)["cases"]:
        write("jinja", "case_" + re.sub(r"[^A-Za-z0-9]+", "_", case["name"]) + ".jinja",
              case["template"].encode())

# fuzz_grpc_messages: the first byte picks the message (0 GenerateRequest, 1 PauseRequest,
# 2 AbortRequest, 3 UpdateWeightsFromDiskRequest, 4 UpdateWeightVersionRequest,
# 5 RegisterEngineRequest, 6 StopRequest, 7 ControllerStatusRequest).
sampling = (pb_float(1, 0.7) + pb_float(2, 0.9) + pb_varint(3, 5) + pb_float(4, 0.05)
            + pb_varint(5, 42) + pb_varint(6, 16) + pb_packed(7, [2, 7]) + pb_bytes(8, "\n\n")
            + pb_varint(9, 1) + pb_varint(10, 4))
write("grpc_messages", "generate_ids", b"\x00" + pb_packed(1, [1, 2, 3, 300])
      + pb_bytes(3, sampling) + pb_varint(4, 1) + pb_bytes(5, "rid-1"))
write("grpc_messages", "generate_text", b"\x00" + pb_bytes(2, "Hello, world! é")
      + pb_bytes(3, pb_varint(6, 8)))
write("grpc_messages", "pause_retract", b"\x01" + pb_varint(1, 1))
write("grpc_messages", "pause_in_place", b"\x01" + pb_varint(1, 2))
write("grpc_messages", "abort", b"\x02" + pb_bytes(1, "rid-1"))
write("grpc_messages", "update_from_disk", b"\x03" + pb_bytes(1, "/models/step_3") + pb_varint(2, 1)
      + pb_varint(3, 3))
write("grpc_messages", "update_version", b"\x04" + pb_varint(1, 7))
write("grpc_messages", "register_engine", b"\x05" + pb_bytes(1, "10.0.0.2") + pb_varint(2, 30000)
      + pb_varint(3, 30001) + pb_varint(4, -1) + pb_varint(5, 1234) + pb_varint(6, 2))
write("grpc_messages", "stop", b"\x06" + pb_bytes(1, "operator"))
write("grpc_messages", "controller_status", b"\x07")

# fuzz_rewards: a flags byte (1 truncated, 2 case-sensitive, 4 answer prefix / require_finish,
# 8 pattern and keywords from the spec text, high nibble tolerance and max_tokens), then
# response \0 label \0 spec text \0 reply body or url.
def reward(flags, response, label, spec, tail):
    return bytes([flags]) + b"\0".join(x.encode() for x in (response, label, spec, tail))


write("rewards", "numeric_prefix", reward(0x24, "so the answer is #### 1,234.5", "1234.5", "####",
                                          '{"score": 0.75}'))
write("rewards", "numeric_label_string", reward(0x10, "I think -3 or maybe .5", '" 0.5 "', "",
                                                "0.5"))
write("rewards", "exact_match", reward(0x02, "  Paris\n", '"Paris"', "", "localhost:8000/score"))
write("rewards", "regex_spec", reward(0x08, "The answer: 42.", "null", r"answer:\s*(\d+)",
                                      "http://127.0.0.1:9/rm"))
write("rewards", "regex_label", reward(0x00, "abcabc", r'"(abc)\\1"', "", "https://rm.example/v1/score"))
write("rewards", "keywords_spec", reward(0x0a, "Photosynthesis uses Light and CO2", "null",
                                         "light,co2,oxygen", '{"score": true}'))
write("rewards", "keywords_label", reward(0x00, "a cat and a dog", '["cat", "DOG", "bird"]', "",
                                          "[1]"))
write("rewards", "length_truncated", reward(0x35, "x" * 60, "null", "", "1e999"))
write("rewards", "rollout_dict", reward(0x00, "", '{"reward": -0.25, "steps": 3}', "",
                                        "ftp://host/x"))

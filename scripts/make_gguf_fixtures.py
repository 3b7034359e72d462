#!/usr/bin/env python3
"""Make the small GGUF fixtures under tests/data/gguf/ and their expected values.

What it makes (deterministic: fixed seeds, CPU):
  tests/data/gguf/types.gguf            one tensor per ggml type the C++ reader decodes (F32, F16, BF16,
                                        Q8_0, Q4_0, Q4_1, Q4_K, Q6_K; plus 3-D and 4-D F32 tensors for the
                                        shape order; then Q5_0, Q5_1, Q2_K, Q3_K, Q5_K, IQ4_NL, IQ4_XS) and one
                                        metadata key per GGUF value type, written by the `gguf` package's
                                        GGUFWriter. F32/F16/BF16 hold random bit patterns (with inf, quiet
                                        NaNs, subnormals, -0); Q8_0/Q4_0/Q4_1/Q5_0/Q5_1 are the package's own
                                        quantisations of random normals (one all-zero row); the package has no
                                        quantiser for the k-quants and IQ4 types, so those blocks are random
                                        bytes with finite half-precision (super-)block scales.
  tests/data/gguf/types_expected.safetensors
                                        each tensor as the package's numpy dequantisers decode it (float32,
                                        row-major: shape = reversed ggml ne), read back through GGUFReader.
  tests/data/gguf/tiny_llama.gguf       a tiny random Llama (vocab 288, hidden 64, 2 layers, 4 heads, 2 KV
                                        heads, untied output) written the way llama.cpp's converter does:
                                        q/k rows permuted to interleaved rotary pairs, token_embd Q8_0,
                                        matrices Q4_1, output F16, norms F32, and a byte-level BPE tokenizer
                                        (3 control tokens, 256 byte tokens, 29 merges, pre "smollm", ChatML
                                        template) in the metadata.
  tests/data/gguf/tiny_llama_expected.safetensors
                                        transformers' view of that file (AutoModelForCausalLM.from_pretrained
                                        with gguf_file=, float32): `ids` (int32 [12]), `logits` (float32
                                        [12, 288]), and layer 0's q_proj / k_proj as transformers un-permuted
                                        them. Before saving, the script asserts that those equal the original
                                        (unpermuted) weights after the same quantisation, i.e. that
                                        transformers' reverse permutation undoes llama.cpp's.

  tests/data/gguf/tiny_qwen2.gguf       a tiny random Qwen2 as llama.cpp writes one (rows in HF's order, q/k/v
                                        biases F32, matrices Q8_0, tied embeddings, pre "qwen2", rope 1e6).
  tests/data/gguf/tiny_qwen2_expected.safetensors
                                        transformers' view of it: `ids`, `logits`, layer 0's q_proj weight,
                                        layer 1's q bias and layer 0's v bias.

  tests/data/gguf/tiny_phi3.gguf        a tiny random Phi-3 as llama.cpp writes one (attn_qkv and ffn_up fused,
                                        Q8_0, untied F16 output, full rotary, no window); tiny_phi3_expected:
                                        transformers' `ids`, `logits`, layer 1's qkv_proj and layer 0's gate_up_proj.

  tests/data/gguf/tiny_gemma3.gguf      a tiny random Gemma 3 as llama.cpp writes one (norms stored as 1 + w, head_dim 8
                                        unlike hidden / heads, 7 layers, window 4, linear RoPE scaling, Q8_0 / Q5_0 /
                                        F16 / F32 tensors); tiny_gemma3_expected: every tensor of transformers' GGUF
                                        loader's state dict, and the logits of Gemma3ForCausalLM with those weights
                                        under the config llama.cpp's semantics give (make_tiny_gemma3's docstring).

  tests/data/gguf/tiny_glm4moe.gguf     tests/data/models/glm4_moe (a random Glm4MoeForCausalLM) as llama.cpp's
                                        Glm4MoeModel converter writes it in float32: experts stacked into 3-D
                                        ffn_*_exps tensors, exp_probs_b, shexp, q/k/v biases, q/k norms, partial
                                        rotary, plus one random NextN block that conversion skips; the tiny
                                        vocabulary padded to 1024 (make_tiny_glm4moe's docstring). Its expected
                                        values are the checkpoint itself and tests/data/goldens/glm4_moe.

  tests/data/gguf/tiny_deepseek2.gguf   tests/data/models/deepseek_v3 (a random DeepseekV3ForCausalLM) as llama.cpp's
                                        DeepseekV2Model converter writes it in float32: MLA as MQA (head_count_kv 1,
                                        key/value lengths of the latent, key_length_mla / value_length_mla), kv_b_proj
                                        split into attn_k_b (transposed) and attn_v_b, experts stacked, exp_probs_b,
                                        no MTP block (the converter skips it); make_tiny_deepseek2's docstring. Its
                                        expected values are the checkpoint itself and tests/data/goldens/deepseek_v3.

Rerun with:  PYTHON scripts/make_gguf_fixtures.py [types] [tiny_llama] [tiny_qwen2] [tiny_phi3] [tiny_gemma3]
             [tiny_glm4moe] [tiny_deepseek2]
(PYTHON: a venv with gguf, numpy, torch and transformers: scripts/setup.sh --reference)
"""

from __future__ import annotations

import importlib.metadata
import json
import sys
from pathlib import Path

import gguf
import numpy as np
from gguf import GGMLQuantizationType as Q

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "tests" / "data" / "gguf"
SEED = 20250301

CHAT_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face"
    "<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + "
    "'<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}"
    "{% endif %}"
)


def quiet_nans(bits: np.ndarray, exp_mask: int, mant_mask: int) -> np.ndarray:
    """16-bit patterns with every NaN made quiet (top mantissa bit set): signalling NaNs convert
    differently on different hardware, and no real checkpoint has them."""
    bits = bits.astype(np.uint16)
    nan = ((bits & exp_mask) == exp_mask) & ((bits & mant_mask) != 0)
    quiet = (mant_mask + 1) >> 1
    return np.where(nan, bits | quiet, bits).astype(np.uint16)


def random_k_blocks(rng: np.random.Generator, n_blocks: int, block_bytes: int, scale_at: list[int]) -> np.ndarray:
    """Random bytes for k-quant blocks, with finite half scales at the given byte offsets."""
    blocks = rng.integers(0, 256, size=(n_blocks, block_bytes), dtype=np.uint8)
    for off in scale_at:
        halves = (rng.standard_normal(n_blocks) * 0.05).astype(np.float16)
        blocks[:, off : off + 2] = halves.view(np.uint8).reshape(n_blocks, 2)
    return blocks


def make_types(path: Path) -> None:
    rng = np.random.default_rng(SEED)
    w = gguf.GGUFWriter(str(path), "test")
    # One key per value type (the C++ test checks these values).
    w.add_uint8("test.u8", 200)
    w.add_int8("test.i8", -100)
    w.add_uint16("test.u16", 60000)
    w.add_int16("test.i16", -30000)
    w.add_uint32("test.u32", 4000000000)
    w.add_int32("test.i32", -2000000000)
    w.add_uint64("test.u64", 2**62 + 1)
    w.add_int64("test.i64", -(2**62) - 1)
    w.add_float32("test.f32", 0.1)
    w.add_float64("test.f64", 0.1)
    w.add_bool("test.bool", True)
    w.add_string("test.string", "h\u00e9llo \u2713")
    w.add_array("test.ints", [1, -2, 3])
    w.add_array("test.strings", ["a", "", "\u00fc"])
    w.add_array("test.floats", [0.5, -1.25])
    w.add_array("test.bools", [True, False, True])

    f32 = rng.standard_normal((3, 40)).astype(np.float32)
    f32.reshape(-1)[:6] = [np.inf, -np.inf, np.nan, -0.0, 1e-40, -3e-39]
    w.add_tensor("f32", f32)
    f16 = quiet_nans(rng.integers(0, 1 << 16, size=(3, 40)), 0x7C00, 0x03FF)
    f16.reshape(-1)[:6] = [0x7C00, 0xFC00, 0x7E00, 0x8000, 0x0001, 0x83FF]  # inf, -inf, NaN, -0, subnormals
    w.add_tensor("f16", f16.view(np.float16))
    bf16 = quiet_nans(rng.integers(0, 1 << 16, size=(3, 40)), 0x7F80, 0x007F)
    bf16.reshape(-1)[:4] = [0x7F80, 0xFF80, 0x7FC0, 0x0001]
    w.add_tensor("bf16", bf16.view(np.uint8).reshape(3, 80), raw_dtype=Q.BF16)
    for name, qtype in (("q8_0", Q.Q8_0), ("q4_0", Q.Q4_0), ("q4_1", Q.Q4_1)):
        x = rng.standard_normal((4, 64)).astype(np.float32)
        x[3] = 0.0  # a zero block: d = 0
        w.add_tensor(name, gguf.quants.quantize(x, qtype), raw_dtype=qtype)
    # Q4_K: half d, half dmin, 12 scale bytes, 128 quant bytes; Q6_K: ql, qh, scales, half d at 208.
    w.add_tensor("q4_k", random_k_blocks(rng, 6, 144, [0, 2]).reshape(3, 288), raw_dtype=Q.Q4_K)
    w.add_tensor("q6_k", random_k_blocks(rng, 6, 210, [208]).reshape(3, 420), raw_dtype=Q.Q6_K)
    w.add_tensor("f32_3d", rng.standard_normal((2, 3, 8)).astype(np.float32))
    w.add_tensor("f32_4d", rng.standard_normal((2, 1, 3, 4)).astype(np.float32))
    # Added later, after every earlier draw of `rng`, so the tensors above keep their bytes. Q5_0 and
    # Q5_1 are the package's quantisations (one all-zero row); the package has no quantiser for the
    # others, so they are random block bytes with finite half scales at the given offsets.
    for name, qtype in (("q5_0", Q.Q5_0), ("q5_1", Q.Q5_1)):
        x = rng.standard_normal((4, 64)).astype(np.float32)
        x[3] = 0.0
        w.add_tensor(name, gguf.quants.quantize(x, qtype), raw_dtype=qtype)
    # Q2_K: scales[16], qs[64], half d, half dmin; Q3_K: hmask[32], qs[64], scales[12], half d;
    # Q5_K: half d, half dmin, scales[12], qh[32], qs[128]; IQ4_NL: half d, qs[16]; IQ4_XS: half d,
    # u16 scales_h, scales_l[4], qs[128].
    for name, qtype, elems, nbytes, halves in (("q2_k", Q.Q2_K, 256, 84, [80, 82]),
                                               ("q3_k", Q.Q3_K, 256, 110, [108]),
                                               ("q5_k", Q.Q5_K, 256, 176, [0, 2]),
                                               ("iq4_nl", Q.IQ4_NL, 32, 18, [0]),
                                               ("iq4_xs", Q.IQ4_XS, 256, 136, [0])):
        n_blocks = 6 if elems == 256 else 12
        blocks = random_k_blocks(rng, n_blocks, nbytes, halves)
        w.add_tensor(name, blocks.reshape(3, -1), raw_dtype=qtype)
    write(w)

    r = gguf.GGUFReader(str(path))
    expected = {}
    for t in r.tensors:
        values = gguf.quants.dequantize(t.data, t.tensor_type)
        shape = [int(n) for n in reversed(t.shape)]
        expected[t.name] = np.ascontiguousarray(values.reshape(shape).astype(np.float32))
    save_safetensors(OUT / "types_expected.safetensors", expected, versions())


def save_safetensors(path: Path, tensors: dict[str, np.ndarray], metadata: dict[str, str]) -> None:
    """A byte-for-byte reproducible .safetensors file (the safetensors package orders __metadata__ at
    random): u64 header size, JSON header with sorted keys padded to 8 bytes, tensors in name order."""
    dtypes = {np.dtype(np.float32): "F32", np.dtype(np.int32): "I32"}
    header: dict = {"__metadata__": dict(sorted(metadata.items()))}
    blobs, offset = [], 0
    for name in sorted(tensors):
        arr = np.ascontiguousarray(tensors[name])
        data = arr.astype(arr.dtype.newbyteorder("<"), copy=False).tobytes()
        header[name] = {"dtype": dtypes[arr.dtype], "shape": list(arr.shape),
                        "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(len(text).to_bytes(8, "little"))
        f.write(text)
        for b in blobs:
            f.write(b)
    path.chmod(0o644)


def versions() -> dict[str, str]:
    return {"gguf": importlib.metadata.version("gguf"), "numpy": np.__version__}


def write(w: gguf.GGUFWriter) -> None:
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


# ---- tiny Llama -------------------------------------------------------------------------------

VOCAB, HIDDEN, INTER, LAYERS, HEADS, KV_HEADS = 288, 64, 96, 2, 4, 2
HEAD_DIM = HIDDEN // HEADS


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character table."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("\u00a1"), ord("\u00ac") + 1)) + list(
        range(ord("\u00ae"), ord("\u00ff") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


def tiny_vocab() -> tuple[list[str], list[int], list[str]]:
    """3 control tokens, the 256 byte tokens, then 29 merged tokens with their merges."""
    b2u = bytes_to_unicode()
    tokens = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"] + [b2u[b] for b in range(256)]
    types = [3, 3, 3] + [1] * 256
    words = ["the", "is", "of", "capital", "France", "Paris", "What"]
    merges: list[str] = []
    for word in words:
        for spelled in (word, "\u0120" + word):  # Ġ: a leading space
            parts = list(spelled)
            while len(parts) > 1 and len(tokens) < VOCAB:
                merged = parts[0] + parts[1]
                if merged not in tokens:
                    merges.append(parts[0] + " " + parts[1])
                    tokens.append(merged)
                    types.append(1)
                parts = [merged] + parts[2:]
    assert len(tokens) == VOCAB, len(tokens)
    return tokens, types, merges


def permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's convert_hf_to_gguf permutation: HF half-split rotary rows -> interleaved pairs."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def roundtrip(x: np.ndarray, qtype: Q) -> np.ndarray:
    return gguf.quants.dequantize(gguf.quants.quantize(x, qtype), qtype).astype(np.float32)


def make_tiny_llama(path: Path) -> None:
    rng = np.random.default_rng(SEED + 1)

    def linear(out_f: int, in_f: int) -> np.ndarray:
        return (rng.standard_normal((out_f, in_f)) / np.sqrt(in_f)).astype(np.float32)

    def norm() -> np.ndarray:
        return (1 + 0.2 * rng.standard_normal(HIDDEN)).astype(np.float32)

    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name("tiny-llama")
    w.add_context_length(256)
    w.add_embedding_length(HIDDEN)
    w.add_feed_forward_length(INTER)
    w.add_block_count(LAYERS)
    w.add_head_count(HEADS)
    w.add_head_count_kv(KV_HEADS)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_dimension_count(HEAD_DIM)
    w.add_vocab_size(VOCAB)
    tokens, types, merges = tiny_vocab()
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("smollm")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    w.add_pad_token_id(2)
    w.add_add_bos_token(False)
    w.add_chat_template(CHAT_TEMPLATE)

    embed = rng.standard_normal((VOCAB, HIDDEN)).astype(np.float32)
    w.add_tensor("token_embd.weight", gguf.quants.quantize(embed, Q.Q8_0), raw_dtype=Q.Q8_0)
    originals = {}
    for l in range(LAYERS):
        p = f"blk.{l}."
        q, k = linear(HEADS * HEAD_DIM, HIDDEN), linear(KV_HEADS * HEAD_DIM, HIDDEN)
        originals[l] = (q, k)
        mats = {
            "attn_q": permute(q, HEADS),
            "attn_k": permute(k, KV_HEADS),
            "attn_v": linear(KV_HEADS * HEAD_DIM, HIDDEN),
            "attn_output": linear(HIDDEN, HEADS * HEAD_DIM),
            "ffn_gate": linear(INTER, HIDDEN),
            "ffn_up": linear(INTER, HIDDEN),
            "ffn_down": linear(HIDDEN, INTER),
        }
        w.add_tensor(p + "attn_norm.weight", norm())
        for name, m in mats.items():
            w.add_tensor(p + name + ".weight", gguf.quants.quantize(m, Q.Q4_1), raw_dtype=Q.Q4_1)
        w.add_tensor(p + "ffn_norm.weight", norm())
    w.add_tensor("output_norm.weight", norm())
    w.add_tensor("output.weight", (linear(VOCAB, HIDDEN) * 4).astype(np.float16))
    write(w)

    import torch
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(1)
    model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32)
    model.eval()
    sd = model.state_dict()
    q_hf = sd["model.layers.0.self_attn.q_proj.weight"].numpy()
    k_hf = sd["model.layers.0.self_attn.k_proj.weight"].numpy()
    q0, k0 = originals[0]
    # Rows are quantised independently, so un-permuting after quantising = quantising the original.
    assert np.array_equal(q_hf, roundtrip(q0, Q.Q4_1)), "transformers did not undo llama.cpp's q permutation"
    assert np.array_equal(k_hf, roundtrip(k0, Q.Q4_1)), "transformers did not undo llama.cpp's k permutation"
    ids = np.array([1, 3, 200, 259, 275, 40, 41, 287, 2, 100, 7, 286], dtype=np.int32)
    with torch.no_grad():
        logits = model(torch.from_numpy(ids.astype(np.int64))[None]).logits[0].numpy().astype(np.float32)
    import transformers

    save_safetensors(OUT / "tiny_llama_expected.safetensors",
                     {"ids": ids, "logits": logits, "q_proj0": q_hf, "k_proj0": k_hf},
                     {**versions(), "torch": torch.__version__, "transformers": transformers.__version__})


def random_makers(seed: int):
    """Seeded makers of random linear weights (N(0, 1/fan_in)) and norm weights (1 + 0.2 N(0, 1))."""
    rng = np.random.default_rng(seed)

    def linear(out_f: int, in_f: int) -> np.ndarray:
        return (rng.standard_normal((out_f, in_f)) / np.sqrt(in_f)).astype(np.float32)

    def norm() -> np.ndarray:
        return (1 + 0.2 * rng.standard_normal(HIDDEN)).astype(np.float32)

    return rng, linear, norm


def add_tiny_metadata(w: gguf.GGUFWriter, name: str, rope_base: float, eps: float, rope_dims: int | None,
                      pre: str, chat_template: str | None) -> None:
    """The sizes, RoPE, norm epsilon and the tiny byte-level vocabulary (BOS 1, EOS = pad = 2)."""
    w.add_name(name)
    w.add_context_length(256)
    w.add_embedding_length(HIDDEN)
    w.add_feed_forward_length(INTER)
    w.add_block_count(LAYERS)
    w.add_head_count(HEADS)
    w.add_head_count_kv(KV_HEADS)
    w.add_rope_freq_base(rope_base)
    if rope_dims is not None:
        w.add_rope_dimension_count(rope_dims)
    w.add_layer_norm_rms_eps(eps)
    w.add_vocab_size(VOCAB)
    tokens, types, merges = tiny_vocab()
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(pre)
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_pad_token_id(2)  # Phi3Config's default (32000) would be outside this vocabulary
    w.add_add_bos_token(False)
    if chat_template:
        w.add_chat_template(chat_template)


def save_transformers_view(path: Path, cls_name: str, out_name: str, picks: dict[str, str]) -> None:
    """transformers' own GGUF loader's view of `path`: its logits on fixed ids and the tensors
    `picks` names (saved name -> state_dict name), into `out_name`."""
    import torch
    import transformers
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(1)
    model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32)
    model.eval()
    assert type(model).__name__ == cls_name, type(model).__name__
    sd = model.state_dict()
    ids = np.array([1, 3, 200, 259, 275, 40, 41, 287, 2, 100, 7, 286], dtype=np.int32)
    with torch.no_grad():
        logits = model(torch.from_numpy(ids.astype(np.int64))[None]).logits[0].numpy().astype(np.float32)
    save_safetensors(OUT / out_name,
                     {"ids": ids, "logits": logits, **{k: sd[v].numpy() for k, v in picks.items()}},
                     {**versions(), "torch": torch.__version__, "transformers": transformers.__version__})


def make_tiny_qwen2(path: Path) -> None:
    """A tiny random Qwen2 as llama.cpp's converter writes one: arch qwen2, q/k rows in HF's order
    (its Qwen2 converter does not permute), q/k/v biases F32, matrices Q8_0, no output.weight (tied
    embeddings), pre-tokenizer qwen2, rope base 1e6."""
    rng, linear, norm = random_makers(SEED + 2)

    def bias(n: int) -> np.ndarray:
        return (0.5 * rng.standard_normal(n)).astype(np.float32)

    w = gguf.GGUFWriter(str(path), "qwen2")
    add_tiny_metadata(w, "tiny-qwen2", 1000000.0, 1e-6, None, "qwen2", CHAT_TEMPLATE)
    embed = rng.standard_normal((VOCAB, HIDDEN)).astype(np.float32)
    w.add_tensor("token_embd.weight", gguf.quants.quantize(embed, Q.Q8_0), raw_dtype=Q.Q8_0)
    for l in range(LAYERS):
        p = f"blk.{l}."
        mats = {
            "attn_q": linear(HEADS * HEAD_DIM, HIDDEN),
            "attn_k": linear(KV_HEADS * HEAD_DIM, HIDDEN),
            "attn_v": linear(KV_HEADS * HEAD_DIM, HIDDEN),
            "attn_output": linear(HIDDEN, HEADS * HEAD_DIM),
            "ffn_gate": linear(INTER, HIDDEN),
            "ffn_up": linear(INTER, HIDDEN),
            "ffn_down": linear(HIDDEN, INTER),
        }
        w.add_tensor(p + "attn_norm.weight", norm())
        for name, m in mats.items():
            w.add_tensor(p + name + ".weight", gguf.quants.quantize(m, Q.Q8_0), raw_dtype=Q.Q8_0)
        w.add_tensor(p + "attn_q.bias", bias(HEADS * HEAD_DIM))
        w.add_tensor(p + "attn_k.bias", bias(KV_HEADS * HEAD_DIM))
        w.add_tensor(p + "attn_v.bias", bias(KV_HEADS * HEAD_DIM))
        w.add_tensor(p + "ffn_norm.weight", norm())
    w.add_tensor("output_norm.weight", norm())
    write(w)
    save_transformers_view(path, "Qwen2ForCausalLM", "tiny_qwen2_expected.safetensors",
                           {"q_proj0": "model.layers.0.self_attn.q_proj.weight",
                            "q_bias1": "model.layers.1.self_attn.q_proj.bias",
                            "v_bias0": "model.layers.0.self_attn.v_proj.bias"})


def make_tiny_phi3(path: Path) -> None:
    """A tiny random Phi-3 as llama.cpp's converter writes one: arch phi3, attn_qkv ([q; k; v] rows)
    and ffn_up ([gate; up] rows) fused as HF's qkv_proj and gate_up_proj, matrices Q8_0, an untied
    output, full rotary and no sliding window (transformers' GGUF loader reads neither key, so only
    then is it a reference; the C++ tests cover both keys on hand-built files)."""
    rng, linear, norm = random_makers(SEED + 3)
    w = gguf.GGUFWriter(str(path), "phi3")
    add_tiny_metadata(w, "tiny-phi3", 10000.0, 1e-5, HEAD_DIM, "qwen2", None)
    embed = rng.standard_normal((VOCAB, HIDDEN)).astype(np.float32)
    w.add_tensor("token_embd.weight", gguf.quants.quantize(embed, Q.Q8_0), raw_dtype=Q.Q8_0)
    for l in range(LAYERS):
        p = f"blk.{l}."
        mats = {
            "attn_qkv": linear((HEADS + 2 * KV_HEADS) * HEAD_DIM, HIDDEN),
            "attn_output": linear(HIDDEN, HEADS * HEAD_DIM),
            "ffn_up": linear(2 * INTER, HIDDEN),
            "ffn_down": linear(HIDDEN, INTER),
        }
        w.add_tensor(p + "attn_norm.weight", norm())
        for name, m in mats.items():
            w.add_tensor(p + name + ".weight", gguf.quants.quantize(m, Q.Q8_0), raw_dtype=Q.Q8_0)
        w.add_tensor(p + "ffn_norm.weight", norm())
    w.add_tensor("output_norm.weight", norm())
    w.add_tensor("output.weight", (linear(VOCAB, HIDDEN) * 4).astype(np.float16))
    write(w)
    save_transformers_view(path, "Phi3ForCausalLM", "tiny_phi3_expected.safetensors",
                           {"qkv_proj1": "model.layers.1.self_attn.qkv_proj.weight",
                            "gate_up_proj0": "model.layers.0.mlp.gate_up_proj.weight"})


# ---- tiny Gemma 3 ------------------------------------------------------------------------------

G_HIDDEN, G_INTER, G_LAYERS, G_HEADS, G_KV_HEADS, G_HEAD_DIM = 32, 64, 7, 2, 1, 8
G_WINDOW, G_ROPE_FACTOR = 4, 2.0


def gemma3_hf_config(tied: bool) -> dict:
    """The Gemma3ForCausalLM config that computes what llama.cpp computes for tiny_gemma3.gguf (what
    miles convert must write): llama.cpp's fixed window pattern (every 6th layer full), its sliding
    layers' RoPE base 10000, its attention scale 1 / sqrt(head_dim) as query_pre_attn_scalar, and the
    file's linear RoPE scaling on the full layers."""
    return {
        "architectures": ["Gemma3ForCausalLM"], "model_type": "gemma3_text", "vocab_size": VOCAB,
        "hidden_size": G_HIDDEN, "intermediate_size": G_INTER, "num_hidden_layers": G_LAYERS,
        "num_attention_heads": G_HEADS, "num_key_value_heads": G_KV_HEADS, "head_dim": G_HEAD_DIM,
        "max_position_embeddings": 256, "rms_norm_eps": 1e-6, "hidden_activation": "gelu_pytorch_tanh",
        "tie_word_embeddings": tied, "query_pre_attn_scalar": G_HEAD_DIM, "sliding_window": G_WINDOW,
        "layer_types": ["full_attention" if (i + 1) % 6 == 0 else "sliding_attention" for i in range(G_LAYERS)],
        "rope_theta": 1000000.0, "rope_local_base_freq": 10000.0,
        "rope_scaling": {"rope_type": "linear", "factor": G_ROPE_FACTOR},
        "final_logit_softcapping": None, "attn_logit_softcapping": None,
        "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 2,
    }


def make_tiny_gemma3(path: Path) -> None:
    """A tiny random Gemma 3 as llama.cpp's Gemma3Model converter writes one: arch gemma3, q/k rows in
    HF's order, every norm weight stored as 1 + w (its norm_shift), head_dim (key_length 8) unlike
    hidden / heads (16), 7 layers (layer 5 the only full-attention one), a window of 4, rope 1e6 with
    linear scaling 2 for the full layers and freq_base_swa 10000, tied embeddings; token_embd and
    q/k/v Q8_0, ffn_gate/up Q5_0, attn_output and ffn_down F16, norms F32; the tiny byte-level BPE
    vocabulary (its converter writes a gpt2 vocabulary when there is no tokenizer.model).

    tiny_gemma3_expected: every tensor of transformers' GGUF loader's state dict (norms minus 1), and
    the logits of Gemma3ForCausalLM with those weights under gemma3_hf_config(): transformers' GGUF
    loader reads neither query_pre_attn_scalar (it keeps the default 256) nor the RoPE scaling, so
    its own model is not llama.cpp's; the script asserts that it agrees on everything else."""
    rng = np.random.default_rng(SEED + 4)

    def linear(out_f: int, in_f: int) -> np.ndarray:
        return (rng.standard_normal((out_f, in_f)) / np.sqrt(in_f)).astype(np.float32)

    def hf_norm(n: int) -> np.ndarray:  # HF's w (Gemma3RMSNorm multiplies by 1 + w)
        return (0.2 * rng.standard_normal(n)).astype(np.float32)

    w = gguf.GGUFWriter(str(path), "gemma3")
    w.add_name("tiny-gemma3")
    w.add_context_length(256)
    w.add_embedding_length(G_HIDDEN)
    w.add_block_count(G_LAYERS)
    w.add_feed_forward_length(G_INTER)
    w.add_head_count(G_HEADS)
    w.add_head_count_kv(G_KV_HEADS)
    w.add_key_length(G_HEAD_DIM)
    w.add_value_length(G_HEAD_DIM)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_rope_freq_base(1000000.0)
    w.add_rope_freq_base_swa(10000.0)
    w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
    w.add_rope_scaling_factor(G_ROPE_FACTOR)
    w.add_sliding_window(G_WINDOW)
    tokens, types, merges = tiny_vocab()
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("smollm")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_pad_token_id(2)
    w.add_add_bos_token(False)

    def norm(name: str, n: int) -> None:
        w.add_tensor(name, hf_norm(n) + np.float32(1))  # llama.cpp's converter: data_torch + 1

    embed = rng.standard_normal((VOCAB, G_HIDDEN)).astype(np.float32)
    w.add_tensor("token_embd.weight", gguf.quants.quantize(embed, Q.Q8_0), raw_dtype=Q.Q8_0)
    q_dim, kv_dim = G_HEADS * G_HEAD_DIM, G_KV_HEADS * G_HEAD_DIM
    for l in range(G_LAYERS):
        p = f"blk.{l}."
        norm(p + "attn_norm.weight", G_HIDDEN)
        for name, m in (("attn_q", linear(q_dim, G_HIDDEN)), ("attn_k", linear(kv_dim, G_HIDDEN)),
                        ("attn_v", linear(kv_dim, G_HIDDEN))):
            w.add_tensor(p + name + ".weight", gguf.quants.quantize(m, Q.Q8_0), raw_dtype=Q.Q8_0)
        norm(p + "attn_q_norm.weight", G_HEAD_DIM)
        norm(p + "attn_k_norm.weight", G_HEAD_DIM)
        w.add_tensor(p + "attn_output.weight", linear(G_HIDDEN, q_dim).astype(np.float16))
        norm(p + "post_attention_norm.weight", G_HIDDEN)
        norm(p + "ffn_norm.weight", G_HIDDEN)
        for name in ("ffn_gate", "ffn_up"):
            m = linear(G_INTER, G_HIDDEN)
            w.add_tensor(p + name + ".weight", gguf.quants.quantize(m, Q.Q5_0), raw_dtype=Q.Q5_0)
        w.add_tensor(p + "ffn_down.weight", linear(G_HIDDEN, G_INTER).astype(np.float16))
        norm(p + "post_ffw_norm.weight", G_HIDDEN)
    norm("output_norm.weight", G_HIDDEN)
    write(w)

    import torch
    import transformers
    from transformers import AutoModelForCausalLM, Gemma3ForCausalLM, Gemma3TextConfig

    torch.set_num_threads(1)
    loaded = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32)
    assert type(loaded).__name__ == "Gemma3ForCausalLM", type(loaded).__name__
    want = gemma3_hf_config(tied=True)
    got = loaded.config
    for key in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                "num_key_value_heads", "head_dim", "max_position_embeddings", "sliding_window", "layer_types",
                "tie_word_embeddings", "hidden_activation"):
        assert getattr(got, key) == want[key], (key, getattr(got, key), want[key])
    assert abs(got.rms_norm_eps - want["rms_norm_eps"]) < 1e-12, got.rms_norm_eps
    assert got.rope_parameters["full_attention"]["rope_theta"] == want["rope_theta"], got.rope_parameters
    assert got.rope_parameters["sliding_attention"]["rope_theta"] == want["rope_local_base_freq"]
    sd = {k: v.detach().clone() for k, v in loaded.state_dict().items()}
    # The reference: HF's class under the config llama.cpp's semantics give, with the loader's weights.
    config = Gemma3TextConfig(**{k: v for k, v in want.items() if k not in ("architectures", "model_type")})
    assert config.query_pre_attn_scalar == G_HEAD_DIM and config.rope_parameters["full_attention"] == {
        "rope_type": "linear", "factor": G_ROPE_FACTOR, "rope_theta": 1000000.0}, config.rope_parameters
    model = Gemma3ForCausalLM(config).to(torch.float32)
    missing, unexpected = model.load_state_dict(sd, strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}, (missing, unexpected)
    model.tie_weights()
    model.eval()
    assert torch.equal(model.lm_head.weight, sd["model.embed_tokens.weight"])
    ids = np.array([1, 3, 200, 259, 275, 40, 41, 287, 2, 100, 7, 286], dtype=np.int32)
    with torch.no_grad():
        logits = model(torch.from_numpy(ids.astype(np.int64))[None]).logits[0].numpy().astype(np.float32)
    tensors = {k: v.numpy() for k, v in sd.items() if k != "lm_head.weight"}
    save_safetensors(OUT / "tiny_gemma3_expected.safetensors", {"ids": ids, "logits": logits, **tensors},
                     {**versions(), "torch": torch.__version__, "transformers": transformers.__version__})


# ---- what the tiny GLM-4 MoE and DeepSeek-V3 writers share ----------------------------------------


def load_checkpoint(model: str) -> tuple[dict, dict[str, np.ndarray]]:
    """tests/data/models/<model>'s config.json and tensors."""
    from safetensors.numpy import load_file

    src = ROOT / "tests" / "data" / "models" / model
    return json.loads((src / "config.json").read_text()), load_file(str(src / "model.safetensors"))


def moe_writer(path: Path, arch: str, cfg: dict, n_blocks: int, kv_heads: int,
               expert_count_first: bool) -> gguf.GGUFWriter:
    """A GGUFWriter with TextModel's metadata as llama.cpp's converter writes it for a routed-experts model,
    up to expert_group_used_count (expert_count among them when the converter writes it there)."""
    w = gguf.GGUFWriter(str(path), arch)
    w.add_name(f"tiny-{arch}")
    w.add_block_count(n_blocks)
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(cfg["num_attention_heads"])
    w.add_head_count_kv(kv_heads)
    w.add_rope_freq_base(cfg["rope_parameters"]["rope_theta"])
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    if expert_count_first:
        w.add_expert_count(cfg["n_routed_experts"])
    w.add_expert_used_count(cfg["num_experts_per_tok"])
    w.add_expert_group_count(cfg["n_group"])
    w.add_expert_group_used_count(cfg["topk_group"])
    return w


def add_padded_vocab(w: gguf.GGUFWriter, cfg: dict, pre: str, add_bos: bool) -> None:
    """The tiny byte-level vocabulary padded to the model's rows with [PAD<i>] tokens of type UNUSED (as the
    converter's get_vocab_base pads), pre-tokenizer `pre`, the checkpoint's bos / eos, the ChatML template."""
    tokens, types, merges = tiny_vocab()
    for i in range(len(tokens), cfg["vocab_size"]):
        tokens.append(f"[PAD{i}]")
        types.append(int(gguf.TokenType.UNUSED))
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(pre)
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(cfg["bos_token_id"])
    w.add_eos_token_id(cfg["eos_token_id"])
    w.add_add_bos_token(add_bos)
    w.add_chat_template(CHAT_TEMPLATE)


def moe_gguf_namer(arch: gguf.MODEL_ARCH, n_blocks: int):
    """The converter's renaming of HF tensor names (e_score_correction_bias as e_score_correction.bias, so
    blk.N.exp_probs_b.bias)."""
    names = gguf.get_tensor_name_map(arch, n_blocks)

    def gguf_name(hf_name: str) -> str:
        if hf_name.endswith("e_score_correction_bias"):
            hf_name = hf_name.replace("e_score_correction_bias", "e_score_correction.bias")
        if hf_name == "model.embed_tokens.weight":
            return "token_embd.weight"
        name = names.get_name(hf_name, try_suffixes=(".weight", ".bias"))
        assert name is not None, hf_name
        return name

    return gguf_name


def stack_experts(hf: dict[str, np.ndarray], n_layers: int, n_exp: int, tensors: dict[str, np.ndarray]) -> None:
    """Each layer's experts of each projection stacked into one [experts, rows, cols] tensor in `tensors`."""
    for l in range(n_layers):
        for proj in ("down_proj", "gate_proj", "up_proj"):
            if f"model.layers.{l}.mlp.experts.0.{proj}.weight" not in hf:
                continue
            stacked = np.stack([hf[f"model.layers.{l}.mlp.experts.{e}.{proj}.weight"] for e in range(n_exp)])
            tensors[f"model.layers.{l}.mlp.experts.{proj}.weight"] = stacked


def check_moe_shapes(path: Path, hidden: int, ff_exp: int, n_exp: int) -> dict[str, list[int]]:
    """The written file's tensor shapes (ggml ne), its stacked experts and router bias checked against what
    llama.cpp's loader expects (its create_tensor shapes)."""
    r = gguf.GGUFReader(str(path))
    got = {t.name: [int(x) for x in t.shape] for t in r.tensors}
    assert got["blk.1.ffn_gate_exps.weight"] == [hidden, ff_exp, n_exp], got["blk.1.ffn_gate_exps.weight"]
    assert got["blk.1.ffn_down_exps.weight"] == [ff_exp, hidden, n_exp]
    assert got["blk.2.exp_probs_b.bias"] == [n_exp]
    assert "blk.0.ffn_gate_inp.weight" not in got
    return got


# ---- tiny GLM-4 MoE -----------------------------------------------------------------------------


def make_tiny_glm4moe(path: Path) -> None:
    """tests/data/models/glm4_moe (a random Glm4MoeForCausalLM: 3 layers, layer 0 dense, 8 routed
    experts in 2 groups (top 2 of the best group), a shared expert, q/k/v biases, q/k norms, partial
    rotary 0.5, routed_scaling_factor 2.5) written as llama.cpp's Glm4MoeModel converter
    (conversion/glm.py, its TextModel base in conversion/base.py) writes it, in float32 (--outtype
    f32), so the converted tensors must equal the checkpoint's bit for bit and its logits the
    transformers goldens (tests/data/goldens/glm4_moe.safetensors):
      - metadata: TextModel's (block_count, context/embedding/feed-forward lengths, head counts,
        rope freq_base, rms eps, expert_count / expert_used_count, expert_group_count /
        expert_group_used_count from n_group / topk_group, key/value lengths) and Glm4MoeModel's
        (rope.dimension_count = head_dim * partial_rotary_factor, expert_feed_forward_length,
        expert_shared_count, leading_dense_block_count, expert_gating_func sigmoid,
        expert_weights_scale, expert_weights_norm, nextn_predict_layers);
      - tensors under gguf-py's GLM4_MOE names (tensor_mapping.py), q/k rows in HF's order (NeoX
        RoPE: no permutation), e_score_correction_bias renamed e_score_correction.bias (so
        blk.N.exp_probs_b.bias), each projection's experts stacked into one [experts, rows, cols]
        tensor (blk.N.ffn_{gate,up,down}_exps);
      - one NextN / multi-token-prediction block after the 3 layers (block_count 4,
        nextn_predict_layers 1), as the converter appends the checkpoint's layer 3 of a real
        GLM-4.5: random tensors (attention, MoE, nextn.eh_proj / enorm / hnorm / shared_head_norm)
        that a conversion must skip, as transformers skips those weights;
      - the tiny byte-level vocabulary padded to the model's 1024 rows with [PAD<i>] tokens of type
        UNUSED, as the converter's get_vocab_base pads, pre-tokenizer "glm4" (GLM-4.5's)."""
    cfg, hf = load_checkpoint("glm4_moe")
    rope = cfg["rope_parameters"]
    n_layers, n_nextn = cfg["num_hidden_layers"], cfg["num_nextn_predict_layers"]
    n_blocks = n_layers + n_nextn
    hidden, heads, kv_heads, head_dim = (cfg["hidden_size"], cfg["num_attention_heads"],
                                         cfg["num_key_value_heads"], cfg["head_dim"])
    n_exp, ff_exp = cfg["n_routed_experts"], cfg["moe_intermediate_size"]

    w = moe_writer(path, "glm4moe", cfg, n_blocks, kv_heads, expert_count_first=True)
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    w.add_rope_dimension_count(int(head_dim * rope["partial_rotary_factor"]))
    w.add_expert_feed_forward_length(ff_exp)
    w.add_expert_shared_count(cfg["n_shared_experts"])
    w.add_leading_dense_block_count(cfg["first_k_dense_replace"])
    w.add_expert_gating_func(gguf.ExpertGatingFuncType.SIGMOID)
    w.add_expert_weights_scale(cfg["routed_scaling_factor"])
    w.add_expert_weights_norm(cfg["norm_topk_prob"])
    w.add_nextn_predict_layers(n_nextn)
    add_padded_vocab(w, cfg, "glm4", add_bos=False)

    # The converter's renaming, with the checkpoint's layers and the appended NextN block.
    gguf_name = moe_gguf_namer(gguf.MODEL_ARCH.GLM4_MOE, n_blocks)

    layer_tensors: dict[str, np.ndarray] = {}
    for name, t in hf.items():
        if ".mlp.experts." not in name:
            layer_tensors[name] = t
    stack_experts(hf, n_layers, n_exp, layer_tensors)
    for name in sorted(layer_tensors):
        t = np.ascontiguousarray(layer_tensors[name].astype(np.float32))
        w.add_tensor(gguf_name(name), t)

    # The NextN block (layer n_layers of a real checkpoint): random, skipped by the conversion.
    rng = np.random.default_rng(SEED + 5)
    n = n_layers
    q_dim, kv_dim, sh_ff = heads * head_dim, kv_heads * head_dim, cfg["n_shared_experts"] * ff_exp
    nextn = {
        "input_layernorm.weight": (hidden,),
        "self_attn.q_proj.weight": (q_dim, hidden), "self_attn.q_proj.bias": (q_dim,),
        "self_attn.k_proj.weight": (kv_dim, hidden), "self_attn.k_proj.bias": (kv_dim,),
        "self_attn.v_proj.weight": (kv_dim, hidden), "self_attn.v_proj.bias": (kv_dim,),
        "self_attn.o_proj.weight": (hidden, q_dim),
        "self_attn.q_norm.weight": (head_dim,), "self_attn.k_norm.weight": (head_dim,),
        "post_attention_layernorm.weight": (hidden,),
        "mlp.gate.weight": (n_exp, hidden), "mlp.gate.e_score_correction_bias": (n_exp,),
        "mlp.experts.gate_proj.weight": (n_exp, ff_exp, hidden),
        "mlp.experts.up_proj.weight": (n_exp, ff_exp, hidden),
        "mlp.experts.down_proj.weight": (n_exp, hidden, ff_exp),
        "mlp.shared_experts.gate_proj.weight": (sh_ff, hidden),
        "mlp.shared_experts.up_proj.weight": (sh_ff, hidden),
        "mlp.shared_experts.down_proj.weight": (hidden, sh_ff),
        "eh_proj.weight": (hidden, 2 * hidden), "enorm.weight": (hidden,), "hnorm.weight": (hidden,),
        "shared_head.norm.weight": (hidden,),
    }
    for suffix, shape in nextn.items():
        w.add_tensor(gguf_name(f"model.layers.{n}.{suffix}"), (0.1 * rng.standard_normal(shape)).astype(np.float32))
    write(w)
    path.chmod(0o644)

    # What the file holds must be what llama.cpp's loader expects (its create_tensor shapes).
    got = check_moe_shapes(path, hidden, ff_exp, n_exp)
    assert got[f"blk.{n}.nextn.eh_proj.weight"] == [2 * hidden, hidden]
    assert "blk.0.ffn_gate.weight" in got


# ---- tiny DeepSeek-V3 (llama.cpp's deepseek2) --------------------------------------------------


def make_tiny_deepseek2(path: Path) -> None:
    """tests/data/models/deepseek_v3 (a random DeepseekV3ForCausalLM: 3 layers, layer 0 dense, q_lora_rank 24,
    kv_lora_rank 32, qk_nope 16, qk_rope 8, v_head_dim 12, 4 heads, 8 routed experts in 2 groups (top 2 of the best
    group), a shared expert, routed_scaling_factor 2.5, interleaved RoPE) written as llama.cpp's DeepseekV2Model
    converter (conversion/deepseek.py, TextModel base in conversion/base.py) writes it, in float32 (--outtype f32),
    so the converted tensors must equal the checkpoint's bit for bit and its logits the transformers goldens
    (tests/data/goldens/deepseek_v3.safetensors):
      - metadata: TextModel's (block_count = num_hidden_layers, context/embedding/feed-forward lengths, head_count,
        head_count_kv 1 (the converter sets num_key_value_heads = 1: absorbed MLA is MQA over the latent), rope
        freq_base, rms eps, expert_used_count, expert_group_count / expert_group_used_count from n_group /
        topk_group, expert_gating_func sigmoid from DeepSeek-V3's scoring_func "sigmoid" (this checkpoint's
        transformers-5 config omits the key; DeepSeek-V3's own config.json has it)) and DeepseekV2Model's
        (leading_dense_block_count, vocab_size, q_lora_rank, kv_lora_rank, key_length = kv_lora_rank + qk_rope,
        value_length = kv_lora_rank, key_length_mla = qk_nope + qk_rope, value_length_mla = v_head_dim,
        expert_feed_forward_length, expert_count, expert_shared_count, expert_weights_scale, expert_weights_norm,
        rope.dimension_count = qk_rope_head_dim; no yarn_log_multiplier: the rope is not scaled);
      - tensors under gguf-py's DEEPSEEK2 names, rows in HF's order (llama.cpp's deepseek2 rotates adjacent pairs,
        LLAMA_ROPE_TYPE_NORM, which is DeepSeek's rope_interleave layout: no permutation), e_score_correction_bias
        as blk.N.exp_probs_b.bias, each projection's experts stacked into one [experts, rows, cols] tensor, and
        kv_b_proj viewed as [heads, qk_nope + v, kv_lora] and split into attn_k_b = the key rows transposed
        ([heads, kv_lora, qk_nope]) and attn_v_b = the value rows ([heads, v, kv_lora]);
      - no NextN / MTP block: the converter skips layers >= num_hidden_layers (skip_mtp) and writes no
        nextn_predict_layers;
      - the tiny byte-level vocabulary padded to the model's 1024 rows with [PAD<i>] tokens, pre "deepseek-v3"."""
    cfg, hf = load_checkpoint("deepseek_v3")
    rope = cfg["rope_parameters"]
    assert rope["rope_type"] == "default" and cfg["rope_interleave"], rope
    n_layers = cfg["num_hidden_layers"]
    hidden, heads = cfg["hidden_size"], cfg["num_attention_heads"]
    q_lora, kv_lora = cfg["q_lora_rank"], cfg["kv_lora_rank"]
    nope, rot, v_dim = cfg["qk_nope_head_dim"], cfg["qk_rope_head_dim"], cfg["v_head_dim"]
    n_exp, ff_exp = cfg["n_routed_experts"], cfg["moe_intermediate_size"]

    w = moe_writer(path, "deepseek2", cfg, n_layers, 1, expert_count_first=False)
    w.add_expert_gating_func(gguf.ExpertGatingFuncType.SIGMOID)
    w.add_key_length(kv_lora + rot)  # TextModel's head_dim key, then DeepseekV2Model's value (it overwrites)
    w.add_value_length(kv_lora)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    w.add_leading_dense_block_count(cfg["first_k_dense_replace"])
    w.add_vocab_size(cfg["vocab_size"])
    w.add_q_lora_rank(q_lora)
    w.add_kv_lora_rank(kv_lora)
    w.add_key_length_mla(nope + rot)
    w.add_value_length_mla(v_dim)
    w.add_expert_feed_forward_length(ff_exp)
    w.add_expert_count(n_exp)
    w.add_expert_shared_count(cfg["n_shared_experts"])
    w.add_expert_weights_scale(cfg["routed_scaling_factor"])
    if cfg["norm_topk_prob"]:
        w.add_expert_weights_norm(True)
    w.add_rope_dimension_count(rot)
    add_padded_vocab(w, cfg, "deepseek-v3", add_bos=True)

    gguf_name = moe_gguf_namer(gguf.MODEL_ARCH.DEEPSEEK2, n_layers)

    tensors: dict[str, np.ndarray] = {}
    for name, t in hf.items():
        layer = int(name.split(".")[2]) if name.startswith("model.layers.") else -1
        assert layer < n_layers, name  # this checkpoint has no MTP layer; the converter would skip one
        if ".mlp.experts." in name:
            continue
        if name.endswith("kv_b_proj.weight"):
            kv_b = t.reshape(heads, nope + v_dim, kv_lora)
            tensors[name.replace("kv_b_proj", "k_b_proj")] = kv_b[:, :nope, :].transpose(0, 2, 1)
            tensors[name.replace("kv_b_proj", "v_b_proj")] = kv_b[:, nope:, :]
            continue
        tensors[name] = t
    stack_experts(hf, n_layers, n_exp, tensors)
    for name in sorted(tensors):
        w.add_tensor(gguf_name(name), np.ascontiguousarray(tensors[name].astype(np.float32)))
    write(w)
    path.chmod(0o644)

    # What the file holds must be what llama.cpp's deepseek2 loader expects (its create_tensor shapes, ggml ne).
    got = check_moe_shapes(path, hidden, ff_exp, n_exp)
    assert got["blk.0.attn_k_b.weight"] == [nope, kv_lora, heads], got["blk.0.attn_k_b.weight"]
    assert got["blk.0.attn_v_b.weight"] == [kv_lora, v_dim, heads]
    assert got["blk.0.attn_q_b.weight"] == [q_lora, heads * (nope + rot)]
    assert got["blk.0.attn_kv_a_mqa.weight"] == [hidden, kv_lora + rot]
    assert "blk.0.attn_kv_b.weight" not in got


def make_tiny_bert_vocab(path: Path) -> None:
    """A vocabulary-only WordPiece GGUF as llama.cpp's BERT converter writes one (tokenizer.ggml.model "bert": a word's
    first piece marked with U+2581, continuation pieces bare; [CLS] / [SEP] / [UNK] ids): the seed through which the
    GGUF fuzzer reaches the WordPiece tokenizer, and tests/tokenizer_gguf_test.cc's small case."""
    w = gguf.GGUFWriter(str(path), "bert")
    tokens = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "\u2581hello", "\u2581world", "\u2581,", "\u2581!",
              "\u2581he", "llo", "\u2581a", "pf", "el", "\u2581\u4e2d", "\u2581\u6587", "\u25811", "23", "\u2581<", "s", "\u2581>"]
    w.add_tokenizer_model("bert")
    w.add_tokenizer_pre("bert-bge")
    w.add_token_list(tokens)
    w.add_token_types([3, 2, 3, 3, 3] + [1] * (len(tokens) - 5))
    w.add_unk_token_id(1)
    w.add_uint32("tokenizer.ggml.cls_token_id", 2)  # the bert-bge vocabulary's keys
    w.add_sep_token_id(3)
    w.add_pad_token_id(0)
    w.add_mask_token_id(4)
    write(w)


def main() -> int:
    OUT.mkdir(parents=True, exist_ok=True)
    only = sys.argv[1:]  # fixture names to make (types, tiny_llama, tiny_qwen2, tiny_phi3, tiny_gemma3,
    #                      tiny_glm4moe, tiny_deepseek2, tiny_bert_vocab); none: all
    for name, make in (("types", make_types), ("tiny_llama", make_tiny_llama), ("tiny_qwen2", make_tiny_qwen2),
                       ("tiny_phi3", make_tiny_phi3), ("tiny_gemma3", make_tiny_gemma3),
                       ("tiny_glm4moe", make_tiny_glm4moe), ("tiny_deepseek2", make_tiny_deepseek2),
                       ("tiny_bert_vocab", make_tiny_bert_vocab)):
        if not only or name in only:
            make(OUT / f"{name}.gguf")
    total = sum(f.stat().st_size for f in OUT.iterdir())
    print(f"wrote {OUT} ({total} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

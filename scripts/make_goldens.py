#!/usr/bin/env python3
"""Make the tiny reference checkpoints and golden outputs under tests/data/.

What it makes (all deterministic: fixed seeds, CPU, float32 eager attention):
  tests/data/models/<name>/   tiny random-weight Hugging Face checkpoints (config.json, model.safetensors or
                              model-0000x-of-0000y.safetensors + model.safetensors.index.json,
                              generation_config.json) written by transformers' save_pretrained.
  tests/data/goldens/<name>.safetensors
                              for 5 fixed prompts i: seq{i}.ids (int32 [T]), seq{i}.logits (float32 [T, vocab]),
                              and for MoE models seq{i}.experts (int32 [T, moe_layers, top_k]) and
                              seq{i}.expert_weights (float32, same shape); plus rope.inv_freq (float32 [rot_dim/2])
                              and rope.attention_scaling (float32 [1]) as HF computes them; versions and model
                              facts in the safetensors __metadata__.

The C++ tests read these files; they never need Python. Rerun (needs `scripts/setup.sh --reference`) with:

    /root/.venvs/miles-ref/bin/python scripts/make_goldens.py
"""

from __future__ import annotations

import inspect
import json
import os
import shutil
import sys
import zlib
from pathlib import Path

import numpy as np
import safetensors
import safetensors.numpy
import torch
import transformers
from transformers import (
    DeepseekV3Config,
    DeepseekV3ForCausalLM,
    Gemma3ForCausalLM,
    Gemma3TextConfig,
    Glm4MoeConfig,
    Glm4MoeForCausalLM,
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    Phi3Config,
    Phi3ForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
    Qwen3MoeConfig,
    Qwen3MoeForCausalLM,
)

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "tests" / "data"
MODELS = DATA / "models"
GOLDENS = DATA / "goldens"

BASE_SEED = 20240611
VOCAB = 1024
SEQ_LENS = (1, 4, 9, 16, 33)
TRANSFORMERS_MAJOR = int(transformers.__version__.split(".")[0])

COMMON = dict(
    vocab_size=VOCAB,
    hidden_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    intermediate_size=128,
    rms_norm_eps=1e-6,
    max_position_embeddings=256,
    initializer_range=0.1,
    hidden_act="silu",
    attention_bias=False,
    bos_token_id=1,
    eos_token_id=2,
    pad_token_id=None,
)


def rope_kwargs(theta: float, scaling: dict | None) -> dict:
    """Spell the RoPE settings the way the installed transformers wants them."""
    if TRANSFORMERS_MAJOR >= 5:
        params = {"rope_type": "default", "rope_theta": theta}
        if scaling:
            params.update(scaling)
        return {"rope_parameters": params}
    return {"rope_theta": theta, "rope_scaling": dict(scaling) if scaling else None}


# name -> (model class, config class, config kwargs, extra facts)
def model_specs() -> dict:
    llama = dict(COMMON, tie_word_embeddings=False, mlp_bias=False)
    qwen3 = dict(COMMON, tie_word_embeddings=False, use_sliding_window=False)
    moe = dict(
        qwen3,
        num_experts=8,
        num_experts_per_tok=2,
        norm_topk_prob=True,
        moe_intermediate_size=32,
        decoder_sparse_step=1,
        mlp_only_layers=[],
        output_router_logits=False,
        router_aux_loss_coef=0.001,
    )
    return {
        "llama": (LlamaForCausalLM, LlamaConfig, dict(llama, **rope_kwargs(10000.0, None))),
        "llama_tied": (LlamaForCausalLM, LlamaConfig,
                       dict(llama, tie_word_embeddings=True, **rope_kwargs(10000.0, None))),
        "llama_rope_llama3": (LlamaForCausalLM, LlamaConfig, dict(llama, **rope_kwargs(500000.0, {
            "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
            # 64, not 32: with theta 5e5 and head_dim 16 the wavelengths are 6.3, 32.4, 167, ...; a window of
            # [64/4, 64/1] = [16, 64] puts one frequency in each of llama3's three bands (kept, smoothed, /factor).
            "original_max_position_embeddings": 64}))),
        "llama_rope_yarn": (LlamaForCausalLM, LlamaConfig, dict(llama, **rope_kwargs(10000.0, {
            "rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32}))),
        "llama_rope_linear": (LlamaForCausalLM, LlamaConfig, dict(llama, **rope_kwargs(10000.0, {
            "rope_type": "linear", "factor": 2.0}))),
        "qwen3": (Qwen3ForCausalLM, Qwen3Config, dict(qwen3, **rope_kwargs(10000.0, None))),
        "qwen3_bf16": (Qwen3ForCausalLM, Qwen3Config, dict(qwen3, **rope_kwargs(10000.0, None))),
        "qwen3_moe": (Qwen3MoeForCausalLM, Qwen3MoeConfig, dict(moe, **rope_kwargs(10000.0, None))),
        "qwen3_moe_nonorm": (Qwen3MoeForCausalLM, Qwen3MoeConfig, dict(
            moe, norm_topk_prob=False, num_hidden_layers=3, mlp_only_layers=[1], **rope_kwargs(10000.0, None))),
        "llama_sharded": (LlamaForCausalLM, LlamaConfig, dict(llama, **rope_kwargs(10000.0, None))),
        # Qwen2 / Qwen2.5: q/k/v biases, none on o_proj; tied like Qwen2.5-0.5B and 1.5B.
        "qwen2": (Qwen2ForCausalLM, Qwen2Config,
                  dict(qwen3, tie_word_embeddings=True, **rope_kwargs(1000000.0, None))),
        # Llama's optional biases: q/k/v and o_proj (attention_bias), gate/up and down_proj (mlp_bias).
        "llama_bias": (LlamaForCausalLM, LlamaConfig,
                       dict(llama, attention_bias=True, mlp_bias=True, **rope_kwargs(10000.0, None))),
        # Mistral: Llama's layers with sliding-window attention on every layer; a window of 5 so the
        # prompts of 9, 16 and 33 tokens see it (its class has no bias fields).
        "mistral": (MistralForCausalLM, MistralConfig,
                    dict({k: v for k, v in COMMON.items() if k != "attention_bias"},
                         tie_word_embeddings=False, sliding_window=5, **rope_kwargs(10000.0, None))),
        # Phi-3 / Phi-4-mini: fused qkv_proj and gate_up_proj, partial rotary (0.5, as Phi-4-mini's 0.75 is a
        # fraction), a sliding window of 7 on every layer, no biases.
        "phi3": (Phi3ForCausalLM, Phi3Config,
                 dict({k: v for k, v in COMMON.items() if k != "attention_bias"},
                      tie_word_embeddings=False, sliding_window=7, resid_pdrop=0.0, embd_pdrop=0.0,
                      **rope_kwargs(10000.0, {"partial_rotary_factor": 0.5}))),
        # Gemma 3 (text): scaled embeddings, GeGLU, (1 + w) norms before and after each block, q/k norms, a window of
        # 5 on the sliding layers (layer_types), their own RoPE (theta 1e4) while the full layer uses theta 1e6 with
        # linear scaling (as Gemma-3-4B+), query_pre_attn_scalar 32 (not head_dim), tied like every Gemma 3.
        "gemma3": (Gemma3ForCausalLM, Gemma3TextConfig, gemma3_kwargs()),
        # GLM-4 MoE: sigmoid routing with a score-correction bias among 2 groups of 4 experts (the best group
        # kept), a shared expert, routed weights renormalised and scaled by 2.5, a dense first layer, q/k/v biases
        # (none on o_proj), q/k norms, half of each head rotated.
        "glm4_moe": (Glm4MoeForCausalLM, Glm4MoeConfig, glm4_moe_kwargs()),
        # The other branches: no renormalisation, one group, two shared experts, every layer MoE, no biases or
        # q/k norms, three quarters of each head rotated.
        "glm4_moe_nonorm": (Glm4MoeForCausalLM, Glm4MoeConfig, dict(
            glm4_moe_kwargs(0.75), num_hidden_layers=2, norm_topk_prob=False, n_group=1, topk_group=1,
            n_shared_experts=2, routed_scaling_factor=1.0, first_k_dense_replace=0, attention_bias=False,
            use_qk_norm=False)),
        # DeepSeek-V3: multi-head latent attention (q through a q_lora_rank bottleneck with its norm, keys and values
        # from one compressed latent with its norm and a shared rotated key part, interleaved RoPE, values narrower
        # than queries) and GLM-4 MoE's routing (the same router, two groups), a dense first layer.
        "deepseek_v3": (DeepseekV3ForCausalLM, DeepseekV3Config, deepseek_v3_kwargs()),
        # No q bottleneck (q_proj), half-split RoPE (rope_interleave false), yarn with mscale_all_dim (the attention
        # scale squared-mscaled), values wider than the query heads, no renormalisation, one group.
        "deepseek_v3_noq": (DeepseekV3ForCausalLM, DeepseekV3Config, dict(
            deepseek_v3_kwargs(), num_hidden_layers=2, q_lora_rank=None, rope_interleave=False, v_head_dim=28,
            norm_topk_prob=False, n_group=1, topk_group=1, routed_scaling_factor=1.0, first_k_dense_replace=0,
            **rope_kwargs(10000.0, {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64,
                                    "mscale": 1.0, "mscale_all_dim": 1.0}))),
    }


def deepseek_v3_kwargs() -> dict:
    base = {k: v for k, v in COMMON.items() if k != "head_dim"}
    return dict(base, num_hidden_layers=3, num_key_value_heads=4, tie_word_embeddings=False, q_lora_rank=24, kv_lora_rank=32,
                qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=12, rope_interleave=True, n_routed_experts=8,
                num_experts_per_tok=2, n_group=2, topk_group=1, n_shared_experts=1, routed_scaling_factor=2.5,
                first_k_dense_replace=1, norm_topk_prob=True, moe_intermediate_size=32,
                **rope_kwargs(10000.0, None))


def glm4_moe_kwargs(partial_rotary: float = 0.5) -> dict:
    return dict(COMMON, num_hidden_layers=3, tie_word_embeddings=False, attention_bias=True, use_qk_norm=True,
                n_routed_experts=8, num_experts_per_tok=2, n_group=2, topk_group=1, n_shared_experts=1,
                routed_scaling_factor=2.5, first_k_dense_replace=1, norm_topk_prob=True, moe_intermediate_size=32,
                **rope_kwargs(10000.0, {"partial_rotary_factor": partial_rotary}))


def gemma3_kwargs() -> dict:
    kw = {k: v for k, v in COMMON.items() if k not in ("hidden_act", "attention_bias", "pad_token_id")}
    kw.update(num_hidden_layers=3, hidden_activation="gelu_pytorch_tanh", tie_word_embeddings=True,
              query_pre_attn_scalar=32, sliding_window=5, pad_token_id=0, bos_token_id=2, eos_token_id=1,
              layer_types=["sliding_attention", "full_attention", "sliding_attention"])
    full = {"rope_type": "linear", "factor": 2.0}
    if TRANSFORMERS_MAJOR >= 5:
        kw["rope_parameters"] = {"full_attention": dict(full, rope_theta=1e6),
                                 "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}}
    else:
        kw.update(rope_theta=1e6, rope_local_base_freq=1e4, rope_scaling=full)
    return kw


# Models whose weights are exactly another model's (only config differs): the weight file is a relative symlink
# to that model's, which keeps tests/data small; the sharded copy is real files because sharding is the point.
SAME_WEIGHTS_AS = {
    "llama_rope_llama3": "llama",
    "llama_rope_yarn": "llama",
    "llama_rope_linear": "llama",
    "llama_sharded": "llama",
    "qwen3_bf16": "qwen3",
}


def generator_for(name: str) -> torch.Generator:
    g = torch.Generator(device="cpu")
    g.manual_seed(BASE_SEED + zlib.crc32(name.encode()))
    return g


@torch.no_grad()
def init_weights(model: torch.nn.Module, name: str) -> None:
    """Overwrite every parameter with seeded normals, scaled so activations and logits are O(1).

    Norm weights are 1 + 0.2·N(0,1) (Gemma's, which multiply by 1 + weight: 0.2·N(0,1)) (so an implementation that drops a norm weight fails), linear weights
    N(0,1)·gain/sqrt(fan_in), the input embedding N(0,1)·0.5 (0.3 when tied to the LM head; Gemma's, scaled by
    sqrt(hidden) in the forward, 0.15), the untied LM head
    N(0,1)·2.5/sqrt(hidden), the MoE router N(0,1)·2/sqrt(hidden) (peaked routing, clear top-k margins).
    """
    g = generator_for(name)
    hidden = model.config.hidden_size
    tied = model.config.tie_word_embeddings
    for pname, p in model.named_parameters():  # tied weights appear once
        noise = torch.randn(p.shape, generator=g, dtype=torch.float32)
        if pname.endswith("norm.weight"):  # Gemma's norms multiply by (1 + weight)
            val = (0.0 if "gemma" in name else 1.0) + 0.2 * noise
        elif "embed_tokens" in pname and "gemma" in name:
            # Gemma multiplies the rows by sqrt(hidden) = 8: 0.15 keeps them near the blocks' normed
            # outputs, so the tied head does not just repeat the input token (0.3: every sample of
            # `miles check` would be one token repeated, with no reward variance to train on).
            val = noise * 0.15
        elif "embed_tokens" in pname:
            val = noise * (0.3 if tied else 0.5)
        elif pname == "lm_head.weight":
            val = noise * (2.5 / hidden**0.5)
        elif pname.endswith("mlp.gate.weight"):
            val = noise * (2.0 / hidden**0.5)
        elif pname.endswith("bias"):
            val = 0.1 * noise
        else:
            gain = 1.5 if (".q_proj." in pname or ".k_proj." in pname) else 1.0
            val = noise * (gain / p.shape[-1] ** 0.5)
        p.copy_(val.to(p.dtype))
    # GLM-4 MoE's score-correction bias is a buffer: 0.3·N(0,1), so that it changes which experts win.
    for bname, b in model.named_buffers():
        if bname.endswith("e_score_correction_bias"):
            b.copy_(0.3 * torch.randn(b.shape, generator=g, dtype=torch.float32))


def make_prompts() -> list[np.ndarray]:
    g = torch.Generator(device="cpu")
    g.manual_seed(BASE_SEED)
    seqs = [torch.randint(0, VOCAB, (n,), generator=g, dtype=torch.int64).numpy().astype(np.int32) for n in SEQ_LENS]
    seqs[2][4] = 0
    seqs[3][15] = VOCAB - 1
    seqs[4][0] = VOCAB - 1
    seqs[4][32] = 0
    return seqs


def save_kwargs() -> dict:
    # v4 needs safe_serialization=True; v5 always writes safetensors and has no such parameter.
    if "safe_serialization" in inspect.signature(transformers.PreTrainedModel.save_pretrained).parameters:
        return {"safe_serialization": True}
    return {}


def build_checkpoint(name: str, spec, built: dict) -> None:
    model_cls, config_cls, cfg = spec
    out = MODELS / name
    if out.exists():
        shutil.rmtree(out)
    config = config_cls(**cfg)
    torch.manual_seed(BASE_SEED)  # transformers' own init is overwritten below; seed it anyway
    model = model_cls(config).float().eval()
    src = SAME_WEIGHTS_AS.get(name)
    if src:
        model.load_state_dict(built[src].state_dict(), strict=True)
    else:
        init_weights(model, name)
    built[name] = model
    if name == "qwen3_bf16":
        model = model.to(torch.bfloat16)  # the qwen3 weights rounded to bf16 (round-to-nearest-even)
    kw = save_kwargs()
    if name == "llama_sharded":
        kw["max_shard_size"] = "200KB"
    model.save_pretrained(out, **kw)
    if src and name != "llama_sharded" and name != "qwen3_bf16":
        # Same bytes as the source's file: replace with a relative symlink (checked equal first).
        mine = out / "model.safetensors"
        theirs = MODELS / src / "model.safetensors"
        assert safetensors_equal(mine, theirs), f"{name}: weights differ from {src}"
        mine.unlink()
        mine.symlink_to(os.path.join("..", src, "model.safetensors"))


def write_safetensors(path: Path, tensors: dict[str, np.ndarray], metadata: dict[str, str]) -> None:
    """Write a .safetensors file byte-for-byte reproducibly (the safetensors package orders __metadata__ at random).

    Layout per the format: u64 little-endian header size, JSON header (keys sorted, padded with spaces to a
    multiple of 8), then the tensors' little-endian row-major bytes back to back in sorted-name order.
    """
    dtypes = {np.dtype(np.float32): "F32", np.dtype(np.int32): "I32"}
    header: dict = {"__metadata__": dict(sorted(metadata.items()))}
    blobs, offset = [], 0
    for name in sorted(tensors):
        arr = np.ascontiguousarray(tensors[name])
        data = arr.astype(arr.dtype.newbyteorder("<"), copy=False).tobytes()
        header[name] = {"dtype": dtypes[arr.dtype], "shape": list(arr.shape), "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(len(text).to_bytes(8, "little"))
        f.write(text)
        for b in blobs:
            f.write(b)


def safetensors_equal(a: Path, b: Path) -> bool:
    ta, tb = safetensors.numpy.load_file(str(a)), safetensors.numpy.load_file(str(b))
    return ta.keys() == tb.keys() and all(np.array_equal(ta[k], tb[k]) for k in ta)


def load_for_reference(name: str):
    model_cls = model_specs()[name][0]
    # Load with the stored dtype ("torch_dtype" before v5), so qwen3_bf16 really goes through its BF16 file.
    kwargs = {"attn_implementation": "eager", ("dtype" if TRANSFORMERS_MAJOR >= 5 else "torch_dtype"): "auto"}
    if model_cls in (Qwen3MoeForCausalLM, Glm4MoeForCausalLM, DeepseekV3ForCausalLM) and TRANSFORMERS_MAJOR >= 5:
        kwargs["experts_implementation"] = "eager"
    model = model_cls.from_pretrained(MODELS / name, **kwargs)
    stored = next(model.parameters()).dtype
    expected = torch.bfloat16 if name == "qwen3_bf16" else torch.float32
    assert stored == expected, f"{name}: loaded as {stored}, expected {expected}"
    return model.float().eval()  # bf16 storage, f32 compute for qwen3_bf16


def moe_layer_indices(config) -> list[int]:
    if config.model_type in GROUPED_ROUTING:
        return list(range(config.first_k_dense_replace, config.num_hidden_layers))
    if not hasattr(config, "num_experts"):
        return []
    return [
        i for i in range(config.num_hidden_layers)
        if i not in config.mlp_only_layers and config.num_experts > 0 and (i + 1) % config.decoder_sparse_step == 0
    ]


GROUPED_ROUTING = ("glm4_moe", "deepseek_v3")  # the models with Glm4MoeTopkRouter's (= DeepseekV3TopkRouter's) routing


def glm4_routing_check(config, gate, router_logits, weights, indices):
    """GLM-4 MoE's routing recomputed from the router logits (grouped top-k of the biased sigmoid scores) and
    checked against the hook's; returns the experts ordered as miles orders them (biased score descending, lower
    id first on ties), their weights, and the smallest margin of a choice (between the k-th and the next expert
    among the kept groups, and between the last kept and the first dropped group)."""
    e, k, ng, kg = config.n_routed_experts, config.num_experts_per_tok, config.n_group, config.topk_group
    scores = torch.sigmoid(router_logits.float())
    choice = scores + gate.e_score_correction_bias
    group = choice.view(-1, ng, e // ng).topk(2, dim=-1)[0].sum(dim=-1)
    gsorted = torch.sort(group, dim=-1, descending=True).values
    margin = float((gsorted[:, kg - 1] - gsorted[:, kg]).min()) if kg < ng else float("inf")
    keep = torch.zeros_like(group).scatter_(1, group.topk(kg, dim=-1)[1], 1)
    keep = keep.unsqueeze(-1).expand(-1, ng, e // ng).reshape(-1, e).bool()
    masked = choice.masked_fill(~keep, float("-inf"))
    msorted = torch.sort(masked, dim=-1, descending=True)
    if k < kg * (e // ng):
        margin = min(margin, float((msorted.values[:, k - 1] - msorted.values[:, k]).min()))
    ids = msorted.indices[:, :k]
    assert torch.equal(torch.sort(ids, dim=-1).values, torch.sort(indices, dim=-1).values), "GLM routing differs"
    # The hook's weights in our order.
    pos = (indices.unsqueeze(1) == ids.unsqueeze(2)).float().argmax(dim=-1)
    return ids, weights.gather(1, pos), margin


@torch.no_grad()
def run_model(model, ids: np.ndarray):
    """Plain forward of one sequence; returns logits [T, V] and, for MoE, experts/weights [T, L, k]."""
    moe_layers = moe_layer_indices(model.config)
    captured: dict[int, tuple] = {}
    hooks = []
    for li in moe_layers:
        gate = model.model.layers[li].mlp.gate

        def hook(_mod, _inp, out, li=li):
            captured[li] = out

        hooks.append(gate.register_forward_hook(hook))
    glm = model.config.model_type in GROUPED_ROUTING
    try:
        x = torch.from_numpy(ids.astype(np.int64))[None]
        out = model(input_ids=x, output_router_logits=bool(moe_layers)) if moe_layers and not glm \
            else model(input_ids=x)
    finally:
        for h in hooks:
            h.remove()
    logits = out.logits[0].float().numpy()
    if not moe_layers:
        return logits, None, None, None
    k = model.config.num_experts_per_tok
    experts, weights, margins = [], [], []
    for j, li in enumerate(moe_layers):
        router_logits, scores, indices = captured[li]
        if glm:
            gate = model.model.layers[li].mlp.gate
            indices, scores, margin = glm4_routing_check(model.config, gate, router_logits, scores, indices)
            margins.append(margin)
            experts.append(indices.to(torch.int32))
            weights.append(scores.float())
            continue
        # Cross-check the hook against an independent recomputation from output_router_logits.
        rl = out.router_logits[j].reshape(-1, model.config.num_experts).float()
        assert torch.equal(rl, router_logits.float())
        probs = torch.softmax(rl, dim=-1, dtype=torch.float32)
        top_v, top_i = torch.topk(probs, k, dim=-1)
        if model.config.norm_topk_prob:
            top_v = top_v / top_v.sum(dim=-1, keepdim=True)
        assert torch.equal(top_i, indices), f"layer {li}: hook indices differ from recomputed top-k"
        assert torch.allclose(top_v, scores.float(), rtol=0, atol=1e-7)
        srt = torch.sort(probs, dim=-1, descending=True).values
        margins.append((srt[:, k - 1] - srt[:, k]).min().item())
        experts.append(indices.to(torch.int32))
        weights.append(scores.float())
    experts = torch.stack(experts, dim=1).numpy()
    weights = torch.stack(weights, dim=1).numpy()
    return logits, experts, weights, min(margins)


@torch.no_grad()
def padded_batch_diff(model, prompts: list[np.ndarray], singles: list[np.ndarray]) -> float:
    tmax = max(len(p) for p in prompts)
    ids = torch.zeros((len(prompts), tmax), dtype=torch.int64)
    mask = torch.zeros((len(prompts), tmax), dtype=torch.int64)
    for b, p in enumerate(prompts):
        ids[b, : len(p)] = torch.from_numpy(p.astype(np.int64))
        mask[b, : len(p)] = 1
    logits = model(input_ids=ids, attention_mask=mask).logits.float().numpy()
    return max(float(np.abs(logits[b, : len(p)] - singles[b]).max()) for b, p in enumerate(prompts))


def rope_reference(model) -> tuple[np.ndarray, float]:
    rot = model.model.rotary_emb
    if hasattr(rot, "full_attention_inv_freq"):  # Gemma 3: the full layers' table
        return (rot.full_attention_inv_freq.detach().float().numpy().copy(),
                float(rot.full_attention_attention_scaling))
    return rot.inv_freq.detach().float().numpy().copy(), float(rot.attention_scaling)


def dir_size(path: Path) -> tuple[int, int]:
    files = [f for f in sorted(path.iterdir())]
    real = [f for f in files if not f.is_symlink()]
    return len(files), sum(f.stat().st_size for f in real)


def main() -> int:
    import argparse
    global DATA, MODELS, GOLDENS
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DATA,
                        help="folder to write models/ and goldens/ into (default: tests/data); "
                             "the live-reference test writes elsewhere and compares bytes")
    args = parser.parse_args()
    DATA = args.out
    MODELS = DATA / "models"
    GOLDENS = DATA / "goldens"
    torch.manual_seed(BASE_SEED)
    torch.set_num_threads(1)
    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    MODELS.mkdir(parents=True, exist_ok=True)
    GOLDENS.mkdir(parents=True, exist_ok=True)

    specs = model_specs()
    built: dict = {}
    for name, spec in specs.items():
        build_checkpoint(name, spec, built)

    prompts = make_prompts()
    versions = {
        "torch_version": torch.__version__,
        "transformers_version": transformers.__version__,
        "safetensors_version": safetensors.__version__,
        "numpy_version": np.__version__,
        "python_version": sys.version.split()[0],
    }
    rows = []
    all_logits = {}
    for name in specs:
        model = load_for_reference(name)
        tensors: dict[str, np.ndarray] = {}
        singles, min_margin = [], None
        for i, ids in enumerate(prompts):
            logits, experts, weights, margin = run_model(model, ids)
            singles.append(logits)
            tensors[f"seq{i}.ids"] = ids.astype(np.int32)
            tensors[f"seq{i}.logits"] = logits.astype(np.float32)
            if experts is not None:
                tensors[f"seq{i}.experts"] = experts.astype(np.int32)
                tensors[f"seq{i}.expert_weights"] = weights.astype(np.float32)
                min_margin = margin if min_margin is None else min(min_margin, margin)
        inv_freq, attn_scaling = rope_reference(model)
        tensors["rope.inv_freq"] = inv_freq.astype(np.float32)
        tensors["rope.attention_scaling"] = np.array([attn_scaling], dtype=np.float32)
        pad_diff = padded_batch_diff(model, prompts, singles)
        cat = np.concatenate(singles)
        all_logits[name] = cat
        moe_layers = moe_layer_indices(model.config)
        meta = dict(versions)
        meta.update({
            "model": name,
            "model_class": type(model).__name__,
            "checkpoint": f"tests/data/models/{name}",
            "storage_dtype": "bfloat16" if name == "qwen3_bf16" else "float32",
            "compute_dtype": "float32",
            "attn_implementation": "eager",
            "num_seqs": str(len(prompts)),
            "seq_lens": ",".join(str(len(p)) for p in prompts),
            "rope_attention_scaling": repr(attn_scaling),
            "padded_batch_max_abs_diff": repr(pad_diff),
            "generator": "scripts/make_goldens.py",
        })
        if moe_layers:
            meta["moe_layers"] = ",".join(map(str, moe_layers))
            meta["top_k"] = str(model.config.num_experts_per_tok)
            meta["norm_topk_prob"] = str(bool(model.config.norm_topk_prob)).lower()
            if model.config.model_type in GROUPED_ROUTING:
                meta["routing"] = "grouped sigmoid (min_topk_prob_margin: of the biased scores and group scores)"
            meta["min_topk_prob_margin"] = repr(min_margin)
        gpath = GOLDENS / f"{name}.safetensors"
        write_safetensors(gpath, tensors, meta)
        # Read back with the safetensors package and compare.
        back = safetensors.numpy.load_file(str(gpath))
        with safetensors.safe_open(str(gpath), framework="numpy") as f:
            assert f.metadata() == meta
        assert back.keys() == tensors.keys()
        for k, v in tensors.items():
            assert back[k].dtype == v.dtype and np.array_equal(back[k], v), k
        nfiles, nbytes = dir_size(MODELS / name)
        rows.append((name, nfiles, nbytes, gpath.stat().st_size, float(cat.std()), float(np.abs(cat).max()),
                     pad_diff, min_margin))
        assert 1.0 <= cat.std() <= 5.0, f"{name}: logits std {cat.std()} out of range"

    print(f"torch {torch.__version__}, transformers {transformers.__version__}, safetensors {safetensors.__version__}")
    hdr = f"{'model':<20} {'files':>5} {'ckpt bytes':>10} {'golden bytes':>12} {'logit std':>9} {'max|logit|':>10}" \
          f" {'pad diff':>9} {'min topk margin':>15}"
    print(hdr)
    print("-" * len(hdr))
    for name, nf, nb, gb, sd, mx, pd, mm in rows:
        mm_s = f"{mm:.3e}" if mm is not None else "-"
        print(f"{name:<20} {nf:>5} {nb:>10} {gb:>12} {sd:>9.3f} {mx:>10.3f} {pd:>9.2e} {mm_s:>15}")
    print("\nmax |logits - llama logits| (same weights, different config):")
    for name in ("llama_rope_llama3", "llama_rope_yarn", "llama_rope_linear", "llama_sharded"):
        print(f"  {name:<20} {float(np.abs(all_logits[name] - all_logits['llama']).max()):.4e}")
    print(f"  {'qwen3_bf16 vs qwen3':<20} {float(np.abs(all_logits['qwen3_bf16'] - all_logits['qwen3']).max()):.4e}")
    total = sum(f.stat().st_size for f in DATA.rglob("*") if f.is_file() and not f.is_symlink())
    print(f"\ntests/data total (symlinks not counted): {total} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Make gradient and AdamW goldens with torch autograd for the tiny reference checkpoints.

Inputs (committed, never regenerated here): the checkpoints tests/data/models/<name>/ and the prompts seq1..seq4
(lengths 4, 9, 16, 33; seq0, length 1, has no target and is skipped) of tests/data/goldens/<name>.safetensors,
both from scripts/make_goldens.py. Same conventions: CPU, one thread, float32 compute, eager attention (and eager
experts for Qwen3-MoE), model.eval() (no dropout; these configs have none anyway), deterministic.

The loss (the policy-gradient-with-entropy shape the trainer uses):
    each sequence s (ids [T]) runs on its own: batch 1, no padding, no attention mask, logits float32 [T, V].
    targets t = 0..T-2 predict ids[t+1]:
        logp[s,t]    = log_softmax(logits[t])[ids[t+1]]
        entropy[s,t] = -sum_v p_v log p_v,  p = softmax(logits[t])      (the gradient flows through it too)
    coef[s,t] ~ U[-1, 2] float32, from torch.Generator seeded COEF_SEED, drawn per sequence in order s = 1..4
    (torch.rand(T-1) * 3 - 1); the same coefficients for every model.  beta = 0.01.  N = sum_s (T_s - 1) = 58.
        loss = ( sum_{s,t} coef[s,t] * (-logp[s,t])  -  beta * sum_{s,t} entropy[s,t] ) / N
    Per sequence the two sums are formed in float32 with torch.sum, the four sequences added in order, then / N.
    No MoE auxiliary (load-balancing) loss: output_router_logits is False.

Gradient file  tests/data/grad_goldens/<name>.safetensors  (names: gemma3, glm4_moe, glm4_moe_nonorm, llama, llama_tied, llama_bias, mistral, phi3, qwen2,
qwen3, qwen3_bf16, qwen3_moe, qwen3_moe_nonorm). All tensors little-endian float32 unless said; names sorted in the file:
    seq{i}.ids        int32 [T]     i = 1..4, the prompt (copied from the logits goldens)
    seq{i}.coef             [T-1]
    seq{i}.logp             [T-1]
    seq{i}.entropy          [T-1]
    loss                    [1]
    beta                    [1]
    grad.<name>             d loss / d parameter, for EVERY tensor of the checkpoint's model.safetensors, under its
                            on-disk name and shape (e.g. grad.model.layers.0.self_attn.q_proj.weight [64, 64]).
  - Tied embeddings (llama_tied): the file has no lm_head.weight, so there is one gradient,
    grad.model.embed_tokens.weight = the embedding-lookup gradient + the LM-head gradient (their total).
  - Qwen3-MoE: transformers 5 fuses each layer's experts into two parameters, mlp.experts.gate_up_proj
    [E, 2I, H] (rows 0..I-1 = gate_proj, I..2I-1 = up_proj) and mlp.experts.down_proj [E, H, I]; the checkpoint
    stores them per expert (mlp.experts.<e>.{gate,up,down}_proj.weight). Gradients are given under the on-disk
    per-expert names, split exactly as the file stores them (checked: the split parameters equal the file).
    An expert that no token selects gets an all-zero gradient.
  - MoE routing: probs = softmax(router logits) over all E experts (float32); top-k picks the experts (not
    differentiable); the selected probabilities, renormalised to sum 1 when norm_topk_prob, weight the expert
    outputs. So mlp.gate.weight gets gradient only through those k weights - but through the full softmax
    (each selected weight depends on all E logits). This is exactly HF's Qwen3MoeTopKRouter.
  - GLM-4 MoE (glm4_moe, glm4_moe_nonorm): scores = sigmoid(router logits); the experts are chosen by scores +
    e_score_correction_bias among the best groups (not differentiable); the chosen scores (renormalised with
    + 1e-20 when norm_topk_prob) times routed_scaling_factor weight the expert outputs, plus the shared expert.
    e_score_correction_bias is a buffer, never trained: the file has no gradient for it.
  - qwen3_bf16: the BF16 checkpoint widened to float32 (HF .float()), then as the others: float32 gradients.

AdamW file  tests/data/grad_goldens/adamw_<name>.safetensors  (llama, qwen3_moe): 10 optimizer steps on the same
loss and batch, starting from the checkpoint. Step k = 0..9:
    zero grads; loss_k = the loss above at the current parameters; backward;
    grad_norm_k = torch.nn.utils.clip_grad_norm_(params, max_norm=1.0)  (pre-clip total L2 norm; when
        1.0 / (grad_norm_k + 1e-6) < 1 every gradient is multiplied by it, in float32);
    lr_k (python float64):  k < 3: 1e-3 * (k + 1) / 3
                            else:  1e-4 + (1e-3 - 1e-4) * 0.5 * (1 + cos(pi * (k - 3) / 7))
    group['lr'] = lr_k for both groups; optimizer.step().
    torch.optim.AdamW(betas=(0.9, 0.95), eps=1e-8, foreach=False, amsgrad=False, maximize=False), two groups:
    weight_decay 0.1 for parameters with ndim >= 2 (every matrix, the fused 3-D expert tensors included, the
    embedding and LM head included), 0.0 for ndim < 2 (the RMSNorm weights). Per element, torch's update:
        p *= 1 - lr*wd;  m = b1*m + (1-b1)*g;  v = b2*v + (1-b2)*g*g;
        p -= lr / (1 - b1^(k+1)) * m / (sqrt(v) / sqrt(1 - b2^(k+1)) + eps)
    Tensors:
    step.loss       [10]  loss_k (before step k's update)
    step.grad_norm  [10]  grad_norm_k (pre-clip)
    step.lr         [10]  lr_k rounded to float32 (the float64 values are in metadata lr_values)
    final.<name>          every on-disk tensor after the 10 steps (on-disk names/shapes, split as above)
  The grad norm is taken over the model's parameters as torch holds them (fused experts); a norm over the split
  tensors is the same number up to float32 summation order.

Metadata (safetensors __metadata__, all strings): versions, model facts, the loss formula, beta, seeds, the
hyperparameters, and f32_vs_f64_grad_max_rel_err (the largest over tensors of max|g32 - g64| / max|g64|, from a
model.double() rerun of the same loss; HF keeps RMSNorm and the softmaxes in float32 even then) as a hint of a
sensible tolerance for the C++ comparison. MoE files also give min_topk_prob_margin (the smallest gap between the
k-th and (k+1)-th router probability; the AdamW file per step): a routing flip in the C++ run needs an error that big.

Files are written byte-for-byte reproducibly (make_goldens.write_safetensors). Rerun with:

    /root/.venvs/miles-ref/bin/python scripts/make_grad_goldens.py [--out DIR]   # writes DIR/grad_goldens/
"""

from __future__ import annotations

import argparse
import json
import math
import struct
import sys
from pathlib import Path

import numpy as np
import safetensors
import safetensors.numpy
import torch
import transformers

sys.path.insert(0, str(Path(__file__).resolve().parent))
import make_goldens as mg  # noqa: E402  (shares the model specs, loader and the reproducible writer)

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "tests" / "data"

GRAD_MODELS = ("deepseek_v3", "deepseek_v3_noq", "gemma3", "glm4_moe", "glm4_moe_nonorm", "llama", "llama_tied", "llama_bias", "mistral", "phi3",
               "qwen2", "qwen3", "qwen3_bf16", "qwen3_moe", "qwen3_moe_nonorm")
ADAMW_MODELS = ("llama", "qwen3_moe")
SEQS = (1, 2, 3, 4)  # indices into the logits goldens' prompts; seq0 (length 1) has no target
COEF_SEED = 20240612
COEF_LO, COEF_HI = -1.0, 2.0
BETA = 0.01

ADAMW = dict(peak_lr=1e-3, min_lr=1e-4, warmup=3, total=10, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1,
             max_grad_norm=1.0)

LOSS_FORMULA = ("loss = ( sum_{s,t} coef[s,t] * (-logp[s,t]) - beta * sum_{s,t} entropy[s,t] ) / N; "
                "logp[s,t] = log_softmax(logits_s[t])[ids_s[t+1]], entropy[s,t] = -sum_v p log p, "
                "t = 0..T_s-2, N = total targets; each sequence a separate batch-1 forward, no padding")


# ----------------------------------------------------------------------------------------------- inputs


def load_prompts(name: str) -> list[np.ndarray]:
    gold = safetensors.numpy.load_file(str(DATA / "goldens" / f"{name}.safetensors"))
    return [gold[f"seq{i}.ids"].astype(np.int32) for i in SEQS]


def make_coefs(prompts: list[np.ndarray]) -> list[torch.Tensor]:
    g = torch.Generator(device="cpu")
    g.manual_seed(COEF_SEED)
    return [torch.rand(len(p) - 1, generator=g, dtype=torch.float32) * (COEF_HI - COEF_LO) + COEF_LO for p in prompts]


def disk_header(name: str) -> dict:
    """name -> (dtype, shape) of the checkpoint's model.safetensors (one file for every model used here)."""
    with open(DATA / "models" / name / "model.safetensors", "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
    header.pop("__metadata__", None)
    return {k: (v["dtype"], tuple(v["shape"])) for k, v in header.items()}


# ------------------------------------------------------------------------------------ on-disk name mapping


def to_disk(model, tensors: dict[str, torch.Tensor], disk: dict) -> dict[str, np.ndarray]:
    """Rename/split tensors keyed by model parameter names into the checkpoint's on-disk names and shapes."""
    out: dict[str, np.ndarray] = {}
    inter = getattr(model.config, "moe_intermediate_size", None)
    for pname, t in tensors.items():
        t = t.detach().float().contiguous()
        if pname.endswith(".mlp.experts.gate_up_proj"):
            base = pname[: -len("gate_up_proj")]
            assert t.shape[1] == 2 * inter, (pname, t.shape)
            for e in range(t.shape[0]):
                out[f"{base}{e}.gate_proj.weight"] = t[e, :inter].numpy().copy()
                out[f"{base}{e}.up_proj.weight"] = t[e, inter:].numpy().copy()
        elif pname.endswith(".mlp.experts.down_proj"):
            base = pname[: -len("down_proj")]
            for e in range(t.shape[0]):
                out[f"{base}{e}.down_proj.weight"] = t[e].numpy().copy()
        else:
            out[pname] = t.numpy().copy()
    # GLM-4 MoE's e_score_correction_bias is a buffer (never trained): on disk, not among the parameters.
    trained = {k for k in disk if not k.endswith("e_score_correction_bias")}
    assert out.keys() == trained, f"names differ from disk: {sorted(set(out) ^ trained)}"
    for k, v in out.items():
        assert tuple(v.shape) == disk[k][1], (k, v.shape, disk[k])
    return out


def check_params_equal_disk(name: str, model, disk: dict) -> None:
    """The loaded (fused, widened) parameters, split back, equal the checkpoint's tensors exactly."""
    params = to_disk(model, dict(model.named_parameters()), disk)
    path = DATA / "models" / name / "model.safetensors"
    with safetensors.safe_open(str(path), framework="pt") as f:
        for k in params:
            ref = f.get_tensor(k).float().numpy()
            assert np.array_equal(params[k], ref), f"{name}: loaded {k} differs from the file"


# ------------------------------------------------------------------------------------------------ loss


def forward_terms(model, ids: np.ndarray, dtype=torch.float32):
    x = torch.from_numpy(ids.astype(np.int64))[None]
    logits = model(input_ids=x).logits[0].to(dtype)  # [T, V]
    logp_all = torch.log_softmax(logits[:-1], dim=-1)
    tgt = torch.from_numpy(ids[1:].astype(np.int64))
    logp = logp_all.gather(-1, tgt[:, None])[:, 0]
    entropy = -(logp_all.exp() * logp_all).sum(-1)
    return logits, logp, entropy


def compute_loss(model, prompts, coefs, dtype=torch.float32):
    n = sum(len(p) - 1 for p in prompts)
    total = None
    per_seq = []
    for ids, c in zip(prompts, coefs):
        logits, logp, ent = forward_terms(model, ids, dtype)
        term = torch.sum(c.to(dtype) * (-logp)) - BETA * torch.sum(ent)
        total = term if total is None else total + term
        per_seq.append((logits, logp, ent))
    return total / n, per_seq, n


# ------------------------------------------------------------------------------------------------ files


def versions() -> dict[str, str]:
    return {
        "torch_version": torch.__version__,
        "transformers_version": transformers.__version__,
        "safetensors_version": safetensors.__version__,
        "numpy_version": np.__version__,
        "python_version": sys.version.split()[0],
    }


def base_meta(name: str, model, prompts, n: int) -> dict[str, str]:
    meta = versions()
    meta.update({
        "model": name,
        "model_class": type(model).__name__,
        "checkpoint": f"tests/data/models/{name}",
        "prompts": f"tests/data/goldens/{name}.safetensors seq" + ",".join(map(str, SEQS)),
        "seq_lens": ",".join(str(len(p)) for p in prompts),
        "num_targets": str(n),
        "storage_dtype": "bfloat16" if name == "qwen3_bf16" else "float32",
        "compute_dtype": "float32",
        "attn_implementation": "eager",
        "mode": "eval (no dropout)",
        "loss_formula": LOSS_FORMULA,
        "beta": repr(BETA),
        "coef_seed": str(COEF_SEED),
        "coef_distribution": f"torch.rand(T-1, generator=Generator().manual_seed({COEF_SEED})) * 3 - 1 "
                             f"per sequence in order (uniform [{COEF_LO}, {COEF_HI}))",
        "param_names": "on-disk names of model.safetensors",
        "tied_word_embeddings": str(bool(model.config.tie_word_embeddings)).lower(),
        "generator": "scripts/make_grad_goldens.py",
    })
    if model.config.tie_word_embeddings:
        meta["tied_note"] = ("lm_head.weight is model.embed_tokens.weight; grad.model.embed_tokens.weight is the "
                             "total gradient (embedding lookup + LM head)")
    moe = mg.moe_layer_indices(model.config)
    if moe:
        meta["moe_layers"] = ",".join(map(str, moe))
        meta["num_experts"] = str(model.config.num_local_experts)
        meta["top_k"] = str(model.config.num_experts_per_tok)
        meta["norm_topk_prob"] = str(bool(model.config.norm_topk_prob)).lower()
        meta["experts_implementation"] = "eager"
        meta["moe_note"] = ("top-k selection is not differentiable; the router weight gets gradient through the "
                            "selected experts' softmax probabilities (renormalised when norm_topk_prob), as HF's "
                            "Qwen3MoeTopKRouter; no aux loss. transformers fuses experts into "
                            "experts.gate_up_proj [E,2I,H] (gate rows first) and experts.down_proj [E,H,I]; "
                            "tensors here are split back to the on-disk per-expert names")
        if model.config.model_type in mg.GROUPED_ROUTING:
            meta["moe_note"] = ("grouped sigmoid routing (HF's Glm4MoeTopkRouter): the router weight gets gradient "
                                "through the chosen experts' sigmoid scores (renormalised when norm_topk_prob, "
                                "scaled by routed_scaling_factor); e_score_correction_bias is a buffer (no "
                                "gradient); experts split back to the on-disk per-expert names as for Qwen3-MoE")
    return meta


def write_and_verify(path: Path, tensors: dict[str, np.ndarray], meta: dict[str, str]) -> None:
    mg.write_safetensors(path, tensors, meta)
    back = safetensors.numpy.load_file(str(path))
    with safetensors.safe_open(str(path), framework="numpy") as f:
        assert f.metadata() == meta
    assert back.keys() == tensors.keys()
    for k, v in tensors.items():
        assert back[k].dtype == v.dtype and np.array_equal(back[k], v), k


def min_topk_margin(model, prompts) -> float | None:
    """Smallest gap between the k-th and (k+1)-th router probability over all tokens and MoE layers."""
    moe = mg.moe_layer_indices(model.config)
    if not moe:
        return None
    k = model.config.num_experts_per_tok
    margins = []
    hooks = []
    glm = model.config.model_type in mg.GROUPED_ROUTING
    for li in moe:
        gate = model.model.layers[li].mlp.gate

        def hook(_m, _i, out, gate=gate):
            if glm:  # the margins of its grouped choice (make_goldens.glm4_routing_check)
                margins.append(mg.glm4_routing_check(model.config, gate, out[0], out[1], out[2])[2])
                return
            probs = torch.softmax(out[0].float(), dim=-1)
            srt = torch.sort(probs, dim=-1, descending=True).values
            margins.append((srt[:, k - 1] - srt[:, k]).min().item())
        hooks.append(model.model.layers[li].mlp.gate.register_forward_hook(hook))
    try:
        with torch.no_grad():
            for ids in prompts:
                model(input_ids=torch.from_numpy(ids.astype(np.int64))[None])
    finally:
        for h in hooks:
            h.remove()
    return min(margins)


# ------------------------------------------------------------------------------------------- gradients


def make_grad_golden(name: str, out_dir: Path) -> tuple[Path, float, float]:
    model = mg.load_for_reference(name)
    disk = disk_header(name)
    check_params_equal_disk(name, model, disk)
    prompts = load_prompts(name)
    coefs = make_coefs(prompts)

    model.zero_grad(set_to_none=True)
    loss, per_seq, n = compute_loss(model, prompts, coefs)
    loss.backward()
    named = dict(model.named_parameters())
    assert all(p.grad is not None for p in named.values()), "a parameter got no gradient"
    grads = to_disk(model, {k: p.grad for k, p in named.items()}, disk)

    # The forward is the logits goldens' forward: with autograd on it must give the same logits.
    gold = safetensors.numpy.load_file(str(DATA / "goldens" / f"{name}.safetensors"))
    logit_diff = max(float(np.abs(lg.detach().numpy() - gold[f"seq{i}.logits"]).max())
                     for i, (lg, _, _) in zip(SEQS, per_seq))
    assert logit_diff <= 1e-5, f"{name}: logits differ from the goldens by {logit_diff}"

    # Float64 rerun: a tolerance hint (and a check that the float32 gradients are sane).
    m64 = mg.load_for_reference(name).double()
    loss64, _, _ = compute_loss(m64, prompts, coefs, torch.float64)
    loss64.backward()
    g64 = to_disk(m64, {k: p.grad for k, p in m64.named_parameters()}, disk)  # to_disk casts to float32
    g64 = {k: v.astype(np.float64) for k, v in g64.items()}
    rel = max(float(np.abs(grads[k] - g64[k]).max() / max(np.abs(g64[k]).max(), 1e-30)) for k in grads)
    assert rel < 1e-3, f"{name}: float32 vs float64 gradients differ by {rel} (relative)"

    tensors: dict[str, np.ndarray] = {}
    for i, ids, c, (_, logp, ent) in zip(SEQS, prompts, coefs, per_seq):
        tensors[f"seq{i}.ids"] = ids.astype(np.int32)
        tensors[f"seq{i}.coef"] = c.numpy().astype(np.float32)
        tensors[f"seq{i}.logp"] = logp.detach().numpy().astype(np.float32)
        tensors[f"seq{i}.entropy"] = ent.detach().numpy().astype(np.float32)
    tensors["loss"] = np.array([loss.item()], dtype=np.float32)
    tensors["beta"] = np.array([BETA], dtype=np.float32)
    for k, v in grads.items():
        tensors[f"grad.{k}"] = v.astype(np.float32)

    meta = base_meta(name, model, prompts, n)
    meta["loss_float64"] = repr(loss64.item())
    meta["f32_vs_f64_grad_max_rel_err"] = f"{rel:.3e}"
    meta["f64_note"] = ("float64 rerun = model.double(); HF still computes RMSNorm, the attention softmax and the "
                        "router softmax in float32 inside it, so this is a tolerance hint, not an exact error")
    meta["logits_vs_goldens_max_abs_diff"] = repr(logit_diff)
    margin = min_topk_margin(model, prompts)
    if margin is not None:
        meta["min_topk_prob_margin"] = repr(margin)
        zero = [k for k, v in grads.items() if ".experts." in k and not np.any(v)]
        meta["experts_with_zero_grad"] = str(len(zero) // 3)
    path = out_dir / f"{name}.safetensors"
    write_and_verify(path, tensors, meta)
    return path, float(loss.item()), rel


# ------------------------------------------------------------------------------------------------ AdamW


def lr_at(k: int) -> float:
    a = ADAMW
    if k < a["warmup"]:
        return a["peak_lr"] * (k + 1) / a["warmup"]
    progress = (k - a["warmup"]) / (a["total"] - a["warmup"])
    return a["min_lr"] + (a["peak_lr"] - a["min_lr"]) * 0.5 * (1.0 + math.cos(math.pi * progress))


def make_adamw_golden(name: str, out_dir: Path) -> tuple[Path, list[float]]:
    a = ADAMW
    model = mg.load_for_reference(name)
    disk = disk_header(name)
    prompts = load_prompts(name)
    coefs = make_coefs(prompts)
    params = [p for _, p in model.named_parameters()]
    decay = [p for p in params if p.ndim >= 2]
    no_decay = [p for p in params if p.ndim < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": a["weight_decay"]}, {"params": no_decay, "weight_decay": 0.0}],
        lr=a["peak_lr"], betas=a["betas"], eps=a["eps"], foreach=False)
    losses, norms, lrs, margins = [], [], [], []
    for k in range(a["total"]):
        margin = min_topk_margin(model, prompts)
        if margin is not None:
            margins.append(margin)
        opt.zero_grad(set_to_none=True)
        loss, _, n = compute_loss(model, prompts, coefs)
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(params, max_norm=a["max_grad_norm"])
        lr = lr_at(k)
        for group in opt.param_groups:
            group["lr"] = lr
        opt.step()
        losses.append(loss.item())
        norms.append(norm.item())
        lrs.append(lr)
    final = to_disk(model, dict(model.named_parameters()), disk)

    tensors: dict[str, np.ndarray] = {
        "step.loss": np.array(losses, dtype=np.float32),
        "step.grad_norm": np.array(norms, dtype=np.float32),
        "step.lr": np.array(lrs, dtype=np.float32),
    }
    for k, v in final.items():
        tensors[f"final.{k}"] = v.astype(np.float32)
    meta = base_meta(name, model, prompts, n)
    meta.update({
        "optimizer": "torch.optim.AdamW(foreach=False, amsgrad=False, maximize=False)",
        "steps": str(a["total"]),
        "peak_lr": repr(a["peak_lr"]),
        "min_lr": repr(a["min_lr"]),
        "warmup_steps": str(a["warmup"]),
        "total_steps": str(a["total"]),
        "lr_schedule": "k < warmup: peak*(k+1)/warmup; else min + (peak-min)*0.5*(1+cos(pi*(k-warmup)/(total-warmup)))",
        "lr_values": ",".join(repr(x) for x in lrs),
        "beta1": repr(a["betas"][0]),
        "beta2": repr(a["betas"][1]),
        "eps": repr(a["eps"]),
        "weight_decay": f"{a['weight_decay']!r} for ndim >= 2, 0.0 for ndim < 2",
        "max_grad_norm": repr(a["max_grad_norm"]),
        "grad_clip": "torch.nn.utils.clip_grad_norm_: pre-clip total L2 norm; grads *= max/(norm+1e-6) when < 1",
        "grad_norm_over": "the model's parameters as torch holds them (MoE experts fused)",
        "loss_values": ",".join(repr(x) for x in losses),
        "grad_norm_values": ",".join(repr(x) for x in norms),
    })
    if margins:
        meta["min_topk_prob_margin_over_steps"] = repr(min(margins))
        meta["min_topk_prob_margin_per_step"] = ",".join(repr(x) for x in margins)
    path = out_dir / f"adamw_{name}.safetensors"
    write_and_verify(path, tensors, meta)
    return path, losses


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DATA,
                        help="folder to write grad_goldens/ into (default: tests/data); the live-reference "
                             "test writes elsewhere and compares bytes")
    args = parser.parse_args()
    out_dir = args.out / "grad_goldens"
    out_dir.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(mg.BASE_SEED)
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()

    print(f"torch {torch.__version__}, transformers {transformers.__version__}")
    total = 0
    for name in GRAD_MODELS:
        path, loss, rel = make_grad_golden(name, out_dir)
        size = path.stat().st_size
        total += size
        print(f"{path.name:<36} {size:>9} bytes  loss {loss:+.6f}  f32 vs f64 grad rel err {rel:.2e}")
    for name in ADAMW_MODELS:
        path, losses = make_adamw_golden(name, out_dir)
        size = path.stat().st_size
        total += size
        print(f"{path.name:<36} {size:>9} bytes  loss {losses[0]:+.6f} -> {losses[-1]:+.6f}")
    print(f"total {total} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())

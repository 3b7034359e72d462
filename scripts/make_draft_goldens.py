#!/usr/bin/env python3
"""Make the draft head's goldens with transformers and torch autograd (include/miles/draft_head.h).

The draft of x_{j+2} at row j of a sequence x_0..x_{T-1} (j = 0..T-2):
    u_j = fc @ cat(embed[x_{j+1}] * embed_scale, norm(f_j))    fc: [H, 2H]; norm: the policy's final RMSNorm
    logits_j = LM(u_0..u_j)                                      a transformers CausalLM of the policy's class
                                                                 with ONE layer (the policy's layer 0), the policy's
                                                                 final norm, vocab = the draft ids, lm_head = the
                                                                 policy's head rows at those ids, fed inputs_embeds=u
    q_j = softmax(policy_logits[j + 1][vocab])                   the target over the draft vocabulary
    loss = scale * sum_j weight[j + 1] * (-sum_i q_j[i] * log_softmax(logits_j)[i]),   scale = 1 / sum(weight used)

Inputs are drawn here from torch.Generator(seed 31) (CPU, float32, one thread, eager attention): two sequences of
7 and 12 ids, features f ~ 2 N(0, 1) [T, H], policy logits ~ 3 N(0, 1) [T, V], weight in {0, 0.5, 1} with each
sequence's first row 0, 48 draft ids (sorted, distinct), fc = [I | 0] + 0.2 N(0, 1).

Several feature layers (EAGLE-3), files <name>.layers0-1.safetensors: seed 32, features [T, 2, H] (the outputs of
layers 0 and 1), and
    u_j = fc @ cat(embed[x_{j+1}] * embed_scale, P @ cat(norm_0(f_j[0]), norm_1(f_j[1])))
where norm_0 is the policy's layer 1 input norm, norm_1 its final norm, and P [H, 2H] = [0 | I] + 0.2 N(0, 1)
(drawn after fc), with its gradient grad.draft.feature_fc.weight and the file's P as feature_fc.

EAGLE-3's training-time test (DraftHead::accumulate_grad with 3 passes), files <name>.ttt3.safetensors and
qwen3.layers0-1.ttt3.safetensors: make_ttt.

File tests/data/draft_goldens/<name>.safetensors (policies llama_tied, qwen3), float32 unless said:
    ids int32 [T], lens int32 [2], vocab int32 [48], features [T, H], policy_logits [T, V], weight [T], scale [1],
    fc [H, 2H], loss [1] (the scaled sum), sums [4] (sum w, sum w*agree, sum w*accept, sum w*in_vocab),
    last_logits [2, 48] (each sequence's last draft row), last_hidden [2, H] (the layer's output there, before the
    norm), grad.draft.fc.weight, grad.draft.layers.0.<name> (d loss / d parameter of the layer, policy names under
    draft.layers.0.).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import transformers

sys.path.insert(0, str(Path(__file__).resolve().parent))
import make_goldens as mg  # noqa: E402  (its reproducible safetensors writer)

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "tests" / "data"
POLICIES = ["llama_tied", "qwen3"]
SEED = 31
LENS = [7, 12]
DRAFT_VOCAB = 48
TTT_PASSES = 3


def draw_inputs(name: str, seed: int, layers: list[int] | None):
    """The policy and the inputs drawn from torch.Generator(seed), in this order: ids, features ([T, H], or
    [T, layers, H]), policy logits, weights (each sequence's first row 0), the draft ids, fc; the generator is
    returned for further draws."""
    policy = transformers.AutoModelForCausalLM.from_pretrained(DATA / "models" / name, dtype=torch.float32,
                                                               attn_implementation="eager").eval()
    h, v = policy.config.hidden_size, policy.config.vocab_size
    g = torch.Generator().manual_seed(seed)
    t = sum(LENS)
    ids = torch.randint(0, v, (t,), generator=g, dtype=torch.int64)
    features = 2 * torch.randn(t, h, generator=g) if layers is None else 2 * torch.randn(t, len(layers), h, generator=g)
    plogits = 3 * torch.randn(t, v, generator=g)
    weight = torch.randint(0, 3, (t,), generator=g).float() / 2
    start = 0
    for n in LENS:
        weight[start] = 0
        start += n
    vocab = torch.randperm(v, generator=g)[:DRAFT_VOCAB].sort().values
    fc = torch.cat([torch.eye(h), torch.zeros(h, h)], 1) + 0.2 * torch.randn(h, 2 * h, generator=g)
    return policy, g, ids, features, plogits, weight, vocab, fc


def row_sums(w, logits, tgt, vocab):
    """[sum w, sum w*agree, sum w*accept, sum w*in_vocab] (float64) of draft rows: logits [R, 48], the policy's
    target rows tgt [R, V], weights w [R]."""
    full = torch.softmax(tgt.double(), -1)
    best = vocab[logits.argmax(-1)]
    wd = w.double()
    return torch.stack([wd.sum(), (wd * (best == tgt.argmax(-1)).double()).sum(),
                        (wd * full[torch.arange(len(w)), best]).sum(), (wd * full[:, vocab].sum(-1)).sum()])


def draft_model(policy, vocab):
    """The head's layer as a transformers CausalLM of the policy's class: ONE layer (the policy's layer 0), the
    policy's final norm, vocab = the draft ids, lm_head = the policy's head rows at those ids; with the policy's
    embedding and embed scale."""
    cfg = policy.config
    dcfg = type(cfg).from_dict(cfg.to_dict())
    dcfg.num_hidden_layers = 1
    dcfg.vocab_size = DRAFT_VOCAB
    dcfg.tie_word_embeddings = False
    if getattr(dcfg, "layer_types", None):
        dcfg.layer_types = dcfg.layer_types[:1]
    draft = type(policy)(dcfg).eval()
    sd = policy.state_dict()
    head = sd["lm_head.weight"] if "lm_head.weight" in sd else sd["model.embed_tokens.weight"]
    with torch.no_grad():
        for k, p in draft.named_parameters():
            if k.startswith("model.layers.0."):
                p.copy_(sd[k])
        draft.model.norm.weight.copy_(sd["model.norm.weight"])
        draft.lm_head.weight.copy_(head[vocab])
        draft.model.embed_tokens.weight.copy_(head[vocab])
    embed = sd["model.embed_tokens.weight"]
    escale = float(getattr(draft.model, "embed_scale", 1.0)) if hasattr(draft.model, "embed_scale") else 1.0
    return dcfg, draft, embed, escale


def feature_projection(policy, g, features, layers):
    """The head's feature rows from the policy's: the final norm of the last layer's state, or with several layers
    P @ cat(norm_l(h_l)) (each layer's state as the next layer's input norm sees it; P drawn from g near [0 | I]).
    Returns (feature(rows), P, P as a parameter); P is None for one layer."""
    if layers is None:
        return (lambda rows: policy.model.norm(features[rows])), None, None
    cfg = policy.config
    h, nk = cfg.hidden_size, len(layers)
    pfc = torch.cat([torch.zeros(h, (nk - 1) * h), torch.eye(h)], 1) + 0.2 * torch.randn(h, nk * h, generator=g)
    pfc_p = torch.nn.Parameter(pfc.clone())
    norms = [policy.model.norm if l == cfg.num_hidden_layers - 1 else policy.model.layers[l + 1].input_layernorm
             for l in layers]

    def feature(rows):
        z = torch.cat([norms[i](features[rows, i]) for i in range(nk)], 1)
        return z @ pfc_p.T

    return feature, pfc, pfc_p


def add_projection(out: dict, layers, pfc, pfc_p) -> None:
    """A several-layer golden's P, its gradient and the layers."""
    if layers is not None:
        out["feature_fc"] = pfc
        out["grad.draft.feature_fc.weight"] = pfc_p.grad
        out["feature_layers"] = torch.tensor(layers, dtype=torch.int32)


def make(name: str, out_dir: Path, layers: list[int] | None = None) -> Path:
    policy, g, ids, features, plogits, weight, vocab, fc = draw_inputs(
        name, SEED if layers is None else SEED + 1, layers)
    feature, pfc, pfc_p = feature_projection(policy, g, features, layers)

    dcfg, draft, embed, escale = draft_model(policy, vocab)
    fc_p = torch.nn.Parameter(fc.clone())

    captured = []
    hook = draft.model.layers[0].register_forward_hook(
        lambda m, i, o: captured.append(o[0] if isinstance(o, tuple) else o))
    loss = torch.zeros(())
    sums = torch.zeros(4, dtype=torch.float64)
    last_logits, last_hidden = [], []
    used = 0.0
    start = 0
    for n in LENS:
        rows = torch.arange(start, start + n - 1)
        used += float(weight[rows + 1].sum())
        start += n
    scale = 1.0 / used
    start = 0
    for n in LENS:
        rows = torch.arange(start, start + n - 1)
        x = torch.cat([embed[ids[rows + 1]] * escale, feature(rows)], 1)
        u = x @ fc_p.T
        captured.clear()
        logits = draft(inputs_embeds=u[None]).logits[0]
        last_logits.append(logits[-1].detach())
        last_hidden.append(captured[-1][0, -1].detach() if captured[-1].dim() == 3 else captured[-1][-1].detach())
        tgt = plogits[rows + 1]
        q = torch.softmax(tgt[:, vocab], -1)
        ce = -(q * torch.log_softmax(logits, -1)).sum(-1)
        w = weight[rows + 1]
        loss = loss + scale * (w * ce).sum()
        sums += row_sums(w, logits, tgt, vocab)
        start += n
    hook.remove()
    loss.backward()

    out = {
        "ids": ids.to(torch.int32), "lens": torch.tensor(LENS, dtype=torch.int32),
        "vocab": vocab.to(torch.int32), "features": features, "policy_logits": plogits, "weight": weight,
        "scale": torch.tensor([scale], dtype=torch.float32), "fc": fc, "loss": loss.detach().reshape(1),
        "sums": sums.float(), "last_logits": torch.stack(last_logits), "last_hidden": torch.stack(last_hidden),
        "grad.draft.fc.weight": fc_p.grad,
    }
    add_projection(out, layers, pfc, pfc_p)
    for k, p in draft.named_parameters():
        if k.startswith("model.layers.0."):
            out["grad.draft.layers.0." + k[len("model.layers.0."):]] = p.grad
    out = {k: v.detach().contiguous().numpy() for k, v in sorted(out.items())}
    meta = {"generator": "scripts/make_draft_goldens.py", "policy": f"tests/data/models/{name}",
            "torch": torch.__version__, "transformers": transformers.__version__, "seed": str(SEED)}
    dst = out_dir / (f"{name}.safetensors" if layers is None else
                     f"{name}.layers{'-'.join(map(str, layers))}.safetensors")
    mg.write_safetensors(dst, out, meta)
    return dst


def make_ttt(name: str, out_dir: Path, layers: list[int] | None = None, passes: int = TTT_PASSES) -> Path:
    """The training-time test (DraftHead::accumulate_grad with passes > 1), file <name>[.layers<a-b>].ttt<passes>
    .safetensors.

    Seed 33 (several layers: 34); inputs as in make(). Pass 1 is make()'s forward, which also returns its layer's
    keys/values (a transformers cache) and outputs g. Pass p >= 2 of a sequence, rows j = 0..n-2 at positions j:
        u_j = fc @ cat(embed[x_{j+1}] * embed_scale, norm(g^{p-1}_{j-1}))     (row 0: norm(0) = 0)
    through the same one-layer CausalLM, given the earlier passes' keys/values as a cache and a custom 4D mask: row j
    sees pass 1's keys 0..j-p+1, pass q's key j-p+q (1 < q < p) and its own. Nothing is detached: as in EAGLE-3's
    training, a pass's loss back-propagates into the earlier passes through the g it reads and the keys and values it
    attends. Each pass's loss is make()'s with the weights of its first p-1 rows set to 0, the same scale; the passes
    add. The file holds make()'s tensors (loss: the total) and sums [passes, 4].
    """
    policy, g, ids, features, plogits, weight, vocab, fc = draw_inputs(
        name, SEED + 2 if layers is None else SEED + 3, layers)
    feature, pfc, pfc_p = feature_projection(policy, g, features, layers)
    h = policy.config.hidden_size

    dcfg, draft, embed, escale = draft_model(policy, vocab)
    fc_p = torch.nn.Parameter(fc.clone())

    captured = []
    hook = draft.model.layers[0].register_forward_hook(
        lambda m, i, o: captured.append(o[0] if isinstance(o, tuple) else o))
    used = 0.0
    start = 0
    for n in LENS:
        used += float(weight[start + 1:start + n].sum())
        start += n
    scale = 1.0 / used
    loss = torch.zeros(())
    sums = torch.zeros(passes, 4, dtype=torch.float64)
    neg = torch.finfo(torch.float32).min
    start = 0
    for n in LENS:
        rows = torch.arange(start, start + n - 1)
        m = n - 1
        tgt = plogits[rows + 1]
        q = torch.softmax(tgt[:, vocab], -1)
        keys, values = [], []  # each pass's layer-0 keys / values [1, kv heads, m, head dim]
        prev = None
        for p in range(1, passes + 1):
            if p == 1:
                feat = feature(rows)
            else:
                shifted = torch.cat([torch.zeros(1, h), prev[:-1]], 0)
                feat = policy.model.norm(shifted)
            u = torch.cat([embed[ids[rows + 1]] * escale, feat], 1) @ fc_p.T
            cache = transformers.DynamicCache(config=dcfg)
            mask = None
            if p > 1:
                cache.update(torch.cat(keys, 2), torch.cat(values, 2), 0)
                allowed = torch.zeros(m, p * m, dtype=torch.bool)
                for j in range(m):
                    allowed[j, :max(0, j - p + 2)] = True
                    for qq in range(2, p):
                        r = j - p + qq
                        if r >= 0:
                            allowed[j, (qq - 1) * m + r] = True
                    allowed[j, (p - 1) * m + j] = True
                mask = torch.where(allowed, 0.0, neg)[None, None]
            captured.clear()
            logits = draft(inputs_embeds=u[None], attention_mask=mask, position_ids=torch.arange(m)[None],
                           cache=cache, use_cache=True).logits[0]
            layer = cache.layers[0]
            keys.append(layer.keys[:, :, -m:])
            values.append(layer.values[:, :, -m:])
            out = captured[-1]
            prev = out[0] if out.dim() == 3 else out
            w = weight[rows + 1].clone()
            w[:p - 1] = 0
            ce = -(q * torch.log_softmax(logits, -1)).sum(-1)
            loss = loss + scale * (w * ce).sum()
            sums[p - 1] += row_sums(w, logits, tgt, vocab)
        start += n
    hook.remove()
    loss.backward()

    out = {
        "ids": ids.to(torch.int32), "lens": torch.tensor(LENS, dtype=torch.int32),
        "vocab": vocab.to(torch.int32), "features": features, "policy_logits": plogits, "weight": weight,
        "scale": torch.tensor([scale], dtype=torch.float32), "fc": fc, "loss": loss.detach().reshape(1),
        "sums": sums.float(), "passes": torch.tensor([passes], dtype=torch.int32),
        "grad.draft.fc.weight": fc_p.grad,
    }
    add_projection(out, layers, pfc, pfc_p)
    for k, p in draft.named_parameters():
        if k.startswith("model.layers.0."):
            out["grad.draft.layers.0." + k[len("model.layers.0."):]] = p.grad
    out = {k: v.detach().contiguous().numpy() for k, v in sorted(out.items())}
    meta = {"generator": "scripts/make_draft_goldens.py", "policy": f"tests/data/models/{name}",
            "torch": torch.__version__, "transformers": transformers.__version__,
            "seed": str(SEED + 2 if layers is None else SEED + 3)}
    tag = "" if layers is None else f".layers{'-'.join(map(str, layers))}"
    dst = out_dir / f"{name}{tag}.ttt{passes}.safetensors"
    mg.write_safetensors(dst, out, meta)
    return dst


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DATA, help="folder to write draft_goldens/ into")
    args = parser.parse_args()
    out_dir = args.out / "draft_goldens"
    out_dir.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    transformers.logging.set_verbosity_error()
    for name in POLICIES:
        for layers in (None, [0, 1]):
            p = make(name, out_dir, layers)
            print(f"{p.name}: {p.stat().st_size} bytes")
        p = make_ttt(name, out_dir)
        print(f"{p.name}: {p.stat().st_size} bytes")
    p = make_ttt("qwen3", out_dir, [0, 1])  # P's gradient from every pass
    print(f"{p.name}: {p.stat().st_size} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())

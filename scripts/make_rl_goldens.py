#!/usr/bin/env python3
"""Goldens for the RL loss math (tests/rl_loss_test.cc): an independent torch reference.

The reference follows the published formulas as slime / verl write them in torch (group reward
normalisation with torch.std, masked whitening with Bessel's correction, compute_policy_loss with
clip-higher and dual clip, GSPO's sequence-level ratio through expand, compute_approx_kl k1/k2/k3,
truncated / masked importance sampling), reduced with masked sums, and differentiated by autograd:
d loss / d logp and d loss / d entropy come from loss.backward(), not from hand-written derivatives.
Inputs are float32 (stored as such); the reference computes in float64 from them.

Run: /root/.venvs/miles-ref/bin/python scripts/make_rl_goldens.py   (writes tests/data/rl/goldens.json)
"""

import json
import os

import numpy as np
import torch

torch.set_default_dtype(torch.float64)
OUT = os.path.join(os.path.dirname(__file__), "..", "tests", "data", "rl", "goldens.json")


# ---- inputs -----------------------------------------------------------------------------------------
def make_inputs(seed=1234):
    rng = np.random.default_rng(seed)
    n_groups, n_per = 3, 4
    num = n_groups * n_per
    # Groups in a shuffled order with arbitrary ids: the estimator must group by value, not position.
    group_ids = np.repeat(np.array([7, 3, 5]), n_per)
    group_ids = group_ids[rng.permutation(num)]
    rewards = np.zeros(num, dtype=np.float32)
    by_group = {g: np.where(group_ids == g)[0] for g in (7, 3, 5)}
    rewards[by_group[7]] = [1, 0, 0, 1]  # binary
    rewards[by_group[3]] = rng.normal(0.3, 0.5, n_per).astype(np.float32)  # continuous
    rewards[by_group[5]] = [1, 1, 1, 1]  # zero variance: advantage 0
    lengths = rng.integers(3, 10, num)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    T = int(offsets[-1])
    mask = np.ones(T, dtype=np.float32)
    drop = rng.random(T) < 0.15  # tool / environment tokens inside responses
    mask[drop] = 0
    mask[offsets[5]:offsets[6]] = 0  # one sample with no trained token (max(n_s, 1) paths)
    for s in range(num):  # every other sample keeps at least one trained token
        if s != 5 and mask[offsets[s]:offsets[s + 1]].sum() == 0:
            mask[offsets[s]] = 1
    old = -rng.uniform(0.05, 3.0, T)
    logp = old + rng.normal(0, 0.22, T)
    # A few large ratios (r > 3) so that the dual clip and the clip-higher bound both act.
    for t in rng.choice(T, 6, replace=False):
        logp[t] = old[t] + rng.choice([1.3, -1.0])
    ref = logp + rng.normal(0, 0.1, T)
    rollout = old + rng.normal(0, 0.3, T)
    entropy = rng.uniform(0.1, 2.0, T)
    f32 = lambda a: np.asarray(a, dtype=np.float32)
    return dict(group_index=group_ids.astype(np.int64), rewards=f32(rewards), offsets=offsets,
                loss_mask=mask, logp=f32(logp), old_logp=f32(old), ref_logp=f32(ref),
                rollout_logp=f32(rollout), entropy=f32(entropy))


def sample_of_token(offsets):
    return torch.repeat_interleave(torch.arange(len(offsets) - 1), torch.tensor(np.diff(offsets)))


# ---- advantages (slime's reward post-processing + distributed_masked_whiten, single rank) -------------
def group_norm(rewards, group_index, std_normalize, eps=1e-6):
    out = torch.empty_like(rewards)
    for g in np.unique(group_index):
        idx = torch.tensor(np.where(group_index == g)[0])
        r = rewards[idx]
        r = r - r.mean()
        if std_normalize:
            r = r / (r.std() + eps)  # torch.std: unbiased
        out[idx] = r
    return out


def masked_whiten(values, mask, eps=1e-8):
    n = mask.sum()
    mean = (values * mask).sum() / n
    var = (values ** 2 * mask).sum() / n - mean ** 2
    if n >= 2:
        var = var * n / (n - 1)
    return (values - mean) * torch.rsqrt(var + eps)


def advantages(inp, cfg):
    rewards = torch.tensor(inp["rewards"]).double()
    mask = torch.tensor(inp["loss_mask"]).double()
    sot = sample_of_token(inp["offsets"])
    est = cfg["estimator"]
    if est == "grpo":
        per = group_norm(rewards, inp["group_index"], cfg.get("std_normalize", True))
        return per[sot] * mask
    if est == "dr_grpo":
        return group_norm(rewards, inp["group_index"], False)[sot] * mask
    if est == "reinforce_pp":
        return masked_whiten(rewards[sot], mask) * mask
    if est == "reinforce_pp_baseline":
        return masked_whiten(group_norm(rewards, inp["group_index"], False)[sot], mask) * mask
    raise ValueError(est)


# ---- losses -------------------------------------------------------------------------------------------
def per_sample(x, offsets):
    return [x[offsets[s]:offsets[s + 1]] for s in range(len(offsets) - 1)]


def approx_kl(logp, ref, kind):
    log_ratio = logp - ref
    if kind == "k1":
        return log_ratio
    if kind == "k2":
        return log_ratio ** 2 / 2.0
    if kind == "k3":
        lr = -log_ratio
        return lr.exp() - 1 - lr
    raise ValueError(kind)


def reduce(x, mask, offsets, cfg):
    kind = cfg.get("reduction", "token_mean")
    if kind == "token_mean":
        denom = cfg.get("token_normaliser", 0) or mask.sum()
        return (x * mask).sum() / denom
    if kind == "sample_mean":
        S = cfg.get("sample_normaliser", 0) or (len(offsets) - 1)
        # slime's sum_of_sample_mean: per-sample masked mean (denominator clamped at 1), summed
        total = sum((xs * ms).sum() / torch.clamp_min(ms.sum(), 1)
                    for xs, ms in zip(per_sample(x, offsets), per_sample(mask, offsets)))
        return total / S
    if kind == "constant":
        return (x * mask).sum() / cfg["constant_normaliser"]
    raise ValueError(kind)


def policy_loss(inp, adv, cfg):
    offsets = inp["offsets"]
    mask = torch.tensor(inp["loss_mask"]).double()
    logp = torch.tensor(inp["logp"]).double().requires_grad_(True)
    entropy = torch.tensor(inp["entropy"]).double().requires_grad_(True)
    old = torch.tensor(inp["old_logp"]).double()
    ref = torch.tensor(inp["ref_logp"]).double()
    rollout = torch.tensor(inp["rollout_logp"]).double()
    A = adv

    if cfg.get("policy", "ppo") == "gspo":
        # compute_gspo_kl: the sequence's masked mean of old - logp, expanded to its tokens
        kls = [((o - l) * m).sum() / torch.clamp_min(m.sum(), 1)
               for l, o, m in zip(per_sample(logp, offsets), per_sample(old, offsets),
                                  per_sample(mask, offsets))]
        ppo_kl = torch.cat([k.expand_as(l) for k, l in zip(kls, per_sample(logp, offsets))])
    else:
        ppo_kl = old - logp
    el, eh, c = cfg.get("eps_low", 0.2), cfg.get("eps_high", 0.2), cfg.get("dual_clip_c", 0)
    ratio = (-ppo_kl).exp()
    pg1 = -ratio * A
    pg2 = -ratio.clamp(1 - el, 1 + eh) * A
    clip1 = torch.maximum(pg1, pg2)
    clipfrac = torch.gt(pg2, pg1).double()
    dual = torch.zeros_like(clipfrac)
    if c:
        pg3 = -c * A
        pg = torch.where(A < 0, torch.min(pg3, clip1), clip1)
        dual = ((A < 0) & (pg3 < clip1)).double()
    else:
        pg = clip1

    keep = torch.ones_like(mask)
    w = (old - rollout).exp()
    corr = cfg.get("correction", "none")
    corrected = torch.zeros_like(mask)
    if corr == "tis":
        pg = pg * w.clamp(max=cfg["tis_c"])
        corrected = (w > cfg["tis_c"]).double()
    elif corr == "mis_token":
        keep = ((w >= cfg["mis_low"]) & (w <= cfg["mis_high"])).double()
        corrected = 1 - keep
    elif corr == "mis_sequence":
        parts = []
        for d, m in zip(per_sample(old - rollout, offsets), per_sample(mask, offsets)):
            ws = ((d * m).sum() / torch.clamp_min(m.sum(), 1)).exp()
            parts.append(torch.full_like(d, float((ws >= cfg["mis_low"]) & (ws <= cfg["mis_high"]))))
        keep = torch.cat(parts)
        corrected = 1 - keep

    pg_loss = reduce(pg * keep, mask, offsets, cfg)
    kl_kind = cfg.get("kl", "none")
    kl_loss = reduce(approx_kl(logp, ref, kl_kind) * keep, mask, offsets, cfg) \
        if kl_kind != "none" else torch.zeros(())
    ent_loss = reduce(entropy * keep, mask, offsets, cfg)
    kc, ec = cfg.get("kl_coef", 0.0), cfg.get("entropy_coef", 0.0)
    loss = pg_loss + kc * kl_loss - ec * ent_loss
    loss.backward()

    n = mask.sum()
    d = (old - rollout)
    md = d[mask == 1]
    wm = md.exp()
    metrics = dict(
        ppo_kl=float(((old - logp.detach()) * mask).sum() / n),
        clipfrac=float((clipfrac * mask).sum() / n),
        dual_clipfrac=float((dual * mask).sum() / n),
        rollout_abs_diff_mean=float(md.abs().mean()),
        rollout_abs_diff_max=float(md.abs().max()),
        rollout_kl=float((wm - 1 - md).mean()),
        is_ess=float(wm.sum() ** 2 / (len(wm) * (wm ** 2).sum())),
        correction_frac=float((corrected * mask).sum() / n),
        num_tokens=int(n),
    )
    return dict(loss=loss.item(), pg_loss=pg_loss.item(), kl_loss=kl_loss.item(),
                entropy_loss=ent_loss.item(), dlogp=logp.grad.tolist(),
                dentropy=entropy.grad.tolist(), metrics=metrics)


def sft_loss(inp, cfg):
    mask = torch.tensor(inp["loss_mask"]).double()
    logp = torch.tensor(inp["logp"]).double().requires_grad_(True)
    loss = reduce(-logp, mask, inp["offsets"], cfg)
    loss.backward()
    return dict(loss=loss.item(), pg_loss=loss.item(), kl_loss=0.0, entropy_loss=0.0,
                dlogp=logp.grad.tolist(), dentropy=[0.0] * len(mask),
                metrics=dict(num_tokens=int(mask.sum())))


def cases(inp):
    num = len(inp["offsets"]) - 1
    max_len = int(np.diff(inp["offsets"]).max())
    masked = float(inp["loss_mask"].sum())
    return [
        ("grpo_ppo_token_k3", dict(estimator="grpo"),
         dict(kl="k3", kl_coef=0.05, entropy_coef=0.01)),
        ("grpo_nostd_cliphigher_dual_sample_k1_tis", dict(estimator="grpo", std_normalize=False),
         dict(eps_high=0.28, dual_clip_c=3.0, kl="k1", kl_coef=0.02, reduction="sample_mean",
              correction="tis", tis_c=1.5)),
        ("drgrpo_constant_k2_mis_token", dict(estimator="dr_grpo"),
         dict(eps_high=0.28, kl="k2", kl_coef=0.1, reduction="constant",
              constant_normaliser=float(max_len * num), correction="mis_token", mis_low=0.7,
              mis_high=1.4)),
        ("rpp_dual_global_tokens_mis_sequence", dict(estimator="reinforce_pp"),
         dict(dual_clip_c=2.0, entropy_coef=0.001, token_normaliser=2 * masked,
              correction="mis_sequence", mis_low=0.8, mis_high=1.25)),
        ("rppb_gspo_sample_sum_k3", dict(estimator="reinforce_pp_baseline"),
         dict(policy="gspo", eps_low=0.03, eps_high=0.04, kl="k3", kl_coef=0.01,
              reduction="sample_mean", sample_normaliser=1.0)),
        ("grpo_gspo_dual_tis", dict(estimator="grpo"),
         dict(policy="gspo", eps_low=0.03, eps_high=0.04, dual_clip_c=3.0, entropy_coef=0.005,
              correction="tis", tis_c=1.2)),
    ]


def main():
    inp = make_inputs()
    out_cases = []
    for name, acfg, lcfg in cases(inp):
        adv = advantages(inp, acfg)
        exp = policy_loss(inp, adv, lcfg)
        exp["advantages"] = adv.tolist()
        out_cases.append(dict(name=name, kind="policy", advantage=acfg, loss=lcfg, expected=exp))
        m = exp["metrics"]
        print(f"{name}: loss={exp['loss']:.6f} clipfrac={m['clipfrac']:.3f} "
              f"dual={m['dual_clipfrac']:.3f} corrected={m['correction_frac']:.3f}")
    num = len(inp["offsets"]) - 1
    for name, lcfg in [("sft_token_mean", dict(reduction="token_mean")),
                       ("sft_sample_mean", dict(reduction="sample_mean")),
                       ("sft_constant", dict(reduction="constant", constant_normaliser=9.0 * num))]:
        out_cases.append(dict(name=name, kind="sft", advantage={}, loss=lcfg,
                              expected=sft_loss(inp, lcfg)))
    inputs = {k: v.tolist() for k, v in inp.items()}
    os.makedirs(os.path.dirname(OUT), exist_ok=True)
    with open(OUT, "w") as f:
        json.dump(dict(generator="scripts/make_rl_goldens.py", torch=torch.__version__,
                       inputs=inputs, cases=out_cases), f)
    print(f"wrote {os.path.relpath(OUT)} ({os.path.getsize(OUT)} bytes), T={len(inp['logp'])}")


if __name__ == "__main__":
    main()

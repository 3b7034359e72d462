#!/usr/bin/env python3
"""miles' training step side by side with PyTorch eager: same model, same batch, same threads, float32.

Why: `miles bench train` reports tokens/s and MFU; this names the baseline (design principle 13). It
  1. takes an HF directory (SmolLM2) as is, or exports a llama2.c file (stories260K) to one with
     `miles bench train --export-hf DIR`, so that both sides train the very same weights,
  2. builds the batch of `miles bench train` with the same generator (splitmix64 seeded --seed, drawn
     sample by sample, position by position, id = next() mod vocab, position 0 = BOS) and checks it
     against the ids miles reports in --json,
  3. measures PyTorch: `AutoModelForCausalLM` (attn_implementation="eager", float32, train mode),
     input = the first T - 1 ids of each sample, loss = token-mean NLL of ids 1..T-1 over the whole
     step (cross entropy, reduction sum / step tokens, summed over micro-batches of
     --micro-batch-size samples, as miles' SFT objective), clip_grad_norm_(1.0), then
     torch.optim.AdamW(lr, betas=(0.9, 0.95), eps=1e-8, weight_decay=0) with --adamw single (the
     single-tensor for-loop, torch's default on CPU: foreach and fused are off for CPU tensors unless
     asked), foreach or fused; torch.set_num_threads(--threads), one inter-op thread,
  4. runs `miles bench train` with the same model, batch, micro-batch and threads,
  5. checks that both computed the same initial loss (|Δ| <= 1e-4) and prints miles / torch.
Before each measurement it waits until the CPUs are --min-idle idle (others compile on this machine)
and records that idle share and the cores each side actually got (CPU seconds / wall seconds).

The machine's speed drifts between modes over minutes, and both sides see it. --repeats N runs N
rounds (all torch steps, then all miles steps right after); --paired instead keeps both alive and
alternates their steps (torch, miles, then miles, torch, ...; miles waits on `--paced`), so each pair's
two steps are seconds apart: the median of the pairs' ratios is the figure least moved by the drift.

Run with the reference venv (build miles first):
    /root/.venvs/miles-ref/bin/python scripts/bench_train_torch.py --model models/smollm2-135m-instruct \
        --threads 1 --miles-bin build/bin/miles
    /root/.venvs/miles-ref/bin/python scripts/bench_train_torch.py \
        --model ../shared/models/stories260K/stories260K.bin --threads 2
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MASK64 = (1 << 64) - 1
# Both sides on the same instructions (--isa): torch's own kernels (ATen's dispatch), oneDNN's and MKL's.
TORCH_ISA_ENV = {
    "native": {},
    "avx2": {"MILES_ISA": "avx2", "ATEN_CPU_CAPABILITY": "avx2", "DNNL_MAX_CPU_ISA": "AVX2",
             "MKL_ENABLE_INSTRUCTIONS": "AVX2"},
    "avx512": {"MILES_ISA": "avx512", "ATEN_CPU_CAPABILITY": "avx512", "DNNL_MAX_CPU_ISA": "AVX512_CORE",
               "MKL_ENABLE_INSTRUCTIONS": "AVX512"},
}


def say(msg: str) -> None:
    print(f"bench_train_torch.py: {msg}", flush=True)


def die(msg: str) -> None:
    print(f"bench_train_torch.py: error: {msg}", file=sys.stderr)
    sys.exit(1)


# ---- the batch: the generator of `miles bench train` ---------------------------------------------------


def splitmix64(state: int) -> tuple[int, int]:
    state = (state + 0x9E3779B97F4A7C15) & MASK64
    z = state
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
    return state, z ^ (z >> 31)


def make_batch(batch: int, seq_len: int, vocab: int, bos: int | None, seed: int) -> list[list[int]]:
    state, out = seed & MASK64, []
    for _ in range(batch):
        ids = []
        for _ in range(seq_len):
            state, x = splitmix64(state)
            ids.append(x % vocab)
        if bos is not None and 0 <= bos < vocab:
            ids[0] = bos
        out.append(ids)
    return out


# ---- the machine (as scripts/bench_llamacpp.py) ----------------------------------------------------------


def cpu_idle_fraction(window_s: float) -> float:
    """Share of all CPUs' time that was idle over the next window_s seconds (/proc/stat)."""

    def sample():
        f = [int(x) for x in open("/proc/stat").readline().split()[1:]]
        return f[3] + f[4], sum(f)  # idle + iowait, total

    i0, t0 = sample()
    time.sleep(window_s)
    i1, t1 = sample()
    return (i1 - i0) / max(1, t1 - t0)


def wait_for_quiet(min_idle: float, timeout_s: float) -> float:
    """Waits until the CPUs are at least min_idle idle over 5 s; returns the idle share last seen,
    whether or not it got there within timeout_s."""
    deadline = time.time() + timeout_s
    idle = cpu_idle_fraction(5)
    while idle < min_idle and time.time() < deadline:
        say(f"  waiting for a quiet machine: CPUs {idle:.0%} idle over 5 s (want {min_idle:.0%})")
        time.sleep(20)
        idle = cpu_idle_fraction(5)
    return idle


# ---- PyTorch --------------------------------------------------------------------------------------------


def torch_setup(a, hf_dir: Path, ids: list[list[int]]):
    """The torch side: returns (step, params); step() runs one whole training step and returns
    (loss, {forward, backward, optimizer} seconds)."""
    import torch
    import torch.nn.functional as F
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()

    model = AutoModelForCausalLM.from_pretrained(str(hf_dir), dtype=torch.float32, attn_implementation="eager")
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    kw = {"single": {"foreach": False}, "foreach": {"foreach": True}, "fused": {"fused": True}}[a.adamw]
    opt = torch.optim.AdamW(params, lr=a.lr, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.0, **kw)
    x = torch.tensor(ids, dtype=torch.long)
    total = a.batch * (a.seq_len - 1)
    vocab = model.config.vocab_size

    def step():
        t = {"forward": 0.0, "backward": 0.0, "optimizer": 0.0}
        loss_sum = 0.0
        for first in range(0, a.batch, a.micro_batch_size):
            mb = x[first:first + a.micro_batch_size]
            t0 = time.perf_counter()
            logits = model(input_ids=mb[:, :-1], use_cache=False).logits
            loss = F.cross_entropy(logits.reshape(-1, vocab), mb[:, 1:].reshape(-1), reduction="sum") / total
            t1 = time.perf_counter()
            loss.backward()
            t2 = time.perf_counter()
            t["forward"] += t1 - t0
            t["backward"] += t2 - t1
            loss_sum += float(loss.detach())
        t0 = time.perf_counter()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        t["optimizer"] = time.perf_counter() - t0
        return loss_sum, t

    return step, sum(p.numel() for p in params)


def timed_torch_step(step, k: int, a) -> tuple[float, float, float, dict]:
    """One torch step: (wall s, cores, loss, breakdown); prints it as `torch step ...`."""
    total = a.batch * (a.seq_len - 1)
    c0, w0 = time.process_time(), time.perf_counter()
    loss, t = step()
    wall, cpu = time.perf_counter() - w0, time.process_time() - c0
    say(f"  torch step {'warm' if k < a.warmup else k - a.warmup + 1}: {wall:.3f} s, "
        f"{total / wall:.1f} tokens/s, loss {loss:.6f}, cores {cpu / wall:.2f}")
    return wall, cpu / wall, loss, t


def torch_bench(a, hf_dir: Path, ids: list[list[int]]) -> dict:
    step, n_params = torch_setup(a, hf_dir, ids)
    total = a.batch * (a.seq_len - 1)
    initial_loss, times, cores, parts = None, [], [], []
    for k in range(a.warmup + a.steps):
        wall, c, loss, t = timed_torch_step(step, k, a)
        if k == 0:
            initial_loss = loss
        if k >= a.warmup:
            times.append(wall), cores.append(c), parts.append(t)
    return torch_result(total, times, cores, parts, initial_loss, n_params)


def torch_result(total, times, cores, parts, initial_loss, n_params) -> dict:
    med = statistics.median(times)
    return {"tokens_per_s": total / med, "tokens_per_s_best": total / min(times), "step_times_s": times,
            "cores": statistics.median(cores), "initial_loss": initial_loss,
            "breakdown_s": {k: statistics.median(p[k] for p in parts) for k in parts[0]},
            "params": n_params}


# ---- miles ----------------------------------------------------------------------------------------------


def miles_bench(a) -> dict:
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        cmd = miles_cmd(a, f.name)
        say("running " + " ".join(cmd))
        if subprocess.call(cmd) != 0:
            die("miles bench train failed")
        return json.load(open(f.name))


def miles_cmd(a, json_path: str) -> list[str]:
    return [str(a.miles_bin), "bench", "train", "--model", str(a.model), "--batch", str(a.batch),
            "--seq-len", str(a.seq_len), "--threads", str(a.threads), "--steps", str(a.steps),
            "--warmup", str(a.warmup), "--micro-batch-size", str(a.micro_batch_size),
            "--seed", str(a.seed), "--lr", str(a.lr), "--json", json_path]


class PacedMiles:
    """`miles bench train --paced` as a child that takes a step when told (its stdout echoed)."""

    def __init__(self, a, json_path: str):
        cmd = miles_cmd(a, json_path) + ["--paced"]
        say("running " + " ".join(cmd))
        self.p = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1)
        self.until_waiting()

    def until_waiting(self) -> list[str]:
        """Echoes miles' lines until it waits for the driver; returns its `paced: step` lines."""
        steps = []
        for line in self.p.stdout:
            print(line, end="", flush=True)
            if line.startswith("paced: step "):
                steps.append(line)
            if line.startswith("paced: waiting"):
                return steps
        die("miles bench train --paced exited early")

    def go(self) -> list[str]:
        self.p.stdin.write("go\n")
        self.p.stdin.flush()
        return self.until_waiting()

    def finish(self) -> None:
        self.p.stdin.write("go\n")  # the breakdown step
        self.p.stdin.close()
        for line in self.p.stdout:
            print(line, end="", flush=True)
        if self.p.wait() != 0:
            die("miles bench train --paced failed")


def paired_bench(a, hf_dir: Path, ids: list[list[int]], idle: list[float]) -> tuple[dict, dict, list[float]]:
    """Both sides alive at once, their steps alternating (torch first in even pairs, miles first in
    odd ones), a --pause of idle between any two steps: each pair's two steps see the same machine.
    Returns (miles' JSON, torch's results, each measured pair's miles / torch ratio)."""
    total = a.batch * (a.seq_len - 1)
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        miles = PacedMiles(a, f.name)  # loaded, waiting before its FMA peak
        step, n_params = torch_setup(a, hf_dir, ids)
        idle.append(wait_for_quiet(a.min_idle, a.quiet_timeout))
        miles.go()  # the FMA peak, alone on the machine
        time.sleep(a.pause)
        initial_loss, times, cores, parts, ratios = None, [], [], [], []
        for k in range(a.warmup + a.steps):
            order = ("torch", "miles") if k % 2 == 0 else ("miles", "torch")
            for side in order:
                if side == "torch":
                    wall, c, loss, t = timed_torch_step(step, k, a)
                    if k == 0:
                        initial_loss = loss
                else:
                    done = miles.go()
                    if len(done) != 1:
                        die(f"expected one `paced: step` line, got {len(done)}")
                    miles_wall = float(done[0].split()[3])
                time.sleep(a.pause)
            if k >= a.warmup:
                times.append(wall), cores.append(c), parts.append(t)
                ratios.append(wall / miles_wall)
                say(f"  pair {k - a.warmup + 1}: torch {wall:.3f} s, miles {miles_wall:.3f} s, "
                    f"miles / torch {wall / miles_wall:.3f}")
        miles.finish()
        ours = json.load(open(f.name))
    return ours, torch_result(total, times, cores, parts, initial_loss, n_params), ratios


def hf_dir_for(a) -> Path:
    if a.model.is_dir():
        return a.model
    out = Path(tempfile.gettempdir()) / "miles-bench-train" / a.model.stem
    cmd = [str(a.miles_bin), "bench", "train", "--model", str(a.model), "--export-hf", str(out)]
    if subprocess.call(cmd, stdout=subprocess.DEVNULL) != 0:
        die("miles bench train --export-hf failed")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", type=Path, required=True, help="HF directory or llama2.c file")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--micro-batch-size", type=int, default=1)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--lr", type=float, default=1e-5)
    ap.add_argument("--adamw", choices=["single", "foreach", "fused"], default="single",
                    help="torch.optim.AdamW implementation (single: foreach=False, torch's CPU default)")
    ap.add_argument("--repeats", type=int, default=1, help="alternating torch / miles rounds (medians)")
    ap.add_argument("--paired", action="store_true",
                    help="one round with both sides alive, their steps alternating (miles --paced): "
                         "prints each pair's ratio and their median")
    ap.add_argument("--pause", type=float, default=0.5,
                    help="--paired: idle seconds between any two steps (threads spinning down)")
    ap.add_argument("--min-idle", type=float, default=0.9,
                    help="before each measurement, wait until the CPUs are this idle over 5 s")
    ap.add_argument("--quiet-timeout", type=float, default=600, help="longest wait for that, seconds")
    ap.add_argument("--miles-bin", type=Path, default=ROOT / "build/bin/miles")
    ap.add_argument("--isa", choices=sorted(TORCH_ISA_ENV), default="native",
                    help="the instruction set both sides run with: miles through MILES_ISA, torch through "
                         "ATEN_CPU_CAPABILITY, DNNL_MAX_CPU_ISA and MKL_ENABLE_INSTRUCTIONS; native = each "
                         "side's best for this CPU")
    a = ap.parse_args()
    if not a.miles_bin.exists():
        die(f"{a.miles_bin} not found: build miles first (or pass --miles-bin)")
    os.environ.update(TORCH_ISA_ENV[a.isa])  # before torch is imported; miles inherits MILES_ISA

    try:
        import torch
    except ImportError as e:
        die(f"{sys.executable} cannot import torch ({e}): scripts/setup.sh --reference installs it into "
            f"the reference venv (MILES_VENV, default /root/.venvs/miles-ref); run this script with that "
            f"venv's python")

    say(f"--isa {a.isa}: torch {torch.__version__} dispatches to {torch.backends.cpu.get_cpu_capability()}, "
        f"miles to {os.environ.get('MILES_ISA', 'its best')}")

    torch.set_num_threads(a.threads)
    torch.set_num_interop_threads(1)
    hf_dir = hf_dir_for(a)
    cfg = json.load(open(hf_dir / "config.json"))
    bos = cfg.get("bos_token_id")
    ids = make_batch(a.batch, a.seq_len, cfg["vocab_size"], bos if isinstance(bos, int) else None, a.seed)
    say(f"{a.model.name}: batch {a.batch} x seq-len {a.seq_len}, micro-batch {a.micro_batch_size}, "
        f"{a.threads} threads, torch {torch.__version__} (AdamW {a.adamw}), {a.repeats} round(s)")

    ours, theirs, idle, pair_ratios = [], [], [], []
    if a.paired:
        o, t_res, pair_ratios = paired_bench(a, hf_dir, ids, idle)
        ours.append(o), theirs.append(t_res)
        if o["tokens"] != ids:
            die("miles bench train used other token ids than this script's generator")
    for r in range(0 if a.paired else a.repeats):
        idle.append(wait_for_quiet(a.min_idle, a.quiet_timeout))
        theirs.append(torch_bench(a, hf_dir, ids))
        idle.append(wait_for_quiet(a.min_idle, a.quiet_timeout))
        ours.append(miles_bench(a))
        if ours[-1]["tokens"] != ids:
            die("miles bench train used other token ids than this script's generator")

    m = statistics.median(x["tokens_per_s"] for x in ours)
    t = statistics.median(x["tokens_per_s"] for x in theirs)
    dl = max(abs(x["initial_loss"] - y["initial_loss"]) for x, y in zip(ours, theirs))
    o0, t0 = ours[0], theirs[0]
    ok = dl <= 1e-4
    print()
    cpu = next((ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                if ln.startswith("model name")), "unknown CPU")
    import torch
    print(f"## {a.model.name} on {cpu}, --isa {a.isa} (torch {torch.__version__}: "
          f"{torch.backends.cpu.get_cpu_capability()}): batch {a.batch} x seq-len {a.seq_len}, micro-batch "
          f"{a.micro_batch_size}, {a.threads} thread(s), float32")
    print()
    print(f"- same batch: token ids checked equal; initial loss miles {o0['initial_loss']:.6f}, torch "
          f"{t0['initial_loss']:.6f}, |Δ| {dl:.2e} ({'OK' if ok else 'MISMATCH'}, limit 1e-4)")
    miles_cores = ", ".join(f"{statistics.median(x['cores']):.2f}" for x in ours)
    torch_cores = ", ".join(f"{x['cores']:.2f}" for x in theirs)
    print(f"- CPUs idle over the 5 s before each measurement (torch, miles, ...): "
          f"{', '.join(f'{x:.0%}' for x in idle)}; cores obtained (CPU s / wall s, median step): "
          f"miles {miles_cores}, torch {torch_cores}")
    print(f"- FMA peak measured by miles in the same run: {o0['peak_gflops']:.1f} GFLOP/s; FLOPs/token "
          f"{o0['flops_per_token']:.4g} (6 x {o0['params_matmul']} GEMM params + causal attention)")
    print()
    print("| | tokens/s (median step) | best step | step s | GFLOP/s | MFU | fwd s | bwd s | opt s |")
    print("|---|---|---|---|---|---|---|---|---|")
    fpt, peak = o0["flops_per_token"], o0["peak_gflops"]
    for name, runs in (("miles", ours), ("torch", theirs)):
        tps = statistics.median(x["tokens_per_s"] for x in runs)
        best = max(x["tokens_per_s_best"] for x in runs)
        g = fpt * tps / 1e9
        b = runs[0]["breakdown_s"]
        if name == "miles":
            fwd, bwd = b["forward"] + b["loss_head"], b["backward"]
            opt = b["optimizer"] + b["rebuild"] + b.get("grad_sum", 0.0)  # older builds: a separate pass
        else:
            fwd, bwd, opt = b["forward"], b["backward"], b["optimizer"]
        print(f"| {name} | {tps:.1f} | {best:.1f} | {a.batch * (a.seq_len - 1) / tps:.3f} | {g:.2f} | "
              f"{100 * g / peak:.1f} % | {fwd:.4g} | {bwd:.4g} | {opt:.4g} |")
    print()
    print(f"**miles / torch = {m / t:.2f}** (tokens/s, medians; aim >= 1.5)")
    # The machine's speed drifts between modes that both sides see; a mode change inside the run
    # moves the ratio of medians. Two checks against that: each round's ratio (torch, then miles
    # right after it) and the ratio of the best steps (each side at its fastest).
    per_round = [o["tokens_per_s"] / h["tokens_per_s"] for o, h in zip(ours, theirs)]
    best_o = max(x["tokens_per_s_best"] for x in ours)
    best_t = max(x["tokens_per_s_best"] for x in theirs)
    print(f"per round: {', '.join(f'{r:.2f}' for r in per_round)} (median "
          f"{statistics.median(per_round):.2f}); best steps: {best_o:.1f} / {best_t:.1f} = "
          f"{best_o / best_t:.2f}")
    if pair_ratios:
        print(f"**paired steps (alternating, {a.pause:g} s apart): miles / torch = "
              f"{statistics.median(pair_ratios):.2f}** (median of {len(pair_ratios)} pairs: "
              f"{', '.join(f'{r:.2f}' for r in pair_ratios)})")
    if "breakdown_s" in o0:
        b = o0["breakdown_s"]
        print(f"miles breakdown (one extra step): forward {b['forward']:.3f} s, loss head {b['loss_head']:.3f} s, "
              f"backward {b['backward']:.3f} s (the micro-batch sum folded in), clip + AdamW "
              f"{b['optimizer']:.3f} s, model rebuild (both weight packs) {b['rebuild']:.3f} s; "
              f"torch opt = clip + AdamW + zero_grad")
    if not ok:
        die("initial losses differ by more than 1e-4: not the same model or batch")


if __name__ == "__main__":
    main()

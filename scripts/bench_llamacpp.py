#!/usr/bin/env python3
"""miles' rollout engine side by side with llama.cpp: same model, same precision, same workload, same threads.

Why: `miles bench rollout` reports tokens/s; this names the baseline (design principle 13). It
  1. installs llama-cpp-python for the --isa asked (default native) if that build is missing: PyPI builds
     llama.cpp from source, here with the ISA's GGML_* options (ISA_CMAKE), into a folder of its own per
     ISA under MILES_LLAMACPP_DIR; that takes a long time on a few cores; log in /tmp. miles runs with
     MILES_ISA set to the same ISA, so both sides use the same instructions,
  2. exports the model miles runs to a float32 GGUF (scripts/export_gguf_f32.py) and checks that the two
     agree: miles' teacher-forced logprobs (`miles score`) against llama.cpp's log-softmax at the same
     tokens, and for SmolLM2 llama.cpp's logits against transformers' goldens (tests/data/smollm2),
     which tests/smollm2_test.cc holds miles to,
  3. measures llama.cpp on the closed-loop workload of `miles bench rollout` (P random prompt ids, O new
     tokens, EOS never consulted): c = 1 through the high-level API (`Llama.generate`, one sequence —
     all llama-cpp-python's high-level API and server can do), and c = 1 and c = 32 through the low-level
     API with one llama_decode per step over all live sequences (the continuous batching llama-server
     does with -np 32). llama.cpp samples greedily (cheaper than miles' temperature-1 sampling with
     exact logprobs, so the comparison leans toward llama.cpp). KV cache float32 unless --kv-type f16,
     one unified KV buffer for all sequences (kv_unified; llama_context's default of one buffer per
     sequence was 2.5x slower at c = 32 for SmolLM2 here: the baseline gets llama.cpp's better setting).
  4. runs `miles bench rollout` on the same model, P, O and threads, and prints miles / llama.cpp.
Steps 3 and 4 alternate for --repeats rounds (medians reported); each round waits until the CPUs are
--min-idle idle, since other jobs share the machine and llama.cpp's OpenMP threads collapse under
contention.

Run with the reference venv:
    /root/.venvs/miles-ref/bin/python scripts/bench_llamacpp.py --preset smollm2
    /root/.venvs/miles-ref/bin/python scripts/bench_llamacpp.py --preset stories260K
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
SHARED = Path(os.environ.get("MILES_SHARED_DIR", ROOT.parent / "shared"))
VENV_PY = Path(os.environ.get("MILES_VENV", "/root/.venvs/miles-ref")) / "bin" / "python"
INSTALL_LOG = Path("/tmp/bench_llamacpp_pip.log")
LLAMA_DIR = Path(os.environ.get("MILES_LLAMACPP_DIR", "/root/.venvs/llamacpp"))  # one build per --isa
_QUIET = None  # llama.cpp's log callback (silent), kept alive while llama.cpp may call it

PRESETS = {
    "stories260K": {
        "miles_model": SHARED / "models/stories260K/stories260K.bin",
        "export": ["--llama2c", str(SHARED / "models/stories260K/stories260K.bin"),
                   "--llama2c-tokenizer", str(SHARED / "models/stories260K/tok512.bin")],
        "gguf": Path("/tmp/miles-bench/stories260K-f32.gguf"),
        "prompt": 64, "output": 64,
        "requests": {1: 32, 32: 256},  # a tiny model: enough requests for runs of a few tenths of a second
    },
    "smollm2": {
        "miles_model": ROOT / "models/smollm2-135m-instruct",
        "export": ["--hf-dir", str(ROOT / "models/smollm2-135m-instruct"),
                   "--tokenizer-gguf", str(ROOT / "models/.cache/SmolLM2-135M-Instruct.Q4_1.gguf")],
        "gguf": Path("/tmp/miles-bench/smollm2-135m-f32.gguf"),
        "prompt": 64, "output": 32,
        "requests": {1: 8, 32: 64},  # miles bench rollout's defaults
        "goldens": ROOT / "tests/data/smollm2/goldens.safetensors",
    },
}


def say(msg: str) -> None:
    print(f"bench_llamacpp.py: {msg}", flush=True)


def die(msg: str) -> None:
    print(f"bench_llamacpp.py: error: {msg}", file=sys.stderr)
    sys.exit(1)


# ---- 1. llama-cpp-python ------------------------------------------------------------------------------


# llama.cpp's ISA is fixed when it is compiled, miles' at run time (MILES_ISA): for --isa X, llama.cpp
# is built for exactly X (GGML_NATIVE off) into a folder of its own, and miles runs with MILES_ISA=X.
ISA_CMAKE = {
    "native": "-DGGML_NATIVE=ON",
    "avx2": "-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON "
            "-DGGML_AVX512=OFF",
    "avx512": "-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON "
              "-DGGML_AVX512=ON",
}
ISA_CPU_FLAGS = {"native": [], "avx2": ["avx2", "fma"], "avx512": ["avx512f", "avx512bw", "avx512vl"]}


def check_cpu_has(isa: str) -> None:
    flags = set()
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("flags"):
            flags = set(line.split(":", 1)[1].split())
            break
    missing = [f for f in ISA_CPU_FLAGS[isa] if f not in flags]
    if missing:
        die(f"--isa {isa}: this CPU lacks {', '.join(missing)}")


def ensure_llama_cpp(isa: str):
    target = LLAMA_DIR / isa
    if (target / "llama_cpp").is_dir():
        sys.path.insert(0, str(target))
    else:
        say(f"installing llama-cpp-python for --isa {isa} into {target} (builds llama.cpp from source; "
            f"log: {INSTALL_LOG})")
        env = dict(os.environ, CMAKE_ARGS=ISA_CMAKE[isa])
        tmp = target.with_name(target.name + ".partial")
        shutil.rmtree(tmp, ignore_errors=True)  # what an interrupted install left
        with open(INSTALL_LOG, "w") as log:
            subprocess.call([sys.executable, "-m", "pip", "install", "numpy", "diskcache", "jinja2",
                             "typing-extensions"], stdout=log, stderr=subprocess.STDOUT)
            rc = subprocess.call([sys.executable, "-m", "pip", "install", "-v", "--no-deps", "--target", str(tmp),
                                  "llama-cpp-python==0.3.36"], stdout=log, stderr=subprocess.STDOUT, env=env)
        if rc != 0:
            die(f"pip install llama-cpp-python failed (exit {rc}); see {INSTALL_LOG}")
        tmp.rename(target)
        sys.path.insert(0, str(target))
    try:
        import llama_cpp
    except ImportError as e:  # its own dependencies (numpy, diskcache, jinja2, typing-extensions)
        die(f"import llama_cpp from {target} failed: {e}; pip install numpy diskcache jinja2 typing-extensions")
    return llama_cpp


# ---- 2. the model, and its logits in both -------------------------------------------------------------


def export_gguf(preset: dict) -> Path:
    out = preset["gguf"]
    if out.exists():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, str(ROOT / "scripts/export_gguf_f32.py"), *preset["export"], "--out", str(out)]
    if subprocess.call(cmd) != 0:
        die("export_gguf_f32.py failed")
    return out


def log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    m = x.max(axis=-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=-1, keepdims=True))


def llama_logits(llama_cpp, gguf: Path, ids: list[int], kv_type: int) -> np.ndarray:
    llm = llama_cpp.Llama(str(gguf), n_ctx=max(64, len(ids) + 8), n_threads=1, logits_all=True,
                          type_k=kv_type, type_v=kv_type, verbose=False)
    llm.eval(ids)
    out = np.array(llm.scores[: len(ids)], dtype=np.float32)
    llm.close()
    return out


def check_logits(llama_cpp, args, preset: dict, gguf: Path, kv_type: int) -> list[str]:
    lines = []
    prompts = []
    goldens = None
    if "goldens" in preset and preset["goldens"].exists():
        from safetensors.numpy import load_file

        goldens = load_file(preset["goldens"])
        prompts = [goldens[f"prompt{p}.ids"].tolist() for p in range(3) if f"prompt{p}.ids" in goldens]
    if not prompts:
        rng = np.random.default_rng(7)
        prompts = [[1] + rng.integers(3, 512, size=31).tolist()]
    worst_lp = 0.0
    worst_hf = 0.0
    for p, ids in enumerate(prompts):
        logits = llama_logits(llama_cpp, gguf, ids, kv_type)
        score = subprocess.run([str(args.miles_bin), "score", "--model", str(preset["miles_model"]),
                                "--input-ids", " ".join(map(str, ids)), "--threads", "1"],
                               capture_output=True, text=True)
        if score.returncode != 0:
            die(f"miles score failed: {score.stderr.strip()}")
        ours = np.array(json.loads(score.stdout)["logprobs"])
        theirs = log_softmax(logits[:-1])[np.arange(len(ids) - 1), ids[1:]]
        worst_lp = max(worst_lp, float(np.abs(ours - theirs).max()))
        if goldens is not None:
            last = goldens[f"prompt{p}.logits_last"]
            probe = goldens["probe_ids"]
            worst_hf = max(worst_hf, float(np.abs(logits[-2:] - last).max()),
                           float(np.abs(logits[:, probe] - goldens[f"prompt{p}.probe_logits"]).max()))
    lines.append(f"max |Δ logprob| miles score vs llama.cpp, {len(prompts)} prompt(s), every position: "
                 f"{worst_lp:.2e}")
    if goldens is not None:
        lines.append(f"max |Δ logit| llama.cpp vs transformers goldens (tests/data/smollm2; miles is held "
                     f"to 1e-3 there): {worst_hf:.2e}")
    return lines


# ---- 3. llama.cpp under the same workload ------------------------------------------------------------


def prompts_for(n: int, p: int, vocab: int, seed: int) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, vocab, size=p).tolist() for _ in range(n)]


def pct(xs: list[float], q: float) -> float:
    """Nearest rank, as miles bench rollout."""
    s = sorted(xs)
    return s[max(1, int(np.ceil(q * len(s)))) - 1] if s else 0.0


def llama_highlevel_c1(llama_cpp, gguf: Path, a, kv_type: int) -> dict:
    """c = 1 through Llama.generate: greedy, EOS never checked (we stop after O tokens)."""
    llm = llama_cpp.Llama(str(gguf), n_ctx=a.prompt_tokens + a.output_tokens + 8, n_threads=a.threads,
                          n_threads_batch=a.threads, n_batch=max(512, a.prompt_tokens),
                          type_k=kv_type, type_v=kv_type, verbose=False)
    vocab = llm.n_vocab()
    prompts = prompts_for(a.hl_requests + 1, a.prompt_tokens, vocab, 99)
    lat, ttft, total = [], [], 0

    def one(ids):
        t0 = time.perf_counter()
        n, first = 0, None
        for _ in llm.generate(ids, temp=0.0, top_k=0, top_p=1.0, min_p=0.0, repeat_penalty=1.0, reset=True):
            n += 1
            if first is None:
                first = time.perf_counter() - t0
            if n == a.output_tokens:
                break
        return time.perf_counter() - t0, first, n

    one(prompts[0][:8])  # warm-up
    t0 = time.perf_counter()
    for ids in prompts[1:]:
        l, f, n = one(ids)
        lat.append(l), ttft.append(f)
        total += n
    wall = time.perf_counter() - t0
    llm.close()
    return {"tokens_per_s": total / wall, "lat_p50": pct(lat, 0.5), "ttft_p50": pct(ttft, 0.5),
            "requests": a.hl_requests}


def llama_batched(llama_cpp, gguf: Path, a, concurrency: int, requests: int, kv_type: int) -> dict:
    """Closed loop over the low-level API: every step, one llama_decode of all live sequences' next
    tokens plus whole prompts of newly admitted requests (as llama-server's continuous batching)."""
    L = llama_cpp
    L.llama_backend_init()
    global _QUIET  # the callback must outlive the call
    _QUIET = L.llama_log_callback(lambda *_: None)
    L.llama_log_set(_QUIET, None)
    mp = L.llama_model_default_params()
    model = L.llama_model_load_from_file(str(gguf).encode(), mp)
    if not model:
        die(f"llama.cpp cannot load {gguf}")
    vocab = L.llama_vocab_n_tokens(L.llama_model_get_vocab(model))
    cp = L.llama_context_default_params()
    per_seq = a.prompt_tokens + a.output_tokens + 1
    cp.n_ctx = concurrency * per_seq
    cp.n_seq_max = concurrency
    cp.n_batch = max(cp.n_batch, concurrency + a.prompt_tokens)
    cp.n_threads = cp.n_threads_batch = a.threads
    cp.type_k = cp.type_v = kv_type
    cp.kv_unified = not a.kv_per_seq
    ctx = L.llama_init_from_model(model, cp)
    if not ctx:
        die("llama_init_from_model failed")
    mem = L.llama_get_memory(ctx)
    n_batch = cp.n_batch
    batch = L.llama_batch_init(n_batch, 0, 1)
    prompts = prompts_for(requests + 1, a.prompt_tokens, vocab, 1234)

    def run(reqs: list[list[int]]):
        free = list(range(concurrency))
        active = {}  # seq -> [next pos, last token, produced, t0, first token time]
        nxt, lat, ttft, total = 0, [], [], 0
        t_start = time.perf_counter()
        while nxt < len(reqs) or active:
            items = [(st[1], st[0], s, True) for s, st in active.items()]
            decoding = list(active)
            while free and nxt < len(reqs) and len(items) + a.prompt_tokens <= n_batch:
                s = free.pop()
                ids = reqs[nxt]
                nxt += 1
                items += [(t, i, s, i == len(ids) - 1) for i, t in enumerate(ids)]
                active[s] = [len(ids), -1, 0, time.perf_counter(), None]
            for i, (tok, pos, s, want) in enumerate(items):
                batch.token[i], batch.pos[i], batch.n_seq_id[i] = tok, pos, 1
                batch.seq_id[i][0], batch.logits[i] = s, want
            batch.n_tokens = len(items)
            if L.llama_decode(ctx, batch) != 0:
                die("llama_decode failed")
            outs = [s for (_, _, s, want) in items if want]
            logits = np.ctypeslib.as_array(L.llama_get_logits(ctx), shape=(len(outs) * vocab,))
            best = logits.reshape(len(outs), vocab).argmax(axis=1)
            for s in decoding:
                active[s][0] += 1
            now = time.perf_counter()
            for s, tok in zip(outs, best.tolist()):
                st = active[s]
                st[1], st[2] = tok, st[2] + 1
                if st[4] is None:
                    st[4] = now - st[3]
                if st[2] == a.output_tokens:
                    lat.append(now - st[3]), ttft.append(st[4])
                    total += st[2]
                    del active[s]
                    L.llama_memory_seq_rm(mem, s, -1, -1)
                    free.append(s)
        return time.perf_counter() - t_start, lat, ttft, total

    run(prompts[:1])  # warm-up
    wall, lat, ttft, total = run(prompts[1:])
    L.llama_batch_free(batch)
    L.llama_free(ctx)
    L.llama_model_free(model)
    return {"tokens_per_s": total / wall, "lat_p50": pct(lat, 0.5), "lat_p99": pct(lat, 0.99),
            "ttft_p50": pct(ttft, 0.5), "ttft_p99": pct(ttft, 0.99), "requests": requests}


# ---- the machine -------------------------------------------------------------------------------------


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
    """Waits until the CPUs are at least min_idle idle over 5 s (others share this machine); returns the
    idle share last seen, whether or not it got there within timeout_s."""
    deadline = time.time() + timeout_s
    idle = cpu_idle_fraction(5)
    while idle < min_idle and time.time() < deadline:
        say(f"  waiting for a quiet machine: CPUs {idle:.0%} idle over 5 s (want {min_idle:.0%})")
        time.sleep(25)
        idle = cpu_idle_fraction(5)
    return idle


# ---- 4. miles ------------------------------------------------------------------------------------------


def run_miles(a, preset: dict, c: int) -> dict:
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        cmd = [str(a.miles_bin), "bench", "rollout", "--model", str(preset["miles_model"]),
               "--concurrency", str(c), "--requests", str(preset["requests"][c]),
               "--prompt-tokens", str(a.prompt_tokens),
               "--output-tokens", str(a.output_tokens), "--threads", str(a.threads),
               "--groups", "0", "--json", f.name]
        env = dict(os.environ)
        if a.isa != "native":
            env["MILES_ISA"] = a.isa
        say("running " + ("MILES_ISA=" + a.isa + " " if a.isa != "native" else "") + " ".join(cmd))
        if subprocess.call(cmd, env=env) != 0:
            die("miles bench rollout failed")
        return json.load(open(f.name))["levels"][0]


def median_of(runs: list[dict], key: str) -> float:
    return float(np.median([r[key] for r in runs]))


def spread(runs: list[dict], key: str) -> str:
    """median [min-max] over the repeats."""
    v = [r[key] for r in runs]
    return f"{np.median(v):.1f} [{min(v):.1f}-{max(v):.1f}]"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--preset", choices=sorted(PRESETS), required=True)
    ap.add_argument("--prompt-tokens", type=int)
    ap.add_argument("--output-tokens", type=int)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--repeats", type=int, default=3, help="alternating llama.cpp / miles rounds (medians)")
    ap.add_argument("--min-idle", type=float, default=0.9,
                    help="before each round, wait until the CPUs are this idle over 5 s")
    ap.add_argument("--quiet-timeout", type=float, default=900, help="longest wait for that, seconds")
    ap.add_argument("--hl-requests", type=int, default=4, help="requests through Llama.generate")
    ap.add_argument("--kv-type", choices=["f32", "f16"], default="f32")
    ap.add_argument("--kv-per-seq", action="store_true",
                    help="one KV buffer per sequence (llama_context's default; measured 2.5x slower at c=32 "
                         "for SmolLM2 here, so the baseline uses one unified buffer)")
    ap.add_argument("--miles-bin", type=Path, default=ROOT / "build/bin/miles")
    ap.add_argument("--skip-miles", action="store_true", help="measure llama.cpp only")
    ap.add_argument("--isa", choices=sorted(ISA_CMAKE), default="native",
                    help="the instruction set both run with: llama.cpp built for it (one build per ISA, kept in "
                         "MILES_LLAMACPP_DIR), miles with MILES_ISA; native = each side's best for this CPU")
    a = ap.parse_args()
    preset = PRESETS[a.preset]
    a.prompt_tokens = a.prompt_tokens or preset["prompt"]
    a.output_tokens = a.output_tokens or preset["output"]
    if not a.miles_bin.exists():
        die(f"{a.miles_bin} not found: build miles first (or pass --miles-bin)")
    kv_type = 0 if a.kv_type == "f32" else 1  # GGML_TYPE_F32 / GGML_TYPE_F16

    check_cpu_has(a.isa)
    llama_cpp = ensure_llama_cpp(a.isa)
    say(f"llama-cpp-python {llama_cpp.__version__}; max parallel sequences in one context: "
        f"{llama_cpp.llama_max_parallel_sequences()} (low-level API; the high-level Llama runs one)")
    gguf = export_gguf(preset)
    checks = check_logits(llama_cpp, a, preset, gguf, kv_type)
    for line in checks:
        say(line)

    say(f"prompt {a.prompt_tokens} + output {a.output_tokens} tokens, {a.threads} threads, llama.cpp KV "
        f"{a.kv_type}; {a.repeats} rounds")
    hl, ll, ours, loads = [], {1: [], 32: []}, {1: [], 32: []}, []
    for r in range(a.repeats):
        loads.append(wait_for_quiet(a.min_idle, a.quiet_timeout))
        hl.append(llama_highlevel_c1(llama_cpp, gguf, a, kv_type))
        say(f"  round {r + 1}: CPUs {loads[-1]:.0%} idle before; Llama.generate c=1: "
            f"{hl[-1]['tokens_per_s']:.1f} tok/s")
        for c in (1, 32):
            ll[c].append(llama_batched(llama_cpp, gguf, a, c, preset["requests"][c], kv_type))
            x = ll[c][-1]
            say(f"  round {r + 1}: llama_decode batched c={c}: {x['tokens_per_s']:.1f} tok/s, latency p50 "
                f"{x['lat_p50']:.3f} s, ttft p50 {x['ttft_p50']:.3f} s")
        if not a.skip_miles:
            for c in (1, 32):
                ours[c].append(run_miles(a, preset, c))
    if a.skip_miles:
        return

    print()
    cpu = next((ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                if ln.startswith("model name")), "unknown CPU")
    print(f"## {a.preset} on {cpu}, --isa {a.isa}: prompt {a.prompt_tokens} + output {a.output_tokens} tokens, "
          f"{a.threads} threads, llama-cpp-python {llama_cpp.__version__}, float32 weights, llama.cpp KV "
          f"{a.kv_type}{' per sequence' if a.kv_per_seq else ' unified'}")
    print()
    for line in checks:
        print(f"- {line}")
    print(f"- requests per measurement: c=1 {preset['requests'][1]}, c=32 {preset['requests'][32]} (same for "
          f"both); llama.cpp greedy, miles temperature 1; EOS ignored by both")
    print(f"- {a.repeats} alternating rounds (llama.cpp, then miles); tok/s as median [min-max]; CPUs idle "
          f"over the 5 s before each round: {', '.join(f'{x:.0%}' for x in loads)}")
    print()
    print("| c | miles tok/s | llama.cpp batched tok/s | miles / batched | llama.cpp one at a time tok/s "
          "| miles / one at a time |")
    print("|---|---|---|---|---|---|")
    # One sequence after another: the better of llama.cpp's two c=1 measurements.
    one_at_a_time = max(median_of(ll[1], "tokens_per_s"), median_of(hl, "tokens_per_s"))
    for c in (1, 32):
        m, b = median_of(ours[c], "output_tokens_per_s"), median_of(ll[c], "tokens_per_s")
        print(f"| {c} | {spread(ours[c], 'output_tokens_per_s')} | {spread(ll[c], 'tokens_per_s')} | "
              f"{m / b:.2f} | {one_at_a_time:.1f} | {m / one_at_a_time:.2f} |")
    print()
    print(f"llama.cpp one at a time = its c=1 rate, one sequence after another (all llama-cpp-python's "
          f"high-level API can do): the better of llama_decode c=1 above and Llama.generate c=1 "
          f"({hl[0]['requests']} requests): {spread(hl, 'tokens_per_s')} tok/s.")
    print()
    print("| c | miles lat p50 s | llama.cpp lat p50 s | miles ttft p50 s | llama.cpp ttft p50 s |")
    print("|---|---|---|---|---|")
    for c in (1, 32):
        print(f"| {c} | {median_of(ours[c], 'latency_p50_s'):.3f} | {median_of(ll[c], 'lat_p50'):.3f} | "
              f"{median_of(ours[c], 'ttft_p50_s'):.3f} | {median_of(ll[c], 'ttft_p50'):.3f} |")


if __name__ == "__main__":
    main()

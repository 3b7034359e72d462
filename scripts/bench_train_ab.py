#!/usr/bin/env python3
"""Two miles binaries' training steps, alternating: the in-step effect of a kernel change.

Why: a change measured in isolation (a harness, one kernel) may not show in the step, and this
machine drifts between speed modes over minutes, so two `miles bench train` runs minutes apart do not
compare. This keeps both binaries alive (`miles bench train --paced`) and alternates their steps
(A then B, then B then A, ...; --pause idle between any two), so each pair's two steps see the same
machine, and prints every pair's B / A step-time ratio with their median (below 1: B is faster).
Needs no Python packages (the standard library only); shares the driver of bench_train_torch.py.

    python3 scripts/bench_train_ab.py --a /tmp/base/build/bin/miles --b build/bin/miles \
        --model models/smollm2-135m-instruct --threads 1 --steps 8
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_train_torch as btt  # noqa: E402  (PacedMiles, wait_for_quiet)


def step_seconds(done: list[str]) -> float:
    if len(done) != 1:
        btt.die(f"expected one `paced: step` line, got {len(done)}")
    return float(done[0].split()[3])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--a", type=Path, required=True, help="the baseline miles binary")
    ap.add_argument("--b", type=Path, required=True, help="the changed miles binary")
    ap.add_argument("--model", type=Path, required=True)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--steps", type=int, default=8, help="measured pairs")
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--micro-batch-size", type=int, default=1)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--lr", type=float, default=1e-5)
    ap.add_argument("--pause", type=float, default=0.5)
    ap.add_argument("--min-idle", type=float, default=0.9)
    ap.add_argument("--quiet-timeout", type=float, default=600)
    a = ap.parse_args()
    for b in (a.a, a.b):
        if not b.is_file():
            btt.die(f"{b}: no such binary")

    with tempfile.TemporaryDirectory() as tmp:
        sides = {}
        for name, binary in (("A", a.a), ("B", a.b)):
            a.miles_bin = binary
            sides[name] = btt.PacedMiles(a, f"{tmp}/{name}.json")  # waits before its FMA peak
        idle = btt.wait_for_quiet(a.min_idle, a.quiet_timeout)
        for side in sides.values():
            side.go()  # the FMA peaks, one at a time
        times = {"A": [], "B": []}
        ratios = []
        for k in range(a.warmup + a.steps):
            order = ("A", "B") if k % 2 == 0 else ("B", "A")
            wall = {}
            for name in order:
                time.sleep(a.pause)
                wall[name] = step_seconds(sides[name].go())
            if k >= a.warmup:
                for name in wall:
                    times[name].append(wall[name])
                ratios.append(wall["B"] / wall["A"])
                print(f"bench_train_ab.py:   pair {k - a.warmup + 1}: A {wall['A']:.3f} s, "
                      f"B {wall['B']:.3f} s, B / A {ratios[-1]:.4f}", flush=True)
        for side in sides.values():
            side.finish()

    print(f"\n## A = {a.a}, B = {a.b}: {a.model.name}, {a.threads} thread(s), CPUs {idle:.0%} idle before")
    print(f"step time B / A: median of {len(ratios)} pairs **{statistics.median(ratios):.4f}** "
          f"({', '.join(f'{r:.3f}' for r in ratios)}); medians {statistics.median(times['B']):.3f} / "
          f"{statistics.median(times['A']):.3f} s; best steps {min(times['B']):.3f} / "
          f"{min(times['A']):.3f} s")


if __name__ == "__main__":
    main()

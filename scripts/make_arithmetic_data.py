#!/usr/bin/env python3
"""Generates the arithmetic task of configs/smollm2_arithmetic.yaml: two-operand integer arithmetic
prompts with their answers (a numeric reward checks the last number of the response).

    python3 scripts/make_arithmetic_data.py > configs/data/arithmetic.jsonl
    python3 scripts/make_arithmetic_data.py --eval > configs/data/arithmetic_eval.jsonl

The training file: 512 prompts drawn with seed 7 (repeats kept: RL data recycles prompts). The
held-out file (--eval): 128 distinct prompts drawn with seed 11, none of which is in the training
file, so that its accuracy measures what transfers. Deterministic (random.Random(seed)).
"""
import argparse
import json
import random
import sys


def draw(rng):
    op = rng.choice("+-*")
    if op == "*":
        a, b = rng.randint(2, 12), rng.randint(2, 12)
    else:
        a, b = rng.randint(1, 99), rng.randint(1, 99)
    answer = a + b if op == "+" else a - b if op == "-" else a * b
    return {"prompt": f"What is {a} {op} {b}? Reply with the number only.", "label": answer}


def training(n=512, seed=7):
    rng = random.Random(seed)
    return [draw(rng) for _ in range(n)]


def held_out(n=128, seed=11):
    seen = {row["prompt"] for row in training()}
    rng = random.Random(seed)
    rows = []
    while len(rows) < n:
        row = draw(rng)
        if row["prompt"] not in seen:
            seen.add(row["prompt"])
            rows.append(row)
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--eval", action="store_true", help="the held-out split")
    rows = held_out() if parser.parse_args().eval else training()
    for row in rows:
        sys.stdout.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()

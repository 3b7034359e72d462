#!/usr/bin/env python3
"""Generates configs/data/arithmetic.jsonl: two-operand integer arithmetic prompts with their answers,
for configs/smollm2_arithmetic.yaml (a numeric reward checks the last number of the response).

Deterministic (random.Random(seed)); regenerate with
    python3 scripts/make_arithmetic_data.py > configs/data/arithmetic.jsonl
"""
import json
import random
import sys


def main(n=512, seed=7):
    rng = random.Random(seed)
    for _ in range(n):
        op = rng.choice("+-*")
        if op == "*":
            a, b = rng.randint(2, 12), rng.randint(2, 12)
        else:
            a, b = rng.randint(1, 99), rng.randint(1, 99)
        answer = a + b if op == "+" else a - b if op == "-" else a * b
        prompt = f"What is {a} {op} {b}? Reply with the number only."
        sys.stdout.write(json.dumps({"prompt": prompt, "label": answer}) + "\n")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""TensorBoard's own readers on a miles run directory (argv[1]): every step's metrics are scalars
with the metrics.jsonl values, the histograms (reward, response_length, logp_abs_diff) and the text
samples are there. Exits non-zero on the first failed check."""
import json
import sys

import numpy as np
from tensorboard.backend.event_processing import event_accumulator
from tensorboard.util import tensor_util

run = sys.argv[1]
metrics = [json.loads(line) for line in open(run + "/metrics.jsonl")]
acc = event_accumulator.EventAccumulator(run + "/tensorboard", size_guidance={
    event_accumulator.SCALARS: 0, event_accumulator.HISTOGRAMS: 0, event_accumulator.TENSORS: 0})
acc.Reload()
tags = acc.Tags()
print("scalars:", len(tags["scalars"]), "histograms:", tags["histograms"], "tensors:", tags["tensors"])
for key in ("reward_mean", "loss", "logp_abs_diff_max", "response_length_mean", "time_step_s"):
    events = acc.Scalars(key)
    assert [e.step for e in events] == [m["step"] for m in metrics], (key, events)
    for e, m in zip(events, metrics):
        assert np.float32(e.value) == np.float32(m[key]), (key, e.step, e.value, m[key])
numeric = [k for k, v in metrics[0].items() if k != "step" and isinstance(v, (int, float))]
missing = sorted(set(numeric) - set(tags["scalars"]))
assert not missing, missing

for tag in ("reward", "response_length", "logp_abs_diff"):
    hs = acc.Histograms(tag)
    assert len(hs) == len(metrics), (tag, len(hs))
    for h, m in zip(hs, metrics):
        assert h.histogram_value.num == m["samples"] or tag == "logp_abs_diff", (tag, h)
        assert sum(h.histogram_value.bucket) == h.histogram_value.num, (tag, h)
# True on-policy: every token's |trainer - engine logp| is in the bucket of exactly 0.
for h in acc.Histograms("logp_abs_diff"):
    assert h.histogram_value.bucket_limit[0] == 0 and h.histogram_value.bucket[0] > 0, h
    assert sum(h.histogram_value.bucket[1:]) == 0, h

texts = acc.Tensors("samples")
assert len(texts) == len(metrics), len(texts)
table = tensor_util.make_ndarray(texts[-1].tensor_proto).item().decode()
print(table)
assert table.startswith("| group | sample | reward | response |"), table
print("tensorboard readers: all checks passed")

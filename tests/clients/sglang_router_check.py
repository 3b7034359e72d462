#!/usr/bin/env python3
"""Requests through sglang-router to two `miles serve` engines (ports in MILES_ENGINES, the router's
in MILES_ROUTER): SGLang's /generate and OpenAI completions come back in their shapes, the
requests are spread over both engines (their /get_load counters), and with one engine killed the
router keeps answering from the other. Exits non-zero on the first failed check."""
import json
import os
import signal
import time
import urllib.error
import urllib.request

engines = [int(p) for p in os.environ["MILES_ENGINES"].split()]
router = int(os.environ["MILES_ROUTER"])


def call(port, path, body=None, timeout=60):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=data,
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read() or b"null")
    except urllib.error.HTTPError as e:
        raise AssertionError(f"{path}: HTTP {e.code}: {e.read()[:2000]!r}") from None


def generated(port):
    _, text = 0, urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    for line in text.splitlines():
        if line.startswith("miles_http_requests_total "):
            return float(line.split()[1])
    raise AssertionError("no request counter")


before = [generated(p) for p in engines]
payload = {"text": "Once upon a time", "sampling_params": {"temperature": 0, "max_new_tokens": 8},
           "return_logprob": True}
outs = []
for _ in range(6):
    status, out = call(router, "/generate", payload)
    assert status == 200, status
    assert out["meta_info"]["finish_reason"]["type"] in ("length", "stop"), out
    assert len(out["meta_info"]["output_token_logprobs"]) == len(out["output_ids"])
    outs.append(out["text"])
assert len(set(outs)) == 1, outs  # greedy: every engine gives the same text
after = [generated(p) for p in engines]
spread = [a - b for a, b in zip(after, before)]
assert all(d >= 2 for d in spread), f"requests not balanced over both engines: {spread}"
status, comp = call(router, "/v1/completions", {"model": "miles", "prompt": "Once upon a time",
                                                "max_tokens": 8, "temperature": 0})
assert status == 200 and comp["choices"][0]["text"] == outs[0], comp
print("router: balanced", spread, "text", repr(outs[0]))

# Kill the second engine: once its health check fails the router sends everything to the first.
os.kill(int(os.environ["MILES_ENGINE2_PID"]), signal.SIGKILL)
ok = 0
deadline = time.time() + 30
while ok < 6 and time.time() < deadline:
    try:
        status, out = call(router, "/generate", payload, timeout=10)
        ok = ok + 1 if status == 200 and out["text"] == outs[0] else 0
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        ok = 0
        time.sleep(0.5)
assert ok >= 6, "the router did not take the killed engine out"
print("sglang-router: all checks passed")

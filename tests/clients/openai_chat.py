#!/usr/bin/env python3
"""The official `openai` Python client against `miles serve` (base URL in argv[1]).

Checks chat completions (plain and streamed), completions, and that miles' token-id extensions come
through the client's extra fields. Exits non-zero on the first failed check.
"""
import sys

import openai

base = sys.argv[1]
client = openai.OpenAI(base_url=base + "/v1", api_key="unused")
question = [{"role": "user", "content": "What is the capital of France?"}]

chat = client.chat.completions.create(model="miles", messages=question, max_tokens=24, temperature=0)
answer = chat.choices[0].message.content
print("chat:", repr(answer))
assert "Paris" in answer, answer
assert chat.choices[0].finish_reason == "stop", chat.choices[0].finish_reason
extra = chat.choices[0].model_extra or {}
assert extra.get("token_ids"), "choices[0].token_ids missing"
assert chat.usage.completion_tokens == len(extra["token_ids"])
assert (chat.model_extra or {}).get("prompt_token_ids"), "prompt_token_ids missing"

pieces = []
ids = []
for chunk in client.chat.completions.create(model="miles", messages=question, max_tokens=24,
                                            temperature=0, stream=True):
    if chunk.choices and chunk.choices[0].delta.content:
        pieces.append(chunk.choices[0].delta.content)
    if chunk.choices:
        ids.extend((chunk.choices[0].model_extra or {}).get("token_ids") or [])
streamed = "".join(pieces)
print("stream:", repr(streamed))
assert streamed == answer, (streamed, answer)
assert ids == extra["token_ids"], (ids, extra["token_ids"])

sampled = client.chat.completions.create(model="miles", messages=question, max_tokens=16,
                                         temperature=0.8, seed=3, n=4, logprobs=True)
assert len(sampled.choices) == 4
for c in sampled.choices:
    assert c.logprobs and len(c.logprobs.content) == len(c.model_extra["token_ids"])

comp = client.completions.create(model="miles", prompt="The capital of France is", max_tokens=8,
                                 temperature=0)
print("completion:", repr(comp.choices[0].text))
assert comp.choices[0].text, "empty completion"

# Fresh seeds: two unseeded requests differ; the reported seed replays one exactly.
a = client.completions.create(model="miles", prompt="Once upon a time", max_tokens=16, temperature=1.0)
b = client.completions.create(model="miles", prompt="Once upon a time", max_tokens=16, temperature=1.0)
assert a.choices[0].model_extra["token_ids"] != b.choices[0].model_extra["token_ids"], "same sample twice"
seed = a.choices[0].model_extra["sampling_seed"]
again = client.completions.create(model="miles", prompt="Once upon a time", max_tokens=16,
                                  temperature=1.0, seed=seed)
assert again.choices[0].model_extra["token_ids"] == a.choices[0].model_extra["token_ids"]

# Greedy logprobs are the model's log-softmax (never 0), with top_logprobs whose first is the token.
greedy = client.chat.completions.create(model="miles", messages=question, max_tokens=6,
                                        temperature=0, logprobs=True, top_logprobs=3)
for entry in greedy.choices[0].logprobs.content:
    assert entry.logprob < 0, entry
    assert len(entry.top_logprobs) == 3
    assert entry.top_logprobs[0].token == entry.token
    assert entry.top_logprobs[0].logprob == entry.logprob
    assert bytes(entry.bytes).decode("utf-8", "replace") == entry.token or entry.bytes

# Completions: echo with logprobs puts the prompt first (its first token has none), batched
# prompts give n choices each, in order.
echo = client.completions.create(model="miles", prompt="The capital of France is", max_tokens=4,
                                 temperature=0, echo=True, logprobs=2)
lp = echo.choices[0].logprobs
assert echo.choices[0].text.startswith("The capital of France is"), echo.choices[0].text
assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
assert all(v is not None for v in lp.token_logprobs[1:])
assert len(lp.tokens) == len(echo.model_extra["prompt_token_ids"]) + 4
batch = client.completions.create(model="miles", prompt=["One", "Two plus two is"], max_tokens=4,
                                  temperature=0, n=2)
assert [c.index for c in batch.choices] == [0, 1, 2, 3]
assert batch.choices[0].text == batch.choices[1].text  # greedy: the same twice
single = client.completions.create(model="miles", prompt="Two plus two is", max_tokens=4, temperature=0)
assert batch.choices[2].text == single.choices[0].text

# Streaming usage, penalties, logit_bias, min_tokens.
chunks = list(client.chat.completions.create(model="miles", messages=question, max_tokens=8,
                                             temperature=0, stream=True,
                                             stream_options={"include_usage": True}))
assert chunks[-1].usage is not None and chunks[-1].choices == []
assert chunks[-1].usage.completion_tokens > 0
token = single.choices[0].model_extra["token_ids"][0]
forced = client.completions.create(model="miles", prompt="Hello", max_tokens=3, temperature=0,
                                   logit_bias={str(token): 100})
assert forced.choices[0].model_extra["token_ids"] == [token] * 3
penalised = client.completions.create(model="miles", prompt="Hello", max_tokens=3, temperature=0,
                                      logit_bias={str(token): 5}, frequency_penalty=2.0)
assert penalised.choices[0].model_extra["token_ids"] != [token] * 3
long = client.chat.completions.create(model="miles", messages=question, max_tokens=12,
                                      temperature=0, extra_body={"min_tokens": 12})
assert long.usage.completion_tokens == 12, long.usage

# Any model name is served and echoed, as SGLang does.
other = client.completions.create(model="some-other-name", prompt="Hi", max_tokens=2)
assert other.model == "some-other-name"
try:
    client.completions.create(model="miles:my-adapter", prompt="Hi", max_tokens=2)
    raise AssertionError("a LoRA adapter name was accepted")
except openai.BadRequestError as e:
    assert "LoRA" in str(e), e

# Tools: the request carries them through the chat template, and an assistant tool call and the
# tool's result go back in the next turn (SmolLM2's template renders the call's message by its
# content; tool calls parsed out of model text are pinned in tests/server_api_test.cc).
tools = [{"type": "function", "function": {"name": "add", "description": "Adds two numbers",
          "parameters": {"type": "object", "properties": {"a": {"type": "number"},
                                                          "b": {"type": "number"}}}}}]
first = client.chat.completions.create(model="miles", messages=question, tools=tools, max_tokens=8,
                                       temperature=0)
assert first.choices[0].message.role == "assistant"
round_trip = question + [
    {"role": "assistant", "content": "", "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "add", "arguments": "{\"a\": 2, \"b\": 3}"}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": "5"}]
second = client.chat.completions.create(model="miles", messages=round_trip, tools=tools,
                                        max_tokens=8, temperature=0)
assert second.choices[0].finish_reason in ("stop", "length", "tool_calls")

try:
    client.chat.completions.create(model="miles", messages=question, max_tokens=4,
                                   tool_choice={"type": "function", "function": {"name": "add"}},
                                   tools=tools)
    raise AssertionError("a forced tool_choice was accepted")
except openai.BadRequestError as e:
    assert "tool_choice" in str(e), e

try:
    client.chat.completions.create(model="miles", messages=[], max_tokens=4)
    raise AssertionError("an empty message list was accepted")
except openai.BadRequestError as e:
    print("rejected as expected:", e.status_code)

# The calls sglang.RuntimeEndpoint makes, as raw HTTP (sglang_frontend.py runs the package's own
# client): model info, a text /generate, and select()'s batched text with input logprobs and their
# text.
import json
import urllib.request


def native(path, body=None):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(base + path, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        raw = r.read()
        return r.status, (json.loads(raw) if raw else None)


status, info = native("/get_model_info")
assert status == 200 and info["model_path"], info
status, out = native("/generate", {"text": "The capital of France is",
                                   "sampling_params": {"max_new_tokens": 0}})
prompt_len = out["meta_info"]["prompt_tokens"]
choices = [" Paris", " London"]
status, outs = native("/generate", {
    "text": ["The capital of France is" + c for c in choices],
    "sampling_params": {"max_new_tokens": 0, "temperature": 0},
    "return_logprob": True, "return_text_in_logprobs": True,
    "logprob_start_len": max(prompt_len - 2, 0)})
assert isinstance(outs, list) and len(outs) == 2, outs
for o in outs:
    entries = o["meta_info"]["input_token_logprobs"]
    assert entries[0][0] is None and isinstance(entries[0][2], str), entries[0]
    assert all(e[0] is not None and e[0] < 0 for e in entries[1:]), entries
scores = [sum(e[0] for e in o["meta_info"]["input_token_logprobs"][1:]) for o in outs]
print("select scores:", scores)
assert scores[0] > scores[1], "the model prefers London to Paris"

# slime's exact rollout payload (slime/rollout/sglang_rollout.py), its abort sequence
# (abort_all, then /v1/loads?include=core until idle) and GET /flush_cache.
ids = client.completions.create(model="miles", prompt="Hi", max_tokens=1).model_extra["prompt_token_ids"]
slime_payload = {"sampling_params": {"temperature": 1.0, "top_p": 1.0, "top_k": -1,
                                     "max_new_tokens": 16, "stop": None, "stop_token_ids": None,
                                     "skip_special_tokens": False, "no_stop_trim": True,
                                     "spaces_between_special_tokens": False, "sampling_seed": 7},
                 "return_logprob": True, "input_ids": ids}
status, out = native("/generate", slime_payload)
assert status == 200
tokens = [t[1] for t in out["meta_info"]["output_token_logprobs"]]
assert tokens == out["output_ids"] and out["meta_info"]["finish_reason"]["type"] in ("length", "stop")
assert isinstance(out["meta_info"]["weight_version"], str)
status, _ = native("/abort_request", {"abort_all": True})
assert status == 200
status, loads = native("/v1/loads?include=core")
assert loads["loads"][0]["num_running_reqs"] + loads["loads"][0]["num_waiting_reqs"] == 0, loads
status, _ = native("/flush_cache")
assert status == 200

print("openai client: all checks passed")

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

# Tools: the chat template renders them, and an assistant tool call goes back in the next turn.
tools = [{"type": "function", "function": {"name": "add", "description": "Adds two numbers",
          "parameters": {"type": "object", "properties": {"a": {"type": "number"},
                                                          "b": {"type": "number"}}}}}]
first = client.chat.completions.create(model="miles", messages=question, tools=tools, max_tokens=8,
                                       temperature=0)
assert first.choices[0].message.role == "assistant"
round_trip = question + [
    {"role": "assistant", "content": None, "tool_calls": [
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

print("openai client: all checks passed")

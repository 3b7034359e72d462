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

try:
    client.chat.completions.create(model="miles", messages=[], max_tokens=4)
    raise AssertionError("an empty message list was accepted")
except openai.BadRequestError as e:
    print("rejected as expected:", e.status_code)

print("openai client: all checks passed")

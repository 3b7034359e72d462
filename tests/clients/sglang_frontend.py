#!/usr/bin/env python3
"""The `sglang` package's own client (its frontend language over sglang.RuntimeEndpoint) against
`miles serve` (base URL in argv[1]).

sglang 0.5.5's frontend imports without torch (later releases import torch from sglang.srt), so
scripts/setup.sh installs that release's wheel without its server dependencies. Checks what a user's
sglang program does: gen with logprobs and top logprobs, streaming, run_batch, select (scored by
input logprobs), fresh samples without a seed, get_server_info and flush_cache. Exits non-zero on
the first failed check.
"""
import sys

import sglang as sgl

base = sys.argv[1]
backend = sgl.RuntimeEndpoint(base)
sgl.set_default_backend(backend)
print("sglang", sgl.__version__, "model:", backend.get_model_name())


@sgl.function
def capital(s, country):
    s += "The capital of " + country + " is"
    s += sgl.gen("answer", max_tokens=8, temperature=0, return_logprob=True, top_logprobs_num=2,
                 return_text_in_logprobs=True)


state = capital.run(country="France")
answer = state["answer"]
print("gen:", repr(answer))
assert "Paris" in answer, answer
meta = state.get_meta_info("answer")
lps = meta["output_token_logprobs"]
assert lps and all(e[0] < 0 and isinstance(e[1], int) and isinstance(e[2], str) for e in lps), lps
tops = meta["output_top_logprobs"]
assert len(tops) == len(lps)
for entry, top in zip(lps, tops):
    assert len(top) == 2 and top[0][1] == entry[1] and top[0][0] == entry[0], (entry, top)
assert isinstance(meta["weight_version"], str)

streamed = capital.run(country="France", stream=True)
pieces = list(streamed.text_iter("answer"))
print("stream:", repr("".join(pieces)), len(pieces), "chunks")
assert "".join(pieces) == answer, (pieces, answer)

states = capital.run_batch([{"country": "France"}, {"country": "Italy"}], num_threads=2)
print("batch:", [st["answer"] for st in states])
assert states[0]["answer"] == answer
assert "Rome" in states[1]["answer"], states[1]["answer"]


@sgl.function
def city(s):
    s += "Question: What is the capital of France?\nAnswer:"
    s += sgl.select("city", choices=[" Paris", " London", " Berlin"])


picked = city.run()
print("select:", repr(picked["city"]))
assert picked["city"] == " Paris", picked["city"]


@sgl.function
def story(s):
    s += "Once upon a time"
    s += sgl.gen("more", max_tokens=16, temperature=1.0)


a, b = story.run()["more"], story.run()["more"]
print("unseeded samples:", repr(a), repr(b))
assert a != b, "two unseeded samples are the same: the server reused a seed"

info = backend.get_server_info()
assert info["page_size"] > 0 and "internal_states" in info, info
backend.flush_cache()
print("sglang client: all checks passed")

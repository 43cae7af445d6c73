#!/usr/bin/env python3
"""Records reference chat-template renderings for ferrox-tokenizer's chat_template tests.

The templates are rendered with Python's jinja2 configured exactly as Hugging Face
transformers' `apply_chat_template` configures it (transformers/utils/chat_template_utils.py,
`_compile_jinja_template` and `render_jinja_template`):

* `ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
  extensions=[AssistantTracker, jinja2.ext.loopcontrols])`
* globals `raise_exception(msg)` (raises `TemplateError`) and `strftime_now(fmt)`
* the `tojson` filter replaced by `json.dumps(x, ensure_ascii=False, indent=indent,
  separators=separators, sort_keys=sort_keys)`
* the context: `messages`, `tools` (None when absent), `documents` (None),
  `add_generation_prompt`, the special tokens (`bos_token`, `eos_token`) and any extra kwargs.

transformers itself is not needed (only `pip install jinja2`). `strftime_now` reads a fixed
clock (`NOW` below) so the outputs are reproducible; the Rust tests pass the same instant.

Usage:
    python3 scripts/gen-chat-template-fixtures.py [--llama-cpp PATH/TO/llama.cpp]

With --llama-cpp the model templates are (re)copied from `models/templates/` of that tree into
the fixtures folder; without it the copies already in the fixtures folder are used.
"""

import argparse
import datetime
import json
import pathlib
import shutil
import sys

import jinja2
from jinja2 import nodes
from jinja2.ext import Extension, loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

ROOT = pathlib.Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "crates" / "ferrox-tokenizer" / "tests" / "fixtures" / "chat_templates"
TEMPLATES = FIXTURES / "templates"

# The fixed "now" seen by strftime_now (a naive local time, as datetime.now() returns).
NOW = datetime.datetime(2025, 3, 7, 14, 5, 9)

# ---------------------------------------------------------------------------------------------
# The transformers environment
# ---------------------------------------------------------------------------------------------


class AssistantTracker(Extension):
    """transformers' `{% generation %}...{% endgeneration %}` tag, reduced to what rendering
    without `return_assistant_tokens_mask` does: render the body unchanged."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
        return nodes.CallBlock(self.call_method("_render_assistant", []), [], [], body).set_lineno(lineno)

    @jinja2.pass_eval_context
    def _render_assistant(self, context, caller):
        return caller()


def raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def strftime_now(format):
    return NOW.strftime(format)


def compile_template(source):
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[AssistantTracker, loopcontrols]
    )
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env.from_string(source)


def render(source, messages, add_generation_prompt, bos_token, eos_token, tools=None, extra=None):
    """Returns ("ok", text) or ("error", message)."""
    try:
        template = compile_template(source)
    except jinja2.exceptions.TemplateSyntaxError as e:
        return "error", f"syntax: {e.message} (line {e.lineno})"
    kwargs = {"bos_token": bos_token, "eos_token": eos_token}
    kwargs.update(extra or {})
    try:
        text = template.render(
            messages=messages,
            tools=tools,
            documents=None,
            add_generation_prompt=add_generation_prompt,
            **kwargs,
        )
    except Exception as e:  # noqa: BLE001 - any failure is a recorded error case
        return "error", f"{type(e).__name__}: {e}"
    return "ok", text


# ---------------------------------------------------------------------------------------------
# Conversations (messages are exactly what the Rust `ChatMessage` serializes to: `content` is
# always a string; optional fields are absent, not null)
# ---------------------------------------------------------------------------------------------

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city — «quoted» & <tagged>",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "City name, e.g. Zürich"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                "days": {"type": "integer", "minimum": 1, "maximum": 7.5},
            },
            "required": ["city"],
        },
    },
}

CONVERSATIONS = {
    "system_user": {
        "messages": [
            {"role": "system", "content": "You are a helpful assistant."},
            {"role": "user", "content": "Hello!"},
        ]
    },
    "user_only": {"messages": [{"role": "user", "content": "What is 2+2?"}]},
    "multi_turn": {
        "messages": [
            {"role": "user", "content": "Hi there"},
            {"role": "assistant", "content": "Hello! How can I help?"},
            {"role": "user", "content": "Tell me a joke."},
        ]
    },
    "system_multi_turn": {
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Name a colour."},
            {"role": "assistant", "content": "Blue."},
            {"role": "user", "content": "Another one."},
            {"role": "assistant", "content": "Red."},
            {"role": "user", "content": "Thanks"},
        ]
    },
    "unicode": {
        "messages": [
            {"role": "system", "content": "Réponds en français, s'il te plaît. 日本語もOK"},
            {"role": "user", "content": "Ça va? 🦀 — «ok» ‘quotes’ \"double\" \\ back\\slash \t tab"},
            {"role": "assistant", "content": "Très bien! 👍🏽 Ω≈ç√∫"},
            {"role": "user", "content": "Und auf Deutsch: Grüße aus Köln. Ελληνικά. العربية"},
        ]
    },
    "jinja_literal": {
        "messages": [
            {"role": "user", "content": "Render {{ x }} and {% if true %}yes{% endif %} {# no comment #} {{ raise_exception('no') }}"},
            {"role": "assistant", "content": "I see {{ bos_token }} and {%- raw %} and '}}' literally."},
            {"role": "user", "content": "{% for m in messages %}{{ m }}{% endfor %}"},
        ]
    },
    "whitespace": {
        "messages": [
            {"role": "system", "content": "  \n  spaced system prompt \n\n"},
            {"role": "user", "content": "\n\n  leading and trailing whitespace  \n\t"},
            {"role": "assistant", "content": "<think>\nsome reasoning\n</think>\n\n  The answer.  "},
            {"role": "user", "content": "line one\nline two\r\nline three"},
        ]
    },
    "tool_call": {
        "tools": [WEATHER_TOOL],
        "messages": [
            {"role": "system", "content": "You can check the weather."},
            {"role": "user", "content": "Weather in Zürich?"},
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    {
                        "id": "call12345",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": {"city": "Zürich", "unit": "celsius", "days": 1}},
                    }
                ],
            },
            {"role": "tool", "content": "{\"temperature\": 21.5, \"sky\": \"clear\"}", "name": "get_weather", "tool_call_id": "call12345"},
            {"role": "assistant", "content": "It is 21.5 °C and clear."},
            {"role": "user", "content": "And tomorrow?"},
        ],
    },
    "tools_declared": {
        "tools": [WEATHER_TOOL],
        "messages": [
            {"role": "system", "content": "You can check the weather."},
            {"role": "user", "content": "Weather in Paris?"},
        ],
    },
}

# ---------------------------------------------------------------------------------------------
# Templates
# ---------------------------------------------------------------------------------------------

ALL_CONVERSATIONS = list(CONVERSATIONS)
PLAIN = [c for c in CONVERSATIONS if "tool" not in c]

# name -> (file copied from llama.cpp's models/templates or None, bos, eos, conversations, extra)
MODEL_TEMPLATES = {
    "meta-llama-Llama-3.1-8B-Instruct": ("meta-llama-Llama-3.1-8B-Instruct.jinja", "<|begin_of_text|>", "<|eot_id|>", ALL_CONVERSATIONS, {}),
    "meta-llama-Llama-3.2-3B-Instruct": ("meta-llama-Llama-3.2-3B-Instruct.jinja", "<|begin_of_text|>", "<|eot_id|>", ALL_CONVERSATIONS, {}),
    "meta-llama-Llama-3.3-70B-Instruct": ("meta-llama-Llama-3.3-70B-Instruct.jinja", "<|begin_of_text|>", "<|eot_id|>", ALL_CONVERSATIONS, {"date_string": "01 Feb 2025"}),
    "Qwen-Qwen2.5-7B-Instruct": ("Qwen-Qwen2.5-7B-Instruct.jinja", "", "<|im_end|>", ALL_CONVERSATIONS, {}),
    "Qwen-Qwen3-0.6B": ("Qwen-Qwen3-0.6B.jinja", "", "<|im_end|>", ALL_CONVERSATIONS, {}),
    "Qwen-Qwen3-0.6B-no-thinking": ("Qwen-Qwen3-0.6B.jinja", "", "<|im_end|>", ["system_user", "multi_turn", "whitespace"], {"enable_thinking": False}),
    "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B": ("deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja", "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", ALL_CONVERSATIONS, {}),
    "deepseek-ai-DeepSeek-V3.1": ("deepseek-ai-DeepSeek-V3.1.jinja", "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", ALL_CONVERSATIONS, {}),
    "deepseek-ai-DeepSeek-V3.1-thinking": ("deepseek-ai-DeepSeek-V3.1.jinja", "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", ["system_user", "multi_turn"], {"thinking": True}),
    "mistralai-Mistral-Nemo-Instruct-2407": ("mistralai-Mistral-Nemo-Instruct-2407.jinja", "<s>", "</s>", ALL_CONVERSATIONS, {}),
    "Mistral-Small-3.2-24B-Instruct-2506": ("Mistral-Small-3.2-24B-Instruct-2506.jinja", "<s>", "</s>", ALL_CONVERSATIONS, {}),
    "google-gemma-2-2b-it": ("google-gemma-2-2b-it.jinja", "<bos>", "<eos>", ALL_CONVERSATIONS, {}),
    "google-gemma-3-it": (None, "<bos>", "<eos>", ALL_CONVERSATIONS, {}),
    "microsoft-Phi-3.5-mini-instruct": ("microsoft-Phi-3.5-mini-instruct.jinja", "<s>", "<|endoftext|>", ALL_CONVERSATIONS, {}),
    "moonshotai-Kimi-K2": ("moonshotai-Kimi-K2.jinja", "[BOS]", "[EOS]", ALL_CONVERSATIONS, {}),
    "Kimi-K2-Instruct": ("Kimi-K2-Instruct.jinja", "[BOS]", "[EOS]", ALL_CONVERSATIONS, {}),
    "chatml": (None, "", "", ALL_CONVERSATIONS, {}),
}

# llama.cpp's fallback when a model has no template (common/chat.cpp CHATML_TEMPLATE_SRC);
# it must equal `ChatTemplate::CHATML_SOURCE`.
CHATML = (
    "{%- for message in messages -%}\n"
    "  {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' -}}\n"
    "{%- endfor -%}\n"
    "{%- if add_generation_prompt -%}\n"
    "  {{- '<|im_start|>assistant\\n' -}}\n"
    "{%- endif -%}"
)

# Small templates pinning down the environment (methods, filters, tojson, printing, ...).
# name -> (source, extra context)
FEATURE_TEMPLATES = {
    "print_values": (
        "{{ none }}|{{ true }}|{{ false }}|{{ 1 }}|{{ -7 }}|{{ 1.0 }}|{{ 2.5 }}|{{ 1e20 }}|{{ 1.5e-7 }}|{{ 0.0001 }}|"
        "{{ 123456789012345678.0 }}|{{ 3 / 2 }}|{{ 4 / 2 }}|{{ 7 // 2 }}|{{ 7 % 3 }}|{{ 2 ** 10 }}|"
        "{{ [1, 'a', none, true, 2.5, [\"x\"]] }}|{{ {'k': 'v', 'n': none, 'b': false} }}|{{ 'it\\'s' }}|"
        "{{ ['it\\'s', 'say \"hi\"', 'both \\' \"', 'tab\\tnl\\n', 'é'] }}|{{ undefined_thing }}|{{ messages[0].nope }}",
        {},
    ),
    "string_filter": (
        "{{ true | string }}|{{ none | string }}|{{ [1, 'b'] | string }}|{{ 3 | string }}|{{ 2.0 | string }}|"
        "{{ (true | string) + '!' }}|{{ [1, 2] | join(',') }}",
        {},
    ),
    "tojson_filter": (
        "{{ tools | tojson }}\n{{ tools | tojson(indent=2) }}\n{{ tools[0] | tojson(indent=4) }}\n"
        "{{ data | tojson }}\n{{ data | tojson(sort_keys=true) }}\n{{ data | tojson(ensure_ascii=true) }}\n"
        "{{ data | tojson(separators=(',', ':')) }}\n{{ data | tojson(indent='\\t') }}\n{{ data | tojson(indent=0) }}\n"
        "{{ [] | tojson(indent=2) }}|{{ {} | tojson(indent=2) }}|{{ 'a<b>&\\'c' | tojson }}|{{ none | tojson }}|"
        "{{ 1.0 | tojson }}|{{ 1e100 | tojson }}|{{ [1, [2, [3, {}]]] | tojson(indent=1) }}",
        {
            "data": {
                "z": 1,
                "a": [1, 2.5, None, True, False],
                "ünï": "çödé 🦀 \u2028 \x7f \x01 \" \\ / \n\r\t\b\f",
                "nested": {"b": {}, "a": []},
                "big": 12345678901234567890,
                "neg": -0.5,
                "tiny": 1e-9,
            }
        },
    ),
    "python_methods": (
        "{% set s = '  Hello, World  ' %}"
        "[{{ s.strip() }}][{{ s.lstrip() }}][{{ s.rstrip() }}][{{ s.upper() }}][{{ s.lower() }}][{{ s.title() }}]"
        "[{{ s.strip().split(', ') }}][{{ s.split() }}][{{ 'a,b,,c'.split(',') }}][{{ 'a b c'.split(' ', 1) }}]"
        "[{{ s.strip().startswith('Hello') }}][{{ s.strip().endswith('World') }}][{{ s.startswith(('x', '  H')) }}]"
        "[{{ s.replace('l', 'L') }}][{{ s.replace('l', 'L', 1) }}][{{ 'xxhixx'.strip('x') }}][{{ 'hello'.capitalize() }}]"
        "[{{ 'a-b-c'.count('-') }}][{{ 'abc'.find('c') }}][{{ 'abc'.find('z') }}][{{ '123'.isdigit() }}][{{ 'ab'.isalpha() }}]"
        "[{{ ', '.join(['x', 'y']) }}][{{ 'l1\\nl2\\r\\nl3'.splitlines() }}][{{ 'a</think>b</think>c'.split('</think>')[-1] }}]"
        "[{{ 'a</think>b'.split('</think>', 1)[1] }}][{{ '\\n\\nx\\n'.lstrip('\\n') }}][{{ 'abc'[::-1] }}][{{ 'abcdef'[1:4] }}]"
        "{% for k, v in d.items() %}<{{ k }}={{ v }}>{% endfor %}[{{ d.get('a') }}][{{ d.get('zz') }}][{{ d.get('zz', 'dflt') }}]"
        "[{{ d.keys() | list }}][{{ d.values() | list }}][{{ 'b' in d }}][{{ 'zz' in d }}][{{ d['a'] }}][{{ d.a }}]",
        {"d": {"b": 2, "a": 1, "c": [3]}},
    ),
    "filters": (
        "[{{ '  x  ' | trim }}][{{ messages | length }}][{{ 'abc' | length }}][{{ messages | map(attribute='role') | join('/') }}]"
        "[{{ messages | selectattr('role', 'equalto', 'user') | list | length }}][{{ messages | rejectattr('role', 'eq', 'user') | map(attribute='content') | list }}]"
        "[{{ (messages | first).role }}][{{ (messages | last).content }}][{{ undefined_x | default('dflt') }}][{{ none | default('n') }}][{{ '' | default('e', true) }}]"
        "[{{ [3, 1, 2] | sort }}][{{ [1, 2, 2, 3] | unique | list }}][{{ 'Hello' | upper }}][{{ 'Hello' | lower }}][{{ 'a b' | replace(' ', '_') }}]"
        "[{{ [1, 2, 3] | reverse | list }}][{{ 5 | string }}][{{ '42' | int + 1 }}][{{ '2.5' | float }}][{{ 3 | float }}][{{ {'b': 1, 'a': 2} | dictsort }}]"
        "[{{ ['a', 'b'] | list }}][{{ 'abc' | list }}][{{ -3 | abs }}][{{ [1, 2, 3] | sum }}][{{ [4, 9] | max }}][{{ 'hello world' | title }}]"
        "[{{ 'x' | center(5) }}][{{ '%s-%d' | format('a', 3) }}][{{ 'a\\nb' | indent(2) }}][{{ [1, 2, 3] | batch(2) | list }}][{{ 'Hi' * 3 }}][{{ messages[-1]['role'] }}]",
        {},
    ),
    "control_flow": (
        "{%- set ns = namespace(count=0, last='', items=[]) %}\n"
        "{%- for m in messages %}\n"
        "    {%- if loop.index0 == 0 %}{% continue %}{% endif %}\n"
        "    {%- if m.role == 'assistant' and loop.index > 3 %}{% break %}{% endif %}\n"
        "    {%- set ns.count = ns.count + 1 %}\n"
        "    {%- set ns.last = m.role %}\n"
        "    {%- set ns.items = ns.items + [m.role] %}\n"
        "    {{- loop.index }}:{{ loop.first }}:{{ loop.last }}:{{ loop.length }}:{{ loop.revindex }} {{ m.role }}\n"
        "{% endfor %}\n"
        "count={{ ns.count }} last={{ ns.last }} items={{ ns.items }}\n"
        "{% macro turn(role, text) -%}\n"
        "    <{{ role }}>{{ text | trim }}</{{ role }}>\n"
        "{%- endmacro %}\n"
        "{% for m in messages if m.role != 'system' %}\n"
        "  {{ turn(m.role, m.content) }}\n"
        "{% else %}\n"
        "  none\n"
        "{% endfor %}\n"
        "{% if messages[0]['role'] == 'system' and messages | length > 1 %}sys-first{% elif messages %}other{% else %}empty{% endif %}\n"
        "{{ 'yes' if add_generation_prompt else 'no' }} {{ messages is defined }} {{ tools is none }} {{ tools is defined }} {{ documents is none }} {{ nothing is defined }} {{ nothing is undefined }}\n"
        "{{ messages[0].content is string }} {{ messages is iterable }} {{ messages[0] is mapping }} {{ messages is sequence }} {{ 1 is number }} {{ 'x' is number }} {{ (1 == 1) is boolean }} {{ 2 is even }}\n"
        "{{ none is iterable }} {{ 'ab' is iterable }} {{ {} is iterable }} {{ nothing is iterable }} {{ 1 is iterable }} "
        "{{ none is sequence }} {{ 'ab' is sequence }} {{ {} is sequence }} {{ [] is sequence }} {{ nothing is sequence }} {{ 1 is sequence }} "
        "{{ true is number }} {{ true is integer }} {{ 1.5 is float }} {{ none is mapping }} {{ {} is mapping }}\n"
        "{% for i in range(3) %}{{ i }}{% endfor %} {% for i in range(1, 10, 3) %}{{ i }},{% endfor %}\n"
        "{% set x = 'outer' %}{% for i in [1] %}{% set x = 'inner' %}{% endfor %}{{ x }}\n"
        "{%- if bos_token %}BOS={{ bos_token }}{% endif %} EOS={{ eos_token }}\n"
        "    indented text line\n"
        "  {% if true %}\n"
        "    lstrip+trim\n"
        "  {% endif %}\n"
        "  {%+ if true %}keep-lstrip{% endif +%}\n"
        "end{# comment #}\n",
        {},
    ),
    "more_python": (
        "[{{ '<tag{}>'.format('X') }}][{{ '{} and {}'.format('a', 1) }}][{{ '{0}-{1}-{0}'.format('p', 'q') }}][{{ '{name}!'.format(name='n') }}]"
        "[{{ 'a\nb\nc' | indent(4) }}][{{ 'a\nb' | indent(4, first=true) }}][{{ 'a\n\nb' | indent(2, blank=true) }}][{{ 'a\nb' | indent('> ') }}]"
        "[{{ 'a,b,c'.split(',', 1) }}][{{ '  a  b '.split(' ') }}][{{ 'x'.join(['1', '2']) }}][{{ 'AbC'.swapcase() if false else 'AbC'.lower() }}]"
        "[{{ 'abc'.upper().startswith('AB') }}][{{ 'hello world'.title() }}][{{ 'ab' ~ 1 ~ none ~ 2.5 }}][{{ ['a', 'b'] | join }}][{{ 'abc' | first }}]"
        "[{{ '%s is %d years' % ('Tom', 3) if false else 'skip' }}][{{ (messages | selectattr('role', 'eq', 'user') | list)[0].content }}]"
        "[{{ messages | map(attribute='content') | map('upper') | join('|') }}][{{ messages | length > 2 }}][{{ messages[1:3] | map(attribute='role') | list }}]"
        "[{{ dict(a=1, b='x') }}][{{ {'a': 1}.items() | list }}][{{ 1 in [1, 2] }}][{{ 'b' not in 'abc' }}][{{ [1, 2] + [3] }}][{{ (1, 2) }}][{{ (1,) }}]"
        "[{{ 10 // 3 }}][{{ -7 // 2 }}][{{ -7 % 3 }}][{{ 2 ** -1 }}][{{ 1 / 3 }}][{{ 0.1 + 0.2 }}][{{ 1e-5 * 3 }}][{{ (0.5) | round }}][{{ 2.675 | round(2) }}]",
        {},
    ),
    "whitespace_control": (
        "start\n"
        "    {# an indented comment #}\n"
        "    {%- if true %}\n"
        "  inner\n"
        "    {% endif -%}\n"
        "\n"
        "{% for m in messages %}\n"
        "    {{ m.role }}\n"
        "    {%- if not loop.last %},{% endif %}\n"
        "{% endfor %}\n"
        "  {{- ' trimmed-left' }}  \n"
        "  {{ 'kept' -}}  \n"
        "    x {% if true %}inline{% endif %} y\n"
        "{% raw %}{{ not rendered }}{% endraw %}\n"
        "{% set captured %}\n"
        "  cap {{ 1 + 1 }}\n"
        "{% endset %}[{{ captured }}]\n"
        "{% filter upper %}shout {{ messages[0].role }}{% endfilter %}\n"
        "trailing newline follows\n",
        {},
    ),
    "strftime": (
        "{{ strftime_now('%d %b %Y') }}|{{ strftime_now('%Y-%m-%d') }}|{{ strftime_now('%B %d, %Y') }}|"
        "{{ strftime_now('%A %H:%M:%S') }}|{{ strftime_now('%j %I%p %y %m %a %%') }}",
        {},
    ),
    "generation_tag": (
        "{% for m in messages %}\n"
        "{% if m.role == 'assistant' %}\n"
        "{% generation %}\n"
        "[A]{{ m.content }}\n"
        "{% endgeneration %}\n"
        "{% else %}\n"
        "[{{ m.role }}]{{ m.content }}\n"
        "{% endif %}\n"
        "{% endfor %}\n",
        {},
    ),
    "extra_context": (
        "{{ enable_thinking }}|{{ custom.nested[1] }}|{{ custom['k'] }}|{{ flag is true }}|{{ n + 1 }}|{{ tools | length }}",
        {"enable_thinking": False, "custom": {"nested": [1, "two"], "k": "v"}, "flag": True, "n": 41},
    ),
    "message_fields": (
        "{% for m in messages %}{{ m.role }}|{{ m.name is defined }}|{{ m.get('name', '-') }}|{{ m.tool_calls is defined }}|"
        "{{ m.tool_call_id | default('-') }}|{% if m.tool_calls %}{{ m.tool_calls | tojson }}{% endif %}\n{% endfor %}",
        {},
    ),
}


def cases_for(source, conversations, bos, eos, extra):
    cases = []
    for conv_name in conversations:
        conv = CONVERSATIONS[conv_name]
        for agp in (True, False):
            status, text = render(source, conv["messages"], agp, bos, eos, tools=conv.get("tools"), extra=extra)
            case = {
                "conversation": conv_name,
                "add_generation_prompt": agp,
                "messages": conv["messages"],
            }
            if conv.get("tools") is not None:
                case["tools"] = conv["tools"]
            if status == "ok":
                case["expected"] = text
            else:
                case["error"] = text
            cases.append(case)
    return cases


def write_fixture(name, template_file, source, bos, eos, conversations, extra, out_dir=None):
    fixture = {
        "name": name,
        "template_file": template_file,
        "bos_token": bos,
        "eos_token": eos,
        "now": NOW.isoformat(),
        "extra": extra,
        "cases": cases_for(source, conversations, bos, eos, extra),
    }
    if template_file is None:
        fixture["template"] = source
    path = (out_dir or FIXTURES) / f"{name}.json"
    path.write_text(json.dumps(fixture, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    n_err = sum(1 for c in fixture["cases"] if "error" in c)
    print(f"{path}: {len(fixture['cases'])} cases ({n_err} expected errors)")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--llama-cpp", type=pathlib.Path, help="llama.cpp source tree to copy models/templates from")
    ap.add_argument(
        "--all-into",
        type=pathlib.Path,
        metavar="DIR",
        help="instead: render every template of --llama-cpp into DIR (not committed; for "
        "FERROX_CHAT_TEMPLATE_FIXTURES=DIR cargo test -p ferrox-tokenizer --test chat_template)",
    )
    args = ap.parse_args()

    if args.all_into is not None:
        if args.llama_cpp is None:
            sys.exit("--all-into needs --llama-cpp")
        (args.all_into / "templates").mkdir(parents=True, exist_ok=True)
        for path in sorted((args.llama_cpp / "models" / "templates").glob("*.jinja")):
            shutil.copyfile(path, args.all_into / "templates" / path.name)
            source = path.read_text(encoding="utf-8")
            write_fixture(path.stem, f"templates/{path.name}", source, "<BOS>", "<EOS>", ALL_CONVERSATIONS, {}, args.all_into)
        return

    print(f"jinja2 {jinja2.__version__}")
    TEMPLATES.mkdir(parents=True, exist_ok=True)
    for name, (file, bos, eos, conversations, extra) in MODEL_TEMPLATES.items():
        if name == "chatml":
            source, template_file = CHATML, None
        elif file is None:
            template_file = f"templates/{name}.jinja"
            source = (FIXTURES / template_file).read_text(encoding="utf-8")
        else:
            template_file = f"templates/{file}"
            dest = FIXTURES / template_file
            if args.llama_cpp is not None:
                shutil.copyfile(args.llama_cpp / "models" / "templates" / file, dest)
            if not dest.exists():
                sys.exit(f"{dest} is missing: run with --llama-cpp PATH")
            source = dest.read_text(encoding="utf-8")
        write_fixture(name, template_file, source, bos, eos, conversations, extra)

    for name, (source, extra) in FEATURE_TEMPLATES.items():
        convs = ["tool_call", "system_multi_turn"] if name in ("message_fields", "tojson_filter", "extra_context") else ["system_multi_turn"]
        write_fixture(f"feature-{name}", None, source, "<s>", "</s>", convs, extra)


if __name__ == "__main__":
    main()

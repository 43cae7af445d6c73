"""Constrained output and tool calls through the official `openai` client against a
served Qwen2.5-Coder-0.5B-Instruct: JSON schemas (validated with `jsonschema`), llama.cpp
GBNF grammars, forced tool calls streaming and not, concurrent constrained streams equal
to their solo runs, and hostile requests answered 400 while the server keeps serving.

Usage: openai_client.py BASE_URL GRAMMARS_DIR [API_KEY]
"""

import json
import re
import sys
import threading

import httpx
import jsonschema
import openai

BASE, GRAMMARS = sys.argv[1], sys.argv[2]
KEY = sys.argv[3] if len(sys.argv) > 3 else "unused"
client = openai.OpenAI(base_url=BASE + "/v1", api_key=KEY, max_retries=0, timeout=120)
MODEL = client.models.list().data[0].id


def chat(messages, **kw):
    kw.setdefault("temperature", 0)
    kw.setdefault("max_tokens", 160)
    return client.chat.completions.create(model=MODEL, messages=messages, **kw)


def user(text):
    return [{"role": "user", "content": text}]


S = {"type": "string", "maxLength": 16}
SCHEMAS = [
    ("person", {"type": "object", "properties": {"name": S, "age": {"type": "integer", "minimum": 0, "maximum": 120}}, "required": ["name", "age"], "additionalProperties": False}),
    ("nested", {"type": "object", "properties": {"person": {"type": "object", "properties": {"first": S, "last": S}, "required": ["first", "last"], "additionalProperties": False}}, "required": ["person"], "additionalProperties": False}),
    ("int_array", {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 99}, "minItems": 1, "maxItems": 5}),
    ("enum", {"type": "object", "properties": {"color": {"enum": ["red", "green", "blue"]}}, "required": ["color"], "additionalProperties": False}),
    ("boolean", {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"], "additionalProperties": False}),
    ("integer_range", {"type": "object", "properties": {"celsius": {"type": "integer", "minimum": -50, "maximum": 60}}, "required": ["celsius"], "additionalProperties": False}),
    ("pattern", {"type": "object", "properties": {"code": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{3}$"}}, "required": ["code"], "additionalProperties": False}),
    ("ref", {"$defs": {"point": {"type": "object", "properties": {"x": {"type": "integer", "minimum": -99, "maximum": 99}, "y": {"type": "integer", "minimum": -99, "maximum": 99}}, "required": ["x", "y"], "additionalProperties": False}}, "type": "object", "properties": {"start": {"$ref": "#/$defs/point"}, "end": {"$ref": "#/$defs/point"}}, "required": ["start", "end"], "additionalProperties": False}),
    ("object_array", {"type": "array", "items": {"type": "object", "properties": {"id": {"type": "integer", "minimum": 0, "maximum": 999}, "title": S}, "required": ["id", "title"], "additionalProperties": False}, "minItems": 1, "maxItems": 3}),
    ("const", {"type": "object", "properties": {"version": {"const": 2}, "name": S}, "required": ["version", "name"], "additionalProperties": False}),
    ("any_of", {"type": "object", "properties": {"value": {"anyOf": [{"type": "integer", "minimum": 0, "maximum": 1000}, S]}}, "required": ["value"], "additionalProperties": False}),
    ("nullable", {"type": "object", "properties": {"nickname": {"type": ["string", "null"], "maxLength": 10}}, "required": ["nickname"], "additionalProperties": False}),
    ("email_pattern", {"type": "object", "properties": {"email": {"type": "string", "pattern": "^[a-z]{1,10}@[a-z]{1,10}\\.com$"}}, "required": ["email"], "additionalProperties": False}),
    ("date_format", {"type": "object", "properties": {"day": {"type": "string", "format": "date"}}, "required": ["day"], "additionalProperties": False}),
    ("enums_mixed", {"type": "object", "properties": {"level": {"enum": [1, 2, 3]}, "label": {"type": "string", "enum": ["low", "mid", "high"]}}, "required": ["level", "label"], "additionalProperties": False}),
    ("tuple", {"type": "array", "prefixItems": [{"type": "string", "maxLength": 8}, {"type": "integer", "minimum": 0, "maximum": 99}], "items": False, "minItems": 2}),
    ("deep", {"type": "object", "properties": {"a": {"type": "object", "properties": {"b": {"type": "object", "properties": {"c": {"type": "integer", "minimum": 0, "maximum": 9}}, "required": ["c"], "additionalProperties": False}}, "required": ["b"], "additionalProperties": False}}, "required": ["a"], "additionalProperties": False}),
    ("string_array", {"type": "object", "properties": {"tags": {"type": "array", "items": {"type": "string", "maxLength": 8}, "minItems": 2, "maxItems": 3}}, "required": ["tags"], "additionalProperties": False}),
    ("discriminated", {"anyOf": [{"type": "object", "properties": {"kind": {"const": "circle"}, "r": {"type": "integer", "minimum": 1, "maximum": 9}}, "required": ["kind", "r"], "additionalProperties": False}, {"type": "object", "properties": {"kind": {"const": "square"}, "side": {"type": "integer", "minimum": 1, "maximum": 9}}, "required": ["kind", "side"], "additionalProperties": False}]}),
    ("optional_fields", {"type": "object", "properties": {"title": {"type": "string", "maxLength": 20}, "year": {"type": "integer", "minimum": 1900, "maximum": 2100}, "rating": {"type": "number", "minimum": 0, "maximum": 10}}, "required": ["title", "year"], "additionalProperties": False}),
]


def test_json_schemas():
    assert len(SCHEMAS) == 20
    failures = []

    def one(name, schema):
        try:
            r = chat(user(f"Reply with JSON for a {name.replace('_', ' ')} example."),
                     response_format={"type": "json_schema", "json_schema": {"name": name, "schema": schema, "strict": True}})
            text = r.choices[0].message.content
            assert r.choices[0].finish_reason == "stop", (name, r.choices[0].finish_reason, text)
            jsonschema.validate(json.loads(text), schema)
        except Exception as e:  # noqa: BLE001 - collected and reported below
            failures.append(f"{name}: {e!r}")

    threads = [threading.Thread(target=one, args=s) for s in SCHEMAS]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not failures, "\n".join(failures)
    # json_object, and llama-server's json_schema field.
    r = chat(user("Describe a dog as a JSON object."), response_format={"type": "json_object"})
    assert isinstance(json.loads(r.choices[0].message.content), dict)
    schema = SCHEMAS[0][1]
    r = chat(user("A person as JSON."), extra_body={"json_schema": schema})
    jsonschema.validate(json.loads(r.choices[0].message.content), schema)
    # The legacy completions endpoint takes them too.
    r = client.completions.create(model=MODEL, prompt="A JSON person:", max_tokens=80, temperature=0,
                                  extra_body={"json_schema": schema})
    jsonschema.validate(json.loads(r.choices[0].text), schema)
    print("json schemas: 20 validated, json_object, json_schema field, completions")


def test_grammars():
    def gbnf(name):
        with open(f"{GRAMMARS}/{name}") as f:
            return f.read()

    r = chat(user("Give me a JSON object about a city."), extra_body={"grammar": gbnf("json.gbnf")}, max_tokens=200)
    text = r.choices[0].message.content
    if r.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(text), dict), text
    else:
        assert text.lstrip().startswith("{"), text
    r = chat(user("Write a shopping list."), extra_body={"grammar": gbnf("list.gbnf")}, max_tokens=40)
    lines = r.choices[0].message.content.split("\n")
    assert all(line.startswith("- ") for line in lines[:-1]) and lines[0].startswith("- "), lines
    r = chat(user("Write an equation."), extra_body={"grammar": gbnf("arithmetic.gbnf")}, max_tokens=30)
    assert re.match(r"^[a-z0-9_ \t\n()+*/=-]*$", r.choices[0].message.content), r.choices[0].message.content
    bounded = 'root ::= answer "." \nanswer ::= "yes" | "no" | "maybe"\n'
    for stream in (False, True):
        if stream:
            parts = chat(user("Is the sky blue?"), extra_body={"grammar": bounded}, stream=True)
            text = "".join(c.choices[0].delta.content or "" for c in parts if c.choices)
        else:
            text = chat(user("Is the sky blue?"), extra_body={"grammar": bounded}).choices[0].message.content
        assert text in ("yes.", "no.", "maybe."), text
    print("grammars: json, list, arithmetic, a bounded one streaming and not")


WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Current weather in a city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 30}, "unit": {"enum": ["celsius", "fahrenheit"]}}, "required": ["city", "unit"], "additionalProperties": False}}}
SEARCH = {"type": "function", "function": {"name": "search", "description": "Search the web",
          "parameters": {"type": "object", "properties": {"query": {"type": "string", "maxLength": 40}}, "required": ["query"], "additionalProperties": False}}}
TOOLS = [WEATHER, SEARCH]
SCHEMA_OF = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}


def check_calls(calls, names=None):
    assert calls, "no tool calls"
    for c in calls:
        assert c.type == "function" and c.id.startswith("call_"), c
        assert names is None or c.function.name in names, c
        jsonschema.validate(json.loads(c.function.arguments), SCHEMA_OF[c.function.name])


def stream_calls(**kw):
    calls = {}
    finish = None
    content = ""
    for chunk in chat(stream=True, **kw):
        if not chunk.choices:
            continue
        ch = chunk.choices[0]
        content += ch.delta.content or ""
        for d in ch.delta.tool_calls or []:
            if d.index not in calls:
                assert d.id and d.function.name, d  # id and name come first
                calls[d.index] = {"id": d.id, "name": d.function.name, "arguments": d.function.arguments or ""}
            else:
                assert d.id is None and d.function.name is None, d
                calls[d.index]["arguments"] += d.function.arguments or ""
        if ch.finish_reason:
            finish = ch.finish_reason
    return calls, finish, content


def test_tools():
    msgs = user("Hello! How are you today?")
    # required: some call of some tool, though the message does not ask for one.
    r = chat(msgs, tools=TOOLS, tool_choice="required")
    m = r.choices[0]
    assert m.finish_reason == "tool_calls" and m.message.content is None, m
    check_calls(m.message.tool_calls, {"get_weather", "search"})
    # named
    r = chat(msgs, tools=TOOLS, tool_choice={"type": "function", "function": {"name": "search"}}, parallel_tool_calls=False)
    calls = r.choices[0].message.tool_calls
    check_calls(calls, {"search"})
    assert len(calls) == 1
    # streaming: OpenAI's delta shape, the same calls as without streaming
    streamed, finish, content = stream_calls(messages=msgs, tools=TOOLS, tool_choice={"type": "function", "function": {"name": "search"}}, parallel_tool_calls=False)
    assert finish == "tool_calls" and content == "", (finish, content)
    assert [(c["name"], json.loads(c["arguments"])) for c in streamed.values()] == [(c.function.name, json.loads(c.function.arguments)) for c in calls]
    streamed, finish, _ = stream_calls(messages=msgs, tools=TOOLS, tool_choice="required")
    assert finish == "tool_calls"
    for c in streamed.values():
        jsonschema.validate(json.loads(c["arguments"]), SCHEMA_OF[c["name"]])
    # auto: a question the weather tool answers
    r = chat(user("What is the weather in Paris, in celsius?"), tools=TOOLS)
    m = r.choices[0]
    if m.message.tool_calls:
        assert m.finish_reason == "tool_calls"
        assert m.message.tool_calls[0].function.name == "get_weather"
    # The round trip: the call and its result go back through the template.
    call = m.message.tool_calls[0] if m.message.tool_calls else calls[0]
    history = user("What is the weather in Paris, in celsius?") + [
        {"role": "assistant", "content": None, "tool_calls": [{"id": call.id, "type": "function", "function": {"name": call.function.name, "arguments": call.function.arguments}}]},
        {"role": "tool", "tool_call_id": call.id, "content": json.dumps({"temperature": 21, "sky": "clear"})},
    ]
    r = chat(history, tools=TOOLS, max_tokens=60)
    assert r.choices[0].message.content or r.choices[0].message.tool_calls
    # none: no call is parsed
    r = chat(msgs, tools=TOOLS, tool_choice="none", max_tokens=20)
    assert not r.choices[0].message.tool_calls
    print("tools: required, named, streaming deltas, auto, round trip, none")


def test_reasoning():
    # A grammar makes the small model write a thinking block, as thinking models do.
    g = 'root ::= "<think>" [a-z ]{3,20} "</think>" "\\n\\nFinal answer."\n'
    m = chat(user("Think, then answer."), extra_body={"grammar": g}, max_tokens=40).choices[0].message
    reasoning = getattr(m, "reasoning_content", None)
    assert m.content == "Final answer." and reasoning and "<" not in reasoning, m
    parts = {"content": "", "reasoning": ""}
    for c in chat(user("Think, then answer."), extra_body={"grammar": g}, max_tokens=40, stream=True):
        if c.choices:
            parts["content"] += c.choices[0].delta.content or ""
            parts["reasoning"] += getattr(c.choices[0].delta, "reasoning_content", None) or ""
    assert parts == {"content": m.content, "reasoning": reasoning}, (parts, m)
    m = chat(user("Think, then answer."), extra_body={"grammar": g, "reasoning_format": "none"}, max_tokens=40).choices[0].message
    assert m.content.startswith("<think>") and not getattr(m, "reasoning_content", None), m
    print("reasoning: reasoning_content split off, streaming and not; reasoning_format none")


def test_concurrent_equals_solo():
    reqs = []
    for i in range(8):
        name, schema = SCHEMAS[i]
        reqs.append(dict(messages=user(f"JSON for {name} number {i}"), temperature=0.9, seed=100 + i, max_tokens=48,
                         response_format={"type": "json_schema", "json_schema": {"name": name, "schema": schema}}))

    def run(kw):
        return "".join(c.choices[0].delta.content or "" for c in chat(stream=True, **kw) if c.choices)

    solo = [run(kw) for kw in reqs]
    together = [None] * len(reqs)

    def worker(i):
        together[i] = run(reqs[i])

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(len(reqs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert together == solo, (together, solo)
    print("8 concurrent constrained streams equal their solo runs")


def expect_400(body, needle, param=None):
    r = httpx.post(BASE + "/v1/chat/completions", content=body if isinstance(body, bytes) else json.dumps(body),
                   headers={"content-type": "application/json", "authorization": f"Bearer {KEY}"}, timeout=60)
    assert r.status_code == 400, (r.status_code, r.text)
    err = r.json()["error"]
    assert needle in err["message"], (needle, err)
    if param:
        assert err["param"] == param, err


def test_errors():
    base = {"model": MODEL, "messages": user("hi"), "max_tokens": 5}
    expect_400({**base, "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nonsense"}}}}, "JSON schema", "response_format")
    expect_400({**base, "grammar": "root ::= missing"}, "undefined rule `missing`", "grammar")
    expect_400({**base, "grammar": "root ::= \"a" + "b" * (1100 * 1024) + "\""}, "limit", "grammar")
    expect_400({**base, "tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "launch"}}}, "'launch'", "tool_choice")
    expect_400({**base, "tool_choice": "required"}, "no 'tools'", "tool_choice")
    expect_400({**base, "tools": [{"type": "function", "function": {"name": "bad name!"}}]}, "invalid function name", "tools[0]")
    expect_400(b'{"messages": [{"role": "user", "content": "\xff\xfe"}]}', "invalid JSON")
    # Still serving.
    assert chat(user("Say hi."), max_tokens=3).choices[0].message.content is not None
    print("errors: bad schema, bad grammar, huge grammar, unknown tool, invalid UTF-8 -> 400")


for test in (test_errors, test_json_schemas, test_grammars, test_tools, test_reasoning, test_concurrent_equals_solo):
    test()
print("OK")

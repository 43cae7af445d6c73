"""The Messages API through the official `anthropic` client against a served
Qwen2.5-Coder-0.5B-Instruct: text, streaming (the SDK checks the event sequence), a tool-use
round trip, stop sequences, token counting, and errors in Anthropic's shape.

Usage: anthropic_client.py BASE_URL API_KEY
"""

import json
import sys

import anthropic
import httpx

BASE, KEY = sys.argv[1], sys.argv[2]
client = anthropic.Anthropic(base_url=BASE, api_key=KEY, max_retries=0, timeout=120)
MODEL = "claude-test"

WEATHER = {"name": "get_weather", "description": "Current weather in a city",
           "input_schema": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 30}}, "required": ["city"], "additionalProperties": False}}


def test_text():
    m = client.messages.create(model=MODEL, max_tokens=24, extra_body={"temperature": 0}, system="You are terse.",
                               messages=[{"role": "user", "content": "Say hello."}])
    assert m.type == "message" and m.role == "assistant" and m.model == MODEL, m
    assert m.id.startswith("msg_")
    assert m.content and m.content[0].type == "text" and m.content[0].text, m
    assert m.stop_reason in ("end_turn", "max_tokens"), m
    assert m.usage.input_tokens > 0 and m.usage.output_tokens > 0
    m = client.messages.create(model=MODEL, max_tokens=5, extra_body={"temperature": 0},
                               messages=[{"role": "user", "content": "Count from 1 to 50, separated by spaces."}])
    assert m.stop_reason == "max_tokens" and m.usage.output_tokens == 5, m
    m = client.messages.create(model=MODEL, max_tokens=60, extra_body={"temperature": 0}, stop_sequences=["5"],
                               messages=[{"role": "user", "content": "Count from 1 to 10, separated by spaces."}])
    assert m.stop_reason == "stop_sequence" and m.stop_sequence == "5", m
    assert "5" not in m.content[0].text, m
    print("text: content, usage, max_tokens, stop_sequence")


def test_streaming():
    kinds = []
    with client.messages.stream(model=MODEL, max_tokens=24, extra_body={"temperature": 0},
                                messages=[{"role": "user", "content": "Say hello."}]) as stream:
        for event in stream:
            kinds.append(event.type)
        final = stream.get_final_message()
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop", kinds
    assert "content_block_start" in kinds and "content_block_delta" in kinds and "message_delta" in kinds, kinds
    plain = client.messages.create(model=MODEL, max_tokens=24, extra_body={"temperature": 0},
                                   messages=[{"role": "user", "content": "Say hello."}])
    assert final.content[0].text == plain.content[0].text, (final.content, plain.content)
    assert final.stop_reason == plain.stop_reason
    print("streaming: event sequence, same text as without")


def test_tool_use_round_trip():
    question = {"role": "user", "content": "What is the weather in Oslo?"}
    for stream in (False, True):
        kw = dict(model=MODEL, max_tokens=80, extra_body={"temperature": 0}, tools=[WEATHER],
                  tool_choice={"type": "tool", "name": "get_weather"}, messages=[question])
        if stream:
            with client.messages.stream(**kw) as s:
                for _ in s:
                    pass
                m = s.get_final_message()
        else:
            m = client.messages.create(**kw)
        assert m.stop_reason == "tool_use", m
        uses = [b for b in m.content if b.type == "tool_use"]
        assert uses and uses[0].name == "get_weather" and uses[0].id.startswith("toolu_"), m
        assert isinstance(uses[0].input, dict) and isinstance(uses[0].input.get("city"), str), uses[0]
    use = uses[0]
    m = client.messages.create(model=MODEL, max_tokens=60, extra_body={"temperature": 0}, tools=[WEATHER], messages=[
        question,
        {"role": "assistant", "content": [{"type": "tool_use", "id": use.id, "name": use.name, "input": use.input}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": json.dumps({"sky": "clear", "celsius": 12})}]},
    ])
    assert m.content, m
    # "any": some tool call even without a reason to.
    m = client.messages.create(model=MODEL, max_tokens=80, extra_body={"temperature": 0}, tools=[WEATHER], tool_choice={"type": "any"},
                               messages=[{"role": "user", "content": "Hi!"}])
    assert m.stop_reason == "tool_use", m
    print("tool use: forced call streaming and not, result round trip, any")


def test_structured_output():
    schema = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}, "population": {"type": "integer", "minimum": 0, "maximum": 100000000}}, "required": ["city", "population"], "additionalProperties": False}
    m = client.messages.create(model=MODEL, max_tokens=60, extra_body={"temperature": 0},
                               output_config={"format": {"type": "json_schema", "schema": schema}},
                               messages=[{"role": "user", "content": "A large city as JSON."}])
    value = json.loads(m.content[0].text)
    assert set(value) == {"city", "population"}, value
    print("structured output (output_config.format)")


def test_thinking_blocks():
    # A grammar makes the small model write a thinking block, as thinking models do.
    g = 'root ::= "<think>" [a-z ]{3,20} "</think>" "\\n\\nDone."\n'
    kw = dict(model=MODEL, max_tokens=40, messages=[{"role": "user", "content": "Think first."}],
              extra_body={"temperature": 0, "grammar": g})
    m = client.messages.create(**kw)
    assert [b.type for b in m.content] == ["thinking", "text"], m.content
    assert m.content[0].thinking and m.content[1].text == "Done.", m.content
    with client.messages.stream(**kw) as s:
        for _ in s:
            pass
        streamed = s.get_final_message()
    assert [b.type for b in streamed.content] == ["thinking", "text"], streamed.content
    assert streamed.content[0].thinking == m.content[0].thinking and streamed.content[1].text == "Done."
    print("thinking blocks, streaming and not")


def test_count_tokens():
    n = client.messages.count_tokens(model=MODEL, messages=[{"role": "user", "content": "Say hello."}])
    longer = client.messages.count_tokens(model=MODEL, messages=[{"role": "user", "content": "Say hello to everyone here, please."}])
    assert 0 < n.input_tokens < longer.input_tokens, (n, longer)
    print("count_tokens")


def test_errors():
    try:
        client.messages.create(model=MODEL, max_tokens=10, messages=[{"role": "system", "content": "x"}])
        raise AssertionError("no error")
    except anthropic.BadRequestError as e:
        assert e.status_code == 400 and e.body["type"] == "error", e.body
        assert e.body["error"]["type"] == "invalid_request_error", e.body
    try:
        client.messages.create(model=MODEL, max_tokens=10, messages=[{"role": "user", "content": "x"}], tools=[WEATHER],
                               tool_choice={"type": "tool", "name": "launch_rocket"})
        raise AssertionError("no error")
    except anthropic.BadRequestError as e:
        assert "launch_rocket" in e.body["error"]["message"], e.body
    bad = anthropic.Anthropic(base_url=BASE, api_key="wrong", max_retries=0)
    try:
        bad.messages.create(model=MODEL, max_tokens=10, messages=[{"role": "user", "content": "x"}])
        raise AssertionError("no error")
    except anthropic.AuthenticationError as e:
        assert e.body["error"]["type"] == "authentication_error", e.body
    r = httpx.post(BASE + "/v1/messages", content=b"{not json", headers={"x-api-key": KEY, "content-type": "application/json"})
    assert r.status_code == 400 and r.json()["type"] == "error", r.text
    # Bearer works as well as x-api-key.
    r = httpx.post(BASE + "/v1/messages/count_tokens", json={"model": MODEL, "messages": [{"role": "user", "content": "x"}]},
                   headers={"authorization": f"Bearer {KEY}"})
    assert r.status_code == 200 and r.json()["input_tokens"] > 0, r.text
    print("errors: bad role, unknown tool, bad key, bad JSON; Bearer accepted")


for test in (test_errors, test_text, test_streaming, test_tool_use_round_trip, test_structured_output, test_thinking_blocks, test_count_tokens):
    test()
print("OK")

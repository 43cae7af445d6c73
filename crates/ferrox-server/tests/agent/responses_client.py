"""The Responses API through the official `openai` client against a served
Qwen2.5-Coder-0.5B-Instruct: plain, with instructions, streamed (the event sequence and the
stream helper), a function tool round trip, a json_schema format, a second turn by
`previous_response_id`, retrieval and deletion, `store: false`. Greedy replies must equal the
chat completions of the same conversation.

Usage: responses_client.py BASE_URL [API_KEY]
"""

import json
import sys

import httpx
import jsonschema
import openai

BASE = sys.argv[1]
KEY = sys.argv[2] if len(sys.argv) > 2 else "unused"
client = openai.OpenAI(base_url=BASE + "/v1", api_key=KEY, max_retries=0, timeout=120)
raw = httpx.Client(base_url=BASE, headers={"Authorization": f"Bearer {KEY}"}, timeout=120)
MODEL = client.models.list().data[0].id


def respond(**kw):
    kw.setdefault("temperature", 0)
    kw.setdefault("max_output_tokens", 40)
    return client.responses.create(model=MODEL, **kw)


def chat_text(messages, max_tokens=40):
    r = client.chat.completions.create(model=MODEL, messages=messages, temperature=0, max_tokens=max_tokens)
    return r.choices[0].message.content


def test_plain_equals_chat():
    r = respond(input="Name one colour of the rainbow.")
    assert r.id.startswith("resp_") and r.object == "response", r
    assert r.status in ("completed", "incomplete"), r.status
    assert [o.type for o in r.output] == ["message"], r.output
    assert r.output_text and r.output_text == chat_text([{"role": "user", "content": "Name one colour of the rainbow."}])
    assert r.usage.input_tokens > 0 and r.usage.output_tokens > 0
    assert r.usage.total_tokens == r.usage.input_tokens + r.usage.output_tokens
    short = respond(input="Count from one to twenty in words.", max_output_tokens=3)
    assert short.status == "incomplete" and short.incomplete_details.reason == "max_output_tokens", short


def test_instructions_are_the_system_message():
    r = respond(instructions="Answer in French.", input="What is the capital of Italy?")
    expected = chat_text([{"role": "system", "content": "Answer in French."},
                          {"role": "user", "content": "What is the capital of Italy?"}])
    assert r.output_text == expected, (r.output_text, expected)
    assert r.instructions == "Answer in French."


def test_streaming_events():
    plain = respond(input="Say hello to Bob.")
    events = list(respond(input="Say hello to Bob.", stream=True))
    kinds = [e.type for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"], kinds
    assert kinds[2:4] == ["response.output_item.added", "response.content_part.added"], kinds
    assert kinds[-4:] == ["response.output_text.done", "response.content_part.done",
                          "response.output_item.done", "response.completed"], kinds
    assert [e.sequence_number for e in events] == list(range(len(events)))
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == plain.output_text, (text, plain.output_text)
    assert events[-1].response.output_text == plain.output_text
    with client.responses.stream(model=MODEL, input="Say hello to Bob.", temperature=0, max_output_tokens=40) as s:
        final = s.get_final_response()
    assert final.output_text == plain.output_text


WEATHER = {"type": "function", "name": "get_weather", "description": "Current weather in a city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                          "required": ["city"], "additionalProperties": False}}


def test_function_tool_round_trip():
    for stream in (False, True):
        kw = dict(input="What is the weather in Paris?", tools=[WEATHER], tool_choice="required")
        if stream:
            with client.responses.stream(model=MODEL, temperature=0, max_output_tokens=80, **kw) as s:
                kinds = [e.type for e in s]
                first = s.get_final_response()
            assert "response.function_call_arguments.delta" in kinds, kinds
        else:
            first = respond(max_output_tokens=80, **kw)
        calls = [o for o in first.output if o.type == "function_call"]
        assert calls and calls[0].name == "get_weather", first.output
        args = json.loads(calls[0].arguments)
        assert "city" in args, args
        second = respond(previous_response_id=first.id, tools=[WEATHER], tool_choice="none",
                         input=[{"type": "function_call_output", "call_id": calls[0].call_id, "output": "sunny, 21 C"}])
        assert second.output_text and second.previous_response_id == first.id, second
        # The same conversation through chat completions.
        chat_calls = [{"id": c.call_id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}} for c in calls]
        expected = client.chat.completions.create(
            model=MODEL, temperature=0, max_tokens=40, tool_choice="none",
            tools=[{"type": "function", "function": {k: WEATHER[k] for k in ("name", "description", "parameters")}}],
            messages=[{"role": "user", "content": "What is the weather in Paris?"},
                      {"role": "assistant", "content": None, "tool_calls": chat_calls},
                      {"role": "tool", "tool_call_id": calls[0].call_id, "content": "sunny, 21 C"}],
        ).choices[0].message.content
        assert second.output_text == expected, (second.output_text, expected)


def test_json_schema_format():
    schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 16},
              "age": {"type": "integer", "minimum": 0, "maximum": 120}},
              "required": ["name", "age"], "additionalProperties": False}
    r = respond(input="Invent a person.", max_output_tokens=60,
                text={"format": {"type": "json_schema", "name": "person", "schema": schema, "strict": True}})
    jsonschema.validate(json.loads(r.output_text), schema)


def test_previous_response_continues_the_conversation():
    first = respond(input="My name is Ada. Reply with one word.", max_output_tokens=8)
    second = respond(previous_response_id=first.id, input="What is my name?")
    expected = chat_text([{"role": "user", "content": "My name is Ada. Reply with one word."},
                          {"role": "assistant", "content": first.output_text},
                          {"role": "user", "content": "What is my name?"}])
    assert second.output_text == expected, (second.output_text, expected)


def test_retrieve_delete_and_store_false():
    r = respond(input="Say yes.", max_output_tokens=4)
    got = client.responses.retrieve(r.id)
    assert got.id == r.id and got.output_text == r.output_text
    deleted = raw.delete(f"/v1/responses/{r.id}")
    assert deleted.status_code == 200 and deleted.json()["deleted"] is True, deleted.text
    assert raw.get(f"/v1/responses/{r.id}").status_code == 404
    unstored = respond(input="Say no.", max_output_tokens=4, store=False)
    assert raw.get(f"/v1/responses/{unstored.id}").status_code == 404
    missing = raw.post("/v1/responses", json={"model": MODEL, "input": "x", "previous_response_id": unstored.id})
    assert missing.status_code == 404, missing.text
    for body in [{"model": MODEL}, {"model": MODEL, "input": [{"type": "input_image"}]},
                 {"model": MODEL, "input": "x", "tools": [{"type": "web_search"}]}]:
        bad = raw.post("/v1/responses", json=body)
        assert bad.status_code == 400, (body, bad.text)


for name, fn in list(globals().items()):
    if name.startswith("test_"):
        fn()
        print("ok  ", name)
print("OK")

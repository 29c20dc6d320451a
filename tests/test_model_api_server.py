"""The counting model API server (tests/servers/model_api.py) against the OpenAI and Anthropic SDKs' own types.

Every JSON body and SSE event is validated with the SDKs' pydantic types, with no field the type does not know;
then the real SDK clients talk to it end to end: plain, streamed, parsed, tool calls, errors and retries."""

from __future__ import annotations

import asyncio
import base64
import http.client
import json
import struct
import subprocess
import sys
import time
import urllib.request
from typing import Any

import pytest
from conftest import REPO, need_module
from servers._proc import stop_process_group
from servers.model_api import start

openai = need_module("openai", whole_module=True)
pydantic = need_module("pydantic", whole_module=True)
from openai.types import Completion, CreateEmbeddingResponse  # noqa: E402
from openai.types.chat import ChatCompletion, ChatCompletionChunk  # noqa: E402
from openai.types.responses import Response, ResponseStreamEvent  # noqa: E402
from openai.types.shared import ErrorObject  # noqa: E402

USER = [{"role": "user", "content": "Name three rivers please"}]
TOOL = {"name": "get_weather", "description": "Weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                       "required": ["city", "days"], "additionalProperties": False}}
CALL = [{"role": "user", "content": "CALL_TOOL for Paris"}]




@pytest.fixture
def anthropic():
    return need_module("anthropic")


def client(api, **kw: Any):
    return openai.OpenAI(base_url=api.url + "/v1", api_key="x", max_retries=kw.pop("max_retries", 0), **kw)


def aclient(api, anthropic, **kw: Any):
    return anthropic.Anthropic(base_url=api.url, api_key="x", max_retries=kw.pop("max_retries", 0), **kw)


# ---- raw HTTP and strict validation ----------------------------------------------------------------------------------

def post(api, path: str, body: dict) -> tuple[int, dict[str, str], bytes]:
    request = urllib.request.Request(api.url + path, data=json.dumps(body).encode(), method="POST",
                                     headers={"content-type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, {k.lower(): v for k, v in response.headers.items()}, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, {k.lower(): v for k, v in exc.headers.items()}, exc.read()


def sse(raw: bytes) -> list[tuple[str | None, Any]]:
    """(event name, parsed data) per SSE event; "[DONE]" stays a string."""
    events = []
    for block in raw.decode().split("\n\n"):
        if not block.strip():
            continue
        name, data = None, []
        for line in block.split("\n"):
            field, _, value = line.partition(": ")
            if field == "event":
                name = value
            elif field == "data":
                data.append(value)
        text = "\n".join(data)
        events.append((name, text if text == "[DONE]" else json.loads(text)))
    return events


def exact(obj: Any, data: Any, where: str = "$") -> None:
    """Every key in ``data`` is a declared field of the validated SDK model (recursively): nothing the SDK ignores."""
    if isinstance(obj, pydantic.BaseModel):
        assert not obj.model_extra, f"{where}: fields unknown to {type(obj).__name__}: {sorted(obj.model_extra)}"
        by_key = {(f.alias or name): name for name, f in type(obj).model_fields.items()}
        for key, value in data.items():
            assert key in by_key, f"{where}.{key} is not a field of {type(obj).__name__}"
            exact(getattr(obj, by_key[key]), value, f"{where}.{key}")
    elif isinstance(obj, list) and isinstance(data, list):
        assert len(obj) == len(data)
        for i, (o, d) in enumerate(zip(obj, data)):
            exact(o, d, f"{where}[{i}]")
    elif isinstance(obj, dict) and isinstance(data, dict):
        for key in data:
            exact(obj.get(key), data[key], f"{where}.{key}")


def validate(kind: Any, data: Any) -> Any:
    """Validate with a model class or a TypeAdapter (strict pydantic validation, unlike the SDKs' lenient construct)."""
    obj = kind.validate_python(data) if isinstance(kind, pydantic.TypeAdapter) else kind.model_validate(data)
    exact(obj, data)
    return obj


# ---- every payload against the SDK types -----------------------------------------------------------------------------

def test_chat_plain_and_stream_match_the_sdk_types(api):
    status, headers, raw = post(api, "/v1/chat/completions", {"model": "m", "messages": USER})
    assert status == 200 and headers["content-type"] == "application/json" and headers["x-request-id"].startswith("req_")
    plain = validate(ChatCompletion, json.loads(raw))
    text = plain.choices[0].message.content
    assert text.startswith("Name three rivers ") and 9 <= plain.usage.completion_tokens <= 15
    assert plain.choices[0].finish_reason == "stop" and plain.id.startswith("chatcmpl-")

    status, headers, raw = post(api, "/v1/chat/completions", {"model": "m", "messages": USER, "stream": True,
                                                              "stream_options": {"include_usage": True}})
    assert status == 200 and headers["content-type"].startswith("text/event-stream")
    events = sse(raw)
    assert events[-1] == (None, "[DONE]")
    chunks = [validate(ChatCompletionChunk, data) for _, data in events[:-1]]
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == text
    assert chunks[-2].choices[0].finish_reason == "stop"
    assert chunks[-1].choices == [] and chunks[-1].usage == plain.usage
    assert all(c.usage is None for c in chunks[:-1])

    _, _, raw = post(api, "/v1/chat/completions", {"model": "m", "messages": USER, "stream": True})
    assert all("usage" not in data for _, data in sse(raw)[:-1])


def test_completions_plain_and_stream_match_the_sdk_types(api):
    body = {"model": "m", "prompt": "Once upon a time"}
    plain = validate(Completion, json.loads(post(api, "/v1/completions", body)[2]))
    assert plain.choices[0].text.startswith("Once upon a") and plain.choices[0].finish_reason == "stop"
    events = sse(post(api, "/v1/completions", {**body, "stream": True, "stream_options": {"include_usage": True}})[2])
    assert events[-1] == (None, "[DONE]")
    # the SDK types finish_reason as never null, but streamed completions (OpenAI's, vLLM's) send null until the end
    for _, data in events[:-3]:
        assert data["choices"][0]["finish_reason"] is None
        data["choices"][0]["finish_reason"] = "stop"
    chunks = [validate(Completion, data) for _, data in events[:-1]]
    assert "".join(c.choices[0].text for c in chunks if c.choices) == plain.choices[0].text
    assert chunks[-1].usage == plain.usage


def test_responses_plain_and_stream_match_the_sdk_types(api):
    body = {"model": "m", "input": USER, "instructions": "be brief"}
    status, headers, raw = post(api, "/v1/responses", body)
    plain = validate(Response, json.loads(raw))
    assert plain.output_text.startswith("Name three rivers") and plain.status == "completed"
    assert plain.usage.input_tokens_details.cached_tokens == 0 and plain.usage.output_tokens_details.reasoning_tokens == 0
    adapter = pydantic.TypeAdapter(ResponseStreamEvent)
    events = sse(post(api, "/v1/responses", {**body, "stream": True})[2])
    for name, data in events:
        assert name == data["type"]
        validate(adapter, data)
    names = [name for name, _ in events]
    deltas = names.count("response.output_text.delta")
    assert names == ["response.created", "response.in_progress", "response.output_item.added",
                     "response.content_part.added", *["response.output_text.delta"] * deltas,
                     "response.output_text.done", "response.content_part.done", "response.output_item.done",
                     "response.completed"]
    assert [data["sequence_number"] for _, data in events] == list(range(len(events)))
    assert "".join(d["delta"] for n, d in events if n == "response.output_text.delta") == plain.output_text
    assert events[-1][1]["response"] == json.loads(raw)


def test_embeddings_match_the_sdk_types(api):
    body = {"model": "e", "input": ["one", "two"], "encoding_format": "float", "dimensions": 16}
    floats = validate(CreateEmbeddingResponse, json.loads(post(api, "/v1/embeddings", body)[2]))
    assert [d.index for d in floats.data] == [0, 1] and len(floats.data[0].embedding) == 16
    encoded = json.loads(post(api, "/v1/embeddings", {**body, "encoding_format": "base64"})[2])
    vector = struct.unpack("<16f", base64.b64decode(encoded["data"][0]["embedding"]))
    assert list(vector) == floats.data[0].embedding


def test_anthropic_plain_and_stream_match_the_sdk_types(api, anthropic):
    body = {"model": "claude-x", "max_tokens": 50, "messages": USER, "system": "be brief"}
    status, headers, raw = post(api, "/v1/messages", body)
    assert headers["request-id"] == headers["x-request-id"]
    plain = validate(anthropic.types.Message, json.loads(raw))
    assert plain.content[0].text.startswith("Name three rivers") and plain.stop_reason == "end_turn"
    assert plain.usage.cache_read_input_tokens == 0 and plain.usage.cache_creation_input_tokens == 0
    adapter = pydantic.TypeAdapter(anthropic.types.RawMessageStreamEvent)
    events = sse(post(api, "/v1/messages?beta=true", {**body, "stream": True})[2])
    names = [name for name, _ in events]
    deltas = names.count("content_block_delta")
    assert names == ["message_start", "content_block_start", "ping", *["content_block_delta"] * deltas,
                     "content_block_stop", "message_delta", "message_stop"]
    for name, data in events:
        assert name == data["type"]
        if name != "ping":  # ping is not in RawMessageStreamEvent: the SDK skips it by its event name
            validate(adapter, data)
    assert "".join(d["delta"]["text"] for n, d in events if n == "content_block_delta") == plain.content[0].text
    assert events[-2][1]["usage"]["output_tokens"] == plain.usage.output_tokens


def test_error_bodies_match_the_sdk_types(api, anthropic):
    api.fail_next(429, times=2)
    status, headers, raw = post(api, "/v1/chat/completions", {"model": "m", "messages": USER})
    assert status == 429 and headers["retry-after"] == "0"
    validate(ErrorObject, json.loads(raw)["error"])
    status, headers, raw = post(api, "/v1/messages", {"model": "c", "max_tokens": 5, "messages": USER})
    assert status == 429 and headers["retry-after"] == "0"
    assert validate(anthropic.types.ErrorResponse, json.loads(raw)).error.type == "rate_limit_error"
    status, _, raw = post(api, "/v1/nothing", {})
    assert status == 404 and validate(ErrorObject, json.loads(raw)["error"])
    assert api.count() == 2


# ---- tool calls ------------------------------------------------------------------------------------------------------

def test_chat_tool_call(api):
    c = client(api)
    tools = [{"type": "function", "function": TOOL}]
    body = {"model": "m", "messages": CALL, "tools": tools}
    validate(ChatCompletion, json.loads(post(api, "/v1/chat/completions", body)[2]))
    for _, data in sse(post(api, "/v1/chat/completions", {**body, "stream": True})[2])[:-1]:
        validate(ChatCompletionChunk, data)
    choice = c.chat.completions.create(**body).choices[0]
    call = choice.message.tool_calls[0]
    assert choice.finish_reason == "tool_calls" and call.function.name == "get_weather"
    assert set(json.loads(call.function.arguments)) == {"city", "days"}
    with c.chat.completions.stream(**body) as stream:
        final = stream.get_final_completion()
    assert final.choices[0].message.tool_calls[0].function.arguments == call.function.arguments
    answer = c.chat.completions.create(model="m", tools=tools, messages=[
        *CALL, choice.message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": "sunny"}])
    assert answer.choices[0].finish_reason == "stop" and answer.choices[0].message.content
    assert c.chat.completions.create(model="m", tools=tools, messages=USER).choices[0].finish_reason == "stop"


def test_responses_tool_call(api):
    c = client(api)
    body = {"model": "m", "input": CALL, "tools": [{"type": "function", **TOOL}]}
    validate(Response, json.loads(post(api, "/v1/responses", body)[2]))
    adapter = pydantic.TypeAdapter(ResponseStreamEvent)
    events = sse(post(api, "/v1/responses", {**body, "stream": True})[2])
    for _, data in events:
        validate(adapter, data)
    assert "response.function_call_arguments.done" in [name for name, _ in events]
    item = c.responses.create(**body).output[0]
    assert item.type == "function_call" and item.name == "get_weather" and json.loads(item.arguments)["city"]
    with c.responses.stream(**body) as stream:
        assert stream.get_final_response().output[0].arguments == item.arguments
    after = c.responses.create(model="m", tools=body["tools"], input=[
        *CALL, item.model_dump(exclude_none=True), {"type": "function_call_output", "call_id": item.call_id,
                                                    "output": "sunny"}])
    assert after.output[0].type == "message" and after.output_text


def test_anthropic_tool_call(api, anthropic):
    a = aclient(api, anthropic)
    tools = [{"name": TOOL["name"], "description": TOOL["description"], "input_schema": TOOL["parameters"]}]
    body = {"model": "claude-x", "max_tokens": 50, "messages": CALL, "tools": tools}
    validate(anthropic.types.Message, json.loads(post(api, "/v1/messages", body)[2]))
    adapter = pydantic.TypeAdapter(anthropic.types.RawMessageStreamEvent)
    for name, data in sse(post(api, "/v1/messages", {**body, "stream": True})[2]):
        if name != "ping":
            validate(adapter, data)
    message = a.messages.create(**body)
    block = message.content[0]
    assert message.stop_reason == "tool_use" and block.type == "tool_use" and set(block.input) == {"city", "days"}
    with a.messages.stream(**body) as stream:
        assert stream.get_final_message().content[0].input == block.input
    after = a.messages.create(model="claude-x", max_tokens=50, tools=tools, messages=[
        *CALL, {"role": "assistant", "content": [block.model_dump()]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": block.id, "content": "sunny"}]}])
    assert after.stop_reason == "end_turn" and after.content[0].type == "text"


# ---- the SDK clients end to end --------------------------------------------------------------------------------------

def test_openai_sdk_end_to_end(api):
    c = client(api)
    plain = c.chat.completions.create(model="m", messages=USER)
    stream = list(c.chat.completions.create(model="m", messages=USER, stream=True, stream_options={"include_usage": True}))
    assert "".join(ch.choices[0].delta.content or "" for ch in stream if ch.choices) == plain.choices[0].message.content
    assert stream[-1].usage.completion_tokens == plain.usage.completion_tokens
    raw = c.chat.completions.with_raw_response.create(model="m", messages=USER)
    assert raw.headers["x-request-id"].startswith("req_") and raw.request_id == raw.headers["x-request-id"]
    assert raw.parse().choices[0].message.content == plain.choices[0].message.content

    response = c.responses.create(model="m", input="Name three rivers please")
    with c.responses.stream(model="m", input="Name three rivers please") as s:
        deltas = [e.delta for e in s if e.type == "response.output_text.delta"]
        final = s.get_final_response()
    assert final.output_text == response.output_text == "".join(deltas)
    assert response.output_text.startswith("Name three rivers")

    completion = c.completions.create(model="m", prompt="Once upon a time", max_tokens=20)
    assert completion.choices[0].text.startswith("Once upon a")
    vectors = c.embeddings.create(model="e", input=["one", "two"])  # the SDK asks for base64 and decodes it
    assert len(vectors.data) == 2 and len(vectors.data[0].embedding) == 8
    assert vectors.data[0].embedding == c.embeddings.create(model="e", input="one", encoding_format="float").data[0].embedding
    assert [m.id for m in c.models.list()] == ["counting-model"]


def test_structured_output_parse(api):
    class City(pydantic.BaseModel):
        name: str
        population: int

    class Trip(pydantic.BaseModel):
        title: str
        days: int
        budget: float
        booked: bool
        tags: list[str]
        city: City
        note: str | None

    c = client(api)
    parsed = c.chat.completions.parse(model="m", messages=USER, response_format=Trip).choices[0].message.parsed
    assert isinstance(parsed, Trip) and isinstance(parsed.city, City) and parsed.booked is True
    again = c.responses.parse(model="m", input="plan a trip", text_format=Trip).output_parsed
    assert isinstance(again, Trip)
    with c.chat.completions.stream(model="m", messages=USER, response_format=Trip) as s:
        assert s.get_final_completion().choices[0].message.parsed == parsed


def test_async_openai(api):
    async def go() -> tuple[str, str]:
        async with openai.AsyncOpenAI(base_url=api.url + "/v1", api_key="x", max_retries=0) as c:
            plain = await c.chat.completions.create(model="m", messages=USER)
            stream = await c.chat.completions.create(model="m", messages=USER, stream=True)
            text = "".join([ch.choices[0].delta.content or "" async for ch in stream if ch.choices])
            return plain.choices[0].message.content, text

    plain, streamed = asyncio.run(go())
    assert plain == streamed


def test_anthropic_sdk_end_to_end(api, anthropic):
    a = aclient(api, anthropic)
    body = {"model": "claude-x", "max_tokens": 50, "messages": USER}
    message = a.messages.create(**body)
    with a.messages.stream(**body) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert final.content[0].text == text == message.content[0].text
    assert final.usage.output_tokens == message.usage.output_tokens and final.id == message.id
    assert a.beta.messages.create(**body).content[0].text == text
    assert api.requests[-1]["path"] == "/v1/messages"

    class Reply(pydantic.BaseModel):
        answer: str
        score: int

    assert isinstance(a.messages.parse(**body, output_format=Reply).parsed_output, Reply)


# ---- determinism, counting, failures, streaming delay ----------------------------------------------------------------

def test_answers_are_a_function_of_the_request_content_only(api):
    for path, body in [("/v1/chat/completions", {"model": "m", "messages": USER}),
                       ("/v1/responses", {"model": "m", "input": USER}),
                       ("/v1/completions", {"model": "m", "prompt": "Once"}),
                       ("/v1/messages", {"model": "c", "max_tokens": 9, "messages": USER})]:
        for stream in (False, True):
            first, second = post(api, path, {**body, "stream": stream}), post(api, path, {**body, "stream": stream})
            assert first[2] == second[2]
            assert {k: v for k, v in first[1].items() if "request-id" not in k and k != "date"} == \
                {k: v for k, v in second[1].items() if "request-id" not in k and k != "date"}
            assert first[1]["x-request-id"] != second[1]["x-request-id"]
    with start() as other:  # another server, fresh counters: the same answer
        assert post(other, "/v1/chat/completions", {"model": "m", "messages": USER})[2] == \
            post(api, "/v1/chat/completions", {"model": "m", "messages": USER})[2]
    c = client(api)
    one = c.chat.completions.create(model="m", messages=USER).choices[0].message.content
    two = c.chat.completions.create(model="m", messages=[{"role": "user", "content": "Name four lakes"}])
    assert one != two.choices[0].message.content
    chained = c.chat.completions.create(model="m", messages=[*USER, {"role": "assistant", "content": one},
                                                             {"role": "user", "content": one}])
    assert chained.choices[0].message.content.startswith(" ".join(one.split()[:3]))


def test_counting_and_reset(api):
    c = client(api)
    c.chat.completions.create(model="m", messages=USER)
    list(c.chat.completions.create(model="m", messages=USER, stream=True))
    c.responses.create(model="m", input="hi")
    c.models.list()
    assert api.count() == 3 and api.count("/v1/chat/completions") == 2 and api.count("/v1/responses") == 1
    assert [r["stream"] for r in api.requests] == [False, True, False]
    assert api.requests[0]["body"] == {"model": "m", "messages": USER}
    assert api.requests[0]["headers"]["authorization"] == "Bearer x"
    api.reset()
    assert api.count() == 0 and api.requests == []


def test_fail_next_is_a_rate_limit_the_sdks_retry(api, anthropic):
    api.fail_next(429)
    with pytest.raises(openai.RateLimitError) as err:
        client(api).chat.completions.create(model="m", messages=USER)
    assert err.value.status_code == 429 and err.value.body["type"] == "rate_limit_error"
    assert client(api).chat.completions.create(model="m", messages=USER).choices[0].message.content
    api.fail_next(429)
    assert client(api, max_retries=1).chat.completions.create(model="m", messages=USER).choices[0].message.content
    api.fail_next(500, times=2)
    with pytest.raises(openai.InternalServerError):
        client(api, max_retries=1).responses.create(model="m", input="hi")
    assert api.count() == 6
    api.fail_next(429)
    with pytest.raises(anthropic.RateLimitError):
        aclient(api, anthropic).messages.create(model="c", max_tokens=5, messages=USER)
    api.fail_next(529)
    assert aclient(api, anthropic, max_retries=1).messages.create(model="c", max_tokens=5, messages=USER).content


def test_stream_delay_is_honoured(api):
    api.stream_delay = 0.1
    c = client(api)
    started = time.monotonic()
    stamps = [time.monotonic() for _ in c.chat.completions.create(model="m", messages=USER, stream=True)]
    assert stamps[-1] - started >= 0.1 * (len(stamps) - 1) * 0.9
    assert stamps[1] - stamps[0] >= 0.08
    api.stream_delay = 0
    started_again = time.monotonic()
    list(c.chat.completions.create(model="m", messages=USER, stream=True))
    assert time.monotonic() - started_again < (stamps[-1] - started) / 2


def test_a_client_gone_mid_stream_leaves_the_server_serving(api):
    api.stream_delay = 0.3
    conn = http.client.HTTPConnection("127.0.0.1", int(api.url.rsplit(":", 1)[1]), timeout=10)
    conn.request("POST", "/v1/responses", json.dumps({"model": "m", "input": "hi", "stream": True}),
                 {"content-type": "application/json"})
    response = conn.getresponse()
    assert b"response.created" in response.readline() + response.readline()
    conn.sock.close()  # as a SIGKILLed client would
    api.stream_delay = 0
    time.sleep(0.5)  # the server's next write fails: it must just drop that connection
    assert client(api).responses.create(model="m", input="hi").output_text
    assert api.count("/v1/responses") == 2


def test_keep_alive_across_json_and_sse(api):
    conn = http.client.HTTPConnection("127.0.0.1", int(api.url.rsplit(":", 1)[1]), timeout=10)
    sock = None
    for stream in (False, True, False, True):
        conn.request("POST", "/v1/chat/completions", json.dumps({"model": "m", "messages": USER, "stream": stream}),
                     {"content-type": "application/json"})
        response = conn.getresponse()
        assert response.status == 200 and not response.will_close
        response.read()
        assert sock is None or conn.sock is sock
        sock = conn.sock
    conn.close()


def test_script_mode(tmp_path):
    proc = subprocess.Popen([sys.executable, str(REPO / "tests" / "servers" / "model_api.py"), "--stream-delay", "0"],
                            stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        line = proc.stdout.readline().strip()
        assert line.startswith("URL http://127.0.0.1:")
        url = line.split()[1]

        def call(path: str, body: dict | None = None) -> dict:
            data = None if body is None else json.dumps(body).encode()
            with urllib.request.urlopen(urllib.request.Request(url + path, data=data), timeout=10) as r:
                return json.loads(r.read())

        call("/_config", {"stream_delay": 0.05, "fail_next": {"status": 429, "times": 1}})
        c = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=1)
        started = time.monotonic()
        chunks = list(c.chat.completions.create(model="m", messages=USER, stream=True))
        assert time.monotonic() - started >= 0.05 * (len(chunks) - 1) * 0.9
        stats = call("/_stats")
        assert stats["count"] == 2 and stats["by_path"] == {"/v1/chat/completions": 2}
        assert stats["requests"][1]["stream"] is True and stats["requests"][1]["body"]["messages"] == USER
        call("/_reset", {})
        assert call("/_stats")["count"] == 0
    finally:
        stop_process_group(proc)
    assert proc.returncode is not None

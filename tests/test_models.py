"""OpenAICompatibleModel against real loopback HTTP servers that answer well and badly."""

from __future__ import annotations

import json

import pytest
from servers._proc import free_port
from servers.loopback import LoopbackHTTP

from caravanserai import ModelError, OpenAICompatibleModel, durable
from caravanserai.runs import read_events


class FakeOpenAI(LoopbackHTTP):
    """A real HTTP server on 127.0.0.1 whose answers the test scripts (status, body)."""

    def __init__(self) -> None:
        self.answers: list[tuple[int, bytes]] = []
        self.seen: list[dict] = []
        super().__init__(self._respond)

    def _respond(self, method, path, headers, body) -> tuple[int, bytes, dict[str, str]]:
        self.seen.append({"path": path, "body": json.loads(body), "auth": headers.get("Authorization")})
        status, data = self.answers.pop(0) if self.answers else (200, b"{}")
        return status, data, {}

    def answer(self, status: int, body: object) -> None:
        self.answers.append((status, body if isinstance(body, bytes) else json.dumps(body).encode()))


@pytest.fixture
def fake():
    server = FakeOpenAI()
    yield server
    server.close()


CHAT = {"model": "m", "choices": [{"message": {"role": "assistant", "content": "hi", "tool_calls": [
    {"id": "c1", "type": "function", "function": {"name": "lookup", "arguments": "{\"order\": \"A-1\"}"}}]}}],
    "usage": {"prompt_tokens": 12, "completion_tokens": 3, "total_tokens": 15, "prompt_tokens_details": {"cached_tokens": 8}}}


def test_chat_reads_text_tool_calls_and_usage(fake):
    fake.answer(200, CHAT)
    model = OpenAICompatibleModel(fake.url + "/v1", "m", api_key="sk-test")
    reply = model.complete([{"role": "user", "content": "x"}], tools=[{"type": "function"}], temperature=0)
    assert reply.text == "hi" and reply.tool_calls[0]["function"]["name"] == "lookup"
    assert (reply.usage.prompt_tokens, reply.usage.completion_tokens, reply.usage.cached_tokens) == (12, 3, 8)
    assert fake.seen[0]["path"] == "/v1/chat/completions" and fake.seen[0]["auth"] == "Bearer sk-test"
    assert fake.seen[0]["body"]["temperature"] == 0 and fake.seen[0]["body"]["tools"] == [{"type": "function"}]


def test_completions_endpoint(fake):
    fake.answer(200, {"choices": [{"text": " Paris"}], "usage": {"prompt_tokens": 4, "completion_tokens": 1}})
    reply = OpenAICompatibleModel(fake.url, "m").complete_text("The capital of France is", max_tokens=2)
    assert reply.text == " Paris" and fake.seen[0]["path"] == "/v1/completions"
    assert fake.seen[0]["body"]["prompt"] == "The capital of France is"


def test_unreachable_server():
    port = free_port()
    with pytest.raises(ModelError) as info:
        OpenAICompatibleModel(f"http://127.0.0.1:{port}", "m", timeout=2).complete([{"role": "user", "content": "x"}])
    assert info.value.kind == "unreachable" and f"127.0.0.1:{port}" in str(info.value)


@pytest.mark.parametrize("status, body, kind", [
    (500, b"internal error", "status"),
    (404, {"error": "no such model"}, "status"),
    (200, b"<html>not json</html>", "malformed"),
    (200, {"choices": []}, "malformed"),
    (200, {"choices": [{"message": "just a string"}]}, "malformed"),
])
def test_bad_answers_are_typed_errors(fake, status, body, kind):
    fake.answer(status, body)
    with pytest.raises(ModelError) as info:
        OpenAICompatibleModel(fake.url, "m").complete([{"role": "user", "content": "x"}])
    assert info.value.kind == kind and info.value.code == "model_error"


def test_failed_call_is_journaled_as_failed_and_retried_next_attempt(project, fake):
    model = OpenAICompatibleModel(fake.url, "m")
    fake.answer(500, b"overloaded")
    with pytest.raises(ModelError):
        with durable("retry") as run:
            run.call_model(model, [{"role": "user", "content": "x"}])
    types = [e["type"] for e in read_events("retry")]
    assert types == ["run_started", "call_started", "call_failed", "run_failed"]
    fake.answer(200, CHAT)
    with durable("retry") as run:
        assert run.call_model(model, [{"role": "user", "content": "x"}]).text == "hi"
        receipt = run.receipt()
    assert len(receipt.calls) == 1 and receipt.resume.prior_calls == 0 and receipt.resume.possible_double_count_calls == 0
    assert receipt.calls[0].estimated_usd is None and receipt.unpriced  # "m" has no list price: never guessed

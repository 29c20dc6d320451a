"""The journal at the HTTP transport, with the openai and anthropic SDKs against a real counting server.

The server (tests/servers/model_api.py) speaks chat, completions, Responses, embeddings and
Anthropic messages, plain and streamed, as the SDKs' own types describe them, and counts what
it received: every "never paid twice" claim below is checked against what the server saw.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import subprocess
import sys
import urllib.parse
import urllib.request
import warnings

import pytest
from chain_helpers import kill_and_resume
from conftest import need_module
from servers.model_api import start

import caravanserai
from caravanserai import UnjournaledCallWarning, http_journal
from caravanserai.calls.http_record import ENDPOINTS, IDENTITY_FIELDS
from caravanserai.errors import BudgetExceeded, UndigestableValue, UnsupportedClient
from caravanserai.journal import digest
from caravanserai.runs import read_events

openai = need_module("openai", whole_module=True)
anthropic = need_module("anthropic", whole_module=True)

MODEL = "gpt-4o-mini"  # priced in caravanserai.calls.pricing: receipts carry inferred USD




@pytest.fixture
def store(tmp_path):
    return f"sqlite:///{tmp_path / 'runs.db'}"


def oai(api, cls=None):
    return (cls or openai.OpenAI)(base_url=api.url + "/v1", api_key="local", max_retries=0)


def ant(api, cls=None):
    return (cls or anthropic.Anthropic)(base_url=api.url, api_key="local", max_retries=0)


def msgs(text):
    return [{"role": "user", "content": text}]


def twice(store, body):
    """Run ``body(run)`` in a run that is interrupted once it has run, then again under the same id (a
    resume: its calls are answered from the journal, and the replays recorded); returns both results."""
    results = []
    with pytest.raises(KeyboardInterrupt), caravanserai.durable("twice", store=store) as run:
        results.append(body(run))
        raise KeyboardInterrupt  # the run stays pending (a completed one entered again would record nothing)
    with caravanserai.durable("twice", store=store) as run:
        results.append(body(run))
    return results


# ---- every call style of the openai SDK replays, and the server sees each request once --------------------

STYLES = {
    "chat": lambda c: c.chat.completions.create(model=MODEL, messages=msgs("hello"), max_tokens=50)
    .choices[0].message.content,
    "chat_stream": lambda c: "".join(ch.choices[0].delta.content or "" for ch in c.chat.completions.create(
        model=MODEL, messages=msgs("hello"), stream=True, stream_options={"include_usage": True}) if ch.choices),
    "raw_response": lambda c: c.chat.completions.with_raw_response.create(model=MODEL, messages=msgs("raw"))
    .parse().choices[0].message.content,
    "completions": lambda c: c.completions.create(model=MODEL, prompt="Once upon").choices[0].text,
    "responses": lambda c: c.responses.create(model=MODEL, input="hello").output_text,
    "responses_stream": lambda c: _responses_stream(c),
    "embeddings": lambda c: c.embeddings.create(model="text-embedding-3-small", input="hello").data[0].embedding[:3],
    "omit_arguments": lambda c: c.chat.completions.create(model=MODEL, messages=msgs("omit"), temperature=openai.omit,
                                                          stream=openai.omit).choices[0].message.content,
}


def _responses_stream(c):
    with c.responses.stream(model=MODEL, input="stream me") as stream:
        kinds = [event.type for event in stream]
        return [kinds, stream.get_final_response().output_text]


@pytest.mark.parametrize("style", sorted(STYLES))
def test_each_openai_call_style_is_journaled_and_replayed(api, store, style):
    client = oai(api)
    first, again = twice(store, lambda run: STYLES[style](client))
    assert first == again and first
    assert api.count() == 1, api.stats()["by_path"]  # the second run was answered from the journal
    events = read_events("twice", store)
    settled = [e for e in events if e["type"] == "call_settled"]
    assert len(settled) == 1 and settled[0]["call"]["response"]["status"] == 200
    replayed = [e for e in events if e["type"] == "replayed"]
    assert replayed, "the replay is recorded in the journal"


def test_an_anthropic_client_is_journaled_plain_and_streamed(api, store):
    client = ant(api)

    def body(run):
        plain = client.messages.create(model="claude-3-5-haiku-latest", max_tokens=64, messages=msgs("hi")).content[0].text
        with client.messages.stream(model="claude-3-5-haiku-latest", max_tokens=64, messages=msgs("stream")) as stream:
            events = [event.type for event in stream]
            final = stream.get_final_message()
        receipt = run.receipt()
        return plain, events, final.content[0].text, final.usage.output_tokens, [c.completion_tokens for c in receipt.calls]

    first, again = twice(store, body)
    assert first == again
    assert api.count("/v1/messages") == 2
    plain, events, text, output_tokens, completions = first
    assert events[0] == "message_start" and events[-1] == "message_stop" and text
    assert completions == [len(plain.split()), output_tokens]  # usage read from message_start/message_delta


def test_async_clients_are_journaled(api, store):
    async def calls():
        client = oai(api, openai.AsyncOpenAI)
        reply = await client.chat.completions.create(model=MODEL, messages=msgs("async"))
        stream = await client.chat.completions.create(model=MODEL, messages=msgs("async stream"), stream=True)
        parts = [ch.choices[0].delta.content or "" async for ch in stream if ch.choices]
        message = await ant(api, anthropic.AsyncAnthropic).messages.create(
            model="claude-3-5-haiku-latest", max_tokens=32, messages=msgs("async"))
        return reply.choices[0].message.content, "".join(parts), message.content[0].text

    first, again = twice(store, lambda run: asyncio.run(calls()))
    assert first == again and api.count() == 3


def test_replayed_stream_bytes_equal_the_recorded_bytes_and_the_sdk_yields_the_same_events(api, store):
    client = oai(api)

    def body(run):
        chunks = list(client.chat.completions.create(model=MODEL, messages=msgs("bytes"), stream=True,
                                                     stream_options={"include_usage": True}))
        with client.responses.stream(model=MODEL, input="bytes") as stream:
            events = [(e.type, e.sequence_number) for e in stream]
        raw = client.chat.completions.with_streaming_response.create(model=MODEL, messages=msgs("raw bytes"), stream=True)
        with raw as response:
            data = b"".join(response.iter_bytes())
        return [c.model_dump() for c in chunks], events, hashlib.sha256(data).hexdigest()

    first, again = twice(store, body)
    assert first == again  # the same chunk objects, the same Responses events, the same bytes
    assert api.count() == 3
    recorded = [e["call"]["response"] for e in read_events("twice", store) if e["type"] == "call_settled"]
    for stored in recorded:
        joined = "".join(stored["events"]).encode()
        assert hashlib.sha256(joined).hexdigest() == stored["sha256"]
        assert all(event.endswith("\n\n") for event in stored["events"])  # one SSE event each
    assert recorded[2]["sha256"] == first[2]  # what the consumer read, byte for byte


def test_identity_fields_host_and_auth_are_not_part_of_the_key(api, store):
    other = start()
    try:
        def body(run):
            if run.attempt == 1:
                return oai(api).chat.completions.create(model=MODEL, messages=msgs("key"), user="alice",
                                                        metadata={"trace": "1"}).choices[0].message.content
            client = openai.OpenAI(base_url=other.url + "/v1", api_key="another-key", max_retries=0)
            return client.chat.completions.create(model=MODEL, messages=msgs("key"), user="bob",
                                                  metadata={"trace": "2"}).choices[0].message.content

        first, again = twice(store, body)
        assert first == again and api.count() == 1 and other.count() == 0
    finally:
        other.stop()


def test_headers_that_change_meaning_are_part_of_the_key(api, store):
    def body(run):
        beta = "tools-2024-04-04" if run.attempt == 1 else "prompt-caching-2024-07-31"
        return ant(api).messages.create(model="claude-3-5-haiku-latest", max_tokens=32, messages=msgs("beta"),
                                        extra_headers={"anthropic-beta": beta}).content[0].text

    twice(store, body)
    assert api.count() == 2  # a different beta is a different request: sent again


def test_repeated_identical_requests_replay_in_order(api, store):
    client = oai(api)

    def body(run):
        return [client.chat.completions.create(model=MODEL, messages=msgs("same")).id for _ in range(3)]

    first, again = twice(store, body)
    assert first == again and api.count() == 3


def test_a_429_is_journaled_as_failed_and_the_sdk_retry_settles(api, store):
    api.fail_next(429)
    client = openai.OpenAI(base_url=api.url + "/v1", api_key="local", max_retries=1)
    with caravanserai.durable("retry", store=store):
        text = client.chat.completions.create(model=MODEL, messages=msgs("retry")).choices[0].message.content
    events = read_events("retry", store)
    kinds = [e["type"] for e in events if e["type"].startswith("call_")]
    assert kinds == ["call_started", "call_failed", "call_started", "call_settled"] and text
    failed = next(e for e in events if e["type"] == "call_failed")
    assert failed["code"] == "http_429" and failed["message"]
    assert api.count() == 2


def test_the_budget_is_checked_from_max_tokens_before_sending(api, store):
    client = oai(api)
    with pytest.raises(BudgetExceeded, match="was not sent"):
        with caravanserai.durable("budget", store=store, budget={"tokens": 100}):
            client.chat.completions.create(model=MODEL, messages=msgs("budget"), max_completion_tokens=500)
    assert api.count() == 0
    with pytest.raises(BudgetExceeded):
        with caravanserai.durable("budget-r", store=store, budget={"tokens": 100}):
            client.responses.create(model=MODEL, input="budget", max_output_tokens=500)
    assert api.count() == 0


def test_a_settled_call_carries_usage_and_inferred_usd(api, store):
    with caravanserai.durable("usd", store=store) as run:
        oai(api).responses.create(model=MODEL, input="price me")
        receipt = run.receipt()
    [call] = receipt.calls
    assert call.prompt_tokens > 0 and call.completion_tokens > 0 and call.estimated_usd and call.estimated_usd > 0
    event = next(e for e in read_events("usd", store) if e["type"] == "call_settled")
    assert event["call"]["response"]["text"] and event["call"]["model"] == MODEL


def test_outside_a_run_nothing_is_journaled_and_nothing_changes(api, store):
    text = oai(api).chat.completions.create(model=MODEL, messages=msgs("outside")).choices[0].message.content
    again = oai(api).chat.completions.create(model=MODEL, messages=msgs("outside")).choices[0].message.content
    assert text == again and api.count() == 2


def test_opt_outs_per_run_per_block_and_per_process(api, store, tmp_path):
    client = oai(api)
    for _ in range(2):
        with caravanserai.durable("opt-out", store=store, http_journal=False):
            client.chat.completions.create(model=MODEL, messages=msgs("opt"))
    assert api.count() == 2
    for _ in range(2):
        with caravanserai.durable("paused", store=store), http_journal.paused():
            client.chat.completions.create(model=MODEL, messages=msgs("opt"))
    assert api.count() == 4
    code = (f"import caravanserai, openai\nc = openai.OpenAI(base_url={api.url + '/v1'!r}, api_key='x', max_retries=0)\n"
            f"with caravanserai.durable('env', store={store!r}):\n"
            f"    c.chat.completions.create(model={MODEL!r}, messages=[{{'role': 'user', 'content': 'env'}}])\n")
    for _ in range(2):
        subprocess.run([sys.executable, "-c", code], check=True, env={**os.environ, "CARAVANSERAI_HTTP_JOURNAL": "off"})
    assert api.count() == 6
    assert not [e for e in read_events("env", store) if e["type"] == "call_started"]


def test_a_request_the_journal_cannot_key_is_named_once_and_on_the_receipt(api, store):
    import httpx

    with caravanserai.durable("unkeyed", store=store) as run:
        with pytest.warns(UnjournaledCallWarning, match="not JSON"):
            httpx.post(api.url + "/v1/chat/completions", content=b"not json", headers={"content-type": "text/plain"})
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            httpx.post(api.url + "/v1/chat/completions", content=b"still not json")  # named once per run
        with pytest.warns(UnjournaledCallWarning, match="not in the journaled endpoint list"):
            httpx.post(api.url + "/v1/generate", json={"prompt": "x"})
        receipt = run.receipt()
    assert receipt.unjournaled == ["POST /v1/chat/completions", "POST /v1/generate"]
    assert "UNJOURNALED" in receipt.summary()


def test_added_endpoints_and_identity_fields_are_journaled(api, store):
    import httpx

    http_journal.configure(endpoints=(*http_journal.rules.endpoints, "/v1/generate"),
                           identity_fields=(*http_journal.rules.identity_fields, "request_tag"))
    try:
        def body(run):
            return httpx.post(api.url + "/v1/chat/completions", json={"model": MODEL, "messages": msgs("tag"),
                                                                       "request_tag": run.attempt}).json()["id"]
        first, again = twice(store, body)
        assert first == again and api.count() == 1
    finally:
        http_journal.configure(endpoints=ENDPOINTS, identity_fields=IDENTITY_FIELDS)


def test_durable_client_returns_the_same_sdk_client(api, store):
    client = oai(api)
    assert caravanserai.durable_client(client) is client and isinstance(client, openai.OpenAI)
    aclient = ant(api, anthropic.AsyncAnthropic)
    assert caravanserai.durable_client(aclient) is aclient
    with pytest.raises(UnsupportedClient, match="proxy_url"):
        caravanserai.durable_client(object())


def test_durable_client_journals_a_client_on_a_custom_transport(api, store):
    import httpx2

    seen = []

    class Forward(httpx2.BaseTransport):  # not httpx2.HTTPTransport: the class patch does not reach it
        def __init__(self):
            self.inner = httpx2.HTTPTransport()

        def handle_request(self, request):
            seen.append(request.url.path)
            return httpx2.HTTPTransport.handle_request.__wrapped__(self.inner, request)

    client = caravanserai.durable_client(openai.OpenAI(base_url=api.url + "/v1", api_key="x", max_retries=0,
                                                       http_client=httpx2.Client(transport=Forward())))
    first, again = twice(store, lambda run: client.chat.completions.create(model=MODEL, messages=msgs("mock")).id)
    assert first == again and api.count() == 1 and seen == ["/v1/chat/completions"]


def test_digests_refuse_values_that_are_not_json():
    with pytest.raises(UndigestableValue, match="openai"):
        digest({"temperature": openai.omit})
    with pytest.raises(UndigestableValue):
        digest({"x": object()})
    assert digest({"a": 1}) == digest({"a": 1})


def test_the_loopback_proxy_journals_a_client_that_is_not_on_httpx(api, store):
    def body(run):
        base = run.proxy_url(api.url)
        request = urllib.request.Request(base + "/v1/chat/completions", method="POST",
                                         data=json.dumps({"model": MODEL, "messages": msgs("proxy")}).encode(),
                                         headers={"content-type": "application/json", "authorization": "Bearer x"})
        with urllib.request.urlopen(request) as response:
            plain = json.loads(response.read())["choices"][0]["message"]["content"]
        request = urllib.request.Request(base + "/v1/messages", method="POST",
                                         data=json.dumps({"model": "claude-3-5-haiku-latest", "max_tokens": 32,
                                                          "stream": True, "messages": msgs("proxy")}).encode(),
                                         headers={"content-type": "application/json", "anthropic-version": "2023-06-01"})
        with urllib.request.urlopen(request) as response:
            streamed = response.read().decode()
        return plain, streamed

    first, again = twice(store, body)
    assert first == again and api.count() == 2
    assert "event: message_stop" in first[1]


# ---- SIGKILL between calls and in the middle of a stream --------------------------------------------------

OPENAI_STEP = '''
import openai
client = openai.OpenAI(base_url=BASE + "/v1", api_key="x", max_retries=0)
def step(i, prev):
    question = [{"role": "user", "content": f"step {i}: {prev}"}]
    if i in (2, 5):  # streamed calls
        return streamed(i, client.chat.completions.create(model="gpt-4o-mini", messages=question, stream=True,
                                                          stream_options={"include_usage": True}))
    if i == 3:
        return client.responses.create(model="gpt-4o-mini", input=f"step {i}: {prev}").output_text
    if i == 4:
        return client.chat.completions.with_raw_response.create(model="gpt-4o-mini", messages=question).parse()\\
            .choices[0].message.content
    return client.chat.completions.create(model="gpt-4o-mini", messages=question).choices[0].message.content
'''

ANTHROPIC_STEP = '''
import anthropic
client = anthropic.Anthropic(base_url=BASE, api_key="x", max_retries=0)
def step(i, prev):
    messages = [{"role": "user", "content": f"step {i}: {prev}"}]
    if i % 2 == 1:
        with client.messages.stream(model="claude-3-5-haiku-latest", max_tokens=100, messages=messages) as stream:
            for text in stream.text_stream:
                chunk(i)
            return stream.get_final_message().content[0].text
    return client.messages.create(model="claude-3-5-haiku-latest", max_tokens=100, messages=messages).content[0].text
'''


@pytest.mark.slow
def test_openai_chain_killed_between_calls_and_mid_stream(tmp_path, api):
    kill_and_resume(tmp_path, api, OPENAI_STEP)


@pytest.mark.slow
def test_anthropic_chain_killed_between_calls_and_mid_stream(tmp_path, api):
    kill_and_resume(tmp_path, api, ANTHROPIC_STEP)


def test_the_proxy_command_journals_a_command_line_and_replays_it(api, store, tmp_path):
    client = tmp_path / "client.py"
    client.write_text(
        "import json, os, urllib.request\n"
        "body = json.dumps({'model': 'gpt-4o-mini', 'messages': [{'role': 'user', 'content': 'cli'}]}).encode()\n"
        "request = urllib.request.Request(os.environ['OPENAI_BASE_URL'] + '/v1/chat/completions', data=body,\n"
        "                                 headers={'content-type': 'application/json'})\n"
        "print(json.loads(urllib.request.urlopen(request).read())['choices'][0]['message']['content'])\n")
    command = [sys.executable, "-m", "caravanserai", "proxy", "cli-run", api.url, "--store", store, "--",
               sys.executable, str(client)]
    first = subprocess.run(command, capture_output=True, text=True, timeout=120)
    again = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert first.returncode == 0 and again.returncode == 0, first.stderr + again.stderr
    assert first.stdout == again.stdout and first.stdout.strip()
    assert api.count() == 1 and "journaling proxy" in first.stderr
    failing = subprocess.run([*command[:-1], "-c", "raise SystemExit(3)"], capture_output=True, text=True, timeout=120)
    assert failing.returncode == 3
    bad = subprocess.run([sys.executable, "-m", "caravanserai", "proxy", "x", "ftp://nope", "--store", store],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "http(s) URL" in bad.stderr and "Traceback" not in bad.stderr


def test_gzip_answers_are_recorded_decoded_and_replayed(api, store):
    api.gzip = True
    client = oai(api)

    def body(run):
        plain = client.chat.completions.create(model=MODEL, messages=msgs("zipped")).choices[0].message.content
        streamed = "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(
            model=MODEL, messages=msgs("zipped stream"), stream=True) if c.choices)
        return plain, streamed

    first, again = twice(store, body)
    assert first == again and api.count() == 2
    assert all("gzip" in r["headers"].get("accept-encoding", "") for r in api.requests)  # so the server did gzip
    recorded = [e["call"]["response"] for e in read_events("twice", store) if e["type"] == "call_settled"]
    assert json.loads(recorded[0]["body"])["object"] == "chat.completion"  # decoded, not gzip bytes
    assert recorded[1]["events"][0].startswith("data: {") and recorded[1]["text"] == first[1]


def test_an_error_event_inside_a_stream_is_a_failed_call_sent_again_on_resume(api, store):
    api.stream_error = True
    client = ant(api)
    for _ in range(2):
        with pytest.raises(anthropic.APIStatusError, match="Overloaded"):
            with caravanserai.durable("stream-error", store=store):
                with client.messages.stream(model="claude-3-5-haiku-latest", max_tokens=32, messages=msgs("x")) as s:
                    s.get_final_message()
    events = read_events("stream-error", store)
    failed = [e for e in events if e["type"] == "call_failed"]
    assert [e["code"] for e in failed] == ["stream_error", "stream_error"] and api.count() == 2
    assert not [e for e in events if e["type"] == "call_settled"]


REAL_MODEL_STEP = '''
import openai
client = openai.OpenAI(base_url=BASE + "/v1", api_key="x", max_retries=0)
MODEL = os.environ["REAL_MODEL"]
def step(i, prev):
    question = [{"role": "user", "content": f"Step {i}. Continue in five words: {prev[-60:]}"}]
    if i in (2, 5):
        return streamed(i, client.chat.completions.create(model=MODEL, messages=question, max_tokens=24, temperature=0,
                                                          stream=True, stream_options={"include_usage": True}))
    if i == 3:
        return client.completions.create(model=MODEL, prompt=question[0]["content"], max_tokens=24, temperature=0).choices[0].text
    return client.chat.completions.create(model=MODEL, messages=question, max_tokens=24, temperature=0).choices[0].message.content
'''


@pytest.mark.slow
def test_a_chain_on_the_real_local_model_killed_between_calls_and_mid_stream(tmp_path, model_server):
    """The same proof on SmolLM2 behind `transformers serve` (greedy decoding), counted in front of it."""
    real = start(upstream=model_server.url)
    try:
        kill_and_resume(tmp_path, real, REAL_MODEL_STEP, env={"REAL_MODEL": model_server.model})
    finally:
        real.stop()


# ---- what the review of the transport journal found ------------------------------------------------------------------

def test_calls_from_worker_threads_of_the_only_open_run_are_journaled(api, store):
    from concurrent.futures import ThreadPoolExecutor

    client = oai(api)

    def ask(n):
        return client.chat.completions.create(model=MODEL, messages=msgs(f"thread {n}")).choices[0].message.content

    def body(run):
        with ThreadPoolExecutor(3) as pool:  # its threads do not copy the run's context
            return sorted(pool.map(ask, range(3)))

    first, again = twice(store, body)
    assert first == again and api.count() == 3


def test_identical_requests_replay_in_the_order_they_were_started_not_settled():
    from caravanserai.calls.ledger import Ledger

    def settled(n):
        return {"type": "call_settled", "path": "POST /v1/chat/completions",
                "call": {"call_id": f"POST /v1/chat/completions#{n}", "request_sha256": "k", "usage": {},
                         "estimated_usd": None, "price_per_million": None, "response": {"answer": n}}}

    events = [{"type": "run_started"}, {"type": "call_started", "call_id": "POST /v1/chat/completions#1"},
              {"type": "call_started", "call_id": "POST /v1/chat/completions#2"}, settled(2), settled(1)]
    ledger = Ledger("r", events, 2)
    assert [ledger.replay_model("POST /v1/chat/completions", "k")["call"]["response"]["answer"] for _ in range(2)] == [1, 2]


def test_a_stream_read_after_its_run_closed_is_named_not_broken(api, store):
    with caravanserai.durable("late", store=store):
        stream = oai(api).chat.completions.create(model=MODEL, messages=msgs("late"), stream=True)
    with pytest.warns(UnjournaledCallWarning, match="could not be journaled"):
        text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert text and api.count() == 1


def test_a_timed_out_request_that_reached_the_server_stays_unsettled(api, store):
    api.response_delay = 1.0
    client = openai.OpenAI(base_url=api.url + "/v1", api_key="x", max_retries=0, timeout=0.3)
    with pytest.raises(openai.APITimeoutError):
        with caravanserai.durable("timeout", store=store):
            client.chat.completions.create(model=MODEL, messages=msgs("slow"))
    api.response_delay = 0.0
    with caravanserai.durable("timeout", store=store) as run:
        client.chat.completions.create(model=MODEL, messages=msgs("slow"))
        resume = run.receipt().resume
    assert resume.possible_double_count_calls == 1 and api.count() == 2  # it may have been billed: said so
    assert not [e for e in read_events("timeout", store) if e["type"] == "call_failed"]


def test_a_stream_cut_before_its_final_event_stays_unsettled(api, store):
    api.truncate_stream = 3  # a clean end of the connection, but no finish_reason and no [DONE]
    client = oai(api)
    for _ in range(2):
        with caravanserai.durable("cut", store=store):
            list(client.chat.completions.create(model=MODEL, messages=msgs("cut"), stream=True))
    events = read_events("cut", store)
    assert api.count() == 2 and not [e for e in events if e["type"] == "call_settled"]


def test_a_replayed_record_can_only_be_a_2xx_with_the_replay_headers():
    from caravanserai.calls.http_record import replay_status_and_headers

    forged = {"status": 307, "headers": {"location": "https://elsewhere.example/v1", "content-type": "application/json"}}
    assert replay_status_and_headers(forged) == (200, [("content-type", "application/json")])


def test_the_proxy_reads_chunked_bodies_and_refuses_over_budget_with_a_final_400(api, store):
    import http.client

    with caravanserai.durable("proxy-edge", store=store, budget={"tokens": 5000}) as run:
        base = urllib.parse.urlsplit(run.proxy_url(api.url))
        conn = http.client.HTTPConnection(base.hostname, base.port)
        body = json.dumps({"model": MODEL, "messages": msgs("chunked")}).encode()
        conn.putrequest("POST", base.path + "/v1/chat/completions")
        conn.putheader("content-type", "application/json")
        conn.putheader("transfer-encoding", "chunked")
        conn.endheaders()
        conn.send(b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body))
        answer = conn.getresponse()
        assert answer.status == 200 and json.loads(answer.read())["choices"][0]["message"]["content"]
        big = json.dumps({"model": MODEL, "messages": msgs("big"), "max_tokens": 100000}).encode()
        conn.request("POST", base.path + "/v1/chat/completions", big, {"content-type": "application/json"})
        refused = conn.getresponse()
        assert refused.status == 400 and refused.getheader("x-should-retry") == "false"
        assert json.loads(refused.read())["error"]["code"] == "budget_exceeded"
    assert api.count() == 1


def test_concurrent_calls_share_one_budget(api, store):
    async def calls():
        client = oai(api, openai.AsyncOpenAI)
        return await asyncio.gather(*(client.chat.completions.create(model=MODEL, messages=msgs(f"gather {n}"))
                                      for n in range(6)), return_exceptions=True)

    api.response_delay = 0.3  # all six are in flight together
    with caravanserai.durable("shared-budget", store=store, budget={"calls": 2}):
        results = asyncio.run(calls())
    refused = [r for r in results if isinstance(r, Exception)]
    assert api.count() == 2 and len(refused) == 4, results


def test_bad_configuration_and_a_bad_upstream_are_one_line_usage_errors(store):
    from caravanserai.errors import UsageError

    before = http_journal.rules.endpoints
    for bad in ({"endpoints": "/chat/completions"}, {"endpoints": ["chat/completions"]}, {"identity_fields": [""]},
                {"meaning_headers": [3]}):
        with pytest.raises(UsageError, match="configure") as info:
            http_journal.configure(**bad)
        assert "\n" not in str(info.value) and info.value.code == "usage_error"
    assert http_journal.rules.endpoints == before  # nothing changed
    with caravanserai.durable("bad-upstream", store=store) as run:
        with pytest.raises(UsageError, match="http\\(s\\) URL"):
            run.proxy_url("ftp://example")


LATE_IMPORT = '''
import sys
import caravanserai
with caravanserai.durable("late-import", store=sys.argv[1]) as run:
    before = sorted(m for m in ("httpx", "httpx2", "openai") if m in sys.modules)
    import openai  # after the run opened: its httpx is patched on import
    client = openai.OpenAI(base_url=sys.argv[2] + "/v1", api_key="local", max_retries=0)
    answer = client.chat.completions.create(model="gpt-4o-mini", messages=[{"role": "user", "content": "late"}])
    print(before, answer.choices[0].message.content)
'''


def test_opening_a_run_imports_no_http_library_and_one_imported_later_is_journaled(api, tmp_path, child_env):
    """A run opens without importing httpx or httpx2 (their import was most of a resume's time); the
    program's own later import is patched all the same: the second run of the script sends nothing."""
    script = tmp_path / "late.py"
    script.write_text(LATE_IMPORT)
    outputs = [subprocess.run([sys.executable, str(script), str(tmp_path / "store"), api.url], env=child_env,
                              capture_output=True, text=True, timeout=120) for _ in range(2)]
    assert [o.returncode for o in outputs] == [0, 0], [o.stderr[-2000:] for o in outputs]
    assert outputs[0].stdout == outputs[1].stdout and outputs[0].stdout.startswith("[] ")
    assert api.count() == 1  # the re-run was answered from the journal

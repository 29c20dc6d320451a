"""A ``%%resumable`` cell in a real kernel: per item a streamed openai call, then a LangChain call;
the kernel is SIGKILLed in the middle of a stream, and again while a LangChain request is in
flight; the cell is re-run after each restart. The counting server says what was paid.
"""

from __future__ import annotations

import json
import time

import pytest
from conftest import need_module
from kernel_helpers import events

need_module("langchain_openai", whole_module=True)

pytestmark = pytest.mark.slow

TOPICS = ["rivers", "deserts", "glaciers", "forests"]

SETUP = '''%load_ext caravanserai
import json, openai
from langchain_openai import ChatOpenAI
from caravanserai import resumable_iterate
BASE = {base!r}
client = openai.OpenAI(base_url=BASE + "/v1", api_key="x", max_retries=0)
llm = ChatOpenAI(model="gpt-4o-mini", base_url=BASE + "/v1", api_key="x", max_retries=0)
topics = {topics!r}
'''

LOOP = '''%%resumable {run_id}
notes = {{}}
for topic in resumable_iterate(topics):
    parts = []
    for piece in client.chat.completions.create(model="gpt-4o-mini", stream=True,
                                                messages=[{{"role": "user", "content": f"Describe {{topic}}"}}]):
        if piece.choices:
            parts.append(piece.choices[0].delta.content or "")
    print("STREAMED", topic, "".join(parts), flush=True)
    notes[topic] = llm.invoke(f"Summarize: {{''.join(parts)}}").content
print(json.dumps(notes))
'''


def wait_until(condition, timeout: float = 60, *, api=None, kernel=None) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            detail = [(r["path"], r["stream"]) for r in api.requests] if api else ""
            raise AssertionError(f"timed out; the server received {detail}")
        time.sleep(0.005)


def test_a_resumable_cell_with_langchain_and_streams_survives_two_kernel_kills(tmp_path, kernel, api):
    k = kernel()
    k.ok(SETUP.format(base=api.url, topics=TOPICS))
    reference = k.ok(LOOP.format(run_id="nb-reference"))
    expected = json.loads(reference.stdout.strip().splitlines()[-1])
    assert sorted(expected) == sorted(TOPICS) and api.count() == 8
    api.reset()

    # attempt 1: killed in the middle of item 2's stream (request 3)
    api.stream_delay = 0.3
    k.submit(LOOP.format(run_id="nb-frameworks"))
    wait_until(lambda: api.count() == 3)
    time.sleep(0.7)  # a few events of the stream are out
    k.kill_and_restart()
    assert api.count() == 3

    # attempt 2: item 2's stream sent again, items 2-3 done, killed while item 4's LangChain request is in flight
    api.stream_delay = 0.2
    k.ok(SETUP.format(base=api.url, topics=TOPICS))
    k.submit(LOOP.format(run_id="nb-frameworks"))
    wait_until(lambda: api.count() == 8, api=api)  # item 4's stream is going out
    api.response_delay = 5.0  # the next request (item 4's LangChain call) is held at the server
    wait_until(lambda: api.count() == 9)
    k.kill_and_restart()
    api.response_delay = api.stream_delay = 0.0

    # attempt 3: item 4's settled stream replayed (its text printed again), its LangChain call sent again
    k.ok(SETUP.format(base=api.url, topics=TOPICS))
    got = k.ok(LOOP.format(run_id="nb-frameworks"))
    assert api.count() == 10  # 8 requests, plus the killed stream and the in-flight call once more
    assert json.loads(got.stdout.strip().splitlines()[-1]) == expected
    assert [line.split()[1] for line in got.stdout.splitlines() if line.startswith("STREAMED")] == ["forests"]
    streamed = [r for r in api.requests if r["stream"]]
    assert len(streamed) == 5  # item 4's stream was not sent twice: re-rendered from the journal

    journal = events(tmp_path, "nb-frameworks")
    assert sum(e["type"] == "call_settled" for e in journal) == 8
    assert sum(e["type"] == "call_started" for e in journal) == 10
    assert journal[-1]["type"] == "run_completed"

    again = k.ok(LOOP.format(run_id="nb-frameworks"))  # completed: re-shown, nothing sent
    assert api.count() == 10 and json.loads(again.stdout.strip().splitlines()[-1]) == expected

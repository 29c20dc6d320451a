"""Six chained model calls in a child process, SIGKILLed between calls and mid-stream, then re-run.

Every framework test supplies ``STEP``: Python source defining ``step(i, prev) -> str`` (call
number ``i`` from 1 to 6, ``prev`` the answer of the call before) with ``BASE`` (the counting
server's URL), ``chunk(i)`` (call it at a stream's first chunk) and ``streamed(i, stream)`` (the
text of an openai chat stream) in scope. ``kill_and_resume``
then proves the promise on a real counting server:

1. an uninterrupted run of the chain under another run id gives the expected answers;
2. attempt 1 pauses after call 3 and is SIGKILLed; attempt 2 replays 1–3 and is SIGKILLed in the
   middle of call ``stream_call``'s stream; attempt 3 replays what settled, sends the killed
   stream again and finishes;
3. the server received each call of the chain once, plus the one killed stream once more; the
   answers equal the uninterrupted run's; the journal and the receipt say so.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import caravanserai  # noqa: F401
from caravanserai.calls.http_record import IDENTITY_FIELDS
from caravanserai.runs import read_events

HEAD = '''
import json, os, sys, time
import caravanserai  # noqa: F401
from caravanserai.calls.http_record import IDENTITY_FIELDS
from caravanserai.runs import read_events
BASE = os.environ["MODEL_API"]
RUN_ID = os.environ["RUN_ID"]
STORE = os.environ["STORE"]
PAUSE_AFTER = int(os.environ.get("PAUSE_AFTER", "0"))
def say(*parts):
    print(*parts, flush=True)
def chunk(i):
    if not getattr(chunk, "seen", None) == i:
        chunk.seen = i
        say("CHUNK", i)
def streamed(i, stream):
    """The text of an openai chat stream (chunk(i) at its first chunk)."""
    out = []
    for piece in stream:
        chunk(i)
        if piece.choices:
            out.append(piece.choices[0].delta.content or "")
    return "".join(out)
'''

TAIL = '''
with caravanserai.durable(RUN_ID, store=STORE) as run:
    prev = "Tell me about caravans."
    for i in range(1, 7):
        prev = step(i, prev)
        say("ANSWER", i, json.dumps(prev))
        if i == PAUSE_AFTER:
            say("PAUSED")
            time.sleep(600)
    say("RECEIPT", json.dumps(run.receipt().to_dict()))
'''


@dataclass
class Attempt:
    answers: dict[int, str]
    receipt: dict | None
    output: str


def child_source(step: str) -> str:
    return HEAD + textwrap.dedent(step) + TAIL


def _env(base: str, run_id: str, store: str, extra: dict | None) -> dict:
    env = {**os.environ, "MODEL_API": base, "RUN_ID": run_id, "STORE": store, "PYTHONUNBUFFERED": "1",
           "OPENAI_API_KEY": "local", "ANTHROPIC_API_KEY": "local", **(extra or {})}
    env.pop("CARAVANSERAI_STORE", None)
    return env


def run_child(script: Path, base: str, run_id: str, store: str, *, python: str = sys.executable,
              pause_after: int = 0, kill_at: str | None = None, env: dict | None = None, timeout: float = 240,
              in_flight: Callable[[], bool] | None = None, settle: float = 0.0) -> Attempt:
    """Run the chain; SIGKILL it when it prints a line starting with ``kill_at`` (e.g. "PAUSED", "CHUNK 5")
    and, if given, once ``in_flight()`` says the server has the request."""
    proc = subprocess.Popen([python, str(script)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=_env(base, run_id, store, {"PAUSE_AFTER": str(pause_after), **(env or {})}))
    lines: list[str] = []
    deadline = time.monotonic() + timeout
    killed = False
    assert proc.stdout is not None
    for line in proc.stdout:
        lines.append(line)
        if kill_at is not None and line.startswith(kill_at):
            if in_flight is not None:
                while not in_flight() and time.monotonic() < deadline:
                    time.sleep(0.01)
                time.sleep(settle)  # a stream: let a few of its events out first
            os.kill(proc.pid, signal.SIGKILL)
            killed = True
            break
        if time.monotonic() > deadline:
            proc.kill()
            break
    proc.wait(timeout=60)
    output = "".join(lines) + (proc.stdout.read() if not killed else "")
    if kill_at is not None:
        assert killed, f"the child never printed {kill_at!r}:\n{output[-3000:]}"
    else:
        assert proc.returncode == 0, f"the chain failed (exit {proc.returncode}):\n{output[-4000:]}"
    answers = {}
    receipt = None
    for line in output.splitlines():
        if line.startswith("ANSWER "):
            _, number, text = line.split(" ", 2)
            answers[int(number)] = json.loads(text)
        elif line.startswith("RECEIPT "):
            receipt = json.loads(line[len("RECEIPT "):])
    return Attempt(answers, receipt, output)


def request_keys(api, since: int = 0) -> list[str]:
    """What the server received (path + canonical body without identity-only fields such as ``metadata``), in order."""
    return [r["path"] + " " + json.dumps({k: v for k, v in r["body"].items() if k not in IDENTITY_FIELDS}, sort_keys=True)
            for r in api.requests[since:]]


def kill_and_resume(tmp_path: Path, api, step: str, *, stream_call: int = 5, python: str = sys.executable,
                    env: dict | None = None, calls_per_step: int = 1, store: str | None = None,
                    streams: bool = True, usage: bool = True) -> dict:
    """The whole proof (see the module docstring); returns facts for framework-specific checks.

    ``streams=False`` (a framework that does not stream): the second kill lands while call
    ``stream_call`` is in flight at the server (``chunk(i)`` is then called just before the call).
    ``usage=False``: some streamed calls ask for no usage (no ``include_usage``), so not every call has tokens."""
    script = tmp_path / "chain.py"
    script.write_text(child_source(step))
    store = store or f"sqlite:///{tmp_path / 'runs.db'}"
    base = api.url

    reference = run_child(script, base, "chain-reference", store, python=python, env=env)
    assert sorted(reference.answers) == [1, 2, 3, 4, 5, 6]
    reference_requests = request_keys(api)
    assert len(reference_requests) == 6 * calls_per_step, reference_requests

    mark = len(api.requests)
    first = run_child(script, base, "chain", store, python=python, env=env, pause_after=3, kill_at="PAUSED")
    assert sorted(first.answers) == [1, 2, 3]
    after_first = len(api.requests)
    assert after_first - mark == 3 * calls_per_step

    old_delays = api.stream_delay, api.response_delay
    if streams:
        api.stream_delay = 0.4  # slow enough to kill between two events of the stream
    else:
        api.response_delay = 1.0  # the request sits at the server: kill the client then
    wanted = after_first + (stream_call - 3) * calls_per_step
    try:
        second = run_child(script, base, "chain", store, python=python, env=env, kill_at=f"CHUNK {stream_call}",
                           in_flight=lambda: len(api.requests) >= wanted, settle=0.6 if streams else 0.0)
    finally:
        api.stream_delay, api.response_delay = old_delays
    after_second = len(api.requests)
    # calls 1-3 replayed from the journal: only calls 4 .. stream_call went out
    assert after_second - after_first == (stream_call - 3) * calls_per_step, request_keys(api, after_first)
    assert second.answers == {i: reference.answers[i] for i in range(1, stream_call)}

    third = run_child(script, base, "chain", store, python=python, env=env)
    after_third = len(api.requests)
    assert third.answers == reference.answers, (third.answers, reference.answers)
    # the killed stream is sent again (it never settled), and so is everything after it; nothing else
    assert after_third - after_second == (7 - stream_call) * calls_per_step, request_keys(api, after_second)

    # the server saw each request of the chain as often as the uninterrupted run did, plus the killed stream once more
    sent = Counter(request_keys(api, mark))
    expected = Counter(reference_requests)
    extra = sent - expected
    assert not expected - sent, f"requests missing: {expected - sent}"
    assert sum(extra.values()) == calls_per_step, f"requests sent twice: {extra}"

    events = read_events("chain", store)
    settled = [e for e in events if e["type"] == "call_settled"]
    started = [e for e in events if e["type"] == "call_started"]
    assert len(settled) == 6 * calls_per_step
    assert len(started) == len(settled) + calls_per_step  # the killed stream's intent never settled
    assert third.receipt is not None
    resume = third.receipt["resume"]
    assert resume["attempts"] == 3 and resume["possible_double_count_calls"] == calls_per_step
    assert resume["prior_calls"] == (stream_call - 1) * calls_per_step
    assert len(third.receipt["calls"]) == 6 * calls_per_step and third.receipt["unjournaled"] == []
    with_usage = [c for c in third.receipt["calls"] if c["prompt_tokens"] > 0 and c["completion_tokens"] > 0]
    assert len(with_usage) == 6 * calls_per_step if usage else with_usage, third.receipt["calls"]
    return {"reference": reference, "attempts": (first, second, third), "events": events, "store": store}

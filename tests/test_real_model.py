"""Durable runs against a REAL local OpenAI-compatible server (SmolLM2 via `transformers serve`).

The server is started from tests/servers/model_server.py (its own venv; `python
tests/servers/model_server.py setup` builds it). A counting proxy in front of it records what the
server really received. Locally these tests skip when the server's venv is not built; under
CI=true they fail.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from servers.counting_proxy import CountingProxy

CHILDREN = Path(__file__).parent / "children"


@pytest.fixture
def proxy(model_server):  # model_server: conftest.py's, one server for this module
    counting = CountingProxy(model_server.url)
    yield counting
    counting.close()


def _events(store: Path, run_id: str) -> list[dict]:
    path = store / run_id / "journal.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.endswith("}")]


def _wait(predicate, timeout: float, proc: subprocess.Popen) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert proc.poll() is None, proc.stderr.read() if proc.stderr else "child exited"
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.005)


def test_agent_killed_mid_call_resumes_and_third_run_spends_nothing(project, child_env, model_server, proxy):
    from caravanserai import open_store, run_summary

    _, model_name = model_server
    store = project / "store"
    args = [sys.executable, str(CHILDREN / "real_agent.py"), proxy.url, model_name, str(store), "real-1"]
    child = subprocess.Popen(args, cwd=project, env=child_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    # kill once the request is at the server and its answer is not yet journaled
    _wait(lambda: len(proxy.posts("/chat/completions")) == 1, 120, child)
    os.kill(child.pid, signal.SIGKILL)
    child.wait()
    lines = open_store(str(store)).load("real-1")
    summary = run_summary(lines)
    assert summary["status"] == "pending" and summary["attempts"] == 1
    assert [e["type"] for e in _events(store, "real-1")] == ["run_started", "call_started"]

    second = subprocess.run(args, cwd=project, env=child_env, capture_output=True, text=True, timeout=300)
    assert second.returncode == 0, second.stderr
    out = json.loads(second.stdout)
    resume = out["receipt"]["resume"]
    assert resume["attempts"] == 2 and resume["possible_double_count_calls"] == 1
    assert resume["prior_calls"] == 0 and resume["prior_tokens"] == 0 and resume["discarded_partial_turn"] is False
    assert "paris" in out["text"].lower()
    assert run_summary(open_store(str(store)).load("real-1"))["status"] == "completed"
    assert len(proxy.posts("/chat/completions")) == 2  # the killed request and its re-drive
    tokens = out["receipt"]["tokens"]
    assert tokens > 0 and out["receipt"]["calls"][0]["prompt_tokens"] > 0

    third = subprocess.run(args, cwd=project, env=child_env, capture_output=True, text=True, timeout=300)
    assert third.returncode == 0, third.stderr
    again = json.loads(third.stdout)
    assert again["replayed"] is True and again["text"] == out["text"]
    assert len(proxy.posts("/chat/completions")) == 2  # the third run sent nothing: zero tokens spent
    assert again["receipt"]["tokens"] == tokens and len(again["receipt"]["calls"]) == 1


def test_openai_client_loop_killed_and_resumed_matches_uninterrupted(project, child_env, model_server, proxy):
    _, model_name = model_server
    store = project / "store"

    def launch(run_id: str) -> subprocess.Popen:
        return subprocess.Popen([sys.executable, str(CHILDREN / "real_client_loop.py"), proxy.url + "/v1", model_name,
                                 str(store), run_id], cwd=project, env=child_env, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)

    child = launch("loop")
    _wait(lambda: any(e["type"] == "waypoint" and e["n"] == 2 for e in _events(store, "loop")), 300, child)
    os.kill(child.pid, signal.SIGKILL)
    child.wait()
    settled_before = [e["call"]["request_sha256"] for e in _events(store, "loop") if e["type"] == "call_settled"]
    sent_before = len(proxy.posts())
    resumed = launch("loop")
    out, err = resumed.communicate(timeout=300)
    assert resumed.returncode == 0, err
    assert out.splitlines()[0] in ("step 3", "step 2")  # resumes after its last waypoint, never from step 1
    outputs = json.loads(out.splitlines()[-1])
    # the server never saw a request again whose answer was already journaled
    bodies = [json.dumps(b, sort_keys=True) for b in proxy.posts()]
    repeated = {b for b in bodies if bodies.count(b) > 1}
    assert len(settled_before) >= 4
    assert len(repeated) <= 1, f"settled requests re-sent: {len(repeated)}"  # at most the one in flight at the kill
    assert len(proxy.posts()) - sent_before <= 2 * 2 + 1

    fresh = launch("uninterrupted")
    clean_out, err = fresh.communicate(timeout=300)
    assert fresh.returncode == 0, err
    assert outputs == json.loads(clean_out.splitlines()[-1])  # temperature 0: same result as an uninterrupted run

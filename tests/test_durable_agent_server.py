"""DurableAgent's OpenAI-compatible ``/v1/completions`` backend against REAL local servers.

* ``transformers serve`` (SmolLM2, tests/servers/model_server.py): checkpoint after step 1, resume in a
  fresh process, compared with an uninterrupted run; a counting proxy proves what the server received.
* Failures: a closed port, a server answering 500, malformed bodies (a tiny stdlib server here).
* vLLM CPU (tests/servers/vllm_server.py): a real prefix cache, so a resume reports ``tokens_saved``.

Locally, server tests skip when a server's venv is not built (``python tests/servers/model_server.py
setup`` / ``python tests/servers/vllm_server.py setup``); under CI=true they fail instead.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import need
from servers import model_server as ms
from servers.counting_proxy import CountingProxy
from servers.loopback import LoopbackHTTP

from caravanserai import DurableAgent, ModelError

CHILDREN = Path(__file__).parent / "children"
MODEL_ID = f"vllm/{ms.MODEL_NAME}"  # the backend strips "vllm/": requests name ms.MODEL_NAME

PROMPTS = [
    "You are a careful coding agent. Step 1: read src/io.py and say in one sentence what it does.",
    "Step 2: run the test suite and report how many tests failed.",
    "Step 3: propose a one-line fix for the first failing test.",
    "Step 4: write the commit message for that fix.",
]

# >= 300 shared tokens (about 600 with the SmolLM2 tokenizer), so vLLM's prefix cache
# (whole 128-token blocks on CPU) applies to every request.
PREAMBLE = "Project notes for the agent.\n" + "\n".join(
    f"Note {i}: file src/module_{i}.py defines handle_{i}(order), which validates the order fields, "
    f"retries the payment call at most {i % 3 + 1} times and writes one log line." for i in range(20)
)
LONG_PROMPTS = [f"{PREAMBLE}\n\nTask {i + 1}: {p.split(': ', 1)[1]}" for i, p in enumerate(PROMPTS)]


def _completions(proxy: CountingProxy) -> list[dict]:
    return [b for b in proxy.posts("/v1/completions") if isinstance(b, dict)]


def _assert_requests_chain(bodies: list[dict], steps: list[int], prompts: list[str], outputs: list[str]) -> None:
    """Each request = the step's prompt, then the previous step's output (as text); the model name is stripped."""
    assert len(bodies) == len(steps)
    for body, step in zip(bodies, steps):
        assert body["model"] == ms.MODEL_NAME
        sent = body["prompt"]
        assert sent.startswith(prompts[step]), (step, sent[:200])
        if step == 0 or not outputs[step - 1]:
            assert sent == prompts[step]
        else:
            rest = sent[len(prompts[step]):]
            assert rest.endswith(outputs[step - 1]), (step, rest)
            assert rest[: len(rest) - len(outputs[step - 1])].strip() == "", (step, rest)


def _resume_in_child(ckpt_file: Path, base_url: str, env: dict[str, str], cwd: Path) -> dict:
    env = dict(env, VLLM_BASE_URL=base_url)
    env.pop("VLLM_API_KEY", None)
    done = subprocess.run([sys.executable, str(CHILDREN / "agent_server_resume.py"), str(ckpt_file)],
                          cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


# ------------------------------------------------------------------ transformers serve


@pytest.fixture(scope="module")
def reference(model_server):  # model_server: conftest.py's (transformers serve), one for this module
    """The uninterrupted run (all steps in one go), sent straight to the server."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("VLLM_BASE_URL", model_server.url)
        mp.delenv("VLLM_API_KEY", raising=False)
        agent = DurableAgent().begin(PROMPTS, model_id=MODEL_ID)
        agent.run_until_step(len(PROMPTS) - 1)
        return agent.step_outputs()


@pytest.fixture
def tf_proxy(model_server):
    proxy = CountingProxy(model_server.url)
    yield proxy
    proxy.close()


def test_checkpoint_resumes_in_fresh_process_like_uninterrupted_run(project, child_env, monkeypatch, tf_proxy, reference):
    assert all(isinstance(o, str) for o in reference) and any(o.strip() for o in reference)
    monkeypatch.setenv("VLLM_BASE_URL", tf_proxy.url)
    monkeypatch.delenv("VLLM_API_KEY", raising=False)

    agent = DurableAgent().begin(PROMPTS, model_id=MODEL_ID)
    assert agent.backend == "vllm"
    ckpt = agent.run_until_step(1)
    assert agent.computed_steps == [0, 1]
    assert agent.step_outputs() == reference[:2] + [None, None]
    before = _completions(tf_proxy)
    assert len(before) == 2
    _assert_requests_chain(before, [0, 1], PROMPTS, reference)
    assert agent.tokens_saved == 0  # transformers serve reports no cached_tokens
    ckpt_file = project / "agent.ckpt"
    ckpt_file.write_bytes(ckpt)

    # Reading a checkpoint needs no server and no VLLM_BASE_URL.
    monkeypatch.delenv("VLLM_BASE_URL")
    info = DurableAgent.inspect(ckpt)
    assert info["backend"] == "vllm" and info["model_id"] == MODEL_ID and info["steps"] == 4
    assert info["executed_nodes"] == ["step-0", "step-1"]
    assert info["pending_nodes"] == ["step-2", "step-3"]
    assert info["kv_tokens"] == 0  # the KV cache lives in the server

    resumed = _resume_in_child(ckpt_file, tf_proxy.url, child_env, project)
    assert resumed["backend"] == "vllm"
    assert resumed["outputs"] == reference  # text, identical to the uninterrupted run
    assert all(isinstance(o, str) for o in resumed["outputs"])
    assert resumed["computed_steps"] == [2, 3]  # steps 0-1 came from the checkpoint
    assert resumed["tokens_saved"] == 0

    everything = _completions(tf_proxy)
    assert len(everything) == 4  # exactly one request per step overall: 2 before the checkpoint, 2 after
    _assert_requests_chain(everything, [0, 1, 2, 3], PROMPTS, reference)
    assert ckpt_file.read_bytes() == ckpt  # resuming does not rewrite the checkpoint


# ------------------------------------------------------------------ failures


def test_unreachable_server_raises_and_leaves_checkpoint_usable(project, monkeypatch, model_server, reference):
    monkeypatch.setenv("VLLM_BASE_URL", model_server.url)
    monkeypatch.delenv("VLLM_API_KEY", raising=False)
    ckpt = DurableAgent().begin(PROMPTS, model_id=MODEL_ID).run_until_step(0)
    saved = bytes(ckpt)
    info_before = DurableAgent.inspect(ckpt)

    monkeypatch.setenv("VLLM_BASE_URL", f"http://127.0.0.1:{ms.free_port()}")  # nothing listens there
    broken = DurableAgent()
    with pytest.raises(ModelError) as caught:
        broken.resume_from(ckpt)
    assert caught.value.kind == "unreachable"
    assert broken.computed_steps == []
    assert broken.step_outputs() == reference[:1] + [None, None, None]  # nothing half-recorded
    assert DurableAgent.inspect(broken.checkpoint()) == info_before
    assert ckpt == saved and DurableAgent.inspect(ckpt) == info_before

    # A fresh run fails the same way, before any step is recorded.
    fresh = DurableAgent().begin(PROMPTS, model_id=MODEL_ID)
    with pytest.raises(ModelError) as caught:
        fresh.run_until_step(0)
    assert caught.value.kind == "unreachable"
    assert fresh.step_outputs() == [None] * 4

    # Later, with the server back, the same checkpoint resumes to the uninterrupted result.
    monkeypatch.setenv("VLLM_BASE_URL", model_server.url)
    again = DurableAgent()
    assert again.resume_from(ckpt) == reference
    assert again.computed_steps == [1, 2, 3]


class _BrokenServer(LoopbackHTTP):
    """127.0.0.1 server whose first path segment chooses the failure: /500, /notjson, /nochoices, /notext."""

    ANSWERS = {
        "500": (500, b'{"error": {"message": "boom", "type": "internal_error"}}'),
        "notjson": (200, b"<html>this is not json"),
        "nochoices": (200, b'{"object": "text_completion", "choices": []}'),
        "notext": (200, b'{"object": "text_completion", "choices": [{"index": 0, "text": null}]}'),
    }

    def __init__(self) -> None:
        self.requests: list[tuple[str, bytes]] = []
        super().__init__(self._respond)

    def _respond(self, method, path, headers, body) -> tuple[int, bytes, dict[str, str]]:
        self.requests.append((path, body))
        status, data = self.ANSWERS[path.strip("/").split("/")[0]]
        return status, data, {"Content-Type": "application/json"}


@pytest.fixture(scope="module")
def broken_server():
    server = _BrokenServer()
    yield server
    server.close()


@pytest.mark.parametrize("mode, kind", [("500", "status"), ("notjson", "malformed"),
                                        ("nochoices", "malformed"), ("notext", "malformed")])
def test_bad_status_and_malformed_bodies_raise_model_error(project, monkeypatch, broken_server, mode, kind):
    monkeypatch.setenv("VLLM_BASE_URL", f"{broken_server.url}/{mode}")
    monkeypatch.delenv("VLLM_API_KEY", raising=False)
    seen = len(broken_server.requests)
    agent = DurableAgent().begin(PROMPTS, model_id=MODEL_ID)
    assert agent.backend == "vllm"
    with pytest.raises(ModelError) as caught:
        agent.run_until_step(1)
    assert caught.value.kind == kind
    if kind == "status":
        assert caught.value.status == 500
    assert agent.step_outputs() == [None] * 4 and agent.computed_steps == []
    path, body = broken_server.requests[seen]
    assert len(broken_server.requests) == seen + 1  # stopped at the first failure, no retry
    assert path == f"/{mode}/v1/completions"
    assert json.loads(body)["model"] == ms.MODEL_NAME and json.loads(body)["prompt"] == PROMPTS[0]


# ------------------------------------------------------------------ vLLM (real prefix cache)


@pytest.fixture(scope="module")
def vllm_server():
    from servers import vllm_server as vs

    need(vs.is_built() and ms.DEFAULT_MODEL_DIR.exists(),
         "the vLLM test server is not set up: python tests/servers/vllm_server.py setup")
    proc, base_url = vs.start_server()
    try:
        yield base_url.removesuffix("/v1")
    finally:
        vs.stop_server(proc)


@pytest.mark.slow
def test_vllm_second_resume_reports_cached_tokens(project, child_env, monkeypatch, vllm_server):
    proxy = CountingProxy(vllm_server)
    try:
        monkeypatch.setenv("VLLM_BASE_URL", proxy.url)
        monkeypatch.delenv("VLLM_API_KEY", raising=False)
        agent = DurableAgent().begin(LONG_PROMPTS, model_id=MODEL_ID)
        assert agent.backend == "vllm"
        ckpt_file = project / "agent.ckpt"
        ckpt_file.write_bytes(agent.run_until_step(1))
        first_two = _completions(proxy)
        assert len(first_two) == 2

        first = _resume_in_child(ckpt_file, proxy.url, child_env, project)
        second = _resume_in_child(ckpt_file, proxy.url, child_env, project)
        bodies = _completions(proxy)
    finally:
        proxy.close()

    assert first["computed_steps"] == second["computed_steps"] == [2, 3]
    assert len(bodies) == 6  # 2 + 2 per resume: completed steps are never re-sent
    assert first["outputs"] == second["outputs"]
    assert first["outputs"][:2] == agent.step_outputs()[:2]
    assert all(isinstance(o, str) for o in first["outputs"])
    _assert_requests_chain(bodies[:4], [0, 1, 2, 3], LONG_PROMPTS, first["outputs"])
    assert bodies[2:4] == bodies[4:6]  # both resumes sent the very same requests
    # The second resume's prompts were all seen before: vLLM reports their cached blocks.
    assert second["tokens_saved"] > 0
    assert second["tokens_saved"] >= 2 * 256, second  # every prompt is > 2 whole 128-token blocks

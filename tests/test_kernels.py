"""``%%resumable`` cells in REAL Jupyter kernels making REAL model calls.

Each test starts an ipykernel (the venv's python, cwd = a tmp project whose default store is
``./.caravanserai``, PYTHONPATH = the repo) through jupyter_client, or a notebook through
nbclient. The cells call the local OpenAI-compatible model server (SmolLM2 via ``transformers
serve``, tests/servers/model_server.py) through ``caravanserai.durable_client(openai.OpenAI(...))``
with a CountingProxy in front that records what the server really received. The kernel is
SIGKILLed (``km.provisioner.pid``) or interrupted mid-loop once waypoints are in the journal,
restarted, the setup cells and the loop cell re-run, and the tests check that the loop resumed at
its last waypoint with its variables back, that the server never saw a settled request again, and
that the result equals an uninterrupted run's. Locally they skip when the model server's venv is
not built; under CI=true they fail.
"""

from __future__ import annotations

import ast
import json
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
from conftest import need_kernel_packages
from kernel_helpers import Kernel, Reply, child_env, count, events, topic_of, wait_for_waypoints
from servers.counting_proxy import CountingProxy

TOPICS = ["rivers", "mountains", "deserts", "forests"]
MAX_TOKENS = 6
KILL_AFTER = 2  # waypoints in the journal


@pytest.fixture(scope="module", autouse=True)
def kernel_packages() -> None:
    """Checked before conftest.py's model_server (same scope: autouse fixtures come first) starts a server."""
    need_kernel_packages()


@pytest.fixture(scope="module")
def uninterrupted(model_server, tmp_path_factory):
    """The loop notebook run top to bottom once, uninterrupted, by nbclient (run id "uninterrupted")."""
    _, model = model_server
    project = tmp_path_factory.mktemp("uninterrupted")
    counting = CountingProxy(model_server.url)
    try:
        nb = execute_notebook(loop_notebook(counting, model, "uninterrupted"), project)
        assert [topic_of(b) for b in counting.posts("/chat/completions")] == TOPICS
    finally:
        counting.close()
    return {"project": project, "notebook": nb, "outputs": json.loads(stream_text(nb.cells[3]))}


@pytest.fixture(scope="module")
def reference(uninterrupted) -> list[str]:
    """What the loop returns when nothing interrupts it (temperature 0: the same every time)."""
    return uninterrupted["outputs"]


def request(topic: str) -> dict:
    return {"temperature": 0, "max_tokens": MAX_TOKENS,
            "messages": [{"role": "user", "content": f"Name one fact about {topic}."}]}


def loop_notebook(counting: CountingProxy, model: str, run_id: str):
    import nbformat

    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.cells = [nbformat.v4.new_code_cell(source) for source in (
        "%load_ext caravanserai",
        SETUP.format(base=counting.url + "/v1", model=model, topics=TOPICS, max_tokens=MAX_TOKENS),
        loop_cell(run_id),
        "print(json.dumps(outputs))",
    )]
    return nb


def execute_notebook(nb, project: Path):
    from nbclient import NotebookClient

    NotebookClient(nb, timeout=120, kernel_name="python3",
                   resources={"metadata": {"path": str(project)}}).execute(env=child_env(project))
    return nb


def stream_text(cell) -> str:
    return "".join(o.get("text", "") for o in cell.outputs if o.output_type == "stream")


SETUP = """\
import asyncio, json, sys
import openai
import caravanserai
from caravanserai import checkpoint
client = caravanserai.durable_client(openai.OpenAI(base_url={base!r}, api_key="x", max_retries=0))
MODEL = {model!r}
TOPICS = {topics!r}

def ask(topic):
    reply = client.chat.completions.create(
        model=MODEL, temperature=0, max_tokens={max_tokens},
        messages=[{{"role": "user", "content": f"Name one fact about {{topic}}."}}])
    return reply.choices[0].message.content

print(sys.executable)
"""

LOOP = """\
%%resumable {run_id}{flags}
outputs = []
print(f"starting with {{len(outputs)}} output(s)", flush=True)
for i in range(len(outputs), len(TOPICS)):
    print(f"{label} {{i + 1}}", flush=True)
    outputs.append(ask(TOPICS[i]))
    checkpoint({{"done": i + 1}}, f"{label} {{i + 1}}: {{TOPICS[i]}}")
outputs
"""

ASYNC_LOOP = """\
%%resumable {run_id}
outputs = []
print(f"starting with {{len(outputs)}} output(s)", flush=True)
for i in range(len(outputs), len(TOPICS)):
    print(f"step {{i + 1}}", flush=True)
    await asyncio.sleep(0.05)
    outputs.append(await asyncio.to_thread(ask, TOPICS[i]))
    checkpoint({{"done": i + 1}}, f"step {{i + 1}}: {{TOPICS[i]}}")
outputs
"""


def loop_cell(run_id: str, flags: str = "", label: str = "step") -> str:
    return LOOP.format(run_id=run_id, flags=flags, label=label)


def setup_cells(k: Kernel, proxy: CountingProxy, model: str) -> None:
    k.ok("%load_ext caravanserai")
    out = k.ok(SETUP.format(base=proxy.url + "/v1", model=model, topics=TOPICS, max_tokens=MAX_TOKENS)).stdout
    assert out.strip() == sys.executable  # the kernel runs the venv's python


def outputs_of(k: Kernel) -> list[str]:
    return json.loads(k.ok("print(json.dumps(outputs))").stdout)


def check_resumed(tmp_path: Path, run_id: str, proxy: CountingProxy, sent_at_kill: int, got: Reply,
                  label: str = "step") -> int:
    """The cell resumed after its last waypoint, with `outputs` back, and re-sent no settled call."""
    before = [e for e in events(tmp_path, run_id)]
    waypoints = sum(e["type"] == "waypoint" for e in before[: _index_of_second_attempt(before)])
    assert got.status == "ok", f"{got.ename}: {got.evalue}"
    assert got.steps(label) == list(range(waypoints + 1, len(TOPICS) + 1)), got.stdout  # first step printed = resume point
    assert f"starting with {waypoints} output(s)" in got.stdout  # `outputs` restored, `outputs = []` skipped
    assert any("restored" in text and "outputs" in text for text in got.displays), got.displays
    posts = proxy.posts("/chat/completions")
    before_kill = [topic_of(b) for b in posts[:sent_at_kill]]
    after = [topic_of(b) for b in posts[sent_at_kill:]]
    settled = before_kill[: sum(e["type"] == "call_settled" for e in before[: _index_of_second_attempt(before)])]
    assert before_kill in (TOPICS[: len(settled)], TOPICS[: len(settled) + 1])  # at most one in flight at the kill
    assert after == TOPICS[len(settled):], (before_kill, after)  # no settled request was sent again
    repeated = [t for t, n in Counter(before_kill + after).items() if n > 1]
    assert len(repeated) <= 1 and all(t == TOPICS[len(settled)] for t in repeated)
    return waypoints


def _index_of_second_attempt(events_: list[dict]) -> int:
    return next((i for i, e in enumerate(events_) if e["type"] == "attempt"), len(events_))


# ---- SIGKILL + restart ----------------------------------------------------------------------
def test_sigkilled_kernel_resumes_the_loop_at_its_last_waypoint(tmp_path, kernel, model_server, proxy, reference):
    _, model = model_server
    k = kernel()
    setup_cells(k, proxy, model)
    k.submit(loop_cell("killed"))
    wait_for_waypoints(tmp_path, "killed", KILL_AFTER)
    k.kill_and_restart()
    sent_at_kill = len(proxy.posts("/chat/completions"))
    assert count(tmp_path, "killed", "run_completed") == 0

    setup_cells(k, proxy, model)  # a restarted kernel has nothing: setup cells first, as a person would
    got = k.run(loop_cell("killed"))
    resumed_at = check_resumed(tmp_path, "killed", proxy, sent_at_kill, got)
    assert resumed_at >= KILL_AFTER
    resumed = outputs_of(k)
    # the same as the uninterrupted run of the same cell under another run id (the `uninterrupted` fixture)
    assert resumed == reference and ast.literal_eval(got.result) == reference
    journal = events(tmp_path, "killed")
    assert journal[-1]["type"] == "run_completed" and sum(e["type"] == "attempt" for e in journal) == 1


# ---- Kernel > Interrupt ---------------------------------------------------------------------
def test_interrupted_loop_resumes_in_the_same_kernel(tmp_path, kernel, model_server, proxy, reference):
    _, model = model_server
    k = kernel()
    setup_cells(k, proxy, model)
    msg_id = k.submit(loop_cell("interrupted"))
    wait_for_waypoints(tmp_path, "interrupted", KILL_AFTER)
    k.km.interrupt_kernel()
    reply = k.reply_to(msg_id)
    assert reply["status"] == "error" and reply["ename"] == "KeyboardInterrupt"
    time.sleep(0.5)  # let the proxy record a request the interrupt cut off mid-send
    sent_at_kill = len(proxy.posts("/chat/completions"))
    journal = events(tmp_path, "interrupted")
    assert not any(e["type"] in ("run_failed", "run_completed") for e in journal)  # pending, resumable

    k.ok("outputs = ['scribbled over after the interrupt']")  # the cell's saved variables win on resume
    got = k.run(loop_cell("interrupted"))
    check_resumed(tmp_path, "interrupted", proxy, sent_at_kill, got)
    assert outputs_of(k) == reference


# ---- async loop with await ------------------------------------------------------------------
def test_async_loop_with_await_resumes_after_sigkill(tmp_path, kernel, model_server, proxy, reference):
    _, model = model_server
    k = kernel()
    setup_cells(k, proxy, model)
    cell = ASYNC_LOOP.format(run_id="async-loop")
    k.submit(cell)
    wait_for_waypoints(tmp_path, "async-loop", KILL_AFTER)
    k.kill_and_restart()
    sent_at_kill = len(proxy.posts("/chat/completions"))
    setup_cells(k, proxy, model)
    got = k.run(cell)
    check_resumed(tmp_path, "async-loop", proxy, sent_at_kill, got)
    assert outputs_of(k) == reference and ast.literal_eval(got.result) == reference


# ---- edited cell: CellChanged, then --fork ----------------------------------------------------
def test_edited_cell_is_refused_then_forked_from_the_last_waypoint(tmp_path, kernel, model_server, proxy, reference):
    _, model = model_server
    k = kernel()
    setup_cells(k, proxy, model)
    k.submit(loop_cell("original"))
    wait_for_waypoints(tmp_path, "original", KILL_AFTER)
    k.kill_and_restart()
    sent_at_kill = len(proxy.posts("/chat/completions"))
    parent = events(tmp_path, "original")
    setup_cells(k, proxy, model)

    changed = k.run(loop_cell("original", label="item"))  # edited: prints "item N" instead of "step N"
    assert changed.status == "error" and changed.ename == "CellChanged"
    assert 'print(f"item {i + 1}"' in changed.evalue and 'print(f"step {i + 1}"' in changed.evalue
    assert "--fork NEW_ID" in changed.evalue and "--restart" in changed.evalue
    assert events(tmp_path, "original") == parent  # refused before anything was written
    assert len(proxy.posts("/chat/completions")) == sent_at_kill

    got = k.run(loop_cell("original", flags=" --fork forked", label="item"))
    waypoints = sum(e["type"] == "waypoint" for e in parent)
    assert got.status == "ok", f"{got.ename}: {got.evalue}"
    assert got.steps("item") == list(range(waypoints + 1, len(TOPICS) + 1)), got.stdout
    assert f"starting with {waypoints} output(s)" in got.stdout
    after = [topic_of(b) for b in proxy.posts("/chat/completions")[sent_at_kill:]]
    assert after == TOPICS[waypoints:]  # settled steps came over with the fork, not from the server
    assert outputs_of(k) == reference
    started = events(tmp_path, "forked")[0]
    assert started["type"] == "run_started" and started["forked_from"]["run_id"] == "original"
    assert events(tmp_path, "original") == parent  # the parent stays as it was


# ---- completed run re-run, through nbclient -----------------------------------------------------
def test_completed_notebook_rerun_in_a_new_kernel_sends_nothing(uninterrupted, model_server, proxy, reference):
    _, model = model_server
    first = uninterrupted["notebook"]
    project = uninterrupted["project"]
    journal = events(project, "uninterrupted")
    # a new kernel runs the same notebook top to bottom again (its setup cell now names this test's proxy)
    second = execute_notebook(loop_notebook(proxy, model, "uninterrupted"), project)
    assert proxy.posts() == []  # the server saw nothing
    loop_out = stream_text(second.cells[2])
    assert [line for line in loop_out.splitlines() if line.startswith("step ")] == ["step 1", "step 2", "step 3", "step 4"]
    assert stream_text(second.cells[2]) == stream_text(first.cells[2])  # the recorded output, re-shown
    statuses = [str(o.get("data", {}).get("text/plain", "")) for o in second.cells[2].outputs if o.output_type == "display_data"]
    assert any("completed earlier" in s for s in statuses), statuses
    assert json.loads(stream_text(second.cells[3])) == reference  # the variables came back too
    assert events(project, "uninterrupted") == journal  # nothing appended, not even an attempt
    shown = [o["data"]["text/plain"] for o in second.cells[2].outputs if o.output_type == "execute_result"]
    was = [o["data"]["text/plain"] for o in first.cells[2].outputs if o.output_type == "execute_result"]
    assert len(shown) == 1 and ast.literal_eval(shown[0]) == reference
    assert shown == was, "the completed cell's value is re-shown differently from how it was displayed"


# ---- one journaled call, replayed on the re-run: sync and async clients ------------------------
REPLAY = """\
%%resumable replay-{kind}
answer = {call}.choices[0].message.content
print("answered", flush=True)
if crash:
    raise RuntimeError("crash after the call")
answer
"""


@pytest.mark.parametrize("kind", ["OpenAI", "AsyncOpenAI"])
def test_a_journaled_call_is_replayed_not_resent(tmp_path, kernel, model_server, proxy, reference, kind):
    _, model = model_server
    k = kernel()
    setup_cells(k, proxy, model)
    k.ok(f"aclient = caravanserai.durable_client(openai.{kind}(base_url={proxy.url + '/v1'!r}, api_key='x', max_retries=0))")
    create = "aclient.chat.completions.create(model=MODEL, **REQUEST)"
    call = f"(await {create})" if kind == "AsyncOpenAI" else create
    k.ok(f"REQUEST = {request(TOPICS[0])!r}\ncrash = True")
    cell = REPLAY.format(kind=kind, call=call)
    first = k.run(cell)
    assert first.ename == "RuntimeError", f"the {kind} call failed: {first.ename}: {first.evalue}"
    assert len(proxy.posts("/chat/completions")) == 1 and count(tmp_path, f"replay-{kind}", "call_settled") == 1

    k.kill_and_restart()
    setup_cells(k, proxy, model)
    k.ok(f"aclient = caravanserai.durable_client(openai.{kind}(base_url={proxy.url + '/v1'!r}, api_key='x', max_retries=0))")
    k.ok(f"REQUEST = {request(TOPICS[0])!r}\ncrash = False")
    again = k.ok(cell)
    assert len(proxy.posts("/chat/completions")) == 1  # answered from the journal
    assert ast.literal_eval(again.result) == reference[0]

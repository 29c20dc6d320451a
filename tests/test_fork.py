"""``caravanserai.fork(run_id, at=N)``: any run continued from one of its waypoints under a new id.

The child resumes at N + 1 with the state of waypoint N; the calls the parent had already settled
for step N + 1 replay from the journal (nothing sent, nothing paid); the parent's journal is
byte-identical before and after; a fork of a fork works; bad input writes nothing. The CLI form
and ``%%resumable NEW --from RUN@N`` (in-process shell here; a real kernel in test_kernels) too.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import caravanserai
from caravanserai import NoSuchWaypoint, RunExists, SerializationError, durable, fork, inspect_run
from caravanserai.cli import main
from caravanserai.runs import read_events
from caravanserai.testing import ScriptedModel


def work(run_id: str, model: ScriptedModel, upto: int = 5) -> list[str]:
    """A durable loop: one model call per step, then a waypoint with the answers so far."""
    with durable(run_id) as run:
        state = run.state or {"step": 0, "answers": []}
        for step in range(state["step"], upto):
            reply = run.call_model(model, [{"role": "user", "content": f"question {step}"}])
            state = {"step": step + 1, "answers": [*state["answers"], reply.text]}
            run.checkpoint(state, f"answered question {step}")
    return state["answers"]


def journal(project: Path, run_id: str) -> bytes:
    return (project / ".caravanserai" / run_id / "journal.jsonl").read_bytes()


@pytest.fixture
def parent(project: Path) -> bytes:
    """A finished run of 5 steps; then its journal as it stands (the fork must not change it)."""
    work("parent", ScriptedModel([f"answer {i}" for i in range(5)]))
    caravanserai.runs.close_all()
    return journal(project, "parent")


def test_a_fork_resumes_after_its_waypoint_and_replays_settled_calls_for_free(project, parent):
    child = fork("parent", at=3)
    assert child == "parent-fork-3"
    assert journal(project, "parent") == parent  # the parent is never modified
    fresh = ScriptedModel(["new answer 4"])
    answers = work(child, fresh)
    assert answers == ["answer 0", "answer 1", "answer 2", "answer 3", "new answer 4"]
    assert [m[-1]["content"] for m in fresh.requests] == ["question 4"]  # step 4's call replayed from the journal
    view = inspect_run(child)
    assert view.parent is not None and view.parent.run_id == "parent" and [w.n for w in view.waypoints] == [1, 2, 3, 4, 5]
    replayed = [c for c in view.calls if c.replayed]
    assert [c.call_id for c in replayed] == ["run#4"] and replayed[0].replayed_in == (1,)  # the fork's own attempt 1
    assert len([c for c in view.calls if c.paid and c.attempt == 1]) == 1  # only question 4 was paid by the child
    assert journal(project, "parent") == parent


def test_a_fork_with_an_edited_state_and_a_fork_of_a_fork(project, parent):
    child = fork("parent", at=2, new_run_id="what-if", state={"step": 2, "answers": ["A", "B"]})
    answers = work(child, ScriptedModel(["c", "d", "e"]))
    assert answers == ["A", "B", "answer 2", "c", "d"]  # question 2's settled call replays; the rest are new
    grandchild = fork("what-if", at=4)
    origin = read_events(grandchild)[0]["forked_from"]
    assert origin["run_id"] == "what-if" and origin["waypoint"] == 4
    assert work(grandchild, ScriptedModel(["z"])) == ["A", "B", "answer 2", "c", "d"]  # step 5's call replays
    notes = [w.note for w in inspect_run("what-if").waypoints]
    assert notes[1].endswith("(edited in this fork: state)")
    assert journal(project, "parent") == parent


@pytest.mark.parametrize("call,error", [
    (lambda: fork("parent", at=9), NoSuchWaypoint),
    (lambda: fork("parent", at=2, new_run_id="parent"), RunExists),
    (lambda: fork("parent", at=2, new_run_id="bad id!"), caravanserai.InvalidRunId),
    (lambda: fork("parent", at=2, state={"when": {1, 2}}), SerializationError),
    (lambda: fork("nobody", at=1), caravanserai.RunNotFound),
])
def test_bad_forks_write_nothing(project, parent, call, error):
    before = sorted(p.name for p in (project / ".caravanserai").iterdir())
    with pytest.raises(error) as info:
        call()
    assert "\n" not in str(info.value)
    assert sorted(p.name for p in (project / ".caravanserai").iterdir()) == before
    assert journal(project, "parent") == parent


def test_the_cli_forks_a_run_at_a_waypoint(project, parent, capsys):
    assert main(["fork", "parent", "--at", "2", "--as", "cli-fork", "--state", '{"step": 2, "answers": ["x", "y"]}']) == 0
    printed = capsys.readouterr().out.splitlines()
    assert printed[0] == "cli-fork" and printed[-1].strip() == "caravanserai resume cli-fork"  # the id, then the next step
    assert caravanserai.load_latest("cli-fork")[0] == {"step": 2, "answers": ["x", "y"]}
    assert main(["fork", "parent", "--at", "7"]) == 1
    assert "no waypoint 7" in capsys.readouterr().err
    assert main(["fork", "parent", "--at", "2", "abc", "prompt-0", "x"]) == 2
    assert journal(project, "parent") == parent


def test_resumable_from_another_runs_waypoint(project):
    from IPython.testing.globalipapp import get_ipython
    from IPython.utils.capture import capture_output

    ip = get_ipython()
    ip.run_line_magic("load_ext", "caravanserai")
    try:
        loop = ("%%resumable {head}\nfrom caravanserai import resumable_iterate\ntotal = 0\n"
                "for i in resumable_iterate(range(6)):\n    total += i * {k}\ntotal\n")
        with capture_output():
            first = ip.run_cell(loop.format(head="squares", k=1))
        assert first.success and first.result == 15
        with capture_output():
            branched = ip.run_cell(loop.format(head="tens --from squares@3", k=10))
        assert branched.success, branched.error_in_exec
        assert branched.result == (0 + 1 + 2) + 10 * (3 + 4 + 5)  # items 0-2 from squares, the rest as tens
        view = inspect_run("tens")
        assert view.parent is not None and view.parent.run_id == "squares" and view.status == "completed"
        with capture_output():
            again = ip.run_cell(loop.format(head="tens --from squares@3", k=10))
        assert again.success and again.result is not None and "123" in repr(again.result)  # re-shown, not re-forked
        assert json.loads(json.dumps(view.summary))["status"] == "completed"
    finally:
        ip.run_line_magic("unload_ext", "caravanserai")


# ---- %%resumable NEW --from RUN@N in a REAL kernel, with real model calls ------------------------
KERNEL_SETUP = """\
import json
import openai
import caravanserai
from caravanserai import resumable_iterate
client = caravanserai.durable_client(openai.OpenAI(base_url={base!r}, api_key="x", max_retries=0))
MODEL, TOPICS = {model!r}, ["rivers", "mountains", "deserts", "forests"]
"""

KERNEL_LOOP = """\
%%resumable {head}
answers = []
for x in resumable_iterate(range(len(TOPICS))):
    reply = client.chat.completions.create(model=MODEL, temperature=0, max_tokens=4,
        messages=[{{"role": "user", "content": f"Name one fact about {{TOPICS[x]}}."}}])
    answers.append({shape})
print(json.dumps(answers))
"""


def test_resumable_from_in_a_real_kernel(tmp_path, kernel, model_server, proxy):
    """The child restores the parent's values at waypoint 2, replays the call the parent had settled for
    item 2 from the journal, and pays only for item 3; the parent's journal does not change."""
    from kernel_helpers import events, topic_of

    k = kernel()
    k.ok("%load_ext caravanserai")
    k.ok(KERNEL_SETUP.format(base=proxy.url + "/v1", model=model_server.model))
    base = json.loads(k.ok(KERNEL_LOOP.format(head="base", shape="reply.choices[0].message.content")).stdout)
    assert [topic_of(b) for b in proxy.posts("/chat/completions")] == ["rivers", "mountains", "deserts", "forests"]
    parent_journal = (tmp_path / ".caravanserai" / "base" / "journal.jsonl").read_bytes()

    child = json.loads(k.ok(KERNEL_LOOP.format(head="upper --from base@2",
                                               shape="reply.choices[0].message.content.upper()")).stdout)
    assert child[:2] == base[:2]  # items 0-1: the parent's values at waypoint 2, not recomputed
    assert child[2:] == [text.upper() for text in base[2:]]  # the same model answers (temperature 0)
    posts = [topic_of(b) for b in proxy.posts("/chat/completions")]
    assert posts == ["rivers", "mountains", "deserts", "forests", "forests"]  # item 2 replayed free; item 3 paid
    started = events(tmp_path, "upper")[0]
    assert started["forked_from"]["run_id"] == "base" and started["forked_from"]["waypoint"] == 2
    assert (tmp_path / ".caravanserai" / "base" / "journal.jsonl").read_bytes() == parent_journal


SCRIPT = """\
import sys
import caravanserai

with caravanserai.durable(sys.argv[1]) as run:
    state = run.state or {"step": 0}
    for step in range(state["step"], 5):
        state = {"step": step + 1, "by": sys.argv[1]}
        run.checkpoint(state, f"step {step + 1}")
print("finished", sys.argv[1], state["step"])
"""


def test_resume_of_a_fork_runs_the_parents_command_pointed_at_the_fork_never_the_fork_command(project):
    import subprocess
    import sys

    (project / "steps.py").write_text(SCRIPT)
    cli = [sys.executable, "-m", "caravanserai"]
    subprocess.run([sys.executable, "steps.py", "base-run"], cwd=project, check=True, capture_output=True)
    made = subprocess.run([*cli, "fork", "base-run", "--at", "2", "--as", "base-fork"], cwd=project, capture_output=True,
                          text=True, check=True)
    assert made.stdout.splitlines()[0] == "base-fork" and "caravanserai resume base-fork" in made.stdout
    resumed = subprocess.run([*cli, "resume", "base-fork"], cwd=project, capture_output=True, text=True)
    assert resumed.returncode == 0, resumed.stderr
    assert "steps.py base-fork" in resumed.stdout and "finished base-fork 5" in resumed.stdout
    view = inspect_run("base-fork")
    assert view.status == "completed" and [a.number for a in view.attempts] == [1]
    assert [w.n for w in view.waypoints] == [1, 2, 3, 4, 5] and view.state() == {"step": 5, "by": "base-fork"}
    assert all(a.end != "killed" for a in view.attempts) and view.copied is not None and view.copied.last == 2

    # a script that names its run id itself cannot be pointed at the fork: one line says how to continue
    (project / "fixed.py").write_text(SCRIPT.replace("sys.argv[1]", "'fixed-run'"))
    subprocess.run([sys.executable, "fixed.py"], cwd=project, check=True, capture_output=True)
    subprocess.run([*cli, "fork", "fixed-run", "--at", "1", "--as", "fixed-fork"], cwd=project, check=True,
                   capture_output=True)
    refused = subprocess.run([*cli, "resume", "fixed-fork"], cwd=project, capture_output=True, text=True)
    assert refused.returncode == 1 and "durable('fixed-fork')" in refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1 and inspect_run("fixed-fork").attempts == ()


def test_a_forks_views_link_the_parents_files_and_render_its_edited_waypoint(project, parent):
    fork("parent", at=3, new_run_id="viewed", state={"step": 3, "answers": ["x"]})
    root = project / ".caravanserai"
    for n in (1, 2):  # the same bytes, one inode: 10,000 copied waypoints cost links, not writes
        mine, theirs = root / "viewed" / f"waypoint-{n}.md", root / "parent" / f"waypoint-{n}.md"
        assert mine.read_text() == theirs.read_text() and mine.stat().st_ino == theirs.stat().st_ino
    edited = (root / "viewed" / "waypoint-3.md").read_text()
    assert "(edited in this fork: state)" in edited and (root / "viewed" / "waypoint-3.md").stat().st_ino != \
        (root / "parent" / "waypoint-3.md").stat().st_ino
    assert json.loads((root / "viewed" / "state.json").read_text()) == {"step": 3, "answers": ["x"]}


def test_a_journal_naming_a_parent_outside_the_store_links_no_file_in(project):
    """The views renderer links a fork's copied waypoints from its parent's directory, named by the journal:
    a forged ``../`` parent names no file, the waypoint is rendered from the event instead."""
    from caravanserai import open_store
    from caravanserai.runs.lifecycle import registry

    secret = project / "outside" / "waypoint-1.md"
    secret.parent.mkdir()
    secret.write_text("not yours\n")
    store = open_store()
    origin = {"run_id": "../outside", "seq": 1, "waypoint": 1, "copied": 1, "started_at": "2026-12-02T00:00:00.000000+00:00"}
    run = registry.open("forged", store, attempt=False, started={"forked_from": origin})
    try:
        run.append({"type": "waypoint", "n": 1, "note": "copied note", "state": {}},
                   {"type": "waypoint", "n": 2, "note": "fork point", "state": {}},
                   {"type": "forked", "parent_run": "../outside", "at_waypoint": 2, "parent_seq": 2})
    finally:
        run.close()
    view = project / ".caravanserai" / "forged" / "waypoint-1.md"
    assert "copied note" in view.read_text() and view.stat().st_ino != secret.stat().st_ino


@pytest.mark.parametrize("variables", [["results"], {1: 2}, "results = 1"])
def test_fork_variables_must_name_variables(project, parent, variables):
    with pytest.raises(caravanserai.UsageError, match="maps variable names to values"):
        fork("parent", at=2, new_run_id="bad-vars", variables=variables)
    assert not caravanserai.open_store().load("bad-vars")

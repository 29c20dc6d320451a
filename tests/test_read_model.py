"""The read model (``inspect_run`` -> ``RunView``): one pass over a real journal, killed runs included.

The main run is written by real child processes SIGKILLed at chosen points: attempt 1 is killed
after step 1's calls settled but before its waypoint, attempt 2 (which replays step 1's calls from
the journal) is killed inside step 2's model call, attempt 3 completes; the run is then forked at
waypoint 2. The view must give every attempt with how it ended, every call (replayed ones marked,
the pending one, the failed one, the unpriced one), every tool call and waypoint, the same receipt
the ledger computes and typed DataFrames, and the fork's view must name its parent and the fork
point. Other forks (a ``forked_from`` journal position and a CheckpointLog fork), a tampered
figure, a missing run, an ``interrupted`` attempt and a ``--restart`` are covered on their own.
"""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from conftest import kill9
from durable_helpers import rewrite_journal

import caravanserai
from caravanserai import DurableAgent, JournalCorruptionError, RunNotFound, RunView, durable, inspect_run
from caravanserai.calls.ledger import Ledger
from caravanserai.checkpoints import CheckpointLog
from caravanserai.checkpoints.log import log_status
from caravanserai.cli import main as cli_main
from caravanserai.cli import summarize
from caravanserai.runs import read_events
from caravanserai.runs.summary import run_summary
from caravanserai.runs.view import ParentView

RUN = "rm-run"

CHILD = r'''
import sys, time
import caravanserai
from caravanserai.errors import ModelError, ToolFailed
from caravanserai.testing import ScriptedModel

run_id, stop = sys.argv[1], sys.argv[2]


def mark(label):
    print(label, flush=True)
    if label == stop:
        time.sleep(120)  # the parent SIGKILLs us here


class Priced(ScriptedModel):
    name = "gpt-4o-mini"  # a list-priced model: real USD figures

    def complete(self, messages, **kw):
        mark("in-call:" + messages[-1]["content"])
        return super().complete(messages, **kw)


priced = Priced(["ok"], repeat_last=True)
unpriced = ScriptedModel(["fine"], repeat_last=True)
unpriced.name = "mystery-llm-7b"  # no list price: unpriced, never $0


def lookup(step):
    return {"row": step}


def send_mail(step):
    return "sent"


def flaky(step):
    raise RuntimeError("flaky tool")


with caravanserai.durable(run_id) as run:
    state = run.state or {"step": 0}
    for step in range(state["step"], 3):
        run.call_model(priced, [{"role": "user", "content": f"step {step}"}])
        run.call_tool(lookup, {"step": step}, effect="read")
        if step == 2:
            run.call_model(unpriced, [{"role": "user", "content": "unpriced"}])
            run.call_tool(send_mail, {"step": step}, effect="write")
            try:
                run.call_tool(flaky, {"step": step})
            except ToolFailed:
                pass
            try:
                run.call_model(ScriptedModel([]), [{"role": "user", "content": "no reply"}])
            except ModelError:
                pass
        mark(f"before-checkpoint:{step}")
        run.checkpoint({"step": step + 1}, f"step {step} done")
print("done", flush=True)
'''


def attempt(project: Path, env: dict, stop: str) -> None:
    """One attempt of the child: killed (SIGKILL) once it prints ``stop``, or run to the end."""
    script = project / "child_read_model.py"
    script.write_text(CHILD, encoding="utf-8")
    proc = subprocess.Popen([sys.executable, str(script), RUN, stop], cwd=project, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        seen = []
        while True:
            line = proc.stdout.readline()
            assert line, f"the child ended before {stop!r}: {seen}\n{proc.stderr.read()}"
            seen.append(line.strip())
            if line.strip() == stop:
                break
        if stop == "done":
            assert proc.wait(timeout=60) == 0, proc.stderr.read()
        else:
            assert kill9(proc) == -9
    finally:
        if proc.poll() is None:
            kill9(proc)
        proc.stdout.close()
        proc.stderr.close()


@pytest.fixture
def killed_run(project: Path, child_env: dict) -> Path:
    attempt(project, child_env, "before-checkpoint:1")  # step 1's calls settled, its waypoint never written
    attempt(project, child_env, "in-call:step 2")  # step 1 replayed; killed inside step 2's model call
    attempt(project, child_env, "done")
    return project


def test_a_run_killed_twice_and_resumed(killed_run):
    view = inspect_run(RUN)
    events = read_events(RUN)
    assert isinstance(view, RunView) and view.run_id == RUN and view.status == "completed"
    assert view.events == len(events) and view.started_at == events[0]["at"] and view.updated_at == events[-1]["at"]

    # every attempt, and how it ended
    assert [(a.number, a.end) for a in view.attempts] == [(1, "killed"), (2, "killed"), (3, "completed")]
    assert [a.ended_at is None for a in view.attempts] == [True, True, False]
    assert view.attempts[2].ended_at == next(e["at"] for e in events if e["type"] == "run_completed")
    assert sum(a.events for a in view.attempts) == len(events)
    assert all(a.pid and a.host and a.command for a in view.attempts)
    assert len({a.pid for a in view.attempts}) == 3 and view.own_attempts == 3

    # every waypoint, the state on demand
    assert [(w.n, w.note, w.attempt, w.loop, w.has_state) for w in view.waypoints] == [
        (1, "step 0 done", 1, None, True), (2, "step 1 done", 2, None, True), (3, "step 2 done", 3, None, True)]
    assert [view.state(n) for n in (1, 2, 3)] == [{"step": 1}, {"step": 2}, {"step": 3}]
    assert view.state() == view.state(view.latest) == {"step": 3} and view.latest == view.waypoints[-1]
    assert not hasattr(view.waypoints[0], "state")  # the state is not copied into every object
    with pytest.raises(KeyError):
        view.state(9)

    # every call: model and tool, replayed ones marked, the pending one, the failed one
    models = [c for c in view.calls if c.kind == "model"]
    assert [(c.attempt, c.status, c.model, c.replayed_in, c.paid) for c in models] == [
        (1, "settled", "gpt-4o-mini", (), True),  # step 0
        (1, "settled", "gpt-4o-mini", (2,), True),  # step 1: paid once, answered from the journal in attempt 2
        (2, "pending", "gpt-4o-mini", (), False),  # step 2, cut by the kill: may have been billed
        (3, "settled", "gpt-4o-mini", (), True),  # step 2 again
        (3, "settled", "mystery-llm-7b", (), True),
        (3, "failed", "scripted", (), False),
    ]
    step0, _, pending, _, unpriced, failed = models
    assert step0.usd is not None and step0.usd > 0 and step0.priced and step0.prompt_tokens > 0
    assert step0.total_tokens == step0.prompt_tokens + step0.completion_tokens
    assert step0.duration_s is not None and step0.duration_s >= 0 and step0.settled_at >= step0.started_at
    assert unpriced.usd is None and not unpriced.priced and unpriced.total_tokens > 0  # unpriced is never $0
    assert pending.settled_at is None and pending.duration_s is None and pending.usd is None
    assert "has no reply" in failed.error and failed.settled_at is not None
    assert failed.usd is None and failed.prompt_tokens is None

    tools = {(t.tool, t.attempt): t for t in view.tools}
    assert [(t.tool, t.attempt, t.effect, t.status, t.replayed_in) for t in view.tools] == [
        ("lookup", 1, "read", "settled", ()), ("lookup", 1, "read", "settled", (2,)), ("lookup", 3, "read", "settled", ()),
        ("send_mail", 3, "write", "settled", ()), ("flaky", 3, "read", "error", ())]
    assert "flaky tool" in tools[("flaky", 3)].error and all(len(t.args_sha256) == 64 for t in view.tools)
    tool_calls = [c for c in view.calls if c.kind == "tool"]
    assert [c.call_id for c in tool_calls] == [t.call_id for t in view.tools]
    assert [c.status for c in tool_calls] == ["settled", "settled", "settled", "settled", "failed"]
    assert [c.seq for c in view.calls] == sorted(c.seq for c in view.calls)  # in intent order
    replayed = next(e for e in events if e["type"] == "replayed")
    assert sorted(replayed["calls"]) == sorted(c.call_id for c in view.calls if c.replayed)

    # the receipt: the ledger's own, with the resume facts (1 possible double count: the pending call)
    ledger = Ledger(RUN, events, 3).receipt().to_dict()
    assert view.receipt.to_dict() == ledger == summarize(RUN, events)["receipt"]
    assert view.receipt.resume.possible_double_count_calls == 1 and view.receipt.unpriced
    assert len(view.receipt.calls) == 4 and view.receipt.estimated_usd == round(
        sum(c.usd for c in models if c.usd is not None), 10)
    assert view.summary == run_summary(events) and view.summary["status"] == "completed"
    assert view.loops == {} and view.forks == () and view.parent is None and view.checkpoints is None

    # a fork of this run at waypoint 2: the child names its parent and the fork point
    child_id = caravanserai.fork(RUN, at=2)
    point = next(e for e in events if e["type"] == "waypoint" and e["n"] == 2)
    child = inspect_run(child_id)
    assert child.parent == ParentView(RUN, None, point["seq"])
    origin = read_events(child_id)[0]["forked_from"]
    assert {k: origin[k] for k in ("run_id", "seq", "waypoint")} == {"run_id": RUN, "seq": point["seq"], "waypoint": 2}
    assert [(w.n, w.note) for w in child.waypoints] == [(1, "step 0 done"), (2, "step 1 done")]
    assert child.state() == {"step": 2} and child.status == "pending" and child.forks == ()
    before_fork = [c.call_id for c in view.calls if c.seq < point["seq"]]
    assert len(before_fork) == 4 and [c.call_id for c in child.calls][:4] == before_fork  # the parent's calls, copied
    marker = child.journal_df().iloc[-1]
    assert marker["type"] == "forked"
    assert marker["summary"] == f"forked from run {RUN} at waypoint 2 (its event {point['seq']})"

    # the parent is only read: every attempt, call, tool call and waypoint is still returned
    after = inspect_run(RUN)
    assert read_events(RUN) == events and after.events == view.events and after.status == "completed"
    assert (after.attempts, after.waypoints, after.calls, after.tools) == (view.attempts, view.waypoints, view.calls,
                                                                           view.tools)
    assert after.receipt.to_dict() == view.receipt.to_dict() and after.parent is None


def test_the_dataframes_are_typed(killed_run):
    view = inspect_run(RUN)
    journal = view.journal_df()
    assert list(journal.columns) == ["seq", "at", "type", "attempt", "call_id", "summary"]
    assert {name: str(dtype) for name, dtype in journal.dtypes.items()} == {
        "seq": "Int64", "at": "datetime64[ns, UTC]", "type": "string", "attempt": "Int64", "call_id": "string",
        "summary": "string"}
    assert len(journal) == view.events and journal["seq"].tolist() == list(range(view.events))
    assert journal["at"].is_monotonic_increasing and journal["at"].iloc[0] == pd_timestamp(view.started_at)
    assert journal.groupby("attempt").size().tolist() == [a.events for a in view.attempts]
    assert journal["summary"].notna().all() and (journal["summary"].str.len() > 0).all()
    assert set(journal.loc[journal["type"] == "call_settled", "call_id"]) <= {c.call_id for c in view.calls}

    calls = view.calls_df()
    assert {name: str(dtype) for name, dtype in calls.dtypes.items()} == {
        "call_id": "string", "kind": "string", "path": "string", "model": "string", "provider": "string",
        "tool": "string", "attempt": "Int64", "status": "string", "started_at": "datetime64[ns, UTC]",
        "settled_at": "datetime64[ns, UTC]", "duration_s": "float64", "prompt_tokens": "Int64",
        "completion_tokens": "Int64", "cached_tokens": "Int64", "total_tokens": "Int64", "usd": "float64",
        "priced": "bool", "paid": "bool", "replayed": "bool", "replayed_in": "string", "error": "string",
        "seq": "Int64"}
    assert calls["call_id"].tolist() == [c.call_id for c in view.calls]
    unpriced = calls[calls["model"] == "mystery-llm-7b"].iloc[0]
    assert pd_isna(unpriced["usd"]) and not unpriced["priced"] and unpriced["total_tokens"] > 0
    assert calls["replayed"].sum() == 2 and set(calls.loc[calls["replayed"], "replayed_in"]) == {"2"}
    assert calls.loc[calls["status"] == "pending", "settled_at"].isna().all()
    assert abs(calls["usd"].sum() - view.receipt.estimated_usd) < 1e-12  # NaN (unpriced) skipped, not 0 added

    empty = RunView.from_events("nothing-called", read_events(RUN)[:1]).calls_df()
    assert len(empty) == 0 and str(empty["started_at"].dtype) == "datetime64[ns, UTC]" and str(empty["usd"].dtype) == "float64"


def pd_isna(value) -> bool:
    import pandas as pd

    return bool(pd.isna(value))


def pd_timestamp(text: str):
    import pandas as pd

    return pd.Timestamp(text)


def test_show_prints_how_each_attempt_ended(killed_run, capsys):
    assert cli_main(["show", RUN]) == 0
    out = capsys.readouterr().out
    assert out.startswith('waypoint 3\n\nstep 2 done\n\nstate: {"step": 3}\n')
    assert "status: completed (attempts: 3)" in out
    # counted as the Runs row and the receipt count them: 4 model calls answered (the receipt's 4), the rest
    # tool calls answered or calls cut by a kill
    view = inspect_run(RUN)
    counts = view.call_counts()
    assert counts["model_calls"] == len(view.receipt.calls) == 4 and sum(counts.values()) == len(view.calls) == 11
    text = f"11 calls (4 model, {counts['tool_calls']} tool, {counts['unanswered_calls']} unanswered)"
    assert view.calls_text() == text and f"receipt: {text}, 40 tokens, $0.00000585 + unpriced calls (inferred" in out
    assert view.receipt.summary().startswith("4 model calls, 40 tokens, $0.00000585 + unpriced calls")
    section = out[out.index("\nattempts:\n"):].splitlines()[2:]
    assert [line.split(": ", 1)[1].split(" ")[0] for line in section] == ["killed:", "killed:", "completed"]
    assert cli_main(["show", RUN, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert [a["end"] for a in data["attempt_history"]] == ["killed", "killed", "completed"]
    assert data["attempts"] == 3 and data["status"] == "completed" and data["waypoints"] == 3


def test_a_tampered_figure_is_journal_corruption(killed_run, capsys):
    events = read_events(RUN)
    settled = next(e for e in events if e["type"] == "call_settled")
    settled["call"]["estimated_usd"] = 0.5  # not the list price of the recorded usage
    caravanserai.runs.close_all()
    rewrite_journal(killed_run / ".caravanserai" / RUN / "journal.jsonl", events)  # the chain recomputed
    read_events(RUN)  # the hash chain is valid: only the figure is wrong
    with pytest.raises(JournalCorruptionError) as info:
        inspect_run(RUN)
    assert f"event {settled['seq']}" in str(info.value)
    assert cli_main(["show", RUN]) == 1 and f"event {settled['seq']}" in capsys.readouterr().err


def test_a_missing_run_is_run_not_found(project):
    with pytest.raises(RunNotFound):
        inspect_run("never-ran")
    caravanserai.checkpoint("other", {"a": 1}, "one")
    with pytest.raises(RunNotFound):
        inspect_run("never-ran")


def test_a_fork_names_its_parent(project):
    with durable("parent-run") as run:
        run.checkpoint({"k": 1}, "one")
    source = inspect_run("parent-run")
    with durable("child-run") as run:  # what `%%resumable --fork` records: the source's journal position
        run.describe(forked_from={"run_id": "parent-run", "seq": source.events - 1})
        run.checkpoint(source.state(), "forked from parent-run")
    child = inspect_run("child-run")
    assert child.parent == ParentView("parent-run", None, source.events - 1)
    assert child.state() == {"k": 1} and child.status == "completed"
    assert "forked from parent-run" in child.journal_df()["summary"].iloc[0]


def test_a_checkpoint_log_fork_and_a_durable_agent_run(tmp_path):
    store = caravanserai.open_store(f"memory://view-{uuid.uuid4().hex}")
    prompts = ["pull the ticket", "reproduce the bug", "draft a fix", "open the PR"]
    agent = DurableAgent().begin(prompts)
    log = CheckpointLog(store, "agent-run")
    parent = None
    for step in range(2):
        parent = log.commit(agent.run_until_step(step), parent=parent, step=step)
    forked = log.fork(parent, agent.prompt_node_ids[1], "new prompt", new_run_id="agent-fork")

    source = inspect_run("agent-run", store)
    events = read_events("agent-run", store)
    assert source.checkpoints.to_dict() == log_status(events) == summarize("agent-run", events)["checkpoints"]
    assert source.checkpoints.steps_done == 2 and source.status == "pending"  # 2 of 4 steps: as log_status says
    assert [(f.new_run_id, f.source, f.checkpoint_id) for f in source.forks] == [("agent-fork", parent, forked)]

    child = inspect_run("agent-fork", store)
    assert child.parent == ParentView("agent-run", parent, None) and child.forks == ()
    assert child.checkpoints.latest == forked and child.checkpoints.to_dict() == log_status(read_events("agent-fork", store))

    done = DurableAgent().begin(["one step"])
    log = CheckpointLog(store, "agent-done")
    log.commit(done.run_until_step(0), step=0)
    assert inspect_run("agent-done", store).status == "completed"  # every step ran: the log says completed


def test_interrupted_killed_and_open_attempts():
    store = caravanserai.open_store(f"memory://view-{uuid.uuid4().hex}")
    with pytest.raises(KeyboardInterrupt):
        with durable("ends", store=store) as run:
            run.checkpoint({"i": 1}, "one")
            raise KeyboardInterrupt  # durable() records `interrupted`
    run = caravanserai.runs.open_run("ends", store)
    run.checkpoint({"i": 2}, "two")
    run.close()  # no end recorded: killed, once a later attempt starts
    with pytest.raises(RuntimeError):
        with durable("ends", store=store) as run:
            raise RuntimeError("the API said no")
    run = caravanserai.runs.open_run("ends", store)
    try:
        run.checkpoint({"i": 3}, "three")
        view = inspect_run("ends", store)
    finally:
        run.close()
    assert [(a.end, a.code, a.message) for a in view.attempts] == [
        ("interrupted", None, None), ("killed", None, None), ("failed", "RuntimeError", "the API said no"),
        ("open", None, None)]
    assert view.status == "pending" and view.summary == run_summary(view.raw_events())
    assert view.journal_df()["attempt"].tolist() == [1, 1, 1, 2, 2, 3, 3, 4, 4]


def test_a_restart_counts_from_the_restart(project):
    with durable("again") as run:
        for i in range(1, 3):
            run.checkpoint({"i": i}, f"first pass {i}")
    with pytest.raises(KeyboardInterrupt):
        with durable("again") as run:
            run.append({"type": "restarted", "definition_sha256": "0" * 64, "cell_source": "new"})
            raise KeyboardInterrupt
    view = inspect_run("again")
    assert view.summary["status"] == "completed"  # run_summary's reading, unchanged
    assert view.status == "pending" and view.latest is None  # after the restart: a fresh start, nothing saved yet
    assert len(view.waypoints) == 2 and view.state(view.waypoints[0]) == {"i": 1}
    with pytest.raises(KeyError):
        view.state(1)  # numbers count from the restart


def test_loops_and_a_legacy_summary_match_the_cli(project):
    for _ in caravanserai.resumable_iterate(["a", "b", "c"], run_id="loop-run"):
        pass
    view = inspect_run("loop-run")
    assert view.loops[0].done == 3 and view.loops[0].total == 3 and view.loops[0].finished
    assert view.status == "completed" and [w.loop for w in view.waypoints] == [0, 0, 0]
    summary = view.as_summary()  # the dict `caravanserai show --json` prints
    assert set(summary) == {"run_id", "status", "attempts", "waypoints", "latest", "items_done", "checkpoints",
                            "started_at", "updated_at", "command", "cwd", "imported_from", "events", "receipt", "summary"}
    assert summary["items_done"] == {0: 3} and summary["latest"] == {"n": 3, "note": "processed item 3/3",
                                                                     "state": {"_i": 3}, "at": view.latest.at}
    assert view.calls == () and view.tools == ()

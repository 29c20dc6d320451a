"""Durable runs (seed 002), continued: identity before spend, tools by effect, budgets, and the
journal as a trust boundary. Crashes are real (SIGKILLed children), as in test_durable_runs.py."""

from __future__ import annotations

import hashlib
import json
import math
import re
import signal
import subprocess
from collections.abc import Callable
from typing import Any

import pytest
from caravanserai.ledger import digest
from conftest import kill9
from durable_helpers import (
    ANSWER,
    PYTHON,
    QUESTION,
    InterruptingModel,
    crash_by_itself,
    events_of,
    journal_path,
    kids,
    opts,
    rewrite_journal,
    spawn,
    store_of,
    tool_messages,
    types_of,
    wait_until,
)

import caravanserai
from caravanserai import (
    AgentMismatch,
    BudgetChanged,
    BudgetExceeded,
    ConversationMismatch,
    DefinitionChanged,
    DurableOptionConflict,
    InputMismatch,
    JournalCorruptionError,
    SessionMismatch,
    Tool,
    ToolEffectUncertain,
    agent,
    calls,
    cli,
    durable,
    run,
    run_summary,
)
from caravanserai.runs import read_events
from caravanserai.testing import ScriptedModel

# ---- 5. identity before spend ------------------------------------------------------------------
BASE = {"input": QUESTION, "session_id": "s-1", "history": [{"role": "user", "content": "hello"}],
        "budget": {"calls": 5}}


def _identity_variants():
    other_effect = Tool("lookup", kids.lookup.fn, "write", kids.lookup.description, kids.lookup.parameters)
    return [
        ("instructions", lambda m: agent(id="support", instructions="Answer rudely.", model=m, tools=[kids.lookup]), {},
         DefinitionChanged, "durable_definition_changed"),
        ("tool effect", lambda m: agent(id="support", instructions="Answer from policy, using your tools.", model=m,
                                        tools=[other_effect]), {}, DefinitionChanged, "durable_definition_changed"),
        ("input", None, {"input": "Where is order B-456?"}, InputMismatch, "durable_input_mismatch"),
        ("budget", None, {"budget": {"calls": 6}}, BudgetChanged, "durable_budget_changed"),
        ("no budget", None, {"budget": None}, BudgetChanged, "durable_budget_changed"),
        ("agent id", lambda m: agent(id="sales", instructions="Answer from policy, using your tools.", model=m,
                                     tools=[kids.lookup]), {}, AgentMismatch, "durable_agent_mismatch"),
        ("session", None, {"session_id": "s-2"}, SessionMismatch, "durable_session_mismatch"),
        ("history", None, {"history": [{"role": "user", "content": "hello!"}]}, ConversationMismatch,
         "durable_conversation_mismatch"),
    ]


@pytest.mark.parametrize("state", ["completed", "pending"])
def test_identity_mismatches_append_nothing(project, state):
    run_id = f"ident-{state}"
    model = ScriptedModel([ANSWER]) if state == "completed" else InterruptingModel([])
    if state == "completed":
        run(kids.support_with(kids.lookup, model), durable=opts(project, run_id), **BASE)
    else:
        with pytest.raises(KeyboardInterrupt):
            run(kids.support_with(kids.lookup, model), durable=opts(project, run_id), **BASE)
    path = journal_path(project, run_id)
    before = path.read_bytes()
    for name, make, changes, error, code in _identity_variants():
        probe = ScriptedModel([ANSWER])
        spec = (make or (lambda m: kids.support_with(kids.lookup, m)))(probe)
        kwargs = {**BASE, **changes}
        with pytest.raises(error) as info:
            run(spec, durable=opts(project, run_id), **kwargs)
        assert info.value.code == code, name
        assert info.value.run_id == run_id and "new run id" in str(info.value)
        assert probe.requests == [], f"{name}: the model was asked"
        assert path.read_bytes() == before, f"{name}: the journal changed"
    # the same identity is accepted
    same = ScriptedModel([ANSWER])
    assert run(kids.support_with(kids.lookup, same), durable=opts(project, run_id), **BASE).text == ANSWER


def test_agent_on_a_plain_checkpoint_run_is_agent_mismatch(project):
    caravanserai.checkpoint("plain-run", {"step": 1}, "a plain waypoint")
    caravanserai.runs.registry.get("plain-run", caravanserai.open_store()).close()
    path = project / ".caravanserai" / "plain-run" / "journal.jsonl"
    before = path.read_bytes()
    model = ScriptedModel([ANSWER])
    with pytest.raises(AgentMismatch) as info:
        run(kids.support(model), QUESTION, durable={"run_id": "plain-run"})
    assert info.value.code == "durable_agent_mismatch"
    assert model.requests == [] and path.read_bytes() == before


def test_plain_durable_block_identity(project):
    definition = {"pipeline": "nightly", "version": 1}
    with durable("plain-id", definition=definition, input="batch-7", budget={"calls": 3}) as r:
        r.checkpoint({"i": 1}, "one")
    path = project / ".caravanserai" / "plain-id" / "journal.jsonl"
    started = read_events("plain-id")[0]
    assert started["definition_sha256"] == digest(definition) and started["input"] == "batch-7"
    assert started["budget_sha256"] == caravanserai.Budget(calls=3).digest()
    before = path.read_bytes()
    cases = [
        ({"definition": {"pipeline": "nightly", "version": 2}, "input": "batch-7", "budget": {"calls": 3}},
         DefinitionChanged, "durable_definition_changed"),
        ({"definition": definition, "input": "batch-8", "budget": {"calls": 3}}, InputMismatch, "durable_input_mismatch"),
        ({"definition": definition, "input": "batch-7", "budget": {"calls": 4}}, BudgetChanged, "durable_budget_changed"),
        ({"definition": definition, "input": "batch-7", "budget": {"calls": 3}, "session_id": "x"}, SessionMismatch,
         "durable_session_mismatch"),
    ]
    for kwargs, error, code in cases:
        with pytest.raises(error) as info:
            with durable("plain-id", **kwargs):
                pytest.fail("the block ran despite an identity mismatch")
        assert info.value.code == code
        assert path.read_bytes() == before
    # the same identity (the definition may be given as its digest) opens the run
    with durable("plain-id", definition=digest(definition), input="batch-7", budget={"calls": 3}) as r:
        assert r.state == {"i": 1}
        r.checkpoint({"i": 2}, "two")
    assert path.read_bytes() != before


# ---- 6. tools resume by effect -----------------------------------------------------------------
def test_idempotent_tool_redrives_with_a_stable_key(project, child_env):
    run_id = "charge-crash"
    crash_by_itself("charge", run_id, project, child_env, DURABLE_CRASH="charge")
    first = kids.records("charge")
    assert len(first) == 1
    intent = next(e for e in events_of(project, run_id) if e["type"] == "tool_intent")
    args = {"order": "A-123", "cents": 1299}
    assert intent["effect"] == "idempotent" and intent["args"] == args and intent["args_sha256"] == digest(args)

    model = ScriptedModel([ANSWER])
    result = run(kids.support_with(kids.charge, model), QUESTION, durable=opts(project, run_id))
    assert result.text == ANSWER and len(model.requests) == 1
    assert tool_messages(model.requests[0])[0]["content"] == "charged 1299 for A-123"
    both = kids.records("charge")
    assert len(both) == 2
    expected = calls.idempotency_key(run_id, "support/charge", intent["call_id"], hashlib.sha256(
        json.dumps(args, sort_keys=True, separators=(",", ":")).encode()).hexdigest())
    for rec in both:
        assert rec["key"] == rec["current"] == expected, rec
    assert re.fullmatch(r"[0-9a-f]{64}", expected)
    # the same id under another run is another key
    assert calls.idempotency_key("other-run", "support/charge", intent["call_id"], digest(args)) != expected
    assert caravanserai.current_idempotency_key() is None  # only inside the tool
    intents = [e for e in events_of(project, run_id) if e["type"] == "tool_intent"]
    assert [e["call_id"] for e in intents] == [intent["call_id"]] * 2  # re-driven under the same id


@pytest.mark.parametrize("tool_name, how", [("send_email", "api"), ("notify", "cli")])
def test_write_and_external_tools_stop_until_settled(project, child_env, tool_name, how):
    run_id = f"{tool_name}-crash"
    proc = spawn(tool_name, run_id, project, child_env, DURABLE_SLEEP="60")
    wait_until(lambda: len(kids.records(tool_name)) == 1, proc, project)  # the effect happened; no settlement yet
    assert kill9(proc) == -signal.SIGKILL
    intent = next(e for e in events_of(project, run_id) if e["type"] == "tool_intent")
    assert intent["effect"] == ("write" if tool_name == "send_email" else "external")

    model = ScriptedModel([ANSWER])
    with pytest.raises(ToolEffectUncertain) as info:
        run(kids.support_with(kids.TOOLS[tool_name], model), QUESTION, durable=opts(project, run_id))
    err = info.value
    assert err.code == "durable_tool_effect_uncertain"
    assert err.tool == tool_name and err.call_id == intent["call_id"]
    assert str(err).startswith(f"durable_tool_effect_uncertain:{tool_name}:{intent['call_id']}")
    assert "caravanserai settle" in str(err)
    assert model.requests == [] and len(kids.records(tool_name)) == 1  # not sent, not re-run
    failed = run_summary(store_of(project).load(run_id))
    assert failed["status"] == "failed" and failed["code"] == "durable_tool_effect_uncertain"

    settled_result = {"status": "delivered", "id": 42}
    if how == "api":
        caravanserai.settle(run_id, intent["call_id"], result=settled_result, store=store_of(project))
    else:
        proc = subprocess.run([PYTHON, "-m", "caravanserai", "settle", run_id, intent["call_id"],
                               "--result", json.dumps(settled_result), "--store", ".caveman/runs/durable"],
                              cwd=project, env=child_env, capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, proc.stderr
        assert intent["call_id"] in proc.stdout and proc.stderr == ""
    settlement = [e for e in events_of(project, run_id) if e["type"] == "tool_settled"]
    assert len(settlement) == 1 and settlement[0]["result"] == settled_result
    assert settlement[0]["call_id"] == intent["call_id"]

    model = ScriptedModel([ANSWER])
    result = run(kids.support_with(kids.TOOLS[tool_name], model), QUESTION, durable=opts(project, run_id))
    assert result.text == ANSWER
    assert len(kids.records(tool_name)) == 1, "the tool ran again after being settled by hand"
    assert len(model.requests) == 1
    assert [m["content"] for m in tool_messages(model.requests[0])] == [json.dumps(settled_result)]
    assert run_summary(store_of(project).load(run_id))["status"] == "completed"


def test_settle_by_hand_counts_as_no_attempt(project):
    """Settling by hand is not an attempt of the run: attempts counts runs of the code only."""
    calls_made = []

    @caravanserai.tool(effect="write")
    def send(to: str) -> str:
        """Send."""
        calls_made.append(to)
        raise KeyboardInterrupt  # crash inside the write tool: intent journaled, no outcome

    def spec(m):
        return agent(id="mailer", instructions="Mail.", model=m, tools=[send])

    with pytest.raises(KeyboardInterrupt):
        run(spec(ScriptedModel([ScriptedModel.tool("send", to="a@b.c")])), "go", durable=opts(project, "mailer-1"))
    intent = next(e for e in events_of(project, "mailer-1") if e["type"] == "tool_intent")
    caravanserai.settle("mailer-1", intent["call_id"], result="sent", store=store_of(project))
    result = run(spec(ScriptedModel(["done"])), "go", durable=opts(project, "mailer-1"))
    assert result.text == "done" and calls_made == ["a@b.c"]
    assert result.receipt.resume.attempts == 2, [e["type"] for e in events_of(project, "mailer-1")]


# ---- 7. budgets -------------------------------------------------------------------------------
def test_budget_stops_the_call_before_it_is_sent(project):
    model = ScriptedModel(kids.TOOL_SCRIPTS["lookup"])
    with pytest.raises(BudgetExceeded) as info:
        run(kids.support_with(kids.lookup, model), QUESTION, durable=opts(project, "budget-1"), budget={"calls": 1})
    assert info.value.code == "budget_exceeded" and "not sent" in str(info.value)
    assert len(model.requests) == 1
    assert types_of(project, "budget-1").count("call_started") == 1
    failed = run_summary(store_of(project).load("budget-1"))
    assert failed["status"] == "failed" and failed["code"] == "budget_exceeded"
    assert len(failed["receipt"]["calls"]) == 1


def test_budget_counts_prior_attempts_after_a_crash(project, child_env):
    crash_by_itself("budget", "budget-crash", project, child_env, DURABLE_CRASH="lookup")
    before_resume = types_of(project, "budget-crash")
    assert before_resume == ["run_started", "call_started", "call_settled", "tool_intent"]
    model = ScriptedModel([ANSWER])
    with pytest.raises(BudgetExceeded):
        run(kids.support_with(kids.lookup, model), QUESTION, durable=opts(project, "budget-crash"),
            budget=kids.BUDGETS["budget"])
    assert model.requests == [], "a call over budget was sent"
    assert types_of(project, "budget-crash").count("call_started") == 1

    # the budget is part of the identity: raising it needs a new run id
    before = journal_path(project, "budget-crash").read_bytes()
    with pytest.raises(BudgetChanged):
        run(kids.support_with(kids.lookup, model), QUESTION, durable=opts(project, "budget-crash"), budget={"calls": 2})
    assert journal_path(project, "budget-crash").read_bytes() == before and model.requests == []


def test_budget_prior_settled_and_option_conflict(project):
    calls_seen = []

    @caravanserai.tool(effect="read")
    def peek(order: str) -> str:
        """Peek."""
        calls_seen.append(order)
        if len(calls_seen) == 1:
            raise KeyboardInterrupt
        return "fine"

    def spec(m):
        return agent(id="peeker", instructions="Peek.", model=m, tools=[peek])

    with pytest.raises(KeyboardInterrupt):
        run(spec(ScriptedModel([ScriptedModel.tool("peek", order="A")])), "go", durable=opts(project, "pb"),
            budget={"calls": 2})
    settled = next(e for e in events_of(project, "pb") if e["type"] == "call_settled")["call"]["usage"]
    result = run(spec(ScriptedModel(["ok"])), "go", durable=opts(project, "pb"), budget={"calls": 2})
    assert result.text == "ok"
    assert result.receipt.resume.prior_settled == {
        "usd": 0.0, "tokens": settled["prompt_tokens"] + settled["completion_tokens"], "calls": 1}

    with pytest.raises(DurableOptionConflict) as info:
        run(spec(ScriptedModel(["ok"])), "go", durable=opts(project, "conflict"), max_cost_usd=1.0)
    assert info.value.code == "durable_option_conflict" and "budget" in str(info.value)
    assert not (project / ".caveman" / "runs" / "durable" / "conflict").exists()


# ---- 8. a journal is a trust boundary -----------------------------------------------------------
def _tamper_usage(field: str, value: Any) -> Callable[[dict], None]:
    def change(call: dict) -> None:
        call["usage"][field] = value
    return change


def _tamper_usd(value: Any) -> Callable[[dict], None]:
    def change(call: dict) -> None:
        call["estimated_usd"] = value
    return change


TAMPERING = {
    "negative prompt": (_tamper_usage("prompt_tokens", -5), False),
    "float completion": (_tamper_usage("completion_tokens", 2.5), False),
    "bool cached": (_tamper_usage("cached_tokens", True), False),
    "nan completion": (_tamper_usage("completion_tokens", math.nan), True),
    "inconsistent total": (_tamper_usage("total_tokens", 1), False),
    "cached over prompt": (_tamper_usage("cached_tokens", 10_000), False),
    "usd not list price": (_tamper_usd(0.25), False),
    "negative usd": (_tamper_usd(-1.0), False),
    "nan usd": (_tamper_usd(math.nan), True),
    "usd dropped for a priced model": (_tamper_usd(None), False),
}


@pytest.mark.parametrize("name", list(TAMPERING))
def test_tampered_money_figures_are_journal_corruption(project, name, capsys):
    change, needs_nan = TAMPERING[name]
    run_id = "tampered"
    run(kids.support(ScriptedModel([ANSWER])), QUESTION, durable=opts(project, run_id))
    events = events_of(project, run_id)
    settled = next(e for e in events if e["type"] == "call_settled")
    seq = settled["seq"]
    change(settled["call"])
    path = journal_path(project, run_id)
    store = store_of(project)

    def expect_corruption(action: Callable[[], Any]) -> None:
        with pytest.raises(JournalCorruptionError) as info:
            action()
        assert f"event {seq}" in str(info.value) and info.value.line == seq + 1

    # completed: the idempotent re-run rebuilds the receipt from the journal
    rewrite_journal(path, events, allow_nan=needs_nan)
    read_events(run_id, store)  # the hash chain is valid: only the figures are wrong
    before = path.read_bytes()
    idle = ScriptedModel([])
    expect_corruption(lambda: run(kids.support(idle), QUESTION, durable=opts(project, run_id)))
    assert cli.main(["show", run_id, "--store", str(store.root)]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"event {seq}" in err

    # pending: resuming loads the meter
    rewrite_journal(path, [e for e in events if e["type"] != "run_completed"], allow_nan=needs_nan)
    before = path.read_bytes()
    expect_corruption(lambda: run(kids.support(idle), QUESTION, durable=opts(project, run_id)))
    expect_corruption(lambda: durable(run_id, store=store).__enter__())
    assert idle.requests == [] and path.read_bytes() == before

    # failed: the summary carries a receipt
    rewrite_journal(path, [*[e for e in events if e["type"] != "run_completed"],
                           {"at": events[-1]["at"], "type": "run_failed", "code": "x", "message": "y"}],
                    allow_nan=needs_nan)
    expect_corruption(lambda: run_summary(store.load(run_id)))


def test_ctrl_c_landing_just_after_a_journal_write_loses_nothing_and_reuses_no_seq(project, monkeypatch):
    """Kernel > Interrupt between the store writing a line and the writer counting it: the interrupt waits
    for the append to finish, so the ``interrupted`` record that follows takes the next seq (this was a
    journal that no longer verified: two lines with one seq)."""
    import os

    interrupted_once: list[bool] = []
    restore: list[Any] = []
    with pytest.raises(KeyboardInterrupt):
        with durable("ctrl-c-mid-append") as run:
            run.checkpoint({"i": 0}, "step 0")
            write = type(run.store)._append

            def write_then_ctrl_c(self, *args, **kwargs):
                write(self, *args, **kwargs)
                if not interrupted_once:  # the SIGINT arrives right after the bytes are on disk
                    interrupted_once.append(True)
                    os.kill(os.getpid(), signal.SIGINT)

            backend = type(run.store)
            monkeypatch.setattr(backend, "_append", write_then_ctrl_c)
            restore.append((backend, write))
            run.checkpoint({"i": 1}, "step 1")
    monkeypatch.setattr(restore[0][0], "_append", restore[0][1])  # not undo(): that would leave the project dir
    events = read_events("ctrl-c-mid-append")  # verifies the hash chain and that seqs follow each other
    assert [e["type"] for e in events] == ["run_started", "waypoint", "waypoint", "interrupted"]
    assert [e["seq"] for e in events] == [0, 1, 2, 3] and events[2]["state"] == {"i": 1}
    assert caravanserai.load_latest("ctrl-c-mid-append")[0] == {"i": 1}  # the waypoint the Ctrl-C followed is kept


def test_ctrl_c_just_after_a_write_leaves_the_shared_writer_counting_right(project, monkeypatch):
    """The same Ctrl-C on ``checkpoint()``'s shared writer, which stays open: its next waypoint is number 3,
    not a second number 2 (the writer's in-memory record is complete before the interrupt is delivered)."""
    import os

    caravanserai.checkpoint("shared-ctrl-c", {"i": 0}, "one")
    from caravanserai.stores.local import LocalStore

    write = LocalStore._append
    fired: list[bool] = []

    def write_then_ctrl_c(self, *args, **kwargs):
        write(self, *args, **kwargs)
        if not fired:
            fired.append(True)
            os.kill(os.getpid(), signal.SIGINT)

    monkeypatch.setattr(LocalStore, "_append", write_then_ctrl_c)
    with pytest.raises(KeyboardInterrupt):
        caravanserai.checkpoint("shared-ctrl-c", {"i": 1}, "two")
    monkeypatch.setattr(LocalStore, "_append", write)
    assert caravanserai.checkpoint("shared-ctrl-c", {"i": 2}, "three") == 3
    waypoints = [e["n"] for e in read_events("shared-ctrl-c") if e["type"] == "waypoint"]
    assert waypoints == [1, 2, 3]

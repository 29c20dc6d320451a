"""Durable runs (seed 002): agents, journaled calls, identity, resume by effect, budgets, receipts.

Every crash is a real one where the brief needs it: a child process (``tests/children/durable_agents.py``)
is SIGKILLed, by the parent or by itself, at a chosen point, and the parent resumes the same run id
with a fresh ``ScriptedModel`` holding only the replies still to come, so a call that should have
been replayed from the journal but was sent again fails the test. Cheaper in-process "crashes"
raise KeyboardInterrupt, which ``run()``/``durable()`` leave unrecorded (the run stays pending).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

import pytest

import caravanserai
from caravanserai import (
    AgentMismatch,
    BudgetChanged,
    BudgetExceeded,
    ConversationMismatch,
    DefinitionChanged,
    DiskDurableStore,
    DurableOptionConflict,
    InputMismatch,
    JournalCorruptionError,
    ModelNotConfigured,
    OpenAICompatibleModel,
    SessionMismatch,
    Tool,
    ToolEffectUncertain,
    agent,
    auto,
    durable,
    input_is_replayable,
    run,
    run_summary,
)
from caravanserai import calls, cli, journal, pricing
from caravanserai.ledger import digest
from caravanserai.runs import read_events
from caravanserai.testing import ScriptedModel
from conftest import kill9, load_child_module

PYTHON = sys.executable
CHILD = Path(__file__).resolve().parent / "children" / "durable_agents.py"
kids = load_child_module(CHILD)
QUESTION, ANSWER = kids.QUESTION, kids.ANSWER


# ---- helpers ------------------------------------------------------------------------------------
class InterruptingModel(ScriptedModel):
    """Same provider/name as ScriptedModel (same definition digest); Ctrl-C inside the call."""

    def complete(self, messages, *, tools=None, **params):
        self.requests.append([dict(m) for m in messages])
        raise KeyboardInterrupt


def store_of(project: Path) -> DiskDurableStore:
    return DiskDurableStore(str(project / ".caveman" / "runs" / "durable"))


def opts(project: Path, run_id: str) -> dict:
    return {"run_id": run_id, "store": store_of(project)}


def journal_path(project: Path, run_id: str) -> Path:
    return project / ".caveman" / "runs" / "durable" / run_id / "journal.jsonl"


def events_of(project: Path, run_id: str) -> list[dict]:
    return read_events(run_id, store_of(project))


def types_of(project: Path, run_id: str) -> list[str]:
    return [e["type"] for e in events_of(project, run_id)]


def spawn(scenario: str, run_id: str, project: Path, child_env: dict, **env: str) -> subprocess.Popen:
    full = dict(child_env, PYTHONUNBUFFERED="1", **env)
    stderr = open(project / f"child-{scenario}-{run_id}.err", "ab")
    try:
        return subprocess.Popen([PYTHON, str(CHILD), scenario, run_id], cwd=project, env=full,
                                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=stderr)
    finally:
        stderr.close()


def child_stderr(project: Path) -> str:
    return "\n".join(p.read_text(errors="replace") for p in sorted(project.glob("child-*.err")))


def wait_until(condition: Callable[[], bool], proc: subprocess.Popen, project: Path, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if proc.poll() is not None:
            raise AssertionError(f"child exited ({proc.returncode}) before the crash point:\n{child_stderr(project)}")
        if time.monotonic() > deadline:
            proc.kill()
            raise AssertionError(f"crash point not reached in {timeout}s:\n{child_stderr(project)}")
        time.sleep(0.02)


def journal_has(project: Path, run_id: str, etype: str) -> Callable[[], bool]:
    path = journal_path(project, run_id)

    def check() -> bool:
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return False
        return any(json.loads(line).get("type") == etype for line in data.split(b"\n")[:-1] if line.strip())

    return check


def crash_by_itself(scenario: str, run_id: str, project: Path, child_env: dict, **env: str) -> None:
    """Run a child that SIGKILLs itself at its crash point."""
    proc = spawn(scenario, run_id, project, child_env, **env)
    proc.wait(timeout=120)
    assert proc.returncode == -signal.SIGKILL, f"child did not crash ({proc.returncode}):\n{child_stderr(project)}"


def rewrite_journal(path: Path, events: list[dict], *, allow_nan: bool = False) -> None:
    """Write ``events`` as a valid hash-chained journal, as a tampering store could."""
    bare = [{k: v for k, v in e.items() if k not in ("v", "seq", "prev")} for e in events]
    if not allow_nan:
        lines = journal.encode(bare, journal.Tail())[0]
    else:  # journal.encode refuses NaN; a store is not bound by that
        lines, prev = [], None
        for seq, event in enumerate(bare):
            record = {"v": journal.FORMAT_VERSION, "seq": seq, "at": event["at"], "type": event["type"]}
            record.update({k: v for k, v in event.items() if k not in ("at", "type")})
            if prev is not None:
                record["prev"] = prev
            line = json.dumps(record, ensure_ascii=False, separators=(",", ":"))
            lines.append(line)
            prev = journal.line_digest(line)
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def tool_messages(request: list[dict]) -> list[dict]:
    return [m for m in request if m.get("role") == "tool"]


SEED_FIELDS = {
    "run_started": {"v", "at", "type", "run_id", "agent_id", "definition_sha256", "input", "session_id",
                    "denomination", "budget_sha256", "pid"},
    "call_started": {"v", "at", "type", "path", "kind", "provider", "model"},
    "call_settled": {"v", "at", "type", "path", "kind", "call"},
    "turn": {"v", "at", "type", "messages"},
    "run_completed": {"v", "at", "type", "result"},
}


# ---- 1. the seed's first sample -----------------------------------------------------------------
def test_seed_first_sample_buys_tokens_once(project, capsys):
    model = ScriptedModel([ANSWER])
    support = agent(id="support", instructions="Answer from policy.", model=model)
    store = DiskDurableStore("./.caveman/runs/durable")

    first = run(support, "Where is order A-123?", durable={"run_id": "nightly-2026-09-16", "store": store})
    again = run(support, "Where is order A-123?", durable={"run_id": "nightly-2026-09-16", "store": store})

    print("first.text     ", json.dumps(first.text))
    print("second.text    ", json.dumps(again.text))
    print("second.receipt ", len(again.receipt.calls), "calls")
    print()
    print("--- journal event types")
    lines = store.load("nightly-2026-09-16")
    for line in lines:
        event = json.loads(line)
        print(event["type"], ",".join(event.keys()))
    out = capsys.readouterr().out.splitlines()
    assert out[:5] == [
        'first.text      "Order A-123 shipped on Tuesday."',
        'second.text     "Order A-123 shipped on Tuesday."',
        "second.receipt  1 calls",
        "",
        "--- journal event types",
    ]
    events = [json.loads(line) for line in lines]
    assert [e["type"] for e in events] == ["run_started", "call_started", "call_settled", "turn", "run_completed"]
    assert [line.split(" ")[0] for line in out[5:]] == [e["type"] for e in events]
    for event in events:
        missing = SEED_FIELDS[event["type"]] - set(event)
        assert not missing, f"{event['type']} lacks the seed's fields {sorted(missing)}"
    started = events[0]
    assert started["run_id"] == "nightly-2026-09-16" and started["agent_id"] == "support"
    assert started["input"] == "Where is order A-123?" and started["pid"] == os.getpid()
    assert started["definition_sha256"] == support.definition_sha256() and started["denomination"] == "USD"
    assert started["session_id"] is None and started["budget_sha256"] is None
    assert events[1]["path"] == "support" and events[1]["kind"] == "model"
    assert (events[1]["provider"], events[1]["model"]) == ("scripted", "scripted")
    assert events[2]["call"]["response"]["text"] == ANSWER
    assert events[3]["messages"][0] == {"role": "assistant", "content": ANSWER}
    assert events[4]["result"] == {"text": ANSWER}
    # One call_started for two run() calls: the model got exactly one request.
    assert len(model.requests) == 1
    assert not first.replayed and again.replayed
    assert again.receipt.calls == first.receipt.calls and again.receipt.tokens == first.receipt.tokens > 0
    receipt_text = json.dumps(again.receipt.to_dict())
    assert ANSWER not in receipt_text and "A-123" not in receipt_text  # a receipt is content-blind

    store.flush_views()
    root = project / ".caveman"
    paths = [root, *root.rglob("*")]
    assert any(p.name == "journal.jsonl" for p in paths)
    for path in paths:
        mode = stat.S_IMODE(path.stat().st_mode)
        assert mode == (0o700 if path.is_dir() else 0o600), f"{path}: {oct(mode)}"


# ---- 2. reading a journal without resuming it ----------------------------------------------------
def test_run_summary_missing_pending_completed_failed_and_recovery_sweep(project):
    store = store_of(project)
    assert run_summary([]) == {"status": "missing"}
    assert run_summary(store.load("never-ran")) == {"status": "missing"}

    # pending: interrupted inside the model call
    with pytest.raises(KeyboardInterrupt):
        run(kids.support(InterruptingModel([])), QUESTION, durable=opts(project, "sweep-1"))
    lines_before = store.load("sweep-1")
    summary = run_summary(lines_before)
    assert summary["status"] == "pending"
    assert summary["run_id"] == "sweep-1" and summary["agent_id"] == "support"
    assert summary["input"] == QUESTION and summary["attempts"] == 1
    assert summary["started_at"] == json.loads(lines_before[0])["at"]
    assert store.load("sweep-1") == lines_before  # it only reads

    # the seed's recovery-sweep snippet
    model = ScriptedModel([ANSWER])
    support = kids.support(model)
    summary = run_summary(store.load("sweep-1"))
    resumed = None
    if summary["status"] == "pending" and input_is_replayable(summary["input"]):
        resumed = run(support, summary["input"], durable={"run_id": summary["run_id"], "store": store})
    assert resumed is not None and resumed.text == ANSWER and len(model.requests) == 1

    done = run_summary(store.load("sweep-1"))
    assert done["status"] == "completed" and done["result"] == {"text": ANSWER}
    assert done["run_id"] == "sweep-1" and done["attempts"] == 2

    # a settled run reads as settled whatever was appended after it
    path = journal_path(project, "sweep-1")
    events = read_events("sweep-1", store)
    tail = journal.decode("sweep-1", store.load("sweep-1"))[1]
    extra = journal.encode([{"type": "attempt", "attempt": 3}, {"type": "run_failed", "code": "boom", "message": "late"}], tail)[0]
    with open(path, "a", encoding="utf-8") as f:
        f.write("\n".join(extra) + "\n")
    assert len(read_events("sweep-1", store)) == len(events) + 2
    late = run_summary(store.load("sweep-1"))
    assert late["status"] == "completed" and late["result"] == {"text": ANSWER}

    # failed: the model has no reply
    with pytest.raises(caravanserai.ModelError):
        run(kids.support(ScriptedModel([])), QUESTION, durable=opts(project, "sweep-2"))
    failed = run_summary(store.load("sweep-2"))
    assert failed["status"] == "failed" and failed["run_id"] == "sweep-2"
    assert failed["code"] == "model_error" and "no reply" in failed["message"]
    assert failed["receipt"]["calls"] == [] and failed["receipt"]["label"] == "inferred from public list prices"
    # events, not only lines
    assert run_summary(read_events("sweep-2", store))["status"] == "failed"


def test_input_is_replayable_text_versus_multimodal(project):
    assert input_is_replayable(QUESTION) is True
    assert input_is_replayable([{"role": "user", "content": [{"type": "text", "text": "hi"}]}]) is True
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgoAAAANSUhEUg"}}
    multimodal = [{"role": "user", "content": [{"type": "text", "text": "What is in this picture?"}, image]}]
    model = ScriptedModel(["A cat."])
    with pytest.raises(KeyboardInterrupt):
        run(kids.support(InterruptingModel([])), multimodal, durable=opts(project, "mm"))
    raw = journal_path(project, "mm").read_text(encoding="utf-8")
    assert "iVBORw0KGgo" not in raw, "a multimodal part's content was journaled"
    summary = run_summary(store_of(project).load("mm"))
    journaled = summary["input"]
    part = journaled[0]["content"][1]
    assert part == {"type": "image_url", "sha256": digest(image)}
    assert journaled[0]["content"][0] == {"type": "text", "text": "What is in this picture?"}
    assert input_is_replayable(journaled) is False
    # resuming takes the caller's original input: it is the same run
    result = run(kids.support(model), multimodal, durable=opts(project, "mm"))
    assert result.text == "A cat." and model.requests[0][1]["content"][1] == image


# ---- 3. crash during a model call ---------------------------------------------------------------
def test_crash_during_model_call_resumes_and_then_spends_nothing(project, child_env):
    run_id = "nightly-crash"
    proc = spawn("seed", run_id, project, child_env, DURABLE_MODEL_DELAY="60")
    wait_until(journal_has(project, run_id, "call_started"), proc, project)
    # one process drives a run at a time: the live child holds it
    locked_before = journal_path(project, run_id).read_bytes()
    busy = ScriptedModel([ANSWER])
    with pytest.raises(caravanserai.RunLocked) as info:
        run(kids.support(busy), QUESTION, durable=opts(project, run_id))
    assert info.value.code == "run_locked" and busy.requests == []
    assert journal_path(project, run_id).read_bytes() == locked_before
    assert kill9(proc) == -signal.SIGKILL

    store = store_of(project)
    summary = run_summary(store.load(run_id))
    assert (summary["status"], summary["attempts"]) == ("pending", 1)
    assert input_is_replayable(summary["input"]) is True
    assert types_of(project, run_id) == ["run_started", "call_started"]

    model = ScriptedModel([ANSWER])
    second = run(kids.support(model), summary["input"], durable=opts(project, run_id))
    assert second.text == ANSWER and not second.replayed
    assert len(model.requests) == 1
    assert second.receipt.resume is not None
    assert second.receipt.resume.to_dict() == {
        "attempts": 2,
        "prior_calls": 0,
        "prior_estimated_usd": 0,
        "prior_tokens": 0,
        "prior_unpriced": False,
        "possible_double_count_calls": 1,
        "discarded_partial_turn": False,
    }
    assert len(second.receipt.calls) == 1 and second.receipt.calls[0].attempt == 2
    assert run_summary(store.load(run_id))["status"] == "completed"

    before = journal_path(project, run_id).read_bytes()
    idle = ScriptedModel([])
    third = run(kids.support(idle), QUESTION, durable=opts(project, run_id))
    assert third.text == ANSWER and third.replayed
    assert idle.requests == []  # spends zero
    assert journal_path(project, run_id).read_bytes() == before
    assert third.receipt.to_dict() == second.receipt.to_dict(), "the replayed receipt differs from the run's receipt"


# ---- 4. crash after a settled call, before the turn ---------------------------------------------
def test_crash_after_settled_call_replays_it_and_restores_the_meter(project, child_env):
    run_id = "tool-crash"
    crash_by_itself("lookup", run_id, project, child_env, DURABLE_CRASH="lookup")
    assert types_of(project, run_id) == ["run_started", "call_started", "call_settled", "tool_intent"]
    assert len(kids.records("lookup")) == 1
    prior = next(e for e in events_of(project, run_id) if e["type"] == "call_settled")["call"]["usage"]
    prior_tokens = prior["prompt_tokens"] + prior["completion_tokens"]

    model = ScriptedModel([ANSWER])  # only the reply still to come
    result = run(kids.support_with(kids.lookup, model), QUESTION, durable=opts(project, run_id))
    assert result.text == ANSWER
    assert len(model.requests) == 1, "the settled model call was sent again"
    assert [m["content"] for m in tool_messages(model.requests[0])] == ["order A-123: shipped Tuesday"]
    assert len(kids.records("lookup")) == 2  # read tool re-driven

    resume = result.receipt.resume
    assert resume.attempts == 2 and resume.prior_calls == 1 and resume.prior_tokens == prior_tokens > 0
    assert resume.discarded_partial_turn is True and resume.possible_double_count_calls == 0
    assert resume.prior_unpriced is False
    receipt = result.receipt
    assert [c.attempt for c in receipt.calls] == [1, 2]
    new = receipt.calls[1]
    assert receipt.tokens == prior_tokens + new.prompt_tokens + new.completion_tokens
    types = types_of(project, run_id)
    assert types.count("call_started") == 2 and types[-1] == "run_completed"


def test_crash_after_a_turn_restores_the_conversation(project, child_env):
    """Killed in the second model call, after the first turn was checkpointed: nothing is replayed
    or re-driven, the conversation comes back from the ``turn`` event."""
    run_id = "turn-crash"
    proc = spawn("lookup", run_id, project, child_env, DURABLE_MODEL_DELAY="1.5")
    wait_until(lambda: types_of(project, run_id).count("call_started") == 2, proc, project)
    assert kill9(proc) == -signal.SIGKILL
    assert types_of(project, run_id) == ["run_started", "call_started", "call_settled", "tool_intent",
                                         "tool_settled", "turn", "call_started"]
    model = ScriptedModel([ANSWER])
    result = run(kids.support_with(kids.lookup, model), QUESTION, durable=opts(project, run_id))
    assert result.text == ANSWER and len(model.requests) == 1
    request = model.requests[0]
    assert [m["role"] for m in request] == ["system", "user", "assistant", "tool"]
    assert request[2]["tool_calls"][0]["function"]["name"] == "lookup"
    assert len(kids.records("lookup")) == 1  # settled in the journal: not re-driven
    resume = result.receipt.resume
    assert (resume.prior_calls, resume.possible_double_count_calls, resume.discarded_partial_turn) == (1, 1, False)


def test_a_failed_tool_stays_in_the_checkpointed_conversation(project):
    """A tool failure is a tool result the model was shown: the turn that holds it is checkpointed,
    so the next attempt continues after it (the model answers from the error) instead of
    re-running the tool or getting stuck."""
    seen = []

    @caravanserai.tool(effect="read")
    def flaky(order: str) -> str:
        """Flaky lookup."""
        seen.append(order)
        raise ConnectionError("shipping system timed out")

    def spec(m):
        return agent(id="flaky-agent", instructions="Look it up.", model=m, tools=[flaky])

    # Attempt 1: the tool fails, the model is shown the error, then the attempt dies (no reply scripted).
    first = ScriptedModel([ScriptedModel.tool("flaky", order="A")])
    with pytest.raises(caravanserai.ModelError):
        run(spec(first), "go", durable=opts(project, "flaky-1"))
    error = "error: ConnectionError: shipping system timed out"
    assert [m["content"] for m in tool_messages(first.requests[1])] == [error]
    assert run_summary(store_of(project).load("flaky-1"))["status"] == "failed"
    # Attempt 2 resumes after the checkpointed turn: one new model request, which holds the error.
    model = ScriptedModel(["the shipping system is down, try later"])
    result = run(spec(model), "go", durable=opts(project, "flaky-1"))
    assert result.text == "the shipping system is down, try later" and seen == ["A"]
    assert len(model.requests) == 1 and [m["content"] for m in tool_messages(model.requests[0])] == [error]


def test_a_tool_failure_is_shown_to_the_model(project):
    @caravanserai.tool(effect="write")
    def send(to: str) -> str:
        """Send."""
        raise PermissionError("mailbox full")

    model = ScriptedModel([ScriptedModel.tool("send", to="ann"), "could not send: mailbox full"])
    result = run(agent(id="mailer", instructions="Send.", model=model, tools=[send]), "go", durable=opts(project, "mail-1"))
    assert result.text == "could not send: mailbox full"
    assert [m["content"] for m in tool_messages(model.requests[1])] == ["error: PermissionError: mailbox full"]
    settled = [e for e in caravanserai.runs.read_events("mail-1", store_of(project)) if e["type"] == "tool_settled"]
    assert settled[0]["error"] == "PermissionError: mailbox full"


def test_run_id_is_validated_before_anything_is_read_or_written(project):
    store_a = DiskDurableStore(str(project / "store-a"))
    run(kids.support(ScriptedModel([ANSWER])), QUESTION, durable={"run_id": "victim", "store": store_a})
    store_b = DiskDurableStore(str(project / "store-b"))
    for bad in ("../store-a/victim", "bad id", "", "-leading-dash", "x" * 129):
        model = ScriptedModel(["other"])
        with pytest.raises(caravanserai.InvalidRunId):
            run(kids.support(model), QUESTION, durable={"run_id": bad, "store": store_b})
        assert model.requests == []
    assert not (project / "store-b").exists()


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
    caravanserai.runs._REGISTRY.get("plain-run", caravanserai.open_store()).close()
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


# ---- 9. subagents share the root journal ---------------------------------------------------------
def test_subagent_shares_the_root_journal_and_receipt(project):
    lead_model = ScriptedModel([ScriptedModel.tool("helper", input="Is A-123 packed?"), ANSWER])
    helper_model = ScriptedModel(["A-123 is packed."])
    result = run(kids.lead(lead_model, kids.helper(helper_model)), QUESTION, durable=opts(project, "sub-1"))
    assert result.text == ANSWER
    assert store_of(project).list() == ["sub-1"]  # one journal
    events = events_of(project, "sub-1")
    assert [e["path"] for e in events if e["type"] == "call_started"] == ["lead", "lead/helper", "lead"]
    assert [e["path"] for e in events if e["type"] == "call_settled"] == ["lead", "lead/helper", "lead"]
    assert [(e["path"], e["tool"]) for e in events if e["type"] == "tool_intent"] == [("lead/helper", "helper")]
    assert [e["result"] for e in events if e["type"] == "tool_settled"] == ["A-123 is packed."]
    assert [c.path for c in result.receipt.calls] == ["lead", "lead/helper", "lead"]
    assert result.receipt.tokens == sum(c.prompt_tokens + c.completion_tokens for c in result.receipt.calls)
    assert helper_model.requests[0][-1] == {"role": "user", "content": "Is A-123 packed?"}
    assert tool_messages(lead_model.requests[1])[0]["content"] == "A-123 is packed."


def test_subagent_is_given_its_own_instructions(project):
    helper_model = ScriptedModel(["A-123 is packed."])
    helper = kids.helper(helper_model)
    lead_model = ScriptedModel([ScriptedModel.tool("helper", input="Is A-123 packed?"), ANSWER])
    run(kids.lead(lead_model, helper), QUESTION, durable=opts(project, "sub-instr"))
    assert helper_model.requests[0][0] == {"role": "system", "content": helper.instructions}, (
        f"the subagent was asked without its instructions: {helper_model.requests[0]}")


def test_subagent_calls_replay_after_a_crash(project, child_env):
    run_id = "sub-crash"
    crash_by_itself("subagent", run_id, project, child_env, DURABLE_CRASH="boom")
    paths = [(e["type"], e.get("path")) for e in events_of(project, run_id) if e["type"] != "run_started"]
    assert paths == [("call_started", "lead"), ("call_settled", "lead"), ("tool_intent", "lead/helper"),
                     ("call_started", "lead/helper"), ("call_settled", "lead/helper"),
                     ("tool_intent", "lead/helper/boom")]

    lead_model = ScriptedModel([ANSWER])
    helper_model = ScriptedModel(["A-123 is packed."])
    result = run(kids.lead(lead_model, kids.helper(helper_model)), QUESTION, durable=opts(project, run_id))
    assert result.text == ANSWER
    assert len(helper_model.requests) == 1, "the subagent's settled call was sent again"
    assert tool_messages(helper_model.requests[0])[0]["content"] == "noted A-123"
    assert len(lead_model.requests) == 1
    assert tool_messages(lead_model.requests[0])[0]["content"] == "A-123 is packed."
    assert len(kids.records("boom")) == 2
    receipt = result.receipt
    assert [(c.path, c.attempt) for c in receipt.calls] == [("lead", 1), ("lead/helper", 1), ("lead/helper", 2), ("lead", 2)]
    assert receipt.resume.prior_calls == 2 and receipt.resume.discarded_partial_turn is True
    assert store_of(project).list() == [run_id]


# ---- 10. journaled calls in a plain loop --------------------------------------------------------
def test_plain_loop_resumes_from_the_last_waypoint(project, child_env):
    crash_by_itself("loop", "loop-run", project, child_env, DURABLE_LOOP_CRASH_AT="2")
    events = read_events("loop-run")
    assert [e["n"] for e in events if e["type"] == "waypoint"] == [1, 2]
    assert [e["type"] for e in events][-2:] == ["tool_intent", "tool_settled"]
    assert [r["order"] for r in kids.records("lookup")] == ["step-0", "step-1", "step-2"]

    model = ScriptedModel(["answer 3"])
    with durable("loop-run") as r:
        assert r.state == {"i": 2}
        answers = kids.loop_body(r, model)
        receipt = r.receipt()
    assert answers == ["answer 2", "answer 3"]  # step 2 replayed from the journal, step 3 asked
    assert [req[-1]["content"] for req in model.requests] == ["step 3"]
    assert [r["order"] for r in kids.records("lookup")] == ["step-0", "step-1", "step-2", "step-3"]
    assert len(receipt.calls) == 4 and receipt.resume.prior_calls == 3
    assert receipt.resume.discarded_partial_turn is True
    final = read_events("loop-run")
    assert final[-1]["type"] == "run_completed" and [e["n"] for e in final if e["type"] == "waypoint"] == [1, 2, 3, 4]


def test_calls_before_the_last_waypoint_are_not_replayed(project):
    first = ScriptedModel(["alpha", "beta"])
    with pytest.raises(KeyboardInterrupt):
        with durable("window") as r:
            assert r.call_model(first, [{"role": "user", "content": "a"}]).text == "alpha"
            r.checkpoint({"a": True}, "a done")
            assert r.call_model(first, [{"role": "user", "content": "b"}]).text == "beta"
            raise KeyboardInterrupt
    second = ScriptedModel(["alpha again"])
    with durable("window") as r:
        assert r.call_model(second, [{"role": "user", "content": "a"}]).text == "alpha again"  # before it: sent
        assert r.call_model(second, [{"role": "user", "content": "b"}]).text == "beta"  # after it: replayed
        assert r.call_tool(kids.lookup, {"order": "Z"}) == "order Z: shipped Tuesday"
    assert [req[-1]["content"] for req in second.requests] == ["a"]
    assert read_events("window")[-1]["type"] == "run_completed"


# ---- 11. the CLI -------------------------------------------------------------------------------
def test_cli_show_journal_and_settle_errors(project, capsys):
    run(kids.support(ScriptedModel([ANSWER])), QUESTION, durable=opts(project, "cli-run"))
    root = str(store_of(project).root)
    events = events_of(project, "cli-run")

    assert cli.main(["show", "cli-run", "--store", root]) == 0
    out = capsys.readouterr().out
    assert "status: completed" in out
    assert f"result: {json.dumps({'text': ANSWER})}" in out
    tokens = sum(e["call"]["usage"]["total_tokens"] for e in events if e["type"] == "call_settled")
    match = re.search(r"receipt: (\d+) call\(s\), (\d+) tokens, \$(\d+\.\d+) \(inferred from public list prices\)", out)
    assert match, out
    assert (int(match.group(1)), int(match.group(2)), float(match.group(3))) == (1, tokens, 0.0)

    assert cli.main(["journal", "cli-run", "--json", "--store", root]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [json.loads(line) for line in lines] == events

    assert cli.main(["journal", "cli-run", "--store", root]) == 0
    human = capsys.readouterr().out.splitlines()
    assert len(human) == len(events)
    for line, event in zip(human, events):
        assert line.split()[0] == str(event["seq"]) and event["type"] in line and event["at"] in line

    for argv in (["settle", "cli-run", "support#9", "--result", "1"],
                 ["settle", "cli-run", "support#1"],
                 ["settle", "cli-run", "support#1", "--result", "1", "--error", "x"],
                 ["settle", "cli-run", "support#1", "--result", "{not json"],
                 ["settle", "ghost-run", "x#1", "--result", "1"]):
        before = journal_path(project, "cli-run").read_bytes()
        assert cli.main([*argv, "--store", root]) == 1, argv
        captured = capsys.readouterr()
        assert captured.out == "" and captured.err.count("\n") == 1 and captured.err.startswith("caravanserai: error: "), argv
        assert journal_path(project, "cli-run").read_bytes() == before
    assert store_of(project).list() == ["cli-run"]


# ---- 12. auto() and prices ---------------------------------------------------------------------
def test_auto_needs_configuration(monkeypatch):
    for name in ("OPENAI_BASE_URL", "OPENAI_MODEL", "OPENAI_API_KEY", "VLLM_BASE_URL", "VLLM_MODEL", "VLLM_API_KEY"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(ModelNotConfigured) as info:
        auto()
    assert "OPENAI_BASE_URL" in str(info.value) and info.value.code == "model_not_configured"
    monkeypatch.setenv("OPENAI_BASE_URL", "http://127.0.0.1:9/v1")
    monkeypatch.setenv("OPENAI_MODEL", "gpt-4o-mini")
    model = auto()
    assert isinstance(model, OpenAICompatibleModel)
    assert model.name == "gpt-4o-mini" and model.base_url == "http://127.0.0.1:9"


def test_unknown_model_is_unpriced_never_guessed(project, capsys):
    model = ScriptedModel([ScriptedModel.tool("lookup", order="A-123"), ANSWER])
    model.name = "mystery-llm-7b"
    result = run(kids.support_with(kids.lookup, model), QUESTION, durable=opts(project, "unpriced"))
    assert [c.estimated_usd for c in result.receipt.calls] == [None, None]
    assert result.receipt.unpriced is True and result.receipt.to_dict()["unpriced"] is True
    settled = [e for e in events_of(project, "unpriced") if e["type"] == "call_settled"]
    assert [e["call"]["estimated_usd"] for e in settled] == [None, None]
    assert cli.main(["show", "unpriced", "--store", str(store_of(project).root)]) == 0
    assert "+ unpriced calls" in capsys.readouterr().out


def test_unknown_model_prior_spend_is_prior_unpriced(project):
    seen = []

    @caravanserai.tool(effect="read")
    def peek(order: str) -> str:
        """Peek."""
        seen.append(order)
        if len(seen) == 1:
            raise KeyboardInterrupt
        return "fine"

    def spec(replies):
        model = ScriptedModel(replies)
        model.name = "mystery-llm-7b"
        return agent(id="peeker", instructions="Peek.", model=model, tools=[peek])

    with pytest.raises(KeyboardInterrupt):
        run(spec([ScriptedModel.tool("peek", order="A")]), "go", durable=opts(project, "unpriced-resume"))
    result = run(spec(["ok"]), "go", durable=opts(project, "unpriced-resume"))
    assert result.receipt.resume.prior_unpriced is True and result.receipt.resume.prior_calls == 1


def test_known_model_is_priced_from_the_list(project, monkeypatch):
    monkeypatch.setitem(pricing._PRICES, "fakeco-large", (0.0, 0.0))  # undone after the test
    pricing.register_price("fakeco-large", 3.0, 12.0)
    with pytest.raises(ValueError):
        pricing.register_price("fakeco-large", math.nan, 1.0)
    model = ScriptedModel([ScriptedModel.tool("lookup", order="A-123"), ANSWER])
    model.name = "fakeco-large-2026"
    result = run(kids.support_with(kids.lookup, model), QUESTION, durable=opts(project, "priced"))
    assert not result.receipt.unpriced
    for call in result.receipt.calls:
        assert call.estimated_usd == pytest.approx((call.prompt_tokens * 3.0 + call.completion_tokens * 12.0) / 1e6)
        assert call.estimated_usd > 0
    assert result.receipt.estimated_usd == pytest.approx(sum(c.estimated_usd for c in result.receipt.calls))
    # revalidated on the way out: the idempotent re-run reads the same figures back
    idle = ScriptedModel([])
    idle.name = model.name  # the model is part of the definition digest
    again = run(kids.support_with(kids.lookup, idle), QUESTION, durable=opts(project, "priced"))
    assert idle.requests == []
    assert again.replayed and again.receipt.estimated_usd == result.receipt.estimated_usd

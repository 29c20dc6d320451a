"""Durable runs (seed 002): agents, journaled calls, identity, resume by effect, budgets, receipts.

Every crash is a real one where the brief needs it: a child process (``tests/children/durable_agents.py``)
is SIGKILLed, by the parent or by itself, at a chosen point, and the parent resumes the same run id
with a fresh ``ScriptedModel`` holding only the replies still to come, so a call that should have
been replayed from the journal but was sent again fails the test. Cheaper in-process "crashes"
raise KeyboardInterrupt, which ``run()``/``durable()`` leave unrecorded (the run stays pending).
"""

from __future__ import annotations

import json
import math
import os
import re
import signal
import stat

import pytest
from caravanserai.ledger import digest
from conftest import kill9
from durable_helpers import (
    ANSWER,
    QUESTION,
    SEED_FIELDS,
    InterruptingModel,
    crash_by_itself,
    events_of,
    journal_has,
    journal_path,
    kids,
    opts,
    spawn,
    store_of,
    tool_messages,
    types_of,
    wait_until,
)

import caravanserai
from caravanserai import (
    DiskDurableStore,
    ModelNotConfigured,
    OpenAICompatibleModel,
    agent,
    auto,
    cli,
    durable,
    input_is_replayable,
    journal,
    pricing,
    run,
    run_summary,
)
from caravanserai.runs import read_events
from caravanserai.testing import ScriptedModel


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
    extra = journal.encode([{"type": "attempt", "attempt": 3},
                            {"type": "run_failed", "code": "boom", "message": "late"}], tail)[0]
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
    match = re.search(r"receipt: (\d+) model calls?, (\d+) tokens, \$(\d+(?:\.\d+)?) \(inferred from public list prices\)", out)
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

    for argv, code in ((["settle", "cli-run", "support#9", "--result", "1"], 1),
                       (["settle", "cli-run", "support#1"], 2),  # bad usage: exit 2
                       (["settle", "cli-run", "support#1", "--result", "1", "--error", "x"], 2),
                       (["settle", "cli-run", "support#1", "--result", "{not json"], 2),
                       (["settle", "ghost-run", "x#1", "--result", "1"], 1)):
        before = journal_path(project, "cli-run").read_bytes()
        assert cli.main([*argv, "--store", root]) == code, argv
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
    assert "tokens, unpriced (" in capsys.readouterr().out  # no call had a list price: no dollar figure at all


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


# ---- a completed run entered again ----------------------------------------------------------------
def _three_steps(run_id: str, model: ScriptedModel | None = None) -> tuple[int, str | None]:
    with durable(run_id) as r:
        step = (r.state or {}).get("step", 0)
        while step < 3:
            step += 1
            r.checkpoint({"step": step}, f"step {step}")
        summary = r.call_model(model, [{"role": "user", "content": "sum up"}]).text if model is not None else None
        return step, summary


def test_a_completed_run_entered_again_says_so_each_time_and_records_nothing(project, capsys):
    assert _three_steps("done-once", ScriptedModel(["hello"])) == (3, "hello")
    assert "completed earlier" not in capsys.readouterr().err  # a first run says nothing
    before = read_events("done-once")
    for _ in range(3):  # the journal answers the call (an empty script would fail if it were sent)
        assert _three_steps("done-once", ScriptedModel([])) == (3, "hello")
        err = capsys.readouterr().err
        assert err.count("[caravanserai] run 'done-once' completed earlier") == 1, err  # once per entry
        assert "caravanserai clean done-once" in err and err.count("\n") == 1
    assert read_events("done-once") == before  # no attempt, no replay record, no second run_completed
    assert [e["type"] for e in before].count("run_completed") == 1
    assert run_summary(DiskDurableStore().load("done-once"))["status"] == "completed"


def test_a_completed_run_entered_again_that_fails_or_is_interrupted_stays_completed(project, capsys):
    _three_steps("stays-done")
    before = read_events("stays-done")
    with pytest.raises(RuntimeError), durable("stays-done"):
        raise RuntimeError("a bug in the re-run")
    with pytest.raises(KeyboardInterrupt), durable("stays-done"):
        raise KeyboardInterrupt
    assert read_events("stays-done") == before and capsys.readouterr().err.count("completed earlier") == 2


def test_a_completed_run_entered_again_that_writes_is_a_new_attempt_completed_again(project, capsys):
    _three_steps("extended")
    with durable("extended") as r:
        r.checkpoint({"step": 4}, "one more step")
    types = [e["type"] for e in read_events("extended")]
    assert types[-3:] == ["attempt", "waypoint", "run_completed"] and types.count("run_completed") == 2
    assert capsys.readouterr().err.count("completed earlier") == 1


def test_resumable_on_a_completed_run_records_nothing(project, capsys):
    @caravanserai.resumable
    def count_to_three(run_id, state):
        step = state.get("step", 0)
        while step < 3:
            step += 1
            caravanserai.checkpoint(run_id, {"step": step}, f"step {step}")
        return step

    assert count_to_three("counted", {"step": 0}) == 3
    before = read_events("counted")
    assert count_to_three("counted", {"step": 0}) == 3
    assert read_events("counted") == before and "completed earlier" in capsys.readouterr().err

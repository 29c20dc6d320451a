"""Child for tests/test_durable_runs.py: durable agent runs that crash (SIGKILL) at chosen points.

usage: durable_agents.py SCENARIO RUN_ID

The parent imports this module for the same agent definitions (a resume must present the same
definition digest) and runs it as a child process to crash it. Crash points are chosen by the
environment, so the parent process (which never sets them) resumes without crashing:

- ``DURABLE_CRASH=<tool>``: that tool SIGKILLs its own process (after recording that it ran);
- ``DURABLE_SLEEP=<seconds>``: write/external tools sleep that long after recording their effect
  (the parent SIGKILLs the child while it sleeps);
- ``DURABLE_MODEL_DELAY=<seconds>``: the scripted model sleeps that long inside the call.

Tools append one JSON line per invocation to ``<tool>.log`` in the working directory (fsynced),
so the parent can tell how many times each really ran and with which idempotency key.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time

from caravanserai import DiskDurableStore, agent, current_idempotency_key, durable, run, tool
from caravanserai.testing import ScriptedModel

STORE_DIR = "./.caveman/runs/durable"
QUESTION = "Where is order A-123?"
ANSWER = "Order A-123 shipped on Tuesday."


def record(name: str, **fields) -> None:
    with open(f"{name}.log", "a", encoding="utf-8") as log:
        log.write(json.dumps(fields, sort_keys=True) + "\n")
        log.flush()
        os.fsync(log.fileno())


def records(name: str) -> list[dict]:
    try:
        with open(f"{name}.log", encoding="utf-8") as log:
            return [json.loads(line) for line in log if line.strip()]
    except FileNotFoundError:
        return []


def maybe_crash(name: str) -> None:
    if os.environ.get("DURABLE_CRASH") == name:
        os.kill(os.getpid(), signal.SIGKILL)


def maybe_sleep() -> None:
    delay = float(os.environ.get("DURABLE_SLEEP", "0") or 0)
    if delay:
        time.sleep(delay)


@tool(effect="read")
def lookup(order: str) -> str:
    """Look an order up in the shipping system."""
    record("lookup", order=order)
    maybe_crash("lookup")
    return f"order {order}: shipped Tuesday"


@tool(effect="read")
def boom(note: str) -> str:
    """A read tool that crashes its process on the first attempt."""
    record("boom", note=note)
    maybe_crash("boom")
    return f"noted {note}"


@tool(effect="idempotent")
def charge(order: str, cents: int, idempotency_key: str = "") -> str:
    """Charge an order (the payment service deduplicates by idempotency key)."""
    record("charge", order=order, cents=cents, key=idempotency_key, current=current_idempotency_key())
    maybe_crash("charge")
    return f"charged {cents} for {order}"


@tool(effect="write")
def send_email(to: str, body: str) -> str:
    """Send an email (not idempotent: a second call sends a second email)."""
    record("send_email", to=to, body=body)
    maybe_sleep()
    return f"sent to {to}"


@tool(effect="external")
def notify(channel: str) -> str:
    """Post to an external channel."""
    record("notify", channel=channel)
    maybe_sleep()
    return f"posted to {channel}"


def store() -> DiskDurableStore:
    return DiskDurableStore(STORE_DIR)


def model_delay() -> float:
    return float(os.environ.get("DURABLE_MODEL_DELAY", "0") or 0)


def support(model) -> object:
    """The seed's agent."""
    return agent(id="support", instructions="Answer from policy.", model=model)


def support_with(tool_obj, model) -> object:
    return agent(id="support", instructions="Answer from policy, using your tools.", model=model, tools=[tool_obj])


def helper(model) -> object:
    """Subagent B: it uses the ``boom`` tool once, then answers."""
    return agent(id="helper", instructions="Check the warehouse notes.", model=model, tools=[boom])


def lead(model, helper_agent) -> object:
    """Agent A with agent B (``helper``) in its tools."""
    return agent(id="lead", instructions="Delegate warehouse questions.", model=model, tools=[helper_agent])


# Scripts: what each model answers in the FIRST attempt (the child). A resume in the parent gives
# its own ScriptedModel only the replies still to come, so a replayed call cannot be answered twice.
TOOL_SCRIPTS = {
    "lookup": [ScriptedModel.tool("lookup", order="A-123"), ANSWER],
    "charge": [ScriptedModel.tool("charge", order="A-123", cents=1299), ANSWER],
    "send_email": [ScriptedModel.tool("send_email", to="ops@example.com", body="A-123 shipped"), ANSWER],
    "notify": [ScriptedModel.tool("notify", channel="#ops"), ANSWER],
}
TOOLS = {"lookup": lookup, "charge": charge, "send_email": send_email, "notify": notify}
BUDGETS = {"budget": {"calls": 1}}


def loop_body(run_obj, model, *, crash_at: int | None = None, steps: int = 4) -> list[str]:
    """A plain journaled loop: a model call and a tool call per step, a waypoint after each step."""
    start = run_obj.state["i"] if run_obj.state else 0
    answers = []
    for i in range(start, steps):
        reply = run_obj.call_model(model, [{"role": "user", "content": f"step {i}"}], path="loop")
        run_obj.call_tool(lookup, {"order": f"step-{i}"}, path="loop")
        answers.append(reply.text)
        if crash_at == i:
            os.kill(os.getpid(), signal.SIGKILL)
        run_obj.checkpoint({"i": i + 1}, f"step {i} done")
    return answers


def main() -> None:
    scenario, run_id = sys.argv[1], sys.argv[2]
    durable_opts = {"run_id": run_id, "store": store()}
    if scenario == "seed":
        model = ScriptedModel([ANSWER], delay=model_delay())
        result = run(support(model), QUESTION, durable=durable_opts)
    elif scenario in TOOLS:
        model = ScriptedModel(TOOL_SCRIPTS[scenario], delay=model_delay())
        result = run(support_with(TOOLS[scenario], model), QUESTION, durable=durable_opts)
    elif scenario == "budget":
        model = ScriptedModel(TOOL_SCRIPTS["lookup"])
        result = run(support_with(lookup, model), QUESTION, durable=durable_opts, budget=BUDGETS["budget"])
    elif scenario == "subagent":
        lead_model = ScriptedModel([ScriptedModel.tool("helper", input="Is A-123 packed?"), ANSWER])
        helper_model = ScriptedModel([ScriptedModel.tool("boom", note="A-123"), "A-123 is packed."])
        result = run(lead(lead_model, helper(helper_model)), QUESTION, durable=durable_opts)
    elif scenario == "loop":
        crash_at = int(os.environ.get("DURABLE_LOOP_CRASH_AT", "-1"))
        model = ScriptedModel([f"answer {i}" for i in range(4)])
        with durable(run_id) as run_obj:
            loop_body(run_obj, model, crash_at=crash_at)
        print("loop done")
        return
    else:
        raise SystemExit(f"unknown scenario {scenario!r}")
    print(json.dumps({"text": result.text}))


if __name__ == "__main__":
    main()

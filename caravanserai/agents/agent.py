"""Agents and durable runs: ``agent(...)``, ``run(agent, input, durable={...})``.

A durable run writes its journal before any network work: the intent of every model and tool
call is appended before the call goes out and its result after, and the conversation is
checkpointed at turn boundaries (a ``turn`` event holds the messages the turn added). The run
id is the idempotency key: running the same id again returns the journaled result and buys its
tokens once; resuming a crashed run replays the settled calls and re-drives the rest by effect.
Subagents (an agent used as a tool) share the root run's journal and meter.
"""

from __future__ import annotations

import contextvars
import inspect
import json
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..calls.journaled import EFFECTS, model_call, tool_call
from ..calls.ledger import Budget, Receipt, completed_receipt
from ..calls.models import Model, auto
from ..errors import DurableOptionConflict, MaxTurnsExceeded, NoCurrentRun, ToolFailed
from ..journal import digest
from ..runs.lifecycle import RunScope, current_run
from ..runs.run import Run
from ..runs.summary import journal_input
from ..stores import LocalStore, MemoryStore, Store, open_store

__all__ = ["Agent", "DiskDurableStore", "Durable", "RunResult", "Tool", "agent", "run", "tool"]

_JSON_TYPES = {str: "string", int: "integer", float: "number", bool: "boolean", list: "array", dict: "object"}


class DiskDurableStore(LocalStore):
    """The local directory store under the seed's name: ``DiskDurableStore("./runs")``."""

    def __init__(self, path: str = ".caravanserai", **options: Any) -> None:
        super().__init__(path, **options)


@dataclass
class Tool:
    """A function an agent may call, with its declared effect (read, idempotent, write, external)."""

    name: str
    fn: Callable[..., Any]
    effect: str = "read"
    description: str = ""
    parameters: dict = field(default_factory=lambda: {"type": "object", "properties": {}})

    def __post_init__(self) -> None:
        if self.effect not in EFFECTS:
            raise ValueError(f"tool {self.name!r}: effect must be one of {', '.join(EFFECTS)}, got {self.effect!r}")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.fn(*args, **kwargs)

    def spec(self) -> dict:
        return {"type": "function",
                "function": {"name": self.name, "description": self.description, "parameters": self.parameters}}

    def describe(self) -> dict:
        return {"name": self.name, "effect": self.effect, "description": self.description, "parameters": self.parameters}


def _schema(fn: Callable[..., Any]) -> dict:
    properties: dict[str, dict] = {}
    required = []
    for name, param in inspect.signature(fn).parameters.items():
        if name == "idempotency_key" or param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            continue
        properties[name] = {"type": _JSON_TYPES.get(param.annotation, "string")}
        if param.default is param.empty:
            required.append(name)
    return {"type": "object", "properties": properties, "required": required}


def tool(fn: Callable[..., Any] | None = None, *, name: str | None = None, effect: str = "read",
         description: str | None = None, parameters: dict | None = None) -> Any:
    """Declare a tool: ``@tool(effect="write") def send_email(to: str, body: str): ...``."""

    def wrap(target: Callable[..., Any]) -> Tool:
        return Tool(name or target.__name__, target, effect, description or inspect.getdoc(target) or "",
                    parameters or _schema(target))

    return wrap(fn) if fn is not None else wrap


@dataclass
class Agent:
    """An agent definition; its digest is part of every durable run's identity."""

    id: str
    instructions: str
    model: Model | None = None
    tools: list[Any] = field(default_factory=list)
    max_turns: int = 8

    def resolved_model(self) -> Model:
        if self.model is None:
            self.model = auto()
        return self.model

    def resolved_tools(self) -> list[Tool]:
        return [t.as_tool() if isinstance(t, Agent) else t if isinstance(t, Tool) else tool(t) for t in self.tools]

    def definition(self) -> dict:
        model = self.model.describe() if self.model is not None else "auto"
        return {"id": self.id, "instructions": self.instructions, "model": model, "max_turns": self.max_turns,
                "tools": [t.describe() for t in self.resolved_tools()]}

    def definition_sha256(self) -> str:
        return digest(self.definition())

    def as_tool(self, description: str | None = None) -> Tool:
        """This agent as a tool of another: it runs inside the caller's run (one journal, one meter)."""
        sub = self

        def call_subagent(input: str) -> str:
            run = current_run()
            if run is None:
                raise NoCurrentRun(f"subagent {sub.id!r} must be called inside a run (as a tool of an agent run)", agent=sub.id)
            path = f"{_AGENT_PATH.get()}/{sub.id}"
            conversation = [{"role": "system", "content": sub.instructions}, {"role": "user", "content": input}]
            return _loop(run, sub, conversation, path=path, checkpoint_turns=False)

        return Tool(self.id, call_subagent, "read", description or f"Ask the {self.id} agent: {self.instructions}",
                    {"type": "object", "properties": {"input": {"type": "string"}}, "required": ["input"]})


def agent(*, id: str, instructions: str, model: Model | None = None, tools: Sequence[Any] = (), max_turns: int = 8) -> Agent:
    """``agent(id=..., instructions=..., model=auto(), tools=[...])``."""
    return Agent(id, instructions, model, list(tools), max_turns)


@dataclass(frozen=True)
class Durable:
    """Where a durable run lives: its id (the idempotency key) and its store."""

    run_id: str
    store: Store | str | None = None

    @classmethod
    def of(cls, value: Durable | dict | str | None) -> Durable | None:
        if value is None or isinstance(value, Durable):
            return value
        if isinstance(value, str):
            return cls(value)
        if isinstance(value, dict) and "run_id" in value and set(value) <= {"run_id", "store"}:
            return cls(value["run_id"], value.get("store"))
        raise ValueError(f"durable must be {{'run_id': ..., 'store': ...}}, a Durable or a run id; got {value!r}")


@dataclass
class RunResult:
    text: str
    receipt: Receipt
    run_id: str
    messages: list[dict] = field(default_factory=list)
    replayed: bool = False  # True when the run had already completed: nothing was called


_AGENT_PATH: contextvars.ContextVar[str] = contextvars.ContextVar("caravanserai_agent_path", default="run")


def _loop(run: Run, spec: Agent, conversation: list[dict], *, path: str, checkpoint_turns: bool) -> str:
    """The agent loop: model call, tool calls, repeat; every call journaled through ``run``."""
    model = spec.resolved_model()
    tools = {t.name: t for t in spec.resolved_tools()}
    schemas = [t.spec() for t in tools.values()] or None
    start = len([m for m in conversation if m.get("role") == "assistant"])
    for _ in range(start, spec.max_turns):
        response = model_call(run, model, conversation, path=path, tools=schemas)
        assistant: dict[str, Any] = {"role": "assistant", "content": response.text}
        if response.tool_calls:
            assistant["tool_calls"] = list(response.tool_calls)
        added = [assistant]
        for call in response.tool_calls:
            function = call.get("function") or {}
            name = function.get("name", "")
            try:
                args = json.loads(function.get("arguments") or "{}")
            except ValueError:
                args = {"_unparsed": function.get("arguments")}
            target = tools.get(name)
            if target is None:
                content = f"error: no tool named {name!r}"
            else:
                outer = _AGENT_PATH.set(path)  # a subagent tool nests its path under this agent's
                try:
                    result = tool_call(run, target.fn, args if isinstance(args, dict) else {"value": args},
                                       name=name, path=f"{path}/{name}", effect=target.effect)
                    content = result if isinstance(result, str) else json.dumps(result, ensure_ascii=False)
                except ToolFailed as failure:  # the model sees the failure and can react to it
                    content = f"error: {failure.detail}"
                finally:
                    _AGENT_PATH.reset(outer)
            added.append({"role": "tool", "tool_call_id": call.get("id"), "name": name, "content": content})
        if checkpoint_turns:
            run.append({"type": "turn", "messages": added})
        conversation.extend(added)
        if not response.tool_calls:
            return response.text
    raise MaxTurnsExceeded(f"agent {spec.id!r} used all {spec.max_turns} turns without a final answer; raise max_turns",
                            code_detail="max_turns", agent=spec.id)


def run(agent: Agent, input: Any, *, durable: Durable | dict | str | None = None, budget: Budget | dict | None = None,
        session_id: str | None = None, history: Sequence[dict] | None = None, max_cost_usd: float | None = None) -> RunResult:
    """Run ``agent`` on ``input``; with ``durable={"run_id": ..., "store": ...}`` the run is journaled.

    The same run id again returns the journaled result (no model call). A crashed run resumes:
    settled calls replay from the journal, unsettled ones go by effect, and the identity
    (agent, definition, input, budget, session, conversation) must match or nothing is spent.
    """
    spec = Durable.of(durable)
    if spec is not None and max_cost_usd is not None:
        raise DurableOptionConflict("durable runs cannot use max_cost_usd: pass budget={'usd': ...} instead "
                                    "(a budget is part of the run's identity and counts earlier attempts)")
    parsed = Budget.of(budget if budget is not None else ({"usd": max_cost_usd} if max_cost_usd is not None else None))
    if spec is None:
        spec = Durable(f"ephemeral-{uuid.uuid4().hex[:12]}", MemoryStore(f"ephemeral-{uuid.uuid4().hex}"))
    store = open_store(spec.store)
    identity = {
        "agent_id": agent.id,
        "definition_sha256": agent.definition_sha256(),
        "input": journal_input(input),
        "session_id": session_id,
        "denomination": "USD",
        "budget_sha256": parsed.digest() if parsed is not None else None,
        "conversation_sha256": digest(list(history)) if history else None,
    }
    scope = RunScope(spec.run_id, store, identity, parsed)
    with scope as the_run:
        finished = the_run.completed_event
        if finished is not None:  # the idempotency key: buy the tokens once
            scope.complete = False
            result = finished.get("result") or {}
            return RunResult(result.get("text", ""), completed_receipt(spec.run_id, the_run.opened_events), spec.run_id,
                             replayed=True)
        initial = [{"role": "system", "content": agent.instructions}, *(history or ()), *_user_messages(input)]
        restored = [m for e in the_run.opened_events if e["type"] == "turn" for m in e.get("messages", ())]
        conversation = initial + restored
        text = _loop(the_run, agent, conversation, path=agent.id, checkpoint_turns=True)
        scope.result = {"text": text}
    return RunResult(text, the_run.receipt(), spec.run_id, conversation)


def _user_messages(value: Any) -> list[dict]:
    if isinstance(value, str):
        return [{"role": "user", "content": value}]
    if isinstance(value, list) and all(isinstance(m, dict) and "role" in m for m in value):
        return list(value)
    return [{"role": "user", "content": value}]

"""ForkPanel's rows and actions: the steps of a timeline, a fork from one of them, and its background resume.

For a DurableAgent run (a CheckpointLog) the rows are its steps (prompt, output, tokens); a fork
edits one step's prompt and becomes a new run (``CheckpointLog.fork``), which ``ForkJob`` resumes
in a thread: only the edited step and those after it run, the others are reused. For any other
run the rows are its waypoints; a fork edits one waypoint's state (``caravanserai.fork``) and the
notebook continues it (``%%resumable NEW``). Every check runs before anything is written.
"""

from __future__ import annotations

import ast
import json
import threading
from dataclasses import dataclass
from typing import Any, ClassVar

from ..checkpoints.agent import prompt_id
from ..checkpoints.log import CheckpointLog
from ..checkpoints.timelines import Step, step_text, timeline
from ..errors import NoSuchWaypoint, RunExists, UsageError
from ..ids import validate_run_id
from ..runs.fork import fork
from ..runs.view import show_value
from ..stores import Store
from .lineage import log_ref
from .source import Source, one_line, pretty

__all__ = ["ForkJob", "Forked", "StepsSource", "fork_step"]

PREVIEW = 160  # characters of a prompt, output or state shown in a row


def _preview(text: str, limit: int = PREVIEW) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


class StepsSource(Source):
    """The steps of ``run_or_log``: DurableAgent steps (``agent`` True) or waypoints."""

    panel = "fork"
    options: ClassVar[dict[str, tuple]] = {}

    def __init__(self, run_or_log: Any, store: Store | str | None = None) -> None:
        self.run_id, self.store = log_ref(run_or_log, store)
        self.log = CheckpointLog(self.store, self.run_id)  # its cache keeps the head rebuilt between polls and a fork
        self.steps: list[Step] = []
        self.head: str | None = None  # the checkpoint the steps were read from (DurableAgent runs)
        self._stamp: Any = object()

    @property
    def agent(self) -> bool:
        return self.head is not None

    def poll(self) -> bool:
        stamp = self.store.last_updated(self.run_id)
        if stamp == self._stamp:
            return False
        events = self.store.events(self.run_id)
        committed = [e for e in events if e["type"] == "checkpoint_committed"]
        self.head = self.log.main_head() if committed else None  # the main line's head, as list and diff read it
        self.steps = timeline(f"{self.run_id}@{self.head}" if self.head else self.run_id, self.store, log=self.log)
        self._stamp = stamp
        return True

    def count(self) -> int:
        return len(self.steps)

    def rows(self, start: int, stop: int) -> list[dict]:
        out = []
        for index, step in enumerate(self.steps[start:stop], start=start):
            if self.agent:
                out.append({"kind": "step", "index": index, "step": step.step, "prompt": _preview(step.prompt or ""),
                            "output": _preview(step_text(step.value)), "done": step.value is not None,
                            "tokens": step.tokens, "latency_s": step.latency_s})
            else:
                shown = step.text(limit=PREVIEW) if step.variables is not None else \
                    json.dumps(step.value, ensure_ascii=False, default=repr)
                out.append({"kind": "waypoint", "index": index, "step": step.step, "note": _preview(step.note or ""),
                            "state": _preview(shown)})
        return out

    def detail(self, index: int) -> dict:
        step = self.steps[index]
        if self.agent:
            return {"title": f"step {step.step}: edit its prompt and fork — steps 1–{step.step - 1} are reused"
                             if step.step > 1 else "step 1: edit its prompt and fork — every step runs again",
                    "step": step.step, "edit": "prompt", "editable": step.prompt or "",
                    "output": step_text(step.value), "tokens": step.tokens}
        if step.variables is not None:
            return {"title": f"waypoint {step.step}: edit the cell's variables and fork — the new run starts here, "
                             "then run its cell (edited or not)",
                    "step": step.step, "edit": "variables", "editable": editable_variables(step.variables),
                    "note": step.note or ""}
        return {"title": f"waypoint {step.step}: edit its state (JSON) and fork — the new run starts here",
                "step": step.step, "edit": "state", "editable": pretty(step.value), "note": step.note or ""}

    def summary(self) -> dict:
        done = sum(1 for s in self.steps if s.value is not None) if self.agent else len(self.steps)
        return {"run_id": self.run_id, "agent": self.agent, "steps": len(self.steps), "steps_done": done,
                "head": self.head}


@dataclass(frozen=True)
class Forked:
    """What a fork made: the new run, its first checkpoint (DurableAgent), the steps and tokens reused."""

    run_id: str
    parent: str
    step: int
    checkpoint: str | None
    reused: int
    tokens_reused: int


def fork_step(source: StepsSource, step: int, text: str, new_run_id: str | None = None) -> Forked:
    """Fork ``source``'s timeline at ``step`` (counted from 1) with ``text`` as that step's prompt, or
    (a plain run) as the waypoint's state in JSON. Typed errors, nothing written, for bad input."""
    if not isinstance(step, int) or isinstance(step, bool):
        raise UsageError(f"fork takes a step number, got {type(step).__name__}")
    if new_run_id is not None:
        validate_run_id(new_run_id)
        if source.store.load(new_run_id):
            raise RunExists(f"run {new_run_id!r} already exists in {source.store.url}: fork into a new run id "
                            "(nothing was written)", run_id=new_run_id)
    if not source.agent:
        chosen = next((s for s in source.steps if s.step == step), None)
        if chosen is not None and chosen.variables is not None:
            variables = parse_variables(text)
            child = fork(source.run_id, at=step, new_run_id=new_run_id, store=source.store, variables=variables)
            return Forked(child, source.run_id, step, None, step, 0)
        try:
            state = json.loads(text)
        except json.JSONDecodeError as exc:
            raise UsageError(f"the state is not JSON ({exc.msg} at line {exc.lineno}); fix it and fork again "
                             "(nothing was written)") from None
        child = fork(source.run_id, at=step, new_run_id=new_run_id, store=source.store, state=state)
        return Forked(child, source.run_id, step, None, step, 0)
    if not 1 <= step <= len(source.steps):
        raise NoSuchWaypoint(f"run {source.run_id!r} has no step {step} (its steps: 1..{len(source.steps)}); "
                             "pick one of the rows", run_id=source.run_id, at=step)
    if not isinstance(text, str):
        raise UsageError(f"a step's prompt is text, got {type(text).__name__}")
    child = new_run_id or _free_id(source.store, f"{source.run_id}-fork-{step}")
    assert source.head is not None
    checkpoint = source.log.fork(source.head, prompt_id(step - 1), text, new_run_id=child)
    reused = source.steps[: step - 1]
    return Forked(child, source.run_id, step, checkpoint, len(reused), sum(s.tokens or 0 for s in reused))


def editable_variables(variables: dict[str, Any]) -> str:
    """A notebook waypoint's variables as the lines the fork box edits: ``name = value`` in Python's
    notation; a value that is not plain data (a DataFrame, a pickled object) as a comment, kept as it is."""
    lines = []
    for name, value in sorted(variables.items()):
        shown = show_value(value, None)
        literal = shown if not shown.startswith("<") else None
        if literal is not None:
            try:
                ast.literal_eval(literal)
            except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
                literal = None
        lines.append(f"{name} = {literal}" if literal is not None else f"# {name} = {shown[:80]} (not editable here: kept)")
    return "\n".join(lines)


def parse_variables(text: str) -> dict[str, Any]:
    """``name = value`` lines (Python literals only: numbers, strings, lists, dicts, sets, tuples,
    True/False/None) as {name: value}; nothing is evaluated. A one-line UsageError otherwise."""
    if not isinstance(text, str):
        raise UsageError(f"the variables are text (name = value lines), got {type(text).__name__}")
    try:
        tree = ast.parse(text)
    except SyntaxError as exc:
        raise UsageError(f"line {exc.lineno} of the variables is not Python ({exc.msg}); fix it and fork again "
                         "(nothing was written)") from None
    out: dict[str, Any] = {}
    for node in tree.body:
        if not (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)):
            raise UsageError(f"line {node.lineno} of the variables is not `name = value`; fix it and fork again "
                             "(nothing was written)")
        name = node.targets[0].id
        try:
            out[name] = ast.literal_eval(node.value)
        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
            raise UsageError(f"{name} on line {node.lineno} is not a value (only literals: numbers, strings, lists, dicts, "
                             "sets, tuples, True/False/None); fix it and fork again (nothing was written)") from None
    return out


def _free_id(store: Store, base: str) -> str:
    candidate, k = base[:120], 1
    while store.load(candidate):
        k += 1
        candidate = f"{base[:112]}-{k}"
    return validate_run_id(candidate)


class ForkJob:
    """Resume a forked DurableAgent run in a daemon thread; ``status`` says where it stands; ``stop()`` ends it
    after the step in progress (what was computed is committed, so a later resume reuses it)."""

    def __init__(self, store: Store, forked: Forked, on_change: Any = None) -> None:
        self.forked = forked
        self.log = CheckpointLog(store, forked.run_id)
        self._stop = threading.Event()
        self._on_change = on_change
        self.status: dict[str, Any] = {"state": "running", "run": forked.run_id, "parent": forked.parent,
                                       "step": forked.step, "head": (forked.checkpoint or "")[:12],
                                       "reused": forked.reused, "tokens_saved": forked.tokens_reused,
                                       "computed": 0, "steps_done": forked.reused, "steps": None, "error": ""}
        self.thread = threading.Thread(target=self._run, name=f"caravanserai-fork-{forked.run_id}", daemon=True)

    def start(self) -> ForkJob:
        self.thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def _update(self, **changes: Any) -> None:
        self.status = {**self.status, **changes}
        if self._on_change is not None:
            self._on_change(self.status)

    def _progress(self, progress: Any) -> None:
        self._update(head=progress.head[:12], computed=progress.computed, steps_done=progress.steps_done,
                     steps=progress.steps, tokens_saved=self.forked.tokens_reused + progress.tokens_saved)

    def _run(self) -> None:
        try:
            progress = self.log.resume(self.forked.checkpoint, stop=self._stop, on_progress=self._progress)
        except Exception as exc:  # a background thread: every failure becomes the panel's error line
            self._update(state="failed", error=one_line(exc))
            return
        self._progress(progress)
        self._update(state="stopped" if progress.stopped else "done")

"""Timelines: a run as a sequence of steps, and the comparison of two or more of them.

A run's timeline is its DurableAgent steps (prompt and output, from the checkpoint its journal
committed last, or a named one: ``"RUN@CHECKPOINT"``) or, for a plain run, its waypoints (note and
state). Each step carries what it cost where the journal knows it: tokens, seconds, inferred USD.
``compare`` aligns timelines step by step, finds the shared prefix and the first divergence, and
gives each later timeline's per-step deltas against the first; ``word_diff`` marks the changed
words. The CLI's ``diff``, the notebook's Compare panel and the HTML export all use it.

Steps here are for people, so they count from 1: ``Step.step`` 1 is the first step (DurableAgent
node ``step-0``, or waypoint 1), and ``compare`` reports ``step``, ``shared_prefix`` and
``first_divergence`` in the same numbering (see docs/checkpoint-format.md, "Step numbers").
"""

from __future__ import annotations

import difflib
import functools
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..errors import UsageError
from ..runs.api import readable_run_id
from ..runs.lifecycle import require_events
from ..runs.values import changes
from ..runs.view import RunView, saved_value, show_value
from ..stores import Store, open_store

__all__ = ["Comparison", "Step", "compare", "parse_ref", "resolve_ref", "step_text", "timeline", "word_diff"]

try:  # orjson encodes a step's key ~10x faster (two 10,000-step timelines share thousands of steps)
    import orjson as _orjson
except ImportError:  # pragma: no cover - orjson is a dependency, optional at import time
    _orjson = None  # type: ignore[assignment]

MAX_DIFF_TOKENS = 4_000  # longer texts are diffed as one replaced block (difflib is quadratic)
_TOKENS = re.compile(r"\s+|\w+|[^\w\s]", re.UNICODE)


@dataclass(frozen=True)
class Step:
    """One step of a timeline: its number (from 1, as people count steps and waypoints), label, value,
    and what the journal says it cost (None where it does not know)."""

    step: int
    label: str
    value: Any
    prompt: str | None = None  # a DurableAgent step's prompt
    note: str | None = None  # a waypoint's note
    tokens: int | None = None
    usd: float | None = None
    latency_s: float | None = None
    saved: Mapping[str, Any] | None = None  # a notebook waypoint's saved variables, as the journal holds them
    code: str | None = None  # the notebook cell's source that computed it

    def key(self) -> str:
        """What two steps must share to be the same step (prompt, note, value, variables and code)."""
        fields = [self.prompt, self.note, self.value, self.saved, self.code]
        if _orjson is not None:
            try:
                return _orjson.dumps(fields, option=_orjson.OPT_SORT_KEYS | _orjson.OPT_NON_STR_KEYS,
                                     default=repr).decode()
            except TypeError:  # an integer beyond 64 bits: the standard encoder below
                pass
        return json.dumps(fields, sort_keys=True, ensure_ascii=False, default=repr)

    @functools.cached_property
    def variables(self) -> dict[str, Any] | None:
        """A notebook step's variables, name -> value as data (``RunView.variables``); None for other steps.
        Made when asked: aligning two 10,000-step timelines compares the saved entries as they are."""
        return None if self.saved is None else {name: saved_value(entry) for name, entry in self.saved.items()}

    def text(self, limit: int | None = 80) -> str:
        """The step's value as people read it: a notebook step's variables (``results = {0: 0, …}``), else ``step_text``."""
        if self.variables is not None:
            return "; ".join(f"{name} = {show_value(value, limit)}" for name, value in sorted(self.variables.items()))
        return step_text(self.value)


@dataclass
class Comparison:
    """Aligned steps (``steps``: JSON-able dicts), the shared prefix and the first divergence; what a
    reader shows of a step (``texts``, ``changes``) is made when asked, for the rows shown only."""

    runs: tuple[str, ...]
    steps: list[dict] = field(default_factory=list)
    shared_prefix: int = 0
    first_divergence: int | None = None
    cells: list[list[Step | None]] = field(default_factory=list, repr=False)  # the Step objects behind ``steps``

    def texts(self, index: int) -> list[str | None]:
        """Step ``index``'s value in each timeline as people read it (``Step.text``)."""
        return [c.text() if c else None for c in self.cells[index]]

    def changes(self, index: int) -> list[list[dict]]:
        """Per timeline, what differs in notebook step ``index`` from the first timeline's (``[]`` for the first)."""
        cells = self.cells[index]
        base = cells[0]
        return [_changes(c, base) if c and base and i and not self.steps[index]["same"] else []
                for i, c in enumerate(cells)]

    def to_dict(self) -> dict:
        steps = []
        for i, step in enumerate(self.steps):
            cells = self.cells[i]
            if any(c is not None and c.saved is not None for c in cells):  # a notebook step: its variables, its changes
                step = {**step, "values": [c.variables if c is not None and c.saved is not None else
                                           (c.value if c else None) for c in cells]}
                if not step["same"]:
                    step["changes"] = self.changes(i)
            steps.append(step)
        return {"runs": list(self.runs), "shared_prefix": self.shared_prefix,
                "first_divergence": self.first_divergence, "steps": steps}

    def totals(self) -> list[dict]:
        """Per timeline: steps, tokens, USD and seconds summed over its steps (None where unknown)."""
        out = []
        for i, name in enumerate(self.runs):
            cells = [s["cells"][i] for s in self.steps if s["cells"][i] is not None]
            out.append({"run": name, "steps": len(cells), **{k: _sum(c[k] for c in cells)
                                                             for k in ("tokens", "usd", "latency_s")}})
        return out


def parse_ref(ref: str) -> tuple[str, str | None]:
    """``"RUN"`` or ``"RUN@CHECKPOINT"`` (a checkpoint id or unique prefix in RUN's log)."""
    run, _, checkpoint = ref.partition("@")
    return run, checkpoint or None


def resolve_ref(ref: Any, store: Store) -> str:
    """``ref`` with its run id made readable (a prefix or a 0.2.0 name resolved): ``RUN`` or ``RUN@CHECKPOINT``."""
    if not isinstance(ref, str):
        raise UsageError(f"a timeline is a run id (or RUN@CHECKPOINT), got {type(ref).__name__}")
    run, checkpoint = parse_ref(ref)
    run = readable_run_id(run, store)
    return f"{run}@{checkpoint}" if checkpoint else run


class TimelineSteps(list):
    """``timeline``'s steps (a list of ``Step``), naming what they show: ``checkpoint`` is the full id of the
    DurableAgent checkpoint read (None for waypoints), ``main_line`` whether it is the head of the run's
    main line (a plain ``RUN``), ``label`` e.g. ``ticket-42@3f2a9c1b0d4e (main line)``."""

    def __init__(self, steps: Any = (), run_id: str = "", checkpoint: str | None = None, main_line: bool = False):
        super().__init__(steps)
        self.run_id, self.checkpoint, self.main_line = run_id, checkpoint, main_line

    @property
    def label(self) -> str:
        if self.checkpoint is None:
            return self.run_id
        return f"{self.run_id}@{self.checkpoint[:12]}" + (" (main line)" if self.main_line else "")


def timeline(ref: str, store: Store | str | None = None, *, log: Any = None) -> list[Step]:
    """The steps of ``ref`` (``RUN`` or ``RUN@CHECKPOINT``): DurableAgent steps if it has a checkpoint log, else waypoints.

    A plain ``RUN`` with a checkpoint log means the head of its main line (``log_status``: not a branch
    forked inside the log, even when that branch was committed last). The list returned is a
    ``TimelineSteps``: its ``checkpoint`` and ``label`` say which checkpoint was read.
    ``log``: the run's ``CheckpointLog`` to read through, so a caller that asks again (a live
    panel) reuses the checkpoints it already rebuilt and verified.
    """
    from .log import log_status

    store = open_store(store)
    run_id, checkpoint = parse_ref(ref)
    events = require_events(run_id, store)
    status = log_status(events)
    head = status["latest"] if status else None
    target = checkpoint or head
    if target:
        return _agent_steps(store, run_id, target, log, main_head=head)
    return TimelineSteps(_waypoint_steps(RunView.from_events(run_id, events)), run_id)


def _agent_steps(store: Store, run_id: str, checkpoint: str, log: Any = None, main_head: str | None = None) -> list[Step]:
    from .agent import KV_ENTRY_BACKENDS, FakeBackend, prompt_id, step_id
    from .log import CheckpointLog

    log = log if log is not None and log.run_id == run_id else CheckpointLog(store, run_id)
    head = log.resolve(checkpoint)
    data = log.load_data(head)
    values, steps = data.header["values"], data.header["steps"]
    usage = step_usage(store, run_id, head)
    fake = data.header["backend"] in KV_ENTRY_BACKENDS
    out = []
    for i in range(steps):
        output = values.get(step_id(i))
        figures = usage.get(i, {})
        tokens = figures.get("tokens")
        if tokens is None and fake and step_id(i) in data.kv:  # the fake and text backends' KV: one entry per token
            tokens = len(data.kv[step_id(i)]) // FakeBackend.ENTRY_BYTES
        out.append(Step(i + 1, f"step {i + 1}", output, prompt=values.get(prompt_id(i)),
                        tokens=tokens if output is not None else None,
                        latency_s=figures.get("latency_s") if output is not None else None))
    return TimelineSteps(out, run_id, head, head == main_head)


def step_usage(store: Store, run_id: str, head: str) -> dict[int, dict]:
    """Per step index (from 0): the ``usage`` recorded by the commit that computed it, following the
    head's parent links through this run's journal and the runs it was forked from."""
    events_by_run: dict[str, dict[str, dict]] = {}

    def commits(run: str) -> dict[str, dict]:
        if run not in events_by_run:
            found = store.events(run)
            events_by_run[run] = {e["checkpoint_id"]: e for e in found
                                  if e["type"] == "checkpoint_committed" and isinstance(e.get("checkpoint_id"), str)}
            origin = next((e.get("forked_from") for e in found if e["type"] == "run_started"), None)
            parents[run] = origin.get("run_id") if isinstance(origin, dict) else None
        return events_by_run[run]

    parents: dict[str, str | None] = {}
    chain: list[dict] = []
    run, seen = run_id, set()
    current: str | None = head
    while isinstance(current, str) and (run, current) not in seen:
        seen.add((run, current))
        event = commits(run).get(current)
        while event is None and parents.get(run):  # the link crosses into the run this one was forked from
            run = parents[run]  # type: ignore[assignment]
            event = commits(run).get(current)
        if event is None:
            break
        chain.append(event)
        current = event.get("parent")
    usage: dict[int, dict] = {}
    for event in reversed(chain):
        fork = event.get("fork")
        if isinstance(fork, dict) and isinstance(fork.get("node_id"), str):
            edited = _node_step(fork["node_id"])
            usage = {i: u for i, u in usage.items() if edited is None or i < edited}
        for entry in event.get("usage") or ():
            if isinstance(entry, dict) and isinstance(entry.get("index"), int):
                usage[entry["index"]] = entry
    return usage


def _node_step(node_id: str) -> int | None:
    number = node_id.rpartition("-")[2]
    return int(number) if number.isdigit() else None


def _waypoint_steps(view: RunView) -> list[Step]:
    """One step per waypoint number (the last waypoint of that number wins: numbering restarts after --restart).

    A step's calls are those journaled after the previous waypoint; its latency is its own work
    (``WaypointView.duration_s``: never across a kill or a fork). A notebook run's step is its saved
    variables and the cell's code; any other run's is the waypoint's state.
    """
    latest = {w.n: w for w in view.waypoints}
    ordered = sorted(latest.values(), key=lambda w: w.n)
    calls = sorted(view.calls, key=lambda c: c.seq)
    out, previous_seq, k = [], 0, 0
    for w in ordered:
        mine = []
        while k < len(calls) and calls[k].seq <= w.seq:
            if calls[k].seq > previous_seq:
                mine.append(calls[k])
            k += 1
        models = [c for c in mine if c.kind == "model" and c.status == "settled"]
        priced = [c.usd for c in models if c.usd is not None]
        notebook = w.values_seq is not None
        out.append(Step(w.n, w.note, None if notebook else view.event(w.seq).get("state"), note=w.note,
                        tokens=sum(c.total_tokens or 0 for c in models),
                        usd=round(sum(priced), 9) if len(priced) == len(models) else None,
                        latency_s=w.duration_s, saved=view.saved_entries(w) if notebook else None,
                        code=w.code if notebook else None))
        previous_seq = w.seq
    return out


def compare(*timelines: tuple[str, list[Step]]) -> Comparison:
    """Step-by-step comparison of two or more named timelines, aligned by step number.

    Each aligned step is ``{"step", "same", "values", "labels", "cells"}``; ``cells`` holds, per
    timeline, the step's figures and their deltas against the first timeline (None where a
    timeline has no such step). Word diffs are left to ``word_diff`` (they are made for the steps
    people look at, not for all of them).
    """
    names = tuple(name for name, _ in timelines)
    by_number = [{s.step: s for s in steps} for _, steps in timelines]
    numbers = sorted(set().union(*by_number)) if by_number else []
    result = Comparison(names)
    for number in numbers:
        cells = [steps.get(number) for steps in by_number]
        base = cells[0]
        same = base is not None and all(c is not None and _same(c, base) for c in cells[1:])
        result.cells.append(cells)
        result.steps.append({"step": number, "same": same,
                             "values": [c.value if c else None for c in cells],
                             "labels": [c.label if c else None for c in cells],
                             "cells": [_cell(c, base) if c else None for c in cells]})
        if result.first_divergence is None:
            if same:
                result.shared_prefix += 1
            else:
                result.first_divergence = number
    return result


def _same(a: Step, b: Step) -> bool:
    """The same step: == first (unequal values differ as JSON too), then exactly (== takes 1 for True or 1.0)."""
    return (a.prompt == b.prompt and a.note == b.note and a.value == b.value and a.code == b.code
            and a.saved == b.saved and a.key() == b.key())


def _changes(step: Step, base: Step) -> list[dict]:
    """What differs in a notebook step against the baseline's: each variable's changed entries
    (``{"name", "path", "old", "new"}``) and the cell's code (``{"name": "cell code", "diff"}``)."""
    if step.saved is None and base.saved is None:
        return []
    out: list[dict] = []
    if step.code != base.code and step.code is not None and base.code is not None:
        out.append({"name": "cell code", "diff": _code_diff(base.code, step.code)})
    mine, theirs = step.variables or {}, base.variables or {}
    for name in sorted(set(mine) | set(theirs)):
        if name not in mine or name not in theirs:
            out.append({"name": name, "path": name, "old": show_value(theirs[name]) if name in theirs else "<absent>",
                        "new": show_value(mine[name]) if name in mine else "<absent>"})
            continue
        for path, old, new in changes(theirs[name], mine[name], name):
            out.append({"name": name, "path": path, "old": old, "new": new})
    return out


@functools.lru_cache(maxsize=64)
def _code_diff(old: str, new: str) -> str:
    """The unified diff of two cell sources (the same pair recurs on every step after a fork: made once)."""
    return "\n".join(difflib.unified_diff(old.splitlines(), new.splitlines(), "baseline", "this", lineterm="", n=1))


def _cell(step: Step, base: Step | None) -> dict:
    cell = {"label": step.label, "prompt": step.prompt, "note": step.note, "tokens": step.tokens, "usd": step.usd,
            "latency_s": step.latency_s, "code": step.code}
    for name in ("tokens", "usd", "latency_s"):
        mine, theirs = cell[name], getattr(base, name) if base is not None else None
        cell[f"d_{name}"] = None if mine is None or theirs is None else round(mine - theirs, 9)
    return cell


def step_text(value: Any) -> str:
    """A step's value as text for people and for ``word_diff``: text as is, token ids joined, the rest as JSON."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        return " ".join(map(str, value))
    return json.dumps(value, ensure_ascii=False, sort_keys=True, default=repr)


def word_diff(old: str, new: str) -> list[tuple[str, str]]:
    """``new`` against ``old`` word by word: ``[("=", text), ("-", removed), ("+", added), ...]``."""
    if old == new:
        return [("=", new)] if new else []
    a, b = _TOKENS.findall(old), _TOKENS.findall(new)
    if len(a) > MAX_DIFF_TOKENS or len(b) > MAX_DIFF_TOKENS:
        return [op for op in (("-", old), ("+", new)) if op[1]]
    out: list[tuple[str, str]] = []
    matcher = difflib.SequenceMatcher(None, a, b, autojunk=False)
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag == "equal":
            _push(out, "=", "".join(a[i1:i2]))
            continue
        if tag in ("delete", "replace"):
            _push(out, "-", "".join(a[i1:i2]))
        if tag in ("insert", "replace"):
            _push(out, "+", "".join(b[j1:j2]))
    return out


def _push(out: list[tuple[str, str]], op: str, text: str) -> None:
    if out and out[-1][0] == op:
        out[-1] = (op, out[-1][1] + text)
    elif text:
        out.append((op, text))


def _sum(values: Any) -> float | int | None:
    total: float | int = 0
    for value in values:
        if value is None:
            return None
        total += value
    return round(total, 9) if isinstance(total, float) else total

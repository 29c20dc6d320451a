"""One short line per journal event, for people: the ``summary`` column of ``RunView.journal_df()``.

A new event type gets its line here; an unknown or odd event falls back to its own fields.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from ..calls.pricing import usd_text

__all__ = ["describe"]


def _cut(text: str, width: int = 80) -> str:
    text = text.replace("\n", " ")
    return text if len(text) <= width else text[: width - 3] + "..."


def _compact(value: Any, width: int = 80) -> str:
    try:
        text = json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    except (TypeError, ValueError):
        text = repr(value)
    return _cut(text, width)


def _describe_settled(e: dict) -> str:
    call = e.get("call")
    if type(call) is not dict:
        call = {}
    usage = call.get("usage")
    if type(usage) is not dict:
        usage = {}
    usd = call.get("estimated_usd")
    price = usd_text(usd) if usd is None or isinstance(usd, (int, float)) else f"${usd}"
    return (f"{call.get('call_id')} settled: {usage.get('prompt_tokens', 0)}+{usage.get('completion_tokens', 0)} "
            f"tokens, {price}")


def _describe_tool_settled(e: dict) -> str:
    how = " (settled by hand)" if e.get("settled_by") else ""
    if "error" in e:
        return f"{e.get('call_id')} error: {_cut(str(e['error']), 60)}{how}"
    return f"{e.get('call_id')} -> {_compact(e.get('result'), 60)}{how}"


def _describe_waypoint(e: dict) -> str:
    note = str(e.get("note", "")).strip().splitlines()
    extra = "" if "state" in e else " (note only)"
    loop = f" [loop {e['loop']}]" if "loop" in e else ""
    return f"waypoint {e.get('n')}{loop}: {_cut(note[0] if note else '', 70)}{extra}"


def _describe_started(e: dict) -> str:
    if e.get("imported_from"):
        return f"imported from {e['imported_from']}"
    origin = e.get("forked_from")
    fork = f", forked from {origin.get('run_id')}" if isinstance(origin, dict) else ""
    return f"run {e.get('run_id')} started (pid {e.get('pid')} on {e.get('host')}){fork}"


_SUMMARIES: dict[str, Callable[[dict], str]] = {
    "run_started": _describe_started,
    "attempt": lambda e: f"attempt {e.get('attempt')} (pid {e.get('pid')} on {e.get('host')})",
    "waypoint": _describe_waypoint,
    "progress": lambda e: f"loop {e.get('loop', 0)}: {e.get('done')} done, {_cut(str(e.get('note', '')), 60)}",
    "iterate_done": lambda e: f"loop {e.get('loop', 0)} finished: {e.get('count')} items",
    "call_started": lambda e: f"{e.get('call_id')} -> {e.get('kind', 'model')} {e.get('model')} ({e.get('provider')})",
    "call_settled": _describe_settled,
    "call_failed": lambda e: f"{e.get('call_id')} failed: {e.get('code')}: {_cut(str(e.get('message')), 60)}",
    "replayed": lambda e: "answered from the journal: " + _cut(", ".join(map(str, e.get("calls") or ())), 70),
    "tool_intent": lambda e: f"{e.get('call_id')} -> tool {e.get('tool')} ({e.get('effect')}) {_compact(e.get('args'), 50)}",
    "tool_settled": _describe_tool_settled,
    "turn": lambda e: f"turn: {len(e.get('messages') or ())} message(s)",
    "run_completed": lambda e: "completed: " + (_compact(e["result"], 70) if "result" in e else str(e.get("result_repr"))),
    "run_failed": lambda e: f"failed: {e.get('code')}: {_cut(str(e.get('message')), 70)}",
    "interrupted": lambda e: "interrupted" + (f": {_cut(str(e['message']), 70)}" if e.get("message") else ""),
    "restarted": lambda e: "restarted: a fresh start in the same run",
    "checkpoint_committed": lambda e: (f"checkpoint {str(e.get('checkpoint_id'))[:12]} step {e.get('step')} "
                                       f"({e.get('steps_done')}/{e.get('steps')} steps, {e.get('kind')})"),
    "forked": lambda e: (  # caravanserai.fork (a journal position) or a CheckpointLog fork (a checkpoint)
        f"forked from run {e['parent_run']} at waypoint {e.get('at_waypoint')} (its event {e.get('parent_seq')})"
        + (", state edited" if e.get("edited") else "") if "at_waypoint" in e else
        f"forked {str(e.get('source'))[:12]} at {e.get('node_id')} -> "
        + (f"run {e['new_run_id']}" if e.get("new_run_id") else
           f"run {e['parent_run']} forked into this run" if e.get("parent_run") else
           str(e.get("checkpoint_id"))[:12])),
}
_ENVELOPE = ("v", "seq", "at", "type", "prev")


def describe(event: dict) -> str:
    """One short line a person reads in a journal table."""
    describe = _SUMMARIES.get(event["type"])
    if describe is not None:
        try:
            return describe(event)
        except (AttributeError, KeyError, TypeError, ValueError):
            pass  # an odd event from an old or foreign writer: fall back to its fields
    return _compact({k: v for k, v in event.items() if k not in _ENVELOPE}, 120)

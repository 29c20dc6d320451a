"""The read model's schema: what ``RunView`` holds about a run's attempts, waypoints, calls, loops and
forks (frozen dataclasses), and how a notebook waypoint's saved variables read as data
(``saved_value``) and for people (``show_value``). Documented in ``docs/read-model.md``."""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import asdict, dataclass
from typing import Any

from .values import TAG, show

__all__ = ["AttemptView", "CallView", "CheckpointsView", "CopiedView", "ForkView", "LoopView", "ParentView",
           "ToolCallView", "WaypointView", "saved_value", "show_value"]


@dataclass(frozen=True)
class AttemptView:
    """One attempt of the run: the first process (``run_started``) or a resume (``attempt``).

    ``end``: ``completed`` / ``failed`` (``code``, ``message``) / ``interrupted`` (an
    ``interrupted`` event) / ``killed`` (a later attempt started with no end recorded) / ``open``
    (the last attempt, no end yet: still running, or killed and not resumed) / ``imported`` (the
    history of a caravanserai 0.2.0/0.1.x directory: how it ended was never recorded).
    """

    number: int
    seq: int
    started_at: str
    end: str
    ended_at: str | None
    last_event_at: str
    events: int
    code: str | None = None
    message: str | None = None
    pid: int | None = None
    host: str | None = None
    command: tuple[str, ...] | None = None
    kind: str = "started"  # "started" (the first), "resumed" (a later attempt) or "restarted" (--restart)


@dataclass(frozen=True)
class CopiedView:
    """A fork's copied prefix: the parent's waypoints ``first``–``last`` with the parent's times (not an attempt)."""

    parent: str
    first: int | None
    last: int | None
    seq_from: int
    seq_to: int
    started_at: str | None
    ended_at: str | None
    waypoints: int
    edited: tuple[str, ...] = ()
    code_changed: str | None = None


@dataclass(frozen=True)
class WaypointView:
    """A waypoint: its number, note and time; the state itself on demand (``RunView.state(n)``), and
    for a notebook run its saved variables (``RunView.variables``).

    ``attempt`` is 0 for a fork's copied prefix (``copied``); ``duration_s`` is the step's own
    work: from the previous waypoint of the same attempt, or the attempt's start (never across a
    kill or a fork); ``values_seq``: the journal seq of the event holding the variables in force
    (None: not a notebook waypoint); ``code``: the notebook cell's source in force.
    """

    n: int
    seq: int
    at: str
    note: str
    attempt: int
    loop: int | None
    has_state: bool
    imported: bool = False
    names: tuple[str, ...] = ()
    copied: bool = False
    duration_s: float | None = None
    values_seq: int | None = None
    code: str | None = None


@dataclass(frozen=True)
class CallView:
    """One journaled call, model or tool (``kind``), from its intent to its result.

    ``status``: ``settled`` (answered), ``failed`` (a server/tool error; a failed model call spent
    nothing) or ``pending`` (intent, no result: in flight, or cut by a kill — a pending model call
    may have been billed). ``paid``: a settled model call, billed once in ``attempt``;
    ``replayed_in``: later attempts that were answered from the journal instead of calling again.
    Tokens and ``usd`` are None unless it is a settled model call; ``usd`` is None when unpriced.
    """

    call_id: str
    kind: str
    path: str
    attempt: int
    status: str
    started_at: str
    settled_at: str | None
    duration_s: float | None
    seq: int
    settled_seq: int | None = None
    model: str | None = None
    provider: str | None = None
    tool: str | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cached_tokens: int | None = None
    total_tokens: int | None = None
    usd: float | None = None
    priced: bool = False
    paid: bool = False
    replayed_in: tuple[int, ...] = ()
    error: str | None = None

    @property
    def replayed(self) -> bool:
        return bool(self.replayed_in)


@dataclass(frozen=True)
class ToolCallView:
    """A journaled tool call and its declared effect.

    ``status``: ``settled`` (a result), ``error`` (the tool raised), ``uncertain`` (a ``write`` or
    ``external`` intent with no outcome: a resume stops with ToolEffectUncertain until it is
    settled by hand) or ``pending`` (a ``read``/``idempotent`` intent with no outcome: a resume
    re-drives it). ``drives``: intents journaled under this call id (2+ when re-driven).
    """

    call_id: str
    path: str
    tool: str
    effect: str
    args_sha256: str | None
    attempt: int
    status: str
    intent_at: str
    settled_at: str | None
    duration_s: float | None
    seq: int
    settled_seq: int | None = None
    drives: int = 1
    settled_by: str | None = None
    error: str | None = None
    replayed_in: tuple[int, ...] = ()


@dataclass(frozen=True)
class LoopView:
    """A ``resumable_iterate`` loop (index within an attempt; a resume continues the same index)."""

    loop: int
    done: int
    total: int | None
    finished: bool
    note: str
    updated_at: str


@dataclass(frozen=True)
class ForkView:
    """A fork made from this run's checkpoint log (``forked`` event); ``new_run_id`` None: inside this log."""

    seq: int
    at: str
    checkpoint_id: str | None
    source: str | None
    node_id: str | None
    new_run_id: str | None


@dataclass(frozen=True)
class ParentView:
    """Where a forked run came from (``run_started.forked_from``): a checkpoint, or a journal position."""

    run_id: str
    checkpoint_id: str | None = None
    seq: int | None = None


@dataclass(frozen=True)
class CheckpointsView:
    """The run's checkpoint log, as ``checkpoints.log_status`` reports it: steps, status and ``latest`` (its head)
    are the main line's; ``branches`` counts the forks made inside the log; ``checkpoints`` every commit.
    ``to_dict`` leaves ``branches`` out when there are none (the summaries of runs without one are unchanged)."""

    checkpoints: int
    steps: int | None
    steps_done: int | None
    status: str
    latest: str | None
    branches: int = 0

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        if not self.branches:
            del out["branches"]
        return out


_TYPE_NAME = re.compile(r"[A-Za-z_][\w.]{0,199}")


def saved_value(entry: Any) -> Any:
    """One saved variable as data: its typed JSON (new journals hold it as ``value``; older ones as
    JSON text in ``data``), or a stand-in naming the codec and digest for bytes (never decoded)."""
    if not isinstance(entry, dict):
        return {TAG: "damaged"}
    codec = entry.get("codec")
    if codec in ("json", "typed") and "value" in entry:
        return entry["value"]
    if codec in ("json", "typed") and isinstance(entry.get("data"), str):
        try:
            return json.loads(entry["data"])
        except ValueError:
            return {TAG: "damaged"}
    digest = entry.get("object")
    if not isinstance(digest, str) and isinstance(entry.get("data"), str):
        digest = hashlib.sha256(entry["data"].encode()).hexdigest()
    stand_in = {TAG: str(codec), "sha256": digest}
    kind = entry.get("type")  # a pickled value's class, recorded when saved: shown, never imported
    if isinstance(kind, str) and _TYPE_NAME.fullmatch(kind):
        stand_in["type"] = kind
    return stand_in


def show_value(value: Any, limit: int | None = 80) -> str:
    """A saved variable (``saved_value``) as people read it; a bytes stand-in as ``<pickled module.Class, not loaded>``."""
    if isinstance(value, dict) and set(value) == {TAG, "sha256", "type"} and value[TAG] == "pickle":
        return f"<pickled {value['type']}, not loaded>"
    if isinstance(value, dict) and set(value) == {TAG, "sha256"}:
        kind = {"pickle": "pickled value, not loaded", "parquet": "DataFrame (Parquet)", "ndarray": "NumPy array (.npy)",
                "dataframe": "DataFrame"}.get(str(value[TAG]), f"{value[TAG]} value")
        return f"<{kind} {str(value['sha256'])[:12]}>"
    return show(value, limit)

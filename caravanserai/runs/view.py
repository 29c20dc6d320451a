"""The read model: everything a person (or a panel) asks about a run, from ONE pass over its journal.

``inspect_run(run_id, store=None) -> RunView`` reads and verifies the journal once (``journal.decode``:
hash chain, sequence, version) and walks the events once: status, attempts and how each ended,
waypoints, journaled model and tool calls (timing, tokens, USD, replayed or paid), loops, forks,
parent, the checkpoint log's status and the receipt. Every money figure is revalidated with the
ledger's own checks (``calls.ledger.record_from_event``): a tampered figure raises
``JournalCorruptionError``, as ``caravanserai show`` and ``verify`` do. ``RunView.journal_df()`` and
``calls_df()`` give pandas DataFrames (pandas is imported inside them, never at import time).

The CLI (``list``, ``show``, ``resume``, ``verify``), the ``%caravanserai`` magic and the panels all
read runs through this module, so a new event type is taught here, once. The schema is stable and
documented in ``docs/read-model.md``.

Times are the journal's strings (UTC ISO-8601); after a ``restarted`` event, ``status``, ``latest``,
``loops`` and ``state(n)`` count from the restart (history stays listed); an unpriced call has
``usd=None``, never 0; the checkpoint status follows ``checkpoints.log_status`` (a higher layer).
"""

from __future__ import annotations

import gc
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from functools import cached_property
from typing import Any

from .._html import bundle, escape, table
from ..calls.ledger import CallRecord, Receipt, ResumeInfo, calls_text, record_from_event
from ..events import ENDINGS, Segments
from ..stores import Store, open_store
from .api import readable_run_id
from .event_text import describe
from .lifecycle import require_events
from .view_schema import (
    AttemptView,
    CallView,
    CheckpointsView,
    CopiedView,
    ForkView,
    LoopView,
    ParentView,
    ToolCallView,
    WaypointView,
    saved_value,
    show_value,
)

__all__ = ["AttemptView", "CallView", "CheckpointsView", "CopiedView", "ForkView", "LoopView", "ParentView", "RunView",
           "ToolCallView", "WaypointView", "follow_pass", "inspect_run"]

ATTEMPT_ENDS = ("completed", "failed", "interrupted", "killed", "open", "imported")
_DEFAULT_LOOP_NOTE = re.compile(r"processed item \d+/(\d+)")
JOURNAL_COLUMNS = (("seq", "Int64"), ("at", "datetime64[ns, UTC]"), ("type", "string"), ("attempt", "Int64"),
                   ("call_id", "string"), ("summary", "string"))
CALLS_COLUMNS = (("call_id", "string"), ("kind", "string"), ("path", "string"), ("model", "string"),
                 ("provider", "string"), ("tool", "string"), ("attempt", "Int64"), ("status", "string"),
                 ("started_at", "datetime64[ns, UTC]"), ("settled_at", "datetime64[ns, UTC]"), ("duration_s", "float64"),
                 ("prompt_tokens", "Int64"), ("completion_tokens", "Int64"), ("cached_tokens", "Int64"),
                 ("total_tokens", "Int64"), ("usd", "float64"), ("priced", "bool"), ("paid", "bool"),
                 ("replayed", "bool"), ("replayed_in", "string"), ("error", "string"), ("seq", "Int64"))


@dataclass(frozen=True, eq=False)
class RunView:
    """Everything about one run, read in one pass. Build with ``inspect_run`` or ``RunView.from_events``."""

    run_id: str
    status: str
    started_at: str | None
    updated_at: str | None
    events: int
    attempts: tuple[AttemptView, ...]
    waypoints: tuple[WaypointView, ...]
    latest: WaypointView | None
    calls: tuple[CallView, ...]
    tools: tuple[ToolCallView, ...]
    loops: Mapping[int, LoopView]
    forks: tuple[ForkView, ...]
    parent: ParentView | None
    checkpoints: CheckpointsView | None
    receipt: Receipt
    summary: Mapping[str, Any]
    result: Any = None
    agent_id: str | None = None
    imported_from: str | None = None
    command: tuple[str, ...] | None = None
    cwd: str | None = None
    commit_seqs: tuple[int, ...] = ()  # journal seqs of the DurableAgent checkpoint commits
    replays: tuple[tuple[int, int, str], ...] = ()  # (seq, attempt, call_id): a settled call answered from the journal
    copied: CopiedView | None = None  # a fork's copied prefix (the parent's work, not an attempt)
    _events: Sequence[dict] = field(default=(), repr=False)
    _states: Mapping[int, int] = field(default_factory=dict, repr=False)

    @classmethod
    def from_events(cls, run_id: str, events: Sequence[dict]) -> RunView:
        """The view of verified events already in hand (``read_events``, a panel's live copy)."""
        with gc_paused():
            return _Pass(run_id).feed(events).view()

    # ---- on demand -------------------------------------------------------------------------
    def state(self, n: int | WaypointView | None = None) -> Any:
        """The state of waypoint ``n`` (default: the latest with a state), or of a WaypointView.

        Numbers count from the last ``--restart``; KeyError when there is no such waypoint or it
        holds no state (a loop waypoint next to a checkpoint() state, an older imported one).
        """
        if isinstance(n, WaypointView):
            event = self._events[n.seq]
        elif n is None:
            if self.latest is None:
                raise KeyError(f"run {self.run_id!r} has no waypoint with a state")
            event = self._events[self.latest.seq]
        else:
            index = self._states.get(n)
            if index is None:
                raise KeyError(f"run {self.run_id!r} has no waypoint {n!r}")
            event = self._events[index]
        if "state" not in event:
            raise KeyError(f"waypoint {event.get('n')} of run {self.run_id!r} holds no state (a note only)")
        return event["state"]

    def variables(self, n: int | WaypointView | None = None) -> dict[str, Any]:
        """The notebook variables saved at waypoint ``n`` (default: the latest), name -> value as
        data: the typed JSON the cell saved (``values.show`` renders it), or for a value saved as
        bytes (Parquet, ``.npy``, pickle) a ``{"$t": codec, "sha256": ...}`` stand-in, never loaded.
        Empty for a waypoint of a run that saves no variables."""
        saved = self.saved_entries(n)
        return {} if saved is None else {name: saved_value(entry) for name, entry in saved.items()}

    def saved_entries(self, n: int | WaypointView | None = None) -> dict[str, Any] | None:
        """The saved-variable entries of waypoint ``n`` as the journal holds them (``variables`` reads
        them as data); None when it saved none. Do not modify them."""
        waypoint = self._waypoint(n)
        if waypoint is None or waypoint.values_seq is None:
            return None
        names = self._events[waypoint.values_seq].get("names")
        saved = names.get("values") if isinstance(names, dict) else None
        return saved if isinstance(saved, dict) else None

    def variables_shown(self, n: int | WaypointView | None = None, limit: int | None = 80) -> dict[str, str]:
        """``variables(n)`` as people read them (``{0: 0, 1: 1}``, ``{1, 2}``), each cut to ``limit`` characters."""
        return {name: show_value(value, limit) for name, value in self.variables(n).items()}

    def _waypoint(self, n: int | WaypointView | None) -> WaypointView | None:
        if isinstance(n, WaypointView):
            return n
        if n is None:
            return self.waypoints[-1] if self.waypoints else None
        index = self._states.get(n)
        return None if index is None else self._by_seq.get(index)

    @cached_property
    def _by_seq(self) -> dict[int, WaypointView]:
        return {w.seq: w for w in self.waypoints}

    def event(self, seq: int) -> dict:
        """The journal event at ``seq`` (a call's response, a tool's arguments...). Do not modify it."""
        return self._events[seq]

    @cached_property
    def _calls_by_id(self) -> dict[str, CallView]:
        return {c.call_id: c for c in self.calls}

    def call(self, call_id: str) -> CallView | None:
        """The call (model or tool) with this id, or None."""
        return self._calls_by_id.get(call_id)

    def raw_events(self) -> Sequence[dict]:
        """The verified events this view was built from (do not modify them)."""
        return self._events

    @property
    def own_attempts(self) -> int:
        """Attempts run by this caravanserai (an imported 0.2.0 history is not one)."""
        return sum(1 for a in self.attempts if a.end != "imported")

    # ---- rich display (Jupyter, GitHub, a terminal) ------------------------------------------
    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, str]:
        ends = ", ".join(f"{a.number}: {a.end}" for a in self.attempts)
        latest = self.latest
        note = (latest.note.splitlines() or [""])[0] if latest else ""
        lines = [f"run {self.run_id}: {self.status}; {len(self.attempts)} attempt(s) ({ends})",
                 f"{len(self.waypoints)} waypoint(s)" + (f"; latest {latest.n}: {note}" if latest else ""),
                 f"receipt: {self.receipt_text()}",
                 f"open it: caravanserai.widgets.show({self.run_id!r}) or %caravanserai show {self.run_id}"]
        attempts = table(("attempt", "started", "ended", "how", "events"),
                         ((a.number, a.started_at, a.ended_at or "", a.end + (f": {a.message}" if a.message else ""), a.events)
                          for a in self.attempts), caption=f"run {self.run_id}: {self.status}")
        waypoints = table(("waypoint", "time", "note"), ((w.n, w.at, w.note) for w in self.waypoints[-10:]),
                          caption=f"the last {min(10, len(self.waypoints))} of {len(self.waypoints)} waypoint(s)")
        return bundle("\n".join(lines), attempts + waypoints + f"<div>receipt: {escape(self.receipt_text())}</div>")

    # ---- the CLI's summary (``caravanserai show/list --json``) ------------------------------
    def as_summary(self) -> dict[str, Any]:
        """The dict ``caravanserai show --json`` prints (the shape earlier releases printed)."""
        latest = self.latest
        return {
            "run_id": self.run_id, "status": self.status, "attempts": len(self.attempts),
            "waypoints": self.waypoints[-1].n if self.waypoints else 0,
            "latest": None if latest is None else {"n": latest.n, "note": latest.note, "state": self.state(latest),
                                                   "at": latest.at},
            "items_done": {loop: view.done for loop, view in self.loops.items()},
            "checkpoints": None if self.checkpoints is None else self.checkpoints.to_dict(),
            "started_at": self.started_at, "updated_at": self.updated_at,
            "command": None if self.command is None else list(self.command), "cwd": self.cwd,
            "imported_from": self.imported_from, "events": self.events, "receipt": self.receipt.to_dict(),
            "summary": dict(self.summary),
        }

    def call_counts(self) -> dict[str, int]:
        """Its calls as ``show``, the Runs panel and receipts count them (``calls.ledger.calls_text``):
        ``model_calls`` answered (the receipt's), ``tool_calls`` answered, ``unanswered_calls`` (failed or
        pending); a replay is the same call again, not a new one."""
        model = sum(1 for c in self.calls if c.kind != "tool" and c.status == "settled")
        tool = sum(1 for c in self.calls if c.kind == "tool" and c.status == "settled")
        return {"model_calls": model, "tool_calls": tool, "unanswered_calls": len(self.calls) - model - tool}

    def calls_text(self) -> str:
        """``3 calls (2 model, 1 tool)``, ``2 model calls``, ``no calls``."""
        counts = self.call_counts()
        return calls_text(counts["model_calls"], counts["tool_calls"], counts["unanswered_calls"])

    def receipt_text(self) -> str:
        """``show``'s receipt line: its calls (``calls_text``), tokens and inferred USD (``calls.pricing.usd_text``)."""
        receipt = self.receipt
        return f"{self.calls_text()}, {receipt.tokens} tokens, {receipt.usd_text()} ({receipt.label})"

    def as_row(self) -> dict[str, Any]:
        """The Runs panel's row and a run panel's header (also kept in the run index).

        ``calls`` counts every journaled call once (model and tool, settled or not), split in
        ``call_counts()`` and said in ``calls_text``; ``error`` is a failed run's ``code: message``."""
        receipt, checkpoints = self.receipt, self.checkpoints
        failed = next((a for a in reversed(self.attempts) if a.end == "failed"), None) if self.status == "failed" else None
        return {"run_id": self.run_id, "status": self.status, "attempts": len(self.attempts),
                "waypoints": len(self.waypoints), "calls": len(self.calls), **self.call_counts(),
                "calls_text": self.calls_text(), "tokens": receipt.tokens,
                "usd": receipt.estimated_usd, "unpriced": receipt.unpriced, "usd_text": receipt.usd_text(),
                "error": None if failed is None else f"{failed.code}: {failed.message}",
                "replayed": sum(len(c.replayed_in) for c in self.calls), "events": self.events,
                "parent": self.parent.run_id if self.parent else None, "updated_at": self.updated_at,
                "steps": checkpoints.steps if checkpoints else None,
                "steps_done": checkpoints.steps_done if checkpoints else None}

    # ---- DataFrames (pandas imported here only) ---------------------------------------------
    def journal_df(self) -> Any:
        """One row per event: seq, at, type, attempt, call_id, summary (see docs/read-model.md)."""
        import numpy as np
        import pandas as pd

        events = self._events
        with gc_paused():
            seq = np.fromiter((e["seq"] for e in events), dtype=np.int64, count=len(events))
            starts = np.fromiter((a.seq for a in self.attempts), dtype=np.int64, count=len(self.attempts))
            attempt = np.searchsorted(starts, seq, side="right")
            attempts = pd.array(attempt, dtype="Int64")
            attempts[attempt == 0] = pd.NA  # before any run_started (not written by caravanserai)
            call_ids = [e.get("call_id") if "call_id" in e else _settled_id(e) for e in events]
            return pd.DataFrame({
                "seq": pd.array(seq, dtype="Int64"), "at": _times(pd, [e["at"] for e in events]),
                "type": pd.array([e["type"] for e in events], dtype="string"), "attempt": attempts,
                "call_id": pd.array(call_ids, dtype="string"),
                "summary": pd.array([describe(e) for e in events], dtype="string"),
            })

    def calls_df(self) -> Any:
        """One row per journaled call (model and tool), the CallView fields (see docs/read-model.md)."""
        import pandas as pd

        calls = self.calls
        data: dict[str, Any] = {}
        for name, dtype in CALLS_COLUMNS:
            values = [getattr(c, name) for c in calls]
            if dtype == "datetime64[ns, UTC]":
                data[name] = _times(pd, values)
            elif name == "replayed_in":
                data[name] = pd.array([", ".join(map(str, v)) or None for v in values], dtype=dtype)
            elif dtype == "float64":
                data[name] = pd.array([float("nan") if v is None else v for v in values], dtype=dtype)
            else:
                data[name] = pd.array(values, dtype=dtype)
        return pd.DataFrame(data)


def follow_pass(run_id: str) -> _Pass:
    """A pass that can be extended as events arrive (``runs.follow.Follower``); ``view()`` any time."""
    return _Pass(run_id)


def inspect_run(run_id: str, store: Store | str | None = None) -> RunView:
    """Read ``run_id``'s journal once (verified) and return its ``RunView``.

    ``store``: a Store, URL or path (default ``$CARAVANSERAI_STORE`` or ``./.caravanserai``).
    Raises RunNotFound when the run has no journal, JournalCorruptionError when a line or a
    journaled figure fails verification, InvalidRunId for an id that names no run.
    """
    resolved = open_store(store)
    run_id = readable_run_id(run_id, resolved)
    with gc_paused():
        return RunView.from_events(run_id, require_events(run_id, resolved))


# ---- the one pass --------------------------------------------------------------------------------
class _Pass:
    """Walks the events once, keeping what the view needs; ``view()`` freezes it."""

    def __init__(self, run_id: str) -> None:
        self.run_id = run_id
        self.events: Sequence[dict] = ()
        self.attempts: list[dict] = []  # {"index", "event", "end", "end_event"}
        self.attempt = 0
        self.waypoints: list[WaypointView] = []
        self.latest: WaypointView | None = None  # the latest waypoint with state since the last restart
        self.states: dict[int, int] = {}  # waypoint n -> index, since the last restart
        self.calls: dict[str, dict] = {}  # call id -> builder (model calls)
        self.tools: dict[str, dict] = {}  # call id -> builder (tool calls)
        self.order: list[tuple[str, str]] = []  # (kind, call id) in intent order
        self.replays: dict[str, list[int]] = {}
        self.records: list[CallRecord] = []
        self.unsettled_models: set[str] = set()  # call_started with no settlement/failure (the ledger's `started`)
        self.settled_since_boundary = False
        self.loops: dict[int, dict] = {}
        self.forks: list[ForkView] = []
        self.committed = 0
        self.commit_seqs: list[int] = []
        self.replay_rows: list[tuple[int, int, str]] = []
        self.newest_commit: dict | None = None
        self.commit_steps: int | None = None
        self.completed: dict | None = None  # first run_completed since the last restart
        self.failed: dict | None = None  # a run_failed not followed by an attempt (since the last restart)
        self.first_completed: dict | None = None  # as run_summary: anywhere in the journal
        self.last_fail_or_attempt: dict | None = None
        self.markers: dict[str, dict] = {}
        self.segments = Segments()  # attempts, a fork's copied prefix, the identity (cell source) in force
        self.segment_at: str | None = None  # when the current attempt (or copied parent attempt) began
        self.values_seq: int | None = None  # index of the last event that saved notebook variables
        self.copy: dict | None = None  # a fork's copied prefix: {"parent", "from", "to", "started_at", ...}
        self.handlers: dict[str, Callable[[int, dict], None]] = {
            "waypoint": self.on_waypoint, "progress": self.on_progress, "iterate_done": self.on_iterate_done,
            "call_started": self.on_call_started, "call_settled": self.on_call_settled,
            "call_failed": self.on_call_failed, "tool_intent": self.on_tool_intent, "tool_settled": self.on_tool_settled,
            "replayed": self.on_replayed, "turn": self.on_turn, "run_started": self.on_attempt,
            "attempt": self.on_attempt, "run_completed": self.on_end, "run_failed": self.on_end,
            "interrupted": self.on_end, "restarted": self.on_restarted, "cell_edited": self.on_cell_edited,
            "checkpoint_committed": self.on_checkpoint, "forked": self.on_forked,
            "cancel_requested": self.on_marker, "sleep": self.on_marker,
        }

    def feed(self, events: Sequence[dict]) -> _Pass:
        return self.extend(events, len(events))

    def extend(self, events: Sequence[dict], new: int) -> _Pass:
        """Walk the last ``new`` of ``events`` (the ones before were walked already): a follower's step."""
        self.events = events
        handlers = self.handlers
        with gc_paused():
            for index in range(len(events) - new, len(events)):
                event = events[index]
                handler = handlers.get(event["type"])
                if handler is not None:
                    handler(index, event)
        return self

    # ---- attempts and endings -----------------------------------------------------------------
    def on_attempt(self, index: int, event: dict) -> None:
        began = self.segments.feed(event)
        self.segment_at = self.segments.started_at
        if began == "copy":
            origin = event["forked_from"]
            self.copy = {"parent": origin["run_id"], "from": index, "started_at": self.segment_at}
            return
        if began != "attempt":
            return  # one of the parent's attempts, inside a fork's copied prefix
        self.attempt = self.segments.number
        self.attempts.append({"index": index, "event": event, "end": None, "end_event": None, "restarted": False})
        if event["type"] == "attempt":
            self.failed = None
            self.last_fail_or_attempt = event

    def on_end(self, index: int, event: dict) -> None:  # run_completed, run_failed, interrupted
        if self.segments.copying:
            return  # how one of the parent's attempts ended
        self._saved(index, event)
        kind = ENDINGS[event["type"]]
        if self.attempts and self.attempts[-1]["end"] is None:
            self.attempts[-1]["end"], self.attempts[-1]["end_event"] = kind, event
        if kind == "completed":
            self.completed = self.completed or event
            self.first_completed = self.first_completed or event
        elif kind == "failed":
            self.failed = self.last_fail_or_attempt = event

    def on_restarted(self, index: int, event: dict) -> None:
        self.segments.feed(event)
        if self.attempts and not self.segments.copying:
            self.attempts[-1]["restarted"] = True
        self.values_seq = None
        self.completed = self.failed = None
        self.latest, self.states, self.loops = None, {}, {}

    def on_cell_edited(self, index: int, event: dict) -> None:  # a fork's cell edited: the code in force changes
        self.segments.feed(event)
        if self.copy is not None and isinstance(event.get("code_changed"), str):
            self.copy["code_changed"] = event["code_changed"]

    def on_marker(self, index: int, event: dict) -> None:  # cancel_requested, sleep: the last one counts
        self.markers[event["type"]] = event

    # ---- waypoints and loops ------------------------------------------------------------------
    def _saved(self, index: int, event: dict) -> None:
        """Note an event that saved notebook variables (a waypoint, loop progress, the cell's end)."""
        names = event.get("names")
        if isinstance(names, dict) and isinstance(names.get("values"), dict):
            self.values_seq = index

    def on_waypoint(self, index: int, event: dict) -> None:
        n = event.get("n", 0)
        self._saved(index, event)
        values = self.events[self.values_seq]["names"]["values"] if self.values_seq is not None else None
        at = event["at"]
        copying = self.segments.copying
        waypoint = WaypointView(n, index, at, event.get("note", ""), 0 if copying else self.attempt, event.get("loop"),
                                "state" in event, bool(event.get("imported")),
                                tuple(sorted(values)) if isinstance(values, dict) else (), copying,
                                _step_seconds(self.segment_at, at), self.values_seq,
                                _str(self.segments.identity.get("cell_source")))
        self.segment_at = at
        self.waypoints.append(waypoint)
        self.states[n] = index
        if waypoint.has_state:
            self.latest = waypoint
        self.settled_since_boundary = False

    def on_turn(self, index: int, event: dict) -> None:  # a boundary: older calls are no longer replayable
        self.settled_since_boundary = False

    def on_progress(self, index: int, event: dict) -> None:
        self._saved(index, event)
        loop = self.loops.setdefault(event.get("loop", 0), {"total": None, "finished": False})
        loop["done"], loop["note"], loop["at"] = event.get("done", 0), event.get("note", ""), event["at"]

    def on_iterate_done(self, index: int, event: dict) -> None:
        loop = self.loops.setdefault(event.get("loop", 0), {"done": 0, "note": "", "total": None})
        loop["finished"], loop["total"], loop["at"] = True, event.get("count"), event["at"]

    # ---- journaled calls ----------------------------------------------------------------------
    def on_call_started(self, index: int, event: dict) -> None:
        call_id = str(event.get("call_id"))
        self.calls[call_id] = {"index": index, "event": event, "attempt": self.attempt, "end": None, "record": None}
        self.order.append(("model", call_id))
        self.unsettled_models.add(call_id)

    def on_call_settled(self, index: int, event: dict) -> None:
        record = record_from_event(self.run_id, event, self.attempt)  # revalidates every figure
        self.records.append(record)
        call_id = record.call_id
        self.unsettled_models.discard(call_id)
        self.settled_since_boundary = True
        call = self.calls.get(call_id)
        if call is None:  # a settlement whose intent this journal lacks: list it from the settlement
            call = self.calls[call_id] = {"index": index, "event": event, "attempt": self.attempt, "end": None}
            self.order.append(("model", call_id))
        if call["end"] is None:
            call["end"], call["end_index"], call["record"] = event, index, record

    def on_call_failed(self, index: int, event: dict) -> None:
        call_id = str(event.get("call_id"))
        self.unsettled_models.discard(call_id)
        call = self.calls.get(call_id)
        if call is not None and call["end"] is None:
            call["end"], call["end_index"], call["record"] = event, index, None

    def on_tool_intent(self, index: int, event: dict) -> None:
        call_id = str(event.get("call_id"))
        tool = self.tools.get(call_id)
        if tool is None:
            self.tools[call_id] = {"index": index, "event": event, "attempt": self.attempt, "end": None, "drives": 1}
            self.order.append(("tool", call_id))
        else:
            tool["drives"] += 1
            if tool["end"] is not None and "error" in tool["end"]:
                tool["end"] = None  # re-driven after an error: the new outcome counts

    def on_tool_settled(self, index: int, event: dict) -> None:
        self.settled_since_boundary = True
        tool = self.tools.get(str(event.get("call_id")))
        if tool is not None:
            tool["end"], tool["end_index"] = event, index

    def on_replayed(self, index: int, event: dict) -> None:
        for call_id in event.get("calls") or ():
            self.replays.setdefault(str(call_id), []).append(self.attempt)
            self.replay_rows.append((index, self.attempt, str(call_id)))

    # ---- checkpoints and forks ----------------------------------------------------------------
    def on_checkpoint(self, index: int, event: dict) -> None:
        """A commit: ``newest_commit`` is the head of the main line (``checkpoints.log_status``: commits not on
        a branch forked inside this log; a fork into a new run is that run's main line)."""
        self.committed += 1
        self.commit_seqs.append(index)
        # this run's commit ids, those on in-log branches, the branch count (kept here: built on first use)
        line = self.__dict__.setdefault("_checkpoint_line", {"seen": set(), "off_main": set(), "branches": 0})
        cid, parent = (value if isinstance(value, str) else None for value in (event.get("checkpoint_id"), event.get("parent")))
        branch_root = isinstance(event.get("fork"), dict) and parent is not None and parent in line["seen"]
        line["branches"] += branch_root
        if branch_root or (parent is not None and parent in line["off_main"]):
            line["off_main"].add(cid)
        else:
            self.newest_commit = event
        line["seen"].add(cid)
        if _is_count(event.get("steps")):
            self.commit_steps = event["steps"]

    def on_forked(self, index: int, event: dict) -> None:
        if "parent_run" in event:  # a birth record: this run's own (ends its copied prefix), or its parent's, copied
            if self.segments.feed(event) == "forked" and self.copy is not None:
                self.segment_at = self.segments.started_at
                edited = event.get("edited")
                self.copy.update(to=index, marker=event, edited=tuple(map(str, edited)) if isinstance(edited, list) else ())
            return
        self.forks.append(ForkView(index, event["at"], _str(event.get("checkpoint_id")), _str(event.get("source")),
                                   _str(event.get("node_id")), _str(event.get("new_run_id"))))

    # ---- freezing -----------------------------------------------------------------------------
    def view(self) -> RunView:
        with gc_paused():  # many small objects, all acyclic: collections would only cost time
            return self._view()

    def _view(self) -> RunView:
        events = self.events
        started = events[0] if events else {}
        attempts = self.attempt_views()
        receipt = self.receipt()
        checkpoints = self.checkpoint_status()
        status = self.status(started, checkpoints)
        origin = started.get("forked_from")
        parent = None
        if isinstance(origin, dict) and isinstance(origin.get("run_id"), str):
            parent = ParentView(origin["run_id"], _str(origin.get("checkpoint_id")),
                                origin["seq"] if _is_count(origin.get("seq")) else None)
        command = started.get("command")
        tools = self.tool_views()
        return RunView(
            run_id=self.run_id, status=status, started_at=started.get("at"),
            updated_at=events[-1]["at"] if events else None, events=len(events), attempts=attempts,
            waypoints=tuple(self.waypoints), latest=self.latest,
            calls=self.call_views(tools), tools=tuple(tools.values()), loops=self.loop_views(), forks=tuple(self.forks),
            parent=parent, checkpoints=checkpoints, receipt=receipt, summary=self.summary(started, receipt),
            result=None if self.completed is None else self.completed.get("result"),
            agent_id=started.get("agent_id"), imported_from=started.get("imported_from"),
            command=tuple(map(str, command)) if isinstance(command, list) else None, cwd=started.get("cwd"),
            commit_seqs=tuple(self.commit_seqs), replays=tuple(self.replay_rows), copied=self.copied_view(),
            _events=events, _states=dict(self.states),
        )

    def status(self, started: dict, checkpoints: CheckpointsView | None) -> str:
        if not self.events:
            return "missing"
        if self.completed is not None:
            return "completed"
        if self.failed is not None:
            return "failed"
        if started.get("imported_from") and len(self.attempts) == 1:
            return "unknown"  # 0.2.0 never recorded whether a run finished
        if checkpoints is not None:
            return checkpoints.status  # a DurableAgent run: done when its newest checkpoint ran every step
        return "pending"

    def attempt_views(self) -> tuple[AttemptView, ...]:
        events, views = self.events, []
        for number, attempt in enumerate(self.attempts, start=1):
            start = attempt["index"]
            stop = self.attempts[number]["index"] if number < len(self.attempts) else len(events)
            event, end_event = attempt["event"], attempt["end_event"]
            end = attempt["end"]
            if end is None:
                end = "imported" if event.get("imported_from") else "killed" if number < len(self.attempts) else "open"
            command = event.get("command")
            views.append(AttemptView(
                number, start, event["at"], end, None if end_event is None else end_event["at"], events[stop - 1]["at"],
                stop - start,
                code=_str(end_event.get("code")) if end_event else None,
                message=_str(end_event.get("message")) if end_event else None,
                pid=event.get("pid") if _is_count(event.get("pid")) else None, host=_str(event.get("host")),
                command=tuple(map(str, command)) if isinstance(command, list) else None,
                kind="restarted" if attempt["restarted"] else "started" if number == 1 else "resumed"))
        return tuple(views)

    def copied_view(self) -> CopiedView | None:
        copy = self.copy
        if copy is None:
            return None
        stop = copy.get("to", len(self.events))
        copied = [w for w in self.waypoints if w.copied]
        marker = copy.get("marker") or {}
        code = copy.get("code_changed") or marker.get("code_changed")
        return CopiedView(copy["parent"], copied[0].n if copied else None, copied[-1].n if copied else None, copy["from"],
                          stop, copy["started_at"], copied[-1].at if copied else None, len(copied), copy.get("edited", ()),
                          _str(code))

    def call_views(self, tools: Mapping[str, ToolCallView]) -> tuple[CallView, ...]:
        out = []
        for kind, call_id in self.order:
            replayed = tuple(self.replays.get(call_id, ()))
            if kind == "tool":
                t = tools[call_id]
                status = {"settled": "settled", "error": "failed"}.get(t.status, "pending")
                out.append(CallView(call_id, "tool", t.path, t.attempt, status, t.intent_at, t.settled_at, t.duration_s,
                                    t.seq, t.settled_seq, tool=t.tool, replayed_in=replayed, error=t.error))
                continue
            call = self.calls[call_id]
            intent, end, record = call["event"], call["end"], call.get("record")
            status = "pending" if end is None else "settled" if record is not None else "failed"
            fields: dict[str, Any] = {}
            if record is not None:
                fields = {"prompt_tokens": record.prompt_tokens, "completion_tokens": record.completion_tokens,
                          "cached_tokens": record.cached_tokens, "total_tokens": record.total_tokens,
                          "usd": record.estimated_usd, "priced": record.priced, "paid": True}
            elif end is not None:
                fields["error"] = f"{end.get('code')}: {end.get('message')}"
            model = record.model if record is not None else _str(intent.get("model"))
            provider = record.provider if record is not None else _str(intent.get("provider"))
            out.append(CallView(
                call_id, str(intent.get("kind") or "model"), str(intent.get("path", "")), call["attempt"], status,
                intent["at"], None if end is None else end["at"], _duration(intent, end), call["index"],
                None if end is None else call["end_index"], model=model, provider=provider, replayed_in=replayed,
                **fields))
        return tuple(out)

    def tool_views(self) -> dict[str, ToolCallView]:
        out = {}
        for call_id, tool in self.tools.items():
            intent, end = tool["event"], tool["end"]
            effect = str(intent.get("effect", "read"))
            if end is None:
                status = "uncertain" if effect in ("write", "external") else "pending"
            else:
                status = "error" if "error" in end else "settled"
            out[call_id] = ToolCallView(
                call_id, str(intent.get("path", "")), str(intent.get("tool", "")), effect,
                _str(intent.get("args_sha256")), tool["attempt"], status, intent["at"],
                None if end is None else end["at"], _duration(intent, end), tool["index"],
                None if end is None else tool["end_index"], tool["drives"],
                None if end is None else _str(end.get("settled_by")),
                None if end is None else _str(end.get("error")), tuple(self.replays.get(call_id, ())))
        return out

    def loop_views(self) -> dict[int, LoopView]:
        out = {}
        for index, loop in sorted(self.loops.items(), key=lambda item: (not isinstance(item[0], int), str(item[0]).zfill(20))):
            total = loop.get("total")
            if total is None:
                match = _DEFAULT_LOOP_NOTE.fullmatch(str(loop.get("note", "")))
                total = int(match.group(1)) if match else None
            out[index] = LoopView(index, loop.get("done", 0), total, bool(loop.get("finished")), str(loop.get("note", "")),
                                  loop.get("at", ""))
        return out

    def checkpoint_status(self) -> CheckpointsView | None:
        newest = self.newest_commit
        if newest is None:
            return None
        steps = newest["steps"] if _is_count(newest.get("steps")) else self.commit_steps
        done = newest.get("steps_done")
        if not _is_count(done):
            done = newest["step"] + 1 if _is_count(newest.get("step")) else None
        latest = newest.get("checkpoint_id")
        status = "completed" if steps is not None and done is not None and done >= steps > 0 else "pending"
        return CheckpointsView(self.committed, steps, done, status, latest if isinstance(latest, str) else None,
                               self.__dict__.get("_checkpoint_line", {}).get("branches", 0))

    def receipt(self) -> Receipt:
        """The ledger's receipt (every settled call, revalidated) with the resume facts of the next attempt."""
        records = list(self.records)
        resume = None
        if len(self.attempts) > 1:
            resume = ResumeInfo(
                attempts=len(self.attempts), prior_calls=len(records),
                prior_estimated_usd=round(sum(r.estimated_usd or 0.0 for r in records), 10),
                prior_tokens=sum(r.total_tokens for r in records), prior_unpriced=any(not r.priced for r in records),
                possible_double_count_calls=len(self.unsettled_models),
                discarded_partial_turn=self.settled_since_boundary)
        return Receipt(records, resume)

    def summary(self, started: dict, receipt: Receipt) -> dict[str, Any]:
        """What ``run_summary(events)`` returns, from this pass."""
        if not self.events:
            return {"status": "missing"}
        base = {"run_id": started.get("run_id", ""), "agent_id": started.get("agent_id"), "attempts": len(self.attempts),
                "started_at": started.get("at")}
        done = self.first_completed
        if done is not None:
            return {"status": "completed", **base, "result": done.get("result"), "completed_at": done.get("at")}
        last = self.last_fail_or_attempt
        if last is not None and last["type"] == "run_failed":
            return {"status": "failed", **base, "code": last.get("code"), "message": last.get("message"),
                    "receipt": receipt.to_dict()}
        summary = {"status": "pending", **base, "input": started.get("input")}
        if "cancel_requested" in self.markers:
            summary["cancel_requested"] = True
        sleep = self.markers.get("sleep")
        if sleep is not None:
            summary["wake_at"], summary["sleep_reason"] = sleep.get("wake_at"), sleep.get("reason")
        return summary


# ---- helpers -------------------------------------------------------------------------------------
@contextmanager
def gc_paused() -> Iterator[None]:
    """No cyclic GC while a journal's (acyclic) events and views are built: with 100,000 events
    alive, collections triggered by the allocations cost as much as the reading itself."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _is_count(value: Any) -> bool:
    return type(value) is int and value >= 0


def _str(value: Any) -> str | None:
    return None if value is None else str(value)


def _duration(start: dict, end: dict | None) -> float | None:
    """Seconds from ``start`` to ``end`` (their ``at``); None when unknown."""
    return None if end is None else _between(start.get("at"), end.get("at"))


def _between(a: Any, b: Any) -> float | None:
    """Seconds from time ``a`` to time ``b`` (journal strings); None when unknown."""
    if type(a) is str and type(b) is str and len(a) == len(b) == 32 and a[:10] == b[:10] and a[26:] == b[26:] == "+00:00":
        try:  # the journal's own form, same day: from the clock fields (parsing two datetimes costs 10x more)
            return round(_clock(b) - _clock(a), 6)
        except ValueError:
            pass
    try:
        return (datetime.fromisoformat(str(b)) - datetime.fromisoformat(str(a))).total_seconds()
    except (TypeError, ValueError):
        return None


def _step_seconds(start: str | None, end: str) -> float | None:
    """A step's own seconds, from the start of its segment (or the previous waypoint) to ``end``; never negative."""
    seconds = None if start is None else _between(start, end)
    return None if seconds is None else max(0.0, seconds)


def _clock(at: str) -> float:
    """Seconds since midnight of ``YYYY-MM-DDTHH:MM:SS.ffffff+00:00``."""
    return int(at[11:13]) * 3600 + int(at[14:16]) * 60 + int(at[17:19]) + int(at[20:26]) / 1e6


def _times(pd: Any, values: list) -> Any:
    """ISO-8601 strings (None: NaT) as a ``datetime64[ns, UTC]`` column, parsed in one vectorised call."""
    return pd.to_datetime(pd.Series(values, dtype="object"), utc=True, format="ISO8601").dt.as_unit("ns")


def _settled_id(event: dict) -> str | None:
    call = event.get("call")
    return call.get("call_id") if type(call) is dict else None

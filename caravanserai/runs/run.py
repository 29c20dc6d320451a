"""A run opened for writing: its lease, its journal tail and what it has recorded so far.

A ``Run`` is the one journal writer of a run in this process (``runs.lifecycle`` opens it through
a registry and ``durable()`` scopes it), so ``checkpoint()`` in a loop costs one append each and no
re-read of the journal; the store's lease keeps other processes out.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from .. import journal
from .._html import bundle, escape, json_block, table
from .._version import __version__
from ..calls import journaled
from ..calls.ledger import Ledger
from ..errors import CaravanseraiError, RunClosed
from ..events import BOUNDARIES, Segments
from ..journal import to_json
from ..stores import Store
from ..stores.base import Lease
from .bookkeeping import LoopBook, NotebookHooks
from .interrupts import interrupts_deferred
from .trust import launch_payload, sign_item

__all__ = ["Run", "Waypoint", "launch_info"]


@dataclass(frozen=True)
class Waypoint:
    """A checkpoint a person can read: number, note, the exact state, and when."""

    n: int
    note: str
    state: Any
    at: str
    has_state: bool = True

    @classmethod
    def from_event(cls, event: dict) -> Waypoint:
        return cls(event["n"], event.get("note", ""), event.get("state"), event["at"], "state" in event)

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, str]:
        state = json.dumps(self.state, ensure_ascii=False) if self.has_state else "(a note only)"
        body = (f'<div style="font-weight:600">waypoint {self.n} <span style="font-weight:normal;color:#59636e">'
                f"{escape(self.at)}</span></div>"
                f'<div style="white-space:pre-wrap;margin:2px 0">{escape(self.note)}</div>'
                + (json_block(self.state) if self.has_state else ""))
        return bundle(f"waypoint {self.n} ({self.at})\n\n{self.note}\n\nstate: {state}", body)


def launch_info(*, sign: bool = True) -> dict[str, Any]:
    """How this process was started, so ``caravanserai resume`` can replay it faithfully (``sign=False``:
    without ``launch_signed``, which loading the signing key makes the slow part)."""
    info: dict[str, Any] = {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "cwd": os.getcwd(),
        "command": [sys.executable, *sys.argv],
        "orig_argv": [sys.executable, *getattr(sys, "orig_argv", [sys.executable, *sys.argv])[1:]],
        "python": sys.version.split()[0],
        "caravanserai": __version__,
    }
    if not sign:
        return info
    signed = sign_item("command", "launch", launch_payload(info))  # resume runs it without asking only if trusted
    return info if signed is None else {**info, "launch_signed": signed}


class _SignWhenWritten:
    """The place of an attempt's ``launch_signed`` until it is written (never JSON: it cannot reach a line)."""


_SIGN_WHEN_WRITTEN = _SignWhenWritten()


def _sign_launch(event: dict) -> None:
    """Sign the launch of an attempt's first event as it is written, not when the run opens: loading the
    signing key takes ~15 ms, which a run opened and never written (a finished run re-run) never pays."""
    if event.get("launch_signed") is _SIGN_WHEN_WRITTEN:
        signed = sign_item("command", "launch", launch_payload(event))
        if signed is None:
            del event["launch_signed"]
        else:
            event["launch_signed"] = signed


_INDEXED = frozenset({"run_started", "attempt", "waypoint", "progress", "run_completed", "run_failed", "restarted",
                      "forked"})
#: A writer keeps the events it appends (next to those it opened) while its journal is at most this
#: long, so the end of an attempt hands the whole journal to the run index without reading it back.
HELD_EVENTS_MAX = 5000


class Run:
    """A run this process writes. Use ``durable()``; construct directly only in tests.

    ``attempt=False`` opens it for bookkeeping that is not an attempt of the run (settling a tool
    call by hand, recording a checkpoint event): no ``attempt`` event is written, and a new run
    starts with ``run_started`` carrying ``started`` fields.
    """

    def __init__(self, run_id: str, store: Store, lease: Lease, events: Sequence[dict], tail: journal.Tail, *,
                 attempt: bool = True, started: dict | None = None) -> None:
        self.run_id = run_id
        self.store = store
        self._lease = lease
        self._tail = tail
        self.lock = threading.RLock()
        self.opened_events: Sequence[dict] = events  # the journal as it stood when this writer opened it
        self.on_close: Callable[[Run], None] | None = None  # after the lease is released
        self.before_release: Callable[[Run], None] | None = None  # at close, while the lease is still held
        self._appended: list[dict] | None = [] if len(events) <= HELD_EVENTS_MAX else None
        self._closed = False
        self._started = bool(events)
        self.segments = Segments()  # attempts so far (a fork's copied prefix is not one of them)
        self._last_waypoint: dict | None = None
        self._waypoint_count = 0
        self._last_n = 0  # number of the last waypoint, with or without state
        self._user_state = False  # a checkpoint() state exists: loop waypoints then leave state alone
        self._completed: dict | None = None
        self._completed_now = False
        self.loops = LoopBook()  # resumable_iterate's progress over this run, and its loops running now
        self.notebook = NotebookHooks()  # a %%resumable cell's variables and status line
        self._first: dict | None = events[0] if events else None
        index = self._index
        for event in events:
            if event["type"] in _INDEXED:
                index(event)
        self.ledger = Ledger(run_id, events, segments=self.segments)  # feeds self.segments the journal
        self.attempt = self.ledger.attempt
        self._header: list[dict] = [self._attempt_event(events, started)] if attempt or not events else []
        self.replayed: list[str] = []  # calls answered from the journal, recorded with the next append
        self.http_journal = True  # False: model requests over httpx/httpx2 are not journaled (durable(http_journal=False))
        self._proxy: Any = None

    # ---- reading -------------------------------------------------------------------------
    @property
    def started_event(self) -> dict | None:
        """The ``run_started`` event with the identity in force now (a restart or a fork's cell replaces it)."""
        return None if self._first is None else {**self._first, **self.segments.identity}

    @property
    def events(self) -> list[dict]:
        """Every event of the run, verified, read back from the store."""
        return journal.decode(self.run_id, self.store.load(self.run_id))[0]

    def held_events(self) -> list[dict] | None:
        """The whole journal as this writer holds it, without reading the store: the events it
        opened, then the ones it appended (as a reader decodes them). None when the journal is
        longer than ``HELD_EVENTS_MAX`` (not kept) or the lease is gone (others may have appended)."""
        with self.lock:
            if self._appended is None or not self._lease.held:
                return None
            return [*self.opened_events, *self._appended]

    def journal_length(self) -> int:
        """Lines in the journal as this writer knows it (what the next append's seq will be)."""
        return self._lease.next_seq

    @property
    def waypoints(self) -> list[Waypoint]:
        return [Waypoint.from_event(e) for e in self.events if e["type"] == "waypoint"]

    @property
    def latest(self) -> Waypoint | None:
        return Waypoint.from_event(self._last_waypoint) if self._last_waypoint else None

    @property
    def state(self) -> Any:
        """The state of the last waypoint (None before the first checkpoint)."""
        return self._last_waypoint.get("state") if self._last_waypoint else None

    @property
    def completed(self) -> bool:
        return self._completed is not None

    @property
    def completed_event(self) -> dict | None:
        """The ``run_completed`` event of the current attempt chain, if the run is complete."""
        return self._completed

    @property
    def attempt_written(self) -> bool:
        """Whether this attempt has written to the journal (its ``attempt`` event goes with the first append)."""
        return not self._header

    @property
    def waypoint_count(self) -> int:
        return self._waypoint_count

    @property
    def result(self) -> Any:
        return self._completed.get("result") if self._completed else None

    # ---- writing -------------------------------------------------------------------------
    def append(self, *events: dict, sync: bool = True) -> list[dict]:
        """Append events (type + fields) durably; returns them as stored (with v/seq/at/prev).

        ``sync=False`` defers durability to the next synced append (for records whose loss a
        crash makes harmless, such as a ``read`` tool's intent).
        """
        with self.lock:
            if self._closed:
                raise RunClosed(f"run {self.run_id!r} is closed; open it again with durable()", run_id=self.run_id)
            capture = self.notebook.capture
            if capture is not None:
                commits = [i for i, e in enumerate(events) if e["type"] in ("waypoint", "progress")]
                names = capture() if commits else None  # a notebook cell's variables go with its commits
                if names:  # once per append, on its last commit event (None: not this one)
                    events = tuple({**e, "names": names} if i == commits[-1] else e for i, e in enumerate(events))
            pending: Sequence[dict] = events
            if self._header or self.replayed:
                if self._header:
                    _sign_launch(self._header[0])
                replays = [{"type": "replayed", "calls": self.replayed}] if self.replayed else []
                pending = [*self._header, *replays, *events]
            lines, encoded, stored, tail = journal.encode_stored(pending, self._tail, sign=self.store.journal_signer)
            # a Ctrl-C between the write and the writer's record of it (seq, waypoint count, index) would
            # make the next append reuse them: it is delivered when all of this is done
            with interrupts_deferred():
                self._lease.renew()
                self.store.append(self.run_id, lines, lease=self._lease, seq=self._tail.seq, sync=sync)
                self._tail = tail
                if pending is not events:
                    self._header, self.replayed = [], []
                self._started = True
                for event in stored:
                    etype = event["type"]
                    self.segments.feed(event)
                    if etype in _INDEXED or "names" in event:  # what _index keeps; journaled calls are the ledger's
                        self._index(event)
                    if etype in BOUNDARIES:
                        self.ledger.boundary()
                if self._first is None:
                    self._first = stored[0]
                if self._appended is not None:
                    self._appended.extend(stored)
                    if len(self.opened_events) + len(self._appended) > HELD_EVENTS_MAX:
                        self._appended = None  # too long to keep: whoever needs the journal reads it
                self.store.committed(self.run_id, encoded)  # in order: views never go backwards
        if self.notebook.listeners:
            for listener in list(self.notebook.listeners):
                try:
                    listener(stored)
                except Exception:
                    pass  # a display problem must never break a durable append
        return stored[len(pending) - len(events):]

    def checkpoint(self, state: Any, note: Any = "") -> int:
        """Commit ``state`` and ``note`` together as the next waypoint; returns its number."""
        encoded = state if isinstance(state, journal.RawJSON) else journal.RawJSON(to_json(state), state)
        with self.lock:
            event = self.waypoint_event(encoded, note)
            claimed = self.loops.claim_inflight()
            self.append(*claimed, event)
            return event["n"]

    def waypoint_event(self, state: Any, note: Any) -> dict:
        """The next waypoint's event (not yet appended); call with the run's lock held."""
        return {"type": "waypoint", "n": self._last_n + 1, "note": str(note), "state": state}

    def loop_waypoint_event(self, loop: int, done: int, note: str) -> dict:
        """The waypoint a ``resumable_iterate`` commit leaves for people and 0.2.0 readers.

        As 0.2.0: note ``processed item i/N``, state ``{"_i": i}`` — unless the run holds a
        ``checkpoint()`` state, which a loop never overwrites (0.2.0 did); then the waypoint is a
        note only. Call with the run's lock held.
        """
        event: dict[str, Any] = {"type": "waypoint", "n": self._last_n + 1, "note": str(note), "loop": loop}
        if not self._user_state:
            event["state"] = {"_i": done}
        return event

    def complete(self, result: Any = None, *, names: dict | None = None) -> None:
        """Record that the run finished (``result`` kept if it is JSON); once per attempt."""
        if self._completed_now:
            return
        event: dict[str, Any] = {"type": "run_completed"}
        if names is not None:
            event["names"] = names
        try:
            event["result"] = journal.RawJSON(to_json(result, what="result"), result)
        except CaravanseraiError:
            event["result_repr"] = repr(result)[:200]
        self.append(event)
        self._completed_now = True

    def fail(self, error: BaseException) -> None:
        """Record that this attempt ended with ``error``; a later attempt may resume the run."""
        info = error.to_dict() if isinstance(error, CaravanseraiError) else {
            "code": type(error).__name__, "message": str(error)[:2000]}
        self.append({"type": "run_failed", **info})

    def describe(self, **fields: Any) -> None:
        """Add identity fields (agent, definition, input, budget...) to this run's ``run_started``.

        Only before the run's first event; a resumed run's identity was fixed when it started.
        """
        if self._header and self._header[0]["type"] == "run_started":
            self._header[0].update(fields)

    # ---- journaled calls -------------------------------------------------------------------
    def call_model(self, model: Any, messages: list[dict], *, path: str = "run", tools: list[dict] | None = None,
                   **params: Any) -> Any:
        """Ask ``model`` through the journal: replayed on resume, metered, refused over budget."""
        return journaled.model_call(self, model, messages, path=path, tools=tools, **params)

    def call_tool(self, fn: Any, args: dict | None = None, *, name: str | None = None, effect: str | None = None,
                  path: str = "run") -> Any:
        """Run a tool through the journal by its declared effect (read, idempotent, write, external)."""
        name = name or getattr(fn, "name", None) or fn.__name__
        declared = effect if effect else getattr(fn, "effect", "read")  # tool_call checks it is one of EFFECTS
        target = getattr(fn, "fn", fn)
        return journaled.tool_call(self, target, dict(args or {}), name=name, path=f"{path}/{name}", effect=declared)

    def receipt(self):
        """What this run has spent, all attempts together (a ``Receipt``)."""
        return self.ledger.receipt()

    def note_replayed(self, call_id: str) -> None:
        """A settled call was answered from the journal; a ``replayed`` event records it (batched)."""
        self.replayed.append(call_id)

    def interrupted(self) -> None:
        """Record that this attempt was interrupted (Ctrl-C, Kernel > Interrupt); the run stays pending."""
        self.append({"type": "interrupted"})

    def proxy_url(self, upstream: str) -> str:
        """A loopback base URL standing for ``upstream`` whose model requests this run journals.

        For clients that are not Python on httpx: ``dspy.LM(..., api_base=run.proxy_url(URL))``,
        ``ANTHROPIC_BASE_URL=run.proxy_url("https://api.anthropic.com")`` for the Claude Agent SDK.
        Served from this process until the run closes.
        """
        with self.lock:
            if self._proxy is None:
                from ..calls.http_proxy import HttpProxy

                self._proxy = HttpProxy(self)
            return str(self._proxy.url_for(upstream))

    def close(self) -> None:
        with self.lock:
            if self._proxy is not None:
                self._proxy.close()
                self._proxy = None
            if not self._closed:
                if self.replayed and self._lease.held:
                    try:
                        self.append()  # the replays not yet recorded, with nothing else to carry them
                    except Exception:
                        pass  # a replay record is for people: losing it loses no work
                self._closed = True
                try:
                    if self.before_release is not None:
                        self.before_release(self)  # the journal cannot change under it: the lease is held
                finally:
                    self._lease.release()
                if self.on_close is not None:
                    self.on_close(self)

    # ---- internals -----------------------------------------------------------------------
    def _attempt_event(self, events: Sequence[dict], started: dict | None) -> dict:
        """The attempt's first event, stamped now: it is written with the first append, but the
        attempt began when the run was opened (a first step's duration counts from here)."""
        info = {"at": journal.utc_now(), **launch_info(sign=False), "launch_signed": _SIGN_WHEN_WRITTEN}
        if not events:
            return {"type": "run_started", "run_id": self.run_id, **info, **(started or {})}
        return {"type": "attempt", "attempt": self.attempt, **info}

    def _index(self, event: dict) -> None:
        etype = event["type"]
        if "names" in event:
            self.notebook.on_saved(event)
        if etype == "restarted":  # a fresh start inside the same run: history stays, state does not
            self._last_waypoint = None
            self._last_n, self._user_state = 0, False
            self.loops.reset()
            self.notebook.reset()
            self._completed = None
            return
        if etype == "waypoint":
            self._waypoint_count += 1
            if isinstance(event.get("n"), int):
                self._last_n = event["n"]
            if "state" in event:
                self._last_waypoint = event
                state = event["state"]
                if "loop" in event:
                    pass  # our own loop's trail: its progress events are the truth
                elif isinstance(state, dict) and set(state) == {"_i"} and isinstance(state["_i"], int):
                    self.loops.legacy_offset = state["_i"]  # 0.2.0's resumable_iterate progress
                else:
                    self._user_state = True
        elif etype == "progress":
            self.loops.on_progress(event)
        elif etype == "run_completed":
            self._completed = event
        elif etype in ("attempt", "run_failed"):
            self._completed = None

    def __repr__(self) -> str:
        return f"<Run {self.run_id!r} attempt {self.attempt} in {self.store.url}>"

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, str]:
        latest = self.latest
        lines = [f"run {self.run_id} (attempt {self.attempt}, {'completed' if self.completed else 'open'}) in {self.store.url}",
                 f"{self._waypoint_count} waypoint(s)" + (f"; latest {latest.n}: {latest.note}" if latest else ""),
                 f"receipt: {self.receipt().summary()}"]
        rows = [("attempt", self.attempt), ("store", self.store.url), ("waypoints", self._waypoint_count),
                ("latest note", latest.note if latest else ""), ("receipt", self.receipt().summary())]
        return bundle("\n".join(lines), table(("run", self.run_id), rows))

"""A run opened for writing: its lease, its journal tail and what it has recorded so far.

``durable(run_id)`` is the context manager every higher layer builds on (the 0.2.0 functions,
``resumable_iterate``, the notebook magic). Within one process a run has exactly one ``Run``
writer, shared through a registry, so ``checkpoint()`` in a loop costs one append each and no
re-read of the journal; the store's lease keeps other processes out.
"""

from __future__ import annotations

import atexit
import contextvars
import os
import socket
import sys
import threading
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Iterator, Sequence

from . import journal
from ._version import __version__
from .errors import CaravanseraiError, RunNotFound
from .identity import check_identity
from .ids import validate_run_id
from .ledger import BOUNDARIES, Ledger
from .serialization import to_json
from .stores import Store, open_store
from .stores.base import Lease

__all__ = ["Run", "Waypoint", "current_run", "durable", "open_run", "read_events"]


@dataclass(frozen=True)
class Waypoint:
    """A checkpoint a person can read: number, note, the exact state, and when."""

    n: int
    note: str
    state: Any
    at: str
    has_state: bool = True

    @classmethod
    def from_event(cls, event: dict) -> "Waypoint":
        return cls(event["n"], event.get("note", ""), event.get("state"), event["at"], "state" in event)


def launch_info() -> dict[str, Any]:
    """How this process was started, so ``caravanserai resume`` can replay it faithfully."""
    return {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "cwd": os.getcwd(),
        "command": [sys.executable, *sys.argv],
        "orig_argv": [sys.executable, *getattr(sys, "orig_argv", [sys.executable, *sys.argv])[1:]],
        "python": sys.version.split()[0],
        "caravanserai": __version__,
    }


_IDENTITY = frozenset({"agent_id", "definition_sha256", "input", "budget_sha256", "session_id", "conversation_sha256",
                       "cell_source"})
_INDEXED = frozenset({"run_started", "attempt", "waypoint", "progress", "run_completed", "run_failed", "restarted"})


class Run:
    """A run this process writes. Use ``durable()``; construct directly only in tests."""

    def __init__(self, run_id: str, store: Store, lease: Lease, events: Sequence[dict], tail: journal.Tail) -> None:
        self.run_id = run_id
        self.store = store
        self._lease = lease
        self._tail = tail
        self._lock = threading.RLock()
        self._closed = False
        self._started = bool(events)
        self.attempt = 1
        self._last_waypoint: dict | None = None
        self._waypoint_count = 0
        self._last_n = 0  # number of the last waypoint, with or without state
        self._user_state = False  # a checkpoint() state exists: loop waypoints then leave state alone
        self._completed: dict | None = None
        self._completed_now = False
        self.progress: dict[int, list[str]] = {}  # loop -> fingerprints of done items, in order
        self.progress_done: dict[int, int] = {}  # loop -> items done, counting any imported from 0.2.0
        self.legacy_offset: int | None = None
        self.saved_names: dict = {}  # the variables saved with the last commit (notebook cells)
        self.saved_at: int | None = None
        self.started_event: dict | None = events[0] if events else None  # identity (updated by restarts)
        index = self._index
        for event in events:
            etype = event["type"]
            if etype in _INDEXED:
                if etype == "run_started" or etype == "attempt":
                    self.attempt += 1
                index(event)
        self._header: list[dict] = [self._attempt_event(events)]
        self._iterate_loops = 0
        self.capture: Any = None  # set by a notebook cell: returns the names to save with each commit
        self.announced: set[str] = set()  # variables already reported as saved with pickle
        self.listeners: list[Any] = []  # called with the stored events after each append (status lines, panels)
        self.active_loops: list[Any] = []  # resumable_iterate loops running over this run right now
        self.ledger = Ledger(run_id, events, self.attempt)

    # ---- reading -------------------------------------------------------------------------
    @property
    def events(self) -> list[dict]:
        """Every event of the run, verified, read back from the store."""
        return read_events(self.run_id, self.store)

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
    def result(self) -> Any:
        return self._completed.get("result") if self._completed else None

    # ---- writing -------------------------------------------------------------------------
    def append(self, *events: dict, sync: bool = True) -> list[dict]:
        """Append events (type + fields) durably; returns them as stored (with v/seq/at/prev).

        ``sync=False`` defers durability to the next synced append (for records whose loss a
        crash makes harmless, such as a ``read`` tool's intent).
        """
        with self._lock:
            if self._closed:
                raise CaravanseraiError(f"run {self.run_id!r} is closed; open it again with durable()", run_id=self.run_id)
            commits = [i for i, e in enumerate(events) if e["type"] in ("waypoint", "progress")]
            if self.capture is not None and commits:
                names = self.capture()  # a notebook cell's variables go with its commits (None: not this one)
                if names:  # once per append, on its last commit event
                    events = tuple({**e, "names": names} if i == commits[-1] else e for i, e in enumerate(events))
            pending = [*self._header, *events]
            lines, encoded, tail = journal.encode(pending, self._tail)
            self._lease.renew()
            self.store.append(self.run_id, lines, lease=self._lease, seq=self._tail.seq, sync=sync)
            self._tail = tail
            self._header = []
            self._started = True
            stored = [journal.plain(e) for e in encoded]
            for event in stored:
                self._index(event)
                if event["type"] in BOUNDARIES:
                    self.ledger.boundary()
            if self.started_event is None:
                self.started_event = stored[0]
            self.store.committed(self.run_id, encoded)  # in order: views never go backwards
        for listener in list(self.listeners):
            try:
                listener(stored)
            except Exception:
                pass  # a display problem must never break a durable append
        return stored[len(pending) - len(events):]

    def checkpoint(self, state: Any, note: Any = "") -> int:
        """Commit ``state`` and ``note`` together as the next waypoint; returns its number."""
        encoded = state if isinstance(state, journal.RawJSON) else journal.RawJSON(to_json(state), state)
        with self._lock:
            event = self.waypoint_event(encoded, note)
            claimed = [p for p in (loop.claim_inflight() for loop in self.active_loops) if p is not None]
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
        return _calls().model_call(self, model, messages, path=path, tools=tools, **params)

    def call_tool(self, fn: Any, args: dict | None = None, *, name: str | None = None, effect: str | None = None,
                  path: str = "run") -> Any:
        """Run a tool through the journal by its declared effect (read, idempotent, write, external)."""
        name = name or getattr(fn, "name", None) or fn.__name__
        effect = effect or getattr(fn, "effect", "read")
        target = getattr(fn, "fn", fn)
        return _calls().tool_call(self, target, dict(args or {}), name=name, path=f"{path}/{name}", effect=effect)

    def receipt(self):
        """What this run has spent, all attempts together (a ``Receipt``)."""
        return self.ledger.receipt()

    def next_iterate_loop(self) -> int:
        """Ordinal of the next ``resumable_iterate`` loop over this run in this attempt."""
        with self._lock:
            index = self._iterate_loops
            self._iterate_loops += 1
            return index

    def close(self) -> None:
        with self._lock:
            if not self._closed:
                self._closed = True
                self._lease.release()
                _REGISTRY.forget(self)

    # ---- internals -----------------------------------------------------------------------
    def _attempt_event(self, events: Sequence[dict]) -> dict:
        info = launch_info()
        if not events:
            return {"type": "run_started", "run_id": self.run_id, **info}
        return {"type": "attempt", "attempt": self.attempt, **info}

    def _index(self, event: dict) -> None:
        etype = event["type"]
        if "names" in event:
            self.saved_names = event["names"]
            self.saved_at = event.get("seq")
        if etype == "restarted":  # a fresh start inside the same run: history stays, state does not
            if self.started_event is not None:
                self.started_event = {**self.started_event, **{k: v for k, v in event.items() if k in _IDENTITY}}
            self._last_waypoint = None
            self._last_n, self._user_state = 0, False
            self.progress, self.progress_done, self.legacy_offset = {}, {}, None
            self.saved_names, self.saved_at = {}, None
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
                    self.legacy_offset = state["_i"]  # 0.2.0's resumable_iterate progress
                else:
                    self._user_state = True
        elif etype == "progress":
            loop = event.get("loop", 0)
            self.progress.setdefault(loop, []).extend(event.get("items", ()))
            self.progress_done[loop] = event.get("done", len(self.progress[loop]))
        elif etype == "run_completed":
            self._completed = event
        elif etype in ("attempt", "run_failed"):
            self._completed = None

    def __repr__(self) -> str:
        return f"<Run {self.run_id!r} attempt {self.attempt} in {self.store.url}>"


_CALLS: Any = None


def _calls() -> Any:
    global _CALLS
    if _CALLS is None:
        from . import calls  # imported late: calls imports this module

        _CALLS = calls
    return _CALLS


class _Registry:
    """The one writer per (store, run) in this process."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._runs: dict[tuple[str, str], Run] = {}

    def get(self, run_id: str, store: Store) -> Run | None:
        with self._lock:
            return self._runs.get((store.url, run_id))

    def open(self, run_id: str, store: Store) -> Run:
        with self._lock:
            run = self._runs.get((store.url, run_id))
            if run is not None:
                return run
            lease = store.acquire(run_id)
            try:
                events, tail = journal.decode(run_id, store.load_held(lease))
                run = Run(run_id, store, lease, events, tail)
                store.refresh_views(run_id, events, writer=True)  # finish views a killed writer left
            except BaseException:
                lease.release()
                raise
            self._runs[(store.url, run_id)] = run
            return run

    def forget(self, run: Run) -> None:
        with self._lock:
            if self._runs.get((run.store.url, run.run_id)) is run:
                del self._runs[(run.store.url, run.run_id)]

    def close_all(self) -> None:
        for run in list(self._runs.values()):
            try:
                run.close()
            except Exception:
                pass

    def reset_after_fork(self) -> None:
        # A forked child must not write through its parent's lease.
        self._lock = threading.Lock()
        self._runs = {}


_REGISTRY = _Registry()
atexit.register(_REGISTRY.close_all)
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_REGISTRY.reset_after_fork)

_CURRENT: contextvars.ContextVar[Run | None] = contextvars.ContextVar("caravanserai_current_run", default=None)


def current_run() -> Run | None:
    """The run of the innermost ``durable()`` block (or ``%%resumable`` cell), if any."""
    return _CURRENT.get()


def open_run(run_id: str, store: Store | str | None = None) -> Run:
    """The process's writer for ``run_id`` (opened and locked on first use)."""
    run_id = validate_run_id(run_id)
    return _REGISTRY.open(run_id, open_store(store))


def read_events(run_id: str, store: Store | str | None = None) -> list[dict]:
    """Verified events of a run, without taking its lock (a reader never blocks a writer)."""
    store = open_store(store)
    return journal.decode(run_id, store.load(run_id))[0]


def open_checked(run_id: str, store: Store | str | None, identity: dict[str, Any], budget: Any = None) -> tuple[Run, bool]:
    """Open (or join) the writer of ``run_id``, verifying its identity first; (run, owner)."""
    run_id = validate_run_id(run_id)
    resolved = open_store(store)
    owner = _REGISTRY.get(run_id, resolved) is None  # a nested block on the same run leaves it to the outer one
    run = _REGISTRY.open(run_id, resolved)
    try:
        check_identity(run_id, run.started_event, identity)
    except BaseException:
        if owner:
            run.close()  # identity before spend: nothing appended
        raise
    if owner:
        run.describe(**identity)
        run.ledger.set_budget(budget)
    return run, owner


def identity_fields(definition: Any = None, input: Any = None, budget: Any = None, session_id: str | None = None) -> tuple[dict, Any]:
    """The identity a caller asserts (only what it gave) and the parsed budget."""
    from .ledger import Budget, digest

    parsed = Budget.of(budget)
    identity: dict[str, Any] = {}
    if definition is not None:
        identity["definition_sha256"] = definition if _is_digest(definition) else digest(definition)
    if input is not None:
        identity["input"] = input
    if parsed is not None:
        identity["budget_sha256"] = parsed.digest()
    if session_id is not None:
        identity["session_id"] = session_id
    return identity, parsed


def _is_digest(value: Any) -> bool:
    return isinstance(value, str) and len(value) == 64 and all(c in "0123456789abcdef" for c in value)


@contextmanager
def durable(run_id: str, *, store: Store | str | None = None, definition: Any = None, input: Any = None,
            budget: Any = None, session_id: str | None = None, capture: Sequence[str] | None = None,
            namespace: dict | None = None) -> Iterator[Run]:
    """Run a block as one durable run: locked, journaled, completed on success.

    ``definition`` (any JSON, or its SHA-256), ``input``, ``budget`` (``{"usd", "tokens", "calls"}``)
    and ``session_id`` are the run's identity: a resume with different ones raises the matching
    IdentityMismatch before anything is spent or written. Journaled calls inside (``run.call_model``,
    ``run.call_tool``, a ``durable_client``) replay on resume. ``capture=["total", ...]`` saves
    those variables of ``namespace`` (default: the caller's globals, i.e. the notebook's) with every
    commit and puts them back when the block is entered again — what ``%%resumable`` does, without
    the magic. An exception records ``run_failed`` for this attempt and propagates;
    KeyboardInterrupt (Ctrl-C, Kernel > Interrupt) records nothing, so the run stays pending and
    resumable.
    """
    identity, parsed = identity_fields(definition, input, budget, session_id)
    run, owner = open_checked(run_id, store, identity, parsed)
    if owner:
        run._iterate_loops = 0
    if capture:
        from .namespace import Snapshotter

        target = namespace if namespace is not None else sys._getframe(2).f_globals
        snapshot = Snapshotter(target, capture, objects=run.store.objects, run_id=run.run_id, store_url=run.store.url,
                               strict=capture, trusted_store=run.store.private_to_user())
        if (run.saved_names or {}).get("values"):
            snapshot.restore(run.saved_names["values"])
        run.capture = lambda: _capture_announcing(run, snapshot)
    token = _CURRENT.set(run)
    try:
        yield run
    except KeyboardInterrupt:
        raise
    except BaseException as exc:
        if owner and not isinstance(exc, GeneratorExit):
            run.fail(exc)
        raise
    else:
        if owner:
            run.complete()
    finally:
        _CURRENT.reset(token)
        if capture:
            run.capture = None
        if owner:
            run.close()


def _capture_announcing(run: Run, snapshot: Any) -> dict:
    """The captured variables; a variable newly saved with pickle is named on stderr at once."""
    values = snapshot.capture()
    fresh = [name for name in snapshot.pickled if name not in run.announced]
    if fresh:
        run.announced.update(fresh)
        sys.stderr.write(f"[caravanserai] run {run.run_id!r}: saved with pickle (restorable only from a store you trust): "
                         f"{', '.join(fresh)}\n")
    return {"values": values, "at": None}


def require_events(run_id: str, store: Store | str | None = None) -> list[dict]:
    events = read_events(run_id, store)
    if not events:
        raise RunNotFound(f"no checkpoints for run {run_id!r} in {open_store(store).url}; check the id with `caravanserai list`", run_id=run_id)
    return events

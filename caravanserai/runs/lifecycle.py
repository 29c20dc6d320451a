"""The one run lifecycle: open (identity before spend) → current run → end of the attempt → close.

``RunScope`` is the lifecycle every entry point shares — ``durable()``, an agent's ``run()`` and a
``%%resumable`` cell: it opens (or joins) the process's one writer of the run, checks the caller's
identity before anything is spent, makes the run current, and at the end of the block records how
the attempt ended — success completes the run, an exception records ``run_failed``, an interrupt
(Ctrl-C, Kernel > Interrupt) leaves it pending — then closes it. The registry keeps exactly one
``Run`` per (store, run id) in this process; the store's lease keeps other processes out.
"""

from __future__ import annotations

import atexit
import contextvars
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, Literal

from .. import journal
from ..calls import http_journal as transport_journal
from ..calls.ledger import Budget
from ..errors import RunLocked, RunNotFound
from ..ids import validate_run_id
from ..stores import Store, open_store
from ..stores.base import describe_holder
from ..stores.urls import first_line
from .identity import check_identity
from .run import Run

__all__ = ["Registry", "RunScope", "append_event", "close_all", "current_run", "durable", "identity_fields", "open_checked",
           "open_run", "read_events", "registry", "require_events"]


class Registry:
    """The one writer per (store, run) in this process."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._runs: dict[tuple[tuple, str], Run] = {}

    def get(self, run_id: str, store: Store) -> Run | None:
        with self._lock:
            return self._runs.get((_key(store), run_id))

    def open(self, run_id: str, store: Store, *, attempt: bool = True, started: dict | None = None) -> Run:
        """The writer of ``run_id`` (taking the store's lease on first use); see ``Run`` for ``attempt``."""
        with self._lock:
            run = self._runs.get((_key(store), run_id))
            if run is not None:
                return run
            lease = store.acquire(run_id)
            try:
                events, tail = journal.decode(run_id, store.load_held(lease))
                run = Run(run_id, store, lease, events, tail, attempt=attempt, started=started)
                store.refresh_views(run_id, events, writer=True)  # finish views a killed writer left
            except BaseException:
                lease.release()
                raise
            run.on_close = self.forget
            if attempt:
                run.before_release = self._attempt_ending
            self._runs[(_key(store), run_id)] = run
            return run

    def forget(self, run: Run) -> None:
        with self._lock:
            if self._runs.get((_key(run.store), run.run_id)) is run:
                del self._runs[(_key(run.store), run.run_id)]

    def _attempt_ending(self, run: Run) -> None:
        """Tell ``attempt_end_hooks`` that ``run``'s attempt ends (closed, its lease not yet released)."""
        for hook in attempt_end_hooks:
            try:
                hook(run)
            except Exception:
                pass  # what hooks keep (the run index) is derived from the journal, which is already durable

    def close_all(self) -> None:
        """Close every run this process has open (at exit; tests simulating a new process)."""
        for run in list(self._runs.values()):
            try:
                run.close()
            except Exception:
                pass

    def reset_after_fork(self) -> None:
        # A forked child must not write through its parent's lease.
        self._lock = threading.Lock()
        self._runs = {}


#: Called with each run whose attempt is ending: closed to appends, its lease still held (so the
#: journal is the one ``run.held_events()`` gives, and cannot change meanwhile); released right
#: after. ``caravanserai.runs.index`` adds the one that refreshes the run's index entry.
attempt_end_hooks: list[Callable[[Run], None]] = []

registry = Registry()
_REGISTRY = registry  # the name earlier releases used
atexit.register(registry.close_all)
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=registry.reset_after_fork)

_CURRENT: contextvars.ContextVar[Run | None] = contextvars.ContextVar("caravanserai_current_run", default=None)


def close_all() -> None:
    """Close every run this process has open."""
    registry.close_all()


def current_run() -> Run | None:
    """The run of the innermost ``durable()`` block (or ``%%resumable`` cell), if any."""
    return _CURRENT.get()


def open_run(run_id: str, store: Store | str | None = None) -> Run:
    """The process's writer for ``run_id`` (opened and locked on first use)."""
    run_id = validate_run_id(run_id)
    return registry.open(run_id, open_store(store))


def read_events(run_id: str, store: Store | str | None = None) -> list[dict]:
    """Verified events of a run, without taking its lock (a reader never blocks a writer)."""
    resolved = open_store(store)
    return journal.decode(run_id, resolved.load(run_id))[0]


def require_events(run_id: str, store: Store | str | None = None) -> list[dict]:
    """``read_events``, or RunNotFound naming the store when the run has none."""
    events = read_events(run_id, store)
    if not events:
        raise RunNotFound.in_store(run_id, open_store(store).url)
    return events


def open_checked(run_id: str, store: Store | str | None, identity: dict[str, Any], budget: Any = None) -> tuple[Run, bool]:
    """Open (or join) the writer of ``run_id``, verifying its identity first; (run, owner)."""
    run_id = validate_run_id(run_id)
    resolved = open_store(store)
    owner = registry.get(run_id, resolved) is None  # a nested block on the same run leaves it to the outer one
    run = registry.open(run_id, resolved)
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


def identity_fields(definition: Any = None, input: Any = None, budget: Any = None,
                    session_id: str | None = None) -> tuple[dict, Any]:
    """The identity a caller asserts (only what it gave) and the parsed budget."""
    parsed = Budget.of(budget)
    identity: dict[str, Any] = {}
    if definition is not None:
        identity["definition_sha256"] = definition if _is_digest(definition) else journal.digest(definition)
    if input is not None:
        identity["input"] = input
    if parsed is not None:
        identity["budget_sha256"] = parsed.digest()
    if session_id is not None:
        identity["session_id"] = session_id
    return identity, parsed


def _is_digest(value: Any) -> bool:
    return isinstance(value, str) and len(value) == 64 and all(c in "0123456789abcdef" for c in value)


class RunScope:
    """One attempt of a run as a ``with`` block; the lifecycle ``durable()``, ``run()`` and cells share.

    Entering opens (or joins) the writer, checks ``identity`` (nothing appended on a mismatch) and
    makes the run current. Leaving: success completes the run with ``result``/``names`` (unless
    ``complete`` was set False, e.g. for a run that had completed before); KeyboardInterrupt records
    ``interrupted`` (the run stays pending and resumable); any other exception records ``run_failed``
    unless it is one of ``not_failures``. Only the outermost scope of a run (its ``owner``) ends it.
    """

    def __init__(self, run_id: str, store: Store | str | None = None, identity: dict[str, Any] | None = None,
                 budget: Any = None, *, not_failures: tuple[type[BaseException], ...] = ()) -> None:
        self.run_id, self.store, self.identity, self.budget = run_id, store, identity or {}, budget
        self.not_failures: tuple[type[BaseException], ...] = (GeneratorExit, *not_failures)
        self.result: Any = None
        self.names: dict | None = None
        self.complete = True
        self.ending = True  # False: leaving records nothing (setup failed before the body ran)
        self.run: Run | None = None
        self.owner = False
        self._token: Any = None

    def __enter__(self) -> Run:
        run, self.owner = open_checked(self.run_id, self.store, self.identity, self.budget)
        self.run = run
        if self.owner:
            run.loops.new_attempt()
        self._token = _CURRENT.set(run)
        self._http_token = transport_journal.bind(run)
        return run

    def __exit__(self, etype: Any, error: Any, tb: Any) -> Literal[False]:
        run = self.run
        assert run is not None
        try:
            if not self.owner or not self.ending:
                pass
            elif etype is None:
                if self.complete:
                    run.complete(self.result, names=self.names)
            elif issubclass(etype, KeyboardInterrupt):
                run.interrupted()  # the run stays pending: the next attempt resumes it
            elif not isinstance(error, self.not_failures):
                run.fail(error)
        except Exception as exc:
            if etype is None:
                raise
            _unrecorded(error, run, "its ending", exc)  # the block's own error is the one that propagates
        finally:
            transport_journal.unbind(self._http_token)
            _CURRENT.reset(self._token)
            if self.owner:
                try:
                    run.close()
                except Exception as exc:
                    if etype is None:
                        raise
                    _unrecorded(error, run, "the release of its lease", exc)
        return False


def _unrecorded(error: BaseException, run: Run, what: str, exc: Exception) -> None:
    """Say that recording ``what`` failed, without replacing ``error`` (the one propagating): on stderr,
    and as a note on the error where Python has them (3.11+)."""
    note = (f"[caravanserai] run {run.run_id!r}: {what} could not be recorded ({type(exc).__name__}: "
            f"{first_line(exc)}); the next attempt resumes from the last waypoint")
    sys.stderr.write(note + "\n")
    add_note = getattr(error, "add_note", None)
    if add_note is not None:
        add_note(note)


@contextmanager
def durable(run_id: str, *, store: Store | str | None = None, definition: Any = None, input: Any = None,
            budget: Any = None, session_id: str | None = None, capture: Sequence[str] | None = None,
            namespace: dict | None = None, http_journal: bool = True) -> Iterator[Run]:
    """Run a block as one durable run: locked, journaled, completed on success.

    ``definition`` (any JSON, or its SHA-256), ``input``, ``budget`` (``{"usd", "tokens", "calls"}``)
    and ``session_id`` are the run's identity: a resume with different ones raises the matching
    IdentityMismatch before anything is spent or written. Journaled calls inside (``run.call_model``,
    ``run.call_tool``, a ``durable_client``) replay on resume. ``capture=["total", ...]`` saves
    those variables of ``namespace`` (default: the caller's globals, i.e. the notebook's) with every
    commit and puts them back when the block is entered again — what ``%%resumable`` does, without
    the magic. Model requests made over httpx/httpx2 inside the block (any SDK or framework) are
    journaled at the transport; ``http_journal=False`` sends them unjournaled (paid again on resume).
    An exception records ``run_failed`` for this attempt and propagates;
    KeyboardInterrupt (Ctrl-C, Kernel > Interrupt) records ``interrupted`` and leaves the run
    pending and resumable. A completed run entered again says so on stderr (once per entry) and its
    block runs on the final state, its calls answered from the journal: nothing is recorded unless
    the block writes (a checkpoint, a new call), which makes it a new attempt.
    """
    identity, parsed = identity_fields(definition, input, budget, session_id)
    target = namespace if namespace is not None else sys._getframe(2).f_globals
    scope = RunScope(run_id, store, identity, parsed)
    with scope as run:
        again = scope.owner and run.completed  # re-entering a completed run (docs/durable-runs.md)
        if again:
            scope.complete = False
            sys.stderr.write(f"[caravanserai] run {run.run_id!r} completed earlier: the block runs again on its final state "
                             f"and records nothing unless it writes; to start over: caravanserai clean {run.run_id} "
                             "(or use a new run id)\n")
        run.http_journal = http_journal
        if capture:
            scope.ending = False  # a variable that cannot be restored ends nothing: nothing ran yet
            _restore_captured(run, capture, target)
            scope.ending = True
        try:
            yield run
        finally:
            run.notebook.capture = None
            if again:
                _end_reentry(scope, run)


def _key(store: Store) -> tuple:
    """A store as the writer registry tells them apart: the place (its canonical ``url``, so a path and
    its ``file://`` URL share one writer), the table (two PostgreSQL tables on one server share a
    ``url``: the table is an option), and whether it signs its journal (a signed and a plain store of
    one place never share a writer)."""
    return type(store).__name__, store.url, getattr(store, "table", None), store.journal_signer is not None


def _end_reentry(scope: RunScope, run: Run) -> None:
    """A completed run re-entered: a block that wrote nothing leaves the journal as it was (no attempt, no
    ending, no replay record); one that wrote (a checkpoint, a new call) was an attempt, and completes the
    run again when it succeeds."""
    if run.attempt_written:
        scope.complete = True
    else:
        scope.ending = False
        run.replayed.clear()


def _restore_captured(run: Run, names: Sequence[str], namespace: dict) -> None:
    from .snapshots import Snapshotter
    from .trust import resigned

    snapshot = Snapshotter(namespace, names, objects=run.store.objects, run_id=run.run_id, store_url=run.store.url,
                           strict=names, resigned=resigned(run.opened_events))
    saved = run.notebook.saved.get("values")
    if saved:
        snapshot.restore(saved)
    run.notebook.capture = lambda: _capture_announcing(run, snapshot)


def _capture_announcing(run: Run, snapshot: Any) -> dict:
    """The captured variables; a variable newly saved with pickle is named on stderr at once."""
    values = snapshot.capture()
    announced = run.notebook.announced
    fresh = [name for name in snapshot.pickled if name not in announced]
    if fresh:
        announced.update(fresh)
        sys.stderr.write(f"[caravanserai] run {run.run_id!r}: saved with pickle, signed with your key (it loads for you and "
                         f"whoever trusts your key): "
                         f"{', '.join(fresh)}\n")
    return {"values": values, "at": None}


def append_event(store: Store, run_id: str, event: dict, *, started: dict | None = None, tries: int = 200) -> dict:
    """Append one bookkeeping event (not an attempt of the run) through the run's one writer.

    Joins this process's open writer if there is one; otherwise takes the run's lease briefly,
    retrying while another process holds it. A new run starts with ``run_started`` + ``started``.
    """
    run_id = validate_run_id(run_id)
    mine = registry.get(run_id, store)
    if mine is not None:
        return mine.append(event)[0]
    last: RunLocked | None = None
    for attempt in range(tries):
        try:
            run = registry.open(run_id, store, attempt=False, started=started)
        except RunLocked as exc:
            last = exc
            time.sleep(min(0.001 * (attempt + 1), 0.05))
            continue
        try:
            return run.append(event)[0]
        finally:
            run.close()
    holder = getattr(last, "holder", None)  # the store named the holder of the last refusal
    who = (f"{describe_holder(holder)} holds it" if holder
           else f"the store did not name its holder ({last.message if last else 'no attempt was made'})")
    raise RunLocked(f"run {run_id!r} stayed locked while recording a {event.get('type')} event ({tries} tries): {who}; "
                    "wait for it to finish or stop that process, then retry", run_id=run_id, holder=holder)

"""Rendering the local store's human-readable views (``waypoint-N.md``, ``state.json``, ``latest``,
``meta.json``) from the journal, off the checkpoint's critical path.

Every render — the writer's background thread or a reader repairing views after a kill — holds
``<run>/views.lock`` (never the writer's ``lock``, so a reader cannot lock a writer out) and
writes each file atomically. A *reconcile* re-reads the journal under that lock and writes every
missing waypoint file and a stale ``state.json``/``latest``, so views left behind by a killed
writer are always completed by the next writer or reader, and view temp files a kill stranded
are removed. The files are in caravanserai 0.2.0's byte format, so people, other agents and 0.2.0
itself can read them; this package never reads them back while a journal exists.
"""

from __future__ import annotations

import atexit
import fcntl
import json
import os
import re
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from ...errors import InvalidRunId
from ...events import fork_origin
from ...ids import validate_run_id
from ...journal import RawJSON
from .files import close_owned, open_owned, write_file_atomic

# Above this size state.json is written compactly, reusing the journal's encoding, so a large
# state is not pretty-printed again on every checkpoint.
PRETTY_STATE_LIMIT = 256 * 1024


def waypoint_markdown(n: int, at: str, note: str) -> str:
    """``# Waypoint N - <ts>``, a blank line, the note verbatim, one newline (0.2.0's format)."""
    stamp = datetime.fromisoformat(at).isoformat(timespec="seconds")
    return f"# Waypoint {n} - {stamp}\n\n{note}\n"


def state_text(state: Any) -> str:
    """``state.json`` as 0.2.0 wrote it (``json.dumps(state, indent=2)``); a large state already
    encoded (``RawJSON``) is written as that compact text instead of being encoded again."""
    if isinstance(state, RawJSON):
        if len(state.text) > PRETTY_STATE_LIMIT:
            return state.text
        state = state.value
    return json.dumps(state, indent=2)


def meta_text(started: dict[str, Any]) -> str:
    """``meta.json``: 0.2.0's ``command`` plus where and how the run was launched."""
    meta = {
        "command": started.get("command") or [],
        "cwd": started.get("cwd"),
        "orig_argv": started.get("orig_argv"),
        "journal": "journal.jsonl",
    }
    return json.dumps(meta, indent=2)


VIEWS_LOCK = "views.lock"
_VIEW_TMP = re.compile(r"\.(waypoint-\d+\.md|state\.json|latest|meta\.json)\.[0-9a-f]{12}\.tmp")
_WAYPOINT = re.compile(r"waypoint-(\d+)\.md")


@contextmanager
def views_lock(run_dir: Path) -> Iterator[None]:
    fd = open_owned(run_dir / VIEWS_LOCK, os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        close_owned(fd)  # closing drops the flock


VIEW_EVENTS = frozenset({"run_started", "waypoint"})  # the only events a view shows (see _Pending.add)


@dataclass
class _Pending:
    waypoints: list[tuple[int, str, str, bool]] = field(default_factory=list)  # (n, at, note, imported)
    state: tuple[int, Any] | None = None
    meta: dict | None = None
    reconcile: Callable[[], Sequence[dict]] | None = None
    copied: list[tuple[int, str, str, str]] = field(default_factory=list)  # a fork's copied waypoints (+ parent id)
    parent: str | None = None  # while a fork's copied prefix is being added

    def add(self, events: Iterable[dict]) -> None:
        for event in events:
            etype = event.get("type")
            if etype == "run_started" and not event.get("imported_from"):
                self.meta = event
                origin = fork_origin(event)
                self.parent = _run_id_or_none(origin["run_id"]) if origin is not None else None
            elif etype == "waypoint":
                if self.parent is not None:  # the parent's file says the same (n, time, note): linked, not rendered
                    self.copied.append((event["n"], event["at"], event.get("note", ""), self.parent))
                else:
                    self.waypoints.append((event["n"], event["at"], event.get("note", ""), bool(event.get("imported"))))
                if "state" in event:
                    self.state = (event["n"], event["state"])
            elif etype == "forked" and event.get("parent_run") == self.parent and self.parent is not None:
                if self.copied:  # the fork point may carry an edited note: rendered
                    n, at, note, _ = self.copied.pop()
                    self.waypoints.append((n, at, note, False))
                self.parent = None


def _write(path: Path, text: str) -> None:
    write_file_atomic(path, text.encode("utf-8"), durable=False)


def _run_id_or_none(value: str) -> str | None:
    """A parent named by the journal, as a sibling directory to link from: only a valid run id (a
    forged ``../..`` names no file); None otherwise (the copied waypoints are rendered instead)."""
    try:
        return validate_run_id(value)
    except InvalidRunId:
        return None


def _link(source: Path, target: Path) -> bool:
    """Hard-link a fork's copied waypoint file to its parent's (10,000 links cost a quarter of 10,000
    writes); False when that cannot be done (no parent file, another file system): render it instead."""
    try:
        os.link(source, target)
    except OSError:  # FileExistsError included: rendered again, from the same event
        return False
    return True


def render(run_dir: Path, pending: _Pending) -> None:
    """Write the views for ``pending`` (call with ``views_lock`` held)."""
    if pending.meta is not None and not (run_dir / "meta.json").exists():
        _write(run_dir / "meta.json", meta_text(pending.meta))
    for n, at, note, parent in pending.copied:
        if not _link(run_dir.parent / parent / f"waypoint-{n}.md", run_dir / f"waypoint-{n}.md"):
            _write(run_dir / f"waypoint-{n}.md", waypoint_markdown(n, at, note))
    for n, at, note, imported in pending.waypoints:
        path = run_dir / f"waypoint-{n}.md"
        if not (imported and path.exists()):
            _write(path, waypoint_markdown(n, at, note))
    if pending.state is not None:
        n, state = pending.state
        _write(run_dir / "state.json", state_text(state))
        _write(run_dir / "latest", str(n))  # after state.json: latest == n implies state.json is n's


def is_stale(run_dir: Path, events: Sequence[dict]) -> bool:
    """True if any waypoint file is missing or ``latest`` lags the journal (cheap: one listdir)."""
    waypoints = [e for e in events if e["type"] == "waypoint"]
    if not waypoints:
        return False
    try:
        names = os.listdir(run_dir)
        latest = (run_dir / "latest").read_text(encoding="utf-8").strip()
    except OSError:
        return True
    present = {int(m.group(1)) for m in map(_WAYPOINT.fullmatch, names) if m}
    last = next((e["n"] for e in reversed(waypoints) if "state" in e), None)
    return any(e["n"] not in present for e in waypoints) or (last is not None and latest != str(last))


def reconcile(run_dir: Path, events: Sequence[dict]) -> None:
    """Complete the views from the journal's ``events`` (call with ``views_lock`` held)."""
    names = os.listdir(run_dir)
    for name in names:
        if _VIEW_TMP.fullmatch(name):
            try:
                os.unlink(run_dir / name)
            except FileNotFoundError:
                pass
    present = {int(m.group(1)) for m in map(_WAYPOINT.fullmatch, names) if m}
    pending = _Pending()
    pending.add(e for e in events if e["type"] != "waypoint" or e["n"] not in present)
    last = next((e for e in reversed(events) if e["type"] == "waypoint" and "state" in e), None)
    try:
        latest = (run_dir / "latest").read_text(encoding="utf-8").strip()
    except OSError:
        latest = None
    pending.state = None if last is None or latest == str(last["n"]) else (last["n"], last["state"])
    render(run_dir, pending)


class ViewRenderer:
    """One daemon thread per process rendering views; pending events per run are coalesced.

    Renders at most every ``interval`` seconds (unless flushed), so a tight checkpoint loop
    replaces ``state.json``/``latest`` a few times a second rather than per checkpoint: those
    writes otherwise compete with the journal's fdatasync on the same disk.
    """

    interval = 0.1

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._pending: dict[Path, _Pending] = {}
        self._busy: set[Path] = set()
        self._thread: threading.Thread | None = None
        self._flushing = 0
        self._last = 0.0
        self._idle = False  # the thread waits for work (not out its interval): a submit must wake it

    def submit(self, run_dir: Path, events: Iterable[dict] = (), *,
               reconcile_from: Callable[[], Sequence[dict]] | None = None) -> None:
        """Queue ``events`` for rendering, or (``reconcile_from``) a full reconcile from the journal."""
        with self._cond:
            pending = self._pending.setdefault(run_dir, _Pending())
            pending.add(events)
            if reconcile_from is not None:
                pending.reconcile = reconcile_from
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._loop, name="caravanserai-views", daemon=True)
                self._thread.start()
            elif self._idle:  # waking a thread that waits out its interval, only for it to wait again, costs the writer
                self._cond.notify_all()

    def flush(self, run_dir: Path | None = None, timeout: float | None = 30.0) -> None:
        def done() -> bool:
            if run_dir is None:
                return not self._pending and not self._busy
            return run_dir not in self._pending and run_dir not in self._busy

        with self._cond:
            self._flushing += 1
            self._cond.notify_all()
            try:
                self._cond.wait_for(done, timeout)
            finally:
                self._flushing -= 1

    def discard(self, run_dir: Path) -> None:
        with self._cond:
            self._pending.pop(run_dir, None)
            self._cond.wait_for(lambda: run_dir not in self._busy, 30.0)

    def _loop(self) -> None:
        while True:
            with self._cond:
                self._idle = True
                self._cond.wait_for(lambda: any(d not in self._busy for d in self._pending))
                self._idle = False
                while not self._flushing and time.monotonic() - self._last < self.interval:
                    self._cond.wait(self.interval - (time.monotonic() - self._last))
                self._last = time.monotonic()
                run_dir = next(d for d in self._pending if d not in self._busy)
                pending = self._pending.pop(run_dir)
                self._busy.add(run_dir)
            try:
                if run_dir.is_dir():
                    with views_lock(run_dir):
                        if pending.reconcile is not None:
                            reconcile(run_dir, pending.reconcile())
                        render(run_dir, pending)
            except Exception:
                pass  # views are a convenience; the journal already holds the truth
            finally:
                with self._cond:
                    self._busy.discard(run_dir)
                    self._cond.notify_all()

    def reset_after_fork(self) -> None:
        type(self).__init__(self)


RENDERER = ViewRenderer()
atexit.register(RENDERER.flush)
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=RENDERER.reset_after_fork)

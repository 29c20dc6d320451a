"""``resumable_iterate``: a for-loop that resumes where a crash stopped it.

At-least-once: an item counts as done when the loop asks for the next one, so after a kill at
most the item in flight is redone (with ``every=`` group commit, at most the items since the
last commit: the trade-off for fast loops). Each done item is journaled with a short
fingerprint, so a resumed loop *checks* the items it skips instead of trusting positions: a
reordered, changed or shrunk input raises ``ItemsChanged``; a ``set`` (whose order changes
between processes) or a loop given ``key=`` resumes by identity instead. The input is consumed
lazily, never turned into a list, and the loop's progress never touches ``checkpoint()`` state.
"""

from __future__ import annotations

import hashlib
import re
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from datetime import timedelta
from typing import Any, TypeVar

from ..errors import ItemsChanged, NoCurrentRun, UsageError
from ..ids import validate_run_id
from ..journal import canonical
from ..stores import Store
from .lifecycle import current_run, open_run
from .progress import ProgressLine
from .run import Run

__all__ = ["fingerprint", "resumable_iterate"]

T = TypeVar("T")
_CURRENT: Any = object()  # run_id not given: the current run
_DURATION = re.compile(r"\s*(\d+(?:\.\d+)?)\s*(ms|s|m|min|h)\s*")
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0}


def _stable_repr(item: Any) -> str:
    text = repr(item)
    return type(item).__qualname__ if " at 0x" in text else text  # default reprs hold addresses


def fingerprint(item: Any) -> str:
    """A short digest of an item that is stable across processes (JSON, else its repr)."""
    try:
        text = canonical(item, default=_stable_repr)
    except (TypeError, ValueError):
        text = _stable_repr(item)
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:16]


def _parse_every(every: int | str | timedelta | None) -> tuple[int, float | None]:
    """(max items per commit, max seconds per commit)."""
    if every is None:
        return 1, None
    if isinstance(every, bool) or isinstance(every, float):
        raise UsageError(f"every={every!r}: give a number of items (every=100) or a duration (every='2s', timedelta)")
    if isinstance(every, int):
        if every < 1:
            raise UsageError(f"every={every}: commit at least every 1 item")
        return every, None
    if isinstance(every, timedelta):
        return sys.maxsize, every.total_seconds()
    if isinstance(every, str):
        match = _DURATION.fullmatch(every)
        if match:
            value, unit = float(match.group(1)), match.group(2)
            return sys.maxsize, value * _UNIT_SECONDS[unit]
    raise UsageError(f"every={every!r}: use an int (items), a duration string like '500ms' or '2s', or a timedelta")


def resumable_iterate(
    items: Iterable[T],
    run_id: Any = _CURRENT,
    note: Callable[[T], str] | None = None,
    *,
    every: int | str | timedelta | None = None,
    key: Callable[[T], Any] | None = None,
    progress: bool = False,
    store: Store | str | None = None,
) -> Iterator[T]:
    """Yield the items of ``items`` not yet done in run ``run_id``, recording each as done.

    ``note(item)`` makes the journal note for an item (default ``processed item i/N``).
    ``every`` groups commits (``100`` items or ``'2s'``); ``key`` resumes by identity;
    ``progress=True`` prints done/total, rate and ETA (showing where it resumed) to stderr.
    Without ``run_id``, inside ``durable()`` or a ``%%resumable`` cell, the loop belongs to that run.
    """
    limits = _parse_every(every)
    if run_id is _CURRENT:
        run = current_run()
        if run is None:
            raise NoCurrentRun("resumable_iterate(items) without a run id needs a current run (inside durable() or a "
                            "%%resumable cell); otherwise pass run_id=...")
        return _iterate(items, run.run_id, note, limits, key, progress, run.store)
    validate_run_id(run_id)
    return _iterate(items, run_id, note, limits, key, progress, store)


def _iterate(items, run_id, note, limits, key, show_progress, store) -> Iterator[Any]:
    run = open_run(run_id, store)
    in_scope = current_run() is run
    book = run.loops
    loop = book.next_loop() if in_scope else 0
    done = list(book.fingerprints.get(loop, ()))
    # Items before `base` were done by 0.2.0 ({"_i": k} state): no fingerprints to check them by.
    legacy_offset = book.legacy_offset if loop == 0 else None
    if loop in book.done:
        offset = book.done[loop]
        base = offset - len(done)
    else:
        base = offset = legacy_offset if legacy_offset is not None else 0
    total = len(items) if hasattr(items, "__len__") else None
    by_identity = key is not None or isinstance(items, (set, frozenset))
    if not by_identity and total is not None and total < offset:
        raise _shrunk(run_id, total, offset)
    commit = _Committer(run, loop, note, limits, total, offset)
    line = ProgressLine(run_id, total, resumed_at=offset) if show_progress else None
    position = -1
    book.active.append(commit)
    try:
        if by_identity:
            seen = set(done)
            for position, item in enumerate(items):  # noqa: B007 - `position` is read after the loop (the done count)
                mark = fingerprint(key(item) if key is not None else item)
                if mark in seen:
                    continue
                commit.inflight = (mark, item)
                yield item
                commit.finish_item()
                if line:
                    line.update(commit.count + offset)
        else:
            for position, item in enumerate(items):
                if position < offset:
                    if position >= base and fingerprint(item) != done[position - base]:
                        raise _changed(run_id, position, item)
                    continue
                commit.inflight = (fingerprint(item), item)
                yield item
                commit.finish_item()
                if line:
                    line.update(position + 1)
            if position + 1 < offset:
                raise _shrunk(run_id, position + 1, offset)
        commit.flush()
        run.append({"type": "iterate_done", "loop": loop, "count": position + 1})
        if not in_scope:
            run.complete()
            run.close()  # the loop was the whole run: let other processes have it
    finally:
        if commit in book.active:
            book.active.remove(commit)
        commit.flush()  # on break/exception: items finished before the current one
        if line:
            line.close()


class _Committer:
    """Buffers done-item fingerprints and appends them as `progress` events per the group policy."""

    def __init__(self, run: Run, loop: int, note: Callable[[Any], str] | None, limits: tuple[int, float | None],
                 total: int | None, position: int) -> None:
        self.run, self.loop, self.note, self.total = run, loop, note, total
        self.max_items, self.max_seconds = limits
        self.pending: list[str] = []
        self.last_note = ""
        self.count = 0
        self.position = position
        self.since = time.monotonic()
        self.inflight: tuple[str, Any] | None = None

    def finish_item(self) -> None:
        """The loop asked for the next item: the one in flight is done (unless a waypoint took it)."""
        if self.inflight is not None:
            mark, item = self.inflight
            self.inflight = None
            self.done(mark, item)

    def claim_inflight(self) -> dict | None:
        """A waypoint is committed while an item is in flight: its state already holds that item's
        effects, so the item is counted done in the same append (no double application on resume)."""
        if self.inflight is None:
            return None
        mark, item = self.inflight
        self.inflight = None
        self.pending.append(mark)
        self.count += 1
        self.position += 1
        self.last_note = str(self.note(item)) if self.note is not None else \
            f"processed item {self.position}/{self.total if self.total is not None else '?'}"
        marks, self.pending = self.pending, []
        self.since = time.monotonic()
        return {"type": "progress", "loop": self.loop, "done": self.position, "items": marks, "note": self.last_note}

    def done(self, mark: str, item: Any) -> None:
        self.pending.append(mark)
        self.count += 1
        self.position += 1
        if self.note is not None:
            self.last_note = str(self.note(item))
        else:
            self.last_note = f"processed item {self.position}/{self.total if self.total is not None else '?'}"
        if len(self.pending) >= self.max_items or (
            self.max_seconds is not None and time.monotonic() - self.since >= self.max_seconds
        ):
            self.flush()

    def flush(self) -> None:
        if not self.pending:
            return
        marks, self.pending = self.pending, []
        progress = {"type": "progress", "loop": self.loop, "done": self.position, "items": marks, "note": self.last_note}
        with self.run.lock:  # and the trail a person (or 0.2.0) reads: one waypoint per commit
            self.run.append(progress, self.run.loop_waypoint_event(self.loop, self.position, self.last_note))
        self.since = time.monotonic()


def _changed(run_id: str, position: int, item: Any) -> ItemsChanged:
    shown = repr(item)
    shown = shown if len(shown) <= 60 else shown[:57] + "..."
    return ItemsChanged(
        f"resumable_iterate on run {run_id!r}: item {position} ({shown}) is not the item processed at that position "
        "before (the input was reordered or changed); iterate in a stable order, pass key=... to resume by identity, "
        "or start a new run id",
        run_id=run_id, position=position,
    )


def _shrunk(run_id: str, total: int, offset: int) -> ItemsChanged:
    return ItemsChanged(
        f"resumable_iterate on run {run_id!r}: the input has {total} items but {offset} were already processed "
        "(it shrank since the earlier attempt); pass the same items, key=... to resume by identity, or start a new run id",
        run_id=run_id, total=total, done=offset,
    )

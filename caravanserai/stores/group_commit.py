"""Leader/follower group commit: concurrent writes that queue up share one flush.

A writer calls ``GroupCommit.submit(item)`` and blocks until the batch that holds its item is
durable. The first writer that finds no flush running becomes the leader: it takes the whole
queue (at most one item per ``key``, so two writes of one run never share a batch) and calls
``flush(batch)``; writers that arrive meanwhile queue up and wait, and when the leader is done
one of them leads the next batch with everything queued by then. There is no timer: a writer
alone flushes at once, with nothing added to its latency but a lock.

``flush`` settles each member itself (``member.done(value)`` or ``member.fail(exc)``: a member
that fails its own checks gets its own error); if ``flush`` raises, every member it has not
settled fails with that error (a copy per member), so nothing is acknowledged from a batch whose
flush failed.
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Callable, Hashable
from typing import Any, Generic, TypeVar

from ..errors import StoreUnavailable

__all__ = ["GroupCommit", "Member"]

T = TypeVar("T")


class Member(Generic[T]):
    """One queued write: its ``item`` and, once its batch is flushed, its value or its error."""

    __slots__ = ("error", "item", "settled", "value")

    def __init__(self, item: T) -> None:
        self.item = item
        self.settled = False
        self.value: Any = None
        self.error: BaseException | None = None

    def done(self, value: Any = None) -> None:
        self.value, self.settled = value, True

    def fail(self, error: BaseException) -> None:
        self.error, self.settled = error, True

    def outcome(self) -> Any:
        if self.error is not None:
            raise self.error
        return self.value


class GroupCommit(Generic[T]):
    """Batches concurrent ``submit`` calls into ``flush(list[Member])`` calls, one at a time."""

    def __init__(self, flush: Callable[[list[Member[T]]], None], key: Callable[[T], Hashable] = id) -> None:
        self._flush = flush
        self._key = key
        self._cond = threading.Condition(threading.Lock())
        self._queue: list[Member[T]] = []
        self._leading = False
        self._waiting = 0  # callers in cond.wait(): nobody to wake when 0
        self.batches = 0  # flushes so far
        self.largest = 0  # members in the largest batch

    def submit(self, item: T) -> Any:
        """Queue ``item``, wait until its batch is flushed; its value, or raise its error."""
        return self.submit_all([item])[0].outcome()

    def submit_all(self, items: list[T]) -> list[Member[T]]:
        """Queue ``items`` together (one caller with many writes), wait until all are flushed; their members."""
        members = [Member(item) for item in items]
        cond = self._cond
        with cond:  # held except while this caller flushes a batch: a writer alone takes the lock twice
            self._queue.extend(members)
            while True:
                while self._leading and not all(m.settled for m in members):
                    self._waiting += 1
                    try:
                        cond.wait()
                    finally:
                        self._waiting -= 1
                own = next((m for m in members if not m.settled), None)
                if own is None:
                    return members
                self._leading = True
                batch = self._take()  # holds these members unless writes of their keys are queued before them
                cond.release()
                try:
                    self._run(batch, own)
                finally:
                    interrupted = _acquire(cond)  # the lock back even through a Ctrl-C: `with` releases it
                    for m in batch:  # a Ctrl-C before the flush settled them: none waits for a batch that is gone
                        if not m.settled:
                            m.fail(StoreUnavailable("the append was interrupted before its batch was flushed; "
                                                    "nothing is acknowledged: retry it (its seq is still free)"))
                    self._leading = False
                    if self._waiting:  # followers whose batch this was, or the next leader
                        cond.notify_all()
                    if interrupted is not None:
                        raise interrupted

    def _take(self) -> list[Member[T]]:
        """The queued members, one per key (the others wait for the next batch). Under the lock."""
        batch: list[Member[T]] = []
        rest: list[Member[T]] = []
        seen: set[Hashable] = set()
        for m in self._queue:
            k = self._key(m.item)
            (rest if k in seen else batch).append(m)
            seen.add(k)
        self._queue = rest
        self.batches += 1
        self.largest = max(self.largest, len(batch))
        return batch

    def _run(self, batch: list[Member[T]], own: Member[T]) -> None:
        try:
            self._flush(batch)
        except BaseException as exc:  # the flush failed: no member of this batch is acknowledged
            for m in batch:
                if not m.settled:
                    m.fail(exc if m is own else _copy(exc))  # the leader raises the original
            if not isinstance(exc, Exception):
                raise
        for m in batch:
            if not m.settled:
                m.fail(StoreUnavailable("the store's group commit settled no outcome for this append; nothing is "
                                        "acknowledged: retry it (its seq is still free)"))


def _acquire(cond: threading.Condition) -> BaseException | None:
    """Take ``cond``'s lock, again if a signal handler's exception (Ctrl-C) cut the wait short; that exception."""
    interrupted = None
    while True:
        try:
            cond.acquire()
            return interrupted
        except BaseException as exc:  # KeyboardInterrupt from a lock wait: the lock is not held yet
            interrupted = exc


def _copy(exc: BaseException) -> BaseException:
    """A copy of ``exc`` for another thread to raise (tracebacks are per raise)."""
    try:
        return copy.copy(exc).with_traceback(None)
    except Exception:
        return exc

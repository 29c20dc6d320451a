"""What a run's writer keeps beside its journal, each behind its own object: the loops'
progress (``LoopBook``) and a notebook cell's hooks (``NotebookHooks``). ``Run`` feeds both from
the events it opens and appends; ``resumable_iterate`` and ``%%resumable`` read and set them."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

__all__ = ["LoopBook", "NotebookHooks"]


class LoopBook:
    """What the run's ``resumable_iterate`` loops have done (from its journal), and the loops running now.

    ``fingerprints[loop]``: the items finished, in order; ``done[loop]``: how many (counting items a
    0.2.0 run finished before it kept fingerprints); ``legacy_offset``: 0.2.0's ``{"_i": k}`` progress;
    ``active``: the loops iterating over the run right now (a waypoint commits their finished items).
    """

    def __init__(self) -> None:
        self.fingerprints: dict[int, list[str]] = {}
        self.done: dict[int, int] = {}
        self.legacy_offset: int | None = None
        self.active: list[Any] = []
        self._opened = 0
        self._lock = threading.Lock()

    def reset(self) -> None:
        """A ``restarted`` event: the loops start from nothing."""
        self.fingerprints, self.done, self.legacy_offset = {}, {}, None

    def on_progress(self, event: dict) -> None:
        loop = event.get("loop", 0)
        self.fingerprints.setdefault(loop, []).extend(event.get("items", ()))
        self.done[loop] = event.get("done", len(self.fingerprints[loop]))

    def new_attempt(self) -> None:
        """A new attempt in this process: loops count from 0 again."""
        with self._lock:
            self._opened = 0

    def next_loop(self) -> int:
        """Ordinal of the next loop over the run in this attempt."""
        with self._lock:
            index = self._opened
            self._opened += 1
            return index

    def claim_inflight(self) -> list[dict]:
        """The progress events of the running loops' finished items, to go with the next waypoint."""
        return [p for p in (loop.claim_inflight() for loop in self.active) if p is not None]


class NotebookHooks:
    """A notebook cell's hooks on its run: ``capture`` (returns the variables to save with each
    commit), ``listeners`` (called with the stored events after each append: the status line),
    the variables saved last (``saved``, at journal seq ``saved_at``), and the names already
    announced as saved with pickle."""

    def __init__(self) -> None:
        self.capture: Callable[[], dict | None] | None = None
        self.listeners: list[Callable[[list[dict]], Any]] = []
        self.saved: dict = {}
        self.saved_at: int | None = None
        self.announced: set[str] = set()

    def on_saved(self, event: dict) -> None:
        self.saved, self.saved_at = event["names"], event.get("seq")

    def reset(self) -> None:
        self.saved, self.saved_at = {}, None

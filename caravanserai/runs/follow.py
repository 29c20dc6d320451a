"""Following a run while it is written: new events only, verified, and the read model kept current.

``Follower(run_id, store)`` remembers how far it has read; ``poll()`` reads only the lines
appended since (``Store.load_since``), verifies them against the hash chain where the last read
stopped, and feeds them to the read model's pass, so a panel on a run being written by this
kernel, another kernel, a script or another machine sees new events without re-reading what it
has. ``view()`` is the ``RunView`` of everything read so far.
"""

from __future__ import annotations

from .. import journal
from ..stores import Store, open_store
from .api import readable_run_id
from .view import RunView, follow_pass, gc_paused

__all__ = ["Follower"]


class Follower:
    """Incremental reader of one run's journal (not thread-safe: one poller at a time)."""

    def __init__(self, run_id: str, store: Store | str | None = None) -> None:
        self.store = open_store(store)
        self.run_id = readable_run_id(run_id, self.store)
        self.events: list[dict] = []
        self._tail = journal.Tail()
        self._pass = follow_pass(self.run_id)
        self._view: RunView | None = None

    def poll(self) -> int:
        """Read what was appended since the last poll; returns how many new events there are.

        Raises what reading raises (StoreUnavailable, JournalCorruptionError...); the events read
        before stay valid.
        """
        lines = self.store.load_since(self.run_id, self._tail.seq)
        if not lines:
            return 0
        with gc_paused():  # the decoded events are acyclic; collections while building them only cost time
            events, tail = journal.decode(self.run_id, lines, start=self._tail.seq, tail=self._tail)
        self.events.extend(events)
        self._tail = tail
        self._pass.extend(self.events, len(events))
        self._view = None
        return len(events)

    def view(self) -> RunView:
        """The read model of every event read so far (built once per change)."""
        if self._view is None:
            self._view = self._pass.view()
        return self._view

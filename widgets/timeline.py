"""``Timeline(run_id)``: a run's waypoints, calls, tool calls and checkpoint commits in journal order, by attempt.

The rows come from ``caravanserai.panels.timeline`` (built in the kernel from the read model; only
the visible window goes to the browser); waypoint notes render as Markdown, and a click shows the
full event and, for a waypoint, its exact state. Live: new journal lines appear as they are written.
"""

from __future__ import annotations

import traitlets

from caravanserai.panels.timeline import TimelineSource, raise_missing, row_dict, run_summary_row, timeline_rows
from caravanserai.runs.view import RunView
from caravanserai.stores import Store

from .panel import Panel
from .saved import reopen_call

__all__ = ["Timeline", "raise_missing", "row_dict", "run_summary_row", "timeline_rows"]


class Timeline(Panel):
    """A run's timeline: ``Timeline(run_id, store=None, live=True, fold=True)``."""

    fold = traitlets.Bool(True).tag(sync=True)

    def __init__(self, run_id: str, store: Store | str | None = None, *, live: bool = True, fold: bool = True) -> None:
        self.run_id = run_id
        super().__init__(TimelineSource(run_id, store, fold=fold), fold=fold)
        self._reopen = reopen_call("Timeline", run_id, store=store)
        if not self.tick():
            self.send_window()
        if live:
            self.watch()

    @property
    def view(self) -> RunView | None:
        """The read model of what the panel shows (None before the run exists)."""
        assert isinstance(self.source, TimelineSource)
        return self.source.view

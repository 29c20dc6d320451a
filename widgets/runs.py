"""``Runs(store=None)``: every run in a store — status, attempts, waypoints, calls, cost, last update,
parent — and a click on one opens its Timeline below. Works for every store URL (a teammate's
runs on PostgreSQL or S3 included); one damaged run is marked, the others listed; a store that
cannot be reached is the panel's one-line error (and nothing else). The panel's "chart" button
draws attempts and cost per run inside it, in the notebook theme's colours.
"""

from __future__ import annotations

from typing import Any

import ipywidgets
import traitlets

from caravanserai.runs.index import indexed
from caravanserai.stores import Store, open_store

from .charts import runs_chart, themed_svg
from .panel import Panel
from .saved import SavedFallback, reopen_call
from .timeline import Timeline

RUNS_POLL_SECONDS = 1.0


def _plotted(rows: list[dict]) -> tuple:
    """The figures ``runs_chart`` draws from the rows: the chart is redrawn only when these change."""
    return tuple((r.get("run_id"), r.get("attempts"), r.get("usd"), r.get("unpriced")) for r in rows)


class RunsList(Panel):
    """The list part of ``Runs``: one row per run of ``store``; ``chart`` is the drawn chart (SVG), or empty."""

    chart = traitlets.Unicode("").tag(sync=True)

    def __init__(self, store: Store | str | None = None, *, live: bool = True) -> None:
        super().__init__(panel="runs")
        self._spec = store
        self._store: Store | None = None  # opened by the first poll, so an unreachable store is the error line
        self._rows_by_id: dict[str, dict] = {}
        self._stamps: dict[str, Any] = {}
        self._all: list[dict] = []
        self.summary = {"store": store if isinstance(store, str) else getattr(store, "url", "the default store")}
        self.on_open: Any = None
        self._plotted: tuple | None = None  # what the chart shows (a live store's new waypoints redraw nothing)
        if not self.tick():
            self.send_window()
        if live:
            self.watch(RUNS_POLL_SECONDS)

    @property
    def store(self) -> Store:
        """The store listed (opened on first use)."""
        if self._store is None:
            self._store = open_store(self._spec)
            self.summary = {"store": self._store.url}
        return self._store

    @property
    def all_rows(self) -> list[dict]:
        """Every run's row as shown (newest update first)."""
        return list(self._all)

    def _poll(self) -> bool:
        store = self.store
        versions = store.journal_versions()  # one cheap pass; only runs that changed are read again
        changed_ids = {r: v for r, v in versions.items() if self._stamps.get(r) != v or r not in self._rows_by_id}
        gone = set(self._rows_by_id) - set(versions)
        for run_id, entry in indexed(store, changed_ids).items():
            self._stamps[run_id] = versions[run_id]
            self._rows_by_id[run_id] = entry.row
        for run_id in gone:
            self._rows_by_id.pop(run_id)
            self._stamps.pop(run_id, None)
        changed = bool(changed_ids or gone)
        if changed:
            self._all = sorted(self._rows_by_id.values(), key=lambda r: r.get("updated_at") or "", reverse=True)
            if self.chart and self._plotted != _plotted(self._all):  # only when what it plots changed
                try:
                    self.draw_chart()
                except Exception as exc:  # a chart that cannot be drawn must not stop the list
                    self.chart = ""
                    self.show_error(exc)
        self.show_error(None, reading=True)
        return changed

    def draw_chart(self, show: bool = True) -> None:
        """Draw (or, with ``show=False``, remove) the attempts and cost per run listed now."""
        self._plotted = _plotted(self._all) if show else None
        self.chart = themed_svg(runs_chart(self.store, rows=self._all)) if show else ""

    def on_chart(self, _content: dict) -> None:
        """The panel's "chart" button: show the chart, or hide it when shown."""
        self.draw_chart(not self.chart)

    def _row_count(self) -> int:
        return len(self._all)

    def _rows(self, start: int, stop: int) -> list[dict]:
        return self._all[start:stop]

    def _detail(self, index: int) -> dict:
        row = self._all[index]
        if self.on_open is not None:
            self.on_open(row["run_id"])
        return {"title": f"{row['run_id']}: its timeline is below"}


class Runs(SavedFallback, ipywidgets.VBox):
    """``Runs(store=None)``: the runs of a store; click one to open its Timeline under the list."""

    def __init__(self, store: Store | str | None = None, *, live: bool = True) -> None:
        self.list = RunsList(store, live=live)
        self.timeline: Timeline | None = None
        self._live = live
        self.list.on_open = self.open_run
        super().__init__([self.list])
        self._reopen = reopen_call("Runs", store=store)

    def _saved_summary(self) -> dict:
        return {"runs": self.list.total}

    def show_chart(self, show: bool = True) -> None:
        """Show (or hide) the attempts and cost per run of the runs listed now, inside the list's panel."""
        self.list.draw_chart(show)

    def _layout(self) -> None:
        self.children = tuple(w for w in (self.list, self.timeline) if w is not None)

    def open_run(self, run_id: str) -> Timeline:
        """Show ``run_id``'s Timeline under the list (closing the one shown before)."""
        if self.timeline is not None:
            self.timeline.close()
        self.timeline = Timeline(run_id, self.list.store, live=self._live)
        self._layout()
        return self.timeline

    def close(self) -> None:
        for child in (getattr(self, "list", None), getattr(self, "timeline", None)):
            if child is not None:
                child.close()
        super().close()

"""``Runs(store=None)``: every run in a store — status, attempts, waypoints, calls, cost, last update,
parent — and a click on one opens its Timeline below. Works for every store URL (a teammate's
runs on PostgreSQL or S3 included); one damaged run is marked, the others listed.
"""

from __future__ import annotations

from typing import Any

import ipywidgets

from caravanserai.errors import CaravanseraiError
from caravanserai.panels.timeline import run_summary_row
from caravanserai.runs.view import inspect_run
from caravanserai.stores import Store, open_store

from .panel import Panel
from .timeline import Timeline

RUNS_POLL_SECONDS = 1.0


class RunsList(Panel):
    """The list part of ``Runs``: one row per run of ``store``."""

    def __init__(self, store: Store | str | None = None, *, live: bool = True) -> None:
        super().__init__(panel="runs")
        self._store = open_store(store)
        self._rows_by_id: dict[str, dict] = {}
        self._stamps: dict[str, Any] = {}
        self._all: list[dict] = []
        self.summary = {"store": self._store.url}
        self.on_open: Any = None
        self.tick() or self.send_window()
        if live:
            self.watch(RUNS_POLL_SECONDS)

    def _poll(self) -> bool:
        store = self._store
        ids = store.list()
        changed = set(ids) != set(self._rows_by_id)
        for run_id in ids:
            stamp = store.last_updated(run_id)
            if run_id in self._rows_by_id and self._stamps.get(run_id) == stamp:
                continue
            self._stamps[run_id] = stamp
            self._rows_by_id[run_id] = _run_row(run_id, store)
            changed = True
        for gone in set(self._rows_by_id) - set(ids):
            self._rows_by_id.pop(gone)
        if changed:
            self._all = sorted(self._rows_by_id.values(), key=lambda r: r.get("updated_at") or "", reverse=True)
        self.show_error(None, reading=True)
        return changed

    def _row_count(self) -> int:
        return len(self._all)

    def _rows(self, start: int, stop: int) -> list[dict]:
        return self._all[start:stop]

    def _detail(self, index: int) -> dict:
        row = self._all[index]
        if self.on_open is not None:
            self.on_open(row["run_id"])
        return {"title": f"{row['run_id']}: its timeline is below"}


def _run_row(run_id: str, store: Store) -> dict:
    try:
        return run_summary_row(inspect_run(run_id, store))
    except CaravanseraiError as exc:
        return {"run_id": run_id, "status": "damaged", "parent": exc.message}


class Runs(ipywidgets.VBox):
    """``Runs(store=None)``: the runs of a store; click one to open its Timeline under the list."""

    def __init__(self, store: Store | str | None = None, *, live: bool = True) -> None:
        self.list = RunsList(store, live=live)
        self.timeline: Timeline | None = None
        self._live = live
        self.list.on_open = self.open_run
        super().__init__([self.list])

    def open_run(self, run_id: str) -> Timeline:
        """Show ``run_id``'s Timeline under the list (closing the one shown before)."""
        if self.timeline is not None:
            self.timeline.close()
        self.timeline = Timeline(run_id, self.list._store, live=self._live)
        self.children = (self.list, self.timeline)
        return self.timeline

    def close(self) -> None:
        self.list.close()
        if self.timeline is not None:
            self.timeline.close()
        super().close()

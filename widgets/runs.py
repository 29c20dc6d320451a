"""``Runs(store=None)``: every run in a store — status, attempts, waypoints, calls, cost, last update,
parent — and a click on one opens its Timeline below. Works for every store URL (a teammate's
runs on PostgreSQL or S3 included); one damaged run is marked, the others listed.
"""

from __future__ import annotations

from typing import Any

import ipywidgets

from caravanserai.runs.index import indexed
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

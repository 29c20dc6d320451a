"""``JournalTable(run_id)``: a run's journal as a sortable, filterable table; selections come back as a DataFrame.

Built on ``RunView.journal_df()``: sorting (click a column) and filtering (type, attempt, time
range, text) run in pandas in the kernel, and only the visible rows go to the browser. Rows picked
in the browser (click; Ctrl/Shift-click for more) are ``table.selected``, a DataFrame.
"""

from __future__ import annotations

from typing import Any

import pandas as pd
import traitlets

from caravanserai.panels.source import pretty as _pretty
from caravanserai.panels.timeline import raise_missing
from caravanserai.runs.follow import Follower
from caravanserai.stores import Store

from .panel import Panel
from .saved import reopen_call

SORTABLE = ("seq", "at", "type", "attempt", "call_id", "summary")


class JournalTable(Panel):
    """``JournalTable(run_id, store=None, live=True)``; ``table.selected`` is the picked rows' DataFrame."""

    sort = traitlets.List(["seq", True]).tag(sync=True)  # [column, ascending]
    filters = traitlets.Dict().tag(sync=True)  # type, attempt, text, since, until
    types: traitlets.List[str] = traitlets.List().tag(sync=True)
    attempt_numbers: traitlets.List[int] = traitlets.List().tag(sync=True)
    selected_seqs: traitlets.List[int] = traitlets.List().tag(sync=True)

    def __init__(self, run_id: str, store: Store | str | None = None, *, live: bool = True) -> None:
        super().__init__(panel="journal")
        self.run_id = run_id
        self._store = store
        self._reopen = reopen_call("JournalTable", run_id, store=store)
        self._follower: Follower | None = None
        self._df: Any = None
        self._shown: Any = None
        self.observe(lambda _: self._refilter(), names=["sort", "filters"])
        self.observe(lambda _: self.send_window(), names=["selected_seqs"])
        if not self.tick():
            self.send_window()
        if live:
            self.watch()

    @property
    def df(self) -> Any:
        """The whole journal as a DataFrame (``RunView.journal_df()``)."""
        return self._df

    @property
    def selected(self) -> Any:
        """The rows picked in the browser, as a DataFrame (empty when none)."""
        if self._df is None:
            return pd.DataFrame()
        return self._df[self._df["seq"].isin(self.selected_seqs)].reset_index(drop=True)

    def _poll(self) -> bool:
        if self._follower is None:
            self._follower = Follower(self.run_id, self._store)
        if not self._follower.poll() and self._df is not None:
            return False
        if not self._follower.events:
            raise_missing(self.run_id, self._follower.store)
        view = self._follower.view()
        self._df = view.journal_df()
        with self.hold_sync():
            self.summary = {"run_id": view.run_id, "events": view.events}
            self.types = sorted(self._df["type"].unique().tolist())
            self.attempt_numbers = [a.number for a in view.attempts]
        self._refilter(push=False)
        self.show_error(None, reading=True)
        return True

    def _refilter(self, push: bool = True) -> None:
        df = self._df
        if df is None:
            return
        f = self.filters
        mask = df["seq"].notna()
        if f.get("type"):
            mask &= df["type"] == f["type"]
        if f.get("attempt") not in (None, ""):
            mask &= df["attempt"] == int(f["attempt"])
        if f.get("text"):
            needle = str(f["text"])
            mask &= df["summary"].str.contains(needle, case=False, regex=False).fillna(False) | \
                df["type"].str.contains(needle, case=False, regex=False).fillna(False)
        for key, op in (("since", "ge"), ("until", "le")):
            bound = _time(f.get(key))
            if bound is not None:
                mask &= getattr(df["at"], op)(bound)
        shown = df[mask.fillna(False)]
        column, ascending = (self.sort + ["seq", True])[:2] if self.sort else ("seq", True)
        if column in SORTABLE:
            shown = shown.sort_values(column, ascending=bool(ascending), kind="stable", na_position="last")
        self._shown = shown.reset_index(drop=True)
        if push:
            self.send_window()

    def _row_count(self) -> int:
        return 0 if self._shown is None else len(self._shown)

    def _rows(self, start: int, stop: int) -> list[dict]:
        part = self._shown.iloc[start:stop]
        picked = set(self.selected_seqs)
        rows = []
        for seq, at, etype, attempt, call_id, summary in zip(part["seq"], part["at"], part["type"], part["attempt"],
                                                             part["call_id"], part["summary"], strict=True):
            rows.append({"seq": int(seq), "at": at.isoformat(), "type": str(etype),
                         "attempt": None if pd.isna(attempt) else int(attempt),
                         "call_id": None if pd.isna(call_id) else str(call_id), "summary": str(summary),
                         "selected": int(seq) in picked})
        return rows

    def _detail(self, index: int) -> dict:
        seq = int(self._shown["seq"].iloc[index])
        assert self._follower is not None
        return {"title": f"event {seq}", "event": _pretty(self._follower.events[seq])}


def _time(text: Any) -> Any:
    """A filter bound: ISO text as a UTC timestamp (naive means UTC), None when empty or unreadable."""
    if not text:
        return None
    try:
        stamp = pd.Timestamp(str(text))
    except ValueError:
        return None
    return stamp.tz_localize("UTC") if stamp.tzinfo is None else stamp.tz_convert("UTC")

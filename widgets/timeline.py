"""``Timeline(run_id)``: a run's waypoints, calls and tool calls in journal order, grouped by attempt.

Each attempt opens with a boundary row saying how it ended (completed, failed, interrupted, or
killed: a later attempt started with no end recorded). A call is one row from intent to result
with a bar for its duration, its model, tokens and USD, marked paid or replayed (answered from
the journal, free). Waypoint notes render as Markdown; a click shows the full event and, for a
waypoint, its exact state. Loop progress (``resumable_iterate`` commits) folds into one row per
run of commits. Rows are built in the kernel from the read model (``caravanserai.runs.view``)
and only the visible window goes to the browser.
"""

from __future__ import annotations

import json
from typing import Any

import traitlets

from caravanserai.runs.follow import Follower
from caravanserai.runs.view import RunView
from caravanserai.stores import Store

from .panel import Panel

DETAIL_LIMIT = 200_000  # characters of an event or state shown in the detail pane


def timeline_rows(view: RunView, *, fold: bool = True) -> list[dict]:
    """The Timeline's rows for ``view`` (plain JSON dicts, in journal order)."""
    items: list[tuple[float, dict]] = []
    longest = max((c.duration_s or 0.0 for c in view.calls), default=0.0) or 1.0
    effects = {t.call_id: t.effect for t in view.tools}
    for a in view.attempts:
        items.append((a.seq, {"kind": "attempt", "seq": a.seq, "number": a.number, "at": a.started_at, "end": a.end,
                              "message": a.message, "pid": a.pid, "host": a.host}))
        if a.end in ("completed", "failed", "interrupted") and a.ended_at:
            last = a.seq + a.events - 1
            text = "the run completed" if a.end == "completed" else (a.message or "")
            items.append((last + 0.5, {"kind": a.end, "seq": last, "at": a.ended_at, "text": text}))
    for w in view.waypoints:
        items.append((w.seq, {"kind": "waypoint", "seq": w.seq, "n": w.n, "at": w.at, "note": w.note,
                              "loop": w.loop, "has_state": w.has_state, "attempt": w.attempt}))
    for c in view.calls:
        items.append((c.seq, {"kind": "call", "kind_of": c.kind, "seq": c.seq, "call_id": c.call_id, "at": c.started_at,
                              "model": c.model, "tool": c.tool, "effect": effects.get(c.call_id),
                              "status": c.status, "duration_s": c.duration_s, "bar": (c.duration_s or 0.0) / longest,
                              "tokens": c.total_tokens, "usd": c.usd, "priced": c.priced, "paid": c.paid,
                              "replayed": c.replayed, "replayed_in": list(c.replayed_in), "attempt": c.attempt}))
    items.sort(key=lambda item: item[0])
    rows = [row for _, row in items]
    return _fold_loops(rows) if fold else rows


def _fold_loops(rows: list[dict]) -> list[dict]:
    """Consecutive loop waypoints of one loop and attempt become one row (the noisy part of a run)."""
    out: list[dict] = []
    for row in rows:
        if row["kind"] == "waypoint" and row["loop"] is not None:
            last = out[-1] if out else None
            if last is not None and last["kind"] == "loop" and last["loop"] == row["loop"] and \
                    last["attempt"] == row["attempt"]:
                last["commits"] += 1
                last["note"], last["last_seq"], last["last_n"] = row["note"], row["seq"], row["n"]
                last["last_done"] = _done(row["note"], last["commits"])
                continue
            out.append({"kind": "loop", "seq": row["seq"], "last_seq": row["seq"], "loop": row["loop"], "at": row["at"],
                        "attempt": row["attempt"], "commits": 1, "note": row["note"], "first_n": row["n"],
                        "last_n": row["n"], "first_done": _done(row["note"], 1), "last_done": _done(row["note"], 1)})
            continue
        out.append(row)
    return out


def _done(note: str, fallback: int) -> int:
    """Items done, from a loop waypoint's default note (``processed item 7/10``)."""
    head = note.removeprefix("processed item ").split("/", 1)[0]
    return int(head) if head.isdigit() else fallback


def run_summary_row(view: RunView) -> dict:
    """The header of a run's panels."""
    receipt = view.receipt
    return {"run_id": view.run_id, "status": view.status, "attempts": len(view.attempts),
            "waypoints": len(view.waypoints), "calls": len(view.calls), "tokens": receipt.tokens,
            "usd": receipt.estimated_usd, "unpriced": receipt.unpriced,
            "replayed": sum(len(c.replayed_in) for c in view.calls), "events": view.events,
            "parent": view.parent.run_id if view.parent else None, "updated_at": view.updated_at}


def _pretty(value: Any) -> str:
    text = json.dumps(value, indent=2, ensure_ascii=False, default=repr)
    return text if len(text) <= DETAIL_LIMIT else text[:DETAIL_LIMIT] + f"\n... ({len(text):,} characters in all)"


class Timeline(Panel):
    """A run's timeline: ``Timeline(run_id, store=None, live=True, fold=True)``."""

    fold = traitlets.Bool(True).tag(sync=True)

    def __init__(self, run_id: str, store: Store | str | None = None, *, live: bool = True, fold: bool = True) -> None:
        super().__init__(panel="timeline", fold=fold)
        self.run_id = run_id
        self._store = store
        self._follower: Follower | None = None
        self._all: list[dict] = []
        self.observe(lambda _: self._rebuild(), names=["fold"])
        self.tick() or self.send_window()
        if live:
            self.watch()

    @property
    def view(self) -> RunView | None:
        """The read model of what the panel shows (None before the run exists)."""
        return self._follower.view() if self._follower is not None and self._follower.events else None

    def _poll(self) -> bool:
        if self._follower is None:
            self._follower = Follower(self.run_id, self._store)
        if not self._follower.poll() and self._all:
            return False
        view = self.view
        if view is None:
            raise_missing(self.run_id, self._follower.store)
        self._rebuild(push=False)
        self.show_error(None)
        return True

    def _rebuild(self, push: bool = True) -> None:
        view = self.view
        if view is None:
            return
        with self._lock:
            self._all = timeline_rows(view, fold=self.fold)
            self.summary = run_summary_row(view)
        if push:
            self.send_window()

    def _row_count(self) -> int:
        return len(self._all)

    def _rows(self, start: int, stop: int) -> list[dict]:
        return self._all[start:stop]

    def _detail(self, index: int) -> dict:
        row, view = self._all[index], self.view
        assert view is not None
        event = view.event(row.get("last_seq", row["seq"]))
        detail: dict[str, Any] = {"title": _title(row), "event": _pretty(event)}
        if row["kind"] in ("waypoint", "loop"):
            detail["note"] = event.get("note", "")
            if "state" in event:
                detail["state"] = _pretty(event["state"])
        return detail


def _title(row: dict) -> str:
    kind = row["kind"]
    if kind == "waypoint":
        return f"waypoint {row['n']} (journal seq {row['seq']})"
    if kind == "loop":
        return f"loop {row['loop']}: {row['commits']} commit(s), waypoints {row['first_n']}-{row['last_n']} (the last one shown)"
    if kind == "call":
        return f"{row['kind_of']} call {row['call_id']} (seq {row['seq']})"
    if kind == "attempt":
        return f"attempt {row['number']} (seq {row['seq']})"
    return f"{kind} (seq {row['seq']})"


def raise_missing(run_id: str, store: Store) -> None:
    from caravanserai.errors import RunNotFound

    raise RunNotFound(f"no run {run_id!r} in {store.url} (yet): check the id with %caravanserai list", run_id=run_id)

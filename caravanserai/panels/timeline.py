"""The Timeline's rows: a run's waypoints, calls, tool calls and checkpoint commits in journal order, by attempt.

Each attempt opens with a boundary row saying how it ended (completed, failed, interrupted, or
killed: a later attempt started with no end recorded). A call is one row from intent to result
with a bar for its duration, its model, tokens and USD, marked paid where it was paid; a later
attempt that was answered from the journal instead shows a replay row there, free. Loop
progress (``resumable_iterate`` commits) folds into one row per run of commits; a DurableAgent
commit is a row with the steps it holds. Rows are light tuples built from the read model
(``caravanserai.runs.view``); only the window a reader shows becomes dicts.
"""

from __future__ import annotations

import heapq
from typing import Any, ClassVar

from ..errors import RunNotFound
from ..runs.follow import Follower
from ..runs.view import RunView, gc_paused
from ..stores import Store
from .source import Source, pretty

__all__ = ["TimelineSource", "raise_missing", "row_dict", "run_summary_row", "timeline_items", "timeline_rows"]


def timeline_items(view: RunView, *, fold: bool = True) -> list[tuple]:
    """The Timeline's rows as light tuples in journal order (``row_dict`` turns one into JSON).

    Only the rows the browser shows become dicts, so a 100,000-event run costs a merge of
    already-ordered lists here, not 100,000 dicts.
    """
    with gc_paused():
        return _items(view, fold)


def _items(view: RunView, fold: bool) -> list[tuple]:
    attempts = [(a.seq, "attempt", a) for a in view.attempts]
    ends = [(a.seq + a.events - 1 + 0.5, "end", a) for a in view.attempts
            if a.end in ("completed", "failed", "interrupted") and a.ended_at]
    waypoints = [(w.seq, "waypoint", w) for w in view.waypoints]
    calls = [(c.seq, "call", c) for c in view.calls]
    by_id = {c.call_id: c for c in view.calls} if view.replays else {}
    replays = [(seq, "replay", (attempt, by_id[call_id], view.event(seq).get("at")))
               for seq, attempt, call_id in view.replays if call_id in by_id]
    commits = [(seq, "commit", seq) for seq in view.commit_seqs]
    copied = [(view.copied.seq_from, "copied", view.copied)] if view.copied is not None else []
    merged = list(heapq.merge(copied, attempts, ends, waypoints, calls, replays, commits, key=lambda item: item[0]))
    return _fold_loops(merged) if fold else merged


def _fold_loops(items: list[tuple]) -> list[tuple]:
    """Consecutive loop waypoints of one loop and attempt become one item: (seq, "loop", [waypoints])."""
    out: list[tuple] = []
    for item in items:
        if item[1] == "waypoint" and item[2].loop is not None:
            last = out[-1] if out else None
            if last is not None and last[1] == "loop" and last[2][0].loop == item[2].loop and \
                    last[2][0].attempt == item[2].attempt:
                last[2].append(item[2])
                continue
            out.append((item[0], "loop", [item[2]]))
            continue
        out.append(item)
    return out


def row_dict(item: tuple, longest: float, effects: dict[str, str], view: RunView | None = None) -> dict:
    """One Timeline row as the browser draws it (``view`` is needed for commit rows only)."""
    _, kind, obj = item
    if kind == "attempt":
        end = "log" if obj.end == "open" and view is not None and view.checkpoints is not None else obj.end
        return {"kind": "attempt", "seq": obj.seq, "number": obj.number, "at": obj.started_at, "end": end,
                "message": obj.message, "pid": obj.pid, "host": obj.host, "how": obj.kind}
    if kind == "copied":
        return {"kind": "copied", "seq": obj.seq_from, "at": obj.ended_at or obj.started_at, "parent": obj.parent,
                "first": obj.first, "last": obj.last, "waypoints": obj.waypoints, "edited": list(obj.edited),
                "code_changed": obj.code_changed is not None}
    if kind == "end":
        text = "the run completed" if obj.end == "completed" else (obj.message or "")
        return {"kind": obj.end, "seq": obj.seq + obj.events - 1, "at": obj.ended_at, "text": text}
    if kind == "waypoint":
        return {"kind": "waypoint", "seq": obj.seq, "n": obj.n, "at": obj.at, "note": obj.note, "loop": obj.loop,
                "has_state": obj.has_state, "attempt": obj.attempt}
    if kind == "loop":
        first, last = obj[0], obj[-1]
        return {"kind": "loop", "seq": first.seq, "last_seq": last.seq, "loop": first.loop, "at": first.at,
                "attempt": first.attempt, "commits": len(obj), "note": last.note, "first_n": first.n, "last_n": last.n,
                "first_done": _done(first.note, 1), "last_done": _done(last.note, len(obj))}
    if kind == "commit":
        return _commit_row(view.event(obj) if view is not None else {"seq": obj})
    if kind == "replay":
        attempt, c, at = obj
        return {"kind": "replay", "kind_of": c.kind, "seq": item[0], "call_id": c.call_id, "at": at, "model": c.model,
                "tool": c.tool, "effect": effects.get(c.call_id), "attempt": attempt, "tokens": c.total_tokens,
                "usd": c.usd, "priced": c.priced, "paid_in": c.attempt, "paid_seq": c.seq}
    c = obj
    return {"kind": "call", "kind_of": c.kind, "seq": c.seq, "call_id": c.call_id, "at": c.started_at,
            "model": c.model, "tool": c.tool, "effect": effects.get(c.call_id), "status": c.status,
            "duration_s": c.duration_s, "bar": (c.duration_s or 0.0) / longest, "tokens": c.total_tokens, "usd": c.usd,
            "priced": c.priced, "paid": c.paid, "replayed": c.replayed, "replayed_in": list(c.replayed_in),
            "attempt": c.attempt}


def _commit_row(event: dict) -> dict:
    """A DurableAgent checkpoint commit: which step, how many of the run's steps it holds, what it cost."""
    usage = [u for u in event.get("usage") or () if isinstance(u, dict)]
    fork = event.get("fork") if isinstance(event.get("fork"), dict) else None
    node = str(fork.get("node_id", "")) if fork else ""
    kind, _, number = node.partition("-")
    fork_step = int(number) + 1 if number.isdigit() else None
    step = event.get("step")
    return {"kind": "commit", "seq": event.get("seq"), "at": event.get("at"),
            "checkpoint": str(event.get("checkpoint_id", ""))[:12], "step": step + 1 if isinstance(step, int) else None,
            "steps": event.get("steps"), "steps_done": event.get("steps_done"), "computed": len(usage),
            "tokens": sum(u.get("tokens") or 0 for u in usage) if usage else None,
            "fork": f"step {fork_step} {'prompt' if kind == 'prompt' else 'output'} edited" if fork else None,
            "fork_step": fork_step, "stored": event.get("kind")}


def timeline_rows(view: RunView, *, fold: bool = True) -> list[dict]:
    """Every Timeline row of ``view`` as JSON dicts (tests, exports; a panel makes only its window)."""
    longest, effects = _scale(view)
    return [row_dict(item, longest, effects, view) for item in timeline_items(view, fold=fold)]


def _scale(view: RunView) -> tuple[float, dict[str, str]]:
    longest = max((c.duration_s or 0.0 for c in view.calls), default=0.0) or 1.0
    return longest, {t.call_id: t.effect for t in view.tools}


def _done(note: str, fallback: int) -> int:
    """Items done, from a loop waypoint's default note (``processed item 7/10``)."""
    head = note.removeprefix("processed item ").split("/", 1)[0]
    return int(head) if head.isdigit() else fallback


def run_summary_row(view: RunView) -> dict:
    """The header of a run's panels (``RunView.as_row``, the Runs panel's row)."""
    return view.as_row()


def raise_missing(run_id: str, store: Store) -> None:
    raise RunNotFound.in_store(run_id, store.url, yet=True)


class TimelineSource(Source):
    """A run's Timeline, read incrementally (``poll`` reads only new journal lines)."""

    panel = "timeline"
    options: ClassVar[dict[str, tuple]] = {"fold": (True, False)}

    def __init__(self, run_id: str, store: Store | str | None = None, *, fold: bool = True) -> None:
        self.run_id = run_id
        self.store = store
        self.fold = fold
        self._follower: Follower | None = None
        self._all: list[tuple] = []
        self._scale: tuple[float, dict[str, str]] = (1.0, {})

    @property
    def view(self) -> RunView | None:
        """The read model of what was read (None before the run exists)."""
        return self._follower.view() if self._follower is not None and self._follower.events else None

    def poll(self) -> bool:
        if self._follower is None:
            self._follower = Follower(self.run_id, self.store)
        if not self._follower.poll() and self._all:
            return False
        if self.view is None:
            raise_missing(self.run_id, self._follower.store)
        self.rebuild()
        return True

    def rebuild(self) -> None:
        view = self.view
        if view is not None:
            self._all = timeline_items(view, fold=self.fold)
            self._scale = _scale(view)

    def count(self) -> int:
        return len(self._all)

    def rows(self, start: int, stop: int) -> list[dict]:
        longest, effects = self._scale
        return [row_dict(item, longest, effects, self.view) for item in self._all[start:stop]]

    def summary(self) -> dict:
        view = self.view
        return run_summary_row(view) if view is not None else {"run_id": self.run_id}

    def detail(self, index: int) -> dict:
        row, view = self.rows(index, index + 1)[0], self.view
        assert view is not None
        event = view.event(row.get("last_seq", row["seq"]))
        detail: dict[str, Any] = {"title": _title(row), "event": pretty(event)}
        if row["kind"] in ("waypoint", "loop"):
            detail["note"] = event.get("note", "")
            waypoint = next((w for w in view.waypoints if w.seq == event.get("seq")), None)
            shown = view.variables_shown(waypoint, limit=2000) if waypoint is not None else {}
            if "state" in event and not (shown and "loop" in event):  # a notebook loop's {"_i": N} adds nothing
                detail["state"] = pretty(event["state"])
            if shown:  # a notebook waypoint: the cell's variables, as people read them
                detail["variables"] = "\n".join(f"{name} = {value}" for name, value in shown.items())
        if row["kind"] == "copied" and view.copied is not None and view.copied.code_changed:
            detail["code"] = view.copied.code_changed
        call = view.call(row["call_id"]) if row["kind"] in ("call", "replay") else None
        if call is not None and call.settled_seq is not None:  # a call is one row from intent to result
            detail["result"] = pretty(view.event(call.settled_seq))
        if row["kind"] == "replay" and call is not None:
            detail["call"] = pretty(view.event(call.seq))
        return detail


def _title(row: dict) -> str:
    kind = row["kind"]
    if kind == "waypoint":
        return f"waypoint {row['n']} (journal seq {row['seq']})"
    if kind == "loop":
        return f"loop {row['loop']}: {row['commits']} commit(s), waypoints {row['first_n']}-{row['last_n']} (the last one shown)"
    if kind == "call":
        return f"{row['kind_of']} call {row['call_id']} (seq {row['seq']})"
    if kind == "replay":
        return (f"{row['kind_of']} call {row['call_id']} answered from the journal in attempt {row['attempt']} "
                f"(seq {row['seq']}; paid in attempt {row['paid_in']}, seq {row['paid_seq']})")
    if kind == "attempt":
        return f"attempt {row['number']} (seq {row['seq']})"
    if kind == "copied":
        return (f"from {row['parent']}: waypoints {row['first']}–{row['last']} copied when this fork was made, "
                "with the parent's times")
    if kind == "commit":
        return f"checkpoint {row['checkpoint']} committed: step {row['step']} (seq {row['seq']})"
    return f"{kind} (seq {row['seq']})"

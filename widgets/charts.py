"""Charts of runs (matplotlib): each function returns a ``Figure``; the dashboards show them as images.

- ``cost_chart(run)``: cumulative USD and tokens per call instance, points coloured by attempt;
  a call answered from the journal in a later attempt is a point at zero cost there; calls of a
  model without a list price are marked "unpriced" and never counted as $0.
- ``latency_chart(run)``: each call's duration (intent to result) and the time between waypoints.
- ``runs_chart(store)``: attempts and cost per run of a store (the Runs panel's "chart" button).

The plotted series are the read model's figures (``caravanserai.runs.view``), nothing recomputed.
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from datetime import datetime

from matplotlib.figure import Figure

from caravanserai.runs.index import list_runs
from caravanserai.runs.view import RunView, inspect_run
from caravanserai.stores import Store, open_store

__all__ = ["CallPoint", "call_points", "cost_chart", "latency_chart", "png", "runs_chart"]

COLOURS = ("#1f6feb", "#cf222e", "#1a7f37", "#9a6700", "#8250df", "#bf3989", "#0a7c86", "#6e7781")


@dataclass(frozen=True)
class CallPoint:
    """One model call as the cost chart counts it: paid once, or answered from the journal (free)."""

    call_id: str
    attempt: int
    usd: float | None  # None: unpriced (no list price)
    tokens: int
    replayed: bool


def _view(run: RunView | str, store: Store | str | None) -> RunView:
    return run if isinstance(run, RunView) else inspect_run(run, store)


def call_points(view: RunView) -> list[CallPoint]:
    """Settled model calls in the order they were paid or replayed, by attempt."""
    keyed: list[tuple[tuple[int, int], CallPoint]] = []
    for c in view.calls:
        if c.kind != "model" or c.status != "settled":
            continue
        keyed.append(((c.attempt, c.seq), CallPoint(c.call_id, c.attempt, c.usd if c.priced else None,
                                                     c.total_tokens or 0, False)))
        for again in c.replayed_in:  # a later attempt asked again and got the journal's answer, free
            keyed.append(((again, c.seq), CallPoint(c.call_id, again, 0.0, 0, True)))
    return [point for _, point in sorted(keyed, key=lambda item: item[0])]


def cost_chart(run: RunView | str, store: Store | str | None = None) -> Figure:
    """Cumulative USD (top) and tokens (bottom) per call instance, coloured by attempt."""
    view = _view(run, store)
    points = call_points(view)
    fig = Figure(figsize=(7.5, 4.2), layout="constrained")
    usd_ax, tok_ax = fig.subplots(2, 1, sharex=True)
    xs = list(range(1, len(points) + 1))
    usd, tokens, total_usd, total_tokens = [], [], 0.0, 0
    for p in points:
        total_usd += p.usd or 0.0
        total_tokens += p.tokens
        usd.append(round(total_usd, 10))
        tokens.append(total_tokens)
    usd_ax.plot(xs, usd, drawstyle="steps-post", color="#6e7781", linewidth=1, label="cumulative USD (priced calls)")
    tok_ax.plot(xs, tokens, drawstyle="steps-post", color="#6e7781", linewidth=1, label="cumulative tokens")
    for attempt in sorted({p.attempt for p in points}):
        colour = COLOURS[(attempt - 1) % len(COLOURS)]
        for replayed in (False, True):
            idx = [i for i, p in enumerate(points) if p.attempt == attempt and p.replayed == replayed and p.usd is not None]
            if idx:
                usd_ax.scatter([xs[i] for i in idx], [usd[i] for i in idx], s=22, color=colour,
                               facecolors="none" if replayed else colour,
                               label=f"attempt {attempt}" + (" (replayed, free)" if replayed else ""))
                tok_ax.scatter([xs[i] for i in idx], [tokens[i] for i in idx], s=22, color=colour,
                               facecolors="none" if replayed else colour)
        unpriced = [i for i, p in enumerate(points) if p.attempt == attempt and p.usd is None]
        if unpriced:
            usd_ax.scatter([xs[i] for i in unpriced], [usd[i] for i in unpriced], marker="x", s=30, color=colour,
                           label=f"attempt {attempt}: unpriced (no list price)")
            tok_ax.scatter([xs[i] for i in unpriced], [tokens[i] for i in unpriced], marker="x", s=30, color=colour)
    missing = sum(1 for p in points if p.usd is None)
    usd_ax.set_ylabel("USD (inferred)")
    usd_ax.set_title(f"{view.run_id}: cost per call" + (f" — {missing} unpriced call(s) not in USD" if missing else ""),
                     fontsize=10)
    tok_ax.set_ylabel("tokens")
    tok_ax.set_xlabel("model call (in order; replays count 0)")
    if points:
        usd_ax.legend(fontsize=7, loc="upper left")
    else:
        usd_ax.text(0.5, 0.5, "no model calls", ha="center", va="center", transform=usd_ax.transAxes)
    return fig


def latency_chart(run: RunView | str, store: Store | str | None = None) -> Figure:
    """Seconds per call (intent to result; top) and between consecutive waypoints (bottom)."""
    view = _view(run, store)
    fig = Figure(figsize=(7.5, 4.2), layout="constrained")
    call_ax, way_ax = fig.subplots(2, 1)
    calls = [c for c in view.calls if c.duration_s is not None]
    call_ax.bar(range(1, len(calls) + 1), [c.duration_s for c in calls],
                color=[COLOURS[(c.attempt - 1) % len(COLOURS)] for c in calls])
    call_ax.set_ylabel("seconds")
    call_ax.set_title(f"{view.run_id}: latency per call (colour: attempt)", fontsize=10)
    call_ax.set_xlabel("call (in journal order)")
    times = [datetime.fromisoformat(w.at) for w in view.waypoints]
    gaps = [(b - a).total_seconds() for a, b in zip(times, times[1:], strict=False)]
    way_ax.bar([w.n for w in view.waypoints[1:]], gaps, color="#1f6feb")
    way_ax.set_ylabel("seconds")
    way_ax.set_xlabel("waypoint (time since the one before)")
    for ax, empty, what in ((call_ax, not calls, "no calls"), (way_ax, not gaps, "fewer than two waypoints")):
        if empty:
            ax.text(0.5, 0.5, what, ha="center", va="center", transform=ax.transAxes)
    return fig


def runs_chart(store: Store | str | None = None, *, rows: list[dict] | None = None) -> Figure:
    """Attempts (left) and inferred USD (right) per run of ``store``; runs with unpriced calls are hatched.

    The figures come from the run index (``list_runs``: one read of each changed journal at most);
    ``rows`` (the Runs panel's rows) draws those instead.
    """
    resolved = open_store(store)
    if rows is None:
        rows = [entry.row for entry in list_runs(resolved)]
    fig = Figure(figsize=(7.5, max(2.0, 0.3 * len(rows) + 1.2)), layout="constrained")
    att_ax, usd_ax = fig.subplots(1, 2, sharey=True)
    names = [str(r["run_id"]) for r in rows]
    att_ax.barh(names, [r.get("attempts") or 0 for r in rows], color="#6e7781")
    att_ax.set_xlabel("attempts")
    bars = usd_ax.barh(names, [r.get("usd") or 0.0 for r in rows], color="#1f6feb")
    for bar, row in zip(bars, rows, strict=True):
        if row.get("unpriced"):
            bar.set_hatch("//")
            bar.set_label("has unpriced calls")
    usd_ax.set_xlabel("USD (inferred; hatched: + unpriced calls)")
    fig.suptitle(f"runs in {resolved.url}", fontsize=10)
    return fig


def png(fig: Figure, dpi: int = 100) -> bytes:
    """The figure as PNG bytes (what the dashboards show)."""
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=dpi)
    return buffer.getvalue()

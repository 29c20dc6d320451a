"""Charts of runs (matplotlib): each function returns a ``ChartFigure``, a matplotlib ``Figure`` that shows
itself as an image when it is a cell's value (no ``%matplotlib inline`` needed).

- ``cost_chart(run)``: cumulative USD and tokens per call instance, points coloured by attempt;
  a call answered from the journal in a later attempt is a point at zero cost there; calls of a
  model without a list price are marked "unpriced" and never counted as $0.
- ``latency_chart(run)``: each call's duration (intent to result) and the time between waypoints.
- ``runs_chart(store)``: attempts and cost per run of a store (the Runs panel's "chart" button).

The plotted series are the read model's figures (``caravanserai.runs.view``), nothing recomputed.
Nothing to plot (no model calls, no runs) is a sentence saying what is missing, not empty axes.
Counts are ticked in whole numbers, money in plain dollars (``usd_tick``). ``themed_svg(fig)`` is
the chart for a panel: an inline SVG whose text, axes and grid take the notebook theme's colours.
"""

from __future__ import annotations

import base64
import io
import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from matplotlib import rc_context
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, MaxNLocator

from caravanserai.calls.pricing import usd_text
from caravanserai.runs.index import list_runs
from caravanserai.runs.view import RunView, inspect_run
from caravanserai.stores import Store, open_store

__all__ = ["CallPoint", "ChartFigure", "call_points", "cost_chart", "latency_chart", "png", "runs_chart", "themed_svg",
           "usd_tick"]

# one colour per attempt: mid-tones, each with a contrast of 4:1 or more on white and on a dark theme's #111
COLOURS = ("#2e7be6", "#dc3d43", "#208c47", "#a97300", "#8a5ae6", "#cc3f92", "#0b8793", "#747e89")
# Everything but the data is drawn in these light-theme colours; themed_svg swaps each for its theme variable
# (the panels' own variable first, then JupyterLab's, then this colour).
INK, MUTED, LINE, GRID, PAPER = "#1f2328", "#59636e", "#8c959f", "#d0d7de", "#ffffff"
THEMED = {INK: "var(--cvs-fg, var(--jp-ui-font-color1, #1f2328))",
          MUTED: "var(--cvs-fg2, var(--jp-ui-font-color2, #59636e))",
          LINE: "var(--jp-border-color1, #8c959f)",
          GRID: "var(--cvs-border, var(--jp-border-color2, #d0d7de))",
          PAPER: "var(--cvs-bg, var(--jp-layout-color1, #ffffff))"}
THEMED_COLOUR = re.compile("|".join(f"{hex_}(?![0-9a-fA-F])" for hex_ in THEMED))
NEUTRAL = COLOURS[-1]  # series that are not an attempt's: cumulative lines, attempts per run
SIZE = (7.5, 4.2)  # inches at 100 dpi: 750 x 420 px


class ChartFigure(Figure):
    """A matplotlib ``Figure`` that displays itself: its ``_repr_mimebundle_`` is a PNG (drawn at twice
    the resolution, shown at the figure's size) and the usual ``text/plain``, so a chart that ends a
    cell is an image in JupyterLab, Notebook 7 and ``nbclient`` runs without ``%matplotlib inline``
    (with it, IPython's registered Figure formatter wins and draws the same picture).
    marimo draws every ``Figure`` itself. No SVG in the bundle: front ends show it as an ``<img>``,
    where the theme's colours cannot reach; the white PNG reads in both themes."""

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> tuple[dict, dict]:
        width, height = (round(v) for v in self.get_size_inches() * self.dpi)
        data = {"image/png": base64.b64encode(png(self, dpi=2 * self.dpi)).decode("ascii"), "text/plain": repr(self)}
        return data, {"image/png": {"width": width, "height": height}}


@dataclass(frozen=True)
class CallPoint:
    """One model call as the cost chart counts it: paid once, or answered from the journal (free)."""

    call_id: str
    attempt: int
    usd: float | None  # None: unpriced (no list price)
    tokens: int
    replayed: bool


def usd_tick(value: float, pos: int | None = None) -> str:
    """A dollar amount as an axis shows it: ``calls.pricing.usd_text`` ("$0", "$12.34", "$0.00042"),
    a tick at zero computed as 1e-18 included; never an offset or scientific notation."""
    return usd_text(0.0 if abs(value) < 1e-12 else value)


def _view(run: RunView | str, store: Store | str | None) -> RunView:
    return run if isinstance(run, RunView) else inspect_run(run, store)


def _figure(rows: int, cols: int, size: tuple[float, float] = SIZE, grid: str = "y", **kw: Any) -> tuple[ChartFigure, list[Axes]]:
    """A chart's axes: light-theme colours that ``themed_svg`` swaps, a grid along the values."""
    fig = ChartFigure(figsize=size, dpi=100, layout="constrained", facecolor=PAPER)
    axes = fig.subplots(rows, cols, squeeze=False, **kw).ravel().tolist()
    for ax in axes:
        ax.ticklabel_format(style="plain", useOffset=False)  # 0.0004 s, never 4e-4 or "+1e3"
        ax.tick_params(which="both", colors=LINE, labelcolor=MUTED, labelsize=8)
        ax.spines[["top", "right"]].set_visible(False)
        ax.spines[["left", "bottom"]].set_color(LINE)
        ax.grid(axis=grid, color=GRID, linewidth=0.6)
        ax.set_axisbelow(True)
        for label in (ax.xaxis.label, ax.yaxis.label, ax.title):
            label.set_color(INK)
    return fig, axes


def _message(text: str) -> ChartFigure:
    """A chart with nothing to plot: the sentence that says what is missing, and no axes."""
    fig = ChartFigure(figsize=(SIZE[0], 0.8), dpi=100, facecolor=PAPER)
    fig.text(0.5, 0.5, text, ha="center", va="center", color=INK, fontsize=10)
    return fig


def _say(ax: Axes, text: str) -> None:
    """One part of a chart with nothing to plot: its axes hidden, the sentence in their place."""
    ax.set_axis_off()
    ax.text(0.5, 0.5, text, ha="center", va="center", color=MUTED, fontsize=9, transform=ax.transAxes)


def _top(values: Sequence[float]) -> float:
    """The upper limit of an axis from zero: a little above the largest value (1 when all are 0)."""
    return max(values, default=0) * 1.08 or 1.0


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


def cost_chart(run: RunView | str, store: Store | str | None = None) -> ChartFigure:
    """Cumulative USD (top) and tokens (bottom) per call instance, coloured by attempt."""
    view = _view(run, store)
    points = call_points(view)
    if not points:
        return _message(f"{view.run_id}: no settled model calls yet, so no cost to chart")
    fig, (usd_ax, tok_ax) = _figure(2, 1, sharex=True)
    xs = list(range(1, len(points) + 1))
    usd, tokens, total_usd, total_tokens = [], [], 0.0, 0
    for p in points:
        total_usd += p.usd or 0.0
        total_tokens += p.tokens
        usd.append(round(total_usd, 10))
        tokens.append(total_tokens)
    usd_ax.plot(xs, usd, drawstyle="steps-post", color=NEUTRAL, linewidth=1, label="cumulative USD (priced calls)")
    tok_ax.plot(xs, tokens, drawstyle="steps-post", color=NEUTRAL, linewidth=1, label="cumulative tokens")
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
    tok_ax.set_xlim(0.5, len(points) + 0.5)
    tok_ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    usd_ax.set_ylim(0, _top(usd))
    usd_ax.yaxis.set_major_formatter(FuncFormatter(usd_tick))
    if not any(usd):  # calls listed at $0: one "$0" tick, not -0.04 ... 0.04 nor a made-up $0-$1 scale
        usd_ax.set_yticks([0.0])
    tok_ax.set_ylim(0, _top(tokens))
    tok_ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    usd_ax.legend(fontsize=7, loc="upper left", facecolor=PAPER, edgecolor=GRID, labelcolor=INK)
    return fig


def latency_chart(run: RunView | str, store: Store | str | None = None) -> ChartFigure:
    """Seconds per call (intent to result; top) and between consecutive waypoints (bottom)."""
    view = _view(run, store)
    calls = [(c.duration_s, c.attempt) for c in view.calls if c.duration_s is not None]
    times = [datetime.fromisoformat(w.at) for w in view.waypoints]
    gaps = [(b - a).total_seconds() for a, b in zip(times, times[1:], strict=False)]
    if not calls and not gaps:
        return _message(f"{view.run_id}: no timed calls and fewer than two waypoints yet, so no latency to chart")
    fig, (call_ax, way_ax) = _figure(2, 1)
    call_ax.set_title(f"{view.run_id}: latency per call (colour: attempt)", fontsize=10)
    if calls:
        call_ax.bar(range(1, len(calls) + 1), [seconds for seconds, _ in calls],
                    color=[COLOURS[(attempt - 1) % len(COLOURS)] for _, attempt in calls])
        call_ax.set_ylabel("seconds")
        call_ax.set_xlabel("call (in journal order)")
        call_ax.set_xlim(0.5, len(calls) + 0.5)
        call_ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    else:
        _say(call_ax, "no timed calls yet")
    if gaps:
        numbers = [w.n for w in view.waypoints[1:]]
        way_ax.bar(numbers, gaps, color=COLOURS[0])
        way_ax.set_ylabel("seconds")
        way_ax.set_xlabel("waypoint (time since the one before)")
        way_ax.set_xlim(min(numbers) - 0.5, max(numbers) + 0.5)
        way_ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    else:
        _say(way_ax, "fewer than two waypoints yet: no time between waypoints")
    return fig


def runs_chart(store: Store | str | None = None, *, rows: list[dict] | None = None) -> ChartFigure:
    """Attempts (left) and inferred USD (right) per run of ``store``; runs with unpriced calls are hatched.

    The figures come from the run index (``list_runs``: one read of each changed journal at most);
    ``rows`` (the Runs panel's rows) draws those instead.
    """
    resolved = open_store(store)
    if rows is None:
        rows = [entry.row for entry in list_runs(resolved)]
    if not rows:
        return _message(f"no runs in {resolved.url} yet, so nothing to chart")
    fig, (att_ax, usd_ax) = _figure(1, 2, (SIZE[0], max(2.0, 0.3 * len(rows) + 1.2)), grid="x", sharey=True)
    names = [str(r["run_id"]) for r in rows]
    attempts = [r.get("attempts") or 0 for r in rows]
    att_ax.barh(names, attempts, color=NEUTRAL)
    att_ax.set_xlabel("attempts")
    att_ax.set_xlim(0, max(attempts) + 0.5)
    att_ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    usd = [r.get("usd") or 0.0 for r in rows]
    if any(usd) or any(r.get("unpriced") for r in rows):
        bars = usd_ax.barh(names, usd, color=COLOURS[0])
        for bar, row in zip(bars, rows, strict=True):
            if row.get("unpriced"):
                bar.set_hatch("//")
                bar.set_label("has unpriced calls")
        usd_ax.set_xlabel("USD (inferred; hatched: + unpriced calls)")
        usd_ax.set_xlim(0, _top(usd))
        usd_ax.xaxis.set_major_locator(MaxNLocator(5))  # half the width: fewer dollar labels
        usd_ax.xaxis.set_major_formatter(FuncFormatter(usd_tick))
    else:
        _say(usd_ax, "no priced model calls in these runs: $0")
    fig.suptitle(f"runs in {resolved.url}", fontsize=10, color=INK)
    return fig


def png(fig: Figure, dpi: float = 100) -> bytes:
    """The figure as PNG bytes."""
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=dpi)
    return buffer.getvalue()


def themed_svg(fig: Figure) -> str:
    """The chart as inline SVG markup for a panel: a transparent background, text and selectable
    labels, and its text, axis, grid and legend colours set to the theme's CSS variables (the
    panels' ``--cvs-*`` where defined, JupyterLab's ``--jp-*``, else the light colours), so the light
    and dark themes both apply. Put it in the page's DOM (``ipywidgets.HTML``): in an ``<img>`` the
    variables would not resolve. Only the charts of this module are drawn in the colours it swaps."""
    buffer = io.StringIO()
    with rc_context({"svg.fonttype": "none", "svg.hashsalt": None}):  # real text; ids unique per drawing
        fig.savefig(buffer, format="svg", transparent=True,
                    metadata={"Date": None, "Creator": None, "Format": None, "Type": None})
    svg = buffer.getvalue()
    width, height = (round(v) for v in fig.get_size_inches() * fig.dpi)
    svg = re.sub(r'<svg([^>]*?) width="[^"]*" height="[^"]*"',
                 rf'<svg\1 width="{width}" height="{height}" role="img" style="max-width: 100%; height: auto"',
                 svg[svg.index("<svg"):], count=1)  # no XML prolog or DOCTYPE inside HTML; scales down in narrow cells
    return THEMED_COLOUR.sub(lambda m: THEMED[m.group(0)], svg)

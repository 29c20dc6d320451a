"""The panels' Python side, without a browser: rows, windows, details, live polling, errors, charts.

The widgets are real anywidgets (no front end attached: ipywidgets gives them a dummy comm), fed
by real runs written through the public API — a child process SIGKILLed mid-run for the attempt
boundary, journaled model calls (ScriptedModel, priced at $0; one unpriced model) and tool calls.
The charts are checked by their data: the plotted series equal the journal's figures.
"""

from __future__ import annotations

import json
import subprocess
import textwrap
import threading
import time
from pathlib import Path

import pytest
from conftest import PYTHON, kill9, need_module

need_module("anywidget", "notebook")
need_module("matplotlib", "notebook")

from caravanserai.widgets import JournalTable, Runs, Timeline, cost_chart, latency_chart, runs_chart  # noqa: E402
from caravanserai.widgets.charts import call_points  # noqa: E402

import caravanserai  # noqa: E402
from caravanserai import durable, resumable_iterate  # noqa: E402
from caravanserai.calls.pricing import register_price  # noqa: E402
from caravanserai.runs.view import inspect_run  # noqa: E402


@pytest.fixture(autouse=True)
def prices():
    register_price("priced-model-1", 1.0, 2.0)


CHILD = textwrap.dedent("""\
    import sys, time
    from caravanserai import durable
    from caravanserai.calls.models import Model, ModelResponse, Usage
    from caravanserai.calls.pricing import register_price

    class Priced(Model):  # a deterministic model with a list price, so USD figures are not all zero
        provider, name = "test", "priced-model-1"

        def complete(self, messages, *, tools=None, **params):
            return ModelResponse(f"answer {len(messages)}", Usage(100, 20), (), self.name, None)

    class Unpriced(Priced):
        name = "no-price-model"

    register_price("priced-model-1", 1.0, 2.0)
    with durable("story") as run:
        done = (run.state or {"done": 0})["done"]
        for i in range(done, 4):
            run.call_model(Priced(), [{"role": "user", "content": f"step {i}"}], path="story")
            if i == 1:
                run.call_model(Unpriced(), [{"role": "user", "content": "free?"}], path="story")
            run.call_tool(lambda x: x * 2, {"x": i}, name="double", effect="idempotent")
            if i == 2 and len(sys.argv) > 1:
                print("ready", flush=True)
                time.sleep(60)
            run.checkpoint({"done": i + 1, "note": f"**step {i + 1}**"}, f"finished **step {i + 1}** of 4")
""")


@pytest.fixture
def story(project: Path, child_env: dict) -> Path:
    """Run ``story``: killed once inside step 3 (SIGKILL), then resumed to completion."""
    (project / "child.py").write_text(CHILD)
    env = child_env
    proc = subprocess.Popen([PYTHON, "child.py", "hang"], cwd=project, env=env, stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready"
    kill9(proc)
    subprocess.run([PYTHON, "child.py"], cwd=project, env=env, check=True, timeout=60)
    return project


def all_rows(panel) -> list[dict]:
    panel.view_start, panel.view_count = 0, 10_000
    return list(panel.rows)


def test_timeline_rows_show_attempts_calls_and_waypoints(story):
    timeline = Timeline("story", live=False)
    try:
        rows = all_rows(timeline)
        attempts = [r for r in rows if r["kind"] == "attempt"]
        assert [(a["number"], a["end"]) for a in attempts] == [(1, "killed"), (2, "completed")]
        waypoints = [r for r in rows if r["kind"] == "waypoint"]
        assert [w["n"] for w in waypoints] == [1, 2, 3, 4] and waypoints[0]["note"] == "finished **step 1** of 4"
        calls = [r for r in rows if r["kind"] == "call" and r["kind_of"] == "model"]
        assert all(c["status"] == "settled" for c in calls)
        replayed = [c for c in calls if c["replayed"]]
        assert len(replayed) == 1 and replayed[0]["replayed_in"] == [2]  # step 3's call, settled before the kill
        unpriced = [c for c in calls if not c["priced"]]
        assert len(unpriced) == 1 and unpriced[0]["usd"] is None and unpriced[0]["model"] == "no-price-model"
        tools = [r for r in rows if r["kind"] == "call" and r["kind_of"] == "tool"]
        assert {t["tool"] for t in tools} == {"double"} and {t["effect"] for t in tools} == {"idempotent"}
        assert [t["replayed_in"] for t in tools if t["replayed"]] == [[2]]  # step 3's tool call, settled before
        assert rows.index(attempts[1]) > rows.index(waypoints[1])  # the boundary sits where the kill happened
        summary = timeline.summary
        view = inspect_run("story")
        assert summary["status"] == "completed" and summary["attempts"] == 2 and summary["replayed"] == 2
        assert summary["usd"] == view.receipt.estimated_usd and summary["unpriced"] is True

        timeline.cursor = rows.index(waypoints[2])
        assert json.loads(timeline.detail["state"]) == {"done": 3, "note": "**step 3**"}
        assert timeline.detail["note"] == "finished **step 3** of 4"
        assert json.loads(timeline.detail["event"])["type"] == "waypoint"
    finally:
        timeline.close()


def test_loop_progress_folds_into_one_row_and_unfolds(project):
    with durable("loop-run") as run:
        for _ in resumable_iterate(range(50)):
            pass
        run.checkpoint({"done": True}, "after the loop")
    timeline = Timeline("loop-run", live=False)
    try:
        folded = all_rows(timeline)
        loops = [r for r in folded if r["kind"] == "loop"]
        assert len(loops) == 1 and loops[0]["commits"] == 50 and loops[0]["last_done"] == 50
        timeline.fold = False
        unfolded = all_rows(timeline)
        assert sum(r["kind"] == "waypoint" for r in unfolded) == 51
        assert timeline.total == len(unfolded) == len(folded) + 49
    finally:
        timeline.close()


def test_only_a_window_of_rows_is_sent_whatever_the_run_length(project):
    def window_bytes(run_id: str, n: int) -> tuple[int, int]:
        with durable(run_id) as run:
            for i in range(n):
                run.checkpoint({"i": i}, f"waypoint {i}")
        timeline = Timeline(run_id, live=False)
        try:
            state = json.dumps(timeline.get_state(), default=str)
            return len(state), timeline.total
        finally:
            timeline.close()

    small, small_total = window_bytes("short", 300)
    large, large_total = window_bytes("long", 3000)
    assert small_total == 302 and large_total == 3002
    assert large < small * 1.2  # the window, not the run, decides what goes to the browser


def test_the_window_follows_the_browser(project):
    with durable("scroll") as run:
        for i in range(1000):
            run.checkpoint({"i": i}, f"waypoint {i}")
    timeline = Timeline("scroll", live=False)
    try:
        timeline.view_count = 50
        timeline.view_start = 900
        assert timeline.row_start == 900 and len(timeline.rows) == 50
        assert [r["n"] for r in timeline.rows[:3]] == [900, 901, 902]  # row 0 is the attempt boundary
    finally:
        timeline.close()


def test_a_live_timeline_shows_new_events_from_another_writer_and_stops_when_closed(project):
    with durable("live") as run:
        run.checkpoint({"i": 0}, "first")
    timeline = Timeline("live")
    try:
        assert timeline.live and timeline.summary["waypoints"] == 1
        shown = list(timeline.rows)
        writer = threading.Thread(target=lambda: caravanserai.checkpoint("live", {"i": 1}, "second"))
        writer.start()
        writer.join()
        deadline = time.monotonic() + 5
        while timeline.summary["waypoints"] < 2:
            assert time.monotonic() < deadline, "the new waypoint never showed"
            time.sleep(0.02)
        assert timeline.rows[: len(shown)] == shown and timeline.rows[-1]["note"] == "second"
        thread = timeline._thread
    finally:
        timeline.close()
    thread.join(2)
    assert not thread.is_alive() and not timeline.live


def test_errors_are_one_line_in_the_panel(project):
    missing = Timeline("nobody", live=False)
    assert missing.error.startswith("RunNotFound: ") and "\n" not in missing.error and missing.total == 0
    missing.close()
    caravanserai.checkpoint("broken", {"a": 1}, "one")
    caravanserai.checkpoint("broken", {"a": 2}, "two")
    caravanserai.runs.close_all()
    journal = project / ".caravanserai" / "broken" / "journal.jsonl"
    journal.write_text(journal.read_text().replace('"a":1', '"a":5'))
    damaged = Timeline("broken", live=False)
    assert damaged.error.startswith("JournalCorruptionError: ") and "does not chain" in damaged.error
    damaged.close()
    unreachable = Timeline("x", store="http://127.0.0.1:9/?token=t&retries=0", live=False)
    assert unreachable.error.startswith("StoreUnavailable: ") and "\n" not in unreachable.error
    unreachable.close()


def test_journal_table_filters_sorts_and_gives_the_selection_back(story):
    table = JournalTable("story", live=False)
    try:
        df = table.df
        assert table.total == len(df) == inspect_run("story").events
        table.filters = {"type": "call_settled"}
        assert table.total == int((df["type"] == "call_settled").sum())
        table.filters = {"attempt": 2, "text": "double"}
        expected = df[(df["attempt"] == 2) & df["summary"].str.contains("double", case=False)]
        assert table.total == len(expected) > 0
        table.filters = {}
        table.sort = ["seq", False]
        assert all_rows(table)[0]["seq"] == int(df["seq"].max())
        late = df["at"].iloc[len(df) // 2]
        table.filters = {"since": late.isoformat()}
        assert table.total == int((df["at"] >= late).sum())
        table.filters = {}
        table.selected_seqs = [3, 5]
        picked = table.selected
        assert list(picked["seq"]) == [3, 5] and list(picked["type"]) == list(df.set_index("seq").loc[[3, 5], "type"])
    finally:
        table.close()


def test_charts_plot_the_journals_figures(story):
    view = inspect_run("story")
    points = call_points(view)
    paid = [c for c in view.calls if c.kind == "model" and c.status == "settled"]
    assert len([p for p in points if not p.replayed]) == len(paid)
    assert [p.usd for p in points if p.replayed] == [0.0]
    fig = cost_chart(view)
    usd_ax, tok_ax = fig.axes
    cumulative_usd = list(usd_ax.lines[0].get_ydata())
    assert cumulative_usd[-1] == pytest.approx(view.receipt.estimated_usd)
    assert list(tok_ax.lines[0].get_ydata())[-1] == view.receipt.tokens  # replays add no tokens
    labels = [t.get_text() for t in usd_ax.get_legend().get_texts()]
    assert any("unpriced" in label for label in labels) and any("replayed, free" in label for label in labels)
    assert "1 unpriced call(s) not in USD" in usd_ax.get_title()
    lat = latency_chart(view)
    heights = [bar.get_height() for bar in lat.axes[0].patches]
    assert heights == [c.duration_s for c in view.calls if c.duration_s is not None]
    caravanserai.checkpoint("other", {"x": 1}, "one")
    runs = runs_chart()
    names = [label.get_text() for label in runs.axes[0].get_yticklabels()]
    assert set(names) == {"story", "other"}
    attempts = {n: bar.get_width() for n, bar in zip(names, runs.axes[0].patches, strict=True)}
    assert attempts == {"story": 2, "other": 1}


def test_runs_lists_every_run_marks_damage_and_opens_a_timeline(story):
    caravanserai.checkpoint("second", {"x": 1}, "one")
    caravanserai.runs.close_all()
    panel = Runs(live=False)
    try:
        rows = {r["run_id"]: r for r in all_rows(panel.list)}
        assert set(rows) == {"story", "second"}
        assert rows["story"]["status"] == "completed" and rows["story"]["attempts"] == 2
        index = all_rows(panel.list).index(rows["second"])
        panel.list.cursor = index
        assert panel.timeline is not None and panel.timeline.run_id == "second"
        assert panel.children[1] is panel.timeline and panel.timeline.total == 2
    finally:
        panel.close()

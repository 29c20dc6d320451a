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
        # paid where it was paid (attempt 1); attempt 2 shows a free replay row for each call answered from the journal
        assert replayed[0]["attempt"] == 1 and replayed[0]["paid"]
        replays = [r for r in rows if r["kind"] == "replay"]
        assert sorted(r["kind_of"] for r in replays) == ["model", "tool"]
        assert all(r["attempt"] == 2 and r["paid_in"] == 1 and rows.index(r) > rows.index(attempts[1]) for r in replays)
        model_replay = next(r for r in replays if r["kind_of"] == "model")
        assert model_replay["call_id"] == replayed[0]["call_id"] and model_replay["tokens"] == replayed[0]["tokens"]
        summary = timeline.summary
        view = inspect_run("story")
        assert summary["status"] == "completed" and summary["attempts"] == 2 and summary["replayed"] == 2
        assert summary["usd"] == view.receipt.estimated_usd and summary["unpriced"] is True

        timeline.cursor = rows.index(waypoints[2])
        assert json.loads(timeline.detail["state"]) == {"done": 3, "note": "**step 3**"}
        assert timeline.detail["note"] == "finished **step 3** of 4"
        assert json.loads(timeline.detail["event"])["type"] == "waypoint"

        timeline.cursor = rows.index(replayed[0])  # a call's detail: from intent to result
        assert json.loads(timeline.detail["event"])["type"] == "call_started"
        result = json.loads(timeline.detail["result"])
        assert result["type"] == "call_settled" and result["call"]["usage"]["total_tokens"] == replayed[0]["tokens"]
        timeline.cursor = rows.index(model_replay)  # a replay's detail: the journal's record and the call it answers
        assert json.loads(timeline.detail["event"])["type"] == "replayed"
        assert json.loads(timeline.detail["call"])["seq"] == replayed[0]["seq"]
        assert "answered from the journal in attempt 2" in timeline.detail["title"]
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


def _say(panel, action: str) -> None:
    """What a browser view of ``panel`` sends (panels.js): attach, alive, detach."""
    panel._on_message(panel, {"action": action}, [])


def test_a_live_panel_polls_only_while_a_view_shows_it(project, monkeypatch):
    """A re-run cell or a cleared output removes the view: its watcher stops; a view again restarts it."""
    caravanserai.checkpoint("viewed", {"i": 0}, "first")
    timeline = Timeline("viewed")
    try:
        first = timeline._thread
        assert first.is_alive()  # no view yet (Python only): it polls
        _say(timeline, "attach")
        _say(timeline, "detach")  # the only view went away
        first.join(2)
        assert not first.is_alive() and not timeline.live
        caravanserai.checkpoint("viewed", {"i": 1}, "while nobody looked")
        _say(timeline, "attach")  # shown again: catches up at once and polls again
        assert timeline.live and timeline._thread.is_alive() and timeline.summary["waypoints"] == 2
        second = timeline._thread
        _say(timeline, "attach")  # a second view of the same panel
        _say(timeline, "detach")
        time.sleep(0.5)
        assert second.is_alive()  # one view is still there
        monkeypatch.setattr("caravanserai.widgets.panel.STALE_SECONDS", 0.3)  # the last view's tab closed: no word
        second.join(3)
        assert not second.is_alive() and not timeline.live
        caravanserai.checkpoint("viewed", {"i": 2}, "third")
        _say(timeline, "alive")  # it speaks again: polling resumes with what it missed
        assert timeline.live and timeline.summary["waypoints"] == 3
        monkeypatch.setattr("caravanserai.widgets.panel.STALE_SECONDS", 150.0)
        timeline.unwatch()
        _say(timeline, "attach")  # unwatch() is the user's word: a view does not undo it
        assert not timeline.live
    finally:
        timeline.close()


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
    runs = Runs("http://127.0.0.1:9/?token=t&retries=0", live=False)  # a store that cannot be reached: the line
    assert runs.list.error.startswith("StoreUnavailable: ") and "\n" not in runs.list.error and runs.list.total == 0
    runs.close()


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
    caravanserai.checkpoint("broken", {"a": 1}, "one")
    caravanserai.checkpoint("broken", {"a": 2}, "two")
    caravanserai.runs.close_all()
    journal = story / ".caravanserai" / "broken" / "journal.jsonl"
    journal.write_text(journal.read_text().replace('"a":1', '"a":5'))  # breaks the hash chain
    panel = Runs(live=False)
    try:
        rows = {r["run_id"]: r for r in all_rows(panel.list)}
        assert set(rows) == {"story", "second", "broken"} and panel.list.error == ""
        assert rows["broken"]["status"] == "damaged"  # marked; the others are listed as usual
        assert rows["story"]["status"] == "completed" and rows["story"]["attempts"] == 2
        index = all_rows(panel.list).index(rows["second"])
        panel.list.cursor = index
        assert panel.timeline is not None and panel.timeline.run_id == "second"
        assert panel.children[-1] is panel.timeline and panel.timeline.total == 2

        panel.list._on_message(panel.list, {"action": "chart"}, [])  # the panel's chart button: attempts and cost per run
        assert panel.list.chart.startswith("<svg") and "broken" in panel.list.chart and panel.list.error == ""
        panel.list._on_message(panel.list, {"action": "chart"}, [])  # clicked again: hidden
        assert panel.list.chart == "" and panel.children == (panel.list, panel.timeline)
    finally:
        panel.close()


def test_the_status_line_link_opens_the_dashboard(project):
    from caravanserai.widgets import DashboardLink

    caravanserai.checkpoint("linked", {"x": 1}, "one")
    link = DashboardLink("linked")
    try:
        bundle = link._repr_mimebundle_()
        assert bundle["text/plain"].startswith("%caravanserai show linked  (")  # a saved notebook says what to type
        assert "<code>%caravanserai show linked</code>" in bundle["text/html"]  # nbviewer, GitHub, an HTML export
        assert "application/vnd.jupyter.widget-view+json" in bundle
        assert link.dashboard is None  # nothing read before the click
        link.children[0].click()
        dashboard = link.dashboard
        assert dashboard is not None and link.children == (dashboard,)
        assert dashboard.timeline.summary["waypoints"] == 1 and dashboard.journal.total == dashboard.timeline.view.events
        dashboard.selected_index = 2
        assert len(dashboard.charts.children) == 2  # cost and latency, drawn when the tab opens
    finally:
        link.close()


def test_rich_reprs_have_html_and_plain_text(story):
    view = inspect_run("story")
    receipt = view.receipt
    with durable("story-repr") as run:
        run.checkpoint({"x": 1}, "step 4 of a **note**")
        shown = [run._repr_mimebundle_(), view._repr_mimebundle_(), receipt._repr_mimebundle_()]
        shown.append(run.latest._repr_mimebundle_())
    for bundle in shown:
        assert set(bundle) >= {"text/html", "text/plain"} and bundle["text/plain"].strip()
        assert "<script" not in bundle["text/html"]
    assert "story-repr" in shown[0]["text/plain"] and "story" in shown[1]["text/html"]
    assert "completed" in shown[1]["text/plain"] and "2 attempt" in shown[1]["text/plain"]
    assert f"{receipt.tokens}" in shown[2]["text/plain"].replace(",", "")
    assert "waypoint 1" in shown[3]["text/html"] and "step 4 of a" in shown[3]["text/plain"]


@pytest.fixture(params=["sqlite", "postgres", "s3", "http"])
def shared_url(request, tmp_path: Path):
    """A shared store's URL, as a teammate would pass it to ``Runs`` (real servers on loopback)."""
    import uuid

    kind, tag = request.param, uuid.uuid4().hex[:8]
    if kind == "sqlite":
        yield f"sqlite:///{tmp_path / 'team.db'}"
    elif kind == "postgres":
        yield f"{request.getfixturevalue('pg').dsn}?table=runs_{tag}&create_schema=1"
    elif kind == "s3":
        s3 = request.getfixturevalue("s3")
        s3.create_bucket(f"team-{tag}")
        yield (f"s3://team-{tag}/runs?endpoint={s3.endpoint}&region=us-east-1&access_key_id=testing"
               "&secret_access_key=testing&allow_http=true")
    else:
        from servers.journal_service import JournalServiceProcess

        service = JournalServiceProcess(f"sqlite:///{tmp_path / 'svc.db'}", "token-0123456789abcdef")
        try:
            yield f"{service.url}/?token=token-0123456789abcdef"
        finally:
            service.stop()
    caravanserai.runs.close_all()


def test_runs_lists_a_shared_stores_runs_and_opens_their_timelines(project, shared_url):
    for run_id, steps in (("teammate-a", 2), ("teammate-b", 3)):
        for i in range(steps):
            caravanserai.checkpoint(run_id, {"i": i}, f"{run_id} step {i}", store=shared_url)
    caravanserai.runs.close_all()
    panel = Runs(shared_url, live=False)
    try:
        assert panel.list.error == ""
        rows = {r["run_id"]: r for r in all_rows(panel.list)}
        assert {r: rows[r]["waypoints"] for r in rows} == {"teammate-a": 2, "teammate-b": 3}
        panel.list.cursor = all_rows(panel.list).index(rows["teammate-b"])
        notes = [r["note"] for r in all_rows(panel.timeline) if r["kind"] == "waypoint"]
        assert notes == [f"teammate-b step {i}" for i in range(3)]
    finally:
        panel.close()


def test_a_saved_fallback_names_the_store_without_its_secrets(project):
    """What a notebook keeps beside a panel (``text/plain``, ``text/html``) goes to GitHub with the file: a
    password, token or key in the store URL is redacted there; a Store object is named by its URL."""
    from caravanserai.widgets import Compare, DashboardLink, Runs

    caravanserai.checkpoint("kept", {"x": 1}, "one")
    shown = []
    for panel in (Runs("postgresql://alice:hunter2@127.0.0.1:9/db", live=False),
                  DashboardLink("kept", "s3://bucket/p?secret_access_key=hunter2&region=x"),
                  Compare(["kept", "kept"], store=caravanserai.open_store(), live=False)):
        bundle = panel._repr_mimebundle_()
        bundle = bundle[0] if isinstance(bundle, tuple) else bundle
        shown.append(bundle["text/plain"] + bundle["text/html"])
        panel.close()
    assert all("hunter2" not in text for text in shown), shown
    assert "alice:***@" in shown[0] and "secret_access_key=***" in shown[1]
    assert "Compare('kept', 'kept', store='file://" in shown[2]  # the names it resolved, the store's URL


def test_the_runs_chart_is_redrawn_only_when_what_it_plots_changes(project, monkeypatch):
    """A live store's new waypoints change the rows, not attempts or cost: the chart's SVG is not redrawn
    (matplotlib in the kernel every poll); a new run is."""
    import caravanserai.widgets.runs as runs_module

    caravanserai.checkpoint("plotted", {"x": 1}, "one")
    panel = Runs(live=False)
    drawn: list[int] = []
    real = runs_module.runs_chart
    monkeypatch.setattr(runs_module, "runs_chart", lambda *a, **k: drawn.append(1) or real(*a, **k))
    try:
        panel.show_chart()
        assert panel.list.chart and len(drawn) == 1
        caravanserai.checkpoint("plotted", {"x": 2}, "two")  # same run, same attempts, same cost
        assert panel.list.tick() and len(drawn) == 1
        caravanserai.checkpoint("another", {"x": 1}, "one")  # a new bar
        assert panel.list.tick() and len(drawn) == 2 and "another" in panel.list.chart
    finally:
        panel.close()

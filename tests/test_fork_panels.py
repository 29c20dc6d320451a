"""ForkPanel, Lineage and Compare as widgets, driven from Python the way their buttons drive them.

The browser sends ``{"action": ...}`` messages; here the same messages go to the panels' handler,
so what a click does is checked without a browser (tests/test_browser_forks.py clicks for real in
JupyterLab). A fork resumes in a background thread while the caller goes on; Stop keeps what was
computed; bad input becomes the panel's one-line error and writes nothing.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest
from agent_helpers import logged_run, store_bytes
from conftest import need_module

need_module("anywidget", "notebook")

from caravanserai.widgets import Compare, ForkPanel, JournalTable, Lineage, Timeline  # noqa: E402

from caravanserai import DurableAgent, durable, open_store  # noqa: E402
from caravanserai.checkpoints import CheckpointLog  # noqa: E402
from caravanserai.errors import UsageError  # noqa: E402

PROMPTS = ["pull the ticket", "reproduce the bug", "draft a fix", "open the PR", "write the changelog"]


def click(panel, **content) -> None:
    """What a button in the browser sends."""
    panel._on_message(panel, content, [])




@pytest.fixture
def store(project):
    return open_store()


def test_fork_button_forks_resumes_in_the_background_and_opens_the_new_timeline(store):
    log = logged_run(store, "ticket", PROMPTS)
    panel = ForkPanel(log, live=False)
    try:
        assert panel.steps.total == 5 and panel.steps.summary["agent"] and panel.steps.summary["steps_done"] == 5
        panel.steps.cursor = 2
        assert panel.steps.detail["editable"] == "draft a fix" and panel.steps.detail["step"] == 3
        click(panel.steps, action="fork", step=3, text="draft two fixes", new_run_id="")
        status = panel.wait(30)
        assert status["state"] == "done" and status["run"] == "ticket-fork-3"
        assert status["reused"] == 2 and status["computed"] == 3 and status["tokens_saved"] > 0
        assert panel.steps.job["state"] == "done"  # the last status always reaches the browser
        assert isinstance(panel.shown, Timeline) and panel.shown.run_id == "ticket-fork-3"
        click(panel.steps, action="compare")
        assert isinstance(panel.shown, Compare)
        assert panel.shown.summary["first_divergence"] == 3 and panel.shown.jump == 1
        child = CheckpointLog(store, "ticket-fork-3")
        outputs = DurableAgent.outputs_of(child.load(child.newest_head()))
        assert outputs[:2] == DurableAgent.outputs_of(log.load(log.newest_head()))[:2] and None not in outputs
    finally:
        panel.close()


def test_the_notebook_stays_free_and_stop_keeps_what_was_computed(store, monkeypatch):
    from caravanserai.checkpoints.agent import FakeBackend

    log = logged_run(store, "long", [f"step {i}" for i in range(4000)])
    generate = FakeBackend.generate

    def slow_generate(self, prompt, previous):  # a model that takes 5 ms a step, so there is time to click Stop
        time.sleep(0.005)
        return generate(self, prompt, previous)

    monkeypatch.setattr(FakeBackend, "generate", slow_generate)
    panel = ForkPanel("long", live=False)
    try:
        seen = []
        started = time.monotonic()
        panel.fork(1, "step zero, edited")
        while panel.steps.job.get("steps_done", 0) < 50:  # this thread goes on while the fork runs
            seen.append(panel.steps.job.get("steps_done"))
            time.sleep(0.01)
            assert time.monotonic() - started < 60
        click(panel.steps, action="stop")
        status = panel.wait(60)
        assert status["state"] == "stopped" and 50 <= status["steps_done"] < 4000 and len(seen) > 1
        monkeypatch.undo()  # the model is quick again
        child = CheckpointLog(store, "long-fork-1")
        again = child.resume(commit_every=3600)  # what the stopped fork computed is reused, not recomputed
        assert again.reused == status["steps_done"] and again.done
        assert log.newest_head() != child.newest_head()
    finally:
        panel.close()


def test_fork_a_plain_run_at_a_waypoint_with_edited_state(store):
    with durable("plain") as run:
        for i in range(3):
            run.checkpoint({"i": i, "items": list(range(i))}, f"step {i}")
    panel = ForkPanel("plain", live=False)
    try:
        assert panel.steps.total == 3 and not panel.steps.summary["agent"]
        panel.steps.cursor = 1
        assert json.loads(panel.steps.detail["editable"]) == {"i": 1, "items": [0]}
        click(panel.steps, action="fork", step=2, text='{"i": 1, "items": [42]}', new_run_id="plain-edit")
        assert panel.steps.job["state"] == "created" and "%%resumable plain-edit" in panel.steps.job["hint"]
        with durable("plain-edit") as child:
            assert child.state == {"i": 1, "items": [42]}
        click(panel.steps, action="fork", step=2, text="{oops", new_run_id="plain-edit-2")
        assert panel.steps.error.startswith("UsageError: the state is not JSON")
        assert "plain-edit-2" not in open_store().list()
    finally:
        panel.close()


@pytest.mark.parametrize("content,says", [
    ({"step": 9, "text": "x"}, "NoSuchWaypoint: run 'ticket' has no step 9"),
    ({"step": 2, "text": "x", "new_run_id": "ticket"}, "RunExists: run 'ticket' already exists"),
    ({"step": 2, "text": "x", "new_run_id": "bad id!"}, "InvalidRunId"),
    ({"step": "2", "text": "x"}, "UsageError: fork takes a step number"),
])
def test_bad_fork_clicks_show_one_line_and_write_nothing(project, store, content, says):
    logged_run(store, "ticket", PROMPTS)
    panel = ForkPanel("ticket", live=False)
    try:
        before = store_bytes(project / ".caravanserai")
        click(panel.steps, action="fork", **content)
        assert panel.steps.error.startswith(says)
        assert "\n" not in panel.steps.error and panel.forked is None
        assert store_bytes(project / ".caravanserai") == before
    finally:
        panel.close()


def test_a_corrupt_log_shows_the_typed_error_in_the_panel(project, store):
    logged_run(store, "ticket", PROMPTS)
    record = next((project / ".caravanserai" / ".objects").rglob("records/*.json"))
    record.write_bytes(record.read_bytes().replace(b'"kind":', b'"kinds":'))
    panel = ForkPanel("ticket", live=False)
    try:
        assert panel.steps.error.startswith("CheckpointCorruptionError: the record of checkpoint")
        before = store_bytes(project / ".caravanserai")
        click(panel.steps, action="fork", step=2, text="x")
        assert panel.steps.error.startswith("CheckpointCorruptionError") and store_bytes(project / ".caravanserai") == before
    finally:
        panel.close()


def test_lineage_grows_a_branch_opens_timelines_and_compares_two(store):
    log = logged_run(store, "ticket", PROMPTS)
    tree = Lineage(log)
    try:
        assert [r["id"] for r in tree.tree.rows] == ["ticket"]
        log.fork(log.newest_head(), "prompt-2", "draft two fixes", new_run_id="alt")
        deadline = time.monotonic() + 10
        while len(tree.tree.rows) < 2:  # the live watcher picks the new fork up
            assert time.monotonic() < deadline, tree.tree.rows
            time.sleep(0.05)
        alt = tree.tree.rows[1]
        assert (alt["id"], alt["parent"], alt["point"], alt["edit"]) == ("alt", "ticket", 3, "step 3 prompt → draft two fixes")
        click(tree.tree, action="open", id="alt")
        assert isinstance(tree.shown, Timeline) and tree.shown.run_id == "alt"
        click(tree.tree, action="compare", ids=["ticket"])
        assert tree.tree.error.startswith("UsageError: pick two timelines")
        tree.tree.picked = ["ticket", "alt"]
        click(tree.tree, action="compare")
        assert isinstance(tree.shown, Compare) and tree.shown.summary["runs"] == ["ticket", "alt"]
        click(tree.tree, action="open", id="nobody")
        assert "no timeline 'nobody'" in tree.tree.error
    finally:
        tree.close()


def test_compare_panel_switches_and_export(project, store):
    log = logged_run(store, "base", [f"step {i}" for i in range(300)])
    log.fork(log.newest_head(), "prompt-199", "step 199, edited", new_run_id="edit")
    CheckpointLog(store, "edit").resume()
    panel = Compare("base", "edit", live=False)
    try:
        assert panel.total == 1 + 101 and panel.jump == 1 and panel.rows[0]["kind"] == "shared"
        assert len(panel.rows) <= panel.view_count  # a window, not every step
        panel.fold = False
        assert panel.total == 300 and panel.jump == 199
        panel.only_diff = True
        assert panel.total == 101 and panel.jump == 0 and all(not r["same"] for r in panel.rows)
        panel.cursor = 0
        assert "the first divergence" in panel.detail["title"]
        path = panel.to_html(str(project / "compare.html"))
        assert "cvs-data" in Path(path).read_text(encoding="utf-8")
        assert panel.only_diff and panel.source.only_diff  # exporting leaves the panel as it was
        with pytest.raises(UsageError):
            JournalTable("base", live=False).to_html(str(project / "journal.html"))
    finally:
        panel.close()


def test_closing_a_fork_panel_stops_its_job_and_threads(store, monkeypatch):
    from caravanserai.checkpoints.agent import FakeBackend

    logged_run(store, "big", [f"s{i}" for i in range(3000)])
    generate = FakeBackend.generate
    monkeypatch.setattr(FakeBackend, "generate", lambda self, p, prev: (time.sleep(0.005), generate(self, p, prev))[1])
    before = {t.name for t in threading.enumerate()}
    panel = ForkPanel("big")
    panel.fork(1, "edited")
    panel.close()
    assert panel.wait(60)["state"] == "stopped"
    deadline = time.monotonic() + 5
    while {t.name for t in threading.enumerate() if t.is_alive()} - before:
        assert time.monotonic() < deadline, {t.name for t in threading.enumerate()} - before
        time.sleep(0.05)

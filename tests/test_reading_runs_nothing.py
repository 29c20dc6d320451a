"""Reading a run never runs what it holds (issue 23's "reading never runs anything", for today's readers).

A run saves a variable with pickle whose ``__reduce__`` would create a marker file when loaded. Then,
in fresh processes and in this one, every reader is pointed at it: ``show`` (plain, ``--all`` and
``--json``), ``journal``, ``list``, ``verify``, ``export --html``, ``diff`` with a fork, the read
model's variables, and every panel (Timeline, JournalTable, Runs, ForkPanel, Lineage, Compare, the
HTML export). None creates the marker, and the value reads as ``<pickled __main__.Boom, not loaded>``,
even for its author, whose key would let a resumed run load it. Who may *load* it: test_trust.py.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from conftest import PYTHON

WRITER = """\
import pathlib
import caravanserai

class Boom:
    def __reduce__(self):  # loading this runs Path('MARKER').touch()
        return (pathlib.Path.touch, (pathlib.Path("MARKER"),))

boom = Boom()
with caravanserai.durable("pickled-run", capture=["boom"]) as run:
    run.checkpoint({"step": 1}, "saved a pickled value")
caravanserai.fork("pickled-run", at=1, new_run_id="pickled-fork", state={"step": 2})
"""


@pytest.fixture
def pickled_store(tmp_path: Path, child_env: dict[str, str]) -> Path:
    writer = subprocess.run([PYTHON, "-c", WRITER], cwd=tmp_path, env=child_env, capture_output=True, text=True, timeout=120)
    assert writer.returncode == 0, writer.stderr
    assert "saved with pickle" in writer.stderr and not (tmp_path / "MARKER").exists()
    return tmp_path


COMMANDS = [["show", "pickled-run"], ["show", "pickled-run", "--all"], ["show", "pickled-run", "--json"],
            ["journal", "pickled-run"], ["list"], ["verify"], ["export", "pickled-run", "--html", "out.html"],
            ["diff", "pickled-run", "pickled-fork"]]


@pytest.mark.parametrize("argv", COMMANDS, ids=[" ".join(a) for a in COMMANDS])
def test_no_command_loads_a_pickled_value(pickled_store, child_env, argv):
    proc = subprocess.run([PYTHON, "-m", "caravanserai", *argv], cwd=pickled_store, env=child_env, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert not (pickled_store / "MARKER").exists(), f"caravanserai {' '.join(argv)} loaded the pickle"


def test_the_read_model_and_every_panel_show_a_stand_in(pickled_store, monkeypatch):
    import caravanserai
    from caravanserai.runs.view import inspect_run

    monkeypatch.chdir(pickled_store)
    monkeypatch.delenv("CARAVANSERAI_STORE", raising=False)
    view = inspect_run("pickled-run")
    variables = view.variables(1)
    assert variables["boom"]["$t"] == "pickle" and "sha256" in variables["boom"]  # named, never loaded
    assert "pickle" in view.variables_shown(1)["boom"]
    from caravanserai.widgets import Compare, ForkPanel, JournalTable, Lineage, Runs, Timeline

    panels = [Timeline("pickled-run", live=False), JournalTable("pickled-run", live=False), Runs(live=False),
              ForkPanel("pickled-run", live=False), Lineage("pickled-run", live=False),
              Compare("pickled-run", "pickled-fork", live=False)]
    try:
        panels[0].cursor = 1  # the waypoint's detail: its variables
        panels[3].steps.cursor = 0  # the ForkPanel editor of the same waypoint
        for panel in panels:
            assert getattr(panel, "error", "") == "", panel.error
        panels[0].to_html(str(pickled_store / "timeline.html"))
        panels[5].to_html(str(pickled_store / "compare.html"))
    finally:
        for panel in panels:
            panel.close()
        caravanserai.runs.close_all()
    assert not (pickled_store / "MARKER").exists()

    # the control: the saved payload is live — restoring it on purpose, as its author (this session's key), runs it
    from caravanserai.runs.snapshots import Snapshotter

    store = caravanserai.open_store()
    entry = view.saved_entries(1)["boom"]
    Snapshotter({}, ["boom"], objects=store.objects, run_id="pickled-run", store_url=store.url).decode("boom", entry)
    assert (pickled_store / "MARKER").exists()


def test_show_names_the_pickled_class_and_says_it_was_not_loaded(pickled_store, child_env):
    shown = subprocess.run([PYTHON, "-m", "caravanserai", "show", "pickled-run"], cwd=pickled_store, env=child_env,
                           capture_output=True, text=True, timeout=120)
    assert "boom = <pickled __main__.Boom, not loaded>" in shown.stdout, shown.stdout
    assert not (pickled_store / "MARKER").exists()

"""Forks of a ``%%resumable`` loop a researcher can read, in-process (IPython's test shell).

The ``research-loop`` story: a 20-item loop fills ``results`` and ``seen``; two ``--from @5`` forks
run different code, a ForkPanel-style fork edits a variable, another edits nothing. Compare and
``diff`` find the first divergence at step 6 and name ``results``; fork records are honest (no
"edited" without an edit, no "killed" attempt, durations never negative); the journal holds the
variables as plain nested JSON. The same story in a real kernel, with a SIGKILL, is in
test_notebook_forks_kernel.py.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest
from ipython_helpers import fresh_session, ip, load_extension, run
from research_loop import research_loop

import caravanserai
from caravanserai.checkpoints.timelines import compare, timeline
from caravanserai.errors import UsageError
from caravanserai.panels.compare import CompareSource
from caravanserai.panels.steps import StepsSource, fork_step
from caravanserai.runs import inspect_run, read_events

extension = pytest.fixture(scope="module", autouse=True)(load_extension)
session = pytest.fixture(autouse=True)(fresh_session)


def cell(head: str, expr: str) -> str:
    """Run the research-loop cell; its printed output (the status line, in this terminal-style shell)."""
    result, out = run(research_loop(head, expr))
    assert result.success, result.error_in_exec
    return out


def cli(*args: str) -> str:
    done = subprocess.run([sys.executable, "-m", "caravanserai", *args], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.fixture
def story(project):
    first = cell("research-loop", "i * i")
    forked = cell("fork-cubes --from research-loop@5", "i ** 3")
    cell("fork-halves --from research-loop@5", "i / 2")
    assert "resumed" not in first and "forked" not in first
    assert "forked from research-loop (attempt 1, restored " in forked and "resumed" not in forked
    return project


def test_forks_with_different_code_diverge_at_the_first_step_after_the_fork_on_their_variables(story):
    result = compare(("fork-cubes", timeline("fork-cubes")), ("fork-halves", timeline("fork-halves")))
    assert result.shared_prefix == 5 and result.first_divergence == 6
    index = next(i for i, s in enumerate(result.steps) if s["step"] == 6)
    changes = result.changes(index)
    named = {c["name"] for c in changes[1]}
    assert "results" in named and "cell code" in named
    change = next(c for c in changes[1] if c["name"] == "results")
    assert (change["path"], change["old"], change["new"]) == ("results[5]", "125", "2.5")
    assert result.texts(index)[0].startswith("i = 5; results = {0: 0, 1: 1, 2: 4, 3: 9, 4: 16, 5: 125}")

    printed = cli("diff", "fork-cubes", "fork-halves")
    assert "first divergence at step 6" in printed
    # as the README shows it; a latency delta "(+3 ms)" appears where the two step-6 cells ran at different speeds
    row = r"^  ≠ step   6  cell code; results\[5\]: 125 → 2\.5(   \([^)]*\))?   <- first divergence$"
    assert re.search(row, printed, re.M), printed
    assert "results[5]: 125 → 2.5" in printed and "cell code changed" in printed
    assert "- " in printed and "i ** 3" in printed and "i / 2" in printed  # the code diff itself


def test_the_journal_holds_variables_as_plain_json_and_the_read_model_shows_them(story):
    lines = (story / ".caravanserai" / "research-loop" / "journal.jsonl").read_text().splitlines()
    waypoint = next(json.loads(line) for line in lines if '"waypoint"' in line and '"names"' in line)
    entry = waypoint["names"]["values"]["results"]
    assert "data" not in entry and isinstance(entry["value"], dict)  # nested JSON, not JSON inside a string
    assert not any('\\"$t\\"' in line for line in lines)
    view = inspect_run("research-loop")
    assert view.variables(3)["seen"] == {"$t": "set", "v": [0, 1, 2]}
    assert view.variables_shown(3) == {"results": "{0: 0, 1: 1, 2: 4}", "seen": "{0, 1, 2}", "i": "2"}
    shown = cli("show", "research-loop")
    assert "results = {0: 0, 1: 1, 2: 4, 3: 9" in shown and '{"_i"' not in shown


def test_fork_records_are_honest(story):
    cubes = inspect_run("fork-cubes")
    assert [a.number for a in cubes.attempts] == [1] and cubes.attempts[0].end == "completed"
    assert cubes.attempts[0].kind == "started" and cubes.attempts[0].started_at >= cubes.copied.ended_at
    assert cubes.copied is not None and (cubes.copied.parent, cubes.copied.first, cubes.copied.last) == \
        ("research-loop", 1, 5)
    assert cubes.copied.edited == () and "i ** 3" in (cubes.copied.code_changed or "")
    assert all(w.duration_s is None or w.duration_s >= 0 for w in cubes.waypoints)
    assert [w.copied for w in cubes.waypoints] == [True] * 5 + [False] * 15
    marker = next(e for e in read_events("fork-cubes") if e["type"] == "forked")
    assert "edited" not in marker and "code_changed" in marker
    steps = timeline("fork-cubes")
    parent = timeline("research-loop")
    assert [s.latency_s for s in steps[:5]] == [s.latency_s for s in parent[:5]]  # the parent's own times

    source = StepsSource("research-loop")
    source.poll()
    unedited = fork_step(source, 5, source.detail(4)["editable"], "panel-same")
    assert "edited" not in next(e for e in read_events(unedited.run_id) if e["type"] == "forked")
    assert "edited" not in inspect_run(unedited.run_id).waypoints[4].note


def test_forkpanel_edits_the_cells_variables_and_an_edited_cell_continues_the_fork(story):
    source = StepsSource("research-loop")
    source.poll()
    detail = source.detail(4)
    assert detail["edit"] == "variables" and "results = {0: 0, 1: 1, 2: 4, 3: 9, 4: 16}" in detail["editable"]
    with pytest.raises(UsageError, match="not a value"):
        fork_step(source, 5, "results = open('x')", "bad-edit")
    with pytest.raises(UsageError, match="saved no variable"):
        fork_step(source, 5, "nothing = 1", "bad-edit")
    assert not caravanserai.open_store().load("bad-edit")  # nothing written
    edited = detail["editable"].replace("4: 16}", "4: -1}")
    forked = fork_step(source, 5, edited, "panel-edit")
    marker = next(e for e in read_events("panel-edit") if e["type"] == "forked")
    assert marker["edited"] == ["results"]
    cell("panel-edit", "i * 100")  # the ForkPanel fork continued with an edited cell
    assert ip.user_ns["results"][4] == -1 and ip.user_ns["results"][5] == 500
    view = inspect_run(forked.run_id)
    assert view.status == "completed" and [a.number for a in view.attempts] == [1]
    assert "i * 100" in (view.copied.code_changed or "")
    result = compare(("research-loop", timeline("research-loop")), ("panel-edit", timeline("panel-edit")))
    assert result.first_divergence == 5
    rows = CompareSource(["research-loop", "panel-edit"])
    rows.poll()
    assert rows.traits()["jump"] >= 0
    detail = rows.detail(rows.traits()["jump"])
    assert any(c["path"] == "results[4]" for c in detail["columns"][1]["changes"])


def test_a_cell_edited_in_the_middle_of_its_own_run_is_still_refused(story):
    result, _ = run(research_loop("research-loop", "i + 1"))
    assert not result.success and type(result.error_in_exec).__name__ == "CellChanged"


def test_the_cli_follows_notebook_forks(story):
    tree = cli("lineage", "fork-halves")
    assert tree.splitlines()[0] == "fork tree of research-loop:"
    assert "└ fork-cubes  from waypoint 5; cell code changed" in tree and "+    results[i] = i / 2" in tree
    made = cli("fork", "research-loop", "--at", "7", "--as", "cli-fork")
    assert made.splitlines()[0] == "cli-fork" and made.splitlines()[-1].strip() == "%%resumable cli-fork"
    resumed = subprocess.run([sys.executable, "-m", "caravanserai", "resume", "cli-fork"], capture_output=True, text=True)
    assert resumed.returncode == 1 and "`%%resumable cli-fork`" in resumed.stderr  # never the fork command again
    cell("cli-fork", "-i")
    view = inspect_run("cli-fork")
    assert view.status == "completed" and [(a.number, a.end) for a in view.attempts] == [(1, "completed")]
    assert ip.user_ns["results"][6] == 36 and ip.user_ns["results"][7] == -7


def test_a_restart_reads_restarted_and_a_kill_free_history_has_no_killed_attempt(story):
    again = cell("research-loop --restart", "i + 1")
    assert "restarted (attempt 2" in again and "resumed" not in again
    view = inspect_run("research-loop")
    assert [(a.number, a.kind, a.end) for a in view.attempts] == [(1, "started", "completed"), (2, "restarted", "completed")]
    assert all(w.duration_s is not None and w.duration_s >= 0 for w in view.waypoints)
    assert "2. restarted" in cli("show", "research-loop", "--all")

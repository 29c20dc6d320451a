"""Forks of a ``%%resumable`` loop in a REAL Jupyter kernel, with a SIGKILL (the in-process story is test_notebook_forks.py).

One project, the default store ./.caravanserai (the kernel's cwd): the 20-item ``research-loop``
cell is SIGKILLed mid-loop, a new kernel re-runs it and it resumes at its last waypoint; two
``--from research-loop@5`` forks run different code; a ForkPanel-style fork edits a variable,
another edits nothing; both are continued in the kernel, the edited one with an edited cell. From the
test process, reading the store: Compare and ``diff`` find the first divergence at step 6 and name
``results``; fork markers say "edited" only for an edit; only the really killed attempt is "killed";
durations and latencies are never negative; each fork's attempts start at 1; ``lineage`` lists the
forks; the journal holds variables as plain nested JSON, never JSON inside a string.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

from kernel_helpers import Kernel, Reply, child_env, count, events, wait_for_waypoints
from research_loop import research_loop

from caravanserai.checkpoints.timelines import compare, timeline
from caravanserai.panels.steps import StepsSource, fork_step
from caravanserai.runs import inspect_run

ITEMS = 20
KILL_AFTER = 8  # waypoints in the journal before the SIGKILL
FORKS = ("fork-cubes", "fork-halves", "panel-same", "panel-edit")

def cell(k: Kernel, head: str, expr: str) -> Reply:
    got = k.run(research_loop(head, expr, pace=0.15))
    assert got.status == "ok", f"{head}: {got.ename}: {got.evalue}\n{got.stdout}"
    assert got.result == str(ITEMS), (head, got.result)
    return got


def results_of(k: Kernel) -> dict:
    return ast.literal_eval(k.ok("print(repr(results))").stdout.strip())


def cli(project: Path, *args: str) -> str:
    done = subprocess.run([sys.executable, "-m", "caravanserai", *args], capture_output=True, text=True, timeout=60,
                          cwd=project, env=child_env(project))
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_a_sigkilled_research_loop_resumes_and_its_forks_read_on_their_variables(tmp_path, project, kernel):
    store = str(tmp_path / ".caravanserai")

    # 1. the loop, SIGKILLed mid-loop, re-run in the restarted kernel: it resumes at its last waypoint
    k = kernel()
    k.ok("%load_ext caravanserai")
    k.submit(research_loop("research-loop", "i * i", pace=0.15))
    wait_for_waypoints(tmp_path, "research-loop", KILL_AFTER)
    k.kill_and_restart()
    at_kill = count(tmp_path, "research-loop", "waypoint")
    assert KILL_AFTER <= at_kill < ITEMS and count(tmp_path, "research-loop", "run_completed") == 0

    k.ok("%load_ext caravanserai")
    again = cell(k, "research-loop", "i * i")
    assert again.steps("item") == list(range(at_kill, ITEMS)), again.stdout  # only the items after the last waypoint
    assert any("resumed (attempt 2" in text and "results" in text for text in again.displays), again.displays
    assert results_of(k) == {i: i * i for i in range(ITEMS)}
    assert k.ok("print(sorted(seen))").stdout.strip() == str(list(range(7)))

    # 2. two forks from waypoint 5 with different code
    cubes = cell(k, "fork-cubes --from research-loop@5", "i ** 3")
    assert cubes.steps("item") == list(range(5, ITEMS)), cubes.stdout
    assert results_of(k) == {i: i * i if i < 5 else i ** 3 for i in range(ITEMS)}
    cell(k, "fork-halves --from research-loop@5", "i / 2")
    assert results_of(k) == {i: i * i if i < 5 else i / 2 for i in range(ITEMS)}

    # 3. ForkPanel-style forks (the panel's Python API, in the test process): one edits nothing, one edits results
    source = StepsSource("research-loop", store)
    source.poll()
    detail = source.detail(4)
    assert detail["edit"] == "variables" and "results = {0: 0, 1: 1, 2: 4, 3: 9, 4: 16}" in detail["editable"]
    fork_step(source, 5, detail["editable"], "panel-same")
    fork_step(source, 5, detail["editable"].replace("4: 16}", "4: -1}"), "panel-edit")
    edited = cell(k, "panel-edit", "i * 100")  # the ForkPanel fork continued with an edited cell
    assert edited.steps("item") == list(range(5, ITEMS)), edited.stdout
    got = results_of(k)
    assert got[4] == -1 and got[5] == 500 and got[19] == 1900 and got[3] == 9
    same = cell(k, "panel-same", "i * i")  # the unedited fork continued with the parent's own cell
    assert same.steps("item") == list(range(5, ITEMS)), same.stdout
    assert results_of(k) == {i: i * i for i in range(ITEMS)}

    # 4. what the store says, read from the test process
    result = compare(("fork-cubes", timeline("fork-cubes", store)), ("fork-halves", timeline("fork-halves", store)))
    assert result.first_divergence == 6
    step = next(s for s in result.to_dict()["steps"] if s["step"] == 6)  # to_dict() carries each changed step's changes
    named = {c["name"] for c in step["changes"][1]}
    assert "results" in named and "cell code" in named, step["changes"]
    change = next(c for c in step["changes"][1] if c["name"] == "results")
    assert (change["path"], change["old"], change["new"]) == ("results[5]", "125", "2.5")

    printed = cli(project, "diff", "fork-cubes", "fork-halves")
    assert "first divergence at step 6" in printed and "results[5]: 125 → 2.5" in printed, printed

    markers = {run: next(e for e in events(tmp_path, run) if e["type"] == "forked") for run in FORKS}
    assert "edited" not in markers["panel-same"] and "edited" not in markers["fork-cubes"]
    assert markers["panel-edit"]["edited"] == ["results"]

    parent = inspect_run("research-loop", store)
    assert parent.status == "completed"
    assert [(a.number, a.end) for a in parent.attempts] == [(1, "killed"), (2, "completed")]
    assert [a.kind for a in parent.attempts] == ["started", "resumed"]
    for run in ("research-loop", *FORKS):
        view = inspect_run(run, store)
        assert view.status == "completed", run
        if run != "research-loop":
            assert [(a.number, a.end) for a in view.attempts] == [(1, "completed")], (run, view.attempts)
            assert view.copied is not None and (view.copied.parent, view.copied.first, view.copied.last) == \
                ("research-loop", 1, 5)
            assert [w.copied for w in view.waypoints] == [True] * 5 + [False] * 15, run
        assert len(view.waypoints) == ITEMS, run
        assert all(w.duration_s is None or w.duration_s >= 0 for w in view.waypoints), (run, view.waypoints)
        assert all(s.latency_s is None or s.latency_s >= 0 for s in timeline(run, store)), run

    tree = cli(project, "lineage", "research-loop")
    assert all(fork in tree for fork in FORKS), tree

    for run in ("research-loop", *FORKS):
        raw = (tmp_path / ".caravanserai" / run / "journal.jsonl").read_text()
        assert '\\"$t\\"' not in raw, run  # a set is {"$t": "set", ...} in the JSON, not escaped inside a string
        assert not re.search(r'"data":\s*"[{\[]', raw), run  # no saved value as JSON text in a string

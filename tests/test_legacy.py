"""Run directories written by the REAL caravanserai 0.2.0 and 0.1.1 (tests/fixtures/legacy/).

Every test copies a fixture project's ``.caravanserai`` tree into its own tmp project first and
never writes into tests/fixtures. Numbers, notes and states come from expected.json (what the old
package itself returned), never from file mtimes or from re-deriving them with our own reader.

Our semantics differ from 0.2.0 on purpose in three places, asserted here:
- notes are kept exactly as written (0.2.0 ``.strip()``-ed them);
- ``show`` prints the state as JSON (0.2.0 printed the Python repr);
- a torn dir with the orphan ``waypoint-(latest+1).md`` resumes as waypoint latest+1 with that
  note and state.json's state (a consistent pair; 0.2.0 paired state N+1 with note N).
"""

from __future__ import annotations

import json
import math
import re
import shutil
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest

import caravanserai
from caravanserai import cli

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "legacy"
EXPECTED = json.loads((FIXTURES / "expected.json").read_text(encoding="utf-8"))
PYTHON = sys.executable

RUNS = [(pkg, run) for pkg in ("cvs020", "cvs01x") for run in sorted(EXPECTED["runs"][pkg])]
RUN_IDS = [f"{pkg}/{run}" for pkg, run in RUNS]
IMPORTED_FROM = {"cvs020": "caravanserai 0.2.0", "cvs01x": "caravanserai 0.1.x"}
ITEMS = [f"file-{k:02d}.csv" for k in range(1, 11)]

LIST_LINE = re.compile(r"(?P<run>[^\t]+)\t(?P<n>\d+) waypoint\(s\)\t(?P<age>\d+[smhd] ago|\?)\t"
                       r"(?P<status>pending|completed|failed|unknown)")
WAYPOINT_020 = re.compile(r"# Waypoint (\d+) - (\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\+00:00)\n\n(.*)\n", re.DOTALL)
HEADER_ANY = re.compile(r"# Waypoint (\d+) (?:-|\u2014) (\S+)")


# ---- helpers ------------------------------------------------------------------------------
def decode_floats(value: Any) -> Any:
    """expected.json writes non-finite floats as {"$float": "NaN"|"Infinity"|"-Infinity"}."""
    if isinstance(value, dict):
        if set(value) == {"$float"}:
            return float({"NaN": "nan", "Infinity": "inf", "-Infinity": "-inf"}[value["$float"]])
        return {k: decode_floats(v) for k, v in value.items()}
    if isinstance(value, list):
        return [decode_floats(v) for v in value]
    return value


def same(a: Any, b: Any) -> bool:
    """Deep equality where NaN equals NaN and int/float/bool are not mixed up."""
    if isinstance(a, float) and isinstance(b, float):
        return (math.isnan(a) and math.isnan(b)) or a == b
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return a == b


def info(pkg: str, run: str) -> dict:
    return EXPECTED["runs"][pkg][run]


def fixture_dir(pkg: str, run: str) -> Path:
    return FIXTURES / pkg / ".caravanserai" / run


def copy_store(pkg: str, project: Path, runs: list[str] | None = None) -> Path:
    """Copy the fixture project's .caravanserai (or only ``runs`` of it) into ``project``."""
    src = FIXTURES / pkg / ".caravanserai"
    dst = project / ".caravanserai"
    if runs is None:
        shutil.copytree(src, dst)
    else:
        dst.mkdir(exist_ok=True)
        for run in runs:
            shutil.copytree(src / run, dst / run)
    return dst


def snapshot(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir()) if p.is_file()}


def file_note(path: Path) -> str:
    """The note of a waypoint file exactly as written (minus the file's final newline)."""
    body = path.read_text(encoding="utf-8").partition("\n\n")[2]
    return body[:-1] if body.endswith("\n") else body


def header_time(path: Path) -> str:
    stamp = HEADER_ANY.match(path.read_text(encoding="utf-8")).group(2)
    return datetime.fromisoformat(stamp).astimezone(timezone.utc).isoformat(timespec="microseconds")


def ours(pkg: str, run: str) -> dict[str, Any]:
    """What our package must return for the run's latest waypoint.

    ``note`` is exact when expected.json holds the note that was passed (else None);
    ``note_stripped`` is always comparable with a ``.strip()``-ed note.
    """
    data = info(pkg, run)
    torn = data.get("torn") or {}
    state = decode_floats(data["load_latest"]["state"])
    if torn.get("orphan_waypoint"):
        n = torn["latest"] + 1
        note = file_note(fixture_dir(pkg, run) / f"waypoint-{n}.md")
        # The orphan note belongs to state.json's state: a consistent pair.
        assert note == f"note {n}" and state == {"step": n}
        return {"n": n, "state": state, "note": note, "note_stripped": note, "waypoints": list(range(1, n + 1))}
    n = data["load_latest"]["n"]
    written = data.get("checkpoints_written") or []
    note = written[-1]["note"] if written and written[-1]["n"] == n else None
    return {
        "n": n,
        "state": state,
        "note": note,
        "note_stripped": data["load_latest"]["note"],
        "waypoints": [k for k in data["waypoint_numbers"] if k <= n],
    }


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    capsys.readouterr()
    rc = cli.main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def run_child(project: Path, env: dict, source: str, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    script = project / "_legacy_child.py"
    script.write_text(source, encoding="utf-8")
    return subprocess.run([PYTHON, str(script), *args], cwd=project, env=env, capture_output=True,
                          text=True, encoding="utf-8", timeout=timeout)


def read_like_020(run_dir: Path) -> tuple[Any, str, int]:
    """caravanserai 0.2.0's load_latest, verbatim semantics (see the peer study, section 2)."""
    n = int((run_dir / "latest").read_text(encoding="utf-8"))
    state = json.loads((run_dir / "state.json").read_text(encoding="utf-8"))
    note = (run_dir / f"waypoint-{n}.md").read_text(encoding="utf-8").split("\n\n", 1)[1].strip()
    return state, note, n


def journal_events(run_dir: Path) -> list[dict]:
    lines = (run_dir / "journal.jsonl").read_text(encoding="utf-8").splitlines()
    return [json.loads(line) for line in lines]


def check_imported_prefix(pkg: str, run: str, events: list[dict], original: Path) -> int:
    """The journal starts with the old dir as events; returns how many events that prefix has."""
    expect = ours(pkg, run)
    first = events[0]
    assert first["seq"] == 0 and first["type"] == "run_started" and first["run_id"] == run
    assert first["imported_from"] == IMPORTED_FROM[pkg]
    assert first.get("command") == info(pkg, run).get("load_command")
    imported = events[1: 1 + len(expect["waypoints"])]
    assert [e["type"] for e in imported] == ["waypoint"] * len(expect["waypoints"])
    assert [e["n"] for e in imported] == expect["waypoints"]
    for event in imported:
        assert event["note"] == file_note(original / f"waypoint-{event['n']}.md")
        assert event["at"] == header_time(original / f"waypoint-{event['n']}.md")
    assert all("state" not in e for e in imported[:-1])
    assert same(imported[-1]["state"], expect["state"])
    assert [e["seq"] for e in events] == list(range(len(events)))
    return 1 + len(imported)


def check_old_files_untouched(pkg: str, run: str, run_dir: Path) -> None:
    """Every file the old package left (waypoints, meta.json, *.tmp) is byte-identical; views may move."""
    before = snapshot(fixture_dir(pkg, run))
    after = snapshot(run_dir)
    for name, data in before.items():
        if name in ("latest", "state.json"):
            continue
        assert after.get(name) == data, f"{name} changed"


def check_new_waypoint_files(run_dir: Path, numbers: list[int], notes: list[str]) -> None:
    for n, note in zip(numbers, notes):
        text = (run_dir / f"waypoint-{n}.md").read_text(encoding="utf-8")
        match = WAYPOINT_020.fullmatch(text)
        assert match, text
        assert int(match.group(1)) == n and match.group(3) == note


# ---- reading: list ------------------------------------------------------------------------
@pytest.mark.parametrize("pkg,run", RUNS, ids=RUN_IDS)
def test_list_shows_each_legacy_run(project, capsys, pkg, run):
    copy_store(pkg, project, [run])
    rc, out, err = run_cli(capsys, "list")
    assert rc == 0, err
    lines = out.splitlines()
    assert len(lines) == 1, out
    match = LIST_LINE.fullmatch(lines[0])
    assert match, lines[0]
    assert match["run"] == run
    assert match["status"] == "unknown"  # 0.2.0 never recorded whether a run finished: not "pending"
    # `latest` for every run, and latest+1 for the torn run with its orphan note (consistent pair).
    assert int(match["n"]) == ours(pkg, run)["n"]
    data = info(pkg, run)
    if not (data.get("torn") or {}).get("orphan_waypoint"):
        assert int(match["n"]) == int(data["latest_raw"].strip())


@pytest.mark.parametrize("pkg", ["cvs020", "cvs01x"])
def test_list_whole_fixture_store(project, capsys, pkg):
    """Same runs, same order and counts as the real old `list` printed (age/status column aside)."""
    copy_store(pkg, project)
    rc, out, err = run_cli(capsys, "list")
    assert rc == 0, err
    got = []
    for line in out.splitlines():
        match = LIST_LINE.fullmatch(line)
        assert match, line
        got.append((match["run"], int(match["n"])))
    assert got == [(run, ours(pkg, run)["n"]) for run in sorted(EXPECTED["runs"][pkg])]
    old_runs = [line.split("\t")[0] for line in EXPECTED["list"][pkg]["stdout"].splitlines()]
    assert [run for run, _ in got] == old_runs


def test_list_json_legacy(project, capsys):
    copy_store("cvs01x", project)
    rc, out, _ = run_cli(capsys, "list", "--json")
    assert rc == 0
    rows = json.loads(out)
    assert [r["run_id"] for r in rows] == ["old-iterate", "old-steps"]
    assert all(r["imported_from"] == "caravanserai 0.1.x" and r["command"] is None for r in rows)
    assert [r["waypoints"] for r in rows] == [3, 3]


# ---- reading: show ------------------------------------------------------------------------
@pytest.mark.parametrize("pkg,run", RUNS, ids=RUN_IDS)
def test_show_latest(project, capsys, pkg, run):
    copy_store(pkg, project, [run])
    expect = ours(pkg, run)
    rc, out, err = run_cli(capsys, "show", run)
    assert rc == 0, err
    head = f"waypoint {expect['n']}\n\n"
    assert out.startswith(head), out[:200]
    body, sep, state_line = out[len(head):].rpartition("\n\nstate: ")
    assert sep, out
    assert body.strip() == expect["note_stripped"].strip()
    if expect["note"] is not None:
        assert body == expect["note"]  # kept exactly as written, unlike 0.2.0
    if run == "nan-state":
        assert "NaN" in state_line and "Infinity" in state_line
        assert same(json.loads(state_line), expect["state"])  # Python's json reads its NaN tokens
    else:
        assert state_line == json.dumps(expect["state"], ensure_ascii=False) + "\n"
        assert json.loads(state_line) == expect["state"]


@pytest.mark.parametrize("pkg,run", RUNS, ids=RUN_IDS)
def test_show_all_lists_every_waypoint(project, capsys, pkg, run):
    copy_store(pkg, project, [run])
    expect = ours(pkg, run)
    rc, out, err = run_cli(capsys, "show", run, "--all")
    assert rc == 0, err
    blocks = out.rstrip("\n").split("\n\n" + "-" * 40 + "\n\n")
    assert [int(re.match(r"waypoint (\d+)\n", b).group(1)) for b in blocks] == expect["waypoints"]
    for block, n in zip(blocks, expect["waypoints"]):
        note = block[len(f"waypoint {n}\n\n"):]
        if n == expect["n"]:
            note = note.rpartition("\n\nstate: ")[0]
        assert note == file_note(fixture_dir(pkg, run) / f"waypoint-{n}.md")
    assert "\n\nstate: " in blocks[-1]


@pytest.mark.parametrize("pkg,run", RUNS, ids=RUN_IDS)
def test_show_json(project, capsys, pkg, run):
    copy_store(pkg, project, [run])
    expect = ours(pkg, run)
    rc, out, err = run_cli(capsys, "show", run, "--json", "--all")
    assert rc == 0, err
    summary = json.loads(out)
    assert summary["run_id"] == run
    assert summary["imported_from"] == IMPORTED_FROM[pkg]
    assert summary["command"] == info(pkg, run).get("load_command")
    assert summary["waypoints"] == expect["n"]
    assert summary["latest"]["n"] == expect["n"]
    assert summary["latest"]["note"].strip() == expect["note_stripped"].strip()
    assert same(summary["latest"]["state"], expect["state"])
    assert [h["n"] for h in summary["history"]] == expect["waypoints"]
    assert [("state" in h) for h in summary["history"]] == [n == expect["n"] for n in expect["waypoints"]]


# ---- reading: the library -----------------------------------------------------------------
@pytest.mark.parametrize("pkg,run", RUNS, ids=RUN_IDS)
def test_load_latest(project, pkg, run):
    copy_store(pkg, project, [run])
    expect = ours(pkg, run)
    state, note, n = caravanserai.load_latest(run)
    assert n == expect["n"]
    assert same(state, expect["state"])
    assert note.strip() == expect["note_stripped"].strip()
    if expect["note"] is not None:
        assert note == expect["note"]
    if not (info(pkg, run).get("torn") or {}).get("orphan_waypoint"):
        # Same (state, n) as the real old package, state key order and float specials included.
        assert n == info(pkg, run)["load_latest"]["n"]
        assert repr(state) == info(pkg, run)["load_latest"]["state_repr"]


def test_load_latest_nan_round_trip(project):
    copy_store("cvs020", project, ["nan-state"])
    state, _, n = caravanserai.load_latest("nan-state")
    assert n == 2
    assert math.isnan(state["loss"]) and state["best"] == math.inf and state["worst"] == -math.inf
    assert state["history"][0] == 1.5 and math.isnan(state["history"][1])
    assert state["history"][2:] == [math.inf, -math.inf]


def test_torn_run_resumes_from_state_json(project):
    """As 0.2.0: state.json (one ahead of `latest`) is the state; no orphan note, so note N."""
    copy_store("cvs020", project, ["torn"])
    torn = info("cvs020", "torn")["torn"]
    assert torn["orphan_waypoint"] is False and torn["state_step"] == torn["latest"] + 1
    assert caravanserai.load_latest("torn") == ({"step": torn["state_step"]}, f"note {torn['latest']}", torn["latest"])


def test_torn_orphan_run_is_a_consistent_pair(project):
    """Our improvement: the orphan waypoint-(latest+1).md is the note of state.json's state."""
    copy_store("cvs020", project, ["torn-orphan"])
    torn = info("cvs020", "torn-orphan")["torn"]
    assert torn["orphan_waypoint"] is True
    n = torn["latest"] + 1
    assert caravanserai.load_latest("torn-orphan") == ({"step": torn["state_step"]}, f"note {n}", n)
    assert torn["state_step"] == n
    history = caravanserai.history("torn-orphan")
    assert [w.n for w in history] == list(range(1, n + 1))
    assert [w.has_state for w in history] == [False] * (n - 1) + [True]


def test_latest_with_trailing_newline(project):
    copy_store("cvs020", project, ["latest-newline"])
    assert (project / ".caravanserai" / "latest-newline" / "latest").read_bytes() == b"2\n"
    assert caravanserai.load_latest("latest-newline") == ({"step": 2}, "checkpoint 2 of 2", 2)


@pytest.mark.parametrize("run", ["old-steps", "old-iterate"])
def test_em_dash_headers(project, run):
    copy_store("cvs01x", project, [run])
    run_dir = project / ".caravanserai" / run
    assert "\u2014" in (run_dir / "waypoint-1.md").read_text(encoding="utf-8").splitlines()[0]
    history = caravanserai.history(run)
    written = info("cvs01x", run)["checkpoints_written"]
    assert [(w.n, w.note) for w in history] == [(c["n"], c["note"]) for c in written]
    # timestamps come from the em-dash headers, not a placeholder
    assert [w.at for w in history] == [header_time(run_dir / f"waypoint-{w.n}.md") for w in history]


@pytest.mark.parametrize("pkg,run", [r for r in RUNS if info(*r).get("checkpoints_written")],
                         ids=[i for r, i in zip(RUNS, RUN_IDS) if info(*r).get("checkpoints_written")])
def test_history_notes_exactly_as_written(project, pkg, run):
    copy_store(pkg, project, [run])
    written = info(pkg, run)["checkpoints_written"]
    history = caravanserai.history(run)
    assert [w.n for w in history] == [c["n"] for c in written]
    assert [w.note for w in history] == [c["note"] for c in written]
    assert same(history[-1].state, decode_floats(written[-1]["state"]))


@pytest.mark.parametrize("pkg,run", RUNS, ids=RUN_IDS)
def test_load_command(project, pkg, run):
    copy_store(pkg, project, [run])
    if pkg == "cvs020":
        assert caravanserai.load_command(run) == info(pkg, run)["load_command"]
    else:
        assert caravanserai.load_command(run) is None


@pytest.mark.parametrize("pkg,run", RUNS, ids=RUN_IDS)
def test_reading_never_writes_into_an_old_dir(project, capsys, pkg, run):
    run_dir = copy_store(pkg, project, [run]) / run
    before = {p.name for p in run_dir.iterdir()}
    before_bytes = snapshot(run_dir)
    readers = [lambda argv=argv: run_cli(capsys, *argv)
               for argv in (["list"], ["show", run], ["show", run, "--all"], ["show", run, "--json"])]
    readers += [lambda f=f: f(run) for f in (caravanserai.load_latest, caravanserai.load_command,
                                              caravanserai.history, caravanserai.last_updated)]
    for read in readers:
        try:
            read()
        except Exception:
            pass  # failures to read are reported by the tests above; here only the files matter
    assert {p.name for p in run_dir.iterdir()} == before
    assert snapshot(run_dir) == before_bytes


# ---- resuming: @resumable -----------------------------------------------------------------
STEPS_CHILD = r'''
import json, sys
import caravanserai

@caravanserai.resumable
def work(run_id, state):
    done = []
    for step in range(state["step"] + 1, 6):
        n = caravanserai.checkpoint(run_id, {"step": step}, f"finished step {step}, next is step {step + 1}")
        done.append([step, n])
    return done

print(json.dumps(work(sys.argv[1], {"step": 0})))
'''


@pytest.mark.parametrize("pkg,run", [("cvs020", "steps-crashed"), ("cvs01x", "old-steps")])
def test_resumable_continues_after_step_3(project, child_env, capsys, pkg, run):
    run_dir = copy_store(pkg, project, [run]) / run
    proc = run_child(project, child_env, STEPS_CHILD, run)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == [[4, 4], [5, 5]]

    events = journal_events(run_dir)
    k = check_imported_prefix(pkg, run, events, fixture_dir(pkg, run))
    assert [e["type"] for e in events[k:]] == ["attempt", "waypoint", "waypoint", "run_completed"]
    assert [(e["n"], e["state"]) for e in events[k:] if e["type"] == "waypoint"] == [(4, {"step": 4}), (5, {"step": 5})]

    check_old_files_untouched(pkg, run, run_dir)
    check_new_waypoint_files(run_dir, [4, 5], ["finished step 4, next is step 5", "finished step 5, next is step 6"])
    assert read_like_020(run_dir) == ({"step": 5}, "finished step 5, next is step 6", 5)

    assert caravanserai.load_latest(run) == ({"step": 5}, "finished step 5, next is step 6", 5)
    rc, out, err = run_cli(capsys, "show", run)
    assert rc == 0, err
    assert out == 'waypoint 5\n\nfinished step 5, next is step 6\n\nstate: {"step": 5}\n'
    rc, out, _ = run_cli(capsys, "show", run, "--all")
    assert [int(m) for m in re.findall(r"^waypoint (\d+)$", out, re.M)] == [1, 2, 3, 4, 5]
    rc, out, _ = run_cli(capsys, "list")
    assert out.startswith(f"{run}\t5 waypoint(s)\t") and out.rstrip("\n").endswith("\tcompleted")


def test_resumable_on_finished_run_does_no_step(project, child_env):
    run_dir = copy_store("cvs020", project, ["steps-done"]) / "steps-done"
    proc = run_child(project, child_env, STEPS_CHILD, "steps-done")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == []
    check_old_files_untouched("cvs020", "steps-done", run_dir)
    assert not (run_dir / "waypoint-6.md").exists()
    assert read_like_020(run_dir) == ({"step": 5}, "finished step 5, next is step 6", 5)


TORN_CHILD = r'''
import json, sys
import caravanserai

@caravanserai.resumable
def work(run_id, state):
    step = state["step"] + 1
    return [step, caravanserai.checkpoint(run_id, {"step": step}, f"note {step}")]

print(json.dumps(work(sys.argv[1], {"step": 0})))
'''


@pytest.mark.parametrize("run", ["torn", "torn-orphan"])
def test_resume_torn_run(project, child_env, run):
    run_dir = copy_store("cvs020", project, [run]) / run
    torn = info("cvs020", run)["torn"]
    proc = run_child(project, child_env, TORN_CHILD, run)
    assert proc.returncode == 0, proc.stderr
    step, n = json.loads(proc.stdout)
    # state continues from state.json (one ahead of `latest`) in both cases
    assert step == torn["state_step"] + 1
    # numbering: after `latest` (0.2.0) or after the adopted orphan waypoint (ours)
    assert n == torn["latest"] + (2 if torn["orphan_waypoint"] else 1)
    events = journal_events(run_dir)
    check_imported_prefix("cvs020", run, events, fixture_dir("cvs020", run))
    check_old_files_untouched("cvs020", run, run_dir)  # the orphan waypoint and *.tmp leftovers too
    check_new_waypoint_files(run_dir, [n], [f"note {step}"])
    assert read_like_020(run_dir) == ({"step": step}, f"note {step}", n)
    assert caravanserai.load_latest(run) == ({"step": step}, f"note {step}", n)


# ---- resuming: resumable_iterate ----------------------------------------------------------
ITERATE_CHILD = r'''
import json, sys
import caravanserai

items = json.loads(sys.argv[2])
seen = []
for item in caravanserai.resumable_iterate(items, sys.argv[1]):
    seen.append(item)
print(json.dumps(seen))
'''


@pytest.mark.parametrize("pkg,run", [("cvs020", "iterate-crashed"), ("cvs01x", "old-iterate")])
def test_iterate_skips_done_items(project, child_env, capsys, pkg, run):
    run_dir = copy_store(pkg, project, [run]) / run
    data = info(pkg, run)
    done = data["load_latest"]["state"]["_i"]
    assert data["items"] == ITEMS and done == 3
    proc = run_child(project, child_env, ITERATE_CHILD, run, json.dumps(data["items"]))
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == data["items"][done:]

    events = journal_events(run_dir)
    check_imported_prefix(pkg, run, events, fixture_dir(pkg, run))
    check_old_files_untouched(pkg, run, run_dir)
    rc, out, err = run_cli(capsys, "show", run)
    assert rc == 0, err
    assert f"items done: {len(ITEMS)}" in out


@pytest.mark.parametrize("pkg,run", [("cvs020", "iterate-crashed"), ("cvs01x", "old-iterate")])
def test_iterate_second_pass_yields_nothing(project, child_env, pkg, run):
    copy_store(pkg, project, [run])
    for expected in (ITEMS[3:], []):
        proc = run_child(project, child_env, ITERATE_CHILD, run, json.dumps(ITEMS))
        assert proc.returncode == 0, proc.stderr
        assert json.loads(proc.stdout) == expected


ITERATE_KILLED_CHILD = r'''
import json, os, signal, sys
import caravanserai

items = json.loads(sys.argv[2])
for item in caravanserai.resumable_iterate(items, sys.argv[1]):
    print(item, flush=True)
    if item == sys.argv[3]:
        os.kill(os.getpid(), signal.SIGKILL)  # killed while processing this item
'''


@pytest.mark.parametrize("pkg,run", [("cvs020", "iterate-crashed"), ("cvs01x", "old-iterate")])
def test_iterate_killed_again_during_our_resume(project, child_env, capsys, pkg, run):
    """Old dir -> our loop is SIGKILLed on item 6 -> the next resume continues at item 6."""
    run_dir = copy_store(pkg, project, [run]) / run
    proc = run_child(project, child_env, ITERATE_KILLED_CHILD, run, json.dumps(ITEMS), "file-06.csv")
    assert proc.returncode == -9, proc.stderr
    assert proc.stdout.split() == ITEMS[3:6]
    proc = run_child(project, child_env, ITERATE_CHILD, run, json.dumps(ITEMS))
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == ITEMS[5:]
    check_old_files_untouched(pkg, run, run_dir)
    rc, out, err = run_cli(capsys, "show", run)
    assert rc == 0, err
    assert f"items done: {len(ITEMS)}" in out


@pytest.mark.parametrize("pkg,run", [("cvs020", "iterate-crashed"), ("cvs01x", "old-iterate")])
def test_iterate_keeps_the_0_2_0_view_current(project, child_env, pkg, run):
    """After our loop finishes, the dir read the 0.2.0 way says all 10 items are done.

    Otherwise 0.2.0 (or 0.2.0-style code reading `latest`/`state.json`/`load_latest()[0]["_i"]`)
    redoes items 4..10, and no waypoint-N.md shows the progress to a person.
    """
    run_dir = copy_store(pkg, project, [run]) / run
    proc = run_child(project, child_env, ITERATE_CHILD, run, json.dumps(ITEMS))
    assert proc.returncode == 0, proc.stderr
    state, note, n = read_like_020(run_dir)
    assert state == {"_i": len(ITEMS)}
    assert n > 3 and WAYPOINT_020.fullmatch((run_dir / f"waypoint-{n}.md").read_text(encoding="utf-8"))
    assert note == f"processed item {len(ITEMS)}/{len(ITEMS)}"


# ---- 0.2.0 keeps reading the dir after our writes -----------------------------------------
@pytest.mark.parametrize("run", ["steps-crashed", "notes-unicode", "latest-newline", "torn", "torn-orphan", "nan-state"])
def test_old_dir_stays_readable_by_0_2_0_after_checkpoint(project, run):
    run_dir = copy_store("cvs020", project, [run]) / run
    n = caravanserai.checkpoint(run, {"step": 99, "label": "ünï"}, "  written by us — ✓\n\nsecond paragraph  ")
    assert n == ours("cvs020", run)["n"] + 1
    caravanserai.open_store().flush_views()
    assert (run_dir / "journal.jsonl").is_file()
    assert int((run_dir / "latest").read_text(encoding="utf-8")) == n
    assert read_like_020(run_dir) == ({"step": 99, "label": "ünï"}, "written by us — ✓\n\nsecond paragraph", n)
    check_new_waypoint_files(run_dir, [n], ["  written by us — ✓\n\nsecond paragraph  "])
    check_old_files_untouched("cvs020", run, run_dir)
    assert caravanserai.load_latest(run) == ({"step": 99, "label": "ünï"}, "  written by us — ✓\n\nsecond paragraph  ", n)
    assert caravanserai.load_command(run) == info("cvs020", run)["load_command"]  # first command wins, as 0.2.0


# ---- CLI resume ---------------------------------------------------------------------------
RESUME_SCRIPT = r'''
import caravanserai

@caravanserai.resumable
def work(run_id, state):
    for step in range(state["step"] + 1, 5):
        n = caravanserai.checkpoint(run_id, {"step": step}, f"finished step {step}")
        print(f"did step {step} as waypoint {n}", flush=True)
    return state["step"]

work("handmade", {"step": 0})
'''


def make_020_run(store: Path, run_id: str, command: list[str] | None, steps: int, *, dash: str = "-") -> Path:
    """A run dir in 0.2.0's byte format (peer study section 3), written by hand."""
    run_dir = store / run_id
    run_dir.mkdir(parents=True)
    if command is not None:
        (run_dir / "meta.json").write_text(json.dumps({"command": command}, indent=2), encoding="utf-8")
    for n in range(1, steps + 1):
        (run_dir / f"waypoint-{n}.md").write_text(
            f"# Waypoint {n} {dash} 2026-11-29T22:27:3{n}+00:00\n\nfinished step {n}\n", encoding="utf-8")
    (run_dir / "state.json").write_text(json.dumps({"step": steps}, indent=2), encoding="utf-8")
    (run_dir / "latest").write_text(str(steps), encoding="utf-8")
    return run_dir


def test_cli_resume_of_a_0_2_0_dir_runs_its_command_once_signed(project, child_env):
    """0.2.0 signed nothing: its recorded command runs once the user has looked at it and signed it."""
    (project / "script.py").write_text(RESUME_SCRIPT, encoding="utf-8")
    run_dir = make_020_run(project / ".caravanserai", "handmade", [PYTHON, "script.py"], 2)
    originals = snapshot(run_dir)

    def cli(*argv: str) -> subprocess.CompletedProcess:
        return subprocess.run([PYTHON, "-m", "caravanserai", *argv], cwd=project, env=child_env, capture_output=True,
                              text=True, encoding="utf-8", timeout=60)

    refused = cli("resume", "handmade")
    assert refused.returncode == 1 and refused.stdout == f"the journal asks to run: {PYTHON} script.py\n"
    assert refused.stderr.count("\n") == 1 and "is not signed" in refused.stderr
    assert "caravanserai sign handmade" in refused.stderr and "caravanserai trust --store" in refused.stderr
    signed = cli("sign", "handmade", "--yes")
    assert signed.returncode == 0 and f"the recorded launch command: {PYTHON} script.py" in signed.stdout, signed.stderr
    proc = cli("resume", "handmade")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [
        f"resuming: {PYTHON} script.py",
        "did step 3 as waypoint 3",
        "did step 4 as waypoint 4",
    ]
    assert "Traceback" not in proc.stderr
    assert caravanserai.load_latest("handmade") == ({"step": 4}, "finished step 4", 4)
    assert read_like_020(run_dir) == ({"step": 4}, "finished step 4", 4)
    for name in ("meta.json", "waypoint-1.md", "waypoint-2.md"):
        assert (run_dir / name).read_bytes() == originals[name]
    events = journal_events(run_dir)
    assert events[0]["imported_from"] == "caravanserai 0.2.0" and events[0]["command"] == [PYTHON, "script.py"]


@pytest.mark.parametrize("run", ["old-steps", "old-iterate"])
def test_cli_resume_of_a_0_1_x_dir_says_no_command(project, child_env, run):
    run_dir = copy_store("cvs01x", project, [run]) / run
    proc = subprocess.run([PYTHON, "-m", "caravanserai", "resume", run], cwd=project, env=child_env,
                          capture_output=True, text=True, encoding="utf-8", timeout=60)
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert "no recorded command" in lines[0] and run in lines[0]
    assert snapshot(run_dir) == snapshot(fixture_dir("cvs01x", run))


def test_cli_resume_with_a_missing_interpreter_is_a_one_line_error(project, child_env):
    """The fixtures' meta.json names a throwaway venv python that other machines do not have."""
    run_dir = copy_store("cvs020", project, ["steps-crashed"]) / "steps-crashed"
    missing = str(project / "gone-venv" / "bin" / "python")
    command = [missing, *info("cvs020", "steps-crashed")["argv"]]
    (run_dir / "meta.json").write_text(json.dumps({"command": command}, indent=2), encoding="utf-8")
    proc = subprocess.run([PYTHON, "-m", "caravanserai", "resume", "steps-crashed", "--yes"], cwd=project, env=child_env,
                          capture_output=True, text=True, encoding="utf-8", timeout=60)
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("caravanserai: error:") and missing in lines[0], proc.stderr


# ---- what is (not) a run ------------------------------------------------------------------
def test_stray_files_and_empty_dirs_are_not_runs(project, capsys):
    store = copy_store("cvs01x", project)
    (store / "README").write_text("not a run\n", encoding="utf-8")
    (store / "notes.txt").write_text("x", encoding="utf-8")
    (store / "empty-dir").mkdir()
    (store / "junk-dir").mkdir()
    (store / "junk-dir" / "something.md").write_text("# hi\n", encoding="utf-8")
    rc, out, err = run_cli(capsys, "list")
    assert rc == 0, err
    assert [line.split("\t")[0] for line in out.splitlines()] == ["old-iterate", "old-steps"]
    rc, out, _ = run_cli(capsys, "list", "--json")
    assert [row["run_id"] for row in json.loads(out)] == ["old-iterate", "old-steps"]
    assert caravanserai.load_latest("empty-dir") is None
    assert (store / "README").read_text(encoding="utf-8") == "not a run\n"
    assert sorted(p.name for p in (store / "empty-dir").iterdir()) == []


def test_empty_store_dir_lists_nothing_without_error(project, capsys):
    (project / ".caravanserai").mkdir()
    (project / ".caravanserai" / "README").write_text("x", encoding="utf-8")
    rc, out, err = run_cli(capsys, "list")
    assert rc == 0 and err == ""
    assert "\t" not in out


@pytest.mark.parametrize("run_id", ["ünïcødé-日本", "a b", "..x"])
def test_0_2_0_only_run_ids_are_readable(project, capsys, run_id):
    """0.2.0 accepted ids our pattern rejects; such existing dirs stay readable (never created)."""
    store = project / ".caravanserai"
    run_dir = make_020_run(store, run_id, [PYTHON, "x.py"], 2)
    before = snapshot(run_dir)
    with pytest.raises(caravanserai.InvalidRunId):
        caravanserai.checkpoint(run_id, {"step": 3}, "nope")
    assert caravanserai.load_latest(run_id) == ({"step": 2}, "finished step 2", 2)
    assert caravanserai.load_command(run_id) == [PYTHON, "x.py"]
    rc, out, err = run_cli(capsys, "show", run_id)
    assert rc == 0, err
    assert out == 'waypoint 2\n\nfinished step 2\n\nstate: {"step": 2}\n'
    rc, out, err = run_cli(capsys, "show", run_id, "--json")
    assert rc == 0, err
    assert json.loads(out)["run_id"] == run_id
    if not run_id.startswith("."):
        rc, out, _ = run_cli(capsys, "list")
        assert [line.split("\t")[0] for line in out.splitlines()] == [run_id]
    assert snapshot(run_dir) == before


def test_unknown_run_id_not_0_2_0_readable_is_rejected(project, capsys):
    (project / ".caravanserai").mkdir()
    rc, out, err = run_cli(capsys, "show", "../x")
    assert rc != 0 and "Traceback" not in err and len(err.strip().splitlines()) == 1

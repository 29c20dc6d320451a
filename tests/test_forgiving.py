"""Forgiving by design: the 0.2.0 trail of a loop, bad values and bad commands as one typed line.

A finished ``resumable_iterate`` run leaves a readable waypoint per commit, as 0.2.0 did, without
ever overwriting a ``checkpoint()`` state; values JSON or UTF-8 cannot hold are refused before
anything is written; the CLI answers bad usage with one line and exit 2, keeps listing when one
journal is damaged, shows a failed run's failure and says when a torn tail was dropped.
"""

from __future__ import annotations

import json
import subprocess

import pytest
from conftest import PYTHON, kill9, need_module

import caravanserai
from caravanserai import SerializationError, checkpoint, durable, history, load_latest, resumable_iterate
from caravanserai.cli import main


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


# ---- the 0.2.0 trail of a loop ------------------------------------------------------------------
def test_a_finished_loop_leaves_one_readable_waypoint_per_item_as_0_2_0(project, capsys):
    for _ in resumable_iterate(["a", "b", "c"], run_id="loop"):
        pass
    assert load_latest("loop") == ({"_i": 3}, "processed item 3/3", 3)
    assert [(w.n, w.note, w.state) for w in history("loop")] == [
        (1, "processed item 1/3", {"_i": 1}), (2, "processed item 2/3", {"_i": 2}), (3, "processed item 3/3", {"_i": 3})]
    caravanserai.open_store().flush_views()
    run_dir = project / ".caravanserai" / "loop"
    assert (run_dir / "waypoint-3.md").read_text().endswith("\n\nprocessed item 3/3\n")
    assert json.loads((run_dir / "state.json").read_text()) == {"_i": 3} and (run_dir / "latest").read_text() == "3"
    code, out, _ = run_cli(capsys, "list")
    assert code == 0 and out.startswith("loop\t3 waypoint(s)\t") and out.rstrip().endswith("completed")


def test_a_loop_never_overwrites_a_checkpoint_state_on_the_same_run(project):
    with durable("mixed") as run:
        run.checkpoint({"total": 0}, "before the loop")
        total = 0
        for x in resumable_iterate([1, 2, 3]):
            total += x
        run.checkpoint({"total": total}, "after the loop")
    notes = [(w.n, w.note, w.state) for w in history("mixed")]
    assert notes == [(1, "before the loop", {"total": 0}), (2, "processed item 1/3", None),
                     (3, "processed item 2/3", None), (4, "processed item 3/3", None), (5, "after the loop", {"total": 6})]
    assert load_latest("mixed") == ({"total": 6}, "after the loop", 5)


def test_a_killed_loop_resumes_from_its_trail_and_keeps_numbering(project, child_env):
    script = project / "loop.py"
    script.write_text("import sys, time\nfrom caravanserai import resumable_iterate\n"
                      "for item in resumable_iterate(range(6), run_id='killed-loop'):\n"
                      "    print(item, flush=True)\n    time.sleep(0.2 if len(sys.argv) > 1 else 0)\n")
    proc = subprocess.Popen([PYTHON, str(script), "slow"], cwd=project, env=child_env, stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "0" and proc.stdout.readline().strip() == "1"
    kill9(proc)
    done = load_latest("killed-loop")[2]
    rest = subprocess.run([PYTHON, str(script)], cwd=project, env=child_env, capture_output=True, text=True, check=True)
    assert [int(x) for x in rest.stdout.split()] in (list(range(done, 6)), list(range(done - 1, 6)))
    assert load_latest("killed-loop") == ({"_i": 6}, "processed item 6/6", 6)
    assert [w.n for w in history("killed-loop")] == list(range(1, 7))


# ---- values JSON or UTF-8 cannot hold: one line, nothing written ------------------------------
def deep(levels: int) -> list:
    value: list = []
    for _ in range(levels):
        value = [value]
    return value


@pytest.mark.parametrize("state,note,problem", [
    ({"deep": deep(5000)}, "n", "nested too deeply"),
    ({"text": "half a pair \ud800"}, "n", "lone surrogate"),
    ({"ok": 1}, "a note with \udfff", "lone surrogate"),
    ({"when": {1, 2}}, "n", "set"),
    ({"x": float("nan")}, "n", "nan"),
])
def test_unstorable_values_are_one_line_and_write_nothing(project, state, note, problem):
    with pytest.raises(SerializationError) as info:
        checkpoint("bad-value", state, note)
    assert problem in str(info.value) and "\n" not in str(info.value) and info.value.code == "serialization_error"
    assert not (project / ".caravanserai" / "bad-value").exists()
    with durable("inside") as run:
        run.checkpoint({"fine": 1}, "first")
        with pytest.raises(SerializationError):
            run.checkpoint(state, note)
    assert [w.note for w in history("inside")] == ["first"]


# ---- the CLI -----------------------------------------------------------------------------------
@pytest.mark.parametrize("argv", [[], ["bogus"], ["show"], ["settle", "r", "c"], ["settle", "r", "c", "--result", "{x"],
                                  ["list", "--nope"]])
def test_bad_usage_is_one_line_and_exit_2(project, capsys, argv):
    code, out, err = run_cli(capsys, *argv)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("caravanserai: error: "), err


def test_list_marks_a_damaged_run_and_lists_the_others(project, capsys):
    for run_id in ("alpha", "broken", "gamma"):
        checkpoint(run_id, {"n": 1}, "one")
        checkpoint(run_id, {"n": 2}, "two")
    caravanserai.runs.close_all()
    path = project / ".caravanserai" / "broken" / "journal.jsonl"
    path.write_text(path.read_text().replace('"n":1', '"n":7'))
    code, out, _ = run_cli(capsys, "list")
    rows = {row.split("\t")[0]: row for row in out.splitlines()}
    assert code == 0 and set(rows) == {"alpha", "broken", "gamma"}
    assert rows["alpha"].endswith("pending") and rows["gamma"].endswith("pending")  # checkpoint() never completes
    assert rows["broken"].endswith("damaged") and "does not chain" in rows["broken"]
    code, out, _ = run_cli(capsys, "list", "--json")
    listed = {row["run_id"]: row for row in json.loads(out)}
    assert listed["broken"]["status"] == "damaged" and listed["broken"]["error"]["code"] == "journal_corruption"


def test_list_shows_an_emptied_journal_beside_its_views_as_damaged(project, capsys):
    for run_id in ("alpha", "emptied"):
        checkpoint(run_id, {"n": 1}, "one")
        checkpoint(run_id, {"n": 2}, "two")
    caravanserai.runs.close_all()
    store = caravanserai.open_store()
    store.flush_views()
    (project / ".caravanserai" / "emptied" / "journal.jsonl").write_bytes(b"")  # 0 bytes, waypoint-2.md still there
    assert set(store.journal_versions()) == {"alpha", "emptied"}  # the run index sees it
    code, out, _ = run_cli(capsys, "list")
    rows = {row.split("\t")[0]: row for row in out.splitlines()}
    assert code == 0 and set(rows) == {"alpha", "emptied"}
    assert rows["emptied"].endswith("damaged") and "holds no waypoint but the views show waypoint 2" in rows["emptied"]
    code, out, _ = run_cli(capsys, "list", "--json")
    listed = {row["run_id"]: row for row in json.loads(out)}
    assert listed["emptied"]["status"] == "damaged" and listed["emptied"]["error"]["code"] == "journal_corruption"
    assert (project / ".caravanserai" / "emptied" / "journal.jsonl").read_bytes() == b""  # listing wrote nothing


def test_show_of_a_failed_run_shows_the_failure(project, capsys):
    with pytest.raises(RuntimeError):
        with durable("fails"):
            raise RuntimeError("the API said no")
    code, out, _ = run_cli(capsys, "show", "fails")
    assert code == 0 and "no waypoints yet" not in out
    assert "status: failed" in out and "RuntimeError: the API said no" in out


def test_verify_reports_a_dropped_torn_tail(project, capsys):
    checkpoint("torn", {"n": 1}, "one")
    caravanserai.runs.close_all()
    path = project / ".caravanserai" / "torn" / "journal.jsonl"
    with open(path, "ab") as handle:
        handle.write(b'{"v":1,"seq":2,"at":"2026-')
    code, out, _ = run_cli(capsys, "verify", "torn")
    assert code == 0 and "torn last line of 26 bytes was dropped" in out
    assert load_latest("torn") == ({"n": 1}, "one", 1)  # the acknowledged waypoint is intact


# ---- the magics --------------------------------------------------------------------------------
@pytest.fixture
def shell(project):
    need_module("IPython", "notebook")
    from IPython.testing.globalipapp import get_ipython

    ip = get_ipython()
    ip.run_line_magic("load_ext", "caravanserai")
    yield ip
    ip.run_line_magic("unload_ext", "caravanserai")


def test_magic_usage_errors_are_ipython_usage_errors_and_help_prints(shell):
    from IPython.core.error import UsageError
    from IPython.utils.capture import capture_output

    for line in ("show", "--nope", "trust --key not-a-key", "show 'unclosed"):
        with pytest.raises(UsageError) as info:
            shell.run_line_magic("caravanserai", line)
        assert "\n" not in str(info.value)
    with capture_output() as captured:
        shell.run_line_magic("caravanserai", "--help")
    assert "usage: caravanserai" in captured.stdout
    with capture_output() as captured:
        result = shell.run_cell("%%resumable --help\nraise SystemExit('the body must not run')\n")
    assert result.success and "usage: %%resumable RUN_ID" in captured.stdout
    for bad in ("%%resumable", "%%resumable r --every 0", "%%resumable r --bogus"):
        with capture_output():
            result = shell.run_cell(f"{bad}\nx = 1\n")
        assert isinstance(result.error_in_exec, UsageError), (bad, result.error_in_exec)

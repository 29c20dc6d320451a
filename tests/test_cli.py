"""The CLI through real subprocesses: 0.2.0 output shapes, JSON, resume where it was launched."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from conftest import need

import caravanserai
from caravanserai import checkpoint, complete


def cli(*args: str, cwd: Path, env: dict, check_rc: int | None = 0) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-m", "caravanserai", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=60)
    if check_rc is not None:
        assert proc.returncode == check_rc, (proc.returncode, proc.stdout, proc.stderr)
    return proc


def test_version_and_help(project, child_env):
    out = cli("--version", cwd=project, env=child_env).stdout
    assert out.strip() == f"caravanserai {caravanserai.__version__}"
    assert "resume" in cli("--help", cwd=project, env=child_env).stdout


def test_list_empty_and_with_runs(project, child_env):
    assert cli("list", cwd=project, env=child_env).stdout == "no runs yet\n"
    (project / ".caravanserai").mkdir()
    assert cli("list", cwd=project, env=child_env).stdout == "no runs yet\n"
    checkpoint("b-run", {"step": 1}, "one")
    checkpoint("b-run", {"step": 2}, "two")
    checkpoint("a-run", {"step": 1}, "one")
    complete("a-run")
    lines = cli("list", cwd=project, env=child_env).stdout.splitlines()
    assert [line.split("\t")[:2] for line in lines] == [["a-run", "1 waypoint(s)"], ["b-run", "2 waypoint(s)"]]
    assert lines[0].split("\t")[2].endswith("s ago") and lines[0].split("\t")[3] == "completed"
    rows = json.loads(cli("list", "--json", cwd=project, env=child_env).stdout)
    assert [(r["run_id"], r["status"], r["waypoints"]) for r in rows] == [("a-run", "completed", 1), ("b-run", "pending", 2)]


def test_show_latest_all_and_json(project, child_env):
    checkpoint("demo", {"step": 4}, "finished step 4/5")
    checkpoint("demo", {"step": 5, "ok": True, "name": "ü"}, "finished step 5/5")
    out = cli("show", "demo", cwd=project, env=child_env).stdout
    assert out == 'waypoint 2\n\nfinished step 5/5\n\nstate: {"step": 5, "ok": true, "name": "ü"}\n'
    everything = cli("show", "demo", "--all", cwd=project, env=child_env).stdout
    assert everything.index("waypoint 1") < everything.index("waypoint 2")
    data = json.loads(cli("show", "demo", "--json", "--all", cwd=project, env=child_env).stdout)
    assert data["latest"]["state"]["step"] == 5 and [h["n"] for h in data["history"]] == [1, 2]
    assert data["status"] == "pending" and data["attempts"] == 1


@pytest.mark.parametrize("command", [["show", "ghost"], ["resume", "ghost"], ["clean", "ghost"], ["show", "../x"],
                                     ["show", "a b"]])
def test_errors_are_one_line_and_non_zero(project, child_env, command):
    proc = cli(*command, cwd=project, env=child_env, check_rc=1)
    assert proc.stdout == ""
    assert len(proc.stderr.strip().splitlines()) == 1 and proc.stderr.startswith("caravanserai: error: ")
    assert "Traceback" not in proc.stderr


def test_usage_errors_exit_2(project, child_env):
    assert cli(cwd=project, env=child_env, check_rc=2).returncode == 2
    assert "invalid choice" in cli("bogus", cwd=project, env=child_env, check_rc=2).stderr


def test_corrupt_journal_is_one_line(project, child_env):
    checkpoint("r", {"a": 1}, "x")
    checkpoint("r", {"a": 2}, "y")
    caravanserai.runs.close_all()
    path = project / ".caravanserai" / "r" / "journal.jsonl"
    path.write_text(path.read_text().replace('"a":1', '"a":9'))
    proc = cli("show", "r", cwd=project, env=child_env, check_rc=1)
    assert "does not chain" in proc.stderr and len(proc.stderr.splitlines()) == 1


def test_clean(project, child_env):
    checkpoint("r", {"a": 1}, "x")
    caravanserai.runs.close_all()
    assert cli("clean", "r", cwd=project, env=child_env).stdout == "deleted checkpoints for 'r'\n"
    assert (cli("clean", "r", cwd=project, env=child_env, check_rc=1).stderr.strip()
            == f"caravanserai: error: no run 'r' in {(project / '.caravanserai').as_uri()}: "
            "check the id with `caravanserai list` (`%caravanserai list` in a notebook)")


def test_clean_refuses_a_run_another_process_writes(project, child_env):
    holder = subprocess.Popen(
        [sys.executable, "-c",
         "import caravanserai,sys,time; caravanserai.checkpoint('busy', {}, 'n'); print('ok', flush=True); time.sleep(30)"],
        cwd=project, env=child_env, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "ok"
        proc = cli("clean", "busy", cwd=project, env=child_env, check_rc=1)
        assert f"pid {holder.pid}" in proc.stderr
    finally:
        holder.kill()
        holder.wait()
    assert cli("clean", "busy", cwd=project, env=child_env).returncode == 0


STEPS = """
from caravanserai import checkpoint, resumable
import sys

@resumable
def task(run_id, state):
    step = state.get("step", 0)
    while step < 3:
        step += 1
        print("step", step, flush=True)
        checkpoint(run_id, {"step": step}, f"step {step}")
        if step == 1 and "--crash" in sys.argv:
            raise SystemExit(3)

task("steps", {})
"""


def test_resume_replays_the_command_in_its_launch_directory(project, child_env, tmp_path):
    work = project / "work"
    work.mkdir()
    (work / "job.py").write_text(STEPS)
    first = subprocess.run([sys.executable, "job.py", "--crash"], cwd=work, env=child_env, capture_output=True, text=True)
    assert first.returncode == 3 and first.stdout.split() == ["step", "1"]
    # resume from a different directory: the run lives in work/.caravanserai
    proc = cli("--store", str(work / ".caravanserai"), "resume", "steps", cwd=tmp_path, env=child_env, check_rc=None)
    assert proc.stdout.startswith("resuming: ") and f"(in {work})" in proc.stdout
    assert "job.py --crash" in proc.stdout  # quoted argv, replayed faithfully
    assert proc.returncode == 0, proc.stderr
    assert "step 2" in proc.stdout and "step 3" in proc.stdout and "step 1\n" not in proc.stdout.split("resuming")[1]
    again = cli("resume", "steps", "--store", str(work / ".caravanserai"), cwd=tmp_path, env=child_env, check_rc=1)
    assert "already completed" in again.stderr and "--force" in again.stderr
    forced = cli("resume", "steps", "--force", "--store", str(work / ".caravanserai"), cwd=tmp_path, env=child_env)
    assert forced.stdout.startswith("resuming: ")


def test_resume_works_for_python_dash_m(project, child_env):
    pkg = project / "jobpkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "steps.py").write_text(STEPS)
    (pkg / "__main__.py").write_text("from . import steps\n")
    first = subprocess.run([sys.executable, "-m", "jobpkg", "--crash"], cwd=project, env=child_env,
                           capture_output=True, text=True)
    assert first.returncode == 3, first.stderr
    sub = project / "elsewhere"
    sub.mkdir()
    proc = cli("--store", str(project / ".caravanserai"), "resume", "steps", cwd=sub, env=child_env)
    assert "-m jobpkg --crash" in proc.stdout and "step 3" in proc.stdout


def test_resume_propagates_the_child_exit_code(project, child_env):
    (project / "fail.py").write_text(textwrap.dedent("""
        import caravanserai, sys
        caravanserai.checkpoint("f", {"x": 1}, "n")
        sys.exit(7)
    """))
    subprocess.run([sys.executable, "fail.py"], cwd=project, env=child_env)
    assert cli("resume", "f", cwd=project, env=child_env, check_rc=7).returncode == 7


def test_resume_of_a_command_someone_else_signed_prints_it_and_needs_yes(project, child_env, tmp_path):
    """A run written by another person (another key, the same OS user): the command its journal names
    is printed and nothing runs without --yes, trust in the store or trust in their key."""
    url = caravanserai.open_store(f"sqlite:///{project / 'runs.db'}").url
    (project / "job.py").write_text(textwrap.dedent("""
        import pathlib, caravanserai
        pathlib.Path("marker").write_text("ran")
        caravanserai.checkpoint("shared", {"x": 1}, "one")
    """))
    colleague = {**child_env, "CARAVANSERAI_KEY_FILE": str(tmp_path / "colleague" / "key"),
                 "XDG_DATA_HOME": str(tmp_path / "colleague")}
    subprocess.run([sys.executable, "job.py"], cwd=project, env={**colleague, "CARAVANSERAI_STORE": url}, check=True)
    marker = project / "marker"
    marker.unlink()
    elsewhere = project / "elsewhere"
    elsewhere.mkdir()
    me = {**child_env, "XDG_DATA_HOME": str(tmp_path / "me")}
    refused = cli("resume", "shared", "--store", url, cwd=elsewhere, env=me, check_rc=1)
    assert refused.stdout.startswith("the journal asks to run: ") and "job.py" in refused.stdout
    assert refused.stderr.count("\n") == 1 and "--yes" in refused.stderr and "nothing was run" in refused.stderr
    assert "a key you do not trust" in refused.stderr and "caravanserai trust --key ed25519:" in refused.stderr
    assert not marker.exists()
    trusted = cli("resume", "shared", "--store", url, cwd=elsewhere, env={**me, "CARAVANSERAI_TRUSTED_STORES": url})
    assert trusted.stdout.startswith("resuming: ") and marker.exists()
    marker.unlink()
    confirmed = cli("resume", "shared", "--yes", "--store", url, cwd=elsewhere, env=me)
    assert confirmed.stdout.startswith("resuming: ") and marker.exists()
    marker.unlink()
    key = cli("key", "--quiet", cwd=project, env=colleague).stdout.strip()
    cli("trust", "--key", key, "--name", "colleague", cwd=project, env=me)
    after = cli("resume", "shared", "--store", url, cwd=elsewhere, env=me)
    assert after.stdout.startswith("resuming: ") and marker.exists()


def test_resume_runs_its_authors_command_whatever_the_modes_and_never_a_tampered_one(project, child_env):
    """Who owns the files plays no part: the author's signed command runs without asking in a store others
    could write; a command changed after signing is refused, --yes or not."""
    from durable_helpers import rewrite_journal

    (project / "job.py").write_text(textwrap.dedent("""
        import pathlib, caravanserai
        pathlib.Path("marker").write_text("ran")
        caravanserai.checkpoint("mine", {"x": 1}, "one")
    """))
    subprocess.run([sys.executable, "job.py"], cwd=project, env=child_env, check=True)
    store = project / ".caravanserai"
    (store / "mine").chmod(0o777)
    (project / "marker").unlink()
    assert cli("resume", "mine", cwd=project, env=child_env).stdout.startswith("resuming: ")
    assert (project / "marker").exists()
    (project / "marker").unlink()
    events = caravanserai.open_store(str(store)).events("mine")
    events[0]["orig_argv"] = [sys.executable, "-c", "import pathlib; pathlib.Path('marker').write_text('forged')"]
    rewrite_journal(store / "mine" / "journal.jsonl", events)
    for extra in ((), ("--yes",)):
        refused = cli("resume", "mine", *extra, cwd=project, env=child_env, check_rc=1)
        assert "recorded launch command of run 'mine' does not verify" in refused.stderr, refused.stderr
        assert "nothing was loaded or run" in refused.stderr and not (project / "marker").exists()


def test_console_script_entry_point(project, child_env):
    exe = Path(sys.executable).with_name("caravanserai")
    need(exe.exists(), "console script not installed next to this interpreter (run from an installed venv)")
    proc = subprocess.run([str(exe), "list"], cwd=project, env=child_env, capture_output=True, text=True)
    assert proc.returncode == 0 and proc.stdout == "no runs yet\n"


def test_verify_reports_each_run_and_fails_on_damage(project, child_env):
    checkpoint("good", {"a": 1}, "x")
    checkpoint("bad", {"a": 1}, "x")
    checkpoint("bad", {"a": 2}, "y")
    caravanserai.runs.close_all()
    from caravanserai.signing import identity

    key = identity().public[:16] + "…"  # the test session's key (conftest), the child's too
    assert cli("verify", cwd=project, env=child_env).stdout.splitlines() == [
        "bad\tok\t3 events", f"bad\tsigned\tlaunch command by yours ({key})",
        "good\tok\t2 events", f"good\tsigned\tlaunch command by yours ({key})"]
    path = project / ".caravanserai" / "bad" / "journal.jsonl"
    path.write_text(path.read_text().replace('"a":1', '"a":7'))
    out = cli("verify", cwd=project, env=child_env, check_rc=1).stdout
    assert out.startswith("bad\tDAMAGED\t") and "does not chain" in out and "good\tok" in out

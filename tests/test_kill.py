"""Real processes, really killed: SIGKILL/SIGINT at random instants, then resume and check the trail.

a. 200+ (``CARAVANSERAI_KILLS``) random SIGKILLs of a tight checkpoint loop accumulating in one
   journal (a fresh run every 50 kills): nothing acknowledged is lost, numbering is contiguous,
   note and state always belong together, and the views agree with the journal once refreshed.
b. Two processes on one run: the second gets RunLocked naming the first's pid and host, nothing
   is corrupted, and after the first is SIGKILLed the second takes over and continues numbering;
   a child forked by a writer neither appends through its copy of the writer nor keeps the run
   locked once the writer is SIGKILLed (local store and SQLite).
c. The seed README's two code samples, verbatim, SIGKILLed mid-run and re-run: they resume,
   redo at most one item per kill, process everything, and a finished re-run does nothing.
   Also: a reader re-rendering stale views must not lock a writer out; kills mid-render must not
   leave holes in the ``waypoint-N.md`` views nor stray temp files once views are refreshed.
d. ``demo.py``: the README transcript (Ctrl-C, run again, ``caravanserai show demo``).

Children live in ``tests/children/``. ``CARAVANSERAI_KILL_SEED`` replays a random kill schedule.
"""

from __future__ import annotations

import json
import os
import random
import re
import select
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections import Counter
from functools import cache
from pathlib import Path

import pytest
from conftest import kill9, load_child_module

import caravanserai
from caravanserai import journal
from caravanserai.runs import read_events

PYTHON = sys.executable
TESTS = Path(__file__).resolve().parent
CHILDREN = TESTS / "children"
REPO = TESTS.parent
TIGHT_LOOP = CHILDREN / "tight_loop.py"


_tight = load_child_module(TIGHT_LOOP)


@cache
def expected_pad(step: int) -> str:
    return _tight.pad(step)


def _env(child_env: dict[str, str], **extra: str) -> dict[str, str]:
    env = dict(child_env)
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra)
    return env


# ---- ack pipe ---------------------------------------------------------------------------------
class AckReader:
    """Reads ``"<n>\\n"`` acknowledgements a child writes to a pipe."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.buffer = b""
        self.acks: list[int] = []
        self.eof = False

    def _read(self, timeout: float) -> None:
        ready, _, _ = select.select([self.fd], [], [], timeout)
        if not ready:
            return
        chunk = os.read(self.fd, 65536)
        if not chunk:
            self.eof = True
            return
        self.buffer += chunk
        *lines, self.buffer = self.buffer.split(b"\n")
        self.acks.extend(int(line) for line in lines if line.strip())

    def wait_for(self, count: int, timeout: float = 20.0) -> bool:
        """True once ``count`` acks arrived; False on EOF (the child died by itself)."""
        deadline = time.monotonic() + timeout
        while len(self.acks) < count:
            if self.eof:
                return False
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"no {count} acks within {timeout}s (got {self.acks[-5:]})")
            self._read(min(left, 0.5))
        return True

    def drain(self, timeout: float = 10.0) -> list[int]:
        """Read to EOF (call after the writer is dead) and return every ack."""
        deadline = time.monotonic() + timeout
        while not self.eof:
            if time.monotonic() > deadline:
                raise AssertionError("ack pipe never reached EOF")
            self._read(0.5)
        assert not self.buffer.strip(), f"torn ack {self.buffer!r}"  # acks are tiny atomic writes
        os.close(self.fd)
        return self.acks


def spawn_tight(run_id: str, env: dict[str, str], cwd: Path, stderr, limit: int | None = None):
    read_fd, write_fd = os.pipe()
    try:
        args = [PYTHON, str(TIGHT_LOOP), run_id, str(write_fd)] + ([str(limit)] if limit is not None else [])
        proc = subprocess.Popen(args, pass_fds=(write_fd,), env=env, cwd=cwd,
                                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=stderr)
    finally:
        os.close(write_fd)
    return proc, AckReader(read_fd)


# ---- checking a run against its journal -------------------------------------------------------
WAYPOINT_MD = re.compile(r"# Waypoint (\d+) - (\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\+00:00)\n\n(.*)\n", re.S)


def check_views(run_dir: Path, last: dict) -> None:
    """``latest``, ``state.json`` and ``waypoint-<latest>.md`` agree with the journal's last waypoint."""
    n = last["n"]
    assert (run_dir / "latest").read_text(encoding="utf-8").strip() == str(n), f"latest view != {n}"
    assert json.loads((run_dir / "state.json").read_text(encoding="utf-8")) == last["state"], "state.json != journal"
    md = (run_dir / f"waypoint-{n}.md").read_text(encoding="utf-8")
    match = WAYPOINT_MD.fullmatch(md)
    assert match, f"waypoint-{n}.md is not in 0.2.0's format: {md[:200]!r}"
    assert int(match.group(1)) == n
    assert match.group(3) == last["note"], f"waypoint-{n}.md note {match.group(3)!r} != journal {last['note']!r}"


def check_all_waypoint_files(run_dir: Path, waypoints: list[dict]) -> None:
    """Every journal waypoint has a ``waypoint-N.md`` holding its note (no holes left by kills)."""
    missing, wrong = [], []
    for event in waypoints:
        path = run_dir / f"waypoint-{event['n']}.md"
        if not path.exists():
            missing.append(event["n"])
            continue
        match = WAYPOINT_MD.fullmatch(path.read_text(encoding="utf-8"))
        if not match or int(match.group(1)) != event["n"] or match.group(3) != event["note"]:
            wrong.append(event["n"])
    assert not missing and not wrong, (
        f"{len(missing)} of {len(waypoints)} waypoint-N.md views missing (first {missing[:10]}), "
        f"{len(wrong)} with the wrong note (first {wrong[:10]})")


def check_tight_run(run_id: str, run_dir: Path, acked: int) -> list[dict]:
    """Everything test (a) promises after a kill; returns the run's waypoint events."""
    events = read_events(run_id)  # decodes and verifies seq + hash chain: raises if corrupted
    waypoints = [e for e in events if e["type"] == "waypoint"]
    numbers = [e["n"] for e in waypoints]
    assert numbers == list(range(1, len(numbers) + 1)), f"waypoint numbers not contiguous: {numbers[-10:]}"
    last_n = numbers[-1] if numbers else 0
    assert last_n >= acked, f"acknowledged waypoint {acked} lost: journal ends at {last_n}"
    for event in waypoints:
        state = event["state"]
        assert event["note"] == f"note {state['step']}", (
            f"waypoint {event['n']}: note {event['note']!r} with state step {state['step']}")
        assert state["step"] == event["n"], f"waypoint {event['n']} holds step {state['step']}"
        assert state["pad"] == expected_pad(state["step"]), f"waypoint {event['n']}: state damaged"
    latest = caravanserai.load_latest(run_id)  # no writer holds the run: re-renders stale views
    if not waypoints:
        assert latest is None
        return waypoints
    last = waypoints[-1]
    assert latest == (last["state"], last["note"], last["n"])
    assert latest[1] == f"note {latest[0]['step']}"
    check_views(run_dir, last)
    return waypoints


# ---- a. random SIGKILLs of a tight checkpoint loop --------------------------------------------
@pytest.mark.slow
def test_random_sigkills_of_tight_checkpoint_loop(project: Path, child_env: dict[str, str]) -> None:
    kills = int(os.environ.get("CARAVANSERAI_KILLS", "200"))
    seed = int(os.environ.get("CARAVANSERAI_KILL_SEED", str(time.time_ns() % 2**32)))
    rng = random.Random(seed)
    env = _env(child_env)
    stats = Counter()
    started = time.monotonic()
    errors = project / "child-stderr.txt"
    run_id, acked, runs = None, 0, []
    with open(errors, "wb") as stderr:
        for k in range(kills):
            if k % 50 == 0:  # every 50 kills a fresh run as well
                run_id, acked, last_n = f"tight-{k // 50}", 0, 0
                runs.append(run_id)
            run_dir = project / ".caravanserai" / run_id
            proc, reader = spawn_tight(run_id, env, project, stderr)
            try:
                if rng.random() < 0.15:
                    # from the start: kills land in start-up, open (torn-tail repair) or the first checkpoints
                    time.sleep(rng.uniform(0.0, 0.12))
                    stats["from_start"] += 1
                else:
                    target = rng.randint(1, 12)
                    if not reader.wait_for(target):
                        proc.wait(timeout=30)
                        pytest.fail(f"kill {k} (seed {seed}): child died by itself, rc {proc.returncode}:\n"
                                    + errors.read_text(errors="replace")[-3000:])
                    time.sleep(rng.uniform(0.0, 0.030))
            finally:
                kill9(proc)
            acks = reader.drain()
            assert proc.returncode == -signal.SIGKILL, (
                f"kill {k} (seed {seed}): child exited {proc.returncode} before the kill:\n"
                + errors.read_text(errors="replace")[-3000:])
            first = last_n + 1  # numbering resumes after the journal's last waypoint, committed or not
            assert acks == list(range(first, first + len(acks))), f"kill {k} (seed {seed}): acks {acks[:5]}... not from {first}"
            acked = max([acked, *acks])
            stats["acks"] += len(acks)
            stats["no_ack"] += not acks
            journal_bytes = (run_dir / "journal.jsonl").read_bytes() if (run_dir / "journal.jsonl").exists() else b""
            stats["torn_tail"] += bool(journal_bytes) and not journal_bytes.endswith(b"\n")
            try:
                raw_last = _last_n(journal_bytes)
                stats["unacked_commit"] += max(acked, last_n) < raw_last  # killed between commit and ack
                view = (run_dir / "latest").read_text().strip() if (run_dir / "latest").exists() else None
                stats["stale_views"] += view != (str(raw_last) if raw_last else None)
                waypoints = check_tight_run(run_id, run_dir, acked)
                last_n = waypoints[-1]["n"] if waypoints else 0
            except AssertionError as exc:
                raise AssertionError(f"kill {k} of run {run_id} (seed {seed}): {exc}") from exc
        # the last run still works: a child that finishes normally continues the numbering
        proc, reader = spawn_tight(run_id, env, project, stderr, limit=3)
        proc.wait(timeout=60)
        acks = reader.drain()
    assert proc.returncode == 0, errors.read_text(errors="replace")[-3000:]
    first = last_n + 1
    assert acks == [first, first + 1, first + 2]
    waypoints = check_tight_run(run_id, project / ".caravanserai" / run_id, acks[-1])
    assert waypoints[-1]["n"] == acks[-1]
    for r in runs:  # after the refreshes every waypoint of every run has its note file, in 0.2.0's format
        check_all_waypoint_files(project / ".caravanserai" / r, [e for e in read_events(r) if e["type"] == "waypoint"])
    total = sum(len([e for e in read_events(r) if e["type"] == "waypoint"]) for r in runs)
    stats["leftover_tmp_files"] = sum(1 for r in runs for _ in (project / ".caravanserai" / r).glob(".*.tmp"))
    elapsed = time.monotonic() - started
    print(f"\n{kills} SIGKILLs (seed {seed}) over {len(runs)} runs in {elapsed:.1f}s: {total} waypoints, "
          + ", ".join(f"{key} {value}" for key, value in sorted(stats.items())))


def _last_n(journal_bytes: bytes) -> int:
    """The last complete waypoint number in raw journal bytes (0 if none)."""
    for line in reversed(journal_bytes[: journal_bytes.rfind(b"\n") + 1].splitlines()):
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if event.get("type") == "waypoint":
            return event["n"]
    return 0


# ---- b. two processes on one run --------------------------------------------------------------
HOLDER = r"""
import sys, time
import caravanserai
with caravanserai.durable("shared") as run:
    step = (run.state or {}).get("step", 0)
    while True:
        step += 1
        n = run.checkpoint({"step": step, "by": "A"}, f"A finished step {step}")
        print(n, flush=True)
        time.sleep(0.02)
"""

INTRUDER = r"""
import json, os, sys
import caravanserai
seen = caravanserai.load_latest("shared")  # reading never needs the lock
try:
    n = caravanserai.checkpoint("shared", {"step": -1, "by": "B"}, "B was here")
except caravanserai.RunLocked as exc:
    print(json.dumps({"locked": str(exc), "holder": getattr(exc, "holder", None), "seen": seen[2] if seen else None}))
    sys.exit(3)
print(json.dumps({"n": n, "pid": os.getpid(), "seen": seen[2] if seen else None}))
"""


def _run_intruder(project: Path, env: dict[str, str]) -> tuple[int, dict]:
    out = subprocess.run([PYTHON, "-c", INTRUDER], cwd=project, env=env, capture_output=True, text=True, timeout=60)
    assert out.stdout.strip(), out.stderr
    return out.returncode, json.loads(out.stdout.strip().splitlines()[-1])


def _check_shared(holder_acked: int) -> list[dict]:
    events = read_events("shared")  # decodes and verifies the whole chain
    waypoints = [e for e in events if e["type"] == "waypoint"]
    assert [e["n"] for e in waypoints] == list(range(1, len(waypoints) + 1))
    assert len(waypoints) >= holder_acked
    for e in waypoints:
        if e["state"]["by"] == "A":
            assert e["note"] == f"A finished step {e['state']['step']}" and e["state"]["step"] == e["n"]
    return waypoints


def test_second_process_gets_run_locked_then_takes_over_after_sigkill(project: Path, child_env: dict[str, str]) -> None:
    env = _env(child_env)
    holder = subprocess.Popen([PYTHON, "-c", HOLDER], cwd=project, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
    reader = AckReader(os.dup(holder.stdout.fileno()))  # drain() closes its own copy
    try:
        assert reader.wait_for(3), holder.stderr.read().decode(errors="replace") if holder.poll() is not None else "A died"
        rc, report = _run_intruder(project, env)
        assert rc == 3, f"B wrote into A's run: {report}"
        message = report["locked"]
        assert f"pid {holder.pid}" in message, message
        assert socket.gethostname() in message, message
        assert report["seen"] is not None and report["seen"] >= 3  # B could read while A writes
        assert holder.poll() is None, "A must be unaffected by B's attempt"
        reader.wait_for(len(reader.acks) + 2)  # A keeps checkpointing after B was turned away
        waypoints = _check_shared(len(reader.acks))
        assert all(e["state"]["by"] == "A" for e in waypoints)
        assert not any(e.get("pid") not in (None, holder.pid) for e in read_events("shared")), "B left an event"
    finally:
        kill9(holder)
    acks = reader.drain()
    holder.stdout.close()
    holder.stderr.close()
    assert acks == list(range(1, len(acks) + 1))
    a_waypoints = _check_shared(acks[-1])
    last_a = a_waypoints[-1]["n"]
    assert last_a >= acks[-1]

    rc, report = _run_intruder(project, env)  # the kernel dropped A's flock: B takes over
    assert rc == 0, report
    assert report["n"] == last_a + 1
    waypoints = _check_shared(last_a)
    assert waypoints[:-1] == a_waypoints
    assert waypoints[-1]["n"] == last_a + 1 and waypoints[-1]["note"] == "B was here"
    attempts = [e for e in read_events("shared") if e["type"] in ("run_started", "attempt")]
    assert [e.get("pid") for e in attempts] == [holder.pid, report["pid"]]
    assert caravanserai.load_latest("shared") == ({"step": -1, "by": "B"}, "B was here", last_a + 1)
    check_views(project / ".caravanserai" / "shared", waypoints[-1])


FORKER = r"""
import os, sys, time
import caravanserai
with caravanserai.durable("forked", store=sys.argv[1] if len(sys.argv) > 1 else None) as run:
    run.checkpoint({"by": "parent"}, "before the fork")
    child = os.fork()  # as multiprocessing's fork start method does: the child inherits every descriptor
    if child == 0:
        try:
            run.checkpoint({"by": "child"}, "from the child")
            os.write(1, b"CHILD WROTE\n")  # one write per line: parent and child share the pipe
        except caravanserai.LeaseLost:
            os.write(1, b"CHILD REFUSED\n")
        time.sleep(120)  # a worker that outlives its parent
        os._exit(0)
    os.write(1, f"FORKED {child}\n".encode())
    time.sleep(120)
"""


FORK_DURING_ACQUIRE = r"""
import os, threading, time
import caravanserai
from caravanserai.stores.local.store import LocalStore

opening, forked = threading.Event(), threading.Event()
open_journal = LocalStore._open_journal


def slow_open(self, lease):  # the lock is taken and the journal open: another thread forks now
    open_journal(self, lease)
    opening.set()
    forked.wait(30)


def fork_from_another_thread():
    opening.wait(30)
    child = os.fork()
    if child == 0:
        time.sleep(120)
        os._exit(0)
    os.write(1, f"FORKED {child}\n".encode())
    forked.set()


LocalStore._open_journal = slow_open
threading.Thread(target=fork_from_another_thread, daemon=True).start()
with caravanserai.durable("forked") as run:
    run.checkpoint({"by": "parent"}, "before the kill")
    os.write(1, b"CHILD REFUSED\n")  # nothing for the child to try here: it never held the lease
    time.sleep(120)
"""


def _forker(script: str, project: Path, env: dict[str, str], *args: str) -> tuple[subprocess.Popen, list[str], int | None]:
    """Start ``script``; its first two lines (within 60 s) and the pid of the child it forked."""
    proc = subprocess.Popen([PYTHON, "-c", script, *args], cwd=project, env=_env(env), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
    out, fd = b"", proc.stdout.fileno()
    deadline = time.monotonic() + 60
    while out.count(b"\n") < 2 and time.monotonic() < deadline:
        if select.select([fd], [], [], 0.5)[0]:
            chunk = os.read(fd, 4096)
            if not chunk:
                break
            out += chunk
    lines = out.decode(errors="replace").splitlines()
    child = next((int(line.split()[1]) for line in lines if line.startswith("FORKED ")), None)
    return proc, lines, child


def _stop_forker(proc: subprocess.Popen, child: int | None) -> None:
    kill9(proc)
    if child is not None:
        try:
            os.kill(child, signal.SIGKILL)
        except ProcessLookupError:
            pass
    proc.stdout.close()
    proc.stderr.close()


@pytest.mark.parametrize("script", [FORKER, FORK_DURING_ACQUIRE], ids=["while-held", "during-acquire"])
def test_a_forked_child_neither_writes_nor_keeps_the_run_locked_after_the_writer_is_killed(
        project: Path, child_env: dict[str, str], script: str) -> None:
    """The lock is a flock on an open file that a forked child shares: without closing its copies the child
    kept the run locked after the writer was SIGKILLed (RunLocked for as long as the child lived), and
    the child's inherited writer could append into the parent's journal. A fork from another thread
    while the writer was still opening the run (the lock taken, the journal being read) counts too."""
    writer, lines, child_pid = _forker(script, project, child_env)
    try:
        assert child_pid is not None and "CHILD REFUSED" in lines, (
            lines, writer.stderr.read().decode(errors="replace") if writer.poll() is not None else "")
        kill9(writer)
        os.kill(child_pid, 0)  # the child still runs, holding its copies of the parent's descriptors (now closed)
        with caravanserai.durable("forked") as run:  # the kernel dropped the writer's flock (else: RunLocked)
            assert run.state == {"by": "parent"}
            run.checkpoint({"by": "next"}, "after the takeover")
        events = read_events("forked")  # verified: numbering and hash chain
        assert [e["state"]["by"] for e in events if e["type"] == "waypoint"] == ["parent", "next"]
    finally:
        _stop_forker(writer, child_pid)


def test_a_forked_child_cannot_append_through_an_expiring_lease(project: Path, child_env: dict[str, str]) -> None:
    """The same on a store whose lease is a row with a TTL (SQLite): the child's copy of the lease carries the
    parent's token, so only forgetting it in the child keeps the child's appends out of the parent's run."""
    store = f"sqlite:///{project / 'runs.db'}"
    writer, lines, child_pid = _forker(FORKER, project, child_env, store)
    try:
        assert child_pid is not None and "CHILD REFUSED" in lines, (
            lines, writer.stderr.read().decode(errors="replace") if writer.poll() is not None else "")
        events = read_events("forked", store)
        assert [e["state"]["by"] for e in events if e["type"] == "waypoint"] == ["parent"]
    finally:
        _stop_forker(writer, child_pid)


WRITER = r"""
import os, sys, caravanserai
limit = int(sys.argv[1]) if len(sys.argv) > 1 else None
with caravanserai.durable("views") as run:
    step = (run.state or {}).get("step", 0)
    done = 0
    while limit is None or done < limit:
        step += 1
        done += 1
        n = run.checkpoint({"step": step, "pad": "x" * 2000}, f"note {step}")
        os.write(1, f"{n}\n".encode())  # one write: a kill cannot split an ack
"""


def test_views_complete_after_kill_and_next_writer(project: Path, child_env: dict[str, str]) -> None:
    """A SIGKILLed tight loop leaves its last views unrendered; the next writer (which does not
    call load_latest) and a later load_latest must leave every waypoint with its note file."""
    env = _env(child_env)
    run_dir = project / ".caravanserai" / "views"
    for _ in range(2):
        proc = subprocess.Popen([PYTHON, "-c", WRITER], cwd=project, env=env, stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        reader = AckReader(os.dup(proc.stdout.fileno()))
        try:
            assert reader.wait_for(len(reader.acks) + 400), "writer died"
        finally:
            kill9(proc)
        reader.drain()
        proc.stdout.close()
    out = subprocess.run([PYTHON, "-c", WRITER, "3"], cwd=project, env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    waypoints = [e for e in read_events("views") if e["type"] == "waypoint"]
    assert [e["n"] for e in waypoints] == list(range(1, len(waypoints) + 1))
    last = waypoints[-1]
    assert caravanserai.load_latest("views") == (last["state"], last["note"], last["n"])  # refreshes views
    check_views(run_dir, last)
    check_all_waypoint_files(run_dir, waypoints)


def _write_unrendered_run(project: Path, run_id: str, count: int) -> Path:
    """A run whose journal holds ``count`` waypoints and whose views were never rendered
    (written with ``views=False``, copied from elsewhere, or left by a starved renderer)."""
    events = [{"type": "run_started", "run_id": run_id, "pid": 1, "host": "elsewhere"}]
    events += [{"type": "waypoint", "n": i, "note": f"note {i}", "state": {"step": i}} for i in range(1, count + 1)]
    run_dir = project / ".caravanserai" / run_id
    run_dir.mkdir(parents=True)
    (run_dir / "journal.jsonl").write_text("\n".join(journal.encode(events, journal.Tail())[0]) + "\n")
    return run_dir


def _wait_for_file(path: Path, proc: subprocess.Popen, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert proc.poll() is None, f"child ended (rc {proc.returncode}) before {path.name} appeared"
        assert time.monotonic() < deadline, f"{path.name} never appeared"
        time.sleep(0.001)


def test_kills_mid_render_leave_no_stray_temp_files(project: Path, child_env: dict[str, str]) -> None:
    """Views are written as ``.<name>.<random>.tmp`` + rename; a kill mid-render leaves such a file.
    Unique names are never overwritten, so once views are refreshed none may remain (else every
    kill leaks one, up to the size of state.json, forever)."""
    count = 3000
    run_dir = _write_unrendered_run(project, "leaky", count)
    env = _env(child_env)
    rng = random.Random()
    reader = "import caravanserai; caravanserai.load_latest('leaky')"
    seen = 0
    for k in range(5):  # each reader re-renders the missing views and is SIGKILLed in the middle
        proc = subprocess.Popen([PYTHON, "-c", reader], cwd=project, env=env, stdin=subprocess.DEVNULL,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            _wait_for_file(run_dir / f"waypoint-{1 + k * 200}.md", proc)
            time.sleep(rng.uniform(0.0, 0.005))
        finally:
            kill9(proc)
        seen = len(list(run_dir.glob(".*.tmp")))
    caravanserai.load_latest("leaky")  # no writer: renders the rest
    check_views(run_dir, [e for e in read_events("leaky") if e["type"] == "waypoint"][-1])
    left = sorted(p.name for p in run_dir.glob(".*.tmp"))
    assert not left, f"{len(left)} temp files left by 5 kills mid-render (seen {seen} before the refresh): {left[:5]}"


READER = "import caravanserai; caravanserai.load_latest('busy')"


def test_reader_refreshing_views_never_locks_out_a_writer(project: Path, child_env: dict[str, str]) -> None:
    """``load_latest``/``caravanserai show`` re-render stale views under the run's lock; a writer
    starting meanwhile must still get the run (it may wait for the render), not RunLocked."""
    count = 2000
    run_dir = _write_unrendered_run(project, "busy", count)

    reader = subprocess.Popen([PYTHON, "-c", READER], cwd=project, env=_env(child_env),
                              stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        _wait_for_file(run_dir / "waypoint-1.md", reader)  # the reader is rendering views now
        rendering = reader.poll() is None
        try:
            with caravanserai.durable("busy") as run:
                n = run.checkpoint({"step": count + 1}, "writer")
        except caravanserai.RunLocked as exc:
            pytest.fail(f"a reader re-rendering views (pid {reader.pid}, still rendering: {rendering}) "
                        f"locked out the writer: {exc}")
    finally:
        reader.wait(timeout=120)
        reader.stderr.close()
    assert reader.returncode == 0
    assert n == count + 1
    waypoints = [e for e in read_events("busy") if e["type"] == "waypoint"]
    assert [e["n"] for e in waypoints] == list(range(1, count + 2))
    assert caravanserai.load_latest("busy") == ({"step": count + 1}, "writer", count + 1)
    check_views(run_dir, waypoints[-1])


# ---- c. the seed README samples, verbatim, killed and re-run ----------------------------------
def _lines(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").split() if path.exists() else []


def _kill_after_lines(proc: subprocess.Popen, log: Path, count: int, extra_sleep: float, timeout: float = 30.0) -> list[str]:
    """SIGKILL ``proc`` ``extra_sleep`` s after ``log`` reached ``count`` lines; returns the lines then."""
    deadline = time.monotonic() + timeout
    while len(_lines(log)) < count:
        if proc.poll() is not None:
            raise AssertionError(f"script ended (rc {proc.returncode}) before {count} log lines: {_lines(log)}")
        if time.monotonic() > deadline:
            kill9(proc)
            raise AssertionError(f"no {count} log lines within {timeout}s: {_lines(log)}")
        time.sleep(0.003)
    time.sleep(extra_sleep)
    kill9(proc)
    assert proc.returncode == -signal.SIGKILL, f"script ended by itself (rc {proc.returncode}) before the kill"
    return _lines(log)


def _run_to_end(script: Path, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    out = subprocess.run([PYTHON, str(script)], cwd=cwd, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return out


def test_seed_iterate_sample_killed_twice_resumes(project: Path, child_env: dict[str, str]) -> None:
    delay = 0.15
    env = _env(child_env, SEED_ITEM_DELAY=str(delay))
    script = shutil.copy(CHILDREN / "seed_iterate.py", project / "seed_iterate.py")
    log = project / "converted.log"
    items = [f"file-{i:02d}.txt" for i in range(1, 13)]
    rng = random.Random()

    kills = 0
    seen: list[str] = []
    for count in (3, 4):  # killed mid-item at the 3rd item, then again 4 items into the re-run
        proc = subprocess.Popen([PYTHON, str(script)], cwd=project, env=env, stdin=subprocess.DEVNULL,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        lines = _kill_after_lines(proc, log, len(seen) + count, rng.uniform(0.01, delay * 0.6))
        kills += 1
        new = lines[len(seen):]
        if seen:  # resumed, not restarted: picks up at the item in flight at the kill, or the next
            assert new[0] in (seen[-1], items[items.index(seen[-1]) + 1]), f"restarted? {seen} then {new}"
        seen = lines
    before_end = list(seen)
    _run_to_end(script, project, env)
    lines = _lines(log)
    assert lines[len(before_end)] in (before_end[-1], items[items.index(before_end[-1]) + 1]), lines
    assert set(lines) == set(items), f"items never processed: {sorted(set(items) - set(lines))}"
    positions = [items.index(name) for name in lines]
    assert positions == sorted(positions), f"went backwards (restart?): {lines}"
    duplicates = len(lines) - len(set(lines))
    assert duplicates <= kills, f"{duplicates} items redone after {kills} kills: {lines}"
    assert max(Counter(lines).values()) <= 2, lines

    _run_to_end(script, project, env)  # a finished run does no work
    assert _lines(log) == lines


def test_seed_steps_sample_killed_resumes(project: Path, child_env: dict[str, str]) -> None:
    delay = 0.2
    env = _env(child_env, SEED_STEP_DELAY=str(delay))
    script = shutil.copy(CHILDREN / "seed_steps.py", project / "seed_steps.py")
    log = project / "steps.log"
    proc = subprocess.Popen([PYTHON, str(script)], cwd=project, env=env, stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    before = _kill_after_lines(proc, log, 2, delay * 0.4)  # mid step 2
    assert before == [str(i) for i in range(1, len(before) + 1)], before
    saved = caravanserai.load_latest("my-run")
    done = saved[0]["step"] if saved else 0
    _run_to_end(script, project, env)
    steps = [int(s) for s in _lines(log)]
    assert steps[len(before)] == done + 1, f"re-run did not resume after step {done}: {steps}"
    assert steps == sorted(steps) and steps[0] == 1 and steps.count(1) == 1, f"restarted: {steps}"
    assert set(steps) == {1, 2, 3, 4, 5}
    assert len(steps) - 5 <= 1, f"more than one step redone after one kill: {steps}"
    waypoints = caravanserai.history("my-run")
    assert [(w.n, w.state, w.note) for w in waypoints] == [
        (n, {"step": n}, f"finished step {n}, next is step {n + 1}") for n in range(1, 6)
    ]
    assert caravanserai.load_latest("my-run") == ({"step": 5}, "finished step 5, next is step 6", 5)

    _run_to_end(script, project, env)  # a finished run does no work
    assert [int(s) for s in _lines(log)] == steps
    assert len(caravanserai.history("my-run")) == 5


# ---- d. demo.py -------------------------------------------------------------------------------
def test_demo_transcript(project: Path, child_env: dict[str, str]) -> None:
    demo = REPO / "demo.py"
    assert demo.is_file(), f"{demo} is missing (the README's `python demo.py`)"
    shutil.copy(demo, project / "demo.py")
    env = _env(child_env, CARAVANSERAI_DEMO_DELAY="0.3")
    steps = [f"[{i}/5] doing work..." for i in range(1, 6)]

    proc = subprocess.Popen([PYTHON, "demo.py"], cwd=project, env=env, stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    first: list[str] = []
    try:
        deadline = time.monotonic() + 30
        while steps[2] not in first:
            line = proc.stdout.readline()
            assert line, f"demo ended before [3/5]: {first}"
            first.append(line.rstrip("\n"))
            assert time.monotonic() < deadline
        time.sleep(0.15)  # Ctrl-C in the middle of the step after "[3/5]" appeared
        proc.send_signal(signal.SIGINT)
        rest, _ = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            kill9(proc)
    first += rest.splitlines()
    assert proc.returncode != 0, first
    assert "crashed/killed mid-task. run me again - I'll resume, not restart." in first, first
    printed = [line for line in first if line.startswith("[")]
    assert printed == steps[: len(printed)] and len(printed) in (3, 4), first
    assert "done." not in first

    saved = caravanserai.load_latest("demo")
    done = saved[0]["step"] if saved else 0
    assert done == len(printed), f"[{len(printed)}/5] was printed but the journal holds step {done}: {saved}"

    again = subprocess.run([PYTHON, "demo.py"], cwd=project, env=env, capture_output=True, text=True, timeout=60)
    assert again.returncode == 0, again.stderr
    out = again.stdout.splitlines()
    assert out[0] == steps[done], f"re-run after step {done} should start at step {done + 1}: {out}"
    assert out == steps[done:] + ["done."], out

    show = subprocess.run([PYTHON, "-m", "caravanserai", "show", "demo"], cwd=project, env=env,
                          capture_output=True, text=True, timeout=60)
    assert show.returncode == 0, show.stderr
    assert show.stdout.rstrip("\n") == 'waypoint 5\n\nfinished step 5/5\n\nstate: {"step": 5}', show.stdout

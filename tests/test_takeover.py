"""Several processes on one shared store: progress read while writing, takeover after a SIGKILL once
the lease expires, and a writer paused past its lease (SIGSTOP/SIGCONT) that can no longer append.

Run on PostgreSQL (real server), S3 (moto on loopback), SQLite and the journal service, with 3-second leases.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from conftest import need_module

import caravanserai
from caravanserai.runs import read_events

CHILD = str(Path(__file__).parent / "children" / "shared_writer.py")
TTL_MS = 3000


@pytest.fixture
def postgres_url(pg):
    return lambda: f"{pg.dsn}?table=t_{uuid.uuid4().hex[:10]}&create_schema=1&lease_ttl_ms={TTL_MS}"


@pytest.fixture
def s3_url(s3):
    def make() -> str:
        bucket = f"take-{uuid.uuid4().hex[:10]}"
        s3.create_bucket(bucket)
        return (f"s3://{bucket}/runs?endpoint={s3.endpoint}&region=us-east-1&access_key_id=testing"
                f"&secret_access_key=testing&lease_ttl_ms={TTL_MS}")

    return make


@pytest.fixture
def http_url(tmp_path):
    """The journal service in front of a SQLite file, in a child process on loopback."""
    need_module("httpx", "http")
    from servers.journal_service import JournalServiceProcess

    token = "takeover-token-0123456789abcdef"
    service = JournalServiceProcess(f"sqlite:///{tmp_path}/behind-service.db?lease_ttl_ms={TTL_MS}", token)
    yield lambda: f"{service.url}/?token={token}&lease_ttl_ms={TTL_MS}"
    service.stop()


@pytest.fixture(params=["postgres", "s3", "sqlite", "http"])
def store_url(request, tmp_path):
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/shared.db?lease_ttl_ms={TTL_MS}"
    return request.getfixturevalue(f"{request.param}_url")()


def _writer(url: str, run_id: str, limit: int, delay: float, env: dict, by: str = "writer") -> subprocess.Popen:
    return subprocess.Popen([sys.executable, CHILD, url, run_id, str(limit), str(delay), by], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _read_until(proc: subprocess.Popen, step: int) -> list[str]:
    lines = []
    while True:
        line = proc.stdout.readline()
        assert line, f"writer ended early: {proc.stderr.read()}"
        lines.append(line.strip())
        if line.strip() == str(step):
            return lines


def test_reader_follows_writer_then_takes_over_after_sigkill(store_url, child_env):
    run_id = "shared-run"
    writer = _writer(store_url, run_id, 1000, 0.05, child_env)
    try:
        _read_until(writer, 3)
        seen = []
        for _ in range(5):  # another process reads the writer's progress while it writes
            latest = caravanserai.load_latest(run_id, store=store_url)
            seen.append(latest[0]["step"])
            time.sleep(0.1)
        assert seen == sorted(seen) and seen[-1] > seen[0] >= 3
        with pytest.raises(caravanserai.RunLocked) as info:
            caravanserai.checkpoint(run_id, {"step": -1}, "too early", store=store_url)
        assert f"pid {writer.pid}" in str(info.value)
        os.kill(writer.pid, signal.SIGKILL)
        writer.wait()
        killed_at = time.monotonic()
    finally:
        if writer.poll() is None:
            writer.kill()
    last = caravanserai.load_latest(run_id, store=store_url)[0]["step"]
    successor = _writer(store_url, run_id, last + 3, 0.0, child_env, by="successor")
    out, err = successor.communicate(timeout=120)
    # the dead writer's lease had to expire first (no stale lock left forever)
    assert successor.returncode == 0 or "LOCKED" in out, (out, err)
    while successor.returncode != 0:
        assert time.monotonic() - killed_at < TTL_MS / 1000 + 20, "never taken over"
        time.sleep(0.5)
        successor = _writer(store_url, run_id, last + 3, 0.0, child_env, by="successor")
        out, err = successor.communicate(timeout=120)
    assert out.split()[-1] == "DONE"
    waypoints = [e for e in read_events(run_id, store=store_url) if e["type"] == "waypoint"]
    assert [w["n"] for w in waypoints] == list(range(1, len(waypoints) + 1))
    assert waypoints[-1]["state"] == {"step": last + 3, "by": "successor"}
    assert all(w["note"] == f"step {w['state']['step']}" for w in waypoints)


def test_writer_paused_past_its_lease_cannot_append(store_url, child_env):
    run_id = "paused-run"
    writer = _writer(store_url, run_id, 1000, 0.05, child_env)
    try:
        _read_until(writer, 2)
        os.kill(writer.pid, signal.SIGSTOP)
        time.sleep(TTL_MS / 1000 + 0.5)
        taken = None
        for _ in range(40):
            try:
                caravanserai.checkpoint(run_id, {"step": 10_000, "by": "taker"}, "taken over", store=store_url)
                taken = True
                break
            except caravanserai.RunLocked:
                time.sleep(0.25)
        assert taken, "the paused writer's lease never expired"
        caravanserai.runs.close_all()
        os.kill(writer.pid, signal.SIGCONT)
        out, err = writer.communicate(timeout=60)
    finally:
        if writer.poll() is None:
            writer.kill()
    assert writer.returncode == 3 and "LEASE LOST" in out, (out, err)
    events = read_events(run_id, store=store_url)
    waypoints = [e for e in events if e["type"] == "waypoint"]
    taker = next(i for i, w in enumerate(waypoints) if w["state"]["by"] == "taker")
    assert taker == len(waypoints) - 1  # nothing the woken writer tried landed after the takeover


@pytest.mark.parametrize("reaped", [True, False], ids=["reaped", "zombie"])
def test_a_dead_holder_on_this_machine_is_taken_over_at_once(store_url, child_env, reaped):
    """A killed writer (kill -9, a killed kernel) on this machine: its lease goes at once, not after its TTL,
    also while its parent has not reaped it yet (a zombie); its token is fenced off all the same."""
    run_id = "dead-holder"
    writer = _writer(store_url, run_id, 1000, 0.05, child_env)
    try:
        _read_until(writer, 2)
        os.kill(writer.pid, signal.SIGKILL)
        if reaped:
            writer.wait()
        else:
            while Path(f"/proc/{writer.pid}/stat").read_bytes().rsplit(b")", 1)[1].split()[0] != b"Z":
                time.sleep(0.01)
        killed_at = time.monotonic()
        n = caravanserai.checkpoint(run_id, {"step": -1, "by": "successor"}, "taken over", store=store_url)
        assert time.monotonic() - killed_at < TTL_MS / 1000  # well before the dead writer's lease would expire
    finally:
        if writer.poll() is None:
            writer.kill()
    events = read_events(run_id, store=store_url)
    assert events[-1]["type"] == "waypoint" and events[-1]["n"] == n and events[-1]["note"] == "taken over", \
        [(e["seq"], e["type"], e.get("n"), e.get("note")) for e in events]
    assert sum(e["type"] in ("run_started", "attempt") for e in events) == 2


# ---- object storage: segment compaction under SIGKILL -----------------------------------------------------
SEGMENT_CHILD = str(Path(__file__).parent / "children" / "segment_writer.py")
KILL_POINTS = [  # (when, request kind, which one): every step of a compaction, on append and on release
    # ten appends: deltas 0-1 and 0-3, a segment through 5 (the deltas deleted), deltas 6-7 and 6-9, and on
    # release a segment through 10 (the segment through 5 and both deltas deleted, in one request each time)
    ("before", "delta", 1),  # the first delta not written
    ("after", "delta", 1),  # written, not yet in the head
    ("after", "head", 1),  # in the head
    ("after", "chunk", 6),  # chunk 5, which triggers the segment, is durable but not acknowledged
    ("before", "segment", 1),
    ("after", "segment", 1),  # written, the head still naming the deltas
    ("after", "head", 3),  # the head moved to it, the deltas it replaces not yet deleted
    ("after", "delete", 1),  # they are deleted
    ("after", "delta", 3),  # a delta after a segment, not yet in the head
    ("before", "segment", 2),  # release: the last segment not written
    ("after", "segment", 2),  # release: written, the head not moved
    ("after", "head", 6),  # release: the head moved, the segment and deltas replaced still there
    ("after", "delete", 2),  # release: they are deleted
    ("before", "release", 1),  # release: compacted, the lease object not yet given up
    ("after", "release", 1),  # released, then killed before saying so
]


def _chunks_only(store, run_id: str) -> list[str]:
    """The journal read the pre-segment way: every chunk, in order (what every segment must agree with)."""
    lines = []
    for key in _chunk_keys(store, run_id):
        data = store.bucket.get(key)
        lines += data.decode().split("\n") if data else []
    return lines


@pytest.mark.parametrize("point", KILL_POINTS, ids=["-".join(map(str, p)) for p in KILL_POINTS])
def test_segment_compaction_killed_at_every_point_keeps_every_acknowledged_event(s3_url, child_env, point):
    url, run_id = s3_url(), "compacted"
    child = subprocess.run([sys.executable, SEGMENT_CHILD, url, run_id, "10", *map(str, point)], env=child_env,
                           capture_output=True, text=True, timeout=120)
    assert child.returncode == -signal.SIGKILL, (child.stdout, child.stderr)
    acknowledged = [int(line) for line in child.stdout.split() if line.isdigit()]
    store = caravanserai.open_store(url)
    events = store.events(run_id)  # verified: seq 0, 1, 2... with no gap or repeat, the hash chain intact
    assert [e["i"] for e in events] == [e["seq"] for e in events] == list(range(len(events)))
    assert acknowledged == list(range(len(acknowledged))) and len(events) >= len(acknowledged)
    assert store.load(run_id) == _chunks_only(store, run_id)  # the newest segment agrees with the chunks
    # the next holder takes over at once (the killed one was on this machine), reads the same, appends
    successor = subprocess.run([sys.executable, SEGMENT_CHILD, url, run_id, "3", "after", "none", "0"],
                               env=child_env, capture_output=True, text=True, timeout=120)
    assert successor.returncode == 0 and successor.stdout.split()[-1] == "RELEASED", successor.stderr
    assert [int(x) for x in successor.stdout.split()[:-1]] == [len(events), len(events) + 1, len(events) + 2]
    after = store.events(run_id)
    assert [e["i"] for e in after] == list(range(len(events) + 3))
    assert after[:len(events)] == events
    assert store.load(run_id) == _chunks_only(store, run_id)
    assert store.bucket.list(f"{store.prefix}segments/{run_id}/") == [
        store._segment_key(run_id, len(_chunk_keys(store, run_id)) - 1), store._head_key(run_id)]  # no leftovers


def _chunk_keys(store, run_id: str) -> list[str]:
    return store.bucket.list(f"{store.prefix}journal/{run_id}/")

"""Faults a shared store meets under its writers (issue 24): a PostgreSQL restart under a writer, two
renewals of one object-store lease at once, a bucket that does not exist, and a block whose error
must survive a store that cannot record it. Real servers only: a private PostgreSQL cluster (it is
restarted) and the moto S3 server."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest
from conftest import need, need_module

import caravanserai
from caravanserai.errors import LeaseLost, RunLocked, StoreUnavailable
from caravanserai.stores import open_store


@pytest.fixture(scope="module")
def private_pg():
    """A PostgreSQL cluster of this module's own (a test restarts it), even where TEST_PG_DSN names a shared one."""
    from servers import pg_server

    need(pg_server.binaries() is not None, "no PostgreSQL server binaries (apt-get install postgresql)")
    server = pg_server.PgServer.start(private=True)
    try:
        yield server
    finally:
        server.stop()


def _pg_url(server) -> str:
    return f"{server.dsn}?table=t_{uuid.uuid4().hex[:10]}&create_schema=1&lease_ttl_ms=3000"


def _waypoints(store, run_id: str) -> list[int]:
    return [e["state"]["i"] for e in store.events(run_id) if e["type"] == "waypoint"]


def test_writers_continue_after_a_postgresql_restart_on_the_same_cached_store(private_pg):
    url = _pg_url(private_pg)
    store = open_store(url)
    acked: list[int] = []
    refused: list[StoreUnavailable] = []
    restarted = False
    while len(acked) < 12:
        try:
            with caravanserai.durable("through-restart", store=url) as run:
                for i in range(len(acked), 12):
                    if i == 5 and not restarted:
                        private_pg.restart()  # every connection dropped; back once it accepts again
                        restarted = True
                    run.checkpoint({"i": i}, f"step {i}")
                    acked.append(i)
        except StoreUnavailable as exc:  # the one statement that met the dropped connection
            refused.append(exc)
            assert "\n" not in str(exc) and exc.code == "store_unavailable"
            assert len(refused) == 1, "the store did not reconnect by itself"
    assert open_store(url) is store  # the same cached store, never closed by hand
    assert _waypoints(store, "through-restart") == list(range(12))  # every acknowledged step, once, in order
    ends = [e["type"] for e in store.events("through-restart") if e["type"] in ("run_failed", "run_completed")]
    assert ends[-1] == "run_completed" and len(ends) == 1 + len(refused)
    caravanserai.runs.close_all()


def test_two_tables_on_one_server_never_share_a_writer(private_pg):
    """The table is a URL option, so two stores on one server share their ``url``: the writer of a run in
    one must never write the other's (it did, through the process's writer registry)."""
    a, b = open_store(_pg_url(private_pg)), open_store(_pg_url(private_pg))
    assert a.url == b.url and a is not b
    caravanserai.checkpoint("same-id", {"i": 0}, "in a", store=a)
    caravanserai.checkpoint("same-id", {"i": 0}, "in b", store=b)
    caravanserai.checkpoint("same-id", {"i": 1}, "in a again", store=a)
    notes = {name: [e["note"] for e in s.events("same-id") if e["type"] == "waypoint"] for name, s in (("a", a), ("b", b))}
    assert notes == {"a": ["in a", "in a again"], "b": ["in b"]}
    caravanserai.runs.close_all()


def test_writers_starting_together_on_a_new_table_all_create_it_and_write(private_pg, child_env):
    """Eight processes open one new ``create_schema=1`` table at once: PostgreSQL's CREATE TABLE IF NOT
    EXISTS raced (a duplicate key in pg_type for the losers) and killed writers at start (CI, issue 24)."""
    url = _pg_url(private_pg)
    code = ("import sys, caravanserai\n"
            "caravanserai.checkpoint(sys.argv[2], {'i': 0}, 'first', store=sys.argv[1])\nprint('written')")
    procs = [subprocess.Popen([sys.executable, "-c", code, url, f"r{n}"], env=child_env, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE) for n in range(8)]
    results = [proc.communicate(timeout=120) for proc in procs]
    assert [(proc.returncode, out.strip()) for proc, (out, _) in zip(procs, results)] == [(0, "written")] * 8, \
        [err.strip().splitlines()[-1:] for _, err in results]
    store = open_store(url)
    assert [_waypoints(store, f"r{n}") for n in range(8)] == [[0]] * 8
    caravanserai.runs.close_all()


def test_an_error_in_the_block_survives_a_store_that_cannot_record_it(private_pg, capsys):
    url = _pg_url(private_pg)
    store = open_store(url)
    with pytest.raises(ValueError, match="the block's own error") as raised:
        with caravanserai.durable("unrecorded", store=url) as run:
            run.checkpoint({"i": 0}, "before")
            private_pg.pause()
            raise ValueError("the block's own error")
    private_pg.resume()
    notes = getattr(raised.value, "__notes__", [])
    assert any("could not be recorded (StoreUnavailable" in note for note in notes), notes
    assert "could not be recorded" in capsys.readouterr().err
    deadline = time.monotonic() + 30
    while True:  # the store fails fast for a moment after a failed reconnect, then connects again
        try:
            with caravanserai.durable("unrecorded", store=url) as run:  # resumes from its last waypoint
                assert run.state == {"i": 0}
            break
        except StoreUnavailable:
            assert time.monotonic() < deadline, "the store never reconnected"
            time.sleep(0.2)
    assert _waypoints(store, "unrecorded") == [0]
    caravanserai.runs.close_all()


def test_a_lease_released_while_the_store_could_not_be_told_is_taken_over_at_once(tmp_path):
    """The release of a lease failed (the database down): this process, which let it go, takes the run
    again at once instead of waiting out the lease (RunLocked naming itself)."""
    store = open_store(f"sqlite:///{tmp_path / 'runs.db'}?lease_ttl_ms=30000")
    lease = store.acquire("abandoned")

    def unreachable() -> None:
        raise StoreUnavailable("the database went away")

    lease._release_remote = unreachable
    lease.release()
    again = store.acquire("abandoned")  # a 30 s lease: without the rule this is RunLocked for 30 s
    assert again.token > lease.token  # fenced: the old lease can write nothing
    again.release()


@pytest.fixture
def bucket_url(s3):
    bucket = f"fleet-{uuid.uuid4().hex[:10]}"
    s3.create_bucket(bucket)
    return (f"s3://{bucket}/p?endpoint={s3.endpoint}&region=us-east-1&access_key_id=testing"
            "&secret_access_key=testing&lease_ttl_ms=3000")


def test_an_object_store_lease_is_renewed_by_one_thread_at_a_time(bucket_url):
    """The append path and the background thread renew the same lease: on S3 both compare-and-swap one
    e-tag, and before one-at-a-time the loser marked its own lease as taken over."""
    store = open_store(bucket_url)
    lease = store.acquire("renewed")
    lost: list[BaseException] = []

    def hammer() -> None:
        for _ in range(15):
            try:
                lease._renew_now()  # renew now, whoever renewed last
            except LeaseLost as exc:
                lost.append(exc)

    threads = [threading.Thread(target=hammer) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert lost == [] and lease.held
    lease.check()
    lease.release()
    with caravanserai.durable("renewed", store=store) as run:  # released cleanly: anyone may take it
        run.checkpoint({"i": 1}, "after")


def test_a_renewal_slower_than_the_lease_is_followed_by_another_before_the_next_append(tmp_path, monkeypatch):
    """An overloaded writer whose renewal took longer than the lease (here, a clock that jumps 3 s during
    the first one) learns little from it; it renews again, keeps the run nobody else took and appends."""
    from caravanserai.stores import leases

    store = open_store(f"sqlite:///{tmp_path}/slow.db?lease_ttl_ms=3000")
    with caravanserai.durable("slow", store=store) as run:
        run.checkpoint({"i": 1}, "before")
        lease = run._lease
        lease._stop.set()
        offset = [0.0]
        real_monotonic = time.monotonic
        clock = type("Clock", (), {"monotonic": staticmethod(lambda: real_monotonic() + offset[0])})
        monkeypatch.setattr(leases, "time", clock)
        calls = []
        renew = lease._renew

        def slow_renew() -> None:
            calls.append(offset[0])
            renew()
            if len(calls) == 1:
                offset[0] += 3.0  # this renewal "took" 3 s: longer than the 2.7 s its holder may trust it

        lease._renew = slow_renew
        lease._deadline = clock.monotonic()  # due now
        run.checkpoint({"i": 2}, "after a slow renewal")
        assert len(calls) == 2 and lease.held
    states = [e["state"]["i"] for e in caravanserai.runs.read_events("slow", store=store) if e["type"] == "waypoint"]
    assert states == [1, 2]


def test_a_release_that_gave_up_on_a_stuck_renewal_is_completed_by_that_renewal(tmp_path):
    """A renewal stuck on a slow store outlives the release that could not wait for it (0.1 s past the
    holder's deadline); when it succeeds after all it releases the lease itself, so the run is not locked
    for another TTL by a writer that already closed it."""
    store = open_store(f"sqlite:///{tmp_path}/stuck.db?lease_ttl_ms=3000")
    lease = store.acquire("stuck")
    lease._stop.set()
    renew, entered, go = lease._renew, threading.Event(), threading.Event()

    def stuck_renew() -> None:
        entered.set()
        go.wait(10)
        renew()

    lease._renew = stuck_renew
    lease._deadline = time.monotonic()  # late: the release waits only 0.1 s for the renewal
    renewal = threading.Thread(target=lease._renew_now)
    renewal.start()
    assert entered.wait(10)
    lease.release()  # gives up on the stuck renewal
    assert store._q("live_holder", ("stuck",))  # still live in the database: nothing could be released yet
    go.set()
    renewal.join(10)
    assert not store._q("live_holder", ("stuck",))  # the renewal, done, released the lease it had just extended


def test_a_missing_bucket_is_named_not_reported_as_a_locked_run(s3):
    url = (f"s3://no-such-bucket-{uuid.uuid4().hex[:6]}/p?endpoint={s3.endpoint}&region=us-east-1"
           "&access_key_id=testing&secret_access_key=testing")
    with pytest.raises(StoreUnavailable) as raised:
        with caravanserai.durable("r", store=url) as run:
            run.checkpoint({"i": 1}, "never")
    assert not isinstance(raised.value, RunLocked)
    assert "the bucket (or container) does not exist (NoSuchBucket)" in str(raised.value) and "\n" not in str(raised.value)


# ---- a fleet under faults: SIGKILL a quarter, SIGSTOP one past its lease, restart the server ---------
FLEET_CHILD = str(Path(__file__).parent / "children" / "fleet_writer.py")
TTL_S = 3.0


class Fleet:
    """Writer processes on one store, one run each (``fleet_writer.py``), with their acknowledgements."""

    def __init__(self, url: str, root: Path, env: dict) -> None:
        self.url, self.root, self.env = url, root, env
        self.procs: dict[str, list[subprocess.Popen]] = {}

    def start(self, run_id: str, *, exit_on_lease_lost: bool = False) -> subprocess.Popen:
        proc = subprocess.Popen([sys.executable, FLEET_CHILD, self.url, run_id, str(self.root / f"{run_id}.acks"),
                                 *(["exit-on-lease-lost"] if exit_on_lease_lost else [])],
                                env=self.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.procs.setdefault(run_id, []).append(proc)
        return proc

    def acks(self, run_id: str) -> list[int]:
        path = self.root / f"{run_id}.acks"
        return [int(x) for x in path.read_text().split()] if path.exists() else []

    def wait_for(self, run_id: str, count: int, timeout: float = 120) -> float:
        """Seconds until ``run_id`` has ``count`` acknowledgements in all."""
        started = time.monotonic()
        while len(self.acks(run_id)) < count:
            proc = self.procs[run_id][-1]
            if proc.poll() is not None:  # died: say why instead of waiting out the timeout
                out, err = proc.communicate()
                raise AssertionError(f"{run_id}: the writer exited {proc.returncode}: {(out + err).strip()[-2000:]}")
            assert time.monotonic() - started < timeout, f"{run_id}: stuck at {len(self.acks(run_id))} acks"
            time.sleep(0.02)
        return time.monotonic() - started

    def stop(self) -> None:
        for procs in self.procs.values():
            for proc in procs:
                if proc.poll() is None:
                    proc.send_signal(signal.SIGCONT)
                    proc.terminate()
        for procs in self.procs.values():
            for proc in procs:
                try:
                    proc.wait(30)
                except subprocess.TimeoutExpired:
                    proc.kill()


@pytest.fixture(params=["postgres", "s3", "http"])
def fleet_store(request, private_pg, tmp_path):
    """(url, restart or None) for a fleet: PostgreSQL (restarted with pg_ctl), S3 on moto, and the journal
    service in front of PostgreSQL (SIGKILLed and started again on its port)."""
    if request.param == "postgres":
        yield _pg_url(private_pg), private_pg.restart
    elif request.param == "s3":
        s3 = request.getfixturevalue("s3")
        bucket = f"fleet-{uuid.uuid4().hex[:10]}"
        s3.create_bucket(bucket)
        yield (f"s3://{bucket}/p?endpoint={s3.endpoint}&region=us-east-1&access_key_id=testing"
               "&secret_access_key=testing&lease_ttl_ms=3000"), None
    else:
        need_module("httpx", "http")
        from servers.journal_service import JournalServiceProcess

        backing, token = _pg_url(private_pg), "fleet-token-0123456789abcdef"
        service = [JournalServiceProcess(backing, token)]

        def restart() -> None:
            service[0].kill()
            service.append(JournalServiceProcess(backing, token, port=service[0].port))

        try:
            yield f"{service[0].url}/?token={token}&lease_ttl_ms=3000", restart
        finally:
            service[-1].stop()


def test_a_fleet_loses_nothing_under_sigkill_sigstop_and_a_server_restart(fleet_store, tmp_path, child_env):
    url, restart = fleet_store
    fleet = Fleet(url, tmp_path, child_env)
    runs = [f"w{n}-{uuid.uuid4().hex[:6]}" for n in range(8)]
    try:
        killed, paused = runs[:2], runs[2]
        for run_id in runs:
            fleet.start(run_id, exit_on_lease_lost=run_id == paused)
        for run_id in runs:
            fleet.wait_for(run_id, 3, timeout=120)
        for run_id in killed:  # a quarter of the fleet, SIGKILLed mid-append; new processes take their runs
            time.sleep(random.uniform(0.0, 0.2))
            os.kill(fleet.procs[run_id][0].pid, signal.SIGKILL)
            fleet.procs[run_id][0].wait()
            before = len(fleet.acks(run_id))
            fleet.start(run_id)
            fleet.wait_for(run_id, before + 1)  # taken over and appending (how fast: benchmarks/bench_fleet.py)
        holder = fleet.procs[paused][0]
        os.kill(holder.pid, signal.SIGSTOP)  # paused past its lease while another process takes the run
        time.sleep(TTL_S + 0.5)
        before = len(fleet.acks(paused))
        fleet.start(paused)
        fleet.wait_for(paused, before + 3)
        os.kill(holder.pid, signal.SIGCONT)
        out, _ = holder.communicate(timeout=30)
        assert holder.returncode == 3 and "LEASE LOST lease_lost" in out, out  # fenced off, with a typed error
        if restart is not None:  # the server goes away under the writers and comes back
            counts = {run_id: len(fleet.acks(run_id)) for run_id in runs}
            restart()
            for run_id in runs:  # every writer appends again by itself (how fast: benchmarks/bench_fleet.py)
                fleet.wait_for(run_id, counts[run_id] + 2)
        for run_id in runs:
            fleet.wait_for(run_id, len(fleet.acks(run_id)) + 1)
    finally:
        fleet.stop()
    store = open_store(url)
    for run_id in runs:
        steps = _waypoints(store, run_id)
        acked = fleet.acks(run_id)
        assert steps == list(range(len(steps))), f"{run_id}: a gap or a duplicate in {steps}"
        assert set(acked) <= set(steps), f"{run_id}: acknowledged {sorted(set(acked) - set(steps))} are missing"
        assert len(acked) == len(set(acked)), f"{run_id}: a step acknowledged twice"
    caravanserai.runs.close_all()

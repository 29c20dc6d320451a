"""Faults a shared store meets under its writers (issue 24): a PostgreSQL restart under a writer, two
renewals of one object-store lease at once, a bucket that does not exist, and a block whose error
must survive a store that cannot record it. Real servers only: a private PostgreSQL cluster (it is
restarted) and the moto S3 server."""

from __future__ import annotations

import threading
import uuid

import pytest
from conftest import need

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
    with caravanserai.durable("unrecorded", store=url) as run:  # resumes from its last waypoint
        assert run.state == {"i": 0}
    assert _waypoints(store, "unrecorded") == [0]
    caravanserai.runs.close_all()


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
                lease._renew_now(due=0.9)  # due at once: renew now, whoever renewed last
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


def test_a_missing_bucket_is_named_not_reported_as_a_locked_run(s3):
    url = (f"s3://no-such-bucket-{uuid.uuid4().hex[:6]}/p?endpoint={s3.endpoint}&region=us-east-1"
           "&access_key_id=testing&secret_access_key=testing")
    with pytest.raises(StoreUnavailable) as raised:
        with caravanserai.durable("r", store=url) as run:
            run.checkpoint({"i": 1}, "never")
    assert not isinstance(raised.value, RunLocked)
    assert "the bucket (or container) does not exist" in str(raised.value) and "\n" not in str(raised.value)

"""postgresql:// against the conformance suite, on a real PostgreSQL server (started by the test
session, or TEST_PG_DSN from .ci/run)."""

from __future__ import annotations

import uuid

import pytest
from servers._proc import free_port

from caravanserai import StoreUnavailable, open_store
from caravanserai.stores.postgres import PostgresStore
from caravanserai.testing import StoreConformance, journal_machine


def _fresh(pg, ttl_ms: int = 3000) -> PostgresStore:
    table = f"t_{uuid.uuid4().hex[:12]}"
    return PostgresStore(pg.dsn, table=table, lease_ttl_ms=ttl_ms, create_schema=True)


class TestPostgresStore(StoreConformance):
    @pytest.fixture
    def store(self, pg):
        store = _fresh(pg)
        yield store
        store.close()

    @pytest.fixture
    def store_url(self, pg):
        return f"{pg.dsn}?table=t_{uuid.uuid4().hex[:12]}&create_schema=1&lease_ttl_ms=3000"


@pytest.fixture
def machine_class(pg):
    return journal_machine(lambda: _fresh(pg))


def test_journal_state_machine(machine_class):
    from hypothesis import settings

    machine_class.TestCase.settings = settings(max_examples=15, stateful_step_count=12, deadline=None)
    machine_class.TestCase().runTest()


def test_url_options_and_schema_not_created_unless_asked(pg):
    table = f"u_{uuid.uuid4().hex[:10]}"
    store = open_store(f"{pg.dsn}?table={table}&lease_ttl_ms=4000")
    with pytest.raises(StoreUnavailable, match="schema"):
        store.load("r")
    created = open_store(f"{pg.dsn}?table={table}&create_schema=1")
    assert created.load("r") == [] and created.ttl_ms == 30000


def test_unreachable_server_is_a_clear_error():
    with pytest.raises(StoreUnavailable, match="cannot connect to PostgreSQL"):
        PostgresStore(f"postgresql://nobody:secret@127.0.0.1:{free_port()}/db")


def test_writer_statements_go_through_libpq_and_keep_psycopgs_behaviour(pg):
    """append and renew run through ``psycopg.pq`` (prepared once per connection): text in the
    connection's encoding comes back unchanged, a taken chunk is the conflict a cursor would raise,
    a fenced writer is refused, and a connection the server dropped is one StoreUnavailable, then a
    new connection on which the statements are prepared again."""
    from caravanserai.errors import LeaseLost
    from caravanserai.stores.sql import _Conflict

    store = _fresh(pg, ttl_ms=30000)
    try:
        assert {store._queries[name] for name in ("append", "append_many", "renew")} <= store._exec.direct
        lease = store.acquire("direct")
        line = '{"v":1,"type":"note","text":"café ✓ 中文 \\u0000"}'
        store.append("direct", [line, line], lease=lease, seq=0)
        assert store.load("direct") == [line, line]
        assert store._exec._prepared, "the append was not prepared on the connection"
        with pytest.raises(StoreUnavailable, match="NUL"):  # libpq would cut the text at the NUL: psycopg refuses it
            store._q("append", ("direct", 1, 2, lease.token, "a\0b", "direct", lease.token))
        assert store.load("direct") == [line, line]
        with pytest.raises(_Conflict):  # chunk 0 is taken: psycopg's UniqueViolation, read from the result
            store._q("append", ("direct", 0, 0, lease.token, "x", "direct", lease.token))
        assert store._q("renew", (30000, "direct", lease.token)) == [(lease.token,)]  # an int column, read back
        assert store._q("renew", (30000, "direct", lease.token + 1)) == []  # a wrong token renews nothing

        backend = store._exec.connection.info.backend_pid
        with psycopg_connection(pg.dsn) as admin:
            admin.execute("SELECT pg_terminate_backend(%s)", (backend,))
        with pytest.raises(StoreUnavailable, match="failed"):
            store.append("direct", [line], lease=lease, seq=2)
        assert store._exec.connection.closed
        store._exec.retry_at = 0.0  # no wait in the test: the next statement reconnects
        store.append("direct", [line], lease=lease, seq=2)  # prepared again on the new connection
        assert store._exec.connection.info.backend_pid != backend
        assert store.load("direct") == [line] * 3

        store._q("takeover", ("{}", 30000, "direct", lease.token))  # another holder now: this lease is fenced
        with pytest.raises(LeaseLost):
            store.append("direct", [line], lease=lease, seq=3)
        assert store.load("direct") == [line] * 3
    finally:
        store.close()


def psycopg_connection(dsn: str):
    import psycopg

    return psycopg.connect(dsn, autocommit=True)


def test_writer_statements_survive_deallocate_all_and_stop_at_ctrl_c(pg):
    """The server forgetting the store's prepared statements (``DEALLOCATE ALL``, which psycopg itself sends
    after a DROP or ALTER) costs one prepare again, not every later append; and a writer statement blocked
    by another session's lock is cancelled by Ctrl-C, as a cursor's is: nothing written, the seq still free."""
    import os
    import signal
    import threading

    store = _fresh(pg, ttl_ms=30000)
    lease = store.acquire("locked")
    try:
        store.append("locked", ['{"n":0}'], lease=lease, seq=0)
        store.exec("DEALLOCATE ALL", ())
        store.append("locked", ['{"n":1}'], lease=lease, seq=1)
        assert store.load("locked") == ['{"n":0}', '{"n":1}']

        admin = psycopg_connection(pg.dsn)
        admin.autocommit = False
        admin.execute(f"LOCK TABLE {store.table} IN ACCESS EXCLUSIVE MODE")
        released = threading.Event()

        def release_later() -> None:  # only if Ctrl-C did not stop the append: the test then fails, not hangs
            if not released.wait(30):
                released.set()
                admin.rollback()

        threading.Thread(target=release_later, daemon=True).start()
        threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGINT)).start()
        with pytest.raises(KeyboardInterrupt):
            store.append("locked", ['{"n":2}'], lease=lease, seq=2)
        assert not released.is_set(), "the append waited for the lock instead of stopping at Ctrl-C"
        released.set()
        admin.rollback()
        admin.close()
        store.append("locked", ['{"n":2}'], lease=lease, seq=2)  # nothing was written: the same seq again
        assert store.load("locked") == ['{"n":0}', '{"n":1}', '{"n":2}']
    finally:
        store.close()

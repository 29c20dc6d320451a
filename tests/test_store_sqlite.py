"""sqlite:// against the conformance suite, plus what SQL stores add (fenced appends, schema)."""

from __future__ import annotations

import sqlite3
import tempfile
import time

import pytest

from caravanserai import LeaseLost, RunLocked, open_store
from caravanserai.stores.sql import SqlDurableStore, SqliteStore
from caravanserai.testing import StoreConformance, journal_machine, make_lines


class TestSqliteStore(StoreConformance):
    @pytest.fixture
    def store(self, tmp_path):
        store = SqliteStore(str(tmp_path / "runs.db"), lease_ttl_ms=3000)
        yield store
        store.close()

    @pytest.fixture
    def store_url(self, tmp_path):
        return f"sqlite:///{tmp_path}/by-url.db?lease_ttl_ms=3000"


TestSqliteJournalMachine = journal_machine(lambda: SqliteStore(tempfile.mkdtemp() + "/m.db", lease_ttl_ms=3000)).TestCase


def test_open_store_url_and_options(tmp_path):
    store = open_store(f"sqlite:///{tmp_path}/a.db?lease_ttl_ms=5000")
    assert isinstance(store, SqliteStore) and store.ttl_ms == 5000
    with pytest.raises(ValueError, match="unknown option"):
        open_store(f"sqlite:///{tmp_path}/b.db?bogus=1")


def test_seed_style_exec_with_user_managed_schema(tmp_path):
    db = sqlite3.connect(tmp_path / "user.db", isolation_level=None, check_same_thread=False)
    db.executescript(SqlDurableStore.schema("sqlite"))
    store = SqlDurableStore({"exec": lambda q, p: db.execute(q, p).fetchall()}, dialect="sqlite", lease_ttl_ms=3000)
    lines, _ = make_lines("r", 2)
    with store.acquire("r") as lease:
        store.append("r", lines, lease=lease, seq=0)
    assert store.load("r") == lines
    assert {r[0] for r in db.execute("SELECT name FROM sqlite_master")} >= {
        "caravanserai_durable_journal", "caravanserai_durable_journal_leases", "caravanserai_durable_journal_objects"}


def test_store_without_schema_is_a_clear_error(tmp_path):
    from caravanserai import StoreUnavailable

    db = sqlite3.connect(tmp_path / "empty.db", isolation_level=None)
    store = SqlDurableStore(lambda q, p: db.execute(q, p).fetchall(), dialect="sqlite")
    with pytest.raises(StoreUnavailable, match="schema"):
        store.load("r")


def test_async_exec(tmp_path):
    db = sqlite3.connect(tmp_path / "a.db", isolation_level=None, check_same_thread=False)
    db.executescript(SqlDurableStore.schema("sqlite"))

    async def exec_(query, params):
        return db.execute(query, params).fetchall()

    store = SqlDurableStore(exec_, dialect="sqlite", lease_ttl_ms=3000)
    lines, _ = make_lines("r", 1)
    with store.acquire("r") as lease:
        store.append("r", lines, lease=lease, seq=0)
    assert store.load("r") == lines


def test_expired_lease_is_fenced_by_the_database(tmp_path):
    path = str(tmp_path / "f.db")
    a = SqliteStore(path, lease_ttl_ms=3000)
    b = SqliteStore(path, lease_ttl_ms=3000)
    lease = a.acquire("r")
    lease._stop.set()  # stop A's renewals: as if A were paused
    lines, tail = make_lines("r", 1)
    a.append("r", lines, lease=lease, seq=0)
    with pytest.raises(RunLocked):
        b.acquire("r")
    time.sleep(3.2)
    taken = b.acquire("r")
    assert taken.token == lease.token + 1
    more, _ = make_lines("r", 1, tail)
    lease._deadline = time.monotonic() + 60  # even if A's own clock still trusts its lease...
    with pytest.raises(LeaseLost):
        a.append("r", more, lease=lease, seq=1)  # ...the database refuses the append
    b.append("r", more, lease=taken, seq=1)
    assert a.load("r") == lines + more
    taken.release()


def test_schema_rejects_bad_names():
    with pytest.raises(ValueError):
        SqlDurableStore.schema("oracle")
    with pytest.raises(ValueError):
        SqlDurableStore.schema("sqlite", table="x; DROP TABLE y")


def test_a_writer_reads_the_journal_once_to_open_a_run_and_a_removal_reads_none(tmp_path, monkeypatch):
    """acquire reads the journal (its length is the next seq) and load_held hands those lines over; a
    removal takes the lease but never appends, so it reads nothing (a long run's journal was read
    twice to open it, and once more to remove it)."""
    import caravanserai

    store = SqliteStore(str(tmp_path / "runs.db"))
    try:
        with caravanserai.durable("once", store=store) as run:
            for n in range(3):
                run.checkpoint({"n": n}, f"step {n}")
        queries: list[str] = []
        real = store._q
        monkeypatch.setattr(store, "_q", lambda name, params: (queries.append(name), real(name, params))[1])
        with caravanserai.durable("once", store=store) as run:
            assert run.state == {"n": 2}
            run.checkpoint({"n": 3}, "step 3")
        assert queries.count("load") == 1, queries
        queries.clear()
        assert store.remove("once")
        assert "load" not in queries, queries
        assert store.load("once") == []
    finally:
        store.close()


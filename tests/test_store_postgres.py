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

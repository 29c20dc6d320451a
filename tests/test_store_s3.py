"""Object storage as a journal store: the conformance suite on a real local S3 server (moto),
the seed's adapter contract, and the errors it names."""

from __future__ import annotations

import time
import uuid

import pytest
from servers._proc import free_port

from caravanserai import LeaseLost, ObjectConditionalPutRequired, ObjectLeaseTtlInvalid, RunLocked, open_store
from caravanserai.stores.objects import ObjectDurableStore
from caravanserai.testing import StoreConformance, journal_machine, make_lines


def _url(s3, ttl_ms: int = 3000) -> str:
    bucket = f"runs-{uuid.uuid4().hex[:10]}"
    s3.create_bucket(bucket)
    return (f"s3://{bucket}/team?endpoint={s3.endpoint}&region=us-east-1&access_key_id=testing"
            f"&secret_access_key=testing&lease_ttl_ms={ttl_ms}")


class TestS3Store(StoreConformance):
    @pytest.fixture
    def store(self, s3):
        return open_store(_url(s3))

    @pytest.fixture
    def store_url(self, s3):
        return _url(s3)


def test_journal_state_machine(s3):
    from hypothesis import settings

    machine = journal_machine(lambda: open_store(_url(s3)))
    machine.TestCase.settings = settings(max_examples=10, stateful_step_count=10, deadline=None)
    machine.TestCase().runTest()


def test_keys_land_under_the_prefix(s3):
    url = _url(s3)
    store = open_store(url)
    lines, _ = make_lines("r", 2)
    with store.acquire("r") as lease:
        store.append("r", lines, lease=lease, seq=0)
    keys = store.storage.list("")
    assert keys and all(k.startswith("team/") for k in keys)
    assert any(k.startswith("team/leases/r") for k in keys) and any(k.startswith("team/journal/r/") for k in keys)


def test_errors_named_by_the_seed(s3):
    storage = open_store(_url(s3)).storage
    with pytest.raises(ObjectLeaseTtlInvalid, match="at least 3000ms"):
        ObjectDurableStore(storage, conditional_put=True, lease_ttl_ms=2999)
    plain = ObjectDurableStore(storage)  # conditional_put not declared
    with pytest.raises(ObjectConditionalPutRequired) as info:
        plain.acquire("r")
    assert info.value.code == "durable_object_conditional_put_required"


def test_fenced_off_writer_collides_instead_of_overwriting(s3):
    url = _url(s3)
    a, b = open_store(url), ObjectDurableStore(open_store(url).storage, conditional_put=True, lease_ttl_ms=3000,
                                               prefix="team/")
    lease_a = a.acquire("r")
    lease_a._stop.set()  # A is paused: no renewals
    lines, tail = make_lines("r", 1)
    a.append("r", lines, lease=lease_a, seq=0)
    with pytest.raises(RunLocked):
        b.acquire("r")
    time.sleep(3.2)
    lease_b = b.acquire("r")  # takes over and fences
    assert lease_b.token == lease_a.token + 1
    more, _ = make_lines("r", 1, tail)
    lease_a._deadline = time.monotonic() + 60  # even if A still trusted its clock...
    with pytest.raises(LeaseLost, match="fenced"):
        a.append("r", more, lease=lease_a, seq=1)  # ...its chunk key is taken: refused, not overwritten
    b.append("r", more, lease=lease_b, seq=1)
    assert b.load("r") == lines + more
    lease_b.release()


def test_unreachable_endpoint_is_store_unavailable():
    from caravanserai import StoreUnavailable

    store = open_store(f"s3://nowhere/x?endpoint=http://127.0.0.1:{free_port()}&region=us-east-1&access_key_id=a"
                       "&secret_access_key=b")
    started = time.monotonic()
    with pytest.raises(StoreUnavailable, match="failed"):
        store.load("r")
    assert time.monotonic() - started < 60


# ---- segments and listing on a real S3 server ---------------------------------------------------------------
class TestS3StoreCompactingOften(StoreConformance):
    @pytest.fixture
    def store(self, s3):
        store = open_store(_url(s3) + "&compact_every=5&delta_every=2")  # the URL options
        assert (store.compact_every, store.delta_every) == (5, 2)
        return store

    @pytest.fixture
    def store_url(self, s3):
        return _url(s3) + "&compact_every=5&delta_every=2"


class _Recorder:
    """Records the calls a store makes on its bucket face (each one request here: small listings)."""

    def __init__(self, bucket) -> None:
        self.calls: list[tuple[str, str]] = []
        for name in ("get", "list", "list_children", "put", "delete", "exists", "get_versioned"):
            setattr(bucket, name, self._wrap(name, getattr(bucket, name)))

    def _wrap(self, name, fn):
        def call(key, *args, **kwargs):
            self.calls.append((name, key))
            return fn(key, *args, **kwargs)
        return call


def test_a_long_run_loads_in_three_requests_and_a_killed_holders_tail_in_parallel(s3):
    store = open_store(_url(s3))
    store.compact_every = 8
    lines, tail = make_lines("r", 30)
    with store.acquire("r") as lease:
        for i, line in enumerate(lines[:20]):
            store.append("r", [line], lease=lease, seq=i)
    calls = _Recorder(store.bucket).calls
    assert store.load("r") == lines[:20]
    assert [name for name, _ in calls] == ["get"] * 3  # the head, the segment, one chunk probe: no listing
    lease = store.acquire("r")
    for i, line in enumerate(lines[20:], start=20):  # a fence (21), chunks 22..31: a segment through 28
        store.append("r", [line], lease=lease, seq=i)
    lease._stop.set()
    lease._deadline = 0  # as if killed: no release, no compaction
    calls.clear()
    assert store.load("r") == lines
    # the head, the segment through 28, chunks 29..31 and four misses (probed 1, 2, then 4 at a time)
    assert [name for name, _ in calls] == ["get"] * 9
    assert store.list() == ["r"]


def test_list_reads_one_key_per_run_not_every_chunk(s3):
    store = open_store(_url(s3))
    for run_id in ("b", "a", "c.1"):
        with store.acquire(run_id) as lease:
            for i, line in enumerate(make_lines(run_id, 5)[0]):
                store.append(run_id, [line], lease=lease, seq=i)
    calls = _Recorder(store.bucket).calls
    assert store.list() == ["a", "b", "c.1"]
    assert calls == [("list_children", "team/journal/")]
    assert store.bucket.list_children("team/journal/a/") == ["00000000000000000000", "00000000000000000001",
                                                             "00000000000000000002", "00000000000000000003",
                                                             "00000000000000000004", "00000000000000000005"]

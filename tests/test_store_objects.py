"""One object-store contract: ``Objects`` with put modes and a CAS flag, the journal store over any
object face with CAS (``BucketStore``, tested here without S3), the seed's adapter form, the one
lease-TTL check and the names (new ones and the seed's aliases)."""

from __future__ import annotations

import json
import pickle
import threading
import uuid
import warnings
from collections.abc import Callable
from concurrent.futures import Future

import pytest
from conftest import need_module

from caravanserai.errors import (
    CaravanseraiError,
    JournalCorruptionError,
    LeaseLost,
    LeaseTtlInvalid,
    ObjectCompactionInvalid,
    ObjectConditionalPutRequired,
    ObjectLeaseTtlInvalid,
    ObjectPreconditionFailed,
    RunLocked,
    SequenceMismatch,
    StoreUnavailable,
)
from caravanserai.stores import IfVersion, LocalObjects, MemoryObjects, MemoryStore, Objects, PrefixedObjects
from caravanserai.stores.objects import BucketStore, PreconditionFailed, StorageObjects, _found
from caravanserai.stores.sql import SqliteStore
from caravanserai.testing import ObjectsConformance, StoreConformance, journal_machine, make_lines


class DictStorage:
    """The seed's adapter shape over a dict: ``get -> (bytes, etag)``, ``put(if_match=...)``, ``list``."""

    def __init__(self, with_delete: bool = True) -> None:
        self.data: dict[str, tuple[bytes, str]] = {}
        self.count = 0
        self.lock = threading.Lock()
        if with_delete:
            self.delete = lambda key: self.data.pop(key, None)

    def get(self, key: str) -> tuple[bytes, str] | None:
        with self.lock:
            return self.data.get(key)

    def put(self, key: str, data: bytes, if_match: str | None = None) -> str:
        with self.lock:
            current = self.data.get(key)
            if if_match == "" and current is not None:
                raise PreconditionFailed(key)
            if if_match not in (None, "") and (current is None or current[1] != if_match):
                raise PreconditionFailed(key)
            self.count += 1
            self.data[key] = (bytes(data), f"etag-{self.count}")
            return f"etag-{self.count}"

    def list(self, prefix: str) -> list[str]:
        with self.lock:
            return [k for k in self.data if k.startswith(prefix)]


# ---- conformance: the journal over object faces with CAS, no S3 needed ---------------------------------
class TestBucketStoreOnMemoryObjects(StoreConformance):
    @pytest.fixture
    def store(self):
        return BucketStore(MemoryObjects(), lease_ttl_ms=3000)


class TestBucketStoreOnTheSeedAdapter(StoreConformance):
    @pytest.fixture
    def store(self):
        return BucketStore(DictStorage(), conditional_put=True, lease_ttl_ms=3000, prefix="team")


class TestPrefixedMemoryObjects(ObjectsConformance):
    @pytest.fixture
    def objects(self):
        return PrefixedObjects(MemoryObjects(), "area/")


TestBucketJournalMachine = journal_machine(lambda: BucketStore(MemoryObjects(), lease_ttl_ms=3000)).TestCase


# ---- the contract ---------------------------------------------------------------------------------------
def test_put_if_absent_is_derived_once_from_create():
    assert "put_if_absent" not in vars(MemoryObjects) and "put_if_absent" not in vars(LocalObjects)
    objects = MemoryObjects()
    assert objects.put_if_absent("k", b"1") is True and objects.put_if_absent("k", b"2") is False
    assert objects.get("k") == b"1"


def test_capability_flags():
    assert MemoryObjects.supports_cas and not LocalObjects.supports_cas
    assert StorageObjects(DictStorage(), conditional_put=True).supports_cas
    assert not StorageObjects(DictStorage()).supports_cas
    assert PrefixedObjects(MemoryObjects(), "p/").supports_cas


def test_if_version_needs_a_version():
    with pytest.raises(ValueError):
        IfVersion("")
    assert IfVersion("a") == IfVersion("a") and repr(IfVersion("a")) == "IfVersion('a')"


def test_named_memory_objects_share_the_objects_of_their_memory_store():
    name = uuid.uuid4().hex
    MemoryStore(name).objects.put("k", b"shared")
    assert MemoryObjects(name).get("k") == b"shared"
    assert not MemoryObjects().exists("k")


# ---- the journal store over object storage ----------------------------------------------------------------
def test_a_face_without_cas_reads_but_refuses_to_write(tmp_path):
    store = BucketStore(LocalObjects(tmp_path / "bucket"), lease_ttl_ms=3000)
    assert store.load("r") == [] and store.list() == []
    with pytest.raises(ObjectConditionalPutRequired) as info:
        store.acquire("r")
    assert info.value.code == "durable_object_conditional_put_required" and "\n" not in str(info.value)


def test_the_seed_form_without_conditional_put_refuses_at_acquire():
    store = BucketStore(DictStorage())
    assert store.load("r") == []
    with pytest.raises(ObjectConditionalPutRequired):
        store.acquire("r")
    with pytest.raises(ObjectConditionalPutRequired):
        store.objects.put_if_absent("k", b"1")
    with pytest.raises(TypeError, match="Objects face or an ObjectStorage"):
        BucketStore(object())  # type: ignore[arg-type]


def test_the_seed_adapter_round_trips_through_storage():
    first = BucketStore(DictStorage(), conditional_put=True, lease_ttl_ms=3000, prefix="team/")
    lines, _ = make_lines("r", 2)
    with first.acquire("r") as lease:
        first.append("r", lines, lease=lease, seq=0)
    again = BucketStore(first.storage, conditional_put=True, lease_ttl_ms=3000, prefix="team/")
    assert again.load("r") == lines
    assert all(k.startswith("team/") for k in first.storage.list(""))


def test_a_seed_storage_without_delete_says_so_on_remove():
    store = BucketStore(DictStorage(with_delete=False), conditional_put=True, lease_ttl_ms=3000)
    lines, _ = make_lines("r", 1)
    with store.acquire("r") as lease:
        store.append("r", lines, lease=lease, seq=0)
    with pytest.raises(StoreUnavailable, match="no delete"):
        store.remove("r")


def test_a_fenced_off_writer_collides_instead_of_overwriting():
    bucket = MemoryObjects()
    a, b = BucketStore(bucket, lease_ttl_ms=3000), BucketStore(bucket, lease_ttl_ms=3000)
    lease_a = a.acquire("r")
    lease_a._stop.set()  # A is paused: no renewals
    lines, tail = make_lines("r", 1)
    a.append("r", lines, lease=lease_a, seq=0)
    with pytest.raises(RunLocked):
        b.acquire("r")
    key = a._lease_key("r")
    body, version = bucket.get_versioned(key)
    expired = {**json.loads(body), "expires_at": 0}  # as if A's lease ran out while it was paused
    bucket.put(key, json.dumps(expired).encode(), mode=IfVersion(version))
    lease_b = b.acquire("r")  # takes over and fences
    assert lease_b.token == lease_a.token + 1 and lease_b.next_seq == 1
    more, _ = make_lines("r", 1, tail)
    with pytest.raises(LeaseLost, match="fenced"):
        a.append("r", more, lease=lease_a, seq=1)
    b.append("r", more, lease=lease_b, seq=1)
    assert b.load("r") == lines + more
    lease_b.release()


def test_memory_store_reports_a_wrong_seq_as_sequence_mismatch():
    store = MemoryStore(uuid.uuid4().hex)
    lines, _ = make_lines("r", 1)
    with store.acquire("r") as lease:
        with pytest.raises(SequenceMismatch) as info:
            store.append("r", lines, lease=lease, seq=1)
    assert info.value.expected == 0 and not isinstance(info.value, LeaseLost)


# ---- one lease TTL check, one error -----------------------------------------------------------------------
@pytest.mark.parametrize("make", [
    lambda tmp: BucketStore(MemoryObjects(), lease_ttl_ms=2999),
    lambda tmp: SqliteStore(str(tmp / "ttl.db"), lease_ttl_ms=2999),
    lambda tmp: _http(lease_ttl_ms=2999),
], ids=["bucket", "sqlite", "http"])
def test_every_backend_refuses_a_short_lease_with_one_error(tmp_path, make):
    with pytest.raises(LeaseTtlInvalid) as info:
        make(tmp_path)
    assert "at least 3000ms" in str(info.value) and "\n" not in str(info.value)
    assert isinstance(info.value, ValueError) and info.value.minimum == 3000
    assert not (tmp_path / "ttl.db").exists()  # checked before anything is created


def test_the_seed_error_is_a_kind_of_the_one_error():
    with pytest.raises(ObjectLeaseTtlInvalid) as info:
        BucketStore(MemoryObjects(), lease_ttl_ms=10)
    assert isinstance(info.value, LeaseTtlInvalid) and info.value.code == "durable_object_lease_ttl_invalid"
    assert issubclass(ObjectLeaseTtlInvalid, LeaseTtlInvalid)
    assert type(pickle.loads(pickle.dumps(info.value))) is ObjectLeaseTtlInvalid


def _http(**options):
    need_module("httpx", "http")
    from caravanserai.stores.http import HttpStore

    return HttpStore("http://127.0.0.1:9", "token", **options)


def test_http_takes_lease_ttl_ms_and_still_the_deprecated_lock_ttl_ms():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        store = _http(lease_ttl_ms=4000)
    assert store.lease_ttl_ms == store.lock_ttl_ms == 4000
    with pytest.warns(DeprecationWarning, match="lease_ttl_ms"):
        old = _http(lock_ttl_ms=5000)
    assert old.lease_ttl_ms == 5000
    with pytest.raises(LeaseTtlInvalid, match="lease_ttl_ms only"):
        _http(lease_ttl_ms=4000, lock_ttl_ms=5000)
    with pytest.raises(LeaseTtlInvalid, match="lock_ttl_ms"):
        with pytest.warns(DeprecationWarning):
            _http(lock_ttl_ms=100)
    from caravanserai.stores.http import HttpStore

    assert HttpStore.from_url("http://127.0.0.1:9/?token=t&lease_ttl_ms=6000").lease_ttl_ms == 6000
    with pytest.warns(DeprecationWarning, match="lock_ttl_ms"):
        assert HttpStore.from_url("http://127.0.0.1:9/?token=t&lock_ttl_ms=7000").lease_ttl_ms == 7000


def test_the_service_refuses_a_short_ttl_with_the_same_error():
    need_module("starlette", "http")
    from starlette.testclient import TestClient

    from caravanserai.stores.http_service import ApiError, create_app

    client = TestClient(create_app(MemoryStore(uuid.uuid4().hex), "tok"), headers={"Authorization": "Bearer tok"})
    answer = client.post("/v1/runs/r/acquire", json={"holder": {}, "ttl_ms": 100})
    assert answer.status_code == 400 and answer.json()["error"]["code"] == "lease_ttl_invalid"
    error = ApiError(400, "bad_request", "the body must be JSON", field="x")
    assert isinstance(error, CaravanseraiError) and error.code == "bad_request"
    assert pickle.loads(pickle.dumps(error)).answer_fields() == {"field": "x"}


# ---- names ------------------------------------------------------------------------------------------------
def test_new_names_and_the_seed_aliases():
    from caravanserai.checkpoints import CheckpointStore, GCSStore, LocalDirectoryStore, MemoryCheckpointStore, S3Store
    from caravanserai.stores import ObjectStore
    from caravanserai.stores.objects import ObjectDurableStore
    from caravanserai.stores.obstore_objects import GCSObjects, S3Objects
    from caravanserai.stores.sql import SqlDurableStore, SqlStore

    assert CheckpointStore is ObjectStore is Objects
    assert LocalDirectoryStore is LocalObjects and MemoryCheckpointStore is MemoryObjects
    assert S3Store is S3Objects and GCSStore is GCSObjects
    assert ObjectDurableStore is BucketStore and SqlDurableStore is SqlStore
    assert PreconditionFailed is ObjectPreconditionFailed
    need_module("httpx", "http")
    from caravanserai.stores.http import HttpDurableStore, HttpStore

    assert HttpDurableStore is HttpStore


# ---- segments: the journal compacted by its holder --------------------------------------------------------
class CountingObjects(MemoryObjects):
    """MemoryObjects that records every call (method, key or prefix)."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[str, str]] = []

    def put(self, key, data, *, mode="overwrite"):
        self.calls.append(("put", key))
        return super().put(key, data, mode=mode)

    def get(self, key):
        self.calls.append(("get", key))
        return super().get(key)

    def list(self, prefix=""):
        self.calls.append(("list", prefix))
        return super().list(prefix)

    def delete(self, key):
        self.calls.append(("delete", key))
        return super().delete(key)


class TestBucketStoreCompactingOften(StoreConformance):
    @pytest.fixture
    def store(self):
        return BucketStore(MemoryObjects(), lease_ttl_ms=3000, compact_every=5, delta_every=2)


TestCompactingJournalMachine = journal_machine(
    lambda: BucketStore(MemoryObjects(), lease_ttl_ms=3000, compact_every=5, delta_every=2)).TestCase


def _append_each(store, run_id, count, tail=None, lease=None):
    """``count`` appends of one event each; returns (lines, tail)."""
    written = []
    own = lease is None
    lease = lease or store.acquire(run_id)
    for _ in range(count):
        lines, new_tail = make_lines(run_id, 1, tail)
        store.append(run_id, lines, lease=lease, seq=(tail.seq if tail else 0))
        written += lines
        tail = new_tail
    if own:
        lease.release()
    return written, tail


def _segments(store, run_id):
    return [key for _, key in store._segments(run_id)]


def test_the_holder_compacts_every_k_chunks_and_on_release():
    store = BucketStore(MemoryObjects(), lease_ttl_ms=3000, compact_every=4)
    lease = store.acquire("r")  # chunk 0 is its fence
    lines, tail = _append_each(store, "r", 10, lease=lease)  # chunks 1..10
    assert _segments(store, "r") == [store._segment_key("r", 7)]  # through 3, then through 7 (3 deleted)
    body = store.bucket.get(store._segment_key("r", 7)).decode().split("\n")
    header = json.loads(body[0])
    assert header == {"segment": 1, "run": "r", "from": 0, "through": 7, "lines": 7, "token": lease.token}
    assert body[1:] == lines[:7]
    lease.release()
    assert _segments(store, "r") == [store._segment_key("r", 10)]
    assert store.load("r") == lines
    again, _ = _append_each(store, "r", 1, tail)  # a fence, one chunk, a segment on release
    assert store.load("r") == lines + again and _segments(store, "r") == [store._segment_key("r", 12)]


def test_a_released_run_loads_from_its_segment_alone():
    bucket = CountingObjects()
    store = BucketStore(bucket, lease_ttl_ms=3000, compact_every=256)
    lines, _ = _append_each(store, "r", 300)
    bucket.calls.clear()
    assert store.load("r") == lines
    assert bucket.calls[0] == ("get", store._head_key("r"))  # then the segment and one chunk probe, no listing
    assert sorted(bucket.calls[1:]) == [("get", store._chunk_key("r", 301)), ("get", store._segment_key("r", 300))]
    bucket.calls.clear()
    assert store.list() == ["r"]


def test_the_new_holder_reads_once_and_reuses_it():
    bucket = CountingObjects()
    store = BucketStore(bucket, lease_ttl_ms=3000, compact_every=4)
    lines, tail = _append_each(store, "r", 6)
    bucket.calls.clear()
    lease = store.acquire("r")
    assert store.load_held(lease) == lines and lease.next_seq == 6
    reads = [c for c in bucket.calls if c[0] in ("get", "list")]
    assert reads.count(("get", store._segment_key("r", 6))) == 1
    bucket.calls.clear()
    assert store.load_held(lease) == lines and not bucket.calls
    more, _ = _append_each(store, "r", 1, tail, lease=lease)
    assert store.load_held(lease) == lines + more
    lease.release()


def test_old_layouts_of_chunks_alone_still_load_and_get_a_segment():
    store = BucketStore(MemoryObjects(), lease_ttl_ms=3000)
    lines, tail = make_lines("r", 5)
    for chunk, data in enumerate([b"", *(line.encode() for line in lines[:2]), "\n".join(lines[2:]).encode()]):
        store.bucket.put(store._chunk_key("r", chunk), data, mode="create")  # as before segments, fence first
    assert store.load("r") == lines and store.list() == ["r"] and not _segments(store, "r")
    more, _ = _append_each(store, "r", 2, tail)
    assert store.load("r") == lines + more and _segments(store, "r") == [store._segment_key("r", 6)]


def test_a_fenced_writers_late_chunk_never_appears_in_a_segment():
    bucket = MemoryObjects()
    a, b = BucketStore(bucket, lease_ttl_ms=3000, compact_every=2), BucketStore(bucket, lease_ttl_ms=3000,
                                                                                compact_every=2)
    lease_a = a.acquire("r")
    lease_a._stop.set()  # A is paused: no renewals
    first, tail = _append_each(a, "r", 3, lease=lease_a)
    key = a._lease_key("r")
    body, version = bucket.get_versioned(key)
    bucket.put(key, json.dumps({**json.loads(body), "expires_at": 0}).encode(), mode=IfVersion(version))
    lease_b = b.acquire("r")  # takes over: fences, reads A's chunks
    late, _ = make_lines("r", 1, tail, text="late")
    with pytest.raises(LeaseLost, match="fenced"):
        a.append("r", late, lease=lease_a, seq=3)
    a._compact(lease_a)  # even a stale holder compacting covers only the chunks it wrote before the fence
    second, _ = _append_each(b, "r", 3, tail, lease=lease_b)
    lease_b.release()
    lease_a.release()
    assert b.load("r") == first + second
    for segment in bucket.list(f"{b.prefix}segments/"):
        assert late[0] not in bucket.get(segment).decode().split("\n")
    assert all(b"late" not in bucket.get(k) for k in bucket.list(""))


def test_a_failed_compaction_loses_nothing():
    class Flaky(MemoryObjects):
        def put(self, key, data, *, mode="overwrite"):
            if "/segments/" in key:
                raise StoreUnavailable("the bucket is unreachable")
            return super().put(key, data, mode=mode)

    store = BucketStore(Flaky(), lease_ttl_ms=3000, compact_every=2)
    lines, _ = _append_each(store, "r", 5)
    assert store.load("r") == lines and not _segments(store, "r")


def test_a_reader_whose_segment_was_replaced_reads_again():
    store = BucketStore(MemoryObjects(), lease_ttl_ms=3000, compact_every=2)
    lines, _ = _append_each(store, "r", 3)
    picked = store._segments("r")
    store.bucket.delete(picked[-1][1])
    stale = iter([[(picked[-1])]])  # the first listing still names the deleted segment
    real = store._segments
    store._segments = lambda run_id: next(stale, None) or real(run_id)
    store.bucket.put(store._segment_key("r", 1), b'{"segment": 1, "run": "r", "from": 0, "through": 1, "lines": 1}\n'
                     + lines[0].encode())
    assert store.load("r") == lines


def test_a_damaged_segment_is_journal_corruption_naming_it():
    store = BucketStore(MemoryObjects(), lease_ttl_ms=3000, compact_every=2)
    _append_each(store, "r", 3)
    key = _segments(store, "r")[-1]
    store.bucket.put(key, b'{"segment": 1, "through": 0, "lines": 9}\nx')
    with pytest.raises(JournalCorruptionError, match="segment") as info:
        store.load("r")
    assert info.value.key == key and "\n" not in str(info.value)


def test_compact_every_and_delta_every_must_be_positive_counts():
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ObjectCompactionInvalid, match="compact_every") as info:
            BucketStore(MemoryObjects(), compact_every=bad)
        assert isinstance(info.value, ValueError) and info.value.code == "object_compaction_invalid"
        with pytest.raises(ObjectCompactionInvalid, match="delta_every"):
            BucketStore(MemoryObjects(), delta_every=bad)


def test_deltas_between_segments_keep_a_killed_holders_tail_short():
    bucket = CountingObjects()
    store = BucketStore(bucket, lease_ttl_ms=3000, compact_every=8, delta_every=2)
    lease = store.acquire("r")  # fence 0
    lines, _ = _append_each(store, "r", 12, lease=lease)  # chunks 1..12
    # deltas 0-1, 0-3, 0-5; the segment through 7 replaced them; deltas 8-9, then 8-11; chunk 12 after
    head = json.loads(bucket.get(store._head_key("r")))
    assert head == {"through": 7, "deltas": [[8, 11]]}
    assert bucket.list(f"{store.prefix}segments/r/") == sorted([store._delta_key("r", 8, 9), store._segment_key("r", 7),
                                                                store._delta_key("r", 8, 11), store._head_key("r")])
    delta = bucket.get(store._delta_key("r", 8, 11)).decode().split("\n")
    assert json.loads(delta[0])["from"] == 8 and delta[1:] == lines[7:11]
    lease._stop.set()
    lease._deadline = 0  # as if killed: no compaction on release
    bucket.calls.clear()
    assert store.load("r") == lines
    fetched = sorted(key for _, key in bucket.calls)
    assert fetched == sorted([store._head_key("r"), store._segment_key("r", 7), store._delta_key("r", 8, 11),
                              *(store._chunk_key("r", n) for n in range(12, 28))])
    # (a head with a delta was written mid-run: the chunks after it are probed 16 at once)
    body, version = bucket.get_versioned(store._lease_key("r"))  # its lease runs out
    bucket.put(store._lease_key("r"), json.dumps({**json.loads(body), "expires_at": 0}).encode(),
               mode=IfVersion(version))
    successor = store.acquire("r")
    assert store.load_held(successor) == lines and successor.deltas == [(8, 11)]
    more, _ = _append_each(store, "r", 2, make_lines("r", 12)[1], lease=successor)  # fence 13, chunks 14, 15
    successor.release()
    assert store.load("r") == lines + more
    assert bucket.list(f"{store.prefix}segments/r/") == [store._segment_key("r", 15), store._head_key("r")]


def test_the_head_is_only_a_hint():
    store = BucketStore(MemoryObjects(), lease_ttl_ms=3000, compact_every=3)
    lines, tail = _append_each(store, "r", 7)
    head = store._head_key("r")
    store.bucket.delete(head)  # a holder killed before its first head: the chunks from 0
    assert store.load("r") == lines
    store.bucket.put(head, b'{"through": 3}')  # an older segment (a kill between segment and head)
    store.bucket.put(store._segment_key("r", 3), b'{"segment": 1, "run": "r", "from": 0, "through": 3, "lines": 3}\n'
                     + "\n".join(lines[:3]).encode())
    assert store.load("r") == lines
    store.bucket.put(head, b"not json")
    assert store.load("r") == lines
    more, _ = _append_each(store, "r", 1, tail)
    assert store.load("r") == lines + more and _segments(store, "r") == [store._segment_key("r", 9)]


def test_a_segment_of_another_run_is_never_read_as_this_ones():
    """A segment whose header names another run (left by a removed run of the same id, or planted) is
    journal corruption naming it, never this run's prefix."""
    store = BucketStore(MemoryObjects(), lease_ttl_ms=3000, compact_every=3)
    lines, _ = _append_each(store, "r", 7)
    store.bucket.put(store._head_key("r"), b'{"through": 3}')
    store.bucket.put(store._segment_key("r", 3), b'{"segment": 1, "run": "other", "from": 0, "through": 3, "lines": 3}\n'
                     + b"\n".join(b'{"forged": true}' for _ in range(3)))
    with pytest.raises(JournalCorruptionError, match="not a segment of this run"):
        store.load("r")


class _InFlight(MemoryObjects):
    """MemoryObjects that records what was asked while what: a create of the lease object waits (up to
    ``patience`` s) for a read of the lease object to be done, and a chunk read for ``together`` chunk reads in flight."""

    def __init__(self, lease_key: str, chunks: str, together: int, patience: float = 2.0) -> None:
        super().__init__()
        self.lease_key, self.chunks, self.together, self.patience = lease_key, chunks, together, patience
        self.read_started = threading.Event()
        self.create_saw_read: list[bool] = []
        self.in_flight = self.most_in_flight = 0
        self.lease_reads = 0
        self.chunk_reads: list[str] = []
        self.before_create: Callable[[], object] | None = None
        self._turn = threading.Condition()

    def get_versioned(self, key):
        found = super().get_versioned(key)
        if key == self.lease_key:
            self.lease_reads += 1
            self.read_started.set()  # once the read is done: a create waiting for it cannot land first
        return found

    def put(self, key, data, *, mode="overwrite"):
        if key == self.lease_key and mode == "create":
            self.create_saw_read.append(self.read_started.wait(self.patience))
            if self.before_create is not None:
                self.before_create()
        return super().put(key, data, mode=mode)

    def get(self, key):
        if not key.startswith(self.chunks):
            return super().get(key)
        self.chunk_reads.append(key)
        with self._turn:  # a barrier: once ``together`` were in flight at once, every waiter goes on
            self.in_flight += 1
            self.most_in_flight = max(self.most_in_flight, self.in_flight)
            self._turn.notify_all()
            self._turn.wait_for(lambda: self.most_in_flight >= self.together, timeout=self.patience)
        try:
            return super().get(key)
        finally:
            with self._turn:
                self.in_flight -= 1


def test_taking_over_a_killed_short_run_reads_its_lease_and_its_chunks_at_once():
    """A successor's open is four round trips, not six: the lease object is read while its create is
    tried (which fails: the run exists), and the chunks of a run without a head come 8 at once.
    (In-memory objects: the order and overlap of requests can only be held still in-process; the same
    takeover against a real S3 server, moto, runs in test_takeover.py and test_store_s3.py.)"""
    probe = BucketStore(MemoryObjects(), lease_ttl_ms=3000)
    bucket = _InFlight(probe._lease_key("r"), f"{probe.prefix}journal/r/", together=1)
    store = BucketStore(bucket, lease_ttl_ms=3000)
    lease = store.acquire("r")  # a new run: its create succeeds; the fence is chunk 0
    assert bucket.chunk_reads == [store._chunk_key("r", 0)]  # no lease object yet: one probe, not eight
    lines, _ = _append_each(store, "r", 4, lease=lease)  # chunks 1..4: no delta, no head
    lease._stop.set()
    lease._deadline = 0  # as if killed: no compaction on release
    body, version = bucket.get_versioned(store._lease_key("r"))  # its lease runs out
    bucket.put(store._lease_key("r"), json.dumps({**json.loads(body), "expires_at": 0}).encode(),
               mode=IfVersion(version))
    bucket.read_started.clear()
    bucket.lease_reads = bucket.most_in_flight = 0
    bucket.chunk_reads.clear()
    bucket.together = 5  # a chunk read waits for five in flight (at most 2 s)
    successor = BucketStore(bucket, lease_ttl_ms=3000).acquire("r")
    bucket.together = 1
    assert bucket.create_saw_read == [True, True]  # both creates went out with the lease object's read
    assert bucket.lease_reads == 1  # the takeover's compare-and-swap used that read: no second one
    assert bucket.most_in_flight >= 5  # chunks 0..4 fetched together (one at a time before)
    assert sorted(bucket.chunk_reads) == [store._chunk_key("r", n) for n in range(8)]  # one batch of 8
    assert successor.token == lease.token + 1 and store.load_held(successor) == lines
    successor.release()
    assert store.load("r") == lines


def test_a_holder_that_let_go_after_the_early_read_is_read_again_not_reported_as_locked():
    """The lease object read alongside the create may be older than the create's refusal: a live
    holder there is read once more before RunLocked, so a run released meanwhile is taken."""
    probe = BucketStore(MemoryObjects(), lease_ttl_ms=3000)
    bucket = _InFlight(probe._lease_key("r"), f"{probe.prefix}journal/r/", together=1)
    first = BucketStore(bucket, lease_ttl_ms=3000)
    lease = first.acquire("r")
    lines, _ = _append_each(first, "r", 2, lease=lease)
    bucket.read_started.clear()
    bucket.before_create = lease.release  # let go after the early read saw it live, before the refusal
    second = BucketStore(bucket, lease_ttl_ms=3000).acquire("r")
    assert second.token == lease.token + 1 and first.load_held(second) == lines
    assert bucket.lease_reads == 3  # the first acquire's early read, then this one's early read and its re-read
    second.release()
    bucket.before_create = None
    bucket.read_started.clear()
    holder = first.acquire("r")  # live now, and still live when read again: RunLocked naming it
    with pytest.raises(RunLocked, match="is being written by"):
        BucketStore(bucket, lease_ttl_ms=3000).acquire("r")
    holder.release()


def test_an_acquire_does_not_count_its_own_new_lease_object_as_an_earlier_run():
    """A new run's create can land before the lease object's read: that read names this acquire's own
    lease, so the chunks are probed one at a time, as for any new run."""
    done: Future = Future()
    done.set_result((json.dumps({"holder": {"lease": "mine"}, "token": 1, "expires_at": 0}).encode(), "v1"))
    assert not _found(done, "mine") and _found(done, "someone else's")
    missing: Future = Future()
    missing.set_result(None)
    failed: Future = Future()
    failed.set_exception(OSError("unreachable"))
    assert not _found(missing, "mine") and not _found(failed, "mine")

"""One object-store contract: ``Objects`` with put modes and a CAS flag, the journal store over any
object face with CAS (``BucketStore``, tested here without S3), the seed's adapter form, the one
lease-TTL check and the names (new ones and the seed's aliases)."""

from __future__ import annotations

import json
import pickle
import threading
import uuid
import warnings

import pytest

from caravanserai.errors import (
    CaravanseraiError,
    LeaseLost,
    LeaseTtlInvalid,
    ObjectConditionalPutRequired,
    ObjectLeaseTtlInvalid,
    ObjectPreconditionFailed,
    RunLocked,
    SequenceMismatch,
    StoreUnavailable,
)
from caravanserai.stores import IfVersion, LocalObjects, MemoryObjects, MemoryStore, Objects, PrefixedObjects
from caravanserai.stores.objects import BucketStore, PreconditionFailed, StorageObjects
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
    pytest.importorskip("httpx")
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
    pytest.importorskip("starlette")
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
    pytest.importorskip("httpx")
    from caravanserai.stores.http import HttpDurableStore, HttpStore

    assert HttpDurableStore is HttpStore

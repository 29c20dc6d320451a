"""Object storage as a journal store: ``BucketStore`` (the seed's ``ObjectDurableStore``) and
``s3://``, ``gs://``, ``az://`` URLs.

``BucketStore(objects)`` takes any object face (``caravanserai.stores.base.Objects``) that has
compare-and-swap (``supports_cas``: ``MemoryObjects``, ``ObstoreObjects``, ``S3Objects``...).
The seed's form works too: ``BucketStore(storage, conditional_put=True)`` with an
``ObjectStorage`` — ``get(key) -> (bytes, etag) | None``, ``put(key, data, if_match=None) ->
etag`` (``if_match=""`` create-if-absent, an e-tag compare-and-swap, ``PreconditionFailed`` when
the condition fails), ``list(prefix)``, optionally ``delete(key)`` — where ``conditional_put=True``
declares those conditions hold. Writing (``acquire``, create-only puts) on a face without CAS
raises ``ObjectConditionalPutRequired``; reading works on any face. Keys land under ``prefix``
(``caravanserai/durable/``):

- ``leases/<run>`` — ``{holder, token, expires_at}``, claimed with a ``"create"`` put, renewed and
  taken over with ``IfVersion`` on its version;
- ``journal/<run>/<chunk:020d>`` — one write-once object per append. A new holder first writes an
  empty *fence* chunk at the tail, so a previous holder's next append collides on its key and is
  refused: safety does not rest on clocks;
- ``objects/<key>`` — the object face.
"""

from __future__ import annotations

import json
import re
import time
import uuid
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any, Protocol, runtime_checkable
from urllib.parse import urlsplit

from ..errors import (
    InvalidStoreUrl,
    LeaseLost,
    ObjectConditionalPutRequired,
    ObjectLeaseTtlInvalid,
    ObjectPreconditionFailed,
    RunLocked,
    StoreUnavailable,
)
from .base import IfVersion, Objects, PrefixedObjects, PutMode, Store, describe_holder, holder_info, holder_is_dead
from .leases import DEFAULT_TTL_MS, ExpiringLease, check_lease_ttl
from .obstore_objects import ObstoreObjects, _obstore, is_panic
from .urls import first_line, parse_bool, parse_options, redact, split_url

__all__ = ["BucketStore", "ObjectDurableStore", "ObjectStorage", "ObstoreStorage", "PreconditionFailed",
           "StorageObjects", "StorageView", "from_obstore_url"]

DEFAULT_PREFIX = "caravanserai/durable/"

PreconditionFailed = ObjectPreconditionFailed  # the seed adapter's error, now the public typed one


@runtime_checkable
class ObjectStorage(Protocol):
    """The seed's adapter contract: three methods over a bucket (``delete`` for cleaning)."""

    def get(self, key: str) -> tuple[bytes, str] | None: ...  # (data, etag), None if absent
    def put(self, key: str, data: bytes, if_match: str | None = None) -> str: ...  # the new etag
    def list(self, prefix: str) -> list[str]: ...


class StorageObjects(Objects):
    """An ``Objects`` face over a seed-style ``ObjectStorage``; CAS exactly when ``conditional_put``."""

    def __init__(self, storage: ObjectStorage, conditional_put: bool = False) -> None:
        self.storage = storage
        self.conditional_put = bool(conditional_put)

    @property
    def supports_cas(self) -> bool:  # type: ignore[override]
        return self.conditional_put

    def put(self, key: str, data: bytes, *, mode: PutMode = "overwrite") -> str | None:
        key, mode = self.check_key(key), self.check_mode(mode)
        if mode == "overwrite":
            return self.storage.put(key, bytes(data))
        if not self.conditional_put:  # create-if-absent is only what the adapter declared
            raise ObjectConditionalPutRequired(
                f"a create-only put on {self!r} needs conditional writes: pass conditional_put=True only if the "
                "storage's put(key, data, if_match='') is create-if-absent (S3, GCS and Azure are)", what="create")
        try:
            return self.storage.put(key, bytes(data), if_match="" if mode == "create" else mode.version)
        except ObjectPreconditionFailed:
            raise self._exists(key, mode) from None

    def get(self, key: str) -> bytes:
        found = self.storage.get(key)
        if found is None:
            raise self._missing(key)
        return found[0]

    def get_versioned(self, key: str) -> tuple[bytes, str] | None:
        if not self.conditional_put:
            raise self._no_cas("get_versioned()")
        return self.storage.get(key)

    def exists(self, key: str) -> bool:
        return self.storage.get(key) is not None

    def list(self, prefix: str = "") -> list[str]:
        return sorted(k for k in self.storage.list(prefix) if k.startswith(prefix))

    def delete(self, key: str) -> bool:
        delete = getattr(self.storage, "delete", None)
        if delete is None:
            raise StoreUnavailable(f"{self!r} has no delete(key): give the storage one to remove runs or objects",
                                   what="delete")
        if self.storage.get(key) is None:
            return False
        delete(key)
        return True

    def __repr__(self) -> str:
        return f"StorageObjects({type(self.storage).__name__})"


class StorageView:
    """The seed's ``ObjectStorage`` methods over an ``Objects`` face with CAS (``BucketStore.storage``)."""

    def __init__(self, objects: Objects) -> None:
        self.objects = objects

    def get(self, key: str) -> tuple[bytes, str] | None:
        return self.objects.get_versioned(key)

    def put(self, key: str, data: bytes, if_match: str | None = None) -> str | None:
        mode: PutMode = "overwrite" if if_match is None else "create" if if_match == "" else IfVersion(if_match)
        return self.objects.put(key, data, mode=mode)

    def list(self, prefix: str) -> list[str]:
        return self.objects.list(prefix)

    def delete(self, key: str) -> None:
        self.objects.delete(key)

    def __repr__(self) -> str:
        return f"StorageView({self.objects!r})"


class ObstoreStorage(StorageView):
    """The seed adapter over an obstore store (``StorageView`` of ``ObstoreObjects``), kept by name."""

    def __init__(self, store: Any, description: str = "") -> None:
        super().__init__(ObstoreObjects(store, description))


class BucketLease(ExpiringLease):
    """A lease object in the bucket, renewed by compare-and-swap on its version."""

    def __init__(self, store: BucketStore, run_id: str, token: int, holder: dict, version: str, started: float,
                 next_chunk: int, next_seq: int) -> None:
        self.version = version
        self.next_chunk = next_chunk
        super().__init__(store, run_id, token, holder, store.ttl, started=started, next_seq=next_seq)

    @property
    def etag(self) -> str:
        """The lease object's version (the seed calls it an e-tag)."""
        return self.version

    def _renew(self) -> None:
        store: BucketStore = self.store  # type: ignore[assignment]
        try:
            self.version = store._bucket.put(store._lease_key(self.run_id), store._lease_body(self.holder, self.token),
                                             mode=IfVersion(self.version)) or ""
        except ObjectPreconditionFailed:
            raise LeaseLost(f"run {self.run_id!r}: the lease object changed (taken over)", run_id=self.run_id) from None

    def _release_remote(self) -> None:
        store: BucketStore = self.store  # type: ignore[assignment]
        store._bucket.put(store._lease_key(self.run_id), store._lease_body(None, self.token, expired=True),
                          mode=IfVersion(self.version))


ObjectLease = BucketLease


class BucketStore(Store):
    """A journal and objects in a bucket, with leases built on conditional writes."""

    scheme = "object"

    def __init__(self, objects: Objects | ObjectStorage, *, conditional_put: bool = False,
                 lease_ttl_ms: int = DEFAULT_TTL_MS, prefix: str = DEFAULT_PREFIX, url: str | None = None) -> None:
        ttl_ms = check_lease_ttl(lease_ttl_ms, error=ObjectLeaseTtlInvalid)
        if isinstance(objects, Objects):
            self._bucket: Objects = objects  # its own supports_cas decides; conditional_put is for the seed form
        elif isinstance(objects, ObjectStorage):
            self._bucket = StorageObjects(objects, conditional_put)
        else:
            raise TypeError(f"BucketStore needs an Objects face or an ObjectStorage (get, put, list), got "
                            f"{type(objects).__name__}")
        self.ttl = ttl_ms / 1000
        self.lease_ttl_ms = ttl_ms
        self.prefix = prefix if prefix.endswith("/") or not prefix else prefix + "/"
        self.url = url or f"object://{type(objects).__name__}/{self.prefix}"
        self._objects = PrefixedObjects(self._bucket, f"{self.prefix}objects/")
        self._storage = objects if not isinstance(objects, Objects) else StorageView(objects)

    @property
    def bucket(self) -> Objects:
        """The object face the whole store lives in (keys include ``prefix``)."""
        return self._bucket

    @property
    def storage(self) -> Any:
        """The seed's ``ObjectStorage`` methods over the bucket (what the seed's constructor takes)."""
        return self._storage

    @property
    def conditional_put(self) -> bool:
        """True when the bucket face has compare-and-swap (writing needs it)."""
        return self._bucket.supports_cas

    def _need_cas(self, what: str) -> None:
        if not self._bucket.supports_cas:
            raise ObjectConditionalPutRequired(
                f"{what} on object storage needs conditional writes: give BucketStore an object face with "
                "compare-and-swap, or pass conditional_put=True only if your storage's put(key, data, if_match='') is "
                "create-if-absent (S3, GCS and Azure through obstore are)", what=what)

    def _lease_key(self, run_id: str) -> str:
        return f"{self.prefix}leases/{run_id}"

    def _chunk_key(self, run_id: str, chunk: int) -> str:
        return f"{self.prefix}journal/{run_id}/{chunk:020d}"

    def _lease_body(self, holder: dict | None, token: int, *, expired: bool = False) -> bytes:
        expires = 0 if expired else int((time.time() + self.ttl) * 1000)  # advisory for other clients
        return json.dumps({"holder": holder, "token": token, "expires_at": expires}).encode()

    def _chunks(self, run_id: str) -> list[str]:
        return self._bucket.list(f"{self.prefix}journal/{run_id}/")

    # ---- journal face --------------------------------------------------------------------
    def _load(self, run_id: str) -> list[str]:
        lines: list[str] = []
        for key in self._chunks(run_id):
            try:
                data = self._bucket.get(key)
            except KeyError:  # ObjectNotFound: removed while we listed
                continue
            if data:
                lines.extend(data.decode("utf-8").split("\n"))
        return lines

    def _claim(self, run_id: str, holder: dict) -> tuple[int, str]:
        """Claim the lease object (create, or take over an expired one by CAS): (token, version)."""
        key = self._lease_key(run_id)
        try:
            return 1, self._bucket.put(key, self._lease_body(holder, 1), mode="create") or ""
        except ObjectPreconditionFailed:
            pass
        found = self._bucket.get_versioned(key)
        current: dict[str, Any] = json.loads(found[0]) if found else {"token": 0, "expires_at": 0, "holder": None}
        live = current.get("holder") is not None and current.get("expires_at", 0) > time.time() * 1000
        if live and not holder_is_dead(current["holder"]):  # a dead holder on this machine: take over now
            raise RunLocked(f"run {run_id!r} is being written by {describe_holder(current['holder'])}; wait for its "
                            "lease to expire or stop that process", run_id=run_id, holder=current["holder"])
        token = int(current.get("token", 0)) + 1
        mode: PutMode = IfVersion(found[1]) if found else "create"
        try:
            return token, self._bucket.put(key, self._lease_body(holder, token), mode=mode) or ""
        except ObjectPreconditionFailed:
            raise RunLocked(f"run {run_id!r} was just taken by another writer", run_id=run_id) from None

    def _acquire(self, run_id: str) -> BucketLease:
        self._need_cas("acquire()")
        started = time.monotonic()
        holder = {**holder_info(), "lease": uuid.uuid4().hex}
        token, version = self._claim(run_id, holder)
        holder["token"] = token
        chunks = self._chunks(run_id)
        fence = int(chunks[-1].rsplit("/", 1)[1]) + 1 if chunks else 0
        while True:  # the fence: a previous holder's next append collides on this key
            try:
                self._bucket.put(self._chunk_key(run_id, fence), b"", mode="create")
                break
            except ObjectPreconditionFailed:
                fence += 1
        next_seq = len(self._load(run_id))
        return BucketLease(self, run_id, token, holder, version, started, fence + 1, next_seq)

    def _append(self, run_id: str, lines: Sequence[str], *, lease: Any, seq: int, sync: bool = True) -> None:
        try:
            self._bucket.put(self._chunk_key(run_id, lease.next_chunk), "\n".join(lines).encode("utf-8"), mode="create")
        except ObjectPreconditionFailed:
            lease._lost = "another writer fenced this one off"
            raise LeaseLost(f"run {run_id!r}: journal chunk {lease.next_chunk} was already written by another holder; "
                            "this writer was fenced off: open the run again", run_id=run_id) from None
        lease.next_chunk += 1

    def list(self) -> list[str]:
        base = f"{self.prefix}journal/"
        return sorted({k[len(base):].split("/", 1)[0] for k in self._bucket.list(base)})

    def _remove(self, run_id: str) -> bool:
        key = self._lease_key(run_id)
        try:
            current = json.loads(self._bucket.get(key))
        except KeyError:  # ObjectNotFound: no lease object
            current = None
        if current and current.get("holder") is not None and current.get("expires_at", 0) > time.time() * 1000:
            raise RunLocked(f"run {run_id!r} is being written by {describe_holder(current['holder'])}; stop it "
                            "before cleaning", run_id=run_id, holder=current["holder"])
        chunks = self._chunks(run_id)
        for chunk in chunks:
            self._bucket.delete(chunk)
        if current is not None:
            self._bucket.delete(key)
        return bool(chunks)

    @property
    def objects(self) -> Objects:
        return self._objects


ObjectDurableStore = BucketStore  # the seed's name


# URL query option -> (where it goes, obstore key, conversion). "config" goes to the store's config,
# "client" to its HTTP client options, "ours" to BucketStore. Nothing else is accepted.
_COMMON: dict[str, tuple[str, str, Callable[[str], Any]]] = {
    "allow_http": ("client", "allow_http", parse_bool),
    "timeout": ("client", "timeout", str),
    "connect_timeout": ("client", "connect_timeout", str),
    "lease_ttl_ms": ("ours", "lease_ttl_ms", int),
    "skip_signature": ("config", "skip_signature", parse_bool),
}
URL_OPTIONS: dict[str, dict[str, tuple[str, str, Callable[[str], Any]]]] = {
    "s3": {
        **_COMMON,
        "endpoint": ("config", "endpoint", str),
        "region": ("config", "region", str),
        "access_key_id": ("config", "access_key_id", str),
        "secret_access_key": ("config", "secret_access_key", str),
        "session_token": ("config", "session_token", str),
        "virtual_hosted_style_request": ("config", "virtual_hosted_style_request", parse_bool),
        "metadata_endpoint": ("config", "metadata_endpoint", str),
    },
    "gs": {
        **_COMMON,
        "endpoint": ("config", "base_url", str),
        "service_account": ("config", "service_account", str),
        "service_account_key": ("config", "service_account_key", str),
        "application_credentials": ("config", "application_credentials", str),
    },
    "az": {
        **_COMMON,
        "endpoint": ("config", "endpoint", str),
        "account_name": ("config", "account_name", str),
        "account_key": ("config", "account_key", str),
        "sas_key": ("config", "sas_key", str),
        "client_id": ("config", "client_id", str),
        "client_secret": ("config", "client_secret", str),
        "tenant_id": ("config", "tenant_id", str),
        "use_emulator": ("config", "use_emulator", parse_bool),
    },
}
_ENDPOINT_CHARS = re.compile(r"[A-Za-z0-9._~:/%@!$&'()*+,;=\[\]-]+")


def _check_endpoint(value: str, option: str, shown: str) -> str:
    """``value`` if it is an absolute http(s) URL obstore can use, else a one-line InvalidStoreUrl."""
    problem = None
    try:
        parts = urlsplit(value)
        parts.port  # noqa: B018 - raises ValueError for a port that is not a number
    except ValueError as exc:
        problem = str(exc)
    else:
        if parts.scheme not in ("http", "https") or not parts.hostname:
            problem = "it must start with http:// or https:// and name a host"
        elif not _ENDPOINT_CHARS.fullmatch(value):
            problem = "it contains characters a URL cannot hold (spaces, quotes...)"
        elif parts.query or parts.fragment:
            problem = "it must not carry a query or fragment"
    if problem:
        raise InvalidStoreUrl(f"option {option}={value!r} in {shown!r} is not a valid endpoint: {problem}; "
                              "use e.g. endpoint=http://127.0.0.1:9000", url=shown, option=option)
    return value


def from_obstore_url(url: str) -> BucketStore:
    """``s3://bucket/prefix``, ``gs://…``, ``az://…`` through obstore; options in the query string
    (``URL_OPTIONS``: endpoint, region, credentials, ``allow_http``, ``lease_ttl_ms``…), other
    settings and credentials from the usual environment variables."""
    obs, _ = _obstore()
    from obstore.store import from_url

    shown = redact(url)
    parts = split_url(url, "s3://bucket/prefix?option=value")
    scheme = parts.scheme.lower()
    table = URL_OPTIONS[scheme]
    if not parts.netloc or "@" in parts.netloc or parts.fragment:
        raise InvalidStoreUrl(f"{shown!r} must look like {scheme}://bucket/prefix?option=value (a bucket, no "
                              "credentials before it, no #fragment)", url=shown)
    given = parse_options(parts.query, {name: entry[2] for name, entry in table.items()}, url)
    config: dict[str, Any] = {}
    client: dict[str, Any] = {}
    ours: dict[str, Any] = {}
    for name, value in given.items():
        where, key, _ = table[name]
        if name in ("endpoint", "metadata_endpoint"):
            value = _check_endpoint(value, name, shown)
            if name == "endpoint" and value.startswith("http://"):
                client.setdefault("allow_http", True)
        {"config": config, "client": client, "ours": ours}[where][key] = value
    bucket_url = f"{scheme}://{parts.netloc}"
    try:
        # the config's type (S3Config, GCSConfig or AzureConfig) follows the URL's scheme, known only at run time
        store = from_url(bucket_url, config=config or None, client_options=client or None,  # type: ignore[call-overload]
                         retry_config={"max_retries": 2, "retry_timeout": timedelta(seconds=10)})
    except BaseException as exc:  # obstore raises its own errors, ValueError, or a Rust panic
        if not isinstance(exc, Exception) and not is_panic(exc):
            raise
        raise InvalidStoreUrl(f"cannot open {shown!r}: {redact(first_line(exc))}; check the bucket and the options "
                              f"({', '.join(sorted(table))})", url=shown) from None
    prefix = parts.path.strip("/")
    return BucketStore(ObstoreObjects(store, bucket_url), prefix=f"{prefix}/" if prefix else DEFAULT_PREFIX,
                       url=url.split("?", 1)[0], **ours)


BucketStore.from_url = staticmethod(from_obstore_url)  # type: ignore[attr-defined]

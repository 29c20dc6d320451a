"""Object storage as a journal store: ``ObjectDurableStore`` and ``s3://``, ``gs://``, ``az://`` URLs.

The constructor takes one ``ObjectStorage`` — three methods over a bucket, ``get(key)``,
``put(key, data, if_match=...)``, ``list(prefix)`` (plus ``delete`` for cleaning) — and
``conditional_put=True`` declaring that ``put(..., if_match="")`` is create-if-absent and
``if_match=<etag>`` compare-and-swap. Keys land under ``prefix`` (``caravanserai/durable/``):

- ``leases/<run>`` — ``{holder, token, expires_at}``, claimed with a create, renewed and taken over
  with compare-and-swap on its e-tag;
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
from datetime import timedelta
from typing import Any, Callable, Protocol, Sequence
from urllib.parse import urlsplit

from ..errors import InvalidStoreUrl, LeaseLost, ObjectConditionalPutRequired, ObjectLeaseTtlInvalid, RunLocked
from .base import ObjectStore, Store, describe_holder, holder_info
from .leases import MIN_TTL, ExpiringLease
from .obstore_objects import ObstoreObjects, _Exists, _Missing, _obstore, is_panic
from .urls import first_line, parse_bool, parse_options, redact, split_url

DEFAULT_PREFIX = "caravanserai/durable/"


class PreconditionFailed(Exception):
    """Raised by an ObjectStorage ``put`` whose ``if_match`` condition does not hold."""


class ObjectStorage(Protocol):
    def get(self, key: str) -> tuple[bytes, str] | None: ...  # (data, etag), None if absent
    def put(self, key: str, data: bytes, if_match: str | None = None) -> str: ...  # the new etag
    def list(self, prefix: str) -> list[str]: ...
    def delete(self, key: str) -> None: ...


class ObstoreStorage:
    """``ObjectStorage`` over an obstore store (S3, GCS, Azure, memory), conditional puts included."""

    def __init__(self, store: Any, description: str = "") -> None:
        self.objects = ObstoreObjects(store, description)

    def get(self, key: str) -> tuple[bytes, str] | None:
        obs, _ = _obstore()

        def read() -> tuple[bytes, str]:  # the body streams: errors may surface while reading it
            result = obs.get(self.objects.store, key)
            return bytes(result.bytes()), _version(result.meta)

        try:
            return self.objects._call(read)
        except _Missing:
            return None

    def put(self, key: str, data: bytes, if_match: str | None = None) -> str:
        obs, _ = _obstore()
        mode: Any = "overwrite" if if_match is None else "create" if if_match == "" else json.loads(if_match)
        try:
            result = self.objects._call(obs.put, self.objects.store, key, bytes(data), mode=mode)
        except (_Exists, _Missing):
            raise PreconditionFailed(key) from None
        return _version(result)

    def list(self, prefix: str) -> list[str]:
        return self.objects.list(prefix)

    def delete(self, key: str) -> None:
        self.objects.delete(key)


def _version(meta: Any) -> str:
    # obstore 0.12 rejects None values in an update mode, so keep only what the server sent.
    return json.dumps({k: meta[k] for k in ("e_tag", "version") if meta.get(k) is not None}, sort_keys=True)


class ObjectLease(ExpiringLease):
    def __init__(self, store: "ObjectDurableStore", run_id: str, token: int, holder: dict, etag: str, started: float,
                 next_chunk: int, next_seq: int) -> None:
        self.etag = etag
        self.next_chunk = next_chunk
        self.next_seq = next_seq
        super().__init__(store, run_id, token, holder, store.ttl, started=started)

    def _renew(self) -> None:
        try:
            self.etag = self.store.storage.put(self.store._lease_key(self.run_id),
                                               self.store._lease_body(self.holder, self.token), if_match=self.etag)
        except PreconditionFailed:
            raise LeaseLost(f"run {self.run_id!r}: the lease object changed (taken over)", run_id=self.run_id) from None

    def _release_remote(self) -> None:
        self.store.storage.put(self.store._lease_key(self.run_id), self.store._lease_body(None, self.token, expired=True),
                               if_match=self.etag)


class _PrefixedObjects(ObjectStore):
    def __init__(self, store: "ObjectDurableStore") -> None:
        self.store = store

    def _key(self, key: str) -> str:
        return f"{self.store.prefix}objects/{self.check_key(key)}"

    def put(self, key: str, data: bytes) -> None:
        self.store.storage.put(self._key(key), bytes(data))

    def put_if_absent(self, key: str, data: bytes) -> bool:
        self.store._need_conditional("put_if_absent")
        try:
            self.store.storage.put(self._key(key), bytes(data), if_match="")
        except PreconditionFailed:
            return False
        return True

    def get(self, key: str) -> bytes:
        found = self.store.storage.get(self._key(key))
        if found is None:
            raise self._missing(key)
        return found[0]

    def exists(self, key: str) -> bool:
        return self.store.storage.get(self._key(key)) is not None

    def list(self, prefix: str = "") -> list[str]:
        base = f"{self.store.prefix}objects/"
        return sorted(k[len(base):] for k in self.store.storage.list(base + prefix) if k.startswith(base + prefix))

    def delete(self, key: str) -> bool:
        if not self.exists(key):
            return False
        self.store.storage.delete(self._key(key))
        return True


class ObjectDurableStore(Store):
    """A journal and objects in a bucket, with leases built on conditional writes."""

    scheme = "object"

    def __init__(self, storage: ObjectStorage, *, conditional_put: bool = False, lease_ttl_ms: int = 30_000,
                 prefix: str = DEFAULT_PREFIX, url: str | None = None) -> None:
        if lease_ttl_ms < MIN_TTL * 1000:
            raise ObjectLeaseTtlInvalid(f"lease must be at least {int(MIN_TTL * 1000)}ms (got {lease_ttl_ms}ms)",
                                        lease_ttl_ms=lease_ttl_ms)
        self.storage = storage
        self.conditional_put = conditional_put
        self.ttl = lease_ttl_ms / 1000
        self.prefix = prefix if prefix.endswith("/") or not prefix else prefix + "/"
        self.url = url or f"object://{type(storage).__name__}/{self.prefix}"
        self._objects = _PrefixedObjects(self)

    def _need_conditional(self, what: str) -> None:
        if not self.conditional_put:
            raise ObjectConditionalPutRequired(
                f"{what} on object storage needs conditional writes: pass conditional_put=True only if your storage's "
                "put(key, data, if_match='') is create-if-absent (S3, GCS and Azure through obstore are)",
            )

    def _lease_key(self, run_id: str) -> str:
        return f"{self.prefix}leases/{run_id}"

    def _chunk_key(self, run_id: str, chunk: int) -> str:
        return f"{self.prefix}journal/{run_id}/{chunk:020d}"

    def _lease_body(self, holder: dict | None, token: int, *, expired: bool = False) -> bytes:
        expires = 0 if expired else int((time.time() + self.ttl) * 1000)  # advisory for other clients
        return json.dumps({"holder": holder, "token": token, "expires_at": expires}).encode()

    def _chunks(self, run_id: str) -> list[str]:
        base = f"{self.prefix}journal/{run_id}/"
        return sorted(k for k in self.storage.list(base) if k.startswith(base))

    # ---- journal face --------------------------------------------------------------------
    def _load(self, run_id: str) -> list[str]:
        lines: list[str] = []
        for key in self._chunks(run_id):
            found = self.storage.get(key)
            if found and found[0]:
                lines.extend(found[0].decode("utf-8").split("\n"))
        return lines

    def _acquire(self, run_id: str) -> ObjectLease:
        self._need_conditional("acquire()")
        started = time.monotonic()
        holder = {**holder_info(), "lease": uuid.uuid4().hex}
        key = self._lease_key(run_id)
        try:
            token, etag = 1, self.storage.put(key, self._lease_body(holder, 1), if_match="")
        except PreconditionFailed:
            found = self.storage.get(key)
            current = json.loads(found[0]) if found else {"token": 0, "expires_at": 0, "holder": None}
            if current.get("holder") is not None and current.get("expires_at", 0) > time.time() * 1000:
                raise RunLocked(f"run {run_id!r} is being written by {describe_holder(current['holder'])}; wait for its "
                                "lease to expire or stop that process", run_id=run_id, holder=current["holder"]) from None
            token = int(current.get("token", 0)) + 1
            try:
                etag = self.storage.put(key, self._lease_body(holder, token), if_match=found[1] if found else "")
            except PreconditionFailed:
                raise RunLocked(f"run {run_id!r} was just taken by another writer", run_id=run_id) from None
        holder["token"] = token
        chunks = self._chunks(run_id)
        fence = int(chunks[-1].rsplit("/", 1)[1]) + 1 if chunks else 0
        while True:  # the fence: a previous holder's next append collides on this key
            try:
                self.storage.put(self._chunk_key(run_id, fence), b"", if_match="")
                break
            except PreconditionFailed:
                fence += 1
        next_seq = len(self._load(run_id))
        return ObjectLease(self, run_id, token, holder, etag, started, fence + 1, next_seq)

    def _append(self, run_id: str, lines: Sequence[str], *, lease: Any, seq: int, sync: bool = True) -> None:
        if not isinstance(lease, ObjectLease) or lease.run_id != run_id or lease.store is not self:
            raise ValueError(f"append to run {run_id!r} needs a lease on that run from this store")
        lease.check()
        if seq != lease.next_seq:
            raise ValueError(f"append to run {run_id!r} at seq {seq}, but the journal's next seq is {lease.next_seq}")
        try:
            self.storage.put(self._chunk_key(run_id, lease.next_chunk), "\n".join(lines).encode("utf-8"), if_match="")
        except PreconditionFailed:
            lease._lost = "another writer fenced this one off"
            raise LeaseLost(f"run {run_id!r}: journal chunk {lease.next_chunk} was already written by another holder; "
                            "this writer was fenced off: open the run again", run_id=run_id) from None
        lease.next_chunk += 1
        lease.next_seq += len(lines)

    def list(self) -> list[str]:
        base = f"{self.prefix}journal/"
        return sorted({k[len(base):].split("/", 1)[0] for k in self.storage.list(base) if k.startswith(base)})

    def _remove(self, run_id: str) -> bool:
        found = self.storage.get(self._lease_key(run_id))
        if found:
            current = json.loads(found[0])
            if current.get("holder") is not None and current.get("expires_at", 0) > time.time() * 1000:
                raise RunLocked(f"run {run_id!r} is being written by {describe_holder(current['holder'])}; stop it "
                                "before cleaning", run_id=run_id, holder=current["holder"])
        chunks = self._chunks(run_id)
        for key in chunks:
            self.storage.delete(key)
        if found:
            self.storage.delete(self._lease_key(run_id))
        return bool(chunks)

    @property
    def objects(self) -> ObjectStore:
        return self._objects


# URL query option -> (where it goes, obstore key, conversion). "config" goes to the store's config,
# "client" to its HTTP client options, "ours" to ObjectDurableStore. Nothing else is accepted.
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


def from_obstore_url(url: str) -> ObjectDurableStore:
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
        store = from_url(bucket_url, config=config or None, client_options=client or None,
                         retry_config={"max_retries": 2, "retry_timeout": timedelta(seconds=10)})
    except BaseException as exc:  # obstore raises its own errors, ValueError, or a Rust panic
        if not isinstance(exc, Exception) and not is_panic(exc):
            raise
        raise InvalidStoreUrl(f"cannot open {shown!r}: {redact(first_line(exc))}; check the bucket and the options "
                              f"({', '.join(sorted(table))})", url=shown) from None
    prefix = parts.path.strip("/")
    try:
        return ObjectDurableStore(ObstoreStorage(store, bucket_url), conditional_put=True, prefix=f"{prefix}/" if prefix
                                  else DEFAULT_PREFIX, url=url.split("?", 1)[0], **ours)
    except ObjectLeaseTtlInvalid as exc:
        raise InvalidStoreUrl(f"{exc.message} in {shown!r}", url=shown, option="lease_ttl_ms") from None


ObjectDurableStore.from_url = staticmethod(from_obstore_url)  # type: ignore[attr-defined]

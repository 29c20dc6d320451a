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
  refused: safety does not rest on clocks. Chunks are never deleted while the run exists: they are
  the fence;
- ``segments/<run>/<through:020d>`` — a write-once *segment*: every line of chunks ``0..through``
  after a one-line JSON header (``{"segment": 1, "run", "from", "through", "lines", "token"}``). The
  lease holder writes one every ``compact_every`` chunks (256) and on release;
- ``segments/<run>/<from:020d>-<through:020d>`` — a write-once *delta* (header ``{"delta": 1, ...}``):
  the lines of every chunk since the segment (``from`` is the segment's ``through + 1``), written
  every ``delta_every`` chunks (16) between segments, each replacing the one before;
- ``segments/<run>/head`` — ``{"through": n, "deltas": [[from, through]]}``: the newest segment and
  delta, overwritten by the holder after each segment or delta; the segment and deltas a new
  segment replaces are deleted after the head moved;
- reading: GET the head, then the segment and delta it names while the chunks after them are
  fetched in parallel batches (1, 2, 4, 8, 16 at a time; 16 at once after a delta) up to the first
  missing one — no listing, so a released run loads in three requests (head, segment, one probe)
  whatever its length, and a killed holder's successor fetches one delta and at most 16 chunks
  more. Without a head (runs written before segments, or younger than their first delta) the
  chunks are read from 0 the same way (8 at once for a writer opening such a run whose lease object
  exists: a short journal in one round trip); a head naming a part replaced meanwhile sends the
  reader to the newest segment listed;
- opening a run: the head, the lease object and a create of the lease object go out at once; the
  lease is then claimed (created, or compare-and-swapped on the version read), the fence chunk
  written after the tail, and the first append follows: a writer taking over a short run (no head
  yet, at most 7 chunks) reaches its first acknowledged append in four round trips (six before
  issue 24); a holder the early read saw live is read once more before ``RunLocked``;
- ``objects/<key>`` — the object face.

Why a segment or delta can never hold a line the chunks do not: the holder covers only chunks it
read after its fence (final from then on: a fenced writer cannot add a key below the fence) or
wrote itself (create-only puts that succeeded), so two parts over the same chunks hold the same
bytes, a fenced writer's refused chunk is in none, and a kill at any point leaves every chunk and
parts the head may name; the head is a hint, never trusted past what it names.
"""

from __future__ import annotations

import json
import os
import re
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from datetime import timedelta
from typing import Any, Protocol, runtime_checkable
from urllib.parse import urlsplit

from ..errors import (
    InvalidStoreUrl,
    JournalCorruptionError,
    LeaseLost,
    ObjectCompactionInvalid,
    ObjectConditionalPutRequired,
    ObjectLeaseTtlInvalid,
    ObjectLeaseTtlOptionInvalid,
    ObjectNotFound,
    ObjectPreconditionFailed,
    RunLocked,
    StoreUnavailable,
)
from .base import (
    IfVersion,
    Objects,
    PrefixedObjects,
    PutMode,
    Store,
    describe_holder,
    holder_info,
    holder_is_dead,
    removal_refused,
)
from .leases import DEFAULT_TTL_MS, ExpiringLease, check_lease_ttl
from .obstore_objects import ObstoreObjects, _obstore, is_panic
from .urls import first_line, parse_bool, parse_options, redact, split_url

__all__ = ["BucketStore", "ObjectDurableStore", "ObjectStorage", "ObstoreStorage", "PreconditionFailed",
           "StorageObjects", "StorageView", "from_obstore_url"]

DEFAULT_PREFIX = "caravanserai/durable/"

#: Chunks between segments. A segment holds the whole journal, so a run of N appends uploads about
#: N/512 lines per append, in one PUT per 256 appends: small next to the PUT each append costs, up
#: to runs of a few hundred thousand appends; fewer chunks between segments would upload more.
COMPACT_EVERY = 256
#: Chunks between deltas (every line since the segment, at most 255 chunks' worth), so that the next
#: holder after a kill fetches one delta and at most 15 chunks more, not up to 255 chunks.
DELTA_EVERY = 16
_FETCHERS = 16  # parallel GETs: obstore's blocking calls release the GIL
_SEGMENT_FORMAT = 1

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
                 next_chunk: int, next_seq: int, view: _View | None = None) -> None:
        self.version = version
        self.next_chunk = next_chunk
        view = view or _View(-1, None, [], False, [])
        self.lines = view.lines  # chunks 0..next_chunk-1: what a segment written now must hold
        self.segment_through = view.through  # the newest segment this holder knows (-1: none)
        self.segment_key = view.segment_key
        self.deltas = view.deltas  # (first, through) of the deltas after it, as the head names them
        self.segment_lines = view.segment_lines  # how many lines that segment holds
        self.superseded: list[str] = []  # deltas a longer one replaced: deleted with the next segment
        self.unsegmented = view.unsegmented  # a non-empty chunk after them
        self.compacted = False  # whether this holder wrote a segment
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
        if time.monotonic() < self._deadline:  # still ours: compact what this holder has not yet
            store._compact(self, tidy=True)
        store._bucket.put(store._lease_key(self.run_id), store._lease_body(None, self.token, expired=True),
                          mode=IfVersion(self.version))


ObjectLease = BucketLease


class _View:
    """A run's journal as read: the segment and deltas used, every line, how many the segment holds
    and whether a non-empty chunk follows the segment and deltas."""

    __slots__ = ("deltas", "lines", "segment_key", "segment_lines", "through", "unsegmented")

    def __init__(self, through: int, segment_key: str | None, lines: list[str], unsegmented: bool,
                 deltas: list[tuple[int, int]], segment_lines: int = 0) -> None:
        self.through, self.segment_key, self.lines, self.unsegmented = through, segment_key, lines, unsegmented
        self.deltas, self.segment_lines = deltas, segment_lines


class _SegmentGone(Exception):
    """The segment a reader picked was replaced (and deleted) before it could be read."""


def _found(read: Future[Any], own: str) -> bool:
    """Whether a read (``get_versioned``) of a lease object found one that is not this acquire's own
    (its create can land before the read); a failed read says no (the claim raises it)."""
    try:
        found = read.result()
        return found is not None and (json.loads(found[0]).get("holder") or {}).get("lease") != own
    except Exception:  # noqa: BLE001 - the same read's error reaches the caller through _claim
        return False


def _number(name: str) -> int | None:
    """The chunk or segment number a key ends with (20 digits), None for anything else."""
    return int(name) if len(name) == 20 and name.isdigit() else None


class BucketStore(Store):
    """A journal and objects in a bucket, with leases built on conditional writes."""

    scheme = "object"

    def __init__(self, objects: Objects | ObjectStorage, *, conditional_put: bool = False,
                 lease_ttl_ms: int = DEFAULT_TTL_MS, prefix: str = DEFAULT_PREFIX, url: str | None = None,
                 compact_every: int = COMPACT_EVERY, delta_every: int = DELTA_EVERY) -> None:
        ttl_ms = check_lease_ttl(lease_ttl_ms, error=ObjectLeaseTtlInvalid)
        for name, value in (("compact_every", compact_every), ("delta_every", delta_every)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ObjectCompactionInvalid(f"{name} must be a whole number of appends, at least 1 (got {value!r}); "
                                              f"leave it out for the default ({COMPACT_EVERY} / {DELTA_EVERY})",
                                              option=name, value=repr(value))
        self.compact_every, self.delta_every = compact_every, delta_every
        self._pool: ThreadPoolExecutor | None = None
        self._pool_pid = 0
        self._pool_lock = threading.Lock()
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

    def _segment_key(self, run_id: str, through: int) -> str:
        return f"{self.prefix}segments/{run_id}/{through:020d}"

    def _head_key(self, run_id: str) -> str:
        return f"{self.prefix}segments/{run_id}/head"

    def _delta_key(self, run_id: str, first: int, through: int) -> str:
        return f"{self.prefix}segments/{run_id}/{first:020d}-{through:020d}"

    def _chunks(self, run_id: str) -> list[str]:
        return self._bucket.list(f"{self.prefix}journal/{run_id}/")

    # ---- reading: the head, then its segment, its deltas and the chunks after them, in parallel
    def _fetcher(self) -> ThreadPoolExecutor:
        with self._pool_lock:  # one pool per process: a forked child builds its own
            if self._pool is None or self._pool_pid != os.getpid():
                self._pool = ThreadPoolExecutor(2 * _FETCHERS, thread_name_prefix="caravanserai-bucket")
                self._pool_pid = os.getpid()
            return self._pool

    def _head(self, run_id: str) -> tuple[int, list[tuple[int, int]]]:
        """The segment and the deltas after it that the run's head names ((-1, []): none). Only a hint:
        it may name older ones than the newest (a holder killed between puts), never past the chunks."""
        try:
            head = json.loads(self._bucket.get(self._head_key(run_id)))
            through, deltas = head["through"], [(int(a), int(b)) for a, b in head.get("deltas", [])]
        except (ObjectNotFound, ValueError, KeyError, TypeError, AttributeError):
            return -1, []
        if type(through) is not int or through < -1:
            return -1, []
        mark = through
        for first, last in deltas:  # a chain: each delta starts right after what precedes it
            if first != mark + 1 or last < first:
                return through, []
            mark = last
        return through, deltas

    def _segments(self, run_id: str) -> list[tuple[int, str]]:
        """``(through, key)`` of the run's segments, oldest first (more than one only after a kill)."""
        base = f"{self.prefix}segments/{run_id}/"
        return sorted((n, k) for k in self._bucket.list(base) if (n := _number(k[len(base):])) is not None)

    def _read_part(self, run_id: str, kind: str, first: int, through: int) -> list[str]:
        """The lines of a ``"segment"`` (chunks ``0..through``) or a ``"delta"`` (``first..through``), checked."""
        key = self._segment_key(run_id, through) if kind == "segment" else self._delta_key(run_id, first, through)
        try:
            data = self._bucket.get(key)
        except ObjectNotFound:
            raise _SegmentGone from None
        try:
            head, *lines = data.decode("utf-8").split("\n")  # one pass over a large segment, no copy of its body
            header = json.loads(head)
            ok = (header.get(kind) == _SEGMENT_FORMAT and header.get("run") == run_id
                  and (header.get("from"), header.get("through")) == (first, through))
        except (ValueError, AttributeError):  # UnicodeDecodeError is a ValueError
            ok, header, head, lines = False, {}, data[:120].decode("utf-8", "replace"), []
        if lines == [""]:
            lines = []
        if not ok or header.get("lines") != len(lines):
            raise JournalCorruptionError(f"run {run_id!r}: {kind} {key!r} is damaged or not a {kind} of this run "
                                         f"(header {head[:120]!r}, {len(lines)} lines); remove it: the chunks still "
                                         "hold the journal", run_id=run_id, key=key, line=None)
        return lines

    def _start(self, run_id: str, through: int, deltas: list[tuple[int, int]]) -> list[Future[list[str]]]:
        parts = ([("segment", 0, through)] if through >= 0 else []) + [("delta", a, b) for a, b in deltas]
        return [self._fetcher().submit(self._read_part, run_id, *part) for part in parts]

    def _get_chunk(self, key: str) -> bytes | None:
        try:
            return self._bucket.get(key)
        except ObjectNotFound:
            return None

    def _probe(self, run_id: str, start: int, batch: int = 1) -> list[tuple[int, bytes]]:
        """Chunks ``start, start + 1, ...`` up to the first missing one, fetched in parallel batches that
        grow (1, 2, 4, 8, 16: a released run's reader misses once), with no listing. Chunk numbers have
        no gaps, so what comes back is the journal's tail as it stood at some instant during the read."""
        found: list[tuple[int, bytes]] = []
        while True:
            keys = [self._chunk_key(run_id, start + i) for i in range(batch)]
            bodies = list(self._fetcher().map(self._get_chunk, keys)) if batch > 1 else [self._get_chunk(keys[0])]
            for i, body in enumerate(bodies):  # the whole batch is back: nothing left running
                if body is None:
                    return found
                found.append((start + i, body))
            start, batch = start + batch, min(2 * batch, _FETCHERS)

    @staticmethod
    def _tail_start(through: int, deltas: list[tuple[int, int]], existed: bool = False) -> tuple[int, int]:
        """Where the chunks after the head's parts start, and the first probe batch: a head with deltas
        was written mid-run, so chunks likely follow (up to ``delta_every``): probe 16 at once. No head
        for a run that ``existed`` (its lease object is there): younger than its first delta, so 8."""
        if deltas:
            return deltas[-1][1] + 1, _FETCHERS
        return (0, _FETCHERS // 2) if through < 0 and existed else (through + 1, 1)

    def _read_ahead(self, run_id: str, ahead: Future[Any], lease: Future[Any], own: str) -> None:
        """The head, its parts on their way and the chunks after them, for an ``acquire`` (into ``ahead``).

        ``lease`` is the lease object's read, made alongside the head's: a run without a head whose
        lease object exists is younger than its first delta (a writer killed early, a short run), so
        its chunks are probed 8 at once (one round trip for a short journal); a new run's, one."""
        try:
            through, deltas = self._head(run_id)
            parts = self._start(run_id, through, deltas)
            existed = through < 0 and _found(lease, own)  # only asked when there is no head
            ahead.set_result((through, deltas, parts, self._probe(run_id, *self._tail_start(through, deltas, existed))))
        except BaseException as exc:  # noqa: BLE001 - handed to the acquiring thread
            ahead.set_exception(exc)

    def _view(self, run_id: str, through: int, deltas: list[tuple[int, int]], parts: list[Future[list[str]]],
              chunks: list[tuple[int, bytes]]) -> _View:
        lines: list[str] = []
        for part in parts:
            lines.extend(part.result())  # _SegmentGone: replaced meanwhile
        segment_lines = len(parts[0].result()) if through >= 0 else 0
        view = _View(through, self._segment_key(run_id, through) if through >= 0 else None, lines, False, deltas,
                     segment_lines)
        for _, data in chunks:
            if data:
                lines.extend(data.decode("utf-8").split("\n"))
                view.unsegmented = True
        return view

    def _read(self, run_id: str) -> _View:
        """What the head names and the chunks after it; if a part was replaced meanwhile, the newest
        segment listed and the chunks after it."""
        through, deltas = self._head(run_id)
        for _ in range(5):
            parts = self._start(run_id, through, deltas)
            chunks = self._probe(run_id, *self._tail_start(through, deltas))
            try:
                return self._view(run_id, through, deltas, parts, chunks)
            except _SegmentGone:
                segments = self._segments(run_id)
                through, deltas = (segments[-1][0] if segments else -1), []
        raise StoreUnavailable(f"run {run_id!r} kept changing while it was read from {self._describe()}; retry",
                               run_id=run_id)

    # ---- journal face --------------------------------------------------------------------
    def _load(self, run_id: str) -> list[str]:
        return self._read(run_id).lines

    def _load_held(self, lease: Any) -> list[str]:
        if isinstance(lease, BucketLease) and lease.held:
            return list(lease.lines)  # read at acquire and kept up to date by every append
        return self._load(lease.run_id)

    def _compact(self, lease: BucketLease, *, tidy: bool = False) -> None:
        """On release: the segment through the holder's last chunk, then (``tidy``, if this holder wrote
        any) every older segment and delta, such as those a killed holder left, deleted."""
        self._write_segment(lease)
        if not (tidy and lease.compacted):
            return
        base = f"{self.prefix}segments/{lease.run_id}/"
        try:
            older = []
            for key in self._bucket.list(base):
                name = key[len(base):]
                segment, delta_end = _number(name), _number(name.rsplit("-", 1)[-1]) if "-" in name else None
                if (segment is not None and segment < lease.segment_through) or \
                        (delta_end is not None and delta_end <= lease.segment_through):
                    older.append(key)
            self._delete(older)
        except Exception:  # noqa: BLE001 - left for the next holder's release
            pass

    def _write_segment(self, lease: BucketLease) -> None:
        """The segment through the holder's last chunk; the head moved to it; the segment and deltas it
        replaces deleted. Best effort: the chunks hold the journal, so a failure (or a kill) at any
        point here loses nothing."""
        through = lease.next_chunk - 1
        if not (lease.unsegmented or lease.deltas) or through <= lease.segment_through:
            return
        key = self._segment_key(lease.run_id, through)
        try:
            self._put_part(lease, key, "segment", 0, through, lease.lines)
            self._bucket.put(self._head_key(lease.run_id), json.dumps({"through": through, "deltas": []}).encode())
            replaced = [lease.segment_key] if lease.segment_key and lease.segment_key != key else []
            replaced += [self._delta_key(lease.run_id, a, b) for a, b in lease.deltas] + lease.superseded
            lease.segment_key, lease.segment_through, lease.deltas, lease.superseded = key, through, [], []
            lease.segment_lines, lease.unsegmented, lease.compacted = len(lease.lines), False, True
            self._delete(replaced)  # a reader that picked one of these reads again (from the head it moved)
        except Exception:  # noqa: BLE001 - an unreachable store: the next compaction (or holder) retries
            pass

    def _delete(self, keys: list[str]) -> None:
        delete_many = getattr(self._bucket, "delete_many", None)
        if delete_many is not None:  # one request (S3 DeleteObjects), not two per key
            delete_many(keys)
            return
        for key in keys:
            self._bucket.delete(key)

    def _write_delta(self, lease: BucketLease) -> None:
        """A delta of every chunk since the segment (so the head names one; at most ``compact_every``
        chunks' lines), the head moved to it (best effort, as segments)."""
        through, first = lease.next_chunk - 1, lease.segment_through + 1
        if not lease.unsegmented or through < first:
            return
        try:
            self._put_part(lease, self._delta_key(lease.run_id, first, through), "delta", first, through,
                           lease.lines[lease.segment_lines:])
            self._bucket.put(self._head_key(lease.run_id),
                             json.dumps({"through": lease.segment_through, "deltas": [[first, through]]}).encode())
            lease.superseded += [self._delta_key(lease.run_id, a, b) for a, b in lease.deltas]
            lease.deltas, lease.unsegmented = [(first, through)], False
        except Exception:  # noqa: BLE001 - as for segments
            pass

    def _put_part(self, lease: BucketLease, key: str, kind: str, first: int, through: int, lines: list[str]) -> None:
        header = json.dumps({kind: _SEGMENT_FORMAT, "run": lease.run_id, "from": first, "through": through,
                             "lines": len(lines), "token": lease.token})
        try:
            self._bucket.put(key, "\n".join([header, *lines]).encode("utf-8"), mode="create")
        except ObjectPreconditionFailed:
            pass  # written by another holder over the same chunks: the same lines

    def _claim(self, run_id: str, holder: dict, early: Future[Any] | None = None) -> tuple[int, str]:
        """Claim the lease object (create, or take over an expired one by CAS): (token, version).

        ``early``: the lease object read while the create is tried (``_acquire``), so opening a run
        that exists (a takeover, a re-open) costs two round trips, not three."""
        key = self._lease_key(run_id)
        try:
            return 1, self._bucket.put(key, self._lease_body(holder, 1), mode="create") or ""
        except ObjectPreconditionFailed:
            pass
        found = early.result() if early is not None else None
        early_read = found is not None  # from before the create: a refusal is read again first
        swaps = 0
        while swaps < 2:  # a compare-and-swap lost to another writer: read again, which names it
            if found is None:  # not read early, read before the object that refused the create, or a lost swap
                found = self._bucket.get_versioned(key)
            current: dict[str, Any] = json.loads(found[0]) if found else {"token": 0, "expires_at": 0, "holder": None}
            live = current.get("holder") is not None and current.get("expires_at", 0) > time.time() * 1000
            if live and not holder_is_dead(current["holder"]):  # a dead holder on this machine: take over now
                if early_read:  # released since that read, perhaps: judged on a fresh one
                    early_read, found = False, None
                    continue
                raise RunLocked(f"run {run_id!r} is being written by {describe_holder(current['holder'])}; wait for its "
                                "lease to expire or stop that process", run_id=run_id, holder=current["holder"])
            token = int(current.get("token", 0)) + 1
            mode: PutMode = IfVersion(found[1]) if found else "create"
            try:
                return token, self._bucket.put(key, self._lease_body(holder, token), mode=mode) or ""
            except ObjectPreconditionFailed:
                swaps, early_read, found = swaps + 1, False, None  # taken between the read and the write
        raise RunLocked(f"run {run_id!r} was taken by another writer between two reads of its lease object, twice, and "
                        "neither read named a live holder (each released it at once); retry", run_id=run_id, holder=None)

    def _acquire(self, run_id: str) -> BucketLease:
        self._need_cas("acquire()")
        started = time.monotonic()
        holder = {**holder_info(), "lease": uuid.uuid4().hex}
        # The journal is read while the lease is claimed: what the read missed (chunks a paused holder
        # wrote meanwhile) collides with the fence below and is read then.
        ahead: Future[Any] = Future()
        lease = self._fetcher().submit(self._bucket.get_versioned, self._lease_key(run_id))
        threading.Thread(target=self._read_ahead, args=(run_id, ahead, lease, holder["lease"]), name="caravanserai-acquire",
                         daemon=True).start()
        token, version = self._claim(run_id, holder, lease)
        holder["token"] = token
        through, deltas, parts, chunks = ahead.result()
        fence = (chunks[-1][0] if chunks else self._tail_start(through, deltas)[0] - 1) + 1
        while True:  # the fence: a previous holder's next append collides on this key
            key = self._chunk_key(run_id, fence)
            try:
                self._bucket.put(key, b"", mode="create")
                break
            except ObjectPreconditionFailed:  # that holder's last append landed first: it is read too
                chunks.append((fence, self._get_chunk(key) or b""))
                fence += 1
        try:  # everything below the fence is final now
            view = self._view(run_id, through, deltas, parts, chunks)
        except _SegmentGone:  # replaced (with the same lines) meanwhile: read again, up to the fence
            view = self._read(run_id)
        return BucketLease(self, run_id, token, holder, version, started, fence + 1, len(view.lines), view)

    def _append(self, run_id: str, lines: Sequence[str], *, lease: Any, seq: int, sync: bool = True) -> None:
        try:
            self._bucket.put(self._chunk_key(run_id, lease.next_chunk), "\n".join(lines).encode("utf-8"), mode="create")
        except ObjectPreconditionFailed:
            lease._lost = "another writer fenced this one off"
            raise LeaseLost(f"run {run_id!r}: journal chunk {lease.next_chunk} was already written by another holder; "
                            "this writer was fenced off: open the run again", run_id=run_id) from None
        lease.next_chunk += 1
        lease.lines.extend(lines)
        lease.unsegmented = True
        if lease.next_chunk - 1 - lease.segment_through >= self.compact_every:
            self._write_segment(lease)
        elif lease.next_chunk - 1 - (lease.deltas[-1][1] if lease.deltas else lease.segment_through) >= self.delta_every:
            self._write_delta(lease)

    def list(self) -> list[str]:
        base = f"{self.prefix}journal/"
        children = getattr(self._bucket, "list_children", None)
        if children is not None:  # one key per run: a delimiter listing
            return sorted(children(base))
        return sorted({k[len(base):].split("/", 1)[0] for k in self._bucket.list(base)})

    def _journal_versions(self, run_ids: Sequence[str] | None) -> dict[str, str]:
        """Each run's chunk count (chunks are numbered without gaps and never deleted while the run
        exists): its head and the chunks after it, many runs in parallel; no segment is read."""
        def count(run_id: str) -> tuple[str, int]:
            through, deltas = self._head(run_id)
            start, batch = self._tail_start(through, deltas)
            return run_id, start + len(self._probe(run_id, start, batch))

        wanted = self.list() if run_ids is None else list(run_ids)
        with ThreadPoolExecutor(min(_FETCHERS, max(1, len(wanted))), thread_name_prefix="caravanserai-versions") as pool:
            return {run_id: f"chunks:{n}" for run_id, n in pool.map(count, wanted) if n > 0}

    def _remove(self, run_id: str) -> bool:
        """Claim the lease first (a holder whose lease expired is fenced off: its late renewal's compare-
        and-swap fails), delete the run, then leave the lease object expired with its token, so tokens
        never start over for that run id."""
        key = self._lease_key(run_id)
        claimed: tuple[int, str] | None = None
        if self._bucket.supports_cas:
            try:
                claimed = self._claim(run_id, {**holder_info(), "removing": True})
            except RunLocked as exc:
                raise removal_refused(run_id, exc) from None
        self._bucket.delete(self._head_key(run_id))  # first: a reader without it probes the chunks
        self._delete(self._bucket.list(f"{self.prefix}segments/{run_id}/"))  # then segments: a reader sees chunks
        chunks = self._chunks(run_id)
        self._delete(chunks)
        if claimed is not None:
            self._bucket.put(key, self._lease_body(None, claimed[0], expired=True), mode=IfVersion(claimed[1]))
        else:  # no compare-and-swap: no writer can hold a lease here
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
    "compact_every": ("ours", "compact_every", int),
    "delta_every": ("ours", "delta_every", int),
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
    given = parse_options(parts.query, {name: entry[2] for name, entry in table.items()}, url,
                          lease_error=ObjectLeaseTtlOptionInvalid)
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

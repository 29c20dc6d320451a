"""Checkpoint stores and ``CheckpointLog``: a run's checkpoint stream, deltas, lineage and forks.

The stores here are the *object face* of caravanserai's one Store abstraction
(``put``, ``get``, ``exists``, ``list``, ``delete``, atomic ``put_if_absent``); subclass
``CheckpointStore`` for anything else. ``CheckpointLog(store, run_id)`` keeps a whole run's
checkpoints in one store, content-addressed (id = SHA-256 of the full checkpoint), each stored
as a delta against its parent (only the values and KV entries that changed) with a full
checkpoint every ``max_chain`` links, a JSON record per checkpoint, and verification of every
rebuilt checkpoint against its id. Objects and records are write-once, so any number of
workers can load from and commit to one log with no locks.
"""

from __future__ import annotations

import json
import os
import time
from collections import OrderedDict
from dataclasses import asdict, dataclass
from typing import Any

from . import ckpt_format as fmt
from .ckpt_format import CheckpointCorruptionError, CheckpointFormatError, checkpoint_id
from .durable_agent import DurableAgent
from .errors import ObjectNotFound, RunLocked
from .stores.base import ObjectStore, Store
from .stores.local import LocalDirectoryStore
from .stores.memory import MemoryObjects, _Space
from .stores.obstore_objects import ObstoreObjects

__all__ = [
    "CheckpointCorruptionError",
    "CheckpointFormatError",
    "CheckpointLog",
    "CheckpointRecord",
    "CheckpointStore",
    "GCSStore",
    "LocalDirectoryStore",
    "MemoryCheckpointStore",
    "S3Store",
]

CheckpointStore = ObjectStore
DELTA_FORMAT = "caravanserai.delta"


class MemoryCheckpointStore(MemoryObjects):
    """Checkpoints in process memory (tests, demos)."""

    def __init__(self) -> None:
        super().__init__(_Space(), "memory://checkpoints")


class S3Store(ObstoreObjects):
    """Checkpoints in an S3 bucket (or any S3-compatible server) through obstore.

    ``S3Store("my-bucket", prefix="caravanserai", endpoint="http://127.0.0.1:5555",
    access_key_id=..., secret_access_key=..., region=...)``; other keyword arguments go to
    ``obstore.store.S3Store``. ``put_if_absent`` is a conditional create (``If-None-Match``).
    """

    def __init__(self, bucket: str, prefix: str | None = None, **config: Any) -> None:
        from obstore.store import S3Store as ObstoreS3

        endpoint = config.get("endpoint") or config.get("aws_endpoint")
        options = dict(config.pop("client_options", {}) or {})
        if endpoint and str(endpoint).startswith("http://"):
            options.setdefault("allow_http", True)
        super().__init__(ObstoreS3(bucket, prefix=prefix, client_options=options or None, **config),
                         f"s3://{bucket}/{prefix or ''}")


class GCSStore(ObstoreObjects):
    """Checkpoints in a Google Cloud Storage bucket through obstore (``x-goog-if-generation-match: 0``
    for ``put_if_absent``). Pass credentials (e.g. ``bearer_token=``) explicitly in tests: without
    them obstore asks the GCE metadata server."""

    def __init__(self, bucket: str, prefix: str | None = None, **config: Any) -> None:
        from obstore.store import GCSStore as ObstoreGCS

        options = dict(config.pop("client_options", {}) or {})
        url = config.get("base_url") or ""
        if str(url).startswith("http://"):
            options.setdefault("allow_http", True)
        super().__init__(ObstoreGCS(bucket, prefix=prefix, client_options=options or None, **config),
                         f"gs://{bucket}/{prefix or ''}")


@dataclass(frozen=True)
class CheckpointRecord:
    """The JSON record of one committed checkpoint."""

    id: str
    run_id: str
    parent: str | None
    parent_run: str | None
    base: str | None  # the checkpoint this one is stored as a delta against (None: stored in full)
    depth: int  # delta links back to the nearest full checkpoint
    step: int | None
    fork: dict | None
    kind: str
    stored_bytes: int
    checkpoint_bytes: int

    def to_json(self) -> bytes:
        return fmt.canonical_json(asdict(self))


# ---- deltas ---------------------------------------------------------------------------------
def make_delta(parent: fmt.CheckpointData, child: fmt.CheckpointData, parent_id: str) -> bytes:
    """Only what changed from ``parent`` to ``child``: values set/removed, KV entries set/removed."""
    pv, cv = parent.header.get("values", {}), child.header.get("values", {})
    header = {
        "format": DELTA_FORMAT,
        "base": parent_id,
        "header": {k: v for k, v in child.header.items() if k != "values" and parent.header.get(k) != v},
        "values_set": {k: v for k, v in cv.items() if k not in pv or pv[k] != v},
        "values_removed": sorted(k for k in pv if k not in cv),
        "kv_removed": sorted(k for k in parent.kv if k not in child.kv),
    }
    kv = {k: v for k, v in child.kv.items() if parent.kv.get(k) != v}
    return fmt.encode(fmt.CheckpointData(header, kv, fmt.DELTA))


def apply_delta(parent: fmt.CheckpointData, delta: fmt.CheckpointData) -> fmt.CheckpointData:
    header = {**parent.header, **delta.header["header"]}
    values = {k: v for k, v in parent.header.get("values", {}).items() if k not in delta.header["values_removed"]}
    values.update(delta.header["values_set"])
    header["values"] = values
    kv = {k: v for k, v in parent.kv.items() if k not in delta.header["kv_removed"]}
    kv.update(delta.kv)
    return fmt.CheckpointData(header, kv)


class CheckpointLog:
    """A run's checkpoints in one store: ``commit``, ``load``, ``record``, ``manifest``,
    ``lineage``, ``heads``, ``fork``.

    ``store`` is a checkpoint store (object face) or a full caravanserai Store; with a full Store
    the log also records ``checkpoint_committed`` and ``forked`` events in the run's journal, so
    ``caravanserai show/lineage/diff`` and the notebook panels can show the timeline.
    """

    def __init__(self, store: Any, run_id: str, *, max_chain: int = 16, prefix: str = "checkpoints/") -> None:
        from .ids import validate_run_id

        if max_chain < 1:
            raise ValueError("max_chain must be at least 1")
        self.run_id = validate_run_id(run_id)
        self.store = store if isinstance(store, Store) else None
        self.objects: ObjectStore = store.objects if isinstance(store, Store) else store
        self.max_chain = max_chain
        self.prefix = prefix
        self._cache: OrderedDict[str, fmt.CheckpointData] = OrderedDict()

    # ---- keys ----------------------------------------------------------------------------
    def _object_key(self, cid: str, base: str | None = None, run_id: str | None = None) -> str:
        # Keyed by the stored form: two workers committing one checkpoint against different
        # parents write different objects, so whichever record wins names an object that exists.
        suffix = f".delta-{base}" if base else ""
        return f"{self.prefix}{run_id or self.run_id}/objects/{cid}{suffix}"

    def _record_key(self, cid: str, run_id: str | None = None) -> str:
        return f"{self.prefix}{run_id or self.run_id}/records/{cid}.json"

    # ---- writing -------------------------------------------------------------------------
    def commit(self, ckpt: bytes, parent: str | None = None, step: int | None = None, *,
               fork: dict | None = None, parent_run: str | None = None) -> str:
        """Store ``ckpt`` (as a delta against ``parent`` where the chain allows); returns its id.

        Committing a checkpoint that already exists is a no-op; records are written last, so a
        record never points at a missing object.
        """
        ckpt = bytes(ckpt)
        cid = checkpoint_id(ckpt)
        if self.objects.exists(self._record_key(cid)):
            return cid
        data = fmt.decode(ckpt)
        if data.kind != fmt.FULL:
            raise CheckpointFormatError("commit() takes a full checkpoint (the bytes DurableAgent returns)")
        base, depth, blob = None, 0, ckpt
        if parent is not None and parent_run is None:
            parent_record = self.record(parent)
            if parent_record.depth + 1 <= self.max_chain:
                base, depth = parent, parent_record.depth + 1
                blob = make_delta(self._load_data(parent), data, parent)
        record = CheckpointRecord(cid, self.run_id, parent, parent_run, base, depth, step, fork,
                                  "delta" if base else "full", len(blob), len(ckpt))
        self.objects.put_if_absent(self._object_key(cid, base), blob)
        written = self.objects.put_if_absent(self._record_key(cid), record.to_json())
        self._remember(cid, data)
        if written:
            self._journal({"type": "checkpoint_committed", "checkpoint_id": cid, "parent": parent, "step": step,
                           "kind": record.kind, "depth": depth, "stored_bytes": record.stored_bytes,
                           "checkpoint_bytes": record.checkpoint_bytes, **({"fork": fork} if fork else {})})
        return cid

    def fork(self, checkpoint: str, node_id: str, value: Any, *, new_run_id: str | None = None) -> str:
        """Commit a copy of ``checkpoint`` with ``node_id`` set to ``value``; returns the new id.

        The record names the source as parent and the edit in ``record.fork``. With
        ``new_run_id`` the fork starts a new run (its own log and journal, naming the parent run
        and checkpoint), and the source run's journal gets a ``forked`` event.
        """
        source = self.record(checkpoint)
        forked = DurableAgent.fork(self.load(checkpoint), node_id, value)
        edit = {"node_id": node_id, "value": value, "source": checkpoint}
        if new_run_id is None:
            cid = self.commit(forked, parent=checkpoint, step=source.step, fork=edit)
            self._journal({"type": "forked", "checkpoint_id": cid, "source": checkpoint, "node_id": node_id})
            return cid
        child = CheckpointLog(self.store or self.objects, new_run_id, max_chain=self.max_chain, prefix=self.prefix)
        child._journal({"type": "forked", "checkpoint_id": checkpoint_id(forked), "source": checkpoint,
                        "parent_run": self.run_id, "node_id": node_id}, forked_from={"run_id": self.run_id, "checkpoint_id": checkpoint})
        cid = child.commit(forked, parent=checkpoint, step=source.step, fork=edit, parent_run=self.run_id)
        self._journal({"type": "forked", "checkpoint_id": cid, "source": checkpoint, "new_run_id": new_run_id,
                       "node_id": node_id})
        return cid

    # ---- reading -------------------------------------------------------------------------
    def record(self, checkpoint: str, run_id: str | None = None) -> CheckpointRecord:
        try:
            raw = self.objects.get(self._record_key(checkpoint, run_id))
        except ObjectNotFound:
            raise ObjectNotFound(f"no checkpoint {checkpoint!r} in the log of run {run_id or self.run_id!r}; "
                                 "check the id (caravanserai lineage RUN lists them)", key=checkpoint) from None
        try:
            return CheckpointRecord(**json.loads(raw))
        except (ValueError, TypeError) as exc:
            raise CheckpointCorruptionError(f"the record of checkpoint {checkpoint!r} is damaged ({exc})") from None

    def load(self, checkpoint: str) -> bytes:
        """The full checkpoint, rebuilt from its delta chain and verified against its id."""
        blob = fmt.encode(self._load_data(checkpoint))
        if checkpoint_id(blob) != checkpoint:  # also when it came from the cache
            raise CheckpointCorruptionError(f"checkpoint {checkpoint} rebuilt from the log does not match its id "
                                            "(a stored object or record was altered)", checkpoint=checkpoint)
        return blob

    def _load_data(self, checkpoint: str) -> fmt.CheckpointData:
        cached = self._cache.get(checkpoint)
        if cached is not None:
            self._cache.move_to_end(checkpoint)
            return cached
        chain: list[CheckpointRecord] = []
        cid: str | None = checkpoint
        while cid is not None and cid not in self._cache:
            rec = self.record(cid)
            chain.append(rec)
            cid = rec.base
            if len(chain) > self.max_chain + 1:
                raise CheckpointCorruptionError(f"checkpoint {checkpoint}'s delta chain is longer than max_chain")
        data = self._cache[cid] if cid is not None else None
        for rec in reversed(chain):
            what = f"stored object of checkpoint {rec.id}"
            try:
                stored = fmt.decode(self.objects.get(self._object_key(rec.id, rec.base)), what=what)
            except ObjectNotFound:
                raise CheckpointCorruptionError(f"{what} is missing from the store", checkpoint=rec.id) from None
            except CheckpointFormatError as exc:  # a stored object was written by us: unreadable means damaged
                raise CheckpointCorruptionError(f"{what} is damaged ({exc.message})", checkpoint=rec.id) from None
            if rec.base is None:
                data = stored
            else:
                if stored.header.get("format") != DELTA_FORMAT or stored.header.get("base") != rec.base:
                    raise CheckpointCorruptionError(f"{what} is not the delta its record describes", checkpoint=rec.id)
                data = apply_delta(data, stored)
        # Each stored object carries its own digest (checked by decode); the rebuilt checkpoint is
        # verified against its id once, at the end of the chain, not at every link.
        if checkpoint_id(fmt.encode(data)) != checkpoint:
            raise CheckpointCorruptionError(f"checkpoint {checkpoint} rebuilt from the log does not match its id",
                                            checkpoint=checkpoint)
        self._remember(checkpoint, data)
        return data

    def _remember(self, cid: str, data: fmt.CheckpointData) -> None:
        self._cache[cid] = data
        self._cache.move_to_end(cid)
        while len(self._cache) > 4:
            self._cache.popitem(last=False)

    def manifest(self) -> list[CheckpointRecord]:
        """Every record of the log (step order, then id)."""
        keys = self.objects.list(f"{self.prefix}{self.run_id}/records/")
        records = [self.record(k.rsplit("/", 1)[1].removesuffix(".json")) for k in keys]
        return sorted(records, key=lambda r: (r.step if r.step is not None else -1, r.id))

    def lineage(self, checkpoint: str) -> list[CheckpointRecord]:
        """Records from the root to ``checkpoint``, following parents (across a forked run's origin)."""
        out: list[CheckpointRecord] = []
        cid, run = checkpoint, self.run_id
        while cid is not None:
            rec = self.record(cid, run)
            out.append(rec)
            cid, run = rec.parent, rec.parent_run or run
        return list(reversed(out))

    def heads(self) -> list[str]:
        """Branch tips: checkpoints of this log that no other checkpoint of it names as parent."""
        records = self.manifest()
        parents = {r.parent for r in records}
        return [r.id for r in records if r.id not in parents]

    # ---- the run's journal ----------------------------------------------------------------
    def _journal(self, event: dict, forked_from: dict | None = None) -> None:
        if self.store is None:
            return
        append_event(self.store, self.run_id, event, started={"forked_from": forked_from} if forked_from else None)


def append_event(store: Store, run_id: str, event: dict, *, started: dict | None = None, tries: int = 200) -> None:
    """Append one event to a run's journal under a short-lived lease (retrying while another writer holds it)."""
    from . import journal
    from .runs import _REGISTRY, launch_info

    mine = _REGISTRY.get(run_id, store)
    if mine is not None:
        mine.append(event)
        return
    for attempt in range(tries):
        try:
            lease = store.acquire(run_id)
        except RunLocked:
            time.sleep(min(0.001 * (attempt + 1), 0.05))
            continue
        try:
            events, tail = journal.decode(run_id, store.load(run_id))
            pending = [] if events else [{"type": "run_started", "run_id": run_id, **launch_info(), **(started or {})}]
            lines, encoded, _ = journal.encode([*pending, event], tail)
            store.append(run_id, lines, lease=lease, seq=tail.seq)
            store.committed(run_id, encoded)
        finally:
            lease.release()
        return
    raise RunLocked(f"run {run_id!r} stayed locked while recording a checkpoint event; another process holds it",
                    run_id=run_id)


def checkpoint_from_file_or_log(target: str, store: Any = None, run_id: str | None = None) -> bytes:
    """Bytes of a checkpoint given as a file path, or as an id found in a run's log (CLI helper)."""
    if os.path.isfile(target):
        with open(target, "rb") as handle:
            return handle.read()
    if store is None:
        raise ObjectNotFound(f"{target!r} is neither a checkpoint file nor an id (give --run to look it up)", key=target)
    if run_id is None:
        objects = store.objects if isinstance(store, Store) else store
        hits = [k for k in objects.list("checkpoints/") if k.endswith(f"/records/{target}.json")]
        if not hits:
            raise ObjectNotFound(f"no checkpoint {target!r} in {store!r}", key=target)
        run_id = hits[0].split("/")[1]
    return CheckpointLog(store, run_id).load(target)

"""``CheckpointLog``: a run's checkpoint stream, deltas, lineage and forks.

``CheckpointLog(store, run_id)`` takes a checkpoint store (``checkpoints.stores``) or a full
caravanserai Store, and keeps a whole run's
checkpoints in one store, content-addressed (id = SHA-256 of the full checkpoint), each stored
as a delta against its parent (only the values and KV entries that changed) with a full
checkpoint every ``max_chain`` links, a JSON record per checkpoint, and verification of every
rebuilt checkpoint against its id. Objects and records are write-once, so any number of
workers can load from and commit to one log with no locks.
"""

from __future__ import annotations

import json
import os
import re
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, fields
from typing import Any

from ..errors import AmbiguousId, InvalidRunId, ObjectNotFound, RunExists, UsageError
from ..runs.lifecycle import append_event
from ..stores.base import ObjectStore, Store
from . import format as fmt
from .agent import KV_ENTRY_BACKENDS, FakeBackend, decode_checkpoint, fork_change, known_fields, validate_header
from .format import CheckpointCorruptionError, CheckpointFormatError, checkpoint_id, corrupt, is_count, short

__all__ = ["CheckpointLog", "CheckpointRecord", "checkpoint_from_file_or_log", "find_checkpoint", "log_status"]

DELTA_FORMAT = "caravanserai.delta"
MIN_PREFIX = 4  # hex characters a checkpoint id prefix needs (`caravanserai lineage` prints 12)
_HEX_ID = re.compile(r"[0-9a-f]{64}")
_DELTA_FIELDS = {"format", "base", "header", "values_set", "values_removed", "kv_removed"}


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

    @classmethod
    def parse(cls, raw: bytes, cid: str, run_id: str) -> CheckpointRecord:
        """The record stored under ``cid`` in ``run_id``'s log, every field checked (CheckpointCorruptionError)."""
        what = f"the record of checkpoint {cid[:12]} (run {run_id})"
        try:
            doc = json.loads(bytes(raw).decode("utf-8"))
        except (ValueError, RecursionError):
            corrupt(what, "it is not JSON", checkpoint=cid)
        if not isinstance(doc, dict) or set(doc) != _RECORD_FIELDS:
            corrupt(what, f"its fields are not {', '.join(sorted(_RECORD_FIELDS))}", checkpoint=cid)
        problem = _record_problem(doc, cid, run_id)
        if problem:
            corrupt(what, problem, checkpoint=cid)
        return cls(**doc)


_RECORD_FIELDS = {f.name for f in fields(CheckpointRecord)}


def _record_problem(doc: dict[str, Any], cid: str, run_id: str) -> str | None:
    """What is wrong with a record's fields (None if nothing): types, and the links between them."""
    if doc["id"] != cid:
        return f"its id {short(doc['id'])} is not the id it is stored under"
    if doc["run_id"] != run_id:
        return f"its run_id {short(doc['run_id'])} is not the run whose log holds it"
    for name in ("parent", "base"):
        if doc[name] is not None and not _is_id(doc[name]):
            return f"its {name} {short(doc[name])} is not a checkpoint id"
    if doc["parent_run"] is not None and not _is_run_id(doc["parent_run"]):
        return f"its parent_run {short(doc['parent_run'])} is not a run id"
    if doc["step"] is not None and not is_count(doc["step"]):
        return f"its step {short(doc['step'])} is not a whole number"
    for name in ("depth", "stored_bytes", "checkpoint_bytes"):
        if not is_count(doc[name]):
            return f"its {name} {short(doc[name])} is not a whole number"
    if doc["kind"] not in ("full", "delta"):
        return f"its kind {short(doc['kind'])} is neither full nor delta"
    if doc["base"] is None and (doc["kind"] != "full" or doc["depth"] != 0):
        return "it is stored in full but does not say kind full, depth 0"
    if doc["base"] is not None and (doc["kind"] != "delta" or doc["depth"] < 1 or doc["base"] != doc["parent"]
                                    or doc["parent_run"] is not None):
        return "it is stored as a delta but its kind, depth or parent do not say so"
    fork = doc["fork"]
    if fork is not None and not (isinstance(fork, dict) and set(fork) == {"node_id", "value", "source"}
                                 and isinstance(fork["node_id"], str) and _is_id(fork["source"])
                                 and not fmt.too_deep(fork["value"])):
        return "its fork is not {node_id, value, source}"
    return None


def _is_id(value: Any) -> bool:
    return isinstance(value, str) and _HEX_ID.fullmatch(value) is not None


def _is_run_id(value: Any) -> bool:
    from ..ids import validate_run_id

    try:
        validate_run_id(value)
    except InvalidRunId:
        return False
    return True


# ---- deltas ---------------------------------------------------------------------------------
def make_delta(parent: fmt.CheckpointData, child: fmt.CheckpointData, parent_id: str, *,
               touched: tuple[Iterable[str], Iterable[str]] | None = None) -> bytes:
    """Only what changed from ``parent`` to ``child``: values set/removed, KV entries set/removed.

    ``touched`` = ``(value keys, KV keys)`` outside which the two are known to agree (a fork, new
    steps): only those keys are compared, so the delta costs the size of the change.
    """
    pv, cv = parent.header.get("values", {}), child.header.get("values", {})
    pk, ck = parent.kv, child.kv
    vkeys, kkeys = (pv.keys() | cv.keys(), pk.keys() | ck.keys()) if touched is None else touched
    header = {
        "format": DELTA_FORMAT,
        "base": parent_id,
        "header": {k: v for k, v in child.header.items() if k != "values" and parent.header.get(k) != v},
        "values_set": {k: cv[k] for k in vkeys if k in cv and (k not in pv or pv[k] != cv[k])},
        "values_removed": sorted({k for k in vkeys if k in pv and k not in cv}),
        "kv_removed": sorted({k for k in kkeys if k in pk and k not in ck}),
    }
    kv = {k: ck[k] for k in kkeys if k in ck and pk.get(k) != ck[k]}
    return fmt.encode(fmt.CheckpointData(header, kv, fmt.DELTA))


def check_delta(delta: fmt.CheckpointData, base: str, what: str) -> None:
    """A stored delta must be exactly what ``make_delta`` writes, against ``base``: CheckpointCorruptionError otherwise."""
    header = delta.header
    if delta.kind != fmt.DELTA or set(header) != _DELTA_FIELDS or header["format"] != DELTA_FORMAT:
        corrupt(what, "it is not a CheckpointLog delta")
    if header["base"] != base:
        corrupt(what, "it is a delta against another checkpoint than its record names")
    changed = header["header"]
    if not isinstance(changed, dict) or "values" in changed or "kv_index" in changed:
        corrupt(what, "its changed header fields are not an object of header fields")
    if not isinstance(header["values_set"], dict):
        corrupt(what, "its values_set is not an object")
    for name in ("values_removed", "kv_removed"):
        removed = header[name]
        if not (isinstance(removed, list) and all(isinstance(k, str) for k in removed)):
            corrupt(what, f"its {name} is not a list of node ids")


def apply_delta(parent: fmt.CheckpointData, *deltas: fmt.CheckpointData) -> fmt.CheckpointData:
    """``parent`` with ``deltas`` applied in order (all already checked: a validated full checkpoint and
    ``check_delta``), on one copy: a chain costs its checkpoint's size once plus its changes."""
    header = dict(parent.header)
    values = dict(parent.header.get("values", {}))
    kv = dict(parent.kv)
    for delta in deltas:
        header.update(delta.header["header"])
        for key in delta.header["values_removed"]:
            values.pop(key, None)
        values.update(delta.header["values_set"])
        for key in delta.header["kv_removed"]:
            kv.pop(key, None)
        kv.update(delta.kv)
    header["values"] = values
    return fmt.CheckpointData(header, kv)


def _merge_deltas(deltas: Sequence[fmt.CheckpointData]
                  ) -> tuple[dict[str, Any], set[str], dict[str, bytes], set[str]] | None:
    """Checked deltas, applied in order, as one ``Sections.edit`` change (values set, values removed,
    KV set, KV removed): a chain is spliced once, not once per link. None if one changes header fields."""
    values: dict[str, Any] = {}
    kv: dict[str, bytes] = {}
    values_gone: set[str] = set()
    kv_gone: set[str] = set()
    for delta in deltas:
        changes = delta.header
        if changes["header"]:
            return None
        for key in changes["values_removed"]:
            values.pop(key, None)
            values_gone.add(key)
        values.update(changes["values_set"])
        values_gone.difference_update(changes["values_set"])
        for key in changes["kv_removed"]:
            kv.pop(key, None)
            kv_gone.add(key)
        kv.update(delta.kv)
        kv_gone.difference_update(delta.kv)
    return values, values_gone, kv, kv_gone


def _apply_chain(start: fmt.Sections, deltas: Sequence[fmt.CheckpointData]) -> fmt.Sections:
    """``start`` with checked ``deltas`` applied in order, as one splice of encoded sections (only the
    changed keys encoded); re-encoded whole only if a delta changes header fields."""
    if not deltas:
        return start
    change = _merge_deltas(deltas)
    return start.edit(*change) if change is not None else fmt.Sections(apply_delta(start.data, *deltas))


def _decode_full(ckpt: Any) -> tuple[fmt.Sections, str]:
    """A full checkpoint decoded, validated and checked to be in canonical form (the bytes ``encode``
    gives, so its id is the SHA-256 of canonical bytes), and its id: the digest check and the id
    are one SHA-256 pass, and the canonical check compares the header's bytes (the header holds the
    sorted kv_index, and decode checked that the KV bytes fill the rest in its order)."""
    data, cid = fmt.decode_identified(ckpt, known=known_fields)
    if data.kind != fmt.FULL:
        decode_checkpoint(ckpt)  # raises the error that names log.load for a delta
    validate_header(data, "checkpoint")
    sections = fmt.Sections(data)
    head = sections.head()
    hlen = int.from_bytes(bytes(ckpt[fmt.HEADER_AT - 4:fmt.HEADER_AT]), "little")
    if hlen != len(head) or bytes(ckpt[fmt.HEADER_AT:fmt.HEADER_AT + hlen]) != head:
        corrupt("checkpoint", "it is not in canonical form (sorted keys, no spaces, KV entries in key order)",
                fix="commit the bytes DurableAgent.checkpoint or run_until_step returned")
    return sections, cid


_STEP_KEY = re.compile(r"step-(0|[1-9][0-9]*)")


def _check_change(data: fmt.CheckpointData, values_set: dict[str, Any], kv_set: dict[str, bytes]) -> None:
    """New step values and KV entries for a validated checkpoint, checked as ``validate_header`` would
    check them in the whole (only the keys that change: the result stays a valid checkpoint)."""
    what = "the change to commit"
    steps, backend = data.header["steps"], data.header["backend"]
    for key, value in values_set.items():
        found = _STEP_KEY.fullmatch(key) if isinstance(key, str) else None
        if found is None or int(found[1]) >= steps:
            corrupt(what, f"it sets {short(key)}, which is no step of this checkpoint", fix="set step outputs only")
        try:
            fmt.canonical_json(value)
        except (TypeError, ValueError, RecursionError):
            corrupt(what, f"its value for {key} is not JSON", fix="set JSON values only")
        if fmt.too_deep(value):
            corrupt(what, f"its value for {key} nests too deep", fix="set flatter values")
    for key, blob in kv_set.items():
        if not (isinstance(key, str) and key.startswith("step-") and (key in values_set or key in data.header["values"])):
            corrupt(what, f"it has a KV entry for {short(key)}, which is no executed step", fix="send the step too")
        if not isinstance(blob, bytes) or (backend in KV_ENTRY_BACKENDS and len(blob) % FakeBackend.ENTRY_BYTES):
            corrupt(what, f"its KV entry for {key} is not whole cache entries", fix="send the backend's KV bytes")


class CheckpointLog:
    """A run's checkpoints in one store: ``commit``, ``load``, ``record``, ``manifest``,
    ``lineage``, ``heads``, ``fork``.

    ``store`` is a checkpoint store (object face) or a full caravanserai Store; with a full Store
    the log also records ``checkpoint_committed`` and ``forked`` events in the run's journal, so
    ``caravanserai show/lineage/diff`` and the notebook panels can show the timeline.
    """

    def __init__(self, store: Any, run_id: str, *, max_chain: int = 16, prefix: str = "checkpoints/") -> None:
        from ..ids import validate_run_id

        if max_chain < 1:
            raise ValueError("max_chain must be at least 1")
        self.run_id = validate_run_id(run_id)
        self.store = store if isinstance(store, Store) else None
        self.objects: ObjectStore = store.objects if isinstance(store, Store) else store
        self.max_chain = max_chain
        self.prefix = prefix
        self._cache: OrderedDict[str, fmt.Sections] = OrderedDict()  # verified checkpoints, encoded pieces kept

    # ---- keys ----------------------------------------------------------------------------
    def _object_key(self, cid: str, base: str | None = None, run_id: str | None = None) -> str:
        # Keyed by the stored form: two workers committing one checkpoint against different
        # parents write different objects, so whichever record wins names an object that exists.
        suffix = f".delta-{base}" if base else ""
        return f"{self.prefix}{run_id or self.run_id}/objects/{cid}{suffix}"

    def _record_key(self, cid: str, run_id: str | None = None) -> str:
        return f"{self.prefix}{run_id or self.run_id}/records/{cid}.json"

    # ---- ids -----------------------------------------------------------------------------
    def resolve(self, id_or_prefix: str) -> str:
        """The full id of the checkpoint ``id_or_prefix`` names in this log.

        A full 64-hex id passes through unchecked (``load``/``record`` then say if it is absent); a
        prefix of at least ``MIN_PREFIX`` hex characters (such as the 12 ``caravanserai lineage``
        prints) must match exactly one record: ``AmbiguousId`` listing the matches if it matches
        several, ``ObjectNotFound`` if none.
        """
        return self._resolve(id_or_prefix, self.run_id)

    def _resolve(self, id_or_prefix: Any, run_id: str) -> str:
        text = _id_prefix(id_or_prefix, run_id)
        if len(text) == 64:
            return text
        keys = self.objects.list(f"{self.prefix}{run_id}/records/{text}")
        found = sorted({cid for cid in (_id_of_record_key(k) for k in keys) if cid})
        if not found:
            raise _not_found(id_or_prefix, run_id)
        if len(found) > 1:
            raise _ambiguous(text, found, f"the log of run {run_id!r}")
        return found[0]

    # ---- writing -------------------------------------------------------------------------
    def commit(self, ckpt: bytes, parent: str | None = None, step: int | None = None, *,
               fork: dict | None = None, parent_run: str | None = None, usage: list[dict] | None = None) -> str:
        """Store ``ckpt`` (as a delta against ``parent`` where the chain allows); returns its id.

        ``ckpt`` is checked in full first (``CheckpointCorruptionError`` for a malformed one),
        so nothing is written for bad input. Committing a checkpoint that already exists is a
        no-op; records are written last, so a record never points at a missing object. ``usage``
        (``[{"index", "tokens", "latency_s", "tokens_saved"}]`` for the steps computed since
        ``parent``) goes into the journal event, for per-step figures in Compare and ``diff``.
        """
        sections, cid = _decode_full(ckpt)  # first: anything but a valid checkpoint is refused before a write
        return self._commit(sections, (cid, len(ckpt)), parent, step, fork=fork, parent_run=parent_run,
                            usage=usage, blob=bytes(ckpt))

    def commit_change(self, parent: str, values_set: dict[str, Any], kv_set: dict[str, bytes] | None = None,
                      step: int | None = None, *, usage: list[dict] | None = None) -> str:
        """Commit ``parent`` (an id or a unique prefix) with new values and KV entries (the steps a resume
        just ran); returns the new id. Only the change is encoded and compared, and the id is one
        SHA-256 pass: the same checkpoint, id and stored delta as ``commit(agent.checkpoint(), parent)``.
        Every changed key is checked as a checkpoint's would be (``CheckpointCorruptionError``) before a write.
        """
        parent = self.resolve(parent)
        source = self._load_sections(parent)
        kv_set = kv_set or {}
        _check_change(source.data, values_set, kv_set)
        sections = source.edit(values_set, (), kv_set, ())
        return self._commit(sections, sections.identify(), parent, step, usage=usage,
                            touched=(list(values_set), list(kv_set)))

    def _commit(self, sections: fmt.Sections, identity: tuple[str, int], parent: str | None, step: int | None, *,
                fork: dict | None = None, parent_run: str | None = None, usage: list[dict] | None = None,
                touched: tuple[list[str], list[str]] | None = None, blob: bytes | None = None,
                parent_record: CheckpointRecord | None = None) -> str:
        """``commit`` of a checkpoint already validated: its sections, ``(id, size)``, its bytes if the
        caller has them, the keys it may differ from ``parent`` in (``make_delta``'s ``touched``) and
        the parent's record if the caller read it."""
        if step is not None and not is_count(step):
            raise UsageError(f"commit() takes step as a whole number >= 0 or None, got {short(step)}")
        if parent_run is not None and not (_is_run_id(parent_run) and _is_id(parent)):
            raise UsageError("commit() with parent_run= needs the full id of a checkpoint of that run as parent=")
        cid, size = identity
        if self.objects.exists(self._record_key(cid)):
            return cid
        data = sections.data
        base, depth, stored = None, 0, None
        if parent is not None and parent_run is None:
            parent = self.resolve(parent)
            if parent_record is None or parent_record.id != parent or parent_record.run_id != self.run_id:
                parent_record = self.record(parent)
            if parent_record.depth + 1 <= self.max_chain:
                base, depth = parent, parent_record.depth + 1
                stored = make_delta(self._load_sections(parent).data, data, parent, touched=touched)
        if stored is None:
            stored = blob if blob is not None else sections.to_bytes()
        record = CheckpointRecord(cid, self.run_id, parent, parent_run, base, depth, step, fork,
                                  "delta" if base else "full", len(stored), size)
        self.objects.put_if_absent(self._object_key(cid, base), stored)
        written = self.objects.put_if_absent(self._record_key(cid), record.to_json())
        self._remember(cid, sections)
        if written:
            steps, values = data.header["steps"], data.header["values"]
            self._journal({"type": "checkpoint_committed", "checkpoint_id": cid, "parent": parent, "step": step,
                           "kind": record.kind, "depth": depth, "stored_bytes": record.stored_bytes,
                           "checkpoint_bytes": record.checkpoint_bytes, "steps": steps,
                           "steps_done": len(values) - steps,  # validated: every prompt, and only node ids
                           **({"fork": fork} if fork else {}), **({"usage": usage} if usage else {})})
        return cid

    def fork(self, checkpoint: str, node_id: str, value: Any, *, new_run_id: str | None = None) -> str:
        """Commit a copy of ``checkpoint`` (an id or a unique prefix) with ``node_id`` set to ``value``; returns the new id.

        The record names the source as parent and the edit in ``record.fork``. With
        ``new_run_id`` the fork starts a new run (its own log and journal, naming the parent run
        and checkpoint), and the source run's journal gets a ``forked`` event. Every check
        (unknown node, a value of the wrong type, a damaged source) runs before anything is written.
        """
        checkpoint = self.resolve(checkpoint)
        source = self.record(checkpoint)
        loaded = self._load_sections(checkpoint)
        stale, stale_kv = fork_change(loaded.data, node_id, value, loaded.keys_from("step-"))
        # Only the edit is encoded; the rest of the new checkpoint is the source's encoded pieces.
        sections = loaded.edit({node_id: value}, stale, None, stale_kv)
        identity = sections.identify()
        touched = ([node_id, *stale], stale_kv)
        if new_run_id is not None:
            self._check_free(new_run_id)
        edit = {"node_id": node_id, "value": value, "source": checkpoint}
        if new_run_id is None:
            cid = self._commit(sections, identity, checkpoint, source.step, fork=edit, touched=touched,
                               parent_record=source)
            self._journal({"type": "forked", "checkpoint_id": cid, "source": checkpoint, "node_id": node_id})
            return cid
        child = CheckpointLog(self.store or self.objects, new_run_id, max_chain=self.max_chain, prefix=self.prefix)
        child._journal({"type": "forked", "checkpoint_id": identity[0], "source": checkpoint,
                        "parent_run": self.run_id, "node_id": node_id},
                       forked_from={"run_id": self.run_id, "checkpoint_id": checkpoint})
        cid = child._commit(sections, identity, checkpoint, source.step, fork=edit, parent_run=self.run_id)
        self._journal({"type": "forked", "checkpoint_id": cid, "source": checkpoint, "new_run_id": new_run_id,
                       "node_id": node_id})
        return cid

    def resume(self, checkpoint: str | None = None, *, stop: Any = None, on_progress: Any = None,
               commit_every: float = 0.25) -> Any:
        """Run the pending steps of ``checkpoint`` (default: the newest head) and commit them; a ``Progress``.

        Steps run one at a time; a checkpoint is committed after a step once ``commit_every``
        seconds passed since the last commit (every step, for a real model), at the end, when
        ``stop`` (a ``threading.Event``) is set, and before an error propagates, so finished steps
        are never recomputed. ``on_progress(progress)`` is called after every step.
        """
        from .runner import resume_log

        return resume_log(self, self.resolve(checkpoint) if checkpoint else self.newest_head(), stop=stop,
                          on_progress=on_progress, commit_every=commit_every)

    def newest_head(self) -> str:
        """The checkpoint this run's journal committed last, a branch forked inside the log included (or the
        log's only head, on a bare object store); ``main_head`` is the head of the run's main line."""
        if self.store is not None:
            committed = [e for e in self.store.events(self.run_id) if e.get("type") == "checkpoint_committed"]
            if committed and isinstance(committed[-1].get("checkpoint_id"), str):
                return committed[-1]["checkpoint_id"]
        return self._only_head()

    def main_head(self) -> str:
        """The head of this run's main line (``log_status``: its newest commit not on a branch forked inside
        the log; what ``caravanserai list``, ``diff RUN`` and ``resume RUN`` use), or the log's only head on
        a bare object store."""
        if self.store is not None:
            status = log_status(self.store.events(self.run_id))
            if status and status["latest"]:
                return status["latest"]
        return self._only_head()

    def _only_head(self) -> str:
        heads = self.heads()
        if len(heads) != 1:
            raise UsageError(f"the log of run {self.run_id!r} has {len(heads)} heads; name the checkpoint "
                             f"(caravanserai lineage {self.run_id} lists them)")
        return heads[0]

    def _check_free(self, run_id: str) -> None:
        """RunExists if ``run_id`` has a journal or a log already (a fork never writes into another run)."""
        from ..ids import validate_run_id

        validate_run_id(run_id)
        taken = self.store.load(run_id) if self.store is not None else self.objects.list(f"{self.prefix}{run_id}/records/")
        if taken:
            raise RunExists(f"run {run_id!r} already exists: fork into a new run id (nothing was written)", run_id=run_id)

    # ---- reading -------------------------------------------------------------------------
    def record(self, checkpoint: str, run_id: str | None = None) -> CheckpointRecord:
        """The record of ``checkpoint`` (an id or a unique prefix) in this log, or in ``run_id``'s."""
        from ..ids import validate_run_id

        run = validate_run_id(run_id) if run_id is not None else self.run_id
        return self._read_record(self._resolve(checkpoint, run), run)

    def _read_record(self, cid: str, run_id: str | None = None, *, named_by: str | None = None) -> CheckpointRecord:
        """Read and check one record. Missing: not found if the user asked for it, corruption if
        another record (``named_by``) links to it."""
        run = run_id or self.run_id
        try:
            raw = self.objects.get(self._record_key(cid, run))
        except ObjectNotFound:
            if named_by is None:
                raise _not_found(cid, run) from None
            corrupt(f"the log of run {run!r}", f"{named_by} names checkpoint {cid[:12]}, which has no record",
                    fix="restore the missing record or commit that checkpoint again", checkpoint=cid)
        return CheckpointRecord.parse(raw, cid, run)

    def load_data(self, checkpoint: str) -> fmt.CheckpointData:
        """The checkpoint decoded (an id or a unique prefix), verified against its id; read it, do not modify it."""
        return self._load_sections(self.resolve(checkpoint)).data

    def load(self, checkpoint: str) -> bytes:
        """The full checkpoint (an id or a unique prefix), rebuilt from its delta chain and verified against its id."""
        checkpoint = self.resolve(checkpoint)
        blob = self._load_sections(checkpoint).to_bytes()
        if checkpoint_id(blob) != checkpoint:  # also when it came from the cache
            raise _mismatch(checkpoint)
        return blob

    def _load_sections(self, checkpoint: str) -> fmt.Sections:
        """The checkpoint verified against its id, as encoded sections (cached: the newest few)."""
        cached = self._cache.get(checkpoint)
        if cached is not None:
            self._cache.move_to_end(checkpoint)
            return cached
        chain = self._chain(checkpoint)
        start = self._cache.get(chain[-1].base) if chain[-1].base is not None else None
        sections = self._rebuild(chain) if start is None and len(chain) > 1 else None
        if sections is None:  # checking every object's digest on the way (and naming a damaged one)
            deltas = [self._read_delta(rec) for rec in reversed(chain) if rec.base is not None]
            if start is None:  # the chain starts at a full object: its digest check gives its id in the same pass
                start, cid = self._read_full(chain[-1])
                if cid != chain[-1].id:
                    raise _mismatch(checkpoint)
            sections = _apply_chain(start, deltas)
            # the rebuilt checkpoint is verified against its id once, at the end of the chain
            if deltas and sections.identify()[0] != checkpoint:
                raise _mismatch(checkpoint)
        if chain[0].base is not None:  # rebuilt from deltas: check the result as a whole too
            validate_header(sections.data, f"checkpoint {checkpoint}")
        self._remember(checkpoint, sections)
        return sections

    def _chain(self, checkpoint: str) -> list[CheckpointRecord]:
        """Records from ``checkpoint`` back along delta bases to a full one (or a cached one).

        Each base is one link shallower (``depth`` falls by exactly 1), so the walk ends at depth 0
        and a cycle is impossible; a link that breaks this is corruption.
        """
        rec = self._read_record(checkpoint)
        chain = [rec]
        while rec.base is not None and rec.base not in self._cache:
            base = self._read_record(rec.base, named_by=f"the delta base of checkpoint {rec.id[:12]}")
            if base.depth != rec.depth - 1:
                corrupt(f"the record of checkpoint {rec.id[:12]}", f"its depth {rec.depth} does not follow its "
                        f"base's depth {base.depth}", checkpoint=rec.id)
            rec = base
            chain.append(rec)
        return chain

    def _rebuild(self, chain: list[CheckpointRecord]) -> fmt.Sections | None:
        """The checkpoint at the end of ``chain`` (full object first, then deltas), verified by one
        SHA-256 pass over the result against its id: bytes that hash to the id are the checkpoint that
        was committed, so the full object's own digest pass is skipped (damage in what the result does
        not use, its digest or a value a later delta replaced, shows when that checkpoint itself is
        loaded). None where anything does not match; the caller then takes the path that checks each
        object and names the damaged one."""
        try:
            base, _ = self._read_object(chain[-1], verify=False)
            if base.data.kind != fmt.FULL:
                return None
            sections = _apply_chain(base, [self._read_delta(rec) for rec in reversed(chain[:-1])])
        except (CheckpointCorruptionError, KeyError, TypeError, ValueError):
            return None
        return sections if sections.identify()[0] == chain[0].id else None

    def _read_object(self, rec: CheckpointRecord, *, verify: bool = True) -> tuple[fmt.Sections, str | None]:
        """Read and decode ``rec``'s stored object, and the SHA-256 of its bytes (None unless ``verify``)."""
        what = f"stored object of checkpoint {rec.id}"
        try:
            raw = self.objects.get(self._object_key(rec.id, rec.base))
        except ObjectNotFound:
            raise CheckpointCorruptionError(f"{what} is missing from the store", checkpoint=rec.id) from None
        try:
            return fmt.decode_sections(raw, what=what, known=known_fields if rec.base is None else None, verify=verify)
        except CheckpointFormatError as exc:  # a stored object was written by us: unreadable means damaged
            raise CheckpointCorruptionError(f"{what} is damaged ({exc.message})", checkpoint=rec.id) from None

    def _read_full(self, rec: CheckpointRecord) -> tuple[fmt.Sections, str | None]:
        """A full stored object, validated, and its id."""
        stored, cid = self._read_object(rec)
        what = f"stored object of checkpoint {rec.id}"
        if stored.data.kind != fmt.FULL:
            corrupt(what, "its record says full but it is a delta", checkpoint=rec.id)
        validate_header(stored.data, what)
        return stored, cid

    def _read_delta(self, rec: CheckpointRecord) -> fmt.CheckpointData:
        """A delta stored object, checked against the base its record names."""
        assert rec.base is not None
        stored, _ = self._read_object(rec)
        check_delta(stored.data, rec.base, f"stored object of checkpoint {rec.id}")
        return stored.data

    def _remember(self, cid: str, sections: fmt.Sections) -> None:
        self._cache[cid] = sections
        self._cache.move_to_end(cid)
        while len(self._cache) > 4:
            self._cache.popitem(last=False)

    def manifest(self) -> list[CheckpointRecord]:
        """Every record of the log (step order, then id)."""
        keys = self.objects.list(f"{self.prefix}{self.run_id}/records/")
        records = []
        for cid in filter(None, map(_id_of_record_key, keys)):  # a stray file that names no id is no record
            records.append(self._read_record(cid, named_by="the log's record listing"))
        return sorted(records, key=lambda r: (r.step if r.step is not None else -1, r.id))

    def lineage(self, checkpoint: str) -> list[CheckpointRecord]:
        """Records from the root to ``checkpoint`` (an id or a unique prefix), following parents
        (across a forked run's origin). A parent that is missing, or a cycle, is corruption."""
        cid, run = self.resolve(checkpoint), self.run_id
        rec = self._read_record(cid, run)
        out, seen = [rec], {(run, cid)}
        while rec.parent is not None:
            cid, run = rec.parent, rec.parent_run or run
            if (run, cid) in seen:
                corrupt(f"the log of run {self.run_id!r}", f"the parents of checkpoint {rec.id[:12]} form a cycle")
            seen.add((run, cid))
            rec = self._read_record(cid, run, named_by=f"the parent link of checkpoint {rec.id[:12]}")
            out.append(rec)
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


def _id_prefix(id_or_prefix: Any, run_id: str | None = None) -> str:
    """``id_or_prefix`` lower-cased, checked to be hex of a usable length (not found / UsageError otherwise)."""
    if not isinstance(id_or_prefix, str):
        raise UsageError(f"a checkpoint id is a str of hex digits, got {type(id_or_prefix).__name__}")
    text = id_or_prefix.strip().lower()
    if not text or len(text) > 64 or any(c not in "0123456789abcdef" for c in text):
        raise _not_found(id_or_prefix, run_id)
    if len(text) < MIN_PREFIX:
        raise UsageError(f"checkpoint id prefix {text!r} is too short: give at least {MIN_PREFIX} hex characters"
                         + (f" (caravanserai lineage {run_id} lists the ids)" if run_id else ""))
    return text


def _id_of_record_key(key: str) -> str | None:
    """The checkpoint id a record key names (``.../records/<id>.json``), or None for a stray key."""
    name = key.rsplit("/", 1)[-1]
    cid = name.removesuffix(".json")
    return cid if name.endswith(".json") and _is_id(cid) else None


def _mismatch(checkpoint: str) -> CheckpointCorruptionError:
    return CheckpointCorruptionError(f"checkpoint {checkpoint} rebuilt from the log does not match its id "
                                     "(a stored object or record was altered)", checkpoint=checkpoint)


def _not_found(checkpoint: Any, run_id: str | None) -> ObjectNotFound:
    where = f"the log of run {run_id!r}" if run_id else "this store"
    how = f"caravanserai lineage {run_id}" if run_id else "caravanserai lineage RUN"
    return ObjectNotFound(f"no checkpoint {short(checkpoint)} in {where}; check the id ({how} lists them)",
                          key=short(checkpoint))


def _ambiguous(prefix: str, matches: Sequence[str], where: str) -> AmbiguousId:
    width = max(12, len(prefix) + 4)
    shown = ", ".join(m[:width] for m in matches[:5]) + (f" and {len(matches) - 5} more" if len(matches) > 5 else "")
    return AmbiguousId(f"checkpoint id prefix {prefix!r} matches {len(matches)} checkpoints in {where} ({shown}); "
                       "give more characters", prefix=prefix, matches=list(matches[:20]))


def find_checkpoint(store: Any, id_or_prefix: str, prefix: str = "checkpoints/") -> tuple[str, str]:
    """``(run_id, checkpoint id)`` of the checkpoint an id or unique prefix names anywhere in ``store``."""
    text = _id_prefix(id_or_prefix)
    objects = store.objects if isinstance(store, Store) else store
    found: dict[str, str] = {}
    for key in objects.list(prefix):
        parts = key[len(prefix):].split("/")
        if len(parts) == 3 and parts[1] == "records" and parts[2].startswith(text):
            cid = _id_of_record_key(key)
            if cid is not None:
                found.setdefault(cid, parts[0])
    if not found:
        raise _not_found(id_or_prefix, None)
    if len(found) > 1:
        raise _ambiguous(text, sorted(found), "this store")
    ((cid, run_id),) = found.items()
    return run_id, cid


def log_status(events: Sequence[dict]) -> dict[str, Any] | None:
    """Where a run's checkpoint log stands, from its journal events alone (pure; never raises on old events).

    None for a run with no ``checkpoint_committed`` event; else ``{"checkpoints", "steps",
    "steps_done", "status", "latest"}``, plus ``"branches"`` when there are some, about the run's
    **main line**: the chain of commits not made by a fork inside this log (a fork into a new run
    is that run's main line). ``latest`` is the main line's head (its newest commit), ``status`` is
    ``completed`` when that head has every step done, else ``pending``; ``branches`` counts the
    forks made inside the log, ``checkpoints`` every commit. Events from journals written before
    ``steps``/``steps_done`` were recorded give what they can: ``steps_done`` from the committed
    step index (+1), ``steps`` from any event that has it, else None (and status ``pending``).
    ``runs.view`` computes the same in one pass (``_Pass.on_checkpoint``): the two must agree.
    """
    committed = [e for e in events if isinstance(e, dict) and e.get("type") == "checkpoint_committed"]
    if not committed:
        return None
    seen: set[str | None] = set()
    off_main: set[str | None] = set()  # commits on a branch made inside this log
    head, branches = committed[0], 0
    for event in committed:
        cid, parent = _str_or_none(event.get("checkpoint_id")), _str_or_none(event.get("parent"))
        # a fork of one of this log's own checkpoints starts a branch (a fork into a new run is its main line)
        branch_root = isinstance(event.get("fork"), dict) and parent is not None and parent in seen
        branches += branch_root
        if branch_root or (parent is not None and parent in off_main):
            off_main.add(cid)
        else:
            head = event
        seen.add(cid)
    steps = head.get("steps") if is_count(head.get("steps")) else None
    if steps is None:
        steps = next((e["steps"] for e in reversed(committed) if is_count(e.get("steps"))), None)
    done = head.get("steps_done")
    if not is_count(done):
        done = head["step"] + 1 if is_count(head.get("step")) else None
    latest = head.get("checkpoint_id")
    return {"checkpoints": len(committed), "steps": steps, "steps_done": done,
            "status": "completed" if steps is not None and done is not None and done >= steps > 0 else "pending",
            "latest": latest if isinstance(latest, str) else None, **({"branches": branches} if branches else {})}


def _str_or_none(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def checkpoint_from_file_or_log(target: str, store: Any = None, run_id: str | None = None) -> bytes:
    """Bytes of a checkpoint given as a file path, or as an id or unique id prefix found in a run's
    log (``run_id``) or anywhere in ``store`` (CLI helper)."""
    if os.path.isfile(target):
        with open(target, "rb") as handle:
            return handle.read()
    text = target.strip().lower() if isinstance(target, str) else ""
    if store is None or not text or any(c not in "0123456789abcdef" for c in text):
        raise ObjectNotFound(f"{short(target)} is neither a checkpoint file nor a checkpoint id; give a file path "
                             "or an id (caravanserai lineage RUN lists them)", key=short(target))
    if run_id is None:
        run_id, target = find_checkpoint(store, target)
    return CheckpointLog(store, run_id).load(target)

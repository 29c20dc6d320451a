"""The one ``Store`` abstraction: a journal face and an object face, implemented per backend.

Journal face (what a durable run needs): ``load`` the complete lines of a run's journal,
``append`` lines durably under a ``Lease`` from ``acquire``, ``list`` the runs, ``close``.
Object face (``store.objects``, what checkpoint logs need): the ``Objects`` contract below —
``put(key, data, mode=...)``, ``get``, ``exists``, ``list``, ``delete``, ``put_if_absent`` derived
once from ``put(mode="create")``, and compare-and-swap where ``supports_cas`` says so. Stores move
lines and bytes; numbering and hash-chaining live in ``caravanserai.journal``, so every backend
verifies the same way.

The public journal methods are implemented here once: they check the run id
(``caravanserai.ids.validate_run_id``; read-only ones also accept an existing 0.2.0 name the
backend vouches for with ``is_legacy_name``) and turn an ``OSError`` into ``StoreFull`` or
``StoreUnavailable``, then call the backend's ``_load``, ``_append``, ``_acquire``, ``_remove``...
``append``'s prologue lives here too: the lease must be this store's lease on this run
(``ForeignLease``), still held (``LeaseLost``), and ``seq`` must be the lease's ``next_seq``
(``SequenceMismatch``); the base advances ``next_seq`` after the backend wrote. A backend
implements the underscored methods and never sees an unchecked id or a stale sequence.
"""

from __future__ import annotations

import builtins
import errno
import functools
import json
import os
import socket
import time
import weakref
from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any, ClassVar, Literal

from .. import journal
from ..errors import (
    CaravanseraiError,
    ForeignLease,
    InvalidObjectKey,
    InvalidPutMode,
    LeaseLost,
    ObjectConditionalPutRequired,
    ObjectNotFound,
    ObjectPreconditionFailed,
    RunLocked,
    SequenceMismatch,
    StoreFull,
    StoreUnavailable,
)
from ..ids import validate_run_id

__all__ = ["IfVersion", "Lease", "ObjectStore", "Objects", "PrefixedObjects", "PutMode", "Store", "holder_info",
           "holder_is_dead", "machine_id", "os_failure"]

FULL_ERRNOS = frozenset(e for e in (errno.ENOSPC, errno.EFBIG, getattr(errno, "EDQUOT", None)) if e is not None)

#: Where the run index keeps one entry per run in the object face (``caravanserai.runs.index``).
RUN_INDEX_PREFIX = "runs-index/"


def run_index_key(run_id: str) -> str:
    return f"{RUN_INDEX_PREFIX}{run_id}.json"


# open_store()'s cache, URL -> store; Store.close() takes a store out of it.
_OPEN: dict[str, Store] = {}


def os_failure(exc: OSError, where: str, what: str) -> StoreUnavailable:
    """The typed one-line error for an ``OSError`` at the store boundary.

    ``StoreFull`` for a full disk, quota or file-size limit (ENOSPC, EDQUOT, EFBIG), else
    ``StoreUnavailable``; ``where`` names the store, ``what`` the operation.
    """
    reason = " ".join(str(exc.strerror or exc).split())
    if exc.errno in FULL_ERRNOS:
        return StoreFull(
            f"the {where} is full ({reason}) while {what}: free disk space or raise the quota or file-size "
            "limit, then retry; nothing was written",
            errno=exc.errno, where=where,
        )
    return StoreUnavailable(
        f"cannot use the {where} while {what}: {reason}; check the path and its permissions or set "
        "CARAVANSERAI_STORE",
        errno=exc.errno, where=where,
    )


def holder_info(token: int = 0) -> dict[str, Any]:
    """Who holds a lease: shown in RunLocked messages so a person can find the other writer.

    ``machine`` (the kernel's boot id and this process's pid namespace) tells whether a holder's
    pid can be checked from here: only then may a dead holder's lease be taken over before it
    expires (``holder_is_dead``).
    """
    return {"pid": os.getpid(), "host": socket.gethostname(), "since": journal.utc_now(), "token": token,
            "machine": machine_id()}


@functools.cache
def machine_id() -> str:
    """Boot id + pid namespace: processes with the same value see each other's pids (read once per
    process: neither changes under it, and every lease taken and every takeover asks)."""
    try:
        with open("/proc/sys/kernel/random/boot_id", "rb") as handle:
            boot = handle.read().strip().decode()
        return f"{boot}/{os.readlink('/proc/self/ns/pid')}"
    except (OSError, UnicodeDecodeError):
        return ""  # not Linux: never judge another process dead


#: leases this process released while its store could not be told (a database down, a bucket
#: unreachable): theirs to take over at once, not after they expire (``holder_is_dead``)
ABANDONED_LEASES: set[str] = set()


def holder_is_dead(holder: dict[str, Any] | None) -> bool:
    """True when ``holder`` ran in this machine's pid namespace and its process is gone (a kill -9,
    a killed kernel), or is this process and released that lease already (``ABANDONED_LEASES``):
    its lease may be taken over now instead of after it expires. Fencing (the token grows) still
    refuses anything the dead holder had in flight."""
    if not holder or not holder.get("machine") or holder.get("machine") != machine_id():
        return False
    pid = holder.get("pid")
    if pid == os.getpid() and holder.get("lease") in ABANDONED_LEASES:
        return True
    if type(pid) is not int or pid <= 1 or pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:
        return False  # alive, another user's
    return _zombie(pid)


def _zombie(pid: int, settle: float = 0.2) -> bool:
    """True for a killed process its parent has not reaped yet (state Z, no thread left): dead, though
    ``kill(pid, 0)`` works. (A process whose main thread exited while others run shows Z too: not dead.)
    A killed process's main thread shows Z while its other threads are still being torn down, for a
    few milliseconds: they are given ``settle`` seconds to go."""
    deadline = time.monotonic() + settle
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            if stat.read().rsplit(b")", 1)[1].split()[0] != b"Z":
                return False
        while len(os.listdir(f"/proc/{pid}/task")) > 1:
            if time.monotonic() > deadline:
                return False
            time.sleep(0.005)
        return True
    except FileNotFoundError:
        return True  # reaped meanwhile
    except (OSError, IndexError):
        return False


def removal_refused(run_id: str, locked: RunLocked) -> RunLocked:
    """The ``RunLocked`` of a removal that found a live writer (what taking the run's lease raised)."""
    holder = getattr(locked, "holder", None)
    return RunLocked(f"run {run_id!r} is being written by {describe_holder(holder)}; stop it before cleaning",
                     run_id=run_id, holder=holder)


def describe_holder(holder: dict[str, Any] | None) -> str:
    if not holder:
        return "another process"
    return f"pid {holder.get('pid', '?')} on {holder.get('host', '?')} since {holder.get('since', '?')}"


HELD_LEASES: weakref.WeakSet[Lease] = weakref.WeakSet()  # acquired and not released by this process


def _forget_leases_in_child() -> None:
    """A forked child holds no lease: every one the parent held is forgotten there (``forget_in_child``)."""
    for lease in list(HELD_LEASES):
        lease.forget_in_child()
    HELD_LEASES.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_leases_in_child)


class Lease(ABC):
    """Exclusive right to append to one run. ``token`` is the fencing token (grows on takeover);
    ``next_seq`` is the seq the next append must carry (``Store.append`` checks and advances it)."""

    def __init__(self, store: Store, run_id: str, token: int, holder: dict[str, Any], next_seq: int = 0) -> None:
        self.store = store
        self.run_id = run_id
        self.token = token
        self.holder = holder
        self.next_seq = next_seq
        self._released = False
        self.snapshot: list[str] | None = None  # the journal's lines as acquire read them (``load_held`` takes them)

    @property
    def held(self) -> bool:
        """False once released or lost; a writer must not append after that."""
        return not self._released

    @property
    def renewable(self) -> bool:
        """Not released nor lost: it may append again, after a renewal where its deadline passed."""
        return not self._released

    def check(self) -> None:
        """Raise LeaseLost unless this lease may still append."""
        if not self.held:
            raise LeaseLost(
                f"the lease on run {self.run_id!r} is no longer held by this process; "
                "open the run again (another writer may own it now)",
                run_id=self.run_id,
            )

    def renew(self) -> None:
        """Extend the lease; backends with expiring leases override this."""
        self.check()

    def release(self) -> None:
        if not self._released:
            self._released = True
            HELD_LEASES.discard(self)
            self._release()

    @abstractmethod
    def _release(self) -> None: ...

    def forget_in_child(self) -> None:
        """In a process forked while this lease was held: this copy must neither append (it carries the
        parent's token, so fencing cannot tell the two apart) nor release the lease the parent still
        holds; it refuses with ``LeaseLost``. (The local store's lock and journal descriptors are closed in
        the child by ``local.files.owned_fds_closed_in_child``.)"""
        self._released = True

    def __enter__(self) -> Lease:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


class IfVersion:
    """Put mode: replace the object only while its version is still ``version`` (compare-and-swap).

    ``version`` is what ``put`` returned or ``get_versioned`` read (an e-tag, a generation...);
    a put whose object changed or vanished meanwhile raises ``ObjectPreconditionFailed``.
    """

    __slots__ = ("version",)

    def __init__(self, version: str) -> None:
        if not isinstance(version, str) or not version:
            raise InvalidPutMode(f"IfVersion needs the non-empty str version a put or get_versioned returned, got "
                                 f"{version!r}", mode=repr(version))
        self.version = version

    def __eq__(self, other: object) -> bool:
        return isinstance(other, IfVersion) and other.version == self.version

    def __hash__(self) -> int:
        return hash(("IfVersion", self.version))

    def __repr__(self) -> str:
        return f"IfVersion({self.version!r})"


PutMode = Literal["overwrite", "create"] | IfVersion
_PLAIN_MODES = ("overwrite", "create")


class Objects(ABC):
    """Bytes by key: the object face every backend implements (checkpoint logs, ``store.objects``).

    A backend implements ``put``, ``get``, ``exists``, ``list`` and ``delete``; ``put_if_absent``
    is derived here from ``put(mode="create")``. Put modes, as obstore's:

    - ``"overwrite"`` (default) — write whatever is there;
    - ``"create"`` — write only if ``key`` is absent, else ``ObjectPreconditionFailed``; of
      concurrent creators exactly one wins (every backend), so created objects are write-once;
    - ``IfVersion(v)`` — compare-and-swap: write only if the object's version is still ``v``, else
      ``ObjectPreconditionFailed``. Only where ``supports_cas`` is True (elsewhere
      ``ObjectConditionalPutRequired``), together with ``get_versioned``.

    ``put`` returns the new version where the backend has versions (always when ``supports_cas``),
    else None. A reader never sees a partial object; ``put`` is durable when it returns.
    """

    #: True when ``put(mode=IfVersion(...))`` and ``get_versioned`` work. A class-level fact for
    #: most backends; an adapter whose capability depends on what it wraps makes it a property.
    supports_cas: bool = False

    @abstractmethod
    def put(self, key: str, data: bytes, *, mode: PutMode = "overwrite") -> str | None:
        """Write ``data`` at ``key`` under ``mode`` (see the class); the new version, or None."""

    @abstractmethod
    def get(self, key: str) -> bytes:
        """The bytes at ``key``; ObjectNotFound if absent. A reader never sees a partial object."""

    @abstractmethod
    def exists(self, key: str) -> bool: ...

    @abstractmethod
    def list(self, prefix: str = "") -> list[str]:
        """Keys starting with ``prefix``, sorted."""

    @abstractmethod
    def delete(self, key: str) -> bool:
        """Remove ``key``; True if it existed."""

    def get_versioned(self, key: str) -> tuple[bytes, str] | None:
        """``(bytes, version)`` at ``key`` (the version to pass to ``IfVersion``), None if absent."""
        raise self._no_cas("get_versioned()")

    #: GETs ``get_many`` runs at once: more than 1 for remote faces whose calls release the GIL.
    parallel_gets: int = 1

    def get_many(self, keys: Sequence[str]) -> dict[str, bytes]:
        """The objects that exist among ``keys``, by key (absent keys are left out): the run index
        reads one small entry per run. ``parallel_gets`` at a time; a backend that can fetch many
        in one round trip overrides this (SQL: one query)."""
        def one(key: str) -> bytes | None:
            try:
                return self.get(key)
            except ObjectNotFound:
                return None

        if self.parallel_gets > 1 and len(keys) > 1:
            from concurrent.futures import ThreadPoolExecutor

            with ThreadPoolExecutor(min(self.parallel_gets, len(keys)), thread_name_prefix="caravanserai-get") as pool:
                bodies = list(pool.map(one, keys))
        else:
            bodies = [one(key) for key in keys]
        return {key: data for key, data in zip(keys, bodies, strict=True) if data is not None}

    # ---- derived once, here -------------------------------------------------------------
    def put_if_absent(self, key: str, data: bytes) -> bool:
        """Write ``data`` only if ``key`` is absent; True if written, False if it existed (atomic)."""
        try:
            self.put(key, data, mode="create")
        except ObjectPreconditionFailed:
            return False
        return True

    def check_mode(self, mode: object) -> PutMode:
        """``mode`` if this face can honour it; InvalidPutMode / ObjectConditionalPutRequired otherwise."""
        if isinstance(mode, IfVersion):
            if not self.supports_cas:
                raise self._no_cas("put(mode=IfVersion(...))")
            return mode
        if mode not in _PLAIN_MODES:
            raise InvalidPutMode(f"put mode must be 'overwrite', 'create' or IfVersion(version), got {mode!r}",
                                 mode=repr(mode))
        return mode  # type: ignore[return-value]

    def _no_cas(self, what: str) -> ObjectConditionalPutRequired:
        return ObjectConditionalPutRequired(f"{what} needs compare-and-swap, which {self!r} does not offer "
                                            "(supports_cas is False); use an object face that has it (memory, S3, "
                                            "GCS, Azure)", what=what)

    def _missing(self, key: str) -> ObjectNotFound:
        return ObjectNotFound(f"no object at key {key!r} in {self!r}; check the key or the store", key=key)

    def _exists(self, key: str, mode: PutMode) -> ObjectPreconditionFailed:
        """The error for a put whose ``mode`` did not hold at ``key``."""
        if mode == "create":
            return ObjectPreconditionFailed(f"an object already exists at key {key!r} in {self!r}; a create never "
                                            "overwrites", key=key)
        return ObjectPreconditionFailed(f"the object at key {key!r} in {self!r} changed or vanished since version "
                                        f"{getattr(mode, 'version', '?')}; read it again and retry", key=key)

    @staticmethod
    def check_key(key: str) -> str:
        """``key`` if it is a non-empty relative ``/``-path without empty, ``.`` or ``..`` segments."""
        if not isinstance(key, str) or not key or key.startswith("/") or "\x00" in key:
            raise InvalidObjectKey(f"object key must be a non-empty relative str, got {key!r}"[:200], key=repr(key)[:100])
        if any(part in ("", ".", "..") for part in key.split("/")):
            raise InvalidObjectKey(f"object key {key!r} has an empty, '.' or '..' segment; use plain names joined by "
                                   "'/'", key=key)
        return key


ObjectStore = Objects  # the name before the object face became one contract


class PrefixedObjects(Objects):
    """The keys of another object face under ``prefix`` (a store's ``objects/`` area in a bucket)."""

    def __init__(self, inner: Objects, prefix: str) -> None:
        self.inner = inner
        self.prefix = prefix

    @property
    def supports_cas(self) -> bool:  # type: ignore[override]
        return self.inner.supports_cas

    def _key(self, key: str) -> str:
        return self.prefix + self.check_key(key)

    def put(self, key: str, data: bytes, *, mode: PutMode = "overwrite") -> str | None:
        mode = self.check_mode(mode)
        try:
            return self.inner.put(self._key(key), data, mode=mode)
        except ObjectPreconditionFailed:
            raise self._exists(key, mode) from None  # named by this face's key, not the bucket's

    def get(self, key: str) -> bytes:
        try:
            return self.inner.get(self._key(key))
        except ObjectNotFound:
            raise self._missing(key) from None

    def get_versioned(self, key: str) -> tuple[bytes, str] | None:
        return self.inner.get_versioned(self._key(key))

    def get_many(self, keys: Sequence[str]) -> dict[str, bytes]:
        found = self.inner.get_many([self._key(k) for k in keys])
        return {k: found[self._key(k)] for k in keys if self._key(k) in found}

    def exists(self, key: str) -> bool:
        return self.inner.exists(self._key(key))

    def list(self, prefix: str = "") -> list[str]:
        base = self.prefix + prefix
        return sorted(k[len(self.prefix):] for k in self.inner.list(base) if k.startswith(base))

    def delete(self, key: str) -> bool:
        return self.inner.delete(self._key(key))

    def __repr__(self) -> str:
        return f"{self.inner!r}/{self.prefix}"


class Store(ABC):
    """A place where runs live. Select one with ``caravanserai.open_store(url)``.

    Backends implement ``_load``, ``_append`` (a write: the lease and seq are checked here),
    ``_acquire`` (a lease whose ``next_seq`` is the journal's length), ``_remove``, ``list`` and ``objects``
    (and optionally ``_load_held``, ``_last_updated``, ``_torn_tail``, ``_committed``,
    ``_refresh_views``, ``_journal_versions``, ``_close``); the public methods check ids and map
    errors once, here.
    """

    scheme: ClassVar[str] = ""

    url: str
    #: set by ``open_store`` for a URL with ``?signed=1``: every journal line this process writes is
    #: signed with its key (``signing.line_signer``), so ``caravanserai verify`` detects a forged line
    journal_signer: journal.Signer | None = None
    #: the URL as given to ``open_store`` when it holds an option read there (``signed``): what a child
    #: process must open to write the same way
    opened_url: str | None = None

    # ---- run ids --------------------------------------------------------------------------
    def is_legacy_name(self, run_id: str) -> bool:
        """True for an existing run 0.2.0 created under an id our pattern rejects (readable only)."""
        return False

    def _readable(self, run_id: object) -> str:
        return validate_run_id(run_id, legacy=self.is_legacy_name)

    def _describe(self) -> str:
        """How messages name this store ("store sqlite:///x.db")."""
        return f"store {self.url}"

    @contextmanager
    def _os_errors(self, what: str) -> Iterator[None]:
        """Turn an OSError inside the block into StoreFull / StoreUnavailable (our own errors pass)."""
        try:
            yield
        except CaravanseraiError:
            raise  # StoreUnavailable is an OSError too: already typed
        except OSError as exc:
            raise os_failure(exc, self._describe(), what) from exc

    # ---- journal face ---------------------------------------------------------------------
    def load(self, run_id: str) -> list[str]:
        """The run's complete journal lines (a torn last line after a crash is left out); [] if none."""
        run_id = self._readable(run_id)
        with self._os_errors(f"reading run {run_id!r}"):
            return self._load(run_id)

    def load_since(self, run_id: str, seq: int) -> builtins.list[str]:
        """The journal lines from number ``seq`` on (what a follower has not read yet).

        Backends that can read from an offset override ``_load_since``; the default loads all.
        """
        run_id = self._readable(run_id)
        with self._os_errors(f"reading run {run_id!r}"):
            return self._load_since(run_id, max(0, int(seq)))

    def _load_since(self, run_id: str, seq: int) -> builtins.list[str]:
        return self._load(run_id)[seq:]

    def append(self, run_id: str, lines: Sequence[str], *, lease: Lease, seq: int, sync: bool = True) -> None:
        """Append ``lines`` (the first has number ``seq``); durable when it returns.

        ``sync=False`` lets a backend defer durability to the next synced append (the local store
        skips that fdatasync); backends whose every write is durable ignore it. Raises
        ``ForeignLease`` for a lease on another run or from another store, ``LeaseLost`` if
        ``lease`` no longer holds the run (a fenced-off writer cannot append) and
        ``SequenceMismatch`` unless ``seq`` is ``lease.next_seq``. A failed append leaves the
        journal as it was; appending no lines is a no-op.
        """
        # The writer's usual call costs no id check: a lease of this store on this run was only
        # granted for a checked id. Anything else is checked, for the right error.
        if not isinstance(lease, Lease) or lease.store is not self or lease.run_id != run_id:
            run_id = validate_run_id(run_id)
            raise ForeignLease(f"append to run {run_id!r} needs a lease on that run from {self._describe()} (acquire "
                               "it from this store)", run_id=run_id)
        lease.check()
        if seq != lease.next_seq:
            raise SequenceMismatch(f"append to run {run_id!r} at seq {seq}, but the journal's next seq is "
                                   f"{lease.next_seq}", run_id=run_id, expected=lease.next_seq)
        if type(lines) is not list:
            lines = list(lines)
        if not lines:
            return
        try:  # as _os_errors, inline: this is the hot path of every journaled call
            self._append(run_id, lines, lease=lease, seq=seq, sync=sync)
        except CaravanseraiError:
            raise
        except OSError as exc:
            raise os_failure(exc, self._describe(), f"appending to run {run_id!r}") from exc
        lease.next_seq = seq + len(lines)

    def acquire(self, run_id: str) -> Lease:
        """Take the run's exclusive writer lease; RunLocked naming the holder if another has it."""
        run_id = validate_run_id(run_id)
        with self._os_errors(f"opening run {run_id!r} for writing"):
            lease = self._acquire(run_id)
        HELD_LEASES.add(lease)
        return lease

    def load_held(self, lease: Lease) -> list[str]:
        """``load`` for the holder of ``lease`` (a backend may reuse what acquiring just read)."""
        run_id = validate_run_id(lease.run_id)
        with self._os_errors(f"reading run {run_id!r}"):
            return self._load_held(lease)

    def remove(self, run_id: str) -> bool:
        """Delete a run (journal and views); True if it existed. RunLocked if a live writer has it."""
        run_id = self._readable(run_id)
        with self._os_errors(f"removing run {run_id!r}"):
            removed = self._remove(run_id)
        try:
            self.index_delete(run_id)
        except (CaravanseraiError, OSError):
            pass  # an index entry without its journal is never read (no version)
        return removed

    @abstractmethod
    def list(self) -> list[str]:
        """Ids of the runs in this store, sorted."""

    def close(self) -> None:
        """Release connections and background work; ``open_store`` then opens this URL afresh."""
        for key in [k for k, v in _OPEN.items() if v is self]:
            _OPEN.pop(key, None)
        self._close()

    @property
    @abstractmethod
    def objects(self) -> Objects:
        """The object face of this store."""

    # ---- what backends implement ----------------------------------------------------------
    @abstractmethod
    def _load(self, run_id: str) -> builtins.list[str]: ...

    @abstractmethod
    def _append(self, run_id: str, lines: Sequence[str], *, lease: Lease, seq: int, sync: bool = True) -> None:
        """Write ``lines`` durably (the prologue in ``append`` has checked the lease and ``seq``);
        LeaseLost if the backend itself fences this writer off."""

    @abstractmethod
    def _acquire(self, run_id: str) -> Lease: ...

    @abstractmethod
    def _remove(self, run_id: str) -> bool: ...

    def _load_held(self, lease: Lease) -> builtins.list[str]:
        """The lines the lease's acquire read (``lease.snapshot``, handed over once, and only while nothing
        was appended since), else a read; a backend that keeps its holder's lines up to date overrides this."""
        snapshot = getattr(lease, "snapshot", None)
        lease.snapshot = None
        return snapshot if snapshot is not None and len(snapshot) == lease.next_seq else self._load(lease.run_id)

    def _close(self) -> None:  # noqa: B027 - optional hook: backends without connections keep the no-op
        """Release the backend's connections (default: nothing to release)."""

    # ---- derived helpers ----------------------------------------------------------------
    def events(self, run_id: str) -> builtins.list[dict]:
        """The run's verified events (JournalCorruptionError on damage)."""
        run_id = self._readable(run_id)
        return journal.decode(run_id, self.load(run_id))[0]

    def has_run(self, run_id: str) -> bool:
        """True if the run has at least one journal line."""
        return bool(self.load(run_id))

    def torn_tail(self, run_id: str) -> int:
        """Bytes after the journal's last complete line (a crash mid-append); 0 where appends are atomic."""
        run_id = self._readable(run_id)
        with self._os_errors(f"reading run {run_id!r}"):
            return self._torn_tail(run_id)

    def _torn_tail(self, run_id: str) -> int:
        return 0

    def committed(self, run_id: str, events: Sequence[dict]) -> None:
        """Hook called after an acknowledged append; the local store renders its views here.

        Never raises for a view problem: the append it follows is already durable.
        """
        run_id = validate_run_id(run_id)
        try:
            self._committed(run_id, events)
        except Exception:
            pass  # views are a convenience; the journal already holds the truth

    def _committed(self, run_id: str, events: Sequence[dict]) -> None:  # noqa: B027 - optional hook, no-op by default
        pass

    def refresh_views(self, run_id: str, events: Sequence[dict] | None = None, *, writer: bool = False) -> None:
        """Bring human-readable views up to date with the journal (no-op where there are none)."""
        run_id = self._readable(run_id)
        with self._os_errors(f"reading run {run_id!r}"):
            self._refresh_views(run_id, events, writer=writer)

    def _refresh_views(self, run_id: str, events: Sequence[dict] | None, *, writer: bool) -> None:  # noqa: B027 - optional hook
        pass

    # ---- where the run index keeps its entries (``caravanserai.runs.index``) ------------------
    def index_get_many(self, run_ids: Sequence[str]) -> dict[str, bytes]:
        """The stored index entries of ``run_ids`` (those that exist), by run id.

        Default: the object face at ``runs-index/<run_id>.json``; the local store keeps each entry
        in its run's directory.
        """
        keys = {run_index_key(r): r for r in run_ids}
        return {keys[key]: data for key, data in self.objects.get_many(list(keys)).items()}

    def index_put(self, run_id: str, data: bytes) -> None:
        """Store ``run_id``'s index entry (a cache of its journal: it need not survive a crash)."""
        self.objects.put(run_index_key(run_id), data)

    def index_delete(self, run_id: str) -> None:
        self.objects.delete(run_index_key(run_id))

    def journal_versions(self, run_ids: Sequence[str] | None = None) -> dict[str, str]:
        """A change token per run (every run, or ``run_ids`` that exist): it differs whenever the
        run's journal changed. The run index keys its entries by it (``caravanserai.runs.index``).

        Backends override ``_journal_versions`` with something cheap (a file size, a row count);
        the default reads each journal.
        """
        wanted = None if run_ids is None else [self._readable(r) for r in run_ids]
        with self._os_errors("reading the runs' versions"):
            return self._journal_versions(wanted)

    def _journal_versions(self, run_ids: Sequence[str] | None) -> dict[str, str]:
        versions = {}
        for run_id in self.list() if run_ids is None else run_ids:
            lines = self._load(run_id)
            if lines:
                versions[run_id] = f"{len(lines)}:{journal.line_digest(lines[-1])[:16]}"
        return versions

    def last_updated(self, run_id: str) -> float | None:
        """POSIX time of the run's last event, or None."""
        run_id = self._readable(run_id)
        with self._os_errors(f"reading run {run_id!r}"):
            return self._last_updated(run_id)

    def _last_updated(self, run_id: str) -> float | None:
        lines = self._load(run_id)
        if not lines:
            return None
        from datetime import datetime

        # only the last event's time is needed: read that line, not the whole journal
        try:
            return datetime.fromisoformat(json.loads(lines[-1])["at"]).timestamp()
        except (ValueError, KeyError, TypeError):
            return None  # a damaged line: `events()` reports it, a timestamp is not worth an error

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.url!r})"

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

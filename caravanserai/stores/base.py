"""The one ``Store`` abstraction: a journal face and an object face, implemented per backend.

Journal face (what a durable run needs): ``load`` the complete lines of a run's journal,
``append`` lines durably under a ``Lease`` from ``acquire``, ``list`` the runs, ``close``.
Object face (``store.objects``, what checkpoint logs need): ``put``, ``get``, ``exists``,
``list``, ``delete`` and an atomic ``put_if_absent``; objects written by ``put_if_absent`` are
write-once. Stores move lines and bytes; numbering and hash-chaining live in
``caravanserai.journal``, so every backend verifies the same way.

The public journal methods are implemented here once: they check the run id
(``caravanserai.ids.validate_run_id``; read-only ones also accept an existing 0.2.0 name the
backend vouches for with ``is_legacy_name``) and turn an ``OSError`` into ``StoreFull`` or
``StoreUnavailable``, then call the backend's ``_load``, ``_append``, ``_acquire``, ``_remove``...
A backend implements the underscored methods and never sees an unchecked id.
"""

from __future__ import annotations

import errno
import json
import os
import socket
from abc import ABC, abstractmethod
from contextlib import contextmanager
from typing import Any, ClassVar, Iterator, Sequence

from .. import journal
from ..errors import CaravanseraiError, LeaseLost, ObjectNotFound, StoreFull, StoreUnavailable
from ..ids import validate_run_id

__all__ = ["Lease", "ObjectStore", "Store", "holder_info", "os_failure"]

FULL_ERRNOS = frozenset(e for e in (errno.ENOSPC, errno.EFBIG, getattr(errno, "EDQUOT", None)) if e is not None)

# open_store()'s cache, URL -> store; Store.close() takes a store out of it.
_OPEN: dict[str, "Store"] = {}


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
    """Who holds a lease: shown in RunLocked messages so a person can find the other writer."""
    return {"pid": os.getpid(), "host": socket.gethostname(), "since": journal.utc_now(), "token": token}


def describe_holder(holder: dict[str, Any] | None) -> str:
    if not holder:
        return "another process"
    return f"pid {holder.get('pid', '?')} on {holder.get('host', '?')} since {holder.get('since', '?')}"


class Lease(ABC):
    """Exclusive right to append to one run. ``token`` is the fencing token (grows on takeover)."""

    def __init__(self, store: "Store", run_id: str, token: int, holder: dict[str, Any]) -> None:
        self.store = store
        self.run_id = run_id
        self.token = token
        self.holder = holder
        self._released = False

    @property
    def held(self) -> bool:
        """False once released or lost; a writer must not append after that."""
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
            self._release()

    @abstractmethod
    def _release(self) -> None: ...

    def __enter__(self) -> "Lease":
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


class ObjectStore(ABC):
    """Bytes by key. ``put_if_absent`` is atomic: of concurrent writers exactly one wins."""

    @abstractmethod
    def put(self, key: str, data: bytes) -> None:
        """Write ``data`` at ``key`` (overwriting); durable when it returns."""

    @abstractmethod
    def put_if_absent(self, key: str, data: bytes) -> bool:
        """Write ``data`` only if ``key`` is absent; True if written, False if it existed."""

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

    def _missing(self, key: str) -> ObjectNotFound:
        return ObjectNotFound(f"no object at key {key!r} in {self!r}; check the key or the store", key=key)

    @staticmethod
    def check_key(key: str) -> str:
        """``key`` if it is a non-empty relative ``/``-path without empty, ``.`` or ``..`` segments."""
        if not isinstance(key, str) or not key or key.startswith("/") or "\x00" in key:
            raise ValueError(f"object key must be a non-empty relative str, got {key!r}")
        if any(part in ("", ".", "..") for part in key.split("/")):
            raise ValueError(f"object key {key!r} has an empty, '.' or '..' segment; use plain names joined by '/'")
        return key


class Store(ABC):
    """A place where runs live. Select one with ``caravanserai.open_store(url)``.

    Backends implement ``_load``, ``_append``, ``_acquire``, ``_remove``, ``list`` and ``objects``
    (and optionally ``_load_held``, ``_last_updated``, ``_torn_tail``, ``_committed``,
    ``_refresh_views``, ``_close``); the public methods check ids and map errors once, here.
    """

    scheme: ClassVar[str] = ""

    url: str

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

    def append(self, run_id: str, lines: Sequence[str], *, lease: Lease, seq: int, sync: bool = True) -> None:
        """Append ``lines`` (the first has number ``seq``); durable when it returns.

        ``sync=False`` lets a backend defer durability to the next synced append (the local store
        skips that fdatasync); backends whose every write is durable ignore it. Raises LeaseLost
        if ``lease`` no longer holds the run: a fenced-off writer cannot append. A failed append
        leaves the journal as it was.
        """
        run_id = validate_run_id(run_id)
        with self._os_errors(f"appending to run {run_id!r}"):
            self._append(run_id, lines, lease=lease, seq=seq, sync=sync)

    def acquire(self, run_id: str) -> Lease:
        """Take the run's exclusive writer lease; RunLocked naming the holder if another has it."""
        run_id = validate_run_id(run_id)
        with self._os_errors(f"opening run {run_id!r} for writing"):
            return self._acquire(run_id)

    def load_held(self, lease: Lease) -> list[str]:
        """``load`` for the holder of ``lease`` (a backend may reuse what acquiring just read)."""
        run_id = validate_run_id(lease.run_id)
        with self._os_errors(f"reading run {run_id!r}"):
            return self._load_held(lease)

    def remove(self, run_id: str) -> bool:
        """Delete a run (journal and views); True if it existed. RunLocked if a live writer has it."""
        run_id = self._readable(run_id)
        with self._os_errors(f"removing run {run_id!r}"):
            return self._remove(run_id)

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
    def objects(self) -> ObjectStore:
        """The object face of this store."""

    # ---- what backends implement ----------------------------------------------------------
    @abstractmethod
    def _load(self, run_id: str) -> list[str]: ...

    @abstractmethod
    def _append(self, run_id: str, lines: Sequence[str], *, lease: Lease, seq: int, sync: bool = True) -> None: ...

    @abstractmethod
    def _acquire(self, run_id: str) -> Lease: ...

    @abstractmethod
    def _remove(self, run_id: str) -> bool: ...

    def _load_held(self, lease: Lease) -> list[str]:
        return self._load(lease.run_id)

    def _close(self) -> None:
        """Release the backend's connections (default: nothing to release)."""

    # ---- derived helpers ----------------------------------------------------------------
    def events(self, run_id: str) -> list[dict]:
        """The run's verified events (JournalCorruptionError on damage)."""
        run_id = self._readable(run_id)
        return journal.decode(run_id, self.load(run_id))[0]

    def has_run(self, run_id: str) -> bool:
        """True if the run has at least one journal line."""
        return bool(self.load(run_id))

    def private_to_user(self) -> bool:
        """True when only this user can have written the store (pickled values may be loaded from it).

        The local store created by this user with mode 0o700 is; shared stores (SQL, object, HTTP)
        are not, whatever their credentials: another writer could have planted a pickle there.
        """
        return False

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

    def _committed(self, run_id: str, events: Sequence[dict]) -> None:
        pass

    def refresh_views(self, run_id: str, events: Sequence[dict] | None = None, *, writer: bool = False) -> None:
        """Bring human-readable views up to date with the journal (no-op where there are none)."""
        run_id = self._readable(run_id)
        with self._os_errors(f"reading run {run_id!r}"):
            self._refresh_views(run_id, events, writer=writer)

    def _refresh_views(self, run_id: str, events: Sequence[dict] | None, *, writer: bool) -> None:
        pass

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

    def __enter__(self) -> "Store":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

"""The one ``Store`` abstraction: a journal face and an object face, implemented per backend.

Journal face (what a durable run needs): ``load`` the complete lines of a run's journal,
``append`` lines durably under a ``Lease`` from ``acquire``, ``list`` the runs, ``close``.
Object face (``store.objects``, what checkpoint logs need): ``put``, ``get``, ``exists``,
``list``, ``delete`` and an atomic ``put_if_absent``; objects written by ``put_if_absent`` are
write-once. Stores move lines and bytes; numbering and hash-chaining live in
``caravanserai.journal``, so every backend verifies the same way.
"""

from __future__ import annotations

import json
import os
import socket
from abc import ABC, abstractmethod
from typing import Any, ClassVar, Sequence

from .. import journal
from ..errors import LeaseLost, ObjectNotFound

__all__ = ["Lease", "ObjectStore", "Store", "holder_info"]


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
        if not isinstance(key, str) or not key or key.startswith("/") or "\x00" in key:
            raise ValueError(f"object key must be a non-empty relative str, got {key!r}")
        if any(part in ("", ".", "..") for part in key.split("/")):
            raise ValueError(f"object key {key!r} has an empty, '.' or '..' segment; use plain names joined by '/'")
        return key


class Store(ABC):
    """A place where runs live. Select one with ``caravanserai.open_store(url)``."""

    scheme: ClassVar[str] = ""

    url: str

    # ---- journal face -------------------------------------------------------------------
    @abstractmethod
    def load(self, run_id: str) -> list[str]:
        """The run's complete journal lines (a torn last line after a crash is left out); [] if none."""

    @abstractmethod
    def append(self, run_id: str, lines: Sequence[str], *, lease: Lease, seq: int, sync: bool = True) -> None:
        """Append ``lines`` (the first has number ``seq``); durable when it returns.

        ``sync=False`` lets a backend defer durability to the next synced append (the local store
        skips that fdatasync); backends whose every write is durable ignore it. Raises LeaseLost
        if ``lease`` no longer holds the run: a fenced-off writer cannot append.
        """

    def load_held(self, lease: Lease) -> list[str]:
        """``load`` for the holder of ``lease`` (a backend may reuse what acquiring just read)."""
        return self.load(lease.run_id)

    @abstractmethod
    def acquire(self, run_id: str) -> Lease:
        """Take the run's exclusive writer lease; RunLocked naming the holder if another has it."""

    @abstractmethod
    def list(self) -> list[str]:
        """Ids of the runs in this store, sorted."""

    @abstractmethod
    def remove(self, run_id: str) -> bool:
        """Delete a run (journal and views); True if it existed. RunLocked if a live writer has it."""

    def close(self) -> None:
        """Release connections and background work; the store may not be used afterwards."""

    @property
    @abstractmethod
    def objects(self) -> ObjectStore:
        """The object face of this store."""

    # ---- derived helpers ----------------------------------------------------------------
    def events(self, run_id: str) -> list[dict]:
        """The run's verified events (JournalCorruptionError on damage)."""
        return journal.decode(run_id, self.load(run_id))[0]

    def has_run(self, run_id: str) -> bool:
        return bool(self.load(run_id))

    def private_to_user(self) -> bool:
        """True when only this user can have written the store (pickled values may be loaded from it).

        The local store created by this user with mode 0o700 is; shared stores (SQL, object, HTTP)
        are not, whatever their credentials: another writer could have planted a pickle there.
        """
        return False

    def torn_tail(self, run_id: str) -> int:
        """Bytes after the journal's last complete line (a crash mid-append); 0 where appends are atomic."""
        return 0

    def committed(self, run_id: str, events: Sequence[dict]) -> None:
        """Hook called after an acknowledged append; the local store renders its views here."""

    def refresh_views(self, run_id: str, events: Sequence[dict] | None = None, *, writer: bool = False) -> None:
        """Bring human-readable views up to date with the journal (no-op where there are none)."""

    def last_updated(self, run_id: str) -> float | None:
        """POSIX time of the run's last event, or None."""
        lines = self.load(run_id)
        if not lines:
            return None
        from datetime import datetime

        # only the last event's time is needed: read that line, not the whole journal
        return datetime.fromisoformat(json.loads(lines[-1])["at"]).timestamp()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.url!r})"

    def __enter__(self) -> "Store":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

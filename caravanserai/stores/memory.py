"""``memory://`` — an in-process store for tests and demos (gone when the process ends).

Stores opened with the same ``memory://name`` URL in one process share their data, so a
test can open a run twice and see one journal.
"""

from __future__ import annotations

import threading
from typing import Sequence

from ..errors import InvalidStoreUrl, LeaseLost, RunLocked
from .base import Lease, ObjectStore, Store, describe_holder, holder_info

_SPACES: dict[str, "_Space"] = {}
_SPACES_LOCK = threading.Lock()


class _Space:
    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.journals: dict[str, list[str]] = {}
        self.holders: dict[str, dict] = {}
        self.tokens: dict[str, int] = {}
        self.objects: dict[str, bytes] = {}


class MemoryLease(Lease):
    def _space(self) -> _Space:
        return self.store._space  # type: ignore[attr-defined]

    @property
    def held(self) -> bool:
        space = self._space()
        with space.lock:
            current = space.holders.get(self.run_id)
            return not self._released and current is not None and current.get("token") == self.token

    def _release(self) -> None:
        space = self._space()
        with space.lock:
            current = space.holders.get(self.run_id)
            if current is not None and current.get("token") == self.token:
                del space.holders[self.run_id]


class MemoryObjects(ObjectStore):
    def __init__(self, space: _Space, url: str) -> None:
        self._space = space
        self._url = url

    def put(self, key: str, data: bytes) -> None:
        with self._space.lock:
            self._space.objects[self.check_key(key)] = bytes(data)

    def put_if_absent(self, key: str, data: bytes) -> bool:
        with self._space.lock:
            if self.check_key(key) in self._space.objects:
                return False
            self._space.objects[key] = bytes(data)
            return True

    def get(self, key: str) -> bytes:
        with self._space.lock:
            try:
                return self._space.objects[key]
            except KeyError:
                raise self._missing(key) from None

    def exists(self, key: str) -> bool:
        with self._space.lock:
            return key in self._space.objects

    def list(self, prefix: str = "") -> list[str]:
        with self._space.lock:
            return sorted(k for k in self._space.objects if k.startswith(prefix))

    def delete(self, key: str) -> bool:
        with self._space.lock:
            return self._space.objects.pop(key, None) is not None

    def __repr__(self) -> str:
        return f"MemoryObjects({self._url!r})"


class MemoryStore(Store):
    """Journal and objects in a dict shared by every ``MemoryStore`` of the same name."""

    scheme = "memory"

    def __init__(self, name: str = "") -> None:
        self.url = f"memory://{name}"
        with _SPACES_LOCK:
            self._space = _SPACES.setdefault(name, _Space())
        self._objects = MemoryObjects(self._space, self.url)

    @classmethod
    def from_url(cls, url: str) -> "MemoryStore":
        """``memory://name``: stores of one name share their runs within this process; no options."""
        from .urls import split_url

        parts = split_url(url, "memory://name")
        if parts.query or parts.fragment:
            raise InvalidStoreUrl(f"memory:// URLs take no options, got {url!r}; use memory://name", url=url)
        return cls(url.split("://", 1)[1].split("?", 1)[0].strip("/"))

    def private_to_user(self) -> bool:
        """True: only this process can write an in-process store."""
        return True

    def _load(self, run_id: str) -> list[str]:
        with self._space.lock:
            return list(self._space.journals.get(run_id, ()))

    def _append(self, run_id: str, lines: Sequence[str], *, lease: Lease, seq: int, sync: bool = True) -> None:
        with self._space.lock:
            if not lease.held:
                lease.check()
            journal = self._space.journals.setdefault(run_id, [])
            if len(journal) != seq:
                raise LeaseLost(
                    f"run {run_id!r} has {len(journal)} events but this writer expected {seq}; "
                    "another writer appended: open the run again",
                    run_id=run_id,
                )
            journal.extend(lines)

    def _acquire(self, run_id: str) -> Lease:
        with self._space.lock:
            current = self._space.holders.get(run_id)
            if current is not None:
                raise RunLocked(
                    f"run {run_id!r} is being written by {describe_holder(current)}; "
                    "close that run first or use another run id",
                    run_id=run_id, holder=current,
                )
            token = self._space.tokens.get(run_id, 0) + 1
            self._space.tokens[run_id] = token
            holder = holder_info(token)
            self._space.holders[run_id] = holder
            return MemoryLease(self, run_id, token, holder)

    def list(self) -> list[str]:
        with self._space.lock:
            return sorted(k for k, v in self._space.journals.items() if v)

    def _remove(self, run_id: str) -> bool:
        with self._space.lock:
            current = self._space.holders.get(run_id)
            if current is not None:
                raise RunLocked(
                    f"run {run_id!r} is being written by {describe_holder(current)}; close it before cleaning",
                    run_id=run_id, holder=current,
                )
            return self._space.journals.pop(run_id, None) is not None

    @property
    def objects(self) -> ObjectStore:
        return self._objects

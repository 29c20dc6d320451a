"""``memory://`` — an in-process store for tests and demos (gone when the process ends).

Stores opened with the same ``memory://name`` URL in one process share their data, so a
test can open a run twice and see one journal. ``MemoryObjects`` is the object face on its own,
with compare-and-swap (``supports_cas``), so stores built on object storage can be tested
without a bucket.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Sequence

from ..errors import InvalidStoreUrl, RunLocked
from .base import IfVersion, Lease, Objects, PutMode, Store, describe_holder, holder_info

__all__ = ["MemoryObjects", "MemoryStore"]

_SPACES: dict[str, _Space] = {}
_SPACES_LOCK = threading.Lock()


class _Space:
    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.journals: dict[str, list[str]] = {}
        self.holders: dict[str, dict] = {}
        self.tokens: dict[str, int] = {}
        self.objects: dict[str, tuple[bytes, str]] = {}  # key -> (data, version)
        self.versions = itertools.count(1)  # never reused: a deleted and re-created key gets a new version


def _named_space(name: str) -> _Space:
    with _SPACES_LOCK:
        return _SPACES.setdefault(name, _Space())


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


class MemoryObjects(Objects):
    """Objects in process memory, versioned: ``MemoryObjects()`` is private to the instance,
    ``MemoryObjects("name")`` shares the objects of ``memory://name``."""

    supports_cas = True

    def __init__(self, name: str | None = None, *, _space: _Space | None = None) -> None:
        self._space = _space or (_named_space(name) if name is not None else _Space())
        self._url = f"memory://{name}" if name is not None else "memory://"

    def put(self, key: str, data: bytes, *, mode: PutMode = "overwrite") -> str:
        key, mode, data = self.check_key(key), self.check_mode(mode), bytes(data)
        with self._space.lock:
            current = self._space.objects.get(key)
            if mode == "create" and current is not None:
                raise self._exists(key, mode)
            if isinstance(mode, IfVersion) and (current is None or current[1] != mode.version):
                raise self._exists(key, mode)
            version = str(next(self._space.versions))
            self._space.objects[key] = (data, version)
            return version

    def get(self, key: str) -> bytes:
        with self._space.lock:
            try:
                return self._space.objects[key][0]
            except KeyError:
                raise self._missing(key) from None

    def get_versioned(self, key: str) -> tuple[bytes, str] | None:
        with self._space.lock:
            return self._space.objects.get(key)

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
        self._space = _named_space(name)
        self._objects = MemoryObjects(name, _space=self._space)

    @classmethod
    def from_url(cls, url: str) -> MemoryStore:
        """``memory://name``: stores of one name share their runs within this process; no options."""
        from .urls import split_url

        parts = split_url(url, "memory://name")
        if parts.query or parts.fragment:
            raise InvalidStoreUrl(f"memory:// URLs take no options, got {url!r}; use memory://name", url=url)
        return cls(url.split("://", 1)[1].split("?", 1)[0].strip("/"))

    def _load(self, run_id: str) -> list[str]:
        with self._space.lock:
            return list(self._space.journals.get(run_id, ()))

    def _append(self, run_id: str, lines: Sequence[str], *, lease: Lease, seq: int, sync: bool = True) -> None:
        with self._space.lock:
            lease.check()  # again under the lock: a release or takeover cannot slip in before the write
            self._space.journals.setdefault(run_id, []).extend(lines)

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
            return MemoryLease(self, run_id, token, holder, len(self._space.journals.get(run_id, ())))

    def list(self) -> list[str]:
        with self._space.lock:
            return sorted(k for k, v in self._space.journals.items() if v)

    def _journal_versions(self, run_ids: Sequence[str] | None) -> dict[str, str]:
        with self._space.lock:
            journals = self._space.journals
            wanted = journals if run_ids is None else run_ids
            return {r: f"{len(journals[r])}:{self._space.tokens.get(r, 0)}" for r in wanted if journals.get(r)}

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
    def objects(self) -> Objects:
        return self._objects

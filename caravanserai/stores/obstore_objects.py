"""The object face on object storage (S3, GCS, Azure, memory) through obstore.

``put_if_absent`` is a conditional create (S3 ``If-None-Match: *``, GCS
``x-goog-if-generation-match: 0``), so of concurrent writers exactly one wins, with no lock.
Needs ``pip install 'caravanserai[s3]'``.
"""

from __future__ import annotations

from typing import Any

from ..errors import MissingExtra, StoreUnavailable
from .base import ObjectStore


def _obstore():
    try:
        import obstore
        from obstore import exceptions
    except ImportError as exc:
        raise MissingExtra("object storage needs obstore: pip install 'caravanserai[s3]'", extra="s3") from exc
    return obstore, exceptions


class _Missing(Exception):
    pass


class _Exists(Exception):
    pass


class ObstoreObjects(ObjectStore):
    """Objects in any obstore store (``obstore.store.S3Store(...)``, ``GCSStore``, ``MemoryStore``...)."""

    def __init__(self, store: Any, description: str = "") -> None:
        self.store = store
        self.description = description or repr(store)

    def _call(self, fn, *args, **kwargs):
        """Run an obstore call, mapping its errors (obstore raises both its own and builtin ones)."""
        _, exc = _obstore()
        try:
            return fn(*args, **kwargs)
        except (exc.NotFoundError, FileNotFoundError):
            raise _Missing from None
        except (exc.AlreadyExistsError, exc.PreconditionError, FileExistsError):
            raise _Exists from None
        except (exc.BaseError, OSError) as error:
            raise StoreUnavailable(f"object store {self.description} failed: {error}; check the endpoint, bucket and "
                                   "credentials", url=self.description) from error

    def put(self, key: str, data: bytes) -> None:
        obs, _ = _obstore()
        self._call(obs.put, self.store, self.check_key(key), bytes(data))

    def put_if_absent(self, key: str, data: bytes) -> bool:
        obs, _ = _obstore()
        try:
            self._call(obs.put, self.store, self.check_key(key), bytes(data), mode="create")
        except _Exists:
            return False
        return True

    def get(self, key: str) -> bytes:
        obs, _ = _obstore()
        try:
            return bytes(self._call(obs.get, self.store, key).bytes())
        except _Missing:
            raise self._missing(key) from None

    def exists(self, key: str) -> bool:
        obs, _ = _obstore()
        try:
            self._call(obs.head, self.store, key)
        except _Missing:
            return False
        return True

    def list(self, prefix: str = "") -> list[str]:
        obs, _ = _obstore()
        def collect() -> list[str]:  # the listing streams: errors surface while iterating
            return [meta["path"] for batch in obs.list(self.store, prefix=prefix or None) for meta in batch]

        try:
            keys = self._call(collect)
        except _Missing:
            return []
        return sorted(k for k in keys if k.startswith(prefix))

    def delete(self, key: str) -> bool:
        obs, _ = _obstore()
        if not self.exists(key):
            return False
        try:
            self._call(obs.delete, self.store, key)
        except _Missing:
            return False
        return True

    def __repr__(self) -> str:
        return f"ObstoreObjects({self.description})"

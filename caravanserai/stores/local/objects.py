"""``LocalObjects``: the object face as files under a directory (a local store's ``.objects/``, or
a checkpoint directory on a shared mount).

Each put writes a unique temp file, fsyncs it, then renames it into place (``"overwrite"``) or
hard-links it (``"create"``: the link fails if the key exists, so of concurrent creators exactly
one wins), and fsyncs the directory. There is no compare-and-swap (``supports_cas`` is False):
a directory cannot compare and replace atomically without a lock.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from ..base import Objects, PutMode, os_failure
from .files import fsync_dir, make_dirs, write_file_atomic

__all__ = ["LocalDirectoryStore", "LocalObjects"]


class LocalObjects(Objects):
    """Objects as files under ``path``: temp file + fsync + rename/link + directory fsync."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.root = Path(path).absolute()

    def _path(self, key: str) -> Path:
        return self.root / self.check_key(key)

    def _failure(self, exc: OSError, what: str) -> Exception:
        return os_failure(exc, f"local object store at {str(self.root)!r}", what)

    def put(self, key: str, data: bytes, *, mode: PutMode = "overwrite") -> None:
        path, mode = self._path(key), self.check_mode(mode)
        try:
            if mode == "create" and path.exists():  # cheap refusal before writing a temp file
                raise self._exists(key, mode)
            make_dirs(path.parent)
            written = write_file_atomic(path, bytes(data), exclusive=mode == "create")
        except OSError as exc:
            raise self._failure(exc, f"writing object {key!r}") from exc
        if not written:
            raise self._exists(key, mode)

    def get(self, key: str) -> bytes:
        try:
            return self._path(key).read_bytes()
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            raise self._missing(key) from None
        except OSError as exc:
            raise self._failure(exc, f"reading object {key!r}") from exc

    def get_many(self, keys: Sequence[str]) -> dict[str, bytes]:
        """Many small objects (the run index) by plain reads, without a Path per key."""
        root, found = str(self.root), {}
        for key in keys:
            try:
                with open(f"{root}/{self.check_key(key)}", "rb") as handle:
                    found[key] = handle.read()
            except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
                continue
            except OSError as exc:
                raise self._failure(exc, f"reading object {key!r}") from exc
        return found

    def exists(self, key: str) -> bool:
        try:
            return self._path(key).is_file()
        except OSError as exc:
            raise self._failure(exc, f"reading object {key!r}") from exc

    def list(self, prefix: str = "") -> list[str]:
        keys = []
        try:
            # walk only the folder the prefix names (not every checkpoint of every log)
            folder_part = prefix.rsplit("/", 1)[0] if "/" in prefix else ""
            plain = folder_part and all(p not in ("", ".", "..") for p in folder_part.split("/"))
            top = self.root / folder_part if plain else self.root
            if not top.is_dir():
                return []
            for folder, _dirs, files in os.walk(top):
                rel = Path(folder).relative_to(self.root).as_posix()
                for name in files:
                    if name.startswith(".") and name.endswith(".tmp"):
                        continue
                    key = name if rel == "." else f"{rel}/{name}"
                    if key.startswith(prefix):
                        keys.append(key)
        except OSError as exc:
            raise self._failure(exc, "listing objects") from exc
        return sorted(keys)

    def delete(self, key: str) -> bool:
        path = self._path(key)
        try:
            os.unlink(path)
            fsync_dir(path.parent)
        except FileNotFoundError:
            return False
        except OSError as exc:
            raise self._failure(exc, f"deleting object {key!r}") from exc
        return True

    def __repr__(self) -> str:
        return f"LocalObjects({str(self.root)!r})"


LocalDirectoryStore = LocalObjects  # the seed's name (``caravanserai.checkpoints.LocalDirectoryStore``)

"""The local directory store (default ``./.caravanserai``), readable by people and by 0.2.0.

Layout of a run directory ``<root>/<run_id>/``:

- ``journal.jsonl`` — the source of truth; appended with ``write`` + ``fdatasync``, the directory
  fsynced when the file is created;
- ``lock`` — ``flock``-ed by the one live writer and holding its pid/host/since; the kernel drops
  the lock when that process dies, so a dead writer's lock is taken over safely;
- ``waypoint-N.md``, ``state.json``, ``latest``, ``meta.json`` — views in 0.2.0's format, rendered
  from the journal off the checkpoint's critical path (each file replaced atomically). After a
  kill they can lag the journal; the next writer, ``load_latest`` and the CLI re-render them.

A 0.2.0/0.1.x directory (views only, no journal) is read through ``caravanserai.legacy``; the
first write into it stores those events as the start of a new journal. Directories are 0o700 and
files 0o600. Ids that differ only in case get a ``~<digest>`` suffix on case-insensitive
file systems, so their journals never mix.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import Any, Sequence

from .. import journal
from ..errors import RunLocked, StoreUnavailable
from ..ids import RUN_ID_PATTERN, is_legacy_readable
from ..legacy import is_legacy_dir, read_legacy_run
from .base import Lease, ObjectStore, Store, describe_holder, holder_info
from .files import complete_lines, fsync_dir, make_dirs, valid_length, write_all, write_file_atomic
from .local_views import RENDERER, is_stale, reconcile, views_lock

JOURNAL = "journal.jsonl"
LOCK = "lock"
OBJECTS = ".objects"
HOLDER_BYTES = 512


# ---- the object face ------------------------------------------------------------------------
class LocalDirectoryStore(ObjectStore):
    """Objects as files under a directory: temp file + fsync + rename/link + directory fsync."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.root = Path(path).absolute()

    def _path(self, key: str) -> Path:
        return self.root / self.check_key(key)

    def put(self, key: str, data: bytes) -> None:
        path = self._path(key)
        make_dirs(path.parent)
        write_file_atomic(path, bytes(data))

    def put_if_absent(self, key: str, data: bytes) -> bool:
        path = self._path(key)
        if path.exists():
            return False
        make_dirs(path.parent)
        return write_file_atomic(path, bytes(data), exclusive=True)

    def get(self, key: str) -> bytes:
        try:
            return self._path(key).read_bytes()
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            raise self._missing(key) from None

    def exists(self, key: str) -> bool:
        return self._path(key).is_file()

    def list(self, prefix: str = "") -> list[str]:
        if not self.root.is_dir():
            return []
        keys = []
        for folder, _dirs, files in os.walk(self.root):
            rel = Path(folder).relative_to(self.root).as_posix()
            for name in files:
                if name.startswith(".") and name.endswith(".tmp"):
                    continue
                key = name if rel == "." else f"{rel}/{name}"
                if key.startswith(prefix):
                    keys.append(key)
        return sorted(keys)

    def delete(self, key: str) -> bool:
        try:
            os.unlink(self._path(key))
        except FileNotFoundError:
            return False
        fsync_dir(self._path(key).parent)
        return True

    def __repr__(self) -> str:
        return f"LocalDirectoryStore({str(self.root)!r})"


# ---- the journal face -----------------------------------------------------------------------
class LocalLease(Lease):
    def __init__(self, store: "LocalStore", run_id: str, token: int, holder: dict, lock_fd: int, run_dir: Path) -> None:
        super().__init__(store, run_id, token, holder)
        self.lock_fd = lock_fd
        self.run_dir = run_dir
        self.journal_fd: int | None = None
        self.size = 0
        self.next_seq = 0
        self.snapshot: bytes | None = None  # the journal as acquire read it

    def _release(self) -> None:
        RENDERER.flush(self.run_dir)
        if self.journal_fd is not None:
            os.close(self.journal_fd)
            self.journal_fd = None
        try:
            fcntl.flock(self.lock_fd, fcntl.LOCK_UN)
        finally:
            os.close(self.lock_fd)


class LocalStore(Store):
    """Runs as directories under ``root`` (default ``./.caravanserai``)."""

    scheme = "file"

    def __init__(self, root: str | os.PathLike[str] = ".caravanserai", *, views: bool = True) -> None:
        self.root = Path(root).expanduser().absolute()
        self.url = self.root.as_uri()
        self.views = views
        self._dirs: dict[str, Path] = {}
        self._objects = LocalDirectoryStore(self.root / OBJECTS)

    @classmethod
    def from_url(cls, url: str) -> "LocalStore":
        if url.startswith("file://"):
            from urllib.parse import unquote, urlsplit

            parts = urlsplit(url)
            if parts.netloc not in ("", "localhost"):
                raise StoreUnavailable(f"file URL {url!r} names host {parts.netloc!r}; use file:///absolute/path or a plain path", url=url)
            return cls(unquote(parts.path))
        return cls(url)

    # -- directories
    def run_dir(self, run_id: str) -> Path:
        cached = self._dirs.get(run_id)
        if cached is not None:
            return cached
        plain = self.root / run_id
        chosen = plain
        try:
            if plain.exists() and run_id not in os.listdir(self.root):
                # A case-insensitive file system matched a directory of another id's case.
                chosen = self.root / f"{run_id}~{hashlib.sha256(run_id.encode()).hexdigest()[:8]}"
        except OSError as exc:
            raise self._unavailable(exc) from exc
        self._dirs[run_id] = chosen
        return chosen

    def _unavailable(self, exc: OSError) -> StoreUnavailable:
        return StoreUnavailable(
            f"cannot use the local store at {str(self.root)!r}: {exc.strerror or exc}; "
            "check the path and its permissions or set CARAVANSERAI_STORE",
            url=self.url, errno=exc.errno,
        )

    # -- journal face
    def load(self, run_id: str) -> list[str]:
        run_dir = self.run_dir(run_id)
        try:
            return complete_lines((run_dir / JOURNAL).read_bytes())
        except FileNotFoundError:
            pass
        except OSError as exc:
            raise self._unavailable(exc) from exc
        legacy = read_legacy_run(run_dir, run_id) if run_dir.is_dir() else []
        return journal.encode(legacy, journal.Tail())[0] if legacy else []

    def acquire(self, run_id: str) -> Lease:
        run_dir = self.run_dir(run_id)
        try:
            make_dirs(run_dir)
            lock_fd = os.open(run_dir / LOCK, os.O_RDWR | os.O_CREAT, 0o600)
        except OSError as exc:
            raise self._unavailable(exc) from exc
        try:
            fcntl.flock(lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read_holder(lock_fd)
            os.close(lock_fd)
            raise RunLocked(
                f"run {run_id!r} is being written by {describe_holder(holder)}; wait for it to finish or stop "
                "that process (a lock left by a dead process is taken over automatically)",
                run_id=run_id, holder=holder,
            ) from None
        try:
            previous = _read_holder(lock_fd) or {}
            holder = holder_info(int(previous.get("token", 0)) + 1)
            # One fixed-size write: a kill cannot leave the holder record empty.
            os.pwrite(lock_fd, json.dumps(holder).encode().ljust(HOLDER_BYTES), 0)
            lease = LocalLease(self, run_id, holder["token"], holder, lock_fd, run_dir)
            self._open_journal(lease)
        except BaseException:
            fcntl.flock(lock_fd, fcntl.LOCK_UN)
            os.close(lock_fd)
            raise
        return lease

    def _open_journal(self, lease: LocalLease) -> None:
        path = lease.run_dir / JOURNAL
        if not path.exists():
            legacy = read_legacy_run(lease.run_dir, lease.run_id)
            if legacy:
                lines = journal.encode(legacy, journal.Tail())[0]
                write_file_atomic(path, ("\n".join(lines) + "\n").encode())
        if not path.exists():
            return
        fd = os.open(path, os.O_RDWR | os.O_APPEND)
        data = os.pread(fd, os.fstat(fd).st_size, 0)
        good = valid_length(data)
        if good != len(data):  # repair a torn tail left by a crash before this writer starts
            os.ftruncate(fd, good)
            os.fsync(fd)
        lease.journal_fd = fd
        lease.size = good
        lease.next_seq = data[:good].count(b"\n")
        lease.snapshot = data[:good]

    def load_held(self, lease: Lease) -> list[str]:
        snapshot = getattr(lease, "snapshot", None)
        if snapshot is None:
            return self.load(lease.run_id)
        lease.snapshot = None  # only valid right after acquire
        return complete_lines(snapshot)

    def append(self, run_id: str, lines: Sequence[str], *, lease: Lease, seq: int, sync: bool = True) -> None:
        assert isinstance(lease, LocalLease) and lease.run_id == run_id
        lease.check()
        if seq != lease.next_seq:
            raise ValueError(f"append to run {run_id!r} at seq {seq}, but the journal's next seq is {lease.next_seq}")
        data = ("\n".join(lines) + "\n").encode("utf-8")
        try:
            if lease.journal_fd is None:
                lease.journal_fd = os.open(lease.run_dir / JOURNAL, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
                fsync_dir(lease.run_dir)
            try:
                write_all(lease.journal_fd, data)
                if sync:
                    os.fdatasync(lease.journal_fd)
            except OSError:
                os.ftruncate(lease.journal_fd, lease.size)  # nothing half-written
                raise
        except OSError as exc:
            if exc.errno in (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EIO):
                raise self._unavailable(exc) from exc
            raise
        lease.size += len(data)
        lease.next_seq += len(lines)

    def committed(self, run_id: str, events: Sequence[dict]) -> None:
        if self.views:
            RENDERER.submit(self.run_dir(run_id), events)

    def flush_views(self) -> None:
        """Wait until views of this process's appends are written (tests, before reading files)."""
        RENDERER.flush()

    def refresh_views(self, run_id: str, events: Sequence[dict] | None = None, *, writer: bool = False) -> None:
        """Complete stale views (after a kill) under ``views.lock``.

        A reader re-reads the journal under that lock; the writer (``writer=True``, holding the
        run's lease, so the journal cannot change) hands its events to the background renderer.
        """
        if not self.views:
            return
        run_dir = self.run_dir(run_id)
        if not (run_dir / JOURNAL).exists():
            return
        if events is None:
            events = journal.decode(run_id, self.load(run_id))[0]
        if not is_stale(run_dir, events):
            return
        if writer:
            RENDERER.submit(run_dir, reconcile_from=lambda: events)
            return
        try:
            with views_lock(run_dir):
                reconcile(run_dir, journal.decode(run_id, self.load(run_id))[0])
        except OSError:
            pass  # read-only media or permissions: the journal is still readable

    def list(self) -> list[str]:
        try:
            entries = sorted(os.listdir(self.root))
        except FileNotFoundError:
            return []
        except OSError as exc:
            raise self._unavailable(exc) from exc
        runs = []
        for name in entries:
            path = self.root / name
            if name.startswith(".") or not path.is_dir():
                continue
            if (path / JOURNAL).exists():
                runs.append(_journal_run_id(path) or name)
            elif is_legacy_dir(path) and is_legacy_readable(name):
                runs.append(name)
        return sorted(runs)

    def is_legacy_name(self, run_id: str) -> bool:
        """True for an existing directory 0.2.0 created under an id our pattern rejects."""
        return is_legacy_readable(run_id) and RUN_ID_PATTERN.fullmatch(run_id) is None and is_legacy_dir(self.root / run_id)

    def remove(self, run_id: str) -> bool:
        run_dir = self.run_dir(run_id)
        if not run_dir.is_dir():
            return False
        lock_fd = os.open(run_dir / LOCK, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            try:
                fcntl.flock(lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = _read_holder(lock_fd)
                raise RunLocked(
                    f"run {run_id!r} is being written by {describe_holder(holder)}; stop it before cleaning",
                    run_id=run_id, holder=holder,
                ) from None
            RENDERER.discard(run_dir)
            shutil.rmtree(run_dir)
            fsync_dir(self.root)
        finally:
            os.close(lock_fd)
        self._dirs.pop(run_id, None)
        return True

    def last_updated(self, run_id: str) -> float | None:
        run_dir = self.run_dir(run_id)
        for name in (JOURNAL, "latest"):
            try:
                return (run_dir / name).stat().st_mtime
            except FileNotFoundError:
                continue
        return None

    @property
    def objects(self) -> ObjectStore:
        return self._objects


def _read_holder(fd: int) -> dict[str, Any] | None:
    try:
        text = os.pread(fd, 4096, 0)
        value = json.loads(text) if text else None
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None


def _journal_run_id(run_dir: Path) -> str | None:
    try:
        with open(run_dir / JOURNAL, encoding="utf-8") as handle:
            first = json.loads(handle.readline())
    except (OSError, ValueError):
        return None
    return first.get("run_id") if isinstance(first, dict) else None


__all__ = ["LocalDirectoryStore", "LocalStore"]

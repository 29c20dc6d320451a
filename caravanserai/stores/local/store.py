"""The local directory store (default ``./.caravanserai``), readable by people and by 0.2.0.

Layout of a run directory ``<root>/<run_id>/``:

- ``journal.jsonl`` — the source of truth; appended with ``write`` + ``fdatasync``, the directory
  fsynced when the file is created; a failed append is truncated back (nothing half-written);
- ``lock`` — ``flock``-ed by the one live writer and holding its pid/host/since/token; the kernel
  drops the lock when that process dies, so a dead writer's lock is taken over safely. A writer
  clears its pid from the record before it unlocks, so ``RunLocked`` always names the live holder;
- ``waypoint-N.md``, ``state.json``, ``latest``, ``meta.json`` — views in 0.2.0's format, rendered
  from the journal off the checkpoint's critical path (each file replaced atomically). After a
  kill they can lag the journal, never lead it: views *ahead* of the journal mean the journal was
  emptied or cut short, and reading or opening the run raises ``JournalCorruptionError``.

A 0.2.0/0.1.x directory (views only, no journal) is read through ``caravanserai.legacy``; the
first write into it stores those events as the start of a new journal. Directories are 0o700 and
files 0o600. Ids that differ only in case get a ``~<digest>`` suffix on case-insensitive
file systems, so their journals never mix. Every ``OSError`` leaves as ``StoreFull`` (disk,
quota or file-size limit) or ``StoreUnavailable``, one line.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import shutil
import socket
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ... import journal
from ...errors import InvalidRunId, InvalidStoreUrl, JournalCorruptionError, RunLocked
from ...ids import is_legacy_readable, validate_run_id
from ..base import Lease, Objects, Store, describe_holder, holder_info, os_failure
from ..urls import split_url
from .files import close_owned, complete_lines, fsync_dir, make_dirs, open_owned, valid_length, write_all, write_file_atomic
from .legacy import WAYPOINT_FILE, is_legacy_dir, read_legacy_run
from .objects import LocalDirectoryStore, LocalObjects
from .views import RENDERER, VIEW_EVENTS, is_stale, reconcile, views_lock

JOURNAL = "journal.jsonl"
LOCK = "lock"
INDEX_FILE = "index.json"  # the run index's entry for this run (caravanserai.runs.index)
OBJECTS = ".objects"
HOLDER_BYTES = 512
HOLDER_WAIT = 2.0  # how long a contender re-reads a lock record that names no live holder yet


# ---- the journal face -----------------------------------------------------------------------
class LocalLease(Lease):
    def __init__(self, store: LocalStore, run_id: str, token: int, holder: dict, lock_fd: int, run_dir: Path) -> None:
        super().__init__(store, run_id, token, holder)
        self.lock_fd = lock_fd
        self.run_dir = run_dir
        self.journal_fd: int | None = None
        self.size = 0

    def renew(self) -> None:
        """A flock does not expire: renewing only checks the lease is still held (once per append)."""
        if self._released:
            self.check()

    def _release(self) -> None:
        try:
            RENDERER.flush(self.run_dir)
        finally:
            if self.journal_fd is not None:
                try:
                    close_owned(self.journal_fd)
                except OSError:
                    pass
                self.journal_fd = None
            _unlock(self.lock_fd, self.token)


class LocalStore(Store):
    """Runs as directories under ``root`` (default ``./.caravanserai``)."""

    scheme = "file"

    def __init__(self, root: str | os.PathLike[str] = ".caravanserai", *, views: bool = True) -> None:
        self.root = Path(root).expanduser().absolute()
        self.url = self.root.as_uri()
        self.views = views
        self._dirs: dict[str, Path] = {}
        self._read_marks: dict[str, tuple[int, int, int]] = {}  # run -> (lines read, bytes read, inode): load_since
        self._objects = LocalObjects(self.root / OBJECTS)

    @classmethod
    def from_url(cls, url: str) -> LocalStore:
        """A path, or ``file:///absolute/path`` (no host but localhost, no options)."""
        if url.startswith("file://"):
            from urllib.parse import unquote

            parts = split_url(url, "file:///absolute/path")
            if parts.netloc not in ("", "localhost"):
                raise InvalidStoreUrl(f"file URL {url!r} names host {parts.netloc!r}; use file:///absolute/path or a "
                                      "plain path", url=url)
            if parts.query or parts.fragment:
                raise InvalidStoreUrl(f"file URL {url!r} has options, but the local store takes none; use "
                                      "file:///absolute/path or a plain path", url=url)
            if not parts.path:
                raise InvalidStoreUrl(f"file URL {url!r} names no directory; use file:///absolute/path", url=url)
            return cls(unquote(parts.path))
        return cls(url)

    def _describe(self) -> str:
        return f"local store at {str(self.root)!r}"

    # -- directories
    def run_dir(self, run_id: str) -> Path:
        """The directory of ``run_id`` (a checked id, or an existing 0.2.0 name)."""
        cached = self._dirs.get(run_id)
        if cached is not None:
            return cached
        run_id = self._readable(run_id)
        plain = self.root / run_id
        chosen = plain
        with self._os_errors(f"finding run {run_id!r}"):
            if plain.exists() and run_id not in os.listdir(self.root):
                # A case-insensitive file system matched a directory of another id's case.
                chosen = self.root / f"{run_id}~{hashlib.sha256(run_id.encode()).hexdigest()[:8]}"
        self._dirs[run_id] = chosen
        return chosen

    def is_legacy_name(self, run_id: str) -> bool:
        """True for an existing directory 0.2.0 created under an id our rule rejects (read-only)."""
        if not is_legacy_readable(run_id) or run_id == OBJECTS:
            return False
        try:
            validate_run_id(run_id)
            return False  # a valid id is not a legacy name
        except InvalidRunId:
            pass
        try:
            return is_legacy_dir(self.root / run_id)
        except (OSError, ValueError):
            return False

    # -- journal face
    def _load(self, run_id: str) -> list[str]:
        run_dir = self.run_dir(run_id)
        try:
            shown = _views_shown(run_dir)  # views first: a writer appending meanwhile only adds to the journal
            data = (run_dir / JOURNAL).read_bytes()
        except FileNotFoundError:
            pass
        else:
            lines = complete_lines(data)
            _check_views(run_id, run_dir, lines, shown)
            return lines
        legacy = read_legacy_run(run_dir, run_id) if run_dir.is_dir() else []
        return journal.encode(legacy, journal.Tail())[0] if legacy else []

    def _load_since(self, run_id: str, seq: int) -> list[str]:
        """Read on from where the last call stopped (same file, same line number), else read it all."""
        path = self.run_dir(run_id) / JOURNAL
        known = self._read_marks.get(run_id)
        try:
            stat = os.stat(path)
        except FileNotFoundError:
            return self._load(run_id)[seq:]
        if known is None or known[0] != seq or known[2] != stat.st_ino or stat.st_size < known[1]:
            lines = self._load(run_id)
            self._read_marks[run_id] = (len(lines), sum(len(line.encode("utf-8")) + 1 for line in lines), stat.st_ino)
            return lines[seq:]
        with open(path, "rb") as handle:
            handle.seek(known[1])
            data = handle.read(stat.st_size - known[1])
        end = data.rfind(b"\n") + 1  # a torn last line waits for the next read
        lines = complete_lines(data[:end])
        self._read_marks[run_id] = (seq + len(lines), known[1] + end, stat.st_ino)
        return lines

    def _acquire(self, run_id: str) -> Lease:
        run_dir = self.run_dir(run_id)
        for _ in range(20):  # the run may be removed between our open and our flock: start again then
            make_dirs(run_dir)
            lock_fd = open_owned(run_dir / LOCK, os.O_RDWR | os.O_CREAT)
            try:
                _take_lock(run_id, lock_fd, "wait for it to finish or stop that process (a lock left by a dead "
                                            "process is taken over automatically)")
            except BaseException:
                close_owned(lock_fd)
                raise
            if _still_linked(lock_fd, run_dir / LOCK):
                break
            fcntl.flock(lock_fd, fcntl.LOCK_UN)
            close_owned(lock_fd)
        else:
            raise RunLocked(f"run {run_id!r} is being removed and created again by other processes; retry", run_id=run_id)
        token = 0
        try:
            previous = _read_holder(lock_fd) or {}
            token = int(previous.get("token", 0)) + 1
            holder = holder_info(token)
            _write_holder(lock_fd, holder)
            lease = LocalLease(self, run_id, token, holder, lock_fd, run_dir)
            self._open_journal(lease)
        except BaseException:
            _unlock(lock_fd, token)
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
            lease.snapshot = []
            return
        fd = open_owned(path, os.O_RDWR | os.O_APPEND)
        try:
            shown = _views_shown(lease.run_dir)
            data = _read_all(fd)
            lines = complete_lines(data)
            _check_views(lease.run_id, lease.run_dir, lines, shown)  # before any repair: nothing changed
            good = valid_length(data)
            if good != len(data):  # repair a torn tail left by a crash before this writer starts
                os.ftruncate(fd, good)
                os.fsync(fd)
        except BaseException:
            close_owned(fd)
            raise
        lease.journal_fd = fd
        lease.size = good
        lease.next_seq = data.count(b"\n", 0, good)
        lease.snapshot = lines

    def _append(self, run_id: str, lines: Sequence[str], *, lease: Lease, seq: int, sync: bool = True) -> None:
        assert isinstance(lease, LocalLease)  # Store.append checked it is this store's lease on this run
        data = ("\n".join(lines) + "\n").encode("utf-8")
        if lease.journal_fd is None:
            lease.journal_fd = open_owned(lease.run_dir / JOURNAL, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
            fsync_dir(lease.run_dir)
        try:
            written = os.write(lease.journal_fd, data)
            if written != len(data):  # a short write (a signal, a nearly full disk): write the rest
                write_all(lease.journal_fd, data[written:])
            if sync:
                os.fdatasync(lease.journal_fd)
        except OSError:
            try:
                os.ftruncate(lease.journal_fd, lease.size)  # nothing half-written
            except OSError:
                lease.release()  # cannot undo: stop this writer; the next one repairs the torn tail
            raise
        lease.size += len(data)

    def committed(self, run_id: str, events: Sequence[dict]) -> None:
        """``Store.committed`` for a run this store has already resolved (its writer's): no id re-check."""
        if run_id not in self._dirs:
            return super().committed(run_id, events)
        try:
            self._committed(run_id, events)
        except Exception:
            pass  # views are a convenience; the journal already holds the truth

    def _committed(self, run_id: str, events: Sequence[dict]) -> None:
        if self.views:
            for event in events:  # views show the run's start and its waypoints: journaled calls never wake the renderer
                if event["type"] in VIEW_EVENTS:
                    RENDERER.submit(self.run_dir(run_id), events)
                    return

    def flush_views(self) -> None:
        """Wait until views of this process's appends are written (tests, before reading files)."""
        RENDERER.flush()

    def _refresh_views(self, run_id: str, events: Sequence[dict] | None, *, writer: bool) -> None:
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
            events = journal.decode(run_id, self._load(run_id))[0]
        if not is_stale(run_dir, events):
            return
        if writer:
            RENDERER.submit(run_dir, reconcile_from=lambda: events)
            return
        try:
            with views_lock(run_dir):
                reconcile(run_dir, journal.decode(run_id, self._load(run_id))[0])
        except OSError:
            pass  # read-only media, permissions or a full disk: the journal is still readable

    def list(self) -> list[str]:
        return sorted(self._scan())

    def _scan(self) -> dict[str, tuple[Path, os.stat_result | None]]:
        """Run id -> (directory, the journal's stat or None for a 0.2.0 run), in one listing.

        The directories found are remembered, so reading each run afterwards never lists the
        store again (which made listing N runs cost N listings).
        """
        try:
            entries = list(os.scandir(self.root))
        except FileNotFoundError:
            return {}
        except OSError as exc:
            raise os_failure(exc, self._describe(), "listing runs") from exc
        runs: dict[str, tuple[Path, os.stat_result | None]] = {}
        known = self._dirs
        for entry in entries:
            name = entry.name
            try:
                if name.startswith(".") or not entry.is_dir():
                    continue
                try:
                    info: os.stat_result | None = os.stat(f"{entry.path}/{JOURNAL}")
                except FileNotFoundError:
                    info = None
                path = known.get(name) or self.root / name
                if info is not None:
                    run_id = name if "~" not in name else _journal_run_id(path) or name
                elif is_legacy_dir(path) and is_legacy_readable(name):
                    run_id = name
                else:
                    continue
            except OSError:
                continue  # an entry we cannot read is not a run we can show
            runs[run_id] = (path, info)
            if info is not None and run_id not in known:
                known[run_id] = path
        return runs

    # -- the run index: one entry per run, in its directory (removed with it)
    def index_get_many(self, run_ids: Sequence[str]) -> dict[str, bytes]:
        found = {}
        for run_id in run_ids:
            try:
                with open(f"{self._dirs.get(run_id) or self.run_dir(run_id)}/{INDEX_FILE}", "rb") as handle:
                    found[run_id] = handle.read()
            except OSError:
                continue  # none yet, or unreadable: the index recomputes it from the journal
        return found

    def index_put(self, run_id: str, data: bytes) -> None:
        """Replace the entry atomically, without fsync: it is a cache of the journal, and one lost in
        a crash is recomputed (its version no longer matches, or it is missing)."""
        run_dir = self.run_dir(run_id)
        if not (run_dir / JOURNAL).exists():
            return  # a 0.2.0 directory (views only): reading never writes into it; its entry is recomputed
        temp = run_dir / f".{INDEX_FILE}.{os.getpid()}.{threading.get_ident()}.tmp"
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        try:
            try:
                write_all(fd, data)
            finally:
                os.close(fd)
            os.replace(temp, run_dir / INDEX_FILE)
        except BaseException:
            temp.unlink(missing_ok=True)  # a full disk leaves no stray temp file behind
            raise

    def index_delete(self, run_id: str) -> None:
        try:
            os.unlink(self.run_dir(run_id) / INDEX_FILE)
        except FileNotFoundError:
            pass

    def _journal_versions(self, run_ids: Sequence[str] | None) -> dict[str, str]:
        # every run: one listing of the store; a few runs (a writer ending its attempt): only their journals
        found = self._scan() if run_ids is None else {r: self._journal_stat(r) for r in run_ids}
        versions = {}
        for run_id, (run_dir, info) in found.items():
            if info is None:  # a 0.2.0 run (or none): its files change rarely; read it
                versions.update(super()._journal_versions([run_id]))
            elif info.st_size or any(_views_shown(run_dir)):
                # size for appends, mtime for a journal rewritten in place (which verify would call damaged);
                # an emptied journal beside waypoint views is a damaged run, listed as such, never hidden
                versions[run_id] = f"{info.st_size}:{info.st_ino}:{info.st_mtime_ns}"
        return versions

    def _journal_stat(self, run_id: str) -> tuple[Path, os.stat_result | None]:
        run_dir = self.run_dir(run_id)
        try:
            return run_dir, os.stat(run_dir / JOURNAL)
        except FileNotFoundError:
            return run_dir, None

    def _remove(self, run_id: str) -> bool:
        run_dir = self.run_dir(run_id)
        if not run_dir.is_dir():
            return False
        lock_fd = open_owned(run_dir / LOCK, os.O_RDWR | os.O_CREAT)
        try:
            _take_lock(run_id, lock_fd, "stop it before cleaning")
            previous = _read_holder(lock_fd) or {}
            _write_holder(lock_fd, {**holder_info(int(previous.get("token", 0))), "removing": True})
            RENDERER.discard(run_dir)
            shutil.rmtree(run_dir)
            fsync_dir(self.root)
        finally:
            close_owned(lock_fd)
        self._dirs.pop(run_id, None)
        return True

    def _last_updated(self, run_id: str) -> float | None:
        run_dir = self.run_dir(run_id)
        for name in (JOURNAL, "latest"):
            try:
                return (run_dir / name).stat().st_mtime
            except FileNotFoundError:
                continue
        return None

    def _torn_tail(self, run_id: str) -> int:
        try:
            data = (self.run_dir(run_id) / JOURNAL).read_bytes()
        except FileNotFoundError:
            return 0
        return len(data) - valid_length(data)

    @property
    def objects(self) -> Objects:
        return self._objects


# ---- the lock record --------------------------------------------------------------------------
def _read_holder(fd: int) -> dict[str, Any] | None:
    try:
        text = os.pread(fd, 4096, 0).decode("utf-8").strip()
        value = json.JSONDecoder().raw_decode(text)[0] if text else None
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None


def _write_holder(fd: int, record: dict[str, Any]) -> None:
    # One fixed-size pwrite: a reader never sees a half record, and a shorter record overwrites a longer one.
    os.pwrite(fd, json.dumps(record).encode().ljust(HOLDER_BYTES), 0)


def _unlock(lock_fd: int, token: int) -> None:
    """Clear the holder's pid from the record (keeping the token), then drop the flock."""
    try:
        _write_holder(lock_fd, {"token": token})
    except OSError:
        pass  # a contender then sees a record whose pid is no longer locking and waits briefly
    try:
        fcntl.flock(lock_fd, fcntl.LOCK_UN)
    finally:
        close_owned(lock_fd)


def _names_live_holder(holder: dict[str, Any] | None) -> bool:
    """True if ``holder`` names a process that is running (or on another host: cannot tell, trust it)."""
    if not holder or not isinstance(holder.get("pid"), int):
        return False
    if holder.get("host") != socket.gethostname():
        return True
    try:
        os.kill(holder["pid"], 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # exists, owned by another user
    return True


def _take_lock(run_id: str, lock_fd: int, remedy: str) -> None:
    """``flock`` the run, or raise RunLocked naming the live holder.

    Between another writer's flock and its holder record there is a short window; a contender
    that finds no live holder named re-reads the record (and retries the lock) for a bounded time.
    """
    deadline = None
    while True:
        try:
            fcntl.flock(lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            pass
        holder = _read_holder(lock_fd)
        live = _names_live_holder(holder)
        now = time.monotonic()
        deadline = deadline or now + HOLDER_WAIT
        if live or now >= deadline:
            named = holder if live else None
            raise RunLocked(f"run {run_id!r} is being written by {describe_holder(named)}; {remedy}",
                            run_id=run_id, holder=named)
        time.sleep(0.005)


def _still_linked(fd: int, path: Path) -> bool:
    """True if ``fd`` is still the file at ``path`` (a concurrent remove unlinks it)."""
    try:
        mine, there = os.fstat(fd), os.stat(path)
    except FileNotFoundError:
        return False
    return (mine.st_dev, mine.st_ino) == (there.st_dev, there.st_ino)


def _read_all(fd: int) -> bytes:
    size = os.fstat(fd).st_size
    chunks, offset = [], 0
    while offset < size:
        chunk = os.pread(fd, size - offset, offset)
        if not chunk:
            break
        chunks.append(chunk)
        offset += len(chunk)
    return b"".join(chunks)


# ---- views ahead of the journal: an emptied or shrunk journal ---------------------------------
_HEAD = re.compile(r'\{"v":\d+,"seq":\d+,"at":"[^"]*","type":"([^"]*)"(?:,"n":(\d+)[,}])?')


def _views_shown(run_dir: Path) -> tuple[list[int], int]:
    """The waypoint numbers of the ``waypoint-N.md`` views and the number in ``latest`` (0 if none)."""
    try:
        names = os.listdir(run_dir)
    except (FileNotFoundError, NotADirectoryError):
        return [], 0
    numbers = [int(m.group(1)) for m in map(WAYPOINT_FILE.fullmatch, names) if m]
    try:
        latest = int((run_dir / "latest").read_text(encoding="utf-8").strip()) if "latest" in names else 0
    except (OSError, ValueError):
        latest = 0
    return numbers, latest


def _highest_waypoint(lines: Sequence[str]) -> tuple[int, set[int]]:
    """The journal's highest waypoint ``n`` (cheap: a prefix match per line) and the 0.2.0 files
    an import left out (``skipped_waypoints`` of an imported ``run_started``)."""
    highest, skipped = 0, set()
    for index, line in enumerate(lines):
        match = _HEAD.match(line)
        if match is not None and match.group(1) != "waypoint" and not (index == 0 and '"skipped_waypoints"' in line):
            continue
        if match is not None and match.group(2) is not None:
            highest = max(highest, int(match.group(2)))
            continue
        if '"waypoint"' not in line and '"skipped_waypoints"' not in line:
            continue
        try:  # an unexpected shape: decode this one line
            event = json.loads(line)
        except ValueError:
            continue  # damage: events() names it
        if not isinstance(event, dict):
            continue
        if event.get("type") == "waypoint" and isinstance(event.get("n"), int):
            highest = max(highest, event["n"])
        if index == 0 and isinstance(event.get("skipped_waypoints"), list):
            skipped = {n for n in event["skipped_waypoints"] if isinstance(n, int)}
    return highest, skipped


def _check_views(run_id: str, run_dir: Path, lines: Sequence[str], shown: tuple[list[int], int]) -> None:
    """Raise JournalCorruptionError if the views show a waypoint the journal does not hold.

    Views are rendered after an append is durable, so they may lag the journal but never lead it.
    """
    numbers, latest = shown
    if not numbers and not latest:
        return
    highest, skipped = _highest_waypoint(lines)
    ahead = [(n, f"waypoint-{n}.md") for n in numbers if n > highest and n not in skipped]
    if latest > highest:
        ahead.append((latest, f"latest = {latest}"))
    if not ahead:
        return
    n, view = max(ahead)
    holds = f"waypoints up to {highest}" if highest else "no waypoint"
    path = run_dir / JOURNAL
    raise JournalCorruptionError(
        f"run {run_id!r}: {str(path)!r} holds {holds} but the views show waypoint {n} ({view}): the journal was emptied or cut "
        "short; restore journal.jsonl from a backup; nothing was changed",
        run_id=run_id, path=str(path), journal_waypoint=highest, views_waypoint=n,
    )


def _journal_run_id(run_dir: Path) -> str | None:
    """The run id the journal's first event names, if it is a valid one (a ``~digest`` directory's id)."""
    try:
        with open(run_dir / JOURNAL, encoding="utf-8") as handle:
            first = json.loads(handle.readline())
        return validate_run_id(first.get("run_id"))
    except (OSError, ValueError, AttributeError):  # InvalidRunId is a ValueError
        return None


__all__ = ["LocalDirectoryStore", "LocalObjects", "LocalStore"]

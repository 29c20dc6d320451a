"""Durable file primitives for the local store: fsync'd atomic writes and journal-tail parsing."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

_OWNED: set[int] = set()  # lock and journal descriptors open now, which a forked child closes (owned_fds_closed_in_child)


def open_owned(path: Path, flags: int, mode: int = 0o600) -> int:
    """``os.open`` (close-on-exec) of a file whose descriptor carries a lock or a writer's journal: a process
    forked while it is open closes its copy, so a child never keeps a run locked nor writes to it."""
    fd = os.open(path, flags | os.O_CLOEXEC, mode)
    _OWNED.add(fd)
    return fd


def close_owned(fd: int) -> None:
    """Close a descriptor ``open_owned`` opened (closing drops its flock)."""
    _OWNED.discard(fd)
    os.close(fd)


def owned_fds_closed_in_child() -> None:
    """In a forked child: close the copies of every owned descriptor, never unlocking them (a flock belongs
    to the open file the parent shares: LOCK_UN would drop the parent's lock). A fork in the few
    bytecodes between an ``os.open`` and its registration is not covered."""
    for fd in _OWNED:
        try:
            os.close(fd)
        except OSError:
            pass
    _OWNED.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=owned_fds_closed_in_child)


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def make_dirs(path: Path) -> None:
    """Create ``path`` and missing parents with mode 0o700, fsyncing each new entry's parent."""
    missing = []
    probe = path
    while not probe.exists():
        missing.append(probe)
        probe = probe.parent
    for directory in reversed(missing):
        try:
            os.mkdir(directory, 0o700)
        except FileExistsError:
            continue
        fsync_dir(directory.parent)


def write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def write_file_atomic(path: Path, data: bytes, *, durable: bool = True, exclusive: bool = False) -> bool:
    """Write via a unique temp file then rename (or link, if ``exclusive``): readers never see a part.

    Returns False when ``exclusive`` and the file already existed (nothing changed).
    """
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:12]}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        try:
            write_all(fd, data)
            if durable:
                os.fsync(fd)
        finally:
            os.close(fd)
        if exclusive:
            try:
                os.link(tmp, path)
            except FileExistsError:
                return False
        else:
            os.replace(tmp, path)
    finally:
        if exclusive or tmp.exists():
            try:
                os.unlink(tmp)
            except FileNotFoundError:
                pass
    if durable:
        fsync_dir(path.parent)
    return True


def complete_lines(data: bytes) -> list[str]:
    """Lines ending in a newline; a torn last line (no newline, or NUL fill after a crash) is left out."""
    body = _body_end(data)
    if not body:
        return []
    return str(memoryview(data)[:body], "utf-8", "replace").split("\n")  # no copy of a long journal first


def valid_length(data: bytes) -> int:
    """The bytes of ``data`` that hold its complete lines (a torn tail, NULs included, excluded)."""
    body = _body_end(data)
    return body + 1 if body else 0


def _body_end(data: bytes) -> int:
    """Where the complete lines' text ends (their last newline excluded): the torn tail after the last
    newline, and newlines and NUL fill before it, stripped from the end without copying ``data``."""
    end = data.rfind(b"\n") + 1
    while end and data[end - 1] in (0, 10):  # b"\x00", b"\n"
        end -= 1
    return end

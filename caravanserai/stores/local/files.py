"""Durable file primitives for the local store: fsync'd atomic writes and journal-tail parsing."""

from __future__ import annotations

import os
import uuid
from pathlib import Path


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
    end = data.rfind(b"\n") + 1
    body = data[:end].rstrip(b"\x00\n")
    if not body:
        return []
    return body.decode("utf-8", errors="replace").split("\n")


def valid_length(data: bytes) -> int:
    body = data[: data.rfind(b"\n") + 1]
    stripped = body.rstrip(b"\x00\n")
    return len(stripped) + 1 if stripped else 0

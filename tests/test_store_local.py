"""The local directory store: conformance suite plus what only a file store has."""

from __future__ import annotations

import json
import os
import stat
import tempfile
from pathlib import Path

import pytest

from caravanserai import JournalCorruptionError, journal
from caravanserai.stores import LocalDirectoryStore, LocalStore
from caravanserai.testing import StoreConformance, journal_machine, make_lines


class TestLocalStore(StoreConformance):
    @pytest.fixture
    def store(self, tmp_path):
        yield LocalStore(tmp_path / ".caravanserai")

    @pytest.fixture
    def store_url(self, tmp_path):
        return str(tmp_path / "by-url")


TestLocalJournalMachine = journal_machine(lambda: LocalStore(tempfile.mkdtemp() + "/.caravanserai")).TestCase


def _write(store: LocalStore, run_id: str, count: int) -> list[str]:
    lines, _ = make_lines(run_id, count)
    with store.acquire(run_id) as lease:
        store.append(run_id, lines, lease=lease, seq=0)
    return lines


def test_modes_are_private(tmp_path):
    store = LocalStore(tmp_path / "s")
    _write(store, "r1", 2)
    store.objects.put("k/x", b"1")
    for path in [tmp_path / "s", tmp_path / "s" / "r1", tmp_path / "s" / ".objects" / "k"]:
        assert stat.S_IMODE(path.stat().st_mode) == 0o700, path
    for path in [tmp_path / "s" / "r1" / "journal.jsonl", tmp_path / "s" / "r1" / "lock",
                 tmp_path / "s" / ".objects" / "k" / "x"]:
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path


def test_torn_last_line_is_ignored_then_repaired(tmp_path):
    store = LocalStore(tmp_path / "s")
    lines = _write(store, "r", 3)
    path = tmp_path / "s" / "r" / "journal.jsonl"
    with open(path, "ab") as f:
        f.write(b'{"v":1,"seq":3,"at":"2026-')  # a crash mid-append
    assert store.load("r") == lines
    more, _ = make_lines("r", 1, journal.decode("r", lines)[1])
    with store.acquire("r") as lease:
        store.append("r", more, lease=lease, seq=3)
    assert path.read_bytes().decode().splitlines() == lines + more
    assert [e["seq"] for e in store.events("r")] == [0, 1, 2, 3]


def test_nul_filled_tail_counts_as_torn(tmp_path):
    store = LocalStore(tmp_path / "s")
    lines = _write(store, "r", 2)
    with open(tmp_path / "s" / "r" / "journal.jsonl", "ab") as f:
        f.write(b"\x00" * 64 + b"\n")
    assert store.load("r") == lines


def test_damage_before_the_end_raises_naming_the_line(tmp_path):
    store = LocalStore(tmp_path / "s")
    _write(store, "r", 4)
    path = tmp_path / "s" / "r" / "journal.jsonl"
    text = path.read_text().splitlines()
    text[1] = text[1][:20] + "garbage"
    path.write_text("\n".join(text) + "\n")
    with pytest.raises(JournalCorruptionError) as info:
        store.events("r")
    assert info.value.line == 2 and info.value.run_id == "r"
    assert "backup" in str(info.value)


def test_dropped_line_is_detected(tmp_path):
    store = LocalStore(tmp_path / "s")
    _write(store, "r", 4)
    path = tmp_path / "s" / "r" / "journal.jsonl"
    text = path.read_text().splitlines()
    del text[2]
    path.write_text("\n".join(text) + "\n")
    with pytest.raises(JournalCorruptionError, match="seq"):
        store.events("r")


def test_foreign_and_future_journals_are_refused(tmp_path):
    store = LocalStore(tmp_path / "s")
    run_dir = tmp_path / "s" / "r"
    run_dir.mkdir(parents=True)
    (run_dir / "journal.jsonl").write_text('{"hello": "world"}\n')
    with pytest.raises(JournalCorruptionError, match="not a caravanserai event"):
        store.events("r")
    (run_dir / "journal.jsonl").write_text(json.dumps({"v": 99, "seq": 0, "at": "x", "type": "t"}) + "\n")
    with pytest.raises(JournalCorruptionError, match="upgrade caravanserai"):
        store.events("r")


def test_failed_append_leaves_nothing_half_written(tmp_path, monkeypatch):
    store = LocalStore(tmp_path / "s")
    lines = _write(store, "r", 2)
    lease = store.acquire("r")
    real_write = os.write
    calls = {"n": 0}

    def short_then_fail(fd, data):
        calls["n"] += 1
        if calls["n"] == 1:
            return real_write(fd, bytes(data)[:10])
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "write", short_then_fail)
    more, _ = make_lines("r", 1, journal.decode("r", lines)[1])
    from caravanserai import StoreUnavailable

    with pytest.raises(StoreUnavailable, match="No space left"):
        store.append("r", more, lease=lease, seq=2)
    monkeypatch.setattr(os, "write", real_write)
    lease.release()
    assert store.load("r") == lines
    assert (tmp_path / "s" / "r" / "journal.jsonl").read_bytes().endswith(b"\n")


def test_unreachable_store_is_a_clear_error(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    store = LocalStore(blocker / "store")
    from caravanserai import StoreUnavailable

    with pytest.raises(StoreUnavailable, match="cannot use the local store"):
        store.acquire("r")


def test_object_store_standalone_is_atomic_and_skips_temp_files(tmp_path):
    objects = LocalDirectoryStore(tmp_path / "ckpt")
    objects.put("ticket-42/step-2", b"blob")
    (tmp_path / "ckpt" / "ticket-42" / ".step-3.abc.tmp").write_bytes(b"partial")
    assert objects.list() == ["ticket-42/step-2"]
    assert objects.get("ticket-42/step-2") == b"blob"


def test_list_skips_stray_files_and_empty_dirs(tmp_path):
    root = tmp_path / "s"
    store = LocalStore(root)
    _write(store, "real", 1)
    (root / "README").write_text("hello")
    (root / "empty").mkdir()
    assert store.list() == ["real"]


def test_case_only_collision_uses_a_separate_directory(tmp_path, monkeypatch):
    store = LocalStore(tmp_path / "s")
    _write(store, "Run", 1)
    real_listdir = os.listdir
    # Simulate a case-insensitive file system: "run" resolves to the existing "Run" directory.
    monkeypatch.setattr(Path, "exists",
                        lambda self: Path.is_dir(self.with_name("Run")) if self.name == "run" else os.path.exists(self))
    monkeypatch.setattr(os, "listdir", lambda p: real_listdir(p))
    other = LocalStore(tmp_path / "s")
    assert other.run_dir("run").name.startswith("run~")
    assert other.run_dir("Run").name == "Run"

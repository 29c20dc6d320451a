"""The run index (``caravanserai.runs.index``): one summary per run kept in the store, rebuilt from
the journals when missing or stale, checked by ``caravanserai verify``; on every store backend."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import pytest

import caravanserai
from caravanserai import open_store
from caravanserai.cli import main as cli_main
from caravanserai.runs.index import check_index, list_runs
from caravanserai.runs.view import inspect_run

REPO = Path(__file__).resolve().parents[1]


def _make_runs(store, names: list[str], waypoints: int = 2) -> None:
    for name in names:
        with caravanserai.durable(name, store=store) as run:
            for i in range(waypoints):
                run.checkpoint({"i": i}, f"step {i}")


def _expected(store, run_id: str) -> dict:
    view = inspect_run(run_id, store)
    summary = view.as_summary()
    summary.pop("latest")
    return json.loads(json.dumps(summary, default=str))


def _summaries(store) -> dict[str, dict]:
    return {e.run_id: json.loads(json.dumps(e.summary, default=str)) for e in list_runs(store)}


@pytest.fixture(params=["local", "memory", "sqlite", "postgres", "s3"])
def any_store(request, tmp_path: Path):
    kind = request.param
    if kind == "local":
        store = open_store(str(tmp_path / "store"))
    elif kind == "memory":
        store = open_store(f"memory://index-{uuid.uuid4().hex[:8]}")
    elif kind == "sqlite":
        store = open_store(f"sqlite:///{tmp_path / 'runs.db'}")
    elif kind == "postgres":
        pg = request.getfixturevalue("pg")
        store = open_store(f"{pg.dsn}?table=idx_{uuid.uuid4().hex[:8]}&create_schema=1")
    else:
        s3 = request.getfixturevalue("s3")
        bucket = f"idx-{uuid.uuid4().hex[:8]}"
        s3.create_bucket(bucket)
        store = open_store(f"s3://{bucket}/runs?endpoint={s3.endpoint}&region=us-east-1&access_key_id=testing"
                           "&secret_access_key=testing&allow_http=true")
    yield store
    store.close()


def test_index_lists_what_the_journals_say_and_follows_changes(any_store) -> None:
    store = any_store
    _make_runs(store, ["alpha", "beta", "gamma"])
    assert _summaries(store) == {r: _expected(store, r) for r in ("alpha", "beta", "gamma")}
    # the writers left an entry per run; each one is current
    entries = store.index_get_many(["alpha", "beta", "gamma"])
    assert sorted(entries) == ["alpha", "beta", "gamma"]
    assert check_index(store) == []

    # a run that changes after its entry was written is read again
    with caravanserai.durable("beta", store=store) as run:
        run.checkpoint({"i": 99}, "one more")
    listed = _summaries(store)
    assert listed["beta"]["waypoints"] == 3 and listed["beta"]["attempts"] == 2
    assert listed["beta"] == _expected(store, "beta")

    # a removed run leaves no entry behind
    assert store.remove("alpha")
    assert set(_summaries(store)) == {"beta", "gamma"}
    assert store.index_get_many(["alpha"]) == {}


def test_fresh_index_is_read_without_the_journals(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = open_store(str(tmp_path / "store"))
    _make_runs(store, [f"run-{i}" for i in range(5)])
    first = _summaries(store)

    def no_journal_reads(run_id: str) -> list[str]:
        raise AssertionError(f"the journal of {run_id} was read although its index entry is current")

    monkeypatch.setattr(store, "_load", no_journal_reads)
    assert _summaries(store) == first


def test_malformed_or_lying_entries(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    store = open_store(str(tmp_path / "store"))
    _make_runs(store, ["good", "bad"])
    # garbage in an entry: recomputed from the journal, never an error
    store.index_put("bad", b"\xff{not json")
    assert _summaries(store)["bad"] == _expected(store, "bad")
    assert check_index(store) == []

    # an entry that claims to be current but disagrees with its journal: verify names it
    raw = json.loads(store.index_get_many(["good"])["good"])
    raw["summary"]["status"] = "failed"
    store.index_put("good", json.dumps(raw).encode())
    problems = check_index(store)
    assert problems == ["good: the index entry's summary differs from the journal"]
    assert cli_main(["--store", str(tmp_path / "store"), "verify"]) == 1
    out = capsys.readouterr().out
    assert "index\tMISMATCH\tgood: the index entry's summary differs from the journal" in out

    # an entry naming another run is ignored (never shown under this id)
    raw["run_id"] = "other"
    store.index_put("good", json.dumps(raw).encode())
    assert _summaries(store)["good"] == _expected(store, "good")


def test_cli_list_json_matches_each_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = tmp_path / "store"
    store = open_store(str(root))
    _make_runs(store, ["one", "two"], waypoints=3)
    assert cli_main(["--store", str(root), "list", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["run_id"] for r in rows] == ["one", "two"]
    for row in rows:
        age = row.pop("age_seconds")
        assert isinstance(age, float) and age >= 0
        assert row == _expected(store, row["run_id"])


_KILLED_WRITER = textwrap.dedent("""
    import sys, caravanserai
    store = caravanserai.open_store(sys.argv[1])
    with caravanserai.durable("victim", store=store) as run:
        for i in range(100000):
            run.checkpoint({"i": i}, f"step {i}")
            if i == 20:
                print("ready", flush=True)
""")


def test_index_repaired_after_a_killed_writer_matches_the_journal(tmp_path: Path) -> None:
    root = tmp_path / "store"
    store = open_store(str(root))
    _make_runs(store, ["victim"], waypoints=1)  # an entry exists, then the next attempt is killed mid-run
    before = _summaries(store)["victim"]
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.Popen([sys.executable, "-c", _KILLED_WRITER, str(root)], stdout=subprocess.PIPE, env=env)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == b"ready"
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    after = _summaries(store)["victim"]
    assert after == _expected(store, "victim")
    assert after["waypoints"] > before["waypoints"] and after["attempts"] == before["attempts"] + 1
    assert check_index(store) == []
    assert json.loads(store.index_get_many(["victim"])["victim"])["summary"]["waypoints"] == after["waypoints"]



def test_a_resume_decodes_its_journal_once(any_store, monkeypatch: pytest.MonkeyPatch) -> None:
    """Opening the run decodes its journal; the index refresh when the attempt ends builds its entry
    from the events the writer holds, so a resume reads and decodes the journal exactly once."""
    from caravanserai import journal
    from caravanserai.runs.index import compute_entry

    with pytest.raises(KeyboardInterrupt):  # attempt 1: two waypoints, then interrupted (the run stays pending)
        with caravanserai.durable("resumed", store=any_store) as run:
            run.checkpoint({"i": 0}, "step 0")
            run.checkpoint({"i": 1}, "step 1")
            raise KeyboardInterrupt
    decodes: list[str] = []
    real = journal.decode

    def counting(run_id, lines, **kw):
        decodes.append(run_id)
        return real(run_id, lines, **kw)

    monkeypatch.setattr(journal, "decode", counting)
    with caravanserai.durable("resumed", store=any_store) as run:  # the resume: identity check, replay, 2 more
        assert run.state == {"i": 1}
        run.checkpoint({"i": 2}, "step 2")
        run.checkpoint({"i": 3}, "step 3")
    assert decodes == ["resumed"]
    monkeypatch.setattr(journal, "decode", real)
    version = any_store.journal_versions(["resumed"])["resumed"]
    entry = list_runs(any_store)[0]
    assert entry["version"] == version  # the entry written at the attempt's end is current...
    assert json.loads(json.dumps(entry, default=str)) == json.loads(json.dumps(compute_entry("resumed", any_store, version),
                                                                               default=str))  # ...and the journal's

"""The 0.2.0 API and durable(): behaviour, views, bad input that writes nothing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import caravanserai
from caravanserai import (
    InvalidRunId,
    RunNotFound,
    SerializationError,
    checkpoint,
    clean,
    durable,
    history,
    last_updated,
    load_command,
    load_latest,
    open_store,
    resumable,
)
from caravanserai.runs import read_events

BAD_IDS = ["../x", "/abs", "", "a/b", "a\nb", "x" * 129, ".hidden", "-dash", "a b", "ünï", "a\\b", None, 123, b"x"]


def _store_dir(project: Path) -> Path:
    return project / ".caravanserai"


def test_checkpoint_then_load_latest(project):
    assert checkpoint("r", {"step": 1}, "first") == 1
    assert checkpoint("r", {"step": 2}, "  second\n\nwith a paragraph  ") == 2
    assert load_latest("r") == ({"step": 2}, "  second\n\nwith a paragraph  ", 2)
    assert [w.n for w in history("r")] == [1, 2]
    assert load_command("r")[1:] == __import__("sys").argv
    assert abs(last_updated("r") - __import__("time").time()) < 60


def test_state_and_note_are_one_journal_line(project):
    checkpoint("r", {"step": 7}, "seven")
    waypoint = [e for e in read_events("r") if e["type"] == "waypoint"][0]
    assert waypoint["state"] == {"step": 7} and waypoint["note"] == "seven" and waypoint["n"] == 1
    assert {"v", "seq", "at", "type"} <= set(waypoint)


def test_views_in_020_format(project):
    checkpoint("r", {"step": 5, "name": "ü"}, "finished step 5, next is step 6")
    open_store().flush_views()
    run_dir = _store_dir(project) / "r"
    assert (run_dir / "latest").read_text() == "1"
    assert (run_dir / "state.json").read_text() == json.dumps({"step": 5, "name": "ü"}, indent=2)
    header, body = (run_dir / "waypoint-1.md").read_text().split("\n\n", 1)
    assert header.startswith("# Waypoint 1 - ") and header.endswith("+00:00")
    assert body == "finished step 5, next is step 6\n"
    assert json.loads((run_dir / "meta.json").read_text())["command"][1:] == __import__("sys").argv


@pytest.mark.parametrize("bad", BAD_IDS, ids=repr)
def test_invalid_run_ids_write_nothing(project, bad):
    with pytest.raises(InvalidRunId) as info:
        checkpoint(bad, {"x": 1}, "n")
    assert info.value.code == "invalid_run_id"
    assert "use 1-128 characters" in str(info.value)
    with pytest.raises(InvalidRunId):
        caravanserai.resumable_iterate([1, 2], bad)
    with pytest.raises(InvalidRunId):
        with durable(bad):
            pass
    assert not _store_dir(project).exists()


@pytest.mark.parametrize(
    "state, path",
    [
        ({"s": {1, 2}}, "state['s']"),
        ({"b": b"bytes"}, "state['b']"),
        ({"o": object()}, "state['o']"),
        ({"nan": float("nan")}, "state['nan']"),
        ({"inf": [1.0, float("inf")]}, "state['inf'][1]"),
        ({1: "int key"}, "state[1]"),
        ({"deep": {"x": [{"when": __import__("datetime").datetime.now()}]}}, "state['deep']['x'][0]['when']"),
    ],
    ids=["set", "bytes", "object", "nan", "inf", "int-key", "datetime"],
)
def test_unserialisable_state_writes_nothing(project, state, path):
    with pytest.raises(SerializationError) as info:
        checkpoint("r", state, "note")
    assert info.value.path == path
    assert "nothing was written" in str(info.value)
    assert not _store_dir(project).exists()


def test_circular_state_is_a_serialization_error(project):
    loop: dict = {}
    loop["self"] = loop
    with pytest.raises(SerializationError, match="circular"):
        checkpoint("r", loop, "note")
    assert not _store_dir(project).exists()


def test_failed_checkpoint_leaves_the_run_unchanged(project):
    checkpoint("r", {"step": 1}, "ok")
    with pytest.raises(SerializationError):
        checkpoint("r", {"step": {2, 3}}, "bad")
    assert checkpoint("r", {"step": 2}, "ok again") == 2
    assert [w.n for w in history("r")] == [1, 2]


def test_tuples_become_lists_and_any_json_state_is_fine(project):
    checkpoint("r", {"t": (1, 2)}, "t")
    assert load_latest("r")[0] == {"t": [1, 2]}
    checkpoint("s", [1, "two", None], 42)
    assert load_latest("s") == ([1, "two", None], "42", 1)


def test_note_is_str_of_anything_like_020(project):
    checkpoint("r", {}, None)
    assert load_latest("r")[1] == "None"


def test_resumable_replaces_state_and_completes(project):
    calls = []

    @resumable
    def task(run_id, state, extra=0):
        calls.append(dict(state))
        step = state.get("step", 0)
        while step < 3:
            step += 1
            checkpoint(run_id, {"step": step}, f"step {step}")
        return step + extra

    assert task("r", {"step": 0}, extra=10) == 13
    assert task("r", {"step": 0}) == 3  # resumes from the saved state: no steps run
    assert calls == [{"step": 0}, {"step": 3}]
    types = [e["type"] for e in read_events("r")]
    assert types.count("run_completed") == 1 and types.count("attempt") == 0  # re-entered completed: nothing recorded
    assert task.__name__ == "task"


def test_resumable_records_a_failure_and_resumes_after_it(project):
    @resumable
    def task(run_id, state):
        step = state.get("step", 0) + 1
        checkpoint(run_id, {"step": step}, f"step {step}")
        if step == 1:
            raise RuntimeError("boom")
        return step

    with pytest.raises(RuntimeError):
        task("r", {})
    assert [e["type"] for e in read_events("r")][-1] == "run_failed"
    assert task("r", {}) == 2


def test_durable_context_manager(project):
    with durable("ctx") as run:
        assert caravanserai.current_run() is run
        assert run.state is None and run.attempt == 1
        assert run.checkpoint({"a": 1}, "one") == 1
        assert checkpoint("ctx", {"a": 2}, "two") == 2  # same writer, same numbering
        assert run.state == {"a": 2} and run.latest.note == "two"
        assert [w.n for w in run.waypoints] == [1, 2]
    assert caravanserai.current_run() is None
    events = read_events("ctx")
    assert [e["type"] for e in events] == ["run_started", "waypoint", "waypoint", "run_completed"]
    with durable("ctx") as again:
        assert again.attempt == 2 and again.state == {"a": 2} and again.completed


def test_durable_keyboard_interrupt_leaves_run_pending(project):
    with pytest.raises(KeyboardInterrupt):
        with durable("ctx") as run:
            run.checkpoint({"i": 1}, "one")
            raise KeyboardInterrupt
    assert [e["type"] for e in read_events("ctx")] == ["run_started", "waypoint", "interrupted"]
    assert caravanserai.runs.view.inspect_run("ctx").attempts[0].end == "interrupted"


def test_clean(project):
    checkpoint("r", {"a": 1}, "n")
    assert clean("r") is True
    assert clean("r") is False
    assert load_latest("r") is None
    assert checkpoint("r", {"a": 2}, "fresh") == 1


def test_load_latest_of_unknown_run_is_none(project):
    assert load_latest("ghost") is None
    assert load_command("ghost") is None
    assert last_updated("ghost") is None


def test_store_argument_and_environment(project, monkeypatch, tmp_path):
    checkpoint("r", {"where": "mem"}, "n", store="memory://api-test")
    assert load_latest("r", store="memory://api-test")[0] == {"where": "mem"}
    assert load_latest("r") is None
    monkeypatch.setenv("CARAVANSERAI_STORE", str(tmp_path / "elsewhere"))
    checkpoint("r", {"where": "env"}, "n")
    assert (tmp_path / "elsewhere" / "r" / "journal.jsonl").exists()
    assert not (project / ".caravanserai").exists()


def test_unknown_scheme_names_the_remedy(project):
    from caravanserai import UnknownStoreScheme

    with pytest.raises(UnknownStoreScheme, match="memory://"):
        open_store("ftp://x/y")


def test_errors_pickle_with_their_fields():
    import pickle

    err = caravanserai.RunLocked("locked", run_id="r", holder={"pid": 1})
    back = pickle.loads(pickle.dumps(err))
    assert type(back) is caravanserai.RunLocked and back.code == "run_locked" and back.holder == {"pid": 1}
    assert str(back) == "locked" and back.to_dict()["run_id"] == "r"
    assert issubclass(RunNotFound, caravanserai.CaravanseraiError)

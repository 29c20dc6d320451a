"""resumable_iterate: lazy, verified resume, group commit, progress, never touches checkpoint state."""

from __future__ import annotations

import io
import itertools
from datetime import timedelta

import pytest
from caravanserai.progress import ProgressLine

from caravanserai import ItemsChanged, checkpoint, durable, load_latest, resumable_iterate
from caravanserai.runs import read_events


def _consume(iterator, stop_after=None):
    seen = []
    for item in iterator:
        if stop_after is not None and len(seen) == stop_after:
            break  # like a crash mid-item: the current item is not done
        seen.append(item)
    return seen


def test_resume_after_break_redoes_only_the_current_item(project):
    items = [f"f{i}" for i in range(7)]
    first = _consume(resumable_iterate(items, "it"), stop_after=3)  # item f3 was in flight
    assert first == ["f0", "f1", "f2"]
    assert _consume(resumable_iterate(items, "it")) == ["f3", "f4", "f5", "f6"]
    assert _consume(resumable_iterate(items, "it")) == []  # finished: nothing again


def test_exception_in_body_keeps_items_before_it(project):
    with pytest.raises(ZeroDivisionError):
        for item in resumable_iterate(range(5), "it"):
            if item == 2:
                1 / 0  # noqa: B018 - raises ZeroDivisionError on purpose
    assert _consume(resumable_iterate(range(5), "it")) == [2, 3, 4]


def test_does_not_materialise_an_infinite_generator(project):
    counter = itertools.count()
    pulled = []

    def numbers():
        for n in counter:
            pulled.append(n)
            yield n

    assert _consume(resumable_iterate(numbers(), "inf"), stop_after=5) == [0, 1, 2, 3, 4]
    assert len(pulled) <= 6
    # resuming skips the 5 done items lazily, verifying each
    gen = resumable_iterate((n for n in itertools.count()), "inf")
    assert next(gen) == 5
    gen.close()


def test_reordered_input_is_detected(project):
    _consume(resumable_iterate(["a", "b", "c", "d"], "it"), stop_after=2)
    with pytest.raises(ItemsChanged, match="reordered or changed") as info:
        _consume(resumable_iterate(["b", "a", "c", "d"], "it"))
    assert info.value.code == "items_changed" and info.value.position == 0


def test_shrunk_input_is_detected(project):
    _consume(resumable_iterate(list(range(6)), "it"), stop_after=4)
    with pytest.raises(ItemsChanged, match="has 2 items but 4 were already processed"):
        _consume(resumable_iterate([0, 1], "it"))
    with pytest.raises(ItemsChanged, match="shrank"):
        _consume(resumable_iterate(iter([0, 1, 2]), "it"))


def test_grown_input_continues_with_the_new_tail(project):
    assert _consume(resumable_iterate([1, 2, 3], "it")) == [1, 2, 3]
    assert _consume(resumable_iterate([1, 2, 3, 4, 5], "it")) == [4, 5]


def test_a_set_resumes_by_identity_whatever_its_order(project):
    names = {f"name-{i}" for i in range(8)}
    first = _consume(resumable_iterate(names, "s"), stop_after=3)
    rest = _consume(resumable_iterate(set(sorted(names, reverse=True)), "s"))
    assert sorted(first + rest) == sorted(names) and not set(first) & set(rest)


def test_key_resumes_by_identity(project):
    rows = [{"id": i, "payload": "x" * i} for i in range(5)]
    first = _consume(resumable_iterate(rows, "k", key=lambda r: r["id"]), stop_after=2)
    rest = _consume(resumable_iterate(list(reversed(rows)), "k", key=lambda r: r["id"]))
    assert [r["id"] for r in first] == [0, 1] and [r["id"] for r in rest] == [4, 3, 2]


def test_never_overwrites_checkpoint_state(project):
    checkpoint("mixed", {"user": "state"}, "mine")
    _consume(resumable_iterate(range(3), "mixed"))
    assert load_latest("mixed")[:2] == ({"user": "state"}, "mine")


def test_group_commit_by_items_and_its_tradeoff(project):
    items = list(range(25))
    _consume(resumable_iterate(items, "g", every=10), stop_after=23)  # break flushes the 23 done
    progress = [e for e in read_events("g") if e["type"] == "progress"]
    assert [len(e["items"]) for e in progress] == [10, 10, 3]
    assert _consume(resumable_iterate(items, "g", every=10)) == [23, 24]


def test_group_commit_by_time(project):
    gen = resumable_iterate(range(1000), "t", every="1h")
    assert _consume(gen) == list(range(1000))
    progress = [e for e in read_events("t") if e["type"] == "progress"]
    assert len(progress) == 1 and progress[0]["done"] == 1000
    assert _consume(resumable_iterate(range(3), "td", every=timedelta(milliseconds=1))) == [0, 1, 2]


@pytest.mark.parametrize("bad", [0, -1, 1.5, "fast", True])
def test_bad_every_is_refused_before_writing(project, bad):
    with pytest.raises((ValueError, TypeError)):
        resumable_iterate([1], "bad", every=bad)
    assert not (project / ".caravanserai").exists()


def test_notes_name_items(project):
    _consume(resumable_iterate(["a.csv", "b.csv"], "n", note=lambda f: f"converted {f}"))
    notes = [e["note"] for e in read_events("n") if e["type"] == "progress"]
    assert notes == ["converted a.csv", "converted b.csv"]
    _consume(resumable_iterate(["x"], "d"))
    assert [e["note"] for e in read_events("d") if e["type"] == "progress"] == ["processed item 1/1"]


def test_empty_input_creates_a_completed_run(project):
    assert _consume(resumable_iterate([], "empty")) == []
    assert [e["type"] for e in read_events("empty")][-1] == "run_completed"


def test_two_loops_in_one_durable_block_are_tracked_apart(project):
    with durable("two"):
        assert _consume(resumable_iterate("abc", "two")) == list("abc")
        _consume(resumable_iterate("xyz", "two"), stop_after=1)
    with durable("two"):
        assert _consume(resumable_iterate("abc", "two")) == []
        assert _consume(resumable_iterate("xyz", "two")) == ["y", "z"]


def test_legacy_iterate_state_resumes(project):
    # A 0.2.0 run stores {"_i": k} as its checkpoint state.
    checkpoint("old", {"_i": 3}, "processed item 3/5")
    assert _consume(resumable_iterate(list("abcde"), "old")) == ["d", "e"]


def test_progress_display_shows_rate_eta_and_resume_offset(project):
    line = ProgressLine("run", 100, resumed_at=40, stream=io.StringIO(), interval=0)
    line.started -= 2.0
    line.update(60)
    text = line.render()
    assert text.startswith("[run] 60/100 (resumed at 40)") and "items/s" in text and "ETA" in text
    line.close()
    assert line.stream.getvalue().endswith("\n")


def test_progress_flag_writes_to_stderr(project, capsys):
    _consume(resumable_iterate(range(3), "p"), stop_after=1)
    _consume(resumable_iterate(range(3), "p", progress=True))
    err = capsys.readouterr().err
    assert "[p] 3/3 (resumed at 1)" in err

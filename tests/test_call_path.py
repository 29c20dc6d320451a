"""The journaled-call path: the bytes it writes, what stays off it, and what a kill cannot take.

a. Lines are byte-identical to those journals were written with before the path was trimmed
   (``docs/journal-format.md`` is a contract): a pinned journal holding every kind of field, and a
   property test against a reference encoder written from the format's text.
b. A journal written earlier verifies, and a writer continues its hash chain.
c. Journaled calls never wake the local store's views renderer, a ``read`` tool call costs one
   fdatasync, and the views are complete when the run ends.
d. Real processes SIGKILLed at random instants in a tight loop of journaled tool calls: every
   acknowledged result is in the journal, verified, and no acknowledged call ever runs again.
   ``CARAVANSERAI_CALL_KILLS`` sets the number of kills, ``CARAVANSERAI_KILL_SEED`` replays a schedule.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import signal
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

import caravanserai
from caravanserai import journal
from caravanserai.journal import RESERVED_FIELDS, RawJSON, Tail
from caravanserai.runs import read_events
from caravanserai.stores.local import views
from caravanserai.stores.local.store import LocalStore

TOOL_LOOP = Path(__file__).resolve().parent / "children" / "tool_loop.py"
REPO = Path(__file__).resolve().parent.parent
AT = "2026-11-30T16:40:00.123456+00:00"


def _pinned_events() -> list[dict]:
    return [
        {"type": "run_started", "run_id": "golden", "pid": 4242, "host": "h\u00f4te", "cwd": "/tmp/x y",
         "command": ["python", "-c", 'print("hi")'], "python": "3.11.7", "caravanserai": "0.3.0"},
        {"type": "tool_intent", "path": "run/step", "tool": "step", "call_id": "run/step#1", "effect": "read",
         "args_sha256": journal.digest({"i": 1}), "args": RawJSON('{"i":1}', {"i": 1})},
        {"type": "tool_settled", "path": "run/step", "tool": "step", "call_id": "run/step#1",
         "result": RawJSON('{"i":1,"text":"caf\u00e9 \u2028 \U0001f42a \\"q\\" \\\\ \\n"}', None)},
        {"type": "call_settled", "path": "run", "kind": "model",
         "call": RawJSON('{"usage":{"prompt_tokens":3},"estimated_usd":1.5e-07}', None)},
        {"type": "waypoint", "n": 1, "note": 'line one\nline "two"\t\u00e9',
         "state": RawJSON('{"total":3.25,"xs":[1,2,3]}', None), "loop": 0},
        {"type": "progress", "loop": 0, "done": 2, "items": ["00ff", "abcd"], "note": None, "flag": True, "ratio": 0.1,
         "big": 123456789012345678901234567890, "neg": -7, "nested": {"b": [1, {"c": None}], "a": "\u0007"}},
        {"type": "x", 1: "an int key", "s": RawJSON("2", 2), "at": "2020-01-01T00:00:00.000000+00:00"},
        {"type": "run_completed", "result": RawJSON("null", None)},
    ]


# ---- a. the bytes -------------------------------------------------------------------------------
def test_lines_are_byte_identical_to_the_pinned_journal():
    lines, _, tail = journal.encode(_pinned_events(), Tail(), at=AT)
    # Written by the encoder before the call path was trimmed; the chain below depends on every byte.
    assert lines[1] == ('{"v":1,"seq":1,"at":"2026-11-30T16:40:00.123456+00:00","type":"tool_intent","path":"run/step",'
                        '"tool":"step","call_id":"run/step#1","effect":"read","args_sha256":'
                        '"0b549edd218c251f511934cc2f3bc5c7f4780e27af6b8ab4ae8d92cd94121b4a","args":{"i":1},'
                        '"prev":"902d8e2bb783879c2d4ad6ae5dce7ad4"}')
    assert lines[4] == ('{"v":1,"seq":4,"at":"2026-11-30T16:40:00.123456+00:00","type":"waypoint","n":1,'
                        '"note":"line one\\nline \\"two\\"\\t\u00e9","loop":0,"state":{"total":3.25,"xs":[1,2,3]},'
                        '"prev":"f94443d2e1e965a03da728ec04d305ff"}')  # a RawJSON field goes after the others
    assert lines[6] == ('{"v":1,"seq":6,"at":"2020-01-01T00:00:00.000000+00:00","type":"x","1":"an int key","s":2,'
                        '"prev":"665e4503172c2500e6e05726746f5cd2"}')
    whole = ("\n".join(lines) + "\n").encode("utf-8")
    assert hashlib.sha256(whole).hexdigest() == "0f7e40dfc8de2fedb75b267728e56a7d58407a2cabf2da545e77760a04b0a89a"
    assert (tail.seq, tail.prev) == (8, "a5c4d7aeac50981deea4e6632308998c")
    assert journal.decode("golden", lines)[1] == tail


def _reference_line(seq: int, event: dict, prev: str | None) -> str:
    """The line as docs/journal-format.md describes it, with the standard library's encoder:
    v, seq, at, type, the event's fields (pre-encoded ones after the rest), prev last."""
    fields = [(k, v) for k, v in event.items() if k not in RESERVED_FIELDS]
    ordered: dict = {"v": 1, "seq": seq, "at": event.get("at", AT), "type": event["type"]}
    ordered.update((k, v) for k, v in fields if not isinstance(v, RawJSON))
    ordered.update((k, v.value) for k, v in fields if isinstance(v, RawJSON))
    if prev is not None:
        ordered["prev"] = prev
    return json.dumps(ordered, ensure_ascii=False, separators=(",", ":"), allow_nan=False)


_text = st.text(st.characters(codec="utf-8"), max_size=12)
_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | _text,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_text, inner, max_size=4),
    max_leaves=12,
)


@st.composite
def _events(draw: st.DrawFn) -> list[dict]:
    out = []
    for _ in range(draw(st.integers(1, 4))):
        event: dict = {"type": draw(st.sampled_from(["tool_intent", "tool_settled", "waypoint", "t\u00e9", 'q"'])) }
        for key in draw(st.lists(_text.filter(lambda k: k not in RESERVED_FIELDS), max_size=6, unique=True)):
            value = draw(_json)
            if draw(st.booleans()):
                value = RawJSON(json.dumps(value, ensure_ascii=False, separators=(",", ":")), value)
            event[key] = value
        out.append(event)
    return out


@settings(max_examples=300, deadline=None)
@given(_events(), st.integers(0, 10**6), st.none() | st.text("0123456789abcdef", min_size=32, max_size=32))
def test_lines_match_the_documented_format(events, seq, prev):
    start = Tail(seq, prev)
    lines, full, tail = journal.encode(events, start, at=AT)
    for line, event in zip(lines, events):
        assert line == _reference_line(seq, event, prev)
        prev = hashlib.sha256(line.encode("utf-8")).hexdigest()[:32]
        seq += 1
    assert (tail.seq, tail.prev) == (seq, prev)
    decoded, _ = journal.decode("prop", lines, tail=start)  # and it verifies as a continuation of `start`
    assert decoded == [journal.plain(e) for e in full]


def test_timestamps_keep_the_documented_form_across_seconds(monkeypatch):
    for ns in (0, 1_764_000_000_999_999_999, 1_764_000_001_000_000_000, 1_764_000_001_000_001_500, 1_764_000_000_500_000_000):
        monkeypatch.setattr(journal.time, "time_ns", lambda ns=ns: ns)
        second, rest = divmod(ns, 10**9)
        expected = datetime.fromtimestamp(second, timezone.utc).replace(microsecond=rest // 1000)
        assert journal.utc_now() == expected.isoformat(timespec="microseconds")  # floored, as datetime.now()


# ---- b. journals written before -----------------------------------------------------------------
def test_a_journal_written_before_verifies_and_its_chain_continues(tmp_path):
    lines, _, _ = journal.encode(_pinned_events(), Tail(), at=AT)
    run_dir = tmp_path / "s" / "golden"
    run_dir.mkdir(parents=True)
    (run_dir / "journal.jsonl").write_bytes(("\n".join(lines) + "\n").encode("utf-8"))
    store = LocalStore(tmp_path / "s", views=False)
    with caravanserai.durable("golden", store=store) as run:
        assert run.call_tool(lambda i: {"twice": 2 * i}, {"i": 21}, name="double") == {"twice": 42}
    events = store.events("golden")  # verified: seq and chain run on from the old lines
    assert store.load("golden")[: len(lines)] == lines
    assert [e["type"] for e in events[len(lines):]] == ["attempt", "tool_intent", "tool_settled", "run_completed"]
    assert events[len(lines)]["prev"] == "a5c4d7aeac50981deea4e6632308998c"


# ---- c. what stays off the hot path -------------------------------------------------------------
def _step(i: int) -> dict:
    return {"i": i, "text": f"step {i:05d}"}


def test_journaled_calls_never_wake_the_views_renderer(tmp_path, monkeypatch):
    submitted: list[list[str]] = []
    real = views.RENDERER.submit

    def spy(run_dir, events=(), **kw):
        events = list(events)
        submitted.append([e["type"] for e in events])
        return real(run_dir, events, **kw)

    monkeypatch.setattr(views.RENDERER, "submit", spy)
    store = LocalStore(tmp_path / "s")
    with caravanserai.durable("calls", store=store) as run:
        for i in range(20):
            run.call_tool(_step, {"i": i}, name="step")
        run.checkpoint({"done": 20}, "twenty calls")
        for i in range(20, 25):
            run.call_tool(_step, {"i": i}, name="step")
    # the run's start (sent with the first call's intent) and the waypoint; no call, no completion
    assert submitted == [["run_started", "tool_intent"], ["waypoint"]]
    run_dir = tmp_path / "s" / "calls"  # up to date when the run ended, with no flush_views()
    assert (run_dir / "latest").read_text() == "1"
    assert json.loads((run_dir / "state.json").read_text()) == {"done": 20}
    assert (run_dir / "waypoint-1.md").read_text().endswith("\n\ntwenty calls\n")
    assert json.loads((run_dir / "meta.json").read_text())["journal"] == "journal.jsonl"


def test_a_read_tool_call_costs_one_fdatasync(tmp_path, monkeypatch):
    store = LocalStore(tmp_path / "s")
    synced: list[int] = []
    real = os.fdatasync
    with caravanserai.durable("one-sync", store=store) as run:
        run.call_tool(_step, {"i": -1}, name="step")  # the journal file exists from here on
        monkeypatch.setattr(os, "fdatasync", lambda fd: (synced.append(fd), real(fd))[1])
        for i in range(10):
            run.call_tool(_step, {"i": i}, name="step", effect="read")
        assert len(synced) == 10  # the intent rides on its result's fdatasync
        run.call_tool(_step, {"i": 10}, name="step", effect="idempotent")
        assert len(synced) == 12  # any other effect's intent is durable before the call goes out
    events = store.events("one-sync")
    assert [e["result"]["i"] for e in events if e["type"] == "tool_settled"] == list(range(-1, 11))


def test_ctrl_c_while_the_store_writes_arrives_once_the_append_is_whole(tmp_path, monkeypatch):
    """A real SIGINT raised inside the store's append reaches the handler that was in place only after
    the line is on disk and counted; a second one interrupts at once; the handler is put back."""
    store = LocalStore(tmp_path / "s")
    delivered: list[int] = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: delivered.append(signum))
    try:
        with caravanserai.durable("ctrl-c", store=store) as run:
            run.call_tool(_step, {"i": 0}, name="step")
            real = store.append

            def interrupted_write(*args, **kwargs):
                before = len(delivered)
                signal.raise_signal(signal.SIGINT)
                assert len(delivered) == before  # noted, not delivered, while the store writes
                return real(*args, **kwargs)

            monkeypatch.setattr(store, "append", interrupted_write)
            run.call_tool(_step, {"i": 1}, name="step")
            assert delivered == [signal.SIGINT, signal.SIGINT]  # the intent's append and the result's
            monkeypatch.setattr(store, "append", lambda *a, **k: (signal.raise_signal(signal.SIGINT),
                                                                  signal.raise_signal(signal.SIGINT), real(*a, **k))[2])
            run.call_tool(_step, {"i": 2}, name="step")
            monkeypatch.setattr(store, "append", real)
        assert delivered == [signal.SIGINT] * 6  # the second Ctrl-C of a hanging write went through at once
        assert signal.getsignal(signal.SIGINT).__name__ == "<lambda>"  # the caller's handler, put back
    finally:
        signal.signal(signal.SIGINT, previous)
    results = [e["result"]["i"] for e in store.events("ctrl-c") if e["type"] == "tool_settled"]
    assert results == [0, 1, 2]  # every line whole and chained


# ---- d. SIGKILL ---------------------------------------------------------------------------------
def _read_marks(path: Path) -> tuple[list[int], list[int], bool]:
    execs, acks, done = [], [], False
    for line in path.read_text(encoding="utf-8").splitlines():
        word, _, number = line.partition(" ")
        if word == "EXEC" and number.isdigit():
            execs.append(int(number))
        elif word == "ACK" and number.isdigit():
            acks.append(int(number))
        elif line == "DONE":
            done = True
    return execs, acks, done


def _results_by_index(store: LocalStore, run_id: str) -> dict[int, dict]:
    events = store.events(run_id)  # verified: numbering and hash chain
    settled = {e["call_id"]: e for e in events if e["type"] == "tool_settled"}
    return {e["args"]["i"]: settled[e["call_id"]]["result"] for e in events
            if e["type"] == "tool_intent" and e["call_id"] in settled}


def test_sigkilled_tool_loop_keeps_every_acknowledged_result(tmp_path, child_env):
    seed = int(os.environ.get("CARAVANSERAI_KILL_SEED") or random.randrange(1 << 30))
    rng = random.Random(seed)
    kills = int(os.environ.get("CARAVANSERAI_CALL_KILLS", "8"))
    store_path, run_id = tmp_path / "store", "tools"
    acknowledged: set[int] = set()
    for attempt in range(kills + 1):
        last = attempt == kills
        out = tmp_path / f"out-{attempt}.txt"
        n = max(acknowledged, default=0) + 20 if last else 10**7
        with open(out, "w", encoding="utf-8") as sink:
            proc = subprocess.Popen([sys.executable, str(TOOL_LOOP), str(store_path), run_id, str(n)], stdout=sink,
                                    stderr=subprocess.PIPE, env=child_env)
            if last:
                assert proc.wait(timeout=120) == 0, proc.stderr.read().decode() if proc.stderr else ""
            else:
                deadline = time.monotonic() + 60
                while "EXEC" not in out.read_text(encoding="utf-8"):  # new work under way (replays print no EXEC)
                    assert proc.poll() is None and time.monotonic() < deadline, f"child did not start (seed {seed})"
                    time.sleep(0.01)
                time.sleep(rng.uniform(0.0, 0.15))
                proc.kill()
                proc.wait(timeout=30)
            if proc.stderr:
                proc.stderr.close()
        execs, acks, done = _read_marks(out)
        assert not set(execs) & acknowledged, f"an acknowledged call ran again (seed {seed})"
        results = _results_by_index(LocalStore(store_path, views=False), run_id)
        for i in acks:
            assert results.get(i) == {"i": i, "text": f"step {i:05d} " + "." * 32}, f"call {i} lost (seed {seed})"
        acknowledged |= set(acks)
        assert done == last
    assert read_events(run_id, store=str(store_path))[-1]["type"] == "run_completed"
    assert acknowledged == set(range(max(acknowledged) + 1))


def test_segments_change_only_on_the_events_the_ledger_feeds_them():
    """The ledger feeds ``Segments`` only ``SEGMENT_EVENTS`` (one call fewer per journaled call): every
    other event type the journal format documents leaves a segment's bookkeeping as it was."""
    import re

    from caravanserai.events import BOUNDARIES, CALL_EVENTS, SEGMENT_EVENTS, Segments

    text = (REPO / "docs" / "journal-format.md").read_text()
    later = re.search(r"^Later layers add (.*?) with the same envelope", text, re.M | re.S)
    assert later is not None
    documented = ((set(re.findall(r"^\| `([a-z_]+)`", text, re.M)) - set(RESERVED_FIELDS))
                  | set(re.findall(r"`([a-z_]+)`", later.group(1))) | set(CALL_EVENTS) | set(BOUNDARIES))
    assert SEGMENT_EVENTS <= documented and {"tool_intent", "waypoint", "turn"} <= documented
    started = {"type": "run_started", "run_id": "r", "agent_id": "a", "at": AT}
    for etype in sorted(documented - SEGMENT_EVENTS):
        segments = Segments.of([started, {"type": "attempt", "at": AT}])
        before = {name: getattr(segments, name) for name in Segments.__slots__}
        event = {"type": etype, "at": AT, "parent_run": "r", "cell_source": "x", "agent_id": "b",
                 "forked_from": {"run_id": "p", "copied": 1}}
        assert segments.feed(event) is None, etype
        assert {name: getattr(segments, name) for name in Segments.__slots__} == before, etype

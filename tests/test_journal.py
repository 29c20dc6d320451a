"""The journal line format: numbering, timestamps, hash chain, round trips."""

from __future__ import annotations

import json
from datetime import datetime

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from caravanserai import JournalCorruptionError, journal

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=12,
)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.dictionaries(st.text(min_size=1, max_size=8).filter(lambda k: k not in journal.RESERVED_FIELDS),
                                json_values, max_size=4), min_size=1, max_size=6))
def test_encode_decode_round_trip(payloads):
    events = [{"type": "t", **p} for p in payloads]
    lines, full, tail = journal.encode(events, journal.Tail())
    decoded, tail2 = journal.decode("r", lines)
    assert decoded == full and tail2 == tail
    for event, payload in zip(decoded, payloads):
        assert {k: event[k] for k in payload} == payload
    # appending more later chains onto the same tail
    more, _, _ = journal.encode([{"type": "u"}], tail)
    assert journal.decode("r", lines + more)[0][-1]["seq"] == len(lines)


def test_every_event_has_v_seq_at_type_first():
    lines, full, _ = journal.encode([{"type": "a", "x": 1}, {"type": "b"}], journal.Tail())
    assert list(full[0])[:4] == ["v", "seq", "at", "type"]
    assert [e["seq"] for e in full] == [0, 1]
    stamp = datetime.fromisoformat(full[0]["at"])
    assert stamp.utcoffset().total_seconds() == 0 and "." in full[0]["at"]  # microseconds
    assert "prev" not in full[0] and full[1]["prev"] == journal.line_digest(lines[0])


def test_raw_json_is_spliced_not_reencoded():
    raw = journal.RawJSON('{"big":[1,2,3]}', {"big": [1, 2, 3]})
    lines, full, _ = journal.encode([{"type": "waypoint", "state": raw, "note": "n"}], journal.Tail())
    assert json.loads(lines[0])["state"] == {"big": [1, 2, 3]}
    assert journal.plain(full[0])["state"] == {"big": [1, 2, 3]}


def test_event_needs_a_type():
    with pytest.raises(ValueError):
        journal.encode([{"x": 1}], journal.Tail())


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda ls: [ls[0], ls[2]], "expected 1"),
        (lambda ls: [ls[1], ls[0], ls[2]], "expected 0"),
        (lambda ls: [ls[0], ls[1].replace('"x":1', '"x":2'), ls[2]], "does not chain"),
        (lambda ls: [ls[0], "not json", ls[2]], "not JSON"),
    ],
    ids=["dropped", "reordered", "edited", "garbage"],
)
def test_damage_is_detected(mutate, message):
    lines, _, _ = journal.encode([{"type": "a", "x": i} for i in range(3)], journal.Tail())
    with pytest.raises(JournalCorruptionError, match=message):
        journal.decode("r", mutate(lines))

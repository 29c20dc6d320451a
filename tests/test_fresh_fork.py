"""A fork from a freshly opened log (issue 24): pieces cut from the stored text, one hash of the rebuilt chain.

A fresh ``CheckpointLog`` reads a chain (a full object, then deltas). It cuts the value items and
KV index entries out of the full object's header text instead of encoding them again, rebuilds
the chain with one splice, and checks the result against its id with one SHA-256 pass (the full
object's own digest pass is skipped: if the result hashes to its id, every object was intact).
Each test compares with a plain path written out here or in ``test_fork_speed.py``, and checks
that damage is still named object by object. Nothing here measures time:
``benchmarks/bench_checkpoints.py`` does.
"""

from __future__ import annotations

import json
import random
from collections import OrderedDict

import pytest
from agent_helpers import commit_chain, flip, long_run, object_key
from hypothesis import given, settings
from hypothesis import strategies as st
from test_fork_speed import kv_dicts, plain_decode, plain_encode, plain_fork, redigest, sha, split, values_dicts

from caravanserai.checkpoints import CheckpointLog, DurableAgent, LocalDirectoryStore
from caravanserai.checkpoints import format as fmt
from caravanserai.checkpoints.agent import known_fields, validate_header
from caravanserai.errors import CheckpointCorruptionError


# ---- Sections decoded from bytes: pieces cut from the text only where each is one entry ----
def _agent_blob(prompts: list[str], step: int) -> bytes:
    return DurableAgent().begin(prompts).run_until_step(step)


def _generic(values: dict, kv: dict, **fields_: object) -> bytes:
    return plain_encode({"format": "x", **fields_, "values": values}, kv)


CUT_CASES = {  # name: (bytes, whether the pieces are cut from the text)
    "a DurableAgent checkpoint": (_agent_blob(["a", "b", "c"], 1), True),
    "a value holding the separators and labels as text": (
        _generic({"a": 'x,"values":{"b":1},"kv_index":[[', "b": [1, 2]}, {"k": b"12"}), True),
    "a nested value with a values key": (_generic({"a": {"values": {"b": [1]}}, "c": "d"}, {}), True),
    "no values, no KV entries": (_generic({}, {}), True),
    "a prompt that ends with a comma": (_agent_blob(["ends with,", "b"], 1), False),
    "a KV key holding the entry separator": (_generic({"a": 1}, {"x],[y": b"1", "z": b"22"}), False),
    "a field that sorts after values": (_generic({"a": 1}, {}, zz=1), False),
    "values that are not an object": (plain_encode({"values": [1, 2]}, {}), False),
}


def _spaced(blob: bytes, old: bytes, new: bytes) -> bytes:
    head, rest = split(blob)
    assert old in head
    return redigest(head.replace(old, new, 1), rest)


SPACED = _agent_blob(["a", "b", "c"], 1)
CUT_CASES |= {  # not canonical (a log commits only canonical bytes): cut only where the pieces stay valid JSON
    "spaces around the KV index": (_spaced(SPACED, b'"kv_index":[[', b'"kv_index":[ ['), False),
    "a space inside a KV entry": (_spaced(SPACED, b'"kv_index":[["step-0",', b'"kv_index":[["step-0", '), False),
    "a space between values": (_spaced(SPACED, b'","prompt-1"', b'", "prompt-1"'), False),
    "a space after a value's colon": (_spaced(SPACED, b'"prompt-1":"', b'"prompt-1": "'), False),
    "a space before a token list": (_spaced(SPACED, b'"step-0":[', b'"step-0": ['), True),  # valid, kept as read
    "a space before the first value": (_spaced(SPACED, b'"values":{"', b'"values":{ "'), False),
    "a hidden separator and a nested one": (redigest(b'{"format":"x","kv_index":[],"values":{"a":["x","y"], "b":1}}'),
                                            False),
    "fields again after the values": (redigest(b'{"format":"x","k":{"p":9},"kv_index":[["z",1]],'
                                               b'"values":{"a":1,"b":2,"c":3},"kv_index":[["z",1]],"k":{"p":9}}', b"1"),
                                      False),
    "the KV index twice": (redigest(b'{"format":"x","kv_index":[["a",1]],"kv_index":[["b",1]],"values":{"v":1}}', b"1"),
                           False),
    "a string value ending in a space": (_generic({"a": "x ", "b": 1}, {}), False),
}


@pytest.mark.parametrize("name", sorted(CUT_CASES))
def test_pieces_are_cut_from_the_text_only_where_each_is_one_entry(name):
    blob, cut = CUT_CASES[name]
    decoded, _ = fmt.decode_sections(blob)
    assert decoded._cut() is cut
    plain_header, plain_kv = plain_decode(blob)
    canonical = fmt.encode(fmt.decode(blob)) == blob
    for key in list(plain_header.get("values", {}))[:2] if isinstance(plain_header.get("values"), dict) else []:
        fresh, _ = fmt.decode_sections(blob)
        edited = fresh.edit({key: "new", "added": [3]}, [], {"new-kv": b"abc"}, list(plain_kv)[:1])
        values = {**plain_header["values"], key: "new", "added": [3]}
        kv = {k: v for k, v in plain_kv.items() if k not in list(plain_kv)[:1]} | {"new-kv": b"abc"}
        expected = plain_encode({**plain_header, "values": values}, kv)
        if canonical or not cut:  # encoded again where not cut: canonical whatever the source
            assert edited.to_bytes() == expected, key
        assert plain_decode(edited.to_bytes()) == plain_decode(expected)  # the same checkpoint, read back
        assert edited.identify() == (sha(edited.to_bytes()), len(edited.to_bytes()))


def _mutated(head: bytes, how: str, at: int) -> bytes:
    """``head`` with a space or line break put in (anywhere, or after a comma or an opening brace), or
    a field written again before the closing brace: text a reader parses, that the encoder never writes."""
    if how == "field again":
        parsed = json.loads(head)
        field = sorted(parsed)[at % len(parsed)]
        value = json.dumps(parsed[field], separators=(",", ":")).encode()
        return head[:-1] + b"," + json.dumps(field).encode() + b":" + value + b"}"
    spacing, _, where = how.partition(" after ")
    points = [i + 1 for i, byte in enumerate(head) if not where or chr(byte) == where] or [len(head) - 1]
    point = points[at % len(points)]
    return head[:point] + spacing.encode().decode("unicode_escape").encode() + head[point:]


nested_values = st.dictionaries(st.sampled_from(["a", "b", "c", "d"]), st.lists(st.text(max_size=2), max_size=3)
                                | st.integers(0, 9) | st.text(max_size=3), max_size=4)


@settings(max_examples=400, deadline=None, derandomize=True)
@given(nested_values | values_dicts, kv_dicts,
       st.sampled_from(["field again", " ", "\\n", " after ,", " after {", "\\t after ,", " after :"]),
       st.integers(0, 10**6))
def test_whatever_the_stored_text_an_edit_reads_back_as_its_parse_edited(values, kv, how, at):
    head, rest = split(plain_encode({"format": "x", "values": values}, kv))
    text = _mutated(head, how, at)
    try:
        parsed = json.loads(text)
        sections, _ = fmt.decode_sections(redigest(text, rest))
    except (ValueError, CheckpointCorruptionError):
        return  # not JSON, or not a checkpoint: nothing to cut
    kv_read = dict(sections.data.kv)
    if not isinstance(parsed.get("values"), dict):  # a space inside the label: no values object to edit
        with pytest.raises(TypeError):
            sections.edit({"a": 1})
        return
    key = next(iter(parsed["values"]), "new")
    edited = sections.edit({key: "edited", "zz": [1]}, [], {"k9": b"xy"}, list(kv_read)[:1])
    header, kv_back = plain_decode(edited.to_bytes())
    assert header == {**{k: v for k, v in parsed.items() if k != "kv_index"},
                      "values": {**parsed["values"], key: "edited", "zz": [1]}}
    assert kv_back == {k: v for k, v in kv_read.items() if k not in list(kv_read)[:1]} | {"k9": b"xy"}


def test_a_fork_of_a_checkpoint_whose_pieces_cannot_be_cut_is_still_the_plain_fork(tmp_path):
    prompts = ["ends with,", 'say "hi", then stop', "c", "d"]
    ckpts = [_agent_blob(prompts, i) for i in range(4)]
    store = LocalDirectoryStore(tmp_path / "ckpt")
    ids = commit_chain(CheckpointLog(store, "odd"), ckpts)
    for k in range(4):
        cid = CheckpointLog(store, "odd").fork(ids[k], "prompt-1", "edited,")
        assert cid == sha(plain_fork(ckpts[k], "prompt-1", "edited,"))


# ---- a fresh log: one hash of the rebuilt chain, damage still named -------------------------
@pytest.fixture
def chain(tmp_path):
    ckpts = long_run(12)
    store = LocalDirectoryStore(tmp_path / "ckpt")
    log = CheckpointLog(store, "long")
    ids = commit_chain(log, ckpts)
    assert [log.record(i).depth for i in ids] == list(range(12))  # one full object, then deltas
    return store, ckpts, ids


def test_a_fresh_log_rebuilds_a_chain_with_one_hash_and_the_plain_bytes(chain, monkeypatch):
    store, ckpts, ids = chain
    verified = []
    real = fmt.decode_sections

    def spy(blob, **kw):
        verified.append(kw.get("verify", True))
        return real(blob, **kw)

    monkeypatch.setattr(fmt, "decode_sections", spy)
    for k in (1, 6, 11):
        verified.clear()
        log = CheckpointLog(store, "long")
        assert log.load(ids[k]) == ckpts[k]
        assert verified == [False] + [True] * k  # the full object unhashed; each small delta checked
        cid = CheckpointLog(store, "long").fork(ids[k], f"prompt-{k}", "fresh fork")
        assert cid == sha(plain_fork(ckpts[k], f"prompt-{k}", "fresh fork"))


@pytest.mark.parametrize("where", ["full object, KV bytes", "full object, header", "delta"])
def test_damage_in_a_chain_is_named_by_its_object_from_a_fresh_log(chain, where):
    store, ckpts, ids = chain
    damaged = ids[0] if where.startswith("full") else ids[4]
    key = object_key(store, "long", damaged)
    blob = store.get(key)
    position = {"full object, KV bytes": len(blob) - 40, "full object, header": 200, "delta": 60}[where]
    store.put(key, flip(blob, position, 0x01))
    for op in (lambda log: log.load(ids[7]), lambda log: log.fork(ids[7], "prompt-2", "x")):
        with pytest.raises(CheckpointCorruptionError, match=f"stored object of checkpoint {damaged}") as caught:
            op(CheckpointLog(store, "long"))
        assert "\n" not in str(caught.value)


def test_damage_only_in_what_a_later_checkpoint_does_not_use_shows_when_its_own_checkpoint_loads(chain):
    store, ckpts, ids = chain
    key = object_key(store, "long", ids[0])
    store.put(key, flip(store.get(key), len(store.get(key)) - 1, 0x01))  # the full object's digest itself
    assert CheckpointLog(store, "long").load(ids[4]) == ckpts[4]  # rebuilt, and it hashes to its id
    with pytest.raises(CheckpointCorruptionError, match=f"stored object of checkpoint {ids[0]}"):
        CheckpointLog(store, "long").load(ids[0])


def test_a_chain_whose_delta_changes_a_header_field_loads_fresh_and_warm(tmp_path):
    ckpts = list(long_run(8))
    for step in range(3, 8):  # the model id changes at step 3: that delta carries a header field
        data = fmt.decode(ckpts[step])
        ckpts[step] = fmt.encode(fmt.CheckpointData({**data.header, "model_id": "fake-2"}, data.kv))
    store = LocalDirectoryStore(tmp_path / "ckpt")
    ids = commit_chain(CheckpointLog(store, "model"), ckpts)
    assert fmt.decode(store.get(object_key(store, "model", ids[3]))).header["header"] == {"model_id": "fake-2"}
    warm = CheckpointLog(store, "model")
    for k in (2, 3, 7):
        assert CheckpointLog(store, "model").load(ids[k]) == ckpts[k]  # fresh: the chain from its full object
        assert warm.load(ids[k]) == ckpts[k]  # warm: on from the checkpoint the log last loaded
        cid = CheckpointLog(store, "model").fork(ids[k], "prompt-1", "edited")
        assert cid == sha(plain_fork(ckpts[k], "prompt-1", "edited"))


def test_a_swapped_delta_is_caught_by_a_fresh_log(chain):
    store, ckpts, ids = chain
    key = object_key(store, "long", ids[5])
    delta = fmt.decode(store.get(key))
    changed = {**delta.header["values_set"], "step-5": [0] * 8}  # well formed, its own digest right
    store.put(key, fmt.encode(fmt.CheckpointData({**delta.header, "values_set": changed}, delta.kv, fmt.DELTA)))
    for k in (5, 9):
        with pytest.raises(CheckpointCorruptionError, match="does not match its id"):
            CheckpointLog(store, "long").load(ids[k])


# ---- the checks in C say what the loops say -------------------------------------------------
def _plain_split(index, blob: bytes, offset: int, end: int) -> dict | None:
    if not isinstance(index, list):
        return None
    kv = {}
    for entry in index:
        if not (isinstance(entry, list) and len(entry) == 2 and isinstance(entry[0], str)
                and type(entry[1]) is int and entry[1] >= 0) or entry[0] in kv or entry[1] > end - offset:
            return None
        kv[entry[0]], offset = blob[offset:offset + entry[1]], offset + entry[1]
    return kv if offset == end else None


entries = st.lists(st.one_of(
    st.tuples(st.sampled_from(["a", "b", "c", "d"]), st.integers(-1, 4)).map(list),
    st.sampled_from([["a"], ["a", 1, 2], [1, 1], ["a", True], ["a", 1.0], "a", None, [["a", 1]]])), max_size=6)


@settings(max_examples=300, deadline=None)
@given(entries, st.integers(0, 12))
def test_the_kv_index_is_split_as_the_loop_splits_it(index, size):
    blob = bytes(range(size))
    expected = _plain_split(index, blob, 0, size)
    if expected is None:
        with pytest.raises(CheckpointCorruptionError):
            fmt._split_kv(index, blob, 0, size, "checkpoint")
    else:
        assert fmt._split_kv(index, blob, 0, size, "checkpoint") == expected


def _values_variants() -> dict[str, dict]:
    data = fmt.decode(_agent_blob(["a", "b", "c", "d"], 2))
    values = data.header["values"]
    shuffled = list(values.items())
    random.Random(1).shuffle(shuffled)
    return {
        "as decoded": values, "shuffled": dict(shuffled), "steps first": dict(sorted(values.items(), reverse=True)),
        "a prompt not a str": {**values, "prompt-1": 5}, "a prompt missing": {k: v for k, v in values.items() if k != "prompt-2"},
        "a step past the graph": {**values, "step-4": [1]}, "a stray key": {**values, "zzz": 1},
        "a prompt past the graph, in order": {**values, "prompt-4": "x"},
        "an OrderedDict": OrderedDict(values),
    }


@pytest.mark.parametrize("name", sorted(_values_variants()))
def test_values_are_checked_the_same_in_any_order(name):
    data = fmt.decode(_agent_blob(["a", "b", "c", "d"], 2))
    values = _values_variants()[name]
    outcomes = []
    for order in (values, dict(reversed(list(values.items())))):  # the same values, in the other order
        try:
            validate_header(fmt.CheckpointData({**data.header, "values": order}, data.kv), "checkpoint")
            outcomes.append("valid")
        except CheckpointCorruptionError as exc:
            outcomes.append(str(exc).split(":")[0])
    assert outcomes[0] == outcomes[1]
    assert (outcomes[0] == "valid") is (name in ("as decoded", "shuffled", "steps first", "an OrderedDict"))


def test_a_step_count_spelled_inside_a_value_decodes_as_a_full_parse_does():
    blob = _agent_blob(["a", "b", "c"], 1)
    head, rest = split(blob)
    values_at = head.index(b'"step-0":')
    end = head.index(b"]", values_at) + 1
    tricky = redigest(head[:values_at] + b'"step-0":{"steps":7}' + head[end:], rest)  # after the real "steps"
    decoded = fmt.decode(tricky, known=known_fields)
    assert decoded.header == {k: v for k, v in json.loads(split(tricky)[0]).items() if k != "kv_index"}
    assert decoded.header["steps"] == 3 and decoded.header["values"]["step-0"] == {"steps": 7}

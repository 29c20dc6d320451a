"""Forks and commits at the hashing floor (issue 13): the fast path writes exactly what the plain one does.

A fork or a resume commit is built from already-encoded sections (``format.Sections``) and
identified with one SHA-256 pass. Every test here compares that path with a plain one written
out in this file (``json.dumps`` of the whole header, the old whole-graph downstream search), byte
for byte and id for id, and checks that damaged or malformed input is still refused. Nothing here
measures time: ``benchmarks/bench_checkpoints.py`` does.
"""

from __future__ import annotations

import hashlib
import json
import struct
import subprocess

import pytest
from agent_helpers import PYTHON, commit_chain, flip, long_run, object_key, store_bytes
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from caravanserai.checkpoints import CheckpointLog, DurableAgent, LocalDirectoryStore, MemoryCheckpointStore
from caravanserai.checkpoints import format as fmt
from caravanserai.checkpoints.agent import _expected_graph, decode_checkpoint, known_fields
from caravanserai.checkpoints.log import make_delta
from caravanserai.errors import CheckpointCorruptionError, RunExists, UnknownNode

MAGIC_PREFIX = struct.Struct("<8sHHI")


# ---- the plain path, written out independently ----------------------------------------------
def plain_encode(header: dict, kv: dict[str, bytes], kind: int = fmt.FULL) -> bytes:
    """The v1 layout from docs/checkpoint-format.md: one json.dumps of the whole header."""
    keys = sorted(kv)
    head = json.dumps({**header, "kv_index": [[k, len(kv[k])] for k in keys]}, sort_keys=True,
                      ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode("utf-8")
    body = MAGIC_PREFIX.pack(b"CVSRCKPT", 1, kind, len(head)) + head + b"".join(kv[k] for k in keys)
    return body + hashlib.sha256(body).digest()


def plain_decode(blob: bytes) -> tuple[dict, dict[str, bytes]]:
    hlen = MAGIC_PREFIX.unpack_from(blob)[3]
    header = json.loads(blob[16:16 + hlen])
    kv, at = {}, 16 + hlen
    for key, length in header.pop("kv_index"):
        kv[key], at = blob[at:at + length], at + length
    return header, kv


def plain_fork(blob: bytes, node_id: str, value) -> bytes:
    """The fork as it was written before issue 13: a reverse index over the whole graph."""
    header, kv = plain_decode(blob)
    dependents: dict[str, list[str]] = {}
    for node in header["graph"]:
        for dep in node["deps"]:
            dependents.setdefault(dep, []).append(node["id"])
    stale, frontier = set(), [node_id]
    while frontier:
        for child in dependents.get(frontier.pop(), ()):
            if child not in stale:
                stale.add(child)
                frontier.append(child)
    values = {k: v for k, v in header["values"].items() if k not in stale}
    values[node_id] = value
    kv = {k: v for k, v in kv.items() if k not in stale and k != node_id}
    return plain_encode({**header, "values": values}, kv)


def sha(blob: bytes) -> str:
    return hashlib.sha256(blob).hexdigest()


def redigest(head: bytes, rest: bytes = b"", kind: int = fmt.FULL) -> bytes:
    """A checkpoint whose header text is ``head`` (and KV bytes ``rest``), with a correct digest."""
    body = MAGIC_PREFIX.pack(b"CVSRCKPT", 1, kind, len(head)) + head + rest
    return body + hashlib.sha256(body).digest()


def split(blob: bytes) -> tuple[bytes, bytes]:
    hlen = MAGIC_PREFIX.unpack_from(blob)[3]
    return blob[16:16 + hlen], blob[16 + hlen:-32]


# ---- Sections: the encoded pieces are the plain encoding ------------------------------------
json_scalars = st.none() | st.booleans() | st.integers(-10**20, 10**20) | st.text(max_size=12) | st.floats(
    allow_nan=False, allow_infinity=False)
json_values = st.recursive(json_scalars, lambda inner: st.lists(inner, max_size=4)
                           | st.dictionaries(st.text(max_size=6), inner, max_size=4), max_leaves=12)
node_keys = st.sampled_from([f"{kind}-{i}" for kind in ("prompt", "step") for i in range(12)]) | st.text(max_size=8)
token_lists = st.lists(st.integers(0, 255), max_size=8)
values_dicts = st.dictionaries(node_keys, token_lists | st.text(max_size=20) | json_values, max_size=20)
kv_dicts = st.dictionaries(node_keys, st.binary(max_size=40), max_size=8)
fields = st.dictionaries(st.sampled_from(["backend", "format", "graph", "model_id", "steps", "zz", "a"]), json_values,
                         max_size=5)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(fields, values_dicts, kv_dicts, st.sampled_from([fmt.FULL, fmt.DELTA]))
def test_sections_bytes_and_id_are_the_plain_encoding(header, values, kv, kind):
    data = fmt.CheckpointData({**header, "values": values}, kv, kind)
    expected = plain_encode(data.header, kv, kind)
    assert fmt.encode(data) == expected
    sections = fmt.Sections(data)
    assert sections.identify() == (sha(expected), len(expected))
    assert sections.to_bytes() == expected


edits = st.lists(st.tuples(st.dictionaries(node_keys, token_lists | json_values, max_size=4),
                           st.lists(node_keys, max_size=5),
                           st.dictionaries(node_keys, st.binary(max_size=30), max_size=3),
                           st.lists(node_keys, max_size=4)), min_size=1, max_size=5)


@settings(max_examples=90, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(fields, values_dicts, kv_dicts, edits, st.sampled_from(["encoded by the edit", "items first", "decoded"]))
def test_edited_sections_are_the_plain_encoding_of_the_edited_checkpoint(header, values, kv, steps, start):
    sections = fmt.Sections(fmt.CheckpointData({**header, "values": values}, kv))
    if start == "items first":  # the source's items already encoded (a warm log), or encoded by the first edit
        sections.identify()
        sections._value_items()
    elif start == "decoded":  # read from its bytes (a fresh log): the pieces cut from the text where they can be
        blob = plain_encode({**header, "values": values}, kv)
        sections, cid = fmt.decode_sections(blob)
        assert cid == sha(blob) and sections.to_bytes() == blob
    model_values, model_kv = dict(values), dict(kv)
    for values_set, values_removed, kv_set, kv_removed in steps:
        sections = sections.edit(values_set, values_removed, kv_set, kv_removed)
        for key in values_removed:
            model_values.pop(key, None)
        model_values.update(values_set)
        for key in kv_removed:
            model_kv.pop(key, None)
        model_kv.update(kv_set)
        expected = plain_encode({**header, "values": model_values}, model_kv)
        assert sections.to_bytes() == expected
        assert sections.identify() == (sha(expected), len(expected))
        assert sections.data.header["values"] == model_values and sections.data.kv == model_kv
    assert values == dict(values)  # the source's dicts were not modified


@settings(max_examples=50, deadline=None)
@given(values_dicts, values_dicts, kv_dicts, kv_dicts)
def test_a_delta_from_the_touched_keys_is_the_full_delta(pv, cv, pk, ck):
    parent = fmt.CheckpointData({"values": pv, "steps": 1}, pk)
    child = fmt.CheckpointData({"values": cv, "steps": 1}, ck)
    touched = ([*pv, *cv], [*pk, *ck])
    assert make_delta(parent, child, "a" * 64, touched=touched) == make_delta(parent, child, "a" * 64)


def _old_nesting(bare: bytes) -> int:
    level = deepest = 0
    for mark in bare:
        if mark in b"[{":
            level += 1
        elif mark in b"]}":
            level -= 1
        deepest = max(deepest, level)
    return deepest - 1 if deepest else 0


@settings(max_examples=80, deadline=None)
@given(st.dictionaries(st.text(max_size=5), json_values, max_size=5))
def test_the_nesting_bound_measures_what_a_bracket_count_does(doc):
    bare = fmt._STRINGS.sub(b'""', fmt.canonical_json(doc))
    assert fmt._nesting(bare) == _old_nesting(bare)


def test_the_nesting_bound_still_refuses_a_deep_header():
    agent = DurableAgent().begin(["a"])
    head, rest = split(agent.checkpoint())
    deep = head.replace(b'"values":{', b'"x":' + b"[" * 70 + b"]" * 70 + b',"values":{')
    with pytest.raises(CheckpointCorruptionError, match="nests more than 64"):
        decode_checkpoint(redigest(deep, rest))


# ---- the graph is compared, not parsed, only when that reads what a parse reads --------------
def _variants(blob: bytes) -> dict[str, bytes]:
    head, rest = split(blob)
    graph = json.dumps(json.loads(head)["graph"], separators=(",", ":")).encode()
    marker = b"10000000000000000000"
    return {
        "as written": blob,
        "graph copied into a value, top-level graph 0": redigest(
            head.replace(b'"graph":' + graph, b'"graph":0')
                .replace(b'"values":{', b'"values":{"step-0":{"graph":' + graph + b"},", 1), rest),
        "graph key twice, the last an empty list": redigest(head[:-1] + b',"graph":[]}', rest),
        "graph key twice, the last spelled with an escape": redigest(head[:-1] + b',"gr\\u0061ph":' + marker + b"}", rest),
        "the marker number in a prompt": redigest(head.replace(b'"prompt-0":"', b'"prompt-0":"' + marker + b" ", 1), rest),
        "the marker number as the top-level graph": redigest(head.replace(b'"graph":' + graph, b'"graph":' + marker), rest),
        "steps lies about the graph": redigest(head.replace(b'"steps":3', b'"steps":2'), rest),
        "spaces around the graph": redigest(head.replace(b'"graph":' + graph, b'"graph" : ' + graph + b" "), rest),
        "graph not at the top": redigest(head.replace(b'"graph":' + graph, b'"x":{"graph":' + graph + b"}"), rest),
    }


@pytest.mark.parametrize("name", list(_variants(DurableAgent().begin(["a", "b", "c"]).run_until_step(1))))
def test_the_graph_fast_path_decodes_exactly_what_a_full_parse_decodes(name):
    blob = _variants(DurableAgent().begin(["a", "b", "c"]).run_until_step(1))[name]
    outcomes = []
    for known in (known_fields, None):
        try:
            data = fmt.decode(blob, known=known)
            outcomes.append(("decoded", data.header, data.kv))
        except Exception as exc:  # noqa: BLE001 - both paths must fail the same way
            outcomes.append(("error", type(exc).__name__, str(exc)))
    assert outcomes[0] == outcomes[1]
    if name == "as written":  # the fast path was taken: the graph is the one encoded once, not a parsed copy
        assert fmt.decode(blob, known=known_fields).header["graph"] is _expected_graph(3)
    if name == "as written" or name == "the marker number in a prompt" or name == "spaces around the graph":
        decode_checkpoint(blob)  # valid checkpoints (the last one not canonical: a log refuses to commit it)
    else:
        with pytest.raises(CheckpointCorruptionError):
            decode_checkpoint(blob)


# ---- CheckpointLog forks and commits: the same bytes, ids and objects as the plain path ------
def _log(tmp_path, steps=40):
    ckpts = long_run(steps)
    store = LocalDirectoryStore(tmp_path / "ckpt")
    return store, ckpts, commit_chain(CheckpointLog(store, "long"), ckpts)


@pytest.mark.parametrize("warm", [True, False], ids=["warm log", "fresh log per fork"])
def test_log_forks_are_the_plain_forks(tmp_path, warm):
    store, ckpts, ids = _log(tmp_path)
    log = CheckpointLog(store, "long")
    cases = [(k, node, value) for k in (0, 5, 16, 17, 33, 39)
             for node, value in ((f"prompt-{k}", f"new prompt {k}"), (f"step-{k}", {"edited": [k, "x"]}),
                                 (f"prompt-{max(k - 3, 0)}", "earlier"), ("step-0", 7))]
    for k, node, value in cases:
        source = ckpts[k]
        expected = plain_fork(source, node, value)
        assert DurableAgent.fork(source, node, value) == expected
        cid = (log if warm else CheckpointLog(store, "long")).fork(ids[k], node, value)
        assert cid == sha(expected), (k, node)
        assert CheckpointLog(store, "long").load(cid) == expected
        assert log.load_data(cid).header == plain_decode(expected)[0]


def test_forks_of_forks_and_resumes_commit_what_the_plain_path_commits(tmp_path, child_env):
    store, ckpts, ids = _log(tmp_path, 30)
    log = CheckpointLog(store, "long")
    expected: list[str] = []

    def plain_resume(blob: bytes) -> list[bytes]:
        agent = DurableAgent().load(blob)
        return [agent.run_until_step(i) for i in agent.pending_steps()]

    first = log.fork(ids[12], "prompt-12", "look elsewhere")
    first_bytes = plain_fork(ckpts[12], "prompt-12", "look elsewhere")
    assert first == sha(first_bytes)
    progress = log.resume(first, commit_every=0)  # a commit after every step: commit_change
    resumed = plain_resume(first_bytes)
    assert progress.head == sha(resumed[-1]) and progress.commits == len(resumed)
    expected += [sha(b) for b in resumed]
    second = log.fork(sha(resumed[5]), "step-15", ["hand", "edited"])  # a fork of a fork's descendant
    second_bytes = plain_fork(resumed[5], "step-15", ["hand", "edited"])
    assert second == sha(second_bytes)
    progress = log.resume(second, commit_every=0)
    resumed2 = plain_resume(second_bytes)
    assert progress.head == sha(resumed2[-1])
    expected += [sha(b) for b in resumed2]
    third = log.fork(progress.head, "prompt-2", "again", new_run_id="branch")
    third_bytes = plain_fork(resumed2[-1], "prompt-2", "again")
    assert third == sha(third_bytes)
    CheckpointLog(store, "branch").resume(third, commit_every=0.0)
    resumed3 = plain_resume(third_bytes)
    assert CheckpointLog(store, "branch").heads() == [sha(resumed3[-1])]

    in_log = {r.id for r in log.manifest()}
    assert {first, second, *expected} <= in_log
    # A fresh process reads the whole log back: every checkpoint hashes to its id, and its own
    # forks (fast path) equal DurableAgent.fork on the loaded bytes (plain path).
    script = f"""
import hashlib, json
from caravanserai.checkpoints import CheckpointLog, DurableAgent, LocalDirectoryStore
store = LocalDirectoryStore({str(tmp_path / 'ckpt')!r})
out = {{}}
for run in ("long", "branch"):
    log = CheckpointLog(store, run)
    for rec in log.manifest():
        blob = CheckpointLog(store, run).load(rec.id)
        assert hashlib.sha256(blob).hexdigest() == rec.id
        out[rec.id] = len(blob)
log = CheckpointLog(store, "long")
blob = log.load({second!r})
plain = DurableAgent.fork(blob, "prompt-20", "from a fresh process")
out["fork"] = [log.fork({second!r}, "prompt-20", "from a fresh process"), hashlib.sha256(plain).hexdigest()]
print(json.dumps(out))
"""
    proc = subprocess.run([PYTHON, "-c", script], env=child_env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    fast, plain = out.pop("fork")
    assert fast == plain == sha(plain_fork(second_bytes, "prompt-20", "from a fresh process"))
    assert set(out) == in_log | {r.id for r in CheckpointLog(store, "branch").manifest()}


def test_resume_commits_store_the_objects_a_plain_commit_stores(tmp_path):
    agent = DurableAgent().begin([f"task {i}" for i in range(24)])
    start = agent.run_until_step(2)
    fast_store, plain_store = MemoryCheckpointStore(), MemoryCheckpointStore()
    fast, plain = CheckpointLog(fast_store, "r"), CheckpointLog(plain_store, "r")
    head = fast.commit(start, step=2)
    assert plain.commit(start, step=2) == head
    fast.commit = lambda *args, **kwargs: pytest.fail("the resume re-encoded the whole checkpoint")  # type: ignore[method-assign]
    progress = fast.resume(head, commit_every=0)
    parent = head
    for i in range(3, 24):  # what runner.py did before: commit(agent.checkpoint()) after each step
        parent = plain.commit(agent.run_until_step(i), parent=parent, step=i)
    assert progress.head == parent
    assert fast.manifest() == plain.manifest()
    keys = fast_store.list("checkpoints/")
    assert keys == plain_store.list("checkpoints/")
    assert all(fast_store.get(k) == plain_store.get(k) for k in keys)


# ---- what is refused is still refused, before anything is written --------------------------
def test_commit_refuses_bytes_that_are_not_in_canonical_form(tmp_path):
    blob = DurableAgent().begin(["a", "b"]).run_until_step(1)
    head, rest = split(blob)
    spaced = redigest(json.dumps(json.loads(head), sort_keys=True, ensure_ascii=False).encode(), rest)
    decode_checkpoint(spaced)  # a valid checkpoint: DurableAgent reads it
    root = tmp_path / "ckpt"
    log = CheckpointLog(LocalDirectoryStore(root), "r")
    with pytest.raises(CheckpointCorruptionError, match="canonical"):
        log.commit(spaced)
    assert not root.exists() or store_bytes(root) == {}
    assert log.commit(blob) == sha(blob)


@pytest.mark.parametrize("values_set, kv_set", [
    ({"prompt-0": "a prompt is not a step"}, {}),
    ({"step-9": [1]}, {}),
    ({"step-x": [1]}, {}),
    ({"step-2": object()}, {}),
    ({"step-2": float("nan")}, {}),
    ({"step-2": [1]}, {"step-3": b"\0" * 64}),
    ({"step-2": [1]}, {"step-2": b"\0" * 63}),
], ids=["prompt", "out of range", "not a node", "not JSON", "NaN", "KV of a step not run", "partial KV entry"])
def test_commit_change_refuses_what_a_checkpoint_could_not_hold(values_set, kv_set):
    store = MemoryCheckpointStore()
    log = CheckpointLog(store, "r")
    head = log.commit(DurableAgent().begin(["a", "b", "c", "d"]).run_until_step(1), step=1)
    before = {k: store.get(k) for k in store.list("")}
    with pytest.raises(CheckpointCorruptionError):
        log.commit_change(head, values_set, kv_set, step=2)
    assert {k: store.get(k) for k in store.list("")} == before


def test_a_swapped_delta_is_caught_when_its_base_is_in_the_cache(tmp_path):
    store, ckpts, ids = _log(tmp_path, 8)
    log = CheckpointLog(store, "long")
    log.fork(ids[3], "prompt-3", "x")  # ids[3] now cached with its items encoded (the fast edit path)
    key = object_key(store, "long", ids[4])
    delta = fmt.decode(store.get(key))
    changed = dict(delta.header["values_set"])
    changed["step-4"] = [0] * 8  # a well-formed delta, its own digest right, that rebuilds another checkpoint
    store.put(key, fmt.encode(fmt.CheckpointData({**delta.header, "values_set": changed}, delta.kv, fmt.DELTA)))
    with pytest.raises(CheckpointCorruptionError, match="does not match its id"):
        log.load(ids[4])
    store.put(key, flip(store.get(key), 40))
    with pytest.raises(CheckpointCorruptionError):
        CheckpointLog(store, "long").load(ids[5])


def test_fork_refusals_still_write_nothing(tmp_path):
    store, ckpts, ids = _log(tmp_path, 6)
    log = CheckpointLog(store, "long")
    log.fork(ids[5], "prompt-1", "taken", new_run_id="taken")
    before = store_bytes(tmp_path / "ckpt")
    with pytest.raises(UnknownNode):
        log.fork(ids[5], "prompt-6", "no such node")
    with pytest.raises(RunExists):
        log.fork(ids[5], "prompt-2", "into a run that exists", new_run_id="taken")
    assert store_bytes(tmp_path / "ckpt") == before

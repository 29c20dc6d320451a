"""Checkpoint safety: malformed checkpoints, records and deltas are corruption (never a crash or a
hang), ids may be given as prefixes, step numbers for people count from 1, runs get a status.

1. A table of bad checkpoint inputs: each one raises its typed one-line error from every decoder
   and writes nothing.
2. Hypothesis: random bytes, random JSON headers with a valid digest, and random mutations of a real
   header: only CheckpointCorruptionError (CheckpointFormatError for foreign bytes), within a bound.
3. A table of damaged CheckpointLog records and objects: corruption from every log operation, and
   nothing written; an id that does not exist stays "not found" and says how to list ids.
4. ``DurableAgent.fork`` / ``caravanserai fork`` errors; id prefixes through ``resolve`` and the CLI.
5. Step numbering (lineage text and JSON, inspect, diff) and ``log_status``.
"""

from __future__ import annotations

import copy
import hashlib
import json
import signal
import struct
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

import pytest
from caravanserai.durable_agent import FORMAT, MAX_STEPS
from caravanserai.timelines import compare, timeline
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import caravanserai
from caravanserai import DurableAgent, ckpt_format
from caravanserai.checkpoints import CheckpointLog, MemoryCheckpointStore, log_status
from caravanserai.cli import main
from caravanserai.errors import (
    AmbiguousId,
    CaravanseraiError,
    CheckpointCorruptionError,
    CheckpointFormatError,
    ModelError,
    ObjectNotFound,
    SerializationError,
    UnknownNode,
    UsageError,
)
from caravanserai.runs import read_events

PROMPTS = ["pull the ticket", "reproduce the bug", "draft a fix", "open the PR"]
REAL = DurableAgent().begin(PROMPTS).run_until_step(1)  # steps 1-2 done, 3-4 pending; fake backend


# ---- helpers --------------------------------------------------------------------------------
def split(blob: bytes) -> tuple[dict, bytes]:
    """A checkpoint's raw header (kv_index included) and KV body, read without the library."""
    hlen = struct.unpack_from("<I", blob, 12)[0]
    return json.loads(blob[16:16 + hlen]), blob[16 + hlen:-32]


def pack(head: bytes, body: bytes = b"", *, version: int = 1, kind: int = 0, hlen: int | None = None,
         magic: bytes = ckpt_format.MAGIC) -> bytes:
    """Checkpoint bytes around ``head`` with a valid digest: only what is inside can be wrong."""
    out = magic + struct.pack("<HHI", version, kind, len(head) if hlen is None else hlen) + head + body
    return out + hashlib.sha256(out).digest()


def with_header(header: Any, body: bytes | None = None, **options: Any) -> bytes:
    """A checkpoint whose header is ``header`` (ASCII JSON, so lone surrogates travel as escapes)."""
    return pack(json.dumps(header, sort_keys=True, allow_nan=True).encode(), split(REAL)[1] if body is None else body,
                **options)


def changed(**fields: Any) -> bytes:
    """REAL with header fields replaced (``None`` removes one)."""
    header, body = split(REAL)
    for key, value in fields.items():
        if value is None:
            header.pop(key, None)
        else:
            header[key] = value
    return with_header(header, body)


def real(path: str, value: Any) -> bytes:
    """REAL with one nested header value replaced: ``path`` like ``graph.1.step`` or ``values.prompt-0``."""
    header, body = split(REAL)
    *parents, last = path.split(".")
    node: Any = header
    for part in parents:
        node = node[int(part)] if isinstance(node, list) else node[part]
    key: Any = int(last) if isinstance(node, list) else last
    if value is _DELETE:
        del node[key]
    else:
        node[key] = value
    return with_header(header, body)


_DELETE = object()


@contextmanager
def no_hang(seconds: float = 3.0) -> Iterator[None]:
    """Fail (not wait forever) if the body runs longer than ``seconds``: a hang is a bug too."""

    def alarm(_signum, _frame):
        raise AssertionError(f"a checkpoint decoder ran longer than {seconds} s (a hang)")

    previous = signal.signal(signal.SIGALRM, alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def fresh_store() -> Any:
    return caravanserai.open_store(f"memory://safety-{uuid.uuid4().hex}")


def snapshot(store: Any) -> tuple[list[str], list[str]]:
    """Everything a store holds that a log operation could write: objects and runs (journals)."""
    return store.objects.list(), store.list()


DECODERS: dict[str, Callable[[Any], Any]] = {
    "decode": ckpt_format.decode,
    "inspect": DurableAgent.inspect,
    "outputs_of": DurableAgent.outputs_of,
    "fork": lambda blob: DurableAgent.fork(blob, "prompt-1", "edited"),
    "resume_from": lambda blob: DurableAgent().resume_from(blob),
    "commit": lambda blob: CheckpointLog(MemoryCheckpointStore(), "fuzz").commit(blob),
}


def only(allowed: tuple[type[BaseException], ...], blob: Any, *, decoders: dict = DECODERS) -> None:
    """Every decoder either accepts ``blob`` or raises one of ``allowed`` with a one-line message, promptly."""
    vllm = False
    try:
        vllm = split(bytes(blob))[0].get("backend") == "vllm"
    except Exception:  # noqa: BLE001 - only deciding whether ModelError (no server) is a fair answer
        pass
    for name, decoder in decoders.items():
        ok = allowed + ((ModelError,) if name == "resume_from" and vllm else ())
        try:
            with no_hang():
                decoder(blob)
        except ok as exc:
            assert "\n" not in str(exc), f"{name}: a multi-line message: {exc!r}"
            assert isinstance(exc, CaravanseraiError) and exc.code


@pytest.fixture(autouse=True)
def no_model_server(monkeypatch):
    """A vllm-backend checkpoint must fail fast (ModelError), never reach out to a server."""
    monkeypatch.delenv("VLLM_BASE_URL", raising=False)


# ---- 1. a table of bad checkpoints ----------------------------------------------------------
(_, L0), (_, L1) = split(REAL)[0]["kv_index"]
FORMAT_ROWS = {
    "not bytes": ("not a checkpoint", CheckpointFormatError),
    "empty": (b"", CheckpointFormatError),
    "bad magic": (pack(b"{}", magic=b"CVSRCKPX"), CheckpointFormatError),
    "future version": (with_header(split(REAL)[0], version=ckpt_format.FORMAT_VERSION + 1), CheckpointFormatError),
    "a delta is not a DurableAgent checkpoint": (with_header(split(REAL)[0], kind=ckpt_format.DELTA),
                                                 CheckpointFormatError),
}
CORRUPT_ROWS = {
    # prefix and sizes
    "version 0": with_header(split(REAL)[0], version=0),
    "unknown kind": with_header(split(REAL)[0], kind=7),
    "hlen past the end": with_header(split(REAL)[0], hlen=2**32 - 1),
    "hlen one too long": pack(b"{}", b"", hlen=3),
    "flipped byte (digest)": REAL[:40] + bytes([REAL[40] ^ 1]) + REAL[41:],
    # the header as JSON
    "header not utf-8": pack(b'{"a":"\xff"}'),
    "header not JSON": pack(b"{not json"),
    "header is a list": pack(b"[1,2,3]"),
    "header is a string": pack(b'"header"'),
    "header NaN": pack(b'{"kv_index":[],"x":NaN}'),
    "header 1e400": pack(b'{"kv_index":[],"x":1e400}'),
    "lone surrogate": pack(b'{"kv_index":[],"x":"\\ud800"}'),
    "header nested 100000 deep": pack(b"[" * 100_000 + b"]" * 100_000),
    "values nested 200 deep": real("values.step-0", json.loads("[" * 200 + "]" * 200)),
    "no kv_index": changed(kv_index=None),
    # kv_index
    "kv_index not a list": changed(kv_index={"step-0": 5}),
    "kv_index entry not a pair": changed(kv_index=[["step-0"]]),
    "kv_index negative length": changed(kv_index=[["step-0", -64]]),
    "kv_index bool length": changed(kv_index=[["step-0", True]]),
    "kv_index string length": changed(kv_index=[["step-0", "64"]]),
    "kv_index past the end": changed(kv_index=[["step-0", 10**12]]),
    "kv_index twice": real("kv_index.1.0", "step-0"),
    "trailing bytes": changed(kv_index=[]),
}
AGENT_ROWS = {  # well-formed checkpoint bytes (ckpt_format.decode reads them) whose DurableAgent header is wrong
    "format missing": changed(format=None),
    "format wrong": changed(format="caravanserai.other"),
    "backend unknown": changed(backend="tpu"),
    "backend not a string": changed(backend=["fake"]),
    "model_id not a string": changed(model_id=7),
    "steps missing": changed(steps=None),
    "steps a string": changed(steps="4"),
    "steps a bool": changed(steps=True),
    "steps zero": changed(steps=0),
    "steps negative": changed(steps=-1),
    "steps a float": changed(steps=4.0),
    "steps above the cap": changed(steps=MAX_STEPS + 1),
    "steps at the cap, small graph": changed(steps=MAX_STEPS),
    "steps 2**62 (a hang before)": changed(steps=2**62),
    "steps not what the graph holds": changed(steps=3),
    "graph missing": changed(graph=None),
    "graph not a list": changed(graph={"prompt-0": {}}),
    "graph too short": real("graph.7", _DELETE),
    "graph node not a dict": real("graph.0", "prompt-0"),
    "graph node without deps": real("graph.1.deps", _DELETE),
    "graph node step a string": real("graph.1.step", "0"),
    "graph node step a float": real("graph.1.step", 0.0),
    "graph node id wrong": real("graph.1.id", "step-9"),
    "graph node kind wrong": real("graph.1.kind", "prompt"),
    "graph deps wrong": real("graph.3.deps", ["prompt-1"]),
    "graph deps not strings": real("graph.3.deps", [1, 2]),
    "graph node extra key": real("graph.0.code", "os.system"),
    "values missing": changed(values=None),
    "values a list": changed(values=[["prompt-0", "x"]]),
    "prompt missing": real("values.prompt-2", _DELETE),
    "prompt not a string": real("values.prompt-2", 42),
    "values name an unknown node": real("values.step-9", [1]),
    "values name a padded node id": real("values.prompt-01", "x"),
    "kv for a pending step": changed(kv_index=[["step-0", L0], ["step-1", L1 - 64], ["step-2", 64]]),
    "kv not whole cache entries": changed(kv_index=[["step-0", L0 - 1], ["step-1", L1 + 1]]),
}


def test_the_table_fixtures_are_what_they_claim():
    header, body = split(REAL)
    assert [k for k, _ in header["kv_index"]] == ["step-0", "step-1"] and len(body) == sum(n for _, n in header["kv_index"])
    assert ckpt_format.decode(with_header(header, body)).header["steps"] == 4  # the repacking itself is sound
    assert DurableAgent.inspect(with_header(header, body))["executed_nodes"] == ["step-0", "step-1"]
    assert L0 % 64 == L1 % 64 == 0 and L0 + L1 == len(body), "the kv rows above move bytes between two entries"


ROWS = {**FORMAT_ROWS, **{name: (blob, CheckpointCorruptionError) for name, blob in {**CORRUPT_ROWS, **AGENT_ROWS}.items()}}


@pytest.mark.parametrize("name", list(ROWS))
def test_a_bad_checkpoint_is_a_typed_one_line_error_and_writes_nothing(name):
    blob, expected = ROWS[name]
    for decoder in ("decode", "inspect", "outputs_of", "fork", "resume_from"):
        if decoder == "decode" and (name in AGENT_ROWS or name == "a delta is not a DurableAgent checkpoint"):
            ckpt_format.decode(blob)  # only the DurableAgent reading of it is wrong
            continue
        with no_hang(), pytest.raises(expected) as caught:
            DECODERS[decoder](blob)
        assert type(caught.value) is expected, f"{decoder}: {type(caught.value).__name__}: {caught.value}"
        assert "\n" not in str(caught.value) and caught.value.code == expected.code
    # a failed resume leaves the agent as it was
    agent = DurableAgent().begin(PROMPTS)
    before = agent.checkpoint()
    with pytest.raises(expected):
        agent.resume_from(blob)
    assert agent.checkpoint() == before and agent.computed_steps == []
    # a failed commit (and a fork of a good checkpoint of the log with a bad one never made) writes nothing
    store = fresh_store()
    log = CheckpointLog(store, "table")
    good = log.commit(REAL, step=1)
    before = snapshot(store)
    with pytest.raises(expected):
        log.commit(blob, parent=good, step=2)
    assert snapshot(store) == before


def test_a_valid_repacked_checkpoint_still_decodes():
    """The table's rows fail for their one defect: the same repacking with nothing changed is accepted."""
    assert DurableAgent.outputs_of(changed()) == DurableAgent.outputs_of(REAL)
    assert DurableAgent().resume_from(changed()) == DurableAgent().resume_from(REAL)


def test_a_header_decodes_to_what_the_standard_parser_reads(monkeypatch):
    """Headers are parsed in C (orjson) where that reads exactly what ``json.loads`` reads: integers past
    64 bits (which orjson would turn into floats) are left to ``json.loads`` and come back exact, and the
    same bytes decode the same either way, deep nesting refused by both."""
    from caravanserai.checkpoints import format as fmt

    exact = [2**64 + 1, -(2**63) - 1, 2**63, 10**19, -(10**18), 1.5, 1e300, "1" * 30]
    blobs = [REAL, real("values.step-0", exact), real("values.step-0", {"n": [[1, [2.25, None]]], "s": "\u00e9"}),
             real("values.step-0", json.loads("[" * 60 + "]" * 60))]
    fast = [ckpt_format.decode(blob) for blob in blobs]
    step0 = fast[1].header["values"]["step-0"]
    assert step0 == exact and [type(v) for v in step0] == [type(v) for v in exact]
    monkeypatch.setattr(fmt, "_fast_loads", None)  # the standard parser alone
    slow = [ckpt_format.decode(blob) for blob in blobs]
    assert [d.header for d in slow] == [d.header for d in fast]
    assert [ckpt_format.encode(d) for d in slow] == [ckpt_format.encode(d) for d in fast]  # the same checkpoint ids


# ---- 2. hypothesis --------------------------------------------------------------------------
FUZZ = settings(max_examples=300, deadline=timedelta(milliseconds=500), derandomize=True, database=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
scalars = (st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats(allow_nan=False, allow_infinity=False)
           | st.text(max_size=12))
json_values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4)
                           | st.dictionaries(st.text(max_size=8), inner, max_size=4), max_leaves=12)
interesting = st.sampled_from([0, -1, 1, 2, 4, 2**31, 2**62, MAX_STEPS, MAX_STEPS + 1, True, False, None, "", "fake",
                               "vllm", "tpu", FORMAT, "step-1", "step-3", "prompt-0", "prompt-9", "kv_index", [], {},
                               1.5, "\ud800", "x" * 500, ["step-0", 64], [["step-0", 64]], [[1] * 3] * 3])
anything = (interesting | json_values).map(copy.deepcopy)  # fresh objects: an edit must never change a constant
HEADER, BODY = split(REAL)


@FUZZ
@given(json_values | st.integers(1, 80).map(lambda n: json.loads("[" * n + "]" * n)), st.integers(0, 70))
def test_too_deep_says_whether_a_value_nests_past_the_limit(value, limit):
    """The nesting bound every header value and fork value is held to, against its definition."""
    def depth(v: Any) -> int:  # a scalar 0, a container 1 + its deepest child
        if not isinstance(v, (dict, list)):
            return 0
        return 1 + max(map(depth, v.values() if isinstance(v, dict) else v), default=0)

    assert ckpt_format.too_deep(value, limit) == (depth(value) > limit)


@FUZZ
@given(st.one_of(st.binary(max_size=400),
                 st.binary(max_size=400).map(lambda b: ckpt_format.MAGIC + b),
                 st.binary(min_size=8, max_size=400).map(  # random fields and header behind a valid digest
                     lambda b: ckpt_format.MAGIC + b + hashlib.sha256(ckpt_format.MAGIC + b).digest())))
def test_random_bytes_are_a_format_or_corruption_error(blob):
    only((CheckpointFormatError, CheckpointCorruptionError), blob)


near_valid_header = st.fixed_dictionaries({}, optional={
    "format": st.just(FORMAT) | anything,
    "backend": st.sampled_from(["fake", "vllm"]) | anything,
    "model_id": st.just("fake") | anything,
    "steps": st.just(4) | st.integers(-5, 2**62) | anything,
    "graph": st.just(HEADER["graph"]) | anything,
    "values": st.just(HEADER["values"]) | anything,
    "kv_index": st.just(HEADER["kv_index"]) | st.lists(st.tuples(st.text(max_size=8), st.integers(-3, 2**40))
                                                        .map(list), max_size=4) | anything,
})


@FUZZ
@given(st.one_of(anything, near_valid_header), st.just(BODY) | st.binary(max_size=200),
       st.none() | st.integers(0, 2**32 - 1))
def test_random_headers_with_a_valid_digest_are_corruption(header, body, hlen):
    only((CheckpointCorruptionError,), with_header(header, body, hlen=hlen))


@st.composite
def mutated_headers(draw) -> dict:
    """The real header with one to three random edits somewhere in its tree (replace, delete, insert)."""
    header = copy.deepcopy(HEADER)
    for _ in range(draw(st.integers(1, 3))):
        node: Any = header
        while True:  # descend into a random container, stopping at random
            children = [k for k in (node if isinstance(node, dict) else range(len(node)))
                        if isinstance(node[k], (dict, list))]
            if not children or not draw(st.booleans()):
                break
            node = node[draw(st.sampled_from(sorted(children, key=str)))]
        keys = sorted(node, key=str) if isinstance(node, dict) else list(range(len(node)))
        action = draw(st.sampled_from(["replace", "delete", "insert"] if keys else ["insert"]))
        if action == "insert":
            if isinstance(node, dict):
                value = draw(anything)  # drawn first, as the assignment's right-hand side always was
                node[draw(st.sampled_from(["step-2", "prompt-9", "steps", "code", "kv_index"]) | st.text(max_size=6))] = value
            else:
                node.insert(draw(st.integers(0, len(node))), draw(anything))
        else:
            key = draw(st.sampled_from(keys))
            if action == "delete":
                del node[key]
            else:
                node[key] = draw(anything)
    return header


@FUZZ
@given(mutated_headers())
def test_mutated_real_headers_are_corruption_or_a_valid_checkpoint(header):
    blob = with_header(header, BODY)
    only((CheckpointCorruptionError,), blob)


# ---- 3. CheckpointLog records and objects ---------------------------------------------------
def long_run(steps: int = 6) -> list[bytes]:
    agent = DurableAgent().begin([f"task {i}" for i in range(steps)])
    return [agent.run_until_step(i) for i in range(steps)]


CHAIN = long_run()


def record_key(cid: str, run: str = "rec") -> str:
    return f"checkpoints/{run}/records/{cid}.json"


def object_key(store: Any, cid: str, run: str = "rec") -> str:
    (key,) = [k for k in store.objects.list(f"checkpoints/{run}/objects/{cid}")]
    return key


def edit_record(store: Any, cid: str, **fields: Any) -> None:
    doc = json.loads(store.objects.get(record_key(cid)))
    doc.update(fields)
    store.objects.put(record_key(cid), json.dumps(doc).encode())


def edit_delta(store: Any, cid: str, **fields: Any) -> None:
    key = object_key(store, cid)
    header, body = split(store.objects.get(key))
    header.update(fields)
    store.objects.put(key, with_header(header, body, kind=ckpt_format.DELTA))


def _not_json(store, ids):
    store.objects.put(record_key(ids[3]), b"{ not json")


def _a_list(store, ids):
    store.objects.put(record_key(ids[3]), b"[]")


def _not_utf8(store, ids):
    store.objects.put(record_key(ids[3]), b'{"id": "\xff"}')


ROW_TAMPERS: dict[str, Callable[[Any, list[str]], None]] = {
    "record not JSON": _not_json,
    "record is a list": _a_list,
    "record not UTF-8": _not_utf8,
    "record depth a string": lambda s, ids: edit_record(s, ids[3], depth="3"),
    "record depth wrong": lambda s, ids: edit_record(s, ids[3], depth=9),
    "record step negative": lambda s, ids: edit_record(s, ids[3], step=-1),
    "record kind unknown": lambda s, ids: edit_record(s, ids[3], kind="zip"),
    "record parent not an id": lambda s, ids: edit_record(s, ids[3], parent=5, base=5),
    "record id not its key": lambda s, ids: edit_record(s, ids[3], id=ids[2]),
    "record run_id not its log": lambda s, ids: edit_record(s, ids[3], run_id="other"),
    "record parent_run not a run id": lambda s, ids: edit_record(s, ids[3], parent_run="../x", base=None,
                                                                 kind="full", depth=0),
    "record extra field": lambda s, ids: edit_record(s, ids[3], code="os.system"),
    "record fork malformed": lambda s, ids: edit_record(s, ids[3], fork={"node_id": 3}),
    "base names a missing record": lambda s, ids: edit_record(s, ids[3], base="ab" * 32, parent="ab" * 32),
    "base record deleted": lambda s, ids: s.objects.delete(record_key(ids[2])),
    "a cycle of parents": lambda s, ids: edit_record(s, ids[1], parent=ids[3], base=None, kind="full", depth=0),
    "stored object missing": lambda s, ids: s.objects.delete(object_key(s, ids[2])),
    "delta values_removed not a list": lambda s, ids: edit_delta(s, ids[3], values_removed="step-0"),
    "delta values_set not an object": lambda s, ids: edit_delta(s, ids[3], values_set=[1]),
    "delta header sets values": lambda s, ids: edit_delta(s, ids[3], header={"values": {}}),
    "delta against another base": lambda s, ids: edit_delta(s, ids[3], base=ids[1]),
    "delta extra field": lambda s, ids: edit_delta(s, ids[3], code="x"),
    "delta makes a malformed checkpoint": lambda s, ids: edit_delta(s, ids[3], header={"steps": 10**9}),
    "full object malformed": lambda s, ids: s.objects.put(object_key(s, ids[0]), changed(steps=10**9)),
}
LOG_OPS: dict[str, Callable[[CheckpointLog, list[str]], Any]] = {
    "load": lambda log, ids: log.load(ids[4]),
    "lineage": lambda log, ids: log.lineage(ids[4]),
    "fork": lambda log, ids: log.fork(ids[4], "prompt-1", "edited"),
    "fork into a new run": lambda log, ids: log.fork(ids[4], "prompt-1", "edited", new_run_id="rec-alt"),
    "commit": lambda log, ids: log.commit(CHAIN[5], parent=ids[4], step=5),
    "manifest": lambda log, ids: log.manifest(),
}
# what an operation does not read cannot notice its damage
NOT_READ = {"lineage": {"record depth wrong", "stored object missing", "delta values_removed not a list",
                        "delta values_set not an object", "delta header sets values", "delta against another base",
                        "delta extra field", "delta makes a malformed checkpoint", "full object malformed"},
            "manifest": {"base names a missing record", "base record deleted", "a cycle of parents",
                         "record depth wrong", "stored object missing", "delta values_removed not a list",
                         "delta values_set not an object", "delta header sets values",
                         "delta against another base", "delta extra field", "delta makes a malformed checkpoint",
                         "full object malformed"}}


@pytest.mark.parametrize("tamper", sorted(ROW_TAMPERS))
def test_a_damaged_log_is_corruption_from_every_operation_and_nothing_is_written(tamper):
    store = fresh_store()
    prev, ids = None, []
    for step, ckpt in enumerate(CHAIN[:5]):
        prev = CheckpointLog(store, "rec").commit(ckpt, parent=prev, step=step)
        ids.append(prev)
    ROW_TAMPERS[tamper](store, ids)
    for name, op in LOG_OPS.items():
        if tamper in NOT_READ.get(name, ()):
            continue
        before = snapshot(store)
        with no_hang(), pytest.raises(CheckpointCorruptionError) as caught:
            op(CheckpointLog(store, "rec"), ids)
        assert "\n" not in str(caught.value), caught.value
        assert snapshot(store) == before, f"{name} wrote something after finding damage"


def test_an_unknown_id_is_not_found_and_says_how_to_list_ids():
    log = CheckpointLog(MemoryCheckpointStore(), "lost")
    ids = [log.commit(c, step=i) for i, c in enumerate(CHAIN[:2])]
    for missing in ("0" * 64, "0000", "not-hex", "abc" * 30):
        for action in (log.load, log.record, log.lineage, lambda c: log.fork(c, "prompt-0", "x"),
                       lambda c: log.commit(CHAIN[2], parent=c)):
            with pytest.raises(ObjectNotFound) as caught:
                action(missing)
            assert "caravanserai lineage lost" in str(caught.value) and "\n" not in str(caught.value)
    with pytest.raises(UsageError, match="at least 4"):
        log.load(ids[0][:3])
    assert len(log.manifest()) == 2


def test_resolve_prefixes():
    store = MemoryCheckpointStore()
    log = CheckpointLog(store, "ids")
    ids = [log.commit(c, step=i) for i, c in enumerate(CHAIN[:3])]
    for cid in ids:
        assert log.resolve(cid) == cid == log.resolve(cid[:12]) == log.resolve(cid[:12].upper())
        assert log.load(cid[:12]) == CHAIN[ids.index(cid)]
        assert log.record(cid[:8]).id == cid and log.lineage(cid[:10])[-1].id == cid
    # two records sharing a prefix: ambiguous, listing both; one more character settles it
    a, b = "abcd0" + "1" * 59, "abcd1" + "2" * 59
    for fake in (a, b):
        store.put(f"checkpoints/ids/records/{fake}.json", b"{}")
    with pytest.raises(AmbiguousId) as caught:
        log.resolve("abcd")
    assert a[:12] in str(caught.value) and b[:12] in str(caught.value) and "\n" not in str(caught.value)
    assert log.resolve("abcd1") == b
    assert log.commit(CHAIN[3], parent=ids[2][:12], step=3) == hashlib.sha256(CHAIN[3]).hexdigest()
    assert log.record(hashlib.sha256(CHAIN[3]).hexdigest()).parent == ids[2]


# ---- 4. fork errors -------------------------------------------------------------------------
def test_fork_an_unknown_node_lists_a_few_ids_in_one_line():
    big = DurableAgent().begin([f"p{i}" for i in range(3000)]).checkpoint()
    for ckpt, last in ((REAL, 3), (big, 2999)):
        for node in ("no-such-node", "prompt-4000", "step-01", "prompt--1", 7, None):
            with pytest.raises(UnknownNode) as caught:
                DurableAgent.fork(ckpt, node, "x")
            message = str(caught.value)
            assert "\n" not in message and len(message) < 250, message
            assert f"prompt-0 ... prompt-{last}" in message and f"step-{last}" in message
    assert issubclass(UnknownNode, KeyError)  # what fork raised before: `except KeyError` keeps working


@pytest.mark.parametrize("node, value, error", [
    ("prompt-2", 3, UsageError), ("prompt-2", None, UsageError), ("prompt-2", ["x"], UsageError),
    ("prompt-2", "\ud800", SerializationError), ("step-1", object(), SerializationError),
    ("step-1", {1, 2}, SerializationError), ("step-1", float("nan"), SerializationError),
    ("step-1", json.loads("[" * 100 + "]" * 100), SerializationError),
], ids=["int-prompt", "none-prompt", "list-prompt", "surrogate", "object", "set", "nan", "too-deep"])
def test_fork_rejects_a_bad_value_before_writing_anything(node, value, error):
    with pytest.raises(error) as caught:
        DurableAgent.fork(REAL, node, value)
    assert "\n" not in str(caught.value) and node in str(caught.value)
    store = fresh_store()
    log = CheckpointLog(store, "forks")
    cid = log.commit(REAL, step=1)
    before = snapshot(store)
    for new_run in (None, "forks-alt"):
        with pytest.raises(error):
            log.fork(cid, node, value, new_run_id=new_run)
    assert snapshot(store) == before


def test_a_forked_number_as_a_step_output_resumes():
    """A fork may set a step's output to any JSON value; the fake backend reads a scalar as one token."""
    forked = DurableAgent.fork(REAL, "step-1", 5)
    outputs = DurableAgent().resume_from(forked)
    assert outputs[1] == 5 and None not in outputs
    assert DurableAgent().resume_from(forked) == outputs


# ---- 5. the CLI: prefixes, numbering, one-line errors ---------------------------------------
def run_cli(capsys, *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def cli_log():
    url = f"memory://cli-{uuid.uuid4().hex}"
    store = caravanserai.open_store(url)
    agent = DurableAgent().begin(PROMPTS)
    log, prev, ids = CheckpointLog(store, "ticket"), None, []
    for step in range(4):
        prev = log.commit(agent.run_until_step(step), parent=prev, step=step)
        ids.append(prev)
    return url, log, ids


def test_cli_the_ids_lineage_prints_work_with_inspect_and_fork(capsys, cli_log):
    url, log, ids = cli_log
    code, out, _ = run_cli(capsys, "lineage", "ticket", "--store", url)
    assert code == 0
    rows = [line.split() for line in out.splitlines()[1:]]
    shown = [row[0] for row in rows]
    assert shown == [cid[:12] for cid in ids]
    assert [row[1:3] for row in rows] == [["step", "1"], ["step", "2"], ["step", "3"], ["step", "4"]]

    for extra in ([], ["--run", "ticket"]):
        code, out, err = run_cli(capsys, "inspect", shown[1], "--store", url, "--json", *extra)
        assert code == 0, err
        report = json.loads(out)
        assert report["checkpoint_id"] == ids[1]
        assert report["executed_nodes"] == ["step-0", "step-1"]  # node ids count from 0
        assert report["executed_steps"] == [1, 2] and report["pending_steps"] == [3, 4]  # people count from 1
        assert report["steps_done"] == 2 and report["steps"] == 4
    code, out, _ = run_cli(capsys, "inspect", shown[3], "--store", url)
    assert code == 0 and f"checkpoint_id: {ids[3]}" in out and "executed_steps: 1, 2, 3, 4" in out

    code, out, err = run_cli(capsys, "fork", "ticket", shown[2], "prompt-3", "open a draft PR", "--store", url)
    assert code == 0, err
    new = out.strip()
    assert log.record(new).parent == ids[2] and log.record(new).fork["source"] == ids[2]
    code, out, _ = run_cli(capsys, "lineage", "ticket", new[:12], "--store", url, "--json")
    chain = json.loads(out)[new]
    assert [(r["step"], r["index"]) for r in chain] == [(1, 0), (2, 1), (3, 2), (3, 2)]
    assert [r["id"] for r in chain] == ids[:3] + [new]


@pytest.mark.parametrize("args, says, rc", [
    (["fork", "ticket", "{id}", "no-such-node", "x"], "prompt-0 ... prompt-3", 1),
    (["fork", "ticket", "ffff0000", "prompt-1", "x"], "caravanserai lineage ticket", 1),
    (["inspect", "ffff0000"], "caravanserai lineage", 1),
    (["inspect", "ffff0000", "--run", "ticket"], "caravanserai lineage ticket", 1),
    (["lineage", "ticket", "ffff0000"], "caravanserai lineage ticket", 1),
    (["inspect", "job.ckpt"], "neither a checkpoint file nor", 1),
    # bad usage (UsageError) exits 2
    (["fork", "ticket", "{id}", "prompt-1", "5", "--json-value"], "takes a str", 2),
    (["fork", "ticket", "{id}", "step-1", "[1,", "--json-value"], "not JSON", 2),
    (["inspect", "abc"], "at least 4", 2),
])
def test_cli_errors_are_one_line_and_nothing_is_written(capsys, cli_log, args, says, rc):
    url, log, ids = cli_log
    assert not any(cid.startswith("ffff0000") for cid in ids)
    before = snapshot(log.store)
    code, out, err = run_cli(capsys, *[a.replace("{id}", ids[1][:12]) for a in args], "--store", url)
    assert code == rc and out == ""
    assert err.count("\n") == 1 and err.startswith("caravanserai: error: ") and says in err, err
    assert snapshot(log.store) == before


def test_diff_and_timelines_number_steps_from_1(capsys, cli_log):
    url, log, ids = cli_log
    alt = log.fork(ids[3], "prompt-2", "draft two fixes", new_run_id="ticket-alt")
    steps = timeline("ticket", url)
    assert [(s.step, s.label) for s in steps] == [(1, "step 1"), (2, "step 2"), (3, "step 3"), (4, "step 4")]
    result = compare(("ticket", steps), ("ticket-alt", timeline("ticket-alt", url)))
    assert result.shared_prefix == 2 and result.first_divergence == 3
    assert [s["step"] for s in result.steps] == [1, 2, 3, 4]
    code, out, _ = run_cli(capsys, "diff", "ticket", "ticket-alt", "--store", url, "--all")
    assert code == 0 and "first divergence at step 3" in out and "shared prefix 2 step(s)" in out
    assert f"  ticket = ticket@{ids[-1][:12]} (main line)" in out  # which checkpoint a plain RUN stands for
    rows = [line.split()[:3] for line in out.splitlines() if line.lstrip().startswith(("= step", "≠ step"))]
    assert rows == [["=", "step", "1"], ["=", "step", "2"], ["≠", "step", "3"], ["≠", "step", "4"]]
    assert CheckpointLog(log.store, "ticket-alt").record(alt).parent == ids[3]


# ---- 6. run status from the journal ---------------------------------------------------------
def test_committed_events_carry_steps_and_log_status_reads_them():
    store = fresh_store()
    log = CheckpointLog(store, "status")
    agent = DurableAgent().begin(PROMPTS)
    assert log_status(read_events("status", store) if "status" in store.list() else []) is None
    first = log.commit(agent.run_until_step(0), step=0)
    second = log.commit(agent.run_until_step(1), parent=first, step=1)
    events = read_events("status", store)
    committed = [e for e in events if e["type"] == "checkpoint_committed"]
    assert [(e["steps"], e["steps_done"]) for e in committed] == [(4, 1), (4, 2)]
    assert log_status(events) == {"checkpoints": 2, "steps": 4, "steps_done": 2, "status": "pending", "latest": second}
    done = log.commit(agent.run_until_step(3), parent=second, step=3)
    assert log_status(read_events("status", store)) == {"checkpoints": 3, "steps": 4, "steps_done": 4,
                                                         "status": "completed", "latest": done}
    # a fork back at step 2 is a branch inside the log: the main line stays completed, the branch is counted
    alt = log.fork(second, "prompt-2", "draft two fixes")
    assert alt != done and log_status(read_events("status", store)) == {
        "checkpoints": 4, "steps": 4, "steps_done": 4, "status": "completed", "latest": done, "branches": 1}


def test_log_status_on_old_or_odd_events():
    assert log_status([]) is None
    assert log_status([{"type": "run_started"}, {"type": "waypoint", "n": 1}]) is None
    old = [{"type": "run_started"}, {"type": "checkpoint_committed", "checkpoint_id": "a" * 64, "step": 0},
           {"type": "checkpoint_committed", "checkpoint_id": "b" * 64, "step": 2}]
    assert log_status(old) == {"checkpoints": 2, "steps": None, "steps_done": 3, "status": "pending",
                               "latest": "b" * 64}
    odd = [{"type": "checkpoint_committed", "steps": "4", "steps_done": None, "step": "x", "checkpoint_id": 5}]
    assert log_status(odd) == {"checkpoints": 1, "steps": None, "steps_done": None, "status": "pending",
                               "latest": None}
    mixed = old + [{"type": "checkpoint_committed", "checkpoint_id": "c" * 64, "steps": 3, "steps_done": 3}]
    assert log_status(mixed)["status"] == "completed"
    assert log_status(old + [{"type": "checkpoint_committed", "checkpoint_id": "d" * 64, "step": 3},
                             mixed[-1], {"type": "checkpoint_committed", "step": 1}]) == {
        "checkpoints": 5, "steps": 3, "steps_done": 2, "status": "pending", "latest": None}

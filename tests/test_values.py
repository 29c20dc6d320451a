"""Typed JSON for notebook values (``caravanserai.values``) and the rule that data never chooses code.

Round trips of ordinary values (no pickle), Hypothesis over nested structures, the class
resolution rules, and forged saved-value entries naming arbitrary callables — for every codec
that names a class, and for a journaled OpenAI response type — refused without calling anything
(a marker file the callable would create must not appear).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import enum
import json
import os
import subprocess
import sys
import textwrap
import types
import typing
import uuid
from decimal import Decimal
from pathlib import Path, PurePosixPath

import pytest
from conftest import need_module
from durable_helpers import rewrite_journal
from hypothesis import given, settings
from hypothesis import strategies as st

import caravanserai
from caravanserai import ClassNotAllowed, JournalCorruptionError, UntrustedPickle, durable, open_store
from caravanserai.journal import dumps
from caravanserai.runs import read_events, values
from caravanserai.runs.snapshots import encode_value


class Colour(enum.Enum):
    RED = "red"
    BLUE = "blue"


class Point(typing.NamedTuple):
    x: int
    y: int


@dataclasses.dataclass
class Reading:
    sensor: str
    at: dt.datetime
    tags: set
    seen: int = dataclasses.field(init=False, default=0)


NAMESPACE = {"Colour": Colour, "Point": Point, "Reading": Reading}


def round_trip(value, namespace=NAMESPACE):
    return values.decode(json.loads(dumps(values.encode(value))), namespace)


def test_ordinary_values_round_trip_with_their_types():
    from zoneinfo import ZoneInfo

    reading = Reading("t1", dt.datetime(2026, 3, 29, 1, 30, tzinfo=ZoneInfo("Europe/Paris")), {"a", "b"})
    reading.seen = 3
    value = {
        1: "int key", (1, "a"): "tuple key", frozenset({2}): "frozenset key", False: "bool key", None: "none key",
        "$t": "a key that looks like a tag", "when": dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc),
        "naive": dt.datetime(2026, 1, 1, 12, 30, 1, 5), "day": dt.date(2026, 2, 3), "clock": dt.time(4, 5, 6, 7),
        "gap": dt.timedelta(days=-1, seconds=5, microseconds=3), "money": Decimal("10.10"), "id": uuid.UUID(int=7),
        "raw": b"\x00\xffdata", "buffer": bytearray(b"xy"), "path": Path("/tmp/x"), "pure": PurePosixPath("a/b"),
        "nan": float("nan"), "inf": float("-inf"), "z": 1 - 2j, "colour": Colour.BLUE, "point": Point(1, 2),
        "reading": reading, "nested": [{"s": {1, 2}}, (3, [4, (5,)])], "big": 2**80,
    }
    back = round_trip(value)
    assert set(back) == set(value)
    for key, original in value.items():
        restored = back[key]
        if key == "nan":
            assert restored != restored
            continue
        assert restored == original and type(restored) is type(original), key
    assert back["reading"].at.tzinfo.key == "Europe/Paris" and back["reading"].seen == 3
    assert type(back["nested"][1][1][1]) is tuple


def test_numpy_and_pandas_values_round_trip():
    np = need_module("numpy")
    pd = need_module("pandas")
    value = {"array": np.arange(6, dtype=np.int16).reshape(2, 3), "scalar": np.float32(1.25),
             "frame": pd.DataFrame({"a": [1, 2], "b": ["x", "y"]}), "series": pd.Series([1.5, 2.5], name="s"),
             "stamp": pd.Timestamp("2026-05-01T12:00:00Z")}
    back = round_trip(value)
    assert np.array_equal(back["array"], value["array"]) and back["array"].dtype == np.int16
    assert back["scalar"] == np.float32(1.25) and back["scalar"].dtype == np.float32
    assert back["frame"].equals(value["frame"]) and back["series"].equals(value["series"])
    assert back["series"].name == "s" and back["stamp"] == value["stamp"]


def test_the_same_set_always_encodes_to_the_same_bytes():
    one = dumps(values.encode({"s": {3, 1, 2, "a", (1, 2)}}))
    two = dumps(values.encode({"s": {(1, 2), "a", 2, 1, 3}}))
    assert one == two


def test_what_typed_json_cannot_hold_is_named():
    gen = (i for i in range(3))
    with pytest.raises(values.Unencodable) as info:
        values.encode({"ok": 1, "bad": [gen]})
    assert "value['bad'][0]" in str(info.value) and "generator" in str(info.value)
    loop: list = []
    loop.append(loop)
    with pytest.raises(values.Unencodable, match="refers back to itself"):
        values.encode(loop)
    with pytest.raises(caravanserai.SerializationError) as info:
        encode_value("gen", gen)
    assert info.value.fields["kind"] == "generator" and "\n" not in str(info.value)


scalars = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False), st.text(max_size=5),
                    st.binary(max_size=5), st.decimals(allow_nan=False, allow_infinity=False, places=3),
                    st.datetimes(timezones=st.one_of(st.none(), st.just(dt.timezone.utc))), st.dates(),
                    st.timedeltas(), st.uuids())
keys = st.one_of(st.integers(), st.text(max_size=4), st.tuples(st.integers(), st.text(max_size=2)), st.booleans())
nested = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.tuples(inner, inner), st.dictionaries(keys, inner, max_size=4),
    st.frozensets(st.integers(), max_size=4), st.sets(st.text(max_size=3), max_size=4)), max_leaves=20)


@settings(max_examples=150, deadline=None)
@given(nested)
def test_nested_values_round_trip_exactly(value):
    back = round_trip(value)
    assert back == value
    assert dumps(values.encode(back)) == dumps(values.encode(value))  # and types too (1 != True in JSON form)


# ---- classes: the namespace, allow_class, defaults -------------------------------------------------
def test_classes_resolve_only_through_the_namespace_the_allow_list_or_the_defaults():
    encoded = json.loads(dumps(values.encode(Point(1, 2))))
    with pytest.raises(ClassNotAllowed) as info:
        values.decode(encoded, {})
    assert "allow_class" in str(info.value) and info.value.code == "class_not_allowed"
    import test_values as module  # a module the namespace holds: its classes resolve by attribute

    assert values.decode(encoded, {"mod": module}) == Point(1, 2)
    caravanserai.allow_class(Point)
    try:
        assert values.decode(encoded, {}) == Point(1, 2)
    finally:
        values._ALLOWED.clear()
    assert "openai.types.chat.chat_completion:ChatCompletion" in values.allowed_classes()


def lookup_traps() -> tuple[types.ModuleType, list[str]]:
    """A module with a lazy ``__getattr__`` and a module-level object with a property, each of which
    records being run (and would hand back a real dataclass): class lookup must run neither."""
    ran: list[str] = []
    module = types.ModuleType("lookup_traps")

    def lazy(name: str):
        ran.append(f"module __getattr__({name})")
        return Reading

    class Holder:
        @property
        def Inner(self):
            ran.append("property Inner")
            return Reading

    module.__getattr__ = lazy  # type: ignore[attr-defined]
    module.obj = Holder()  # type: ignore[attr-defined]
    return module, ran


@pytest.mark.parametrize("ref", ["lookup_traps:Missing", "lookup_traps:sub.Reading", "lookup_traps:obj.Inner",
                                 "lookup_traps:obj.Inner.sensor"])
def test_class_lookup_runs_no_module_getattr_and_no_property(ref, monkeypatch):
    module, ran = lookup_traps()
    monkeypatch.setitem(sys.modules, "lookup_traps", module)
    entry = {"$t": "dataclass", "class": ref, "v": {"sensor": "s", "at": None, "tags": []}}
    with pytest.raises(ClassNotAllowed) as info:
        values.decode(entry, {"traps": module})
    assert "nothing was called" in str(info.value) and ran == []


def test_sdk_stream_types_resolve_by_default_only_as_pydantic_models_of_imported_modules(monkeypatch):
    need_module("openai")
    from openai.types.chat import ChatCompletionChunk

    ref = "openai.types.chat.chat_completion_chunk:ChatCompletionChunk"
    assert values.resolve_class(ref, {}) is ChatCompletionChunk  # a stream chunk saved by a notebook loop
    with pytest.raises(ClassNotAllowed):  # a module of an allowed package that is not imported: nothing imports it
        values.resolve_class("openai.types.not_imported_here:Thing", {})
    fake = types.ModuleType("openai.types.fake_module")
    fake.Plain = type("Plain", (), {})  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "openai.types.fake_module", fake)
    with pytest.raises(ClassNotAllowed):  # not a pydantic model: refused
        values.resolve_class("openai.types.fake_module:Plain", {})


def test_class_lookup_never_imports_a_lazy_submodule(child_env):
    need_module("numpy")
    script = textwrap.dedent("""
        import sys, numpy
        from caravanserai import ClassNotAllowed
        from caravanserai.runs import values
        assert "numpy.f2py" not in sys.modules
        try:
            values.decode({"$t": "dataclass", "class": "numpy:f2py.Foo", "v": {}}, {"np": numpy})
        except ClassNotAllowed:
            pass
        else:
            raise SystemExit("resolved")
        print(sorted(name for name in sys.modules if name.startswith("numpy.f2py")))
    """)
    done = subprocess.run([sys.executable, "-c", script], env=child_env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"  # numpy's module __getattr__ would have imported numpy.f2py


MARKER_CASES = ["typed-dataclass", "typed-pydantic", "typed-enum", "typed-namedtuple", "legacy-dataclass",
                "legacy-pydantic"]


def forged_entry(case: str, marker: Path) -> dict:
    """A saved-variable entry whose class reference names a callable that would create ``marker``."""
    popen = {"args": ["touch", str(marker)]}
    if case == "legacy-dataclass":
        return {"codec": "dataclass", "class": "subprocess:Popen", "data": json.dumps(popen)}
    if case == "legacy-pydantic":
        return {"codec": "pydantic", "class": "builtins:open", "data": json.dumps({"file": str(marker), "mode": "w"})}
    tag = case.removeprefix("typed-")
    body = {"namedtuple": ["touch", str(marker)], "enum": "x"}.get(tag, popen)
    typed = {"$t": tag, "class": "subprocess:Popen", "v": body}
    return {"codec": "typed", "data": json.dumps({"outer": [typed]})}


def save_one(project: Path, run_id: str, store=None) -> tuple[Path, list[dict]]:
    namespace = {"value": {"plain": 1}}
    with durable(run_id, store=store, capture=["value"], namespace=namespace) as run:
        run.checkpoint({}, "saved")
    store = open_store(store)
    return Path(store.url.removeprefix("file://")) / run_id / "journal.jsonl", read_events(run_id, store)


@pytest.mark.parametrize("case", MARKER_CASES)
def test_a_forged_class_reference_calls_nothing(project, case):
    marker = project / "marker"
    path, events = save_one(project, f"forged-{case}")
    for event in events:
        if "names" in event:
            event["names"]["values"]["value"] = forged_entry(case, marker)
    events = [e for e in events if e["type"] != "run_completed"]
    rewrite_journal(path, events)  # the hash chain verifies: only the entry is hostile
    namespace: dict = {"subprocess": subprocess, "open": open}  # reachable, yet never called
    with pytest.raises(ClassNotAllowed) as info:
        with durable(f"forged-{case}", capture=["value"], namespace=namespace):
            pass
    assert "nothing was called" in str(info.value) and "\n" not in str(info.value)
    assert not marker.exists() and "value" not in namespace


def test_a_forged_pickle_from_a_store_that_is_not_private_is_refused(project):
    marker = project / "marker"
    path, events = save_one(project, "forged-pickle")
    payload = b"cos\nsystem\n(S'touch " + str(marker).encode() + b"'\ntR."
    import base64

    for event in events:
        if "names" in event:
            event["names"]["values"]["value"] = {"codec": "pickle", "signature": "0" * 64,
                                                 "data": base64.b64encode(payload).decode()}
    rewrite_journal(path, [e for e in events if e["type"] != "run_completed"])
    os.chmod(path.parent.parent, 0o755)  # readable by others: not this user's private store any more
    with pytest.raises(UntrustedPickle):
        with durable("forged-pickle", capture=["value"], namespace={}):
            pass
    assert not marker.exists()


def test_a_replayed_response_names_no_class_the_sdk_parses_the_recorded_bytes(project):
    """A forged record that names a class (``subprocess:Popen``) replays as the SDK's own type, built
    by the SDK from the recorded bytes: nothing named by the journal is imported or called."""
    openai = need_module("openai")
    from servers.model_api import start

    api = start()
    marker = project / "marker"
    try:
        client = openai.OpenAI(base_url=api.url + "/v1", api_key="x", max_retries=0)
        ask = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "forge"}]}
        with durable("forged-response") as run:
            client.chat.completions.create(**ask)
            run.fail(RuntimeError("stop here"))  # leave the run resumable
        path = Path(open_store(None).url.removeprefix("file://")) / "forged-response" / "journal.jsonl"
        events = read_events("forged-response")
        for event in events:
            if event["type"] == "call_settled":
                event["call"]["response"].update(type="subprocess:Popen", args=["touch", str(marker)])
        rewrite_journal(path, events)
        with durable("forged-response"):
            replayed = client.chat.completions.create(**ask)
        assert isinstance(replayed, openai.types.chat.ChatCompletion) and api.count() == 1 and not marker.exists()
    finally:
        api.stop()


@pytest.mark.parametrize("entry", [
    "not an object", {"codec": 3}, {"codec": "typed"}, {"codec": "typed", "data": "{not json"},
    {"codec": "typed", "data": json.dumps({"$t": "no-such-tag", "v": 1})},
    {"codec": "typed", "data": json.dumps({"$t": "dict", "v": [[[1], 2]]})},
    {"codec": "typed", "data": json.dumps({"$t": "datetime", "v": "yesterday"})},
    {"codec": "ndarray", "data": "!!!"}, {"codec": "json", "object": "0" * 64}, {"codec": "martian", "data": "x"},
])
def test_a_malformed_saved_entry_is_journal_damage_in_one_line(project, entry):
    path, events = save_one(project, "malformed")
    for event in events:
        if "names" in event:
            event["names"]["values"]["value"] = entry
    rewrite_journal(path, [e for e in events if e["type"] != "run_completed"])
    with pytest.raises((JournalCorruptionError, caravanserai.SerializationError)) as info:
        with durable("malformed", capture=["value"], namespace={}):
            pass
    assert "\n" not in str(info.value)

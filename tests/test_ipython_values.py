"""Notebook variables across a restart, in-process (IPython's test shell): which codec saves each
value (JSON forms, DataFrames, ndarrays, dataclasses, pickle only when signed by a trusted key or from a trusted store),
refusals for classes the notebook does not hold, and the status line naming what was pickled or left
out. Shared setup: ``ipython_helpers``; the cell/restart/fork behaviour is in test_ipython_ext.py.
"""

from __future__ import annotations

import os
import textwrap
from pathlib import Path

import pytest
from conftest import has_module, need
from ipython_helpers import (  # skips the module without IPython
    Box,
    Tag,
    capture_output,
    events,
    forget,
    fresh_session,
    ip,
    load_extension,
    run,
)

extension = pytest.fixture(scope="module", autouse=True)(load_extension)
session = pytest.fixture(autouse=True)(fresh_session)

from caravanserai import open_store  # noqa: E402 - after the IPython check
from caravanserai.errors import UntrustedPickle  # noqa: E402 - after the IPython check

# ---- notebook state codecs ------------------------------------------------------------------
SAVE_AND_CRASH = """\
%%resumable {run_id}
from caravanserai import checkpoint
value = make()
checkpoint({{}}, "saved")
if crash_at == 0:
    raise RuntimeError("crash")
"""


def save_then_restore(run_id: str, make):
    """Run a cell that saves ``value = make()`` and crashes; forget ``value``; re-run; (original, restored, result)."""
    made: list = []
    ip.user_ns["make"] = lambda: made.append(make()) or made[-1]
    ip.user_ns["crash_at"] = 0
    first, _ = run(SAVE_AND_CRASH.format(run_id=run_id))
    assert isinstance(first.error_in_exec, RuntimeError), first.error_in_exec
    forget("value")
    ip.user_ns["crash_at"] = -1
    second, _ = run(SAVE_AND_CRASH.format(run_id=run_id))
    assert len(made) == 1 or second.error_in_exec is not None  # restored, not made again
    return made[0], ip.user_ns.get("value"), second


def project_store() -> Path:
    return Path(open_store(None).url.removeprefix("file://"))


def test_pickles_load_for_their_author_with_no_trust_configured():
    ip.user_ns["crash_at"] = 0
    ip.user_ns["make"] = lambda: {Tag("own")}
    first, _ = run(SAVE_AND_CRASH.format(run_id="c-own-pickle"))
    assert codec_of("c-own-pickle") == "pickle"
    os.chmod(project_store(), 0o755)  # file modes play no part: the signature does
    forget("value")
    ip.user_ns["crash_at"] = -1
    loaded, _ = run(SAVE_AND_CRASH.format(run_id="c-own-pickle"))
    assert loaded.success, loaded.error_in_exec
    assert ip.user_ns["value"] == {Tag("own")}


def codec_of(run_id: str, name: str = "value") -> str:
    waypoint = next(e for e in events(run_id) if e["type"] == "waypoint")
    return waypoint["names"]["values"][name]["codec"]


def test_dataframe_round_trips_with_dtypes():
    need(has_module("pandas"), "pandas not installed (pip install 'caravanserai[notebook]')")
    import pandas as pd

    def make():
        return pd.DataFrame({
            "n": pd.Series([1, 2, 3], dtype="int64"),
            "x": [1.5, 2.25, -0.5],
            "name": ["a", "b", "c"],
            "ok": [True, False, True],
            "kind": pd.Categorical(["p", "q", "p"]),
            "maybe": pd.array([1, None, 3], dtype="Int64"),
        }, index=pd.Index(["r1", "r2", "r3"], name="row"))

    original, restored, result = save_then_restore("c-frame", make)
    assert result.success, result.error_in_exec
    assert codec_of("c-frame") == "parquet"
    assert restored is not original
    pd.testing.assert_frame_equal(restored, original, check_exact=True)
    assert list(restored.dtypes.astype(str)) == list(original.dtypes.astype(str))


def _frame_cases():
    return {
        "float64-full-precision": ("x", lambda pd, np: [1 / 3, 2 / 3, 0.1 + 0.2]),
        "int32": ("n", lambda pd, np: np.array([1, 2, 3], dtype="int32")),
        "float32": ("f", lambda pd, np: np.array([0.5, 1.5, 2.5], dtype="float32")),
        "datetime-from-to_datetime": ("when", lambda pd, np: pd.to_datetime(["2024-01-01", "2024-02-01", "2024-03-01"])),
        "timedelta": ("took", lambda pd, np: pd.to_timedelta(["1s", "2s", "3s"])),
    }


@pytest.mark.parametrize("case", list(_frame_cases()))
def test_dataframe_round_trip_is_exact_for_common_columns(case: str):
    need(has_module("pandas"), "pandas not installed (pip install 'caravanserai[notebook]')")
    import numpy as np
    import pandas as pd

    column, values = _frame_cases()[case]
    original, restored, result = save_then_restore(f"c-col-{case}", lambda: pd.DataFrame({column: values(pd, np)}))
    assert result.success, f"restoring a DataFrame with a {case} column failed: {result.error_in_exec!r}"
    pd.testing.assert_frame_equal(restored, original, check_exact=True)


def test_ndarray_round_trips_without_pickle():
    need(has_module("numpy"), "numpy not installed")
    import numpy as np

    original, restored, result = save_then_restore("c-array", lambda: np.arange(24, dtype=np.float32).reshape(2, 3, 4) / 7)
    assert result.success, result.error_in_exec
    assert codec_of("c-array") == "ndarray"
    assert restored.dtype == np.float32 and restored.shape == (2, 3, 4)
    assert np.array_equal(restored, original)


def test_dataclass_defined_in_an_earlier_cell_round_trips():
    defined, _ = run("""\
    from dataclasses import dataclass, field

    @dataclass
    class Point:
        x: int
        y: float
        tags: list = field(default_factory=list)
    """)
    assert defined.success
    original, restored, result = save_then_restore("c-dataclass", lambda: ip.user_ns["Point"](3, 0.25, ["a"]))
    assert result.success, result.error_in_exec
    assert codec_of("c-dataclass") == "typed"
    assert type(restored) is ip.user_ns["Point"] and restored == original and restored is not original


def test_imported_dataclass_round_trips_untrusted():
    ip.user_ns["Box"] = Box  # as `from mymodule import Box` in the notebook
    original, restored, result = save_then_restore("c-box", lambda: Box("crate", [1, 2]))
    assert result.success, result.error_in_exec  # not pickle: needs no trust
    assert codec_of("c-box") == "typed" and restored == original


def test_a_class_the_notebook_does_not_hold_is_refused_until_allowed():
    import caravanserai
    from caravanserai.errors import ClassNotAllowed

    ip.user_ns["crash_at"] = 0
    ip.user_ns["make"] = lambda: Box("crate", [1])
    run(SAVE_AND_CRASH.format(run_id="c-unheld"))
    forget("value")
    ip.user_ns["crash_at"] = -1
    refused, _ = run(SAVE_AND_CRASH.format(run_id="c-unheld"))
    assert isinstance(refused.error_in_exec, ClassNotAllowed), refused.error_in_exec
    assert "value" not in ip.user_ns and "allow_class" in str(refused.error_in_exec)
    caravanserai.allow_class(Box)
    try:
        loaded, _ = run(SAVE_AND_CRASH.format(run_id="c-unheld"))
    finally:
        caravanserai.runs.values._ALLOWED.clear()
    assert loaded.success, loaded.error_in_exec
    assert ip.user_ns["value"] == Box("crate", [1])


def test_dataclass_defined_in_the_resumable_cell_itself_round_trips():
    cell = """\
    %%resumable c-own-class
    from dataclasses import dataclass
    from caravanserai import checkpoint

    @dataclass
    class Reading:
        sensor: str
        value: float

    reading = Reading("t1", 21.5)
    checkpoint({}, "saved")
    if crash_at == 0:
        raise RuntimeError("crash")
    reading
    """
    ip.user_ns["crash_at"] = 0
    run(cell)
    forget("reading", "Reading", "dataclass", "checkpoint")  # a restarted kernel has none of these
    ip.user_ns["crash_at"] = -1
    result, _ = run(cell)
    assert result.success, f"resuming a cell whose dataclass is defined in that cell failed: {result.error_in_exec!r}"
    assert repr(result.result) == "Reading(sensor='t1', value=21.5)"


def test_someone_elses_pickle_is_refused_until_their_store_or_key_is_trusted(person, capsys):
    store_url = open_store(None).url
    made = [0]

    def make():
        made[0] += 1
        return {Tag("a"), Tag("b")}

    alice, bob = person("alice"), person("bob")
    person.use(alice)
    ip.user_ns["crash_at"] = 0
    ip.user_ns["make"] = make
    run(SAVE_AND_CRASH.format(run_id="c-pickle"))
    assert codec_of("c-pickle") == "pickle"
    person.use(bob)
    forget("value")
    ip.user_ns["crash_at"] = -1
    refused, _ = run(SAVE_AND_CRASH.format(run_id="c-pickle"))
    error = refused.error_in_exec
    assert isinstance(error, UntrustedPickle), error
    assert error.code == "untrusted_pickle" and error.name == "value" and "a key you do not trust" in str(error)
    assert "value" not in ip.user_ns and made[0] == 1  # nothing loaded, nothing ran

    result, out = run(f"%caravanserai trust {store_url}\n")
    assert result.success
    loaded, _ = run(SAVE_AND_CRASH.format(run_id="c-pickle"))
    assert loaded.success, loaded.error_in_exec
    assert ip.user_ns["value"] == {Tag("a"), Tag("b")} and made[0] == 1


def test_a_trusted_key_loads_its_pickles_and_the_retired_hmac_variable_says_so(person, monkeypatch, capsys):
    from caravanserai import cli, signing

    made = [0]

    def make():
        made[0] += 1
        return {Tag("x")}

    alice, bob = person("alice"), person("bob")
    person.use(alice)
    alice_key = signing.identity().public
    ip.user_ns["make"] = make
    ip.user_ns["crash_at"] = 0
    run(SAVE_AND_CRASH.format(run_id="c-signed"))
    person.use(bob)
    forget("value")
    ip.user_ns["crash_at"] = -1
    assert isinstance(run(SAVE_AND_CRASH.format(run_id="c-signed"))[0].error_in_exec, UntrustedPickle)
    cli.run_command(["trust", "--key", alice_key, "--name", "alice"])
    monkeypatch.setattr(signing, "_warned_retired", False)
    monkeypatch.setenv("CARAVANSERAI_SIGNING_KEY", "an-old-shared-secret")
    signing.identity()
    signing.identity()
    warned = [line for line in capsys.readouterr().err.splitlines() if "CARAVANSERAI_SIGNING_KEY" in line]
    assert len(warned) == 1 and "retired and ignored" in warned[0]  # once, and the old secret changes nothing
    loaded, _ = run(SAVE_AND_CRASH.format(run_id="c-signed"))
    assert loaded.success, loaded.error_in_exec
    assert ip.user_ns["value"] == {Tag("x")} and made[0] == 1


def test_unchanged_large_values_are_not_rewritten_at_each_waypoint(monkeypatch: pytest.MonkeyPatch):
    need(has_module("numpy"), "numpy not installed")
    store = open_store(None)
    objects = store.objects
    writes: list[str] = []
    real = objects.put_if_absent

    def counting(key: str, data: bytes) -> bool:
        writes.append(key)
        return real(key, data)

    monkeypatch.setattr(objects, "put_if_absent", counting)
    cell = """\
    %%resumable c-large
    import numpy as np
    from caravanserai import checkpoint
    big = np.arange(50_000, dtype=np.float64)
    small = 0
    for k in range(6):
        small += 1
        checkpoint({"k": k}, f"commit {k}")
    big = big + 1
    checkpoint({"k": "changed"}, "big changed")
    """
    result, _ = run(cell)
    assert result.success, result.error_in_exec
    stored = objects.list("values/c-large/")
    assert len(stored) == 2  # the original array once, and its changed version once
    assert len(writes) == 2
    waypoints = [e for e in events("c-large") if e["type"] == "waypoint"]
    assert len(waypoints) == 7
    digests = [w["names"]["values"]["big"]["object"] for w in waypoints]
    assert len(set(digests[:6])) == 1 and digests[6] != digests[0]
    assert all(len(str(w["names"])) < 2000 for w in waypoints)  # referenced, not inlined

    forget("big", "small", "k")  # and the big value comes back from the object face
    import numpy as np

    again, _ = run(cell)
    assert again.success and np.array_equal(ip.user_ns["big"], np.arange(50_000, dtype=np.float64) + 1)


def test_the_status_line_names_pickled_and_unsaved_variables_when_they_are_saved():
    ip.user_ns["make"] = lambda: {Tag("t")}
    cell = """\
    %%resumable c-announce
    from caravanserai import checkpoint
    tags = make()
    gen = (i for i in range(3))
    counts = {1: "one", (2, 3): "pair"}
    checkpoint({}, "first commit")
    """
    with capture_output() as captured:
        result = ip.run_cell(textwrap.dedent(cell), store_history=True)
    assert result.success, result.error_in_exec
    said = captured.stderr.splitlines()
    announced = [line for line in said if "c-announce" in line]
    assert len(announced) == 1, said  # said once, at the commit that first saved them
    assert "not saved: gen (generator)" in announced[0] and "pickled: tags" in announced[0]
    assert "counts" not in announced[0]  # int and tuple keys: typed JSON, no pickle
    final = [line for line in captured.stdout.splitlines() if line.startswith("[caravanserai] c-announce")][-1]
    assert "not saved: gen (generator)" in final and "pickled: tags" in final and final.endswith("done")

"""The IPython extension in-process, through IPython's own test shell (``globalipapp``).

One shared terminal-style shell per process: every test works in its own project directory
(default store ``./.caravanserai`` there) and its own run ids, and the names it puts in
``user_ns`` are removed afterwards. A kernel "restart" is simulated by deleting the cell's
names from ``user_ns``; real kernels (SIGKILL, interrupt, nbclient) are in test_kernels.py.
``run_cell`` never raises: the tests look at ``result.error_in_exec`` / ``result.success``.
The loop bodies append to ``log``, a list the cells only mutate (never assign), so it is not
saved or restored and shows exactly which iterations ran in each attempt.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import textwrap
import traceback
from pathlib import Path

import pytest
from conftest import need

if importlib.util.find_spec("IPython") is None:  # the notebook layer is optional; the package imports without it
    if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
        raise ImportError("required for CI but missing: IPython (the [test] extra installs it with ipykernel)")
    pytest.skip("IPython is not installed", allow_module_level=True)

import caravanserai.namespace as namespace  # noqa: E402
from caravanserai.ipython_ext.cell import CellChanged  # noqa: E402
from caravanserai.ipython_ext.transform import FACTORY, WrapCell, cleanup  # noqa: E402
from caravanserai.namespace import UntrustedPickle  # noqa: E402
from IPython.testing.globalipapp import get_ipython  # noqa: E402
from IPython.utils.capture import capture_output  # noqa: E402

from caravanserai import open_store  # noqa: E402
from caravanserai.errors import DefinitionChanged, SerializationError  # noqa: E402
from caravanserai.runs import read_events  # noqa: E402

ip = get_ipython()


class Tag:
    """A custom (non-JSON, non-dataclass) object: a set of these is saved with pickle."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Tag) and other.name == self.name

    def __hash__(self) -> int:
        return hash(self.name)


@dataclasses.dataclass
class Box:  # importable dataclass, used to show the codec is not pickle
    label: str
    sizes: list


@pytest.fixture(scope="module", autouse=True)
def extension():
    ip.run_line_magic("load_ext", "caravanserai")
    yield
    ip.run_line_magic("unload_ext", "caravanserai")


@pytest.fixture(autouse=True)
def session(project: Path, monkeypatch: pytest.MonkeyPatch):
    """A fresh project dir, no trusted stores, no signing key; the test's user_ns names removed after."""
    for var in ("CARAVANSERAI_SIGNING_KEY", "CARAVANSERAI_TRUSTED_STORES"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(namespace, "_TRUSTED", set())
    before = set(ip.user_ns)
    log: list = []
    ip.user_ns["log"] = log
    ip.user_ns["crash_at"] = -1
    yield log
    for name in set(ip.user_ns) - before:
        ip.user_ns.pop(name, None)


def run(code: str):
    """Run one cell as typed; (ExecutionResult, captured stdout)."""
    with capture_output() as captured:
        result = ip.run_cell(textwrap.dedent(code), store_history=True)
    return result, captured.stdout


def forget(*names: str) -> None:
    """What a kernel restart does to the cell's variables."""
    for name in names:
        ip.user_ns.pop(name, None)


def events(run_id: str, store: str | Path | None = None) -> list[dict]:
    return read_events(run_id, open_store(str(store) if store is not None else None))


def types(run_id: str, store: str | Path | None = None) -> list[str]:
    return [e["type"] for e in events(run_id, store)]


LOOP = """\
%%resumable {run_id}{flags}
from caravanserai import checkpoint
total = 0
done = []
for i in range(len(done), 5):
    log.append(i)
    if i == crash_at:
        raise RuntimeError(f"crashed at {{i}}")
    total += i * {factor}
    done.append(i)
    checkpoint({{"i": i}}, f"step {{i}}")
total
"""


def loop(run_id: str, flags: str = "", factor: int = 1) -> str:
    return LOOP.format(run_id=run_id, flags=flags, factor=factor)


# ---- loading and unloading ------------------------------------------------------------------
def test_load_registers_and_unload_removes_everything():
    magics = ip.magics_manager.magics
    assert cleanup in ip.input_transformers_cleanup
    assert sum(isinstance(t, WrapCell) for t in ip.ast_transformers) == 1
    assert "resumable" in magics["cell"] and "caravanserai" in magics["line"]
    assert FACTORY in ip.user_ns
    ordinary, _ = run("x_plain = 6 * 7\nx_plain\n")  # other cells are untouched
    assert ordinary.success and ordinary.result == 42

    ip.run_line_magic("unload_ext", "caravanserai")
    try:
        assert cleanup not in ip.input_transformers_cleanup
        assert not any(isinstance(t, WrapCell) for t in ip.ast_transformers)
        assert "resumable" not in magics["cell"] and "caravanserai" not in magics["line"]
        assert FACTORY not in ip.user_ns
        gone, _ = run("%%resumable r-unloaded\nvalue = 1\n")
        assert not gone.success and "resumable" in str(gone.error_in_exec)
        assert "value" not in ip.user_ns
        line, _ = run("%caravanserai list\n")
        assert not line.success and "caravanserai" in str(line.error_in_exec)
        assert not Path(".caravanserai", "r-unloaded").exists()
    finally:
        ip.run_line_magic("load_ext", "caravanserai")
    from caravanserai.ipython_ext import load_ipython_extension

    load_ipython_extension(ip)  # loading twice registers once
    assert ip.input_transformers_cleanup.count(cleanup) == 1
    assert sum(isinstance(t, WrapCell) for t in ip.ast_transformers) == 1
    back, _ = run("%%resumable r-reloaded\nvalue = 2\nvalue\n")
    assert back.success and back.result == 2


# ---- restart: the cell's names come back, done work is not redone ---------------------------
def test_assigned_names_are_restored_after_a_restart(session):
    log = session
    ip.user_ns["crash_at"] = 3
    first, out = run(loop("r-restore"))
    assert isinstance(first.error_in_exec, RuntimeError) and log == [0, 1, 2, 3]
    assert types("r-restore").count("waypoint") == 3

    forget("total", "done", "i")
    ip.user_ns["crash_at"] = -1
    second, out = run(loop("r-restore"))
    assert second.success, second.error_in_exec
    assert log == [0, 1, 2, 3, 3, 4]  # resumed at the step that crashed; 0-2 not redone
    assert ip.user_ns["done"] == [0, 1, 2, 3, 4] and ip.user_ns["total"] == 10
    assert second.result == 10
    assert "restored done, i, total" in out  # `total = 0` / `done = []` were skipped, not re-run
    saved = [e for e in events("r-restore") if e["type"] == "waypoint"][2]["names"]
    assert set(saved["values"]) == {"total", "done", "i"} and saved["at"] == 3  # the for statement


def test_interrupted_cell_stays_pending_and_resumes(session):
    log = session
    ip.user_ns["stop_at"] = 2
    cell = loop("r-interrupt").replace("if i == crash_at:\n        raise RuntimeError(f\"crashed at {i}\")",
                                       "if i == stop_at:\n        raise KeyboardInterrupt")
    first, _ = run(cell)
    assert isinstance(first.error_in_exec, KeyboardInterrupt)
    assert "run_failed" not in types("r-interrupt")  # Kernel > Interrupt: pending, not failed
    forget("total", "done", "i")
    ip.user_ns["stop_at"] = -1
    second, _ = run(cell)
    assert second.success and second.result == 10 and log == [0, 1, 2, 2, 3, 4]


def test_run_cell_magic_entry_point_resumes_and_raises_the_cells_error(session):
    log = session
    body = loop("r-magic").split("\n", 1)[1]
    ip.user_ns["crash_at"] = 2
    with capture_output():
        with pytest.raises(RuntimeError, match="crashed at 2"):
            ip.run_cell_magic("resumable", "r-magic", body)
    forget("total", "done", "i")
    ip.user_ns["crash_at"] = -1
    with capture_output() as captured:
        ip.run_cell_magic("resumable", "r-magic", body)
    assert log == [0, 1, 2, 2, 3, 4] and ip.user_ns["total"] == 10
    assert "restored done, i, total" in captured.stdout
    assert types("r-magic")[-1] == "run_completed"


# ---- --state -----------------------------------------------------------------------------
def test_state_saves_only_the_named_variables(session):
    log = session
    cell = """\
    %%resumable r-state --state total,done
    from caravanserai import checkpoint
    total = 0
    done = []
    scratch = "not saved"
    for i in range(len(done), 4):
        log.append(i)
        if i == crash_at:
            raise RuntimeError("crash")
        total += i
        done.append(i)
        checkpoint({"i": i}, f"step {i}")
    """
    ip.user_ns["crash_at"] = 2
    run(cell)
    saved = [e["names"]["values"] for e in events("r-state") if e["type"] == "waypoint"]
    assert saved and all(set(s) == {"total", "done"} for s in saved)
    forget("total", "done", "scratch", "i")
    ip.user_ns["crash_at"] = -1
    second, out = run(cell)
    assert second.success, second.error_in_exec
    assert log == [0, 1, 2, 2, 3] and ip.user_ns["total"] == 6 and ip.user_ns["done"] == [0, 1, 2, 3]
    assert "restored done, total" in out
    assert ip.user_ns["scratch"] == "not saved"  # re-run, not restored


@pytest.mark.parametrize("maker", ["threading.Lock()", "(n for n in range(3))"], ids=["lock", "generator"])
def test_state_with_an_unsaveable_variable_raises_at_the_waypoint_naming_it(maker):
    cell = f"""\
    %%resumable r-unsaveable --state total,handle
    import threading
    from caravanserai import checkpoint
    total = 1
    handle = {maker}
    checkpoint({{"total": total}}, "first")
    after = True
    """
    result, _ = run(cell)
    error = result.error_in_exec
    assert isinstance(error, SerializationError), error
    assert "'handle'" in str(error) and error.path == "handle"
    frame = traceback.extract_tb(error.__traceback__)
    assert any(f.lineno == 6 and "checkpoint" in (f.line or "") for f in frame)  # raised at the waypoint line
    assert "after" not in ip.user_ns
    assert types("r-unsaveable").count("waypoint") == 0  # nothing half-written


def test_without_state_an_unsaveable_variable_is_left_out():
    cell = """\
    %%resumable r-skip
    import threading
    from caravanserai import checkpoint
    total = 1
    handle = threading.Lock()
    checkpoint({"total": total}, "first")
    """
    result, _ = run(cell)
    assert result.success, result.error_in_exec
    waypoint = next(e for e in events("r-skip") if e["type"] == "waypoint")
    assert set(waypoint["names"]["values"]) == {"total"}


# ---- resumable_iterate inside a cell -------------------------------------------------------
ITERATE = """\
%%resumable {run_id}
from caravanserai import checkpoint, resumable_iterate
results = []
for item in resumable_iterate(["a", "b", "c", "d"]):
    log.append(item)
    if item == crash_before:
        raise RuntimeError("crash before the waypoint")
    results.append(item.upper())
    checkpoint({{"n": len(results)}}, f"did {{item}}")
    if item == crash_after:
        raise RuntimeError("crash after the waypoint")
results
"""


def test_resumable_iterate_in_a_cell_resumes_with_its_variables(session):
    log = session
    ip.user_ns.update(crash_before="c", crash_after=None)
    run(ITERATE.format(run_id="r-iter"))
    forget("results", "item")
    ip.user_ns.update(crash_before=None)
    result, _ = run(ITERATE.format(run_id="r-iter"))
    assert result.success, result.error_in_exec
    assert log == ["a", "b", "c", "c", "d"] and result.result == ["A", "B", "C", "D"]


def test_a_crash_after_a_waypoint_inside_resumable_iterate_does_not_apply_the_item_twice(session):
    log = session
    ip.user_ns.update(crash_before=None, crash_after="c")  # e.g. a kill after checkpoint(), before the next item
    run(ITERATE.format(run_id="r-iter-wp"))
    forget("results", "item")
    ip.user_ns.update(crash_after=None)
    result, _ = run(ITERATE.format(run_id="r-iter-wp"))
    assert result.success, result.error_in_exec
    assert result.result == ["A", "B", "C", "D"], (
        "variables saved with the waypoint already hold item 'c', but the loop's progress does not count it, "
        f"so the resumed loop applied it again (log {log})")


def test_the_documented_summaries_cell_resumes_after_a_restart(session):
    """docs/notebooks.md's first example keeps each `reply` (an openai ChatCompletion) in a variable."""
    need(_has("openai"), "openai not installed (the [test] extra)")
    from openai.types.chat import ChatCompletion

    made: list = []

    def answer(doc: str) -> ChatCompletion:  # what client.chat.completions.create returns
        made.append(doc)
        return ChatCompletion.model_validate({
            "id": f"c-{doc}", "object": "chat.completion", "created": 1, "model": "m",
            "choices": [{"index": 0, "finish_reason": "stop",
                         "message": {"role": "assistant", "content": f"summary of {doc}"}}]})

    ip.user_ns.update(answer=answer, docs=["d1", "d2", "d3"], crash_on="d3")
    cell = """\
    %%resumable r-docs
    from caravanserai import resumable_iterate
    summaries = {}
    for doc in resumable_iterate(docs):
        if doc == crash_on:
            raise RuntimeError("the kernel died here")
        reply = answer(doc)
        summaries[doc] = reply.choices[0].message.content
    len(summaries)
    """
    run(cell)
    forget("summaries", "reply", "doc")
    ip.user_ns["crash_on"] = None
    result, _ = run(cell)
    assert result.success, f"the documented cell cannot resume in a new kernel: {result.error_in_exec!r}"
    assert result.result == 3 and made == ["d1", "d2", "d3"]
    assert ip.user_ns["summaries"] == {d: f"summary of {d}" for d in ("d1", "d2", "d3")}


# ---- completed runs -------------------------------------------------------------------------
def test_a_completed_run_reshows_its_output_and_value_without_recomputing(session):
    log = session
    cell = """\
    %%resumable r-done
    from caravanserai import checkpoint
    report = []
    for i in range(3):
        log.append(i)
        print(f"working on {i}")
        report.append(i * i)
        checkpoint({"i": i}, f"step {i}")
    {"squares": report, "n": len(report)}
    """
    first, out1 = run(cell)
    assert first.success and log == [0, 1, 2]
    assert first.result == {"squares": [0, 1, 4], "n": 3}
    assert "working on 2" in out1
    journal_before = events("r-done")

    forget("report", "i")
    second, out2 = run(cell)
    assert second.success, second.error_in_exec
    assert log == [0, 1, 2]  # the loop body did not run again
    assert [line for line in out2.splitlines() if line.startswith("working on")] == \
        ["working on 0", "working on 1", "working on 2"]  # the recorded output, re-shown
    assert repr(second.result) == repr({"squares": [0, 1, 4], "n": 3})
    assert "completed earlier" in out2
    assert ip.user_ns["report"] == [0, 1, 4]  # and its variables are back
    assert events("r-done") == journal_before  # nothing appended: not even an attempt


# ---- edited cells: CellChanged, --fork, --restart -------------------------------------------
def test_an_edited_cell_raises_cell_changed_saying_what_changed(session):
    log = session
    ip.user_ns["crash_at"] = 2
    run(loop("r-edit"))
    before = events("r-edit")
    forget("total", "done", "i")
    ip.user_ns["crash_at"] = -1
    log.clear()
    result, _ = run(loop("r-edit", factor=100))
    error = result.error_in_exec
    assert isinstance(error, CellChanged) and isinstance(error, DefinitionChanged)
    assert error.code == "durable_definition_changed"
    message = str(error)
    assert "-    total += i * 1" in message and "+    total += i * 100" in message
    assert "%%resumable r-edit --fork NEW_ID" in message and "%%resumable r-edit --restart" in message
    assert log == [] and "total" not in ip.user_ns  # nothing ran
    assert events("r-edit") == before  # and nothing was written


def test_fork_continues_from_the_last_waypoint_under_a_new_id(session):
    log = session
    ip.user_ns["crash_at"] = 2
    run(loop("r-parent"))
    parent_before = events("r-parent")
    forget("total", "done", "i")
    ip.user_ns["crash_at"] = -1
    log.clear()
    result, out = run(loop("r-parent", flags=" --fork r-child", factor=100))
    assert result.success, result.error_in_exec
    assert log == [2, 3, 4]  # continued at the waypoint after step 1
    assert ip.user_ns["done"] == [0, 1, 2, 3, 4]
    assert ip.user_ns["total"] == 0 + 1 + 200 + 300 + 400  # steps 0-1 from the parent, the rest edited
    assert "restored done, i, total" in out
    child = events("r-child")
    assert child[0]["type"] == "run_started"
    assert child[0]["forked_from"]["run_id"] == "r-parent"
    last_waypoint = [e for e in parent_before if e["type"] == "waypoint"][-1]
    assert last_waypoint["seq"] <= child[0]["forked_from"]["seq"] <= parent_before[-1]["seq"]
    assert child[-1]["type"] == "run_completed"
    assert events("r-parent") == parent_before  # the parent is untouched

    log.clear()  # the fork's cell, run again: completed, nothing recomputed
    again, _ = run(loop("r-parent", flags=" --fork r-child", factor=100))
    assert again.success and log == [] and repr(again.result) == "901"


def test_fork_of_a_restarted_run_continues_from_its_last_waypoint(session):
    log = session
    ip.user_ns["crash_at"] = 1
    run(loop("r-redo"))
    forget("total", "done", "i")
    ip.user_ns["crash_at"] = 3
    run(loop("r-redo", flags=" --restart", factor=10))  # the new attempt gets to step 2, then crashes
    assert [e["type"] for e in events("r-redo")].count("restarted") == 1
    forget("total", "done", "i")
    ip.user_ns["crash_at"] = -1
    log.clear()
    result, out = run(loop("r-redo", flags=" --fork r-redo-fork", factor=1000))
    assert result.success, result.error_in_exec
    assert log == [3, 4], "the fork did not continue from the restarted attempt's last waypoint"
    assert ip.user_ns["done"] == [0, 1, 2, 3, 4]
    assert ip.user_ns["total"] == 0 + 10 + 20 + 3000 + 4000


def test_restart_starts_over_and_keeps_the_old_attempt(session):
    log = session
    ip.user_ns["crash_at"] = 3
    run(loop("r-again"))
    old = events("r-again")
    forget("total", "done", "i")
    ip.user_ns["crash_at"] = -1
    log.clear()
    result, _ = run(loop("r-again", flags=" --restart", factor=10))
    assert result.success, result.error_in_exec
    assert log == [0, 1, 2, 3, 4] and ip.user_ns["total"] == 100
    now = events("r-again")
    assert now[: len(old)] == old  # the old attempt stays in the journal
    assert [e["type"] for e in now[len(old):]][:2] == ["attempt", "restarted"]
    assert now[-1]["type"] == "run_completed"
    log.clear()  # the restarted cell is now the run's definition: re-running it is a completed run
    plain, _ = run(loop("r-again", factor=10))
    assert plain.success and log == [] and repr(plain.result) == "100"


# ---- await, errors, display -----------------------------------------------------------------
def test_top_level_await_works_inside_the_cell(session):
    log = session
    cell = """\
    %%resumable r-await
    import asyncio
    from caravanserai import checkpoint, current_run
    got = []
    for i in range(len(got), 3):
        log.append(i)
        value = await asyncio.sleep(0.001, result=i * 3)
        if i == crash_at:
            raise RuntimeError("crash after await")
        got.append(value)
        checkpoint({"n": len(got)}, f"after await {i}")
    (current_run().run_id, got)
    """
    ip.user_ns["crash_at"] = 1
    first, _ = run(cell)
    assert isinstance(first.error_in_exec, RuntimeError)
    forget("got", "value", "i")
    ip.user_ns["crash_at"] = -1
    second, _ = run(cell)
    assert second.success, second.error_in_exec
    assert second.result == ("r-await", [0, 3, 6]) and log == [0, 1, 1, 2]


def test_an_exception_is_the_cells_error_at_the_users_line():
    cell = """\
    %%resumable r-error
    values = [1, 2]

    def parse(text):
        return int(text)

    parsed = parse("x" + str(values[0]))
    """
    result, out = run(cell)
    error = result.error_in_exec
    assert isinstance(error, ValueError) and "invalid literal" in str(error)
    frames = traceback.extract_tb(error.__traceback__)
    cell_frames = [f for f in frames if f.filename.startswith("<ipython-input-")]
    assert [(f.lineno, f.line) for f in cell_frames] == [(7, 'parsed = parse("x" + str(values[0]))'),
                                                         (5, "return int(text)")]
    failed = events("r-error")[-1]
    assert failed["type"] == "run_failed" and failed["code"] == "ValueError"


def test_the_last_expression_is_displayed_and_a_statement_shows_nothing():
    shown, _ = run("%%resumable r-show\nitems = [3, 1, 2]\nsorted(items)\n")
    assert shown.success and shown.result == [1, 2, 3]
    silent, _ = run("%%resumable r-silent\nitems = [3, 1, 2]\nitems.sort()\n")
    assert silent.success and silent.result is None and ip.user_ns["items"] == [1, 2, 3]


# ---- %caravanserai --------------------------------------------------------------------------
def test_caravanserai_line_magic_list_show_store_trust_clean(project: Path, monkeypatch: pytest.MonkeyPatch):
    run("%%resumable m-one\nfrom caravanserai import checkpoint\nx = 1\ncheckpoint({'x': x}, 'first note')\n")
    result, out = run("%caravanserai list\n")
    assert result.success and out.startswith("m-one\t1 waypoint(s)") and "completed" in out

    result, out = run("%caravanserai show m-one\n")
    assert result.success and "waypoint 1" in out and "first note" in out and '"x": 1' in out

    other = project / "elsewhere"
    monkeypatch.setenv("CARAVANSERAI_STORE", str(project / "unused"))  # restored after the test
    result, out = run(f"%caravanserai store {other}\n")
    assert result.success and f"file://{other}" in out
    assert os.environ["CARAVANSERAI_STORE"] == f"file://{other}"
    result, out = run("%caravanserai store\n")
    assert out.strip() == f"file://{other}"
    run("%%resumable m-two\nfrom caravanserai import checkpoint\ny = 2\ncheckpoint({'y': y}, 'second')\n")
    assert types("m-two", other)[-1] == "run_completed"  # the new default store
    result, out = run("%caravanserai list\n")
    assert "m-two" in out and "m-one" not in out

    result, out = run(f"%caravanserai trust {other}\n")
    assert result.success and namespace.trusted(f"file://{other}")
    assert not namespace.trusted(f"file://{project / '.caravanserai'}")

    result, out = run("%caravanserai clean m-two\n")
    assert result.success and "deleted" in out and events("m-two", other) == []
    result, out = run("%caravanserai list\n")
    assert "m-two" not in out


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


def test_pickles_load_without_trust_from_this_users_private_store():
    ip.user_ns["crash_at"] = 0
    ip.user_ns["make"] = lambda: {Tag("own")}
    first, _ = run(SAVE_AND_CRASH.format(run_id="c-own-pickle"))
    assert codec_of("c-own-pickle") == "pickle"
    assert oct(project_store().stat().st_mode & 0o777) == "0o700"
    forget("value")
    ip.user_ns["crash_at"] = -1
    loaded, _ = run(SAVE_AND_CRASH.format(run_id="c-own-pickle"))
    assert loaded.success, loaded.error_in_exec
    assert ip.user_ns["value"] == {Tag("own")}


def codec_of(run_id: str, name: str = "value") -> str:
    waypoint = next(e for e in events(run_id) if e["type"] == "waypoint")
    return waypoint["names"]["values"][name]["codec"]


def test_dataframe_round_trips_with_dtypes():
    need(_has("pandas"), "pandas not installed (pip install 'caravanserai[notebook]')")
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
    need(_has("pandas"), "pandas not installed (pip install 'caravanserai[notebook]')")
    import numpy as np
    import pandas as pd

    column, values = _frame_cases()[case]
    original, restored, result = save_then_restore(f"c-col-{case}", lambda: pd.DataFrame({column: values(pd, np)}))
    assert result.success, f"restoring a DataFrame with a {case} column failed: {result.error_in_exec!r}"
    pd.testing.assert_frame_equal(restored, original, check_exact=True)


def test_ndarray_round_trips_without_pickle():
    need(_has("numpy"), "numpy not installed")
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


def test_pickled_value_from_an_untrusted_store_is_refused_until_trusted():
    store_url = open_store(None).url
    made = [0]

    def make():
        made[0] += 1
        return {Tag("a"), Tag("b")}

    ip.user_ns["crash_at"] = 0
    ip.user_ns["make"] = make
    run(SAVE_AND_CRASH.format(run_id="c-pickle"))
    assert codec_of("c-pickle") == "pickle"
    os.chmod(project_store(), 0o750)  # no longer private to this user: pickles need trust
    forget("value")
    ip.user_ns["crash_at"] = -1
    refused, _ = run(SAVE_AND_CRASH.format(run_id="c-pickle"))
    error = refused.error_in_exec
    assert isinstance(error, UntrustedPickle), error
    assert error.code == "untrusted_pickle" and error.name == "value" and store_url in str(error)
    assert "value" not in ip.user_ns and made[0] == 1  # nothing loaded, nothing ran

    result, out = run(f"%caravanserai trust {store_url}\n")
    assert result.success
    loaded, _ = run(SAVE_AND_CRASH.format(run_id="c-pickle"))
    assert loaded.success, loaded.error_in_exec
    assert ip.user_ns["value"] == {Tag("a"), Tag("b")} and made[0] == 1


def test_signed_pickles_load_with_the_key_and_not_without(monkeypatch: pytest.MonkeyPatch):
    made = [0]

    def make():
        made[0] += 1
        return {Tag("x")}

    monkeypatch.setenv("CARAVANSERAI_SIGNING_KEY", "first-key")
    ip.user_ns["make"] = make
    ip.user_ns["crash_at"] = 0
    run(SAVE_AND_CRASH.format(run_id="c-signed"))
    os.chmod(project_store(), 0o750)  # no longer private to this user: pickles need trust or a signature
    forget("value")
    ip.user_ns["crash_at"] = -1
    monkeypatch.setenv("CARAVANSERAI_SIGNING_KEY", "another-key")
    wrong, _ = run(SAVE_AND_CRASH.format(run_id="c-signed"))
    assert isinstance(wrong.error_in_exec, UntrustedPickle)
    monkeypatch.delenv("CARAVANSERAI_SIGNING_KEY")
    unsigned, _ = run(SAVE_AND_CRASH.format(run_id="c-signed"))
    assert isinstance(unsigned.error_in_exec, UntrustedPickle)
    monkeypatch.setenv("CARAVANSERAI_SIGNING_KEY", "first-key")
    loaded, _ = run(SAVE_AND_CRASH.format(run_id="c-signed"))
    assert loaded.success, loaded.error_in_exec
    assert ip.user_ns["value"] == {Tag("x")} and made[0] == 1


def test_unchanged_large_values_are_not_rewritten_at_each_waypoint(monkeypatch: pytest.MonkeyPatch):
    need(_has("numpy"), "numpy not installed")
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


def _has(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


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

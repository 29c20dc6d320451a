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

import os
import traceback
from pathlib import Path

import pytest
from conftest import has_module, need
from ipython_helpers import (  # skips the module without IPython
    capture_output,
    events,
    forget,
    fresh_session,
    ip,
    load_extension,
    run,
    types,
)

extension = pytest.fixture(scope="module", autouse=True)(load_extension)
session = pytest.fixture(autouse=True)(fresh_session)

from caravanserai.ipython_ext.cell import CellChanged  # noqa: E402 - after the IPython check
from caravanserai.ipython_ext.transform import FACTORY, WrapCell, cleanup  # noqa: E402 - after the IPython check

import caravanserai.runs.trust as trust  # noqa: E402 - after the IPython check
from caravanserai.errors import DefinitionChanged, SerializationError  # noqa: E402 - after the IPython check

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
    need(has_module("openai"), "openai not installed (the [test] extra)")
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


FORGED_BUNDLE = {"text/plain": "42", "text/html": "<script>document.title = 'pwned'</script>",
                 "application/javascript": "document.title = 'pwned'", "image/svg+xml": "<svg onload='alert(1)'/>",
                 "text/markdown": "<img src=x onerror=alert(1)>", "image/png": "iVBORw0KGgo="}


def test_a_completed_cell_reshows_active_formats_only_when_signed_by_a_trusted_key(session, project, monkeypatch):
    """A forged run_completed event's display bundle: with the writer's signature kept it is refused
    (SignatureInvalid, private store or not); unsigned, only text/plain and raster images come back,
    unless the store is trusted explicitly."""
    from durable_helpers import rewrite_journal

    from caravanserai.errors import SignatureInvalid

    cell = "%%resumable r-forged\nanswer = 6 * 7\nanswer\n"
    first, _ = run(cell)
    assert first.success and first.result == 42
    store_dir = project / ".caravanserai"
    recorded = events("r-forged")

    def forge(keep_signature: bool) -> None:
        for event in recorded:
            if event["type"] == "run_completed":
                event["result"]["display"] = dict(FORGED_BUNDLE)
                if not keep_signature:
                    event["result"].pop("display_signed", None)
        rewrite_journal(store_dir / "r-forged" / "journal.jsonl", recorded)  # the chain verifies: only the bundle is hostile

    def reshown():
        forget("answer")
        again, _ = run(cell)
        return again.error_in_exec or ip.display_formatter.format(again.result)[0]

    forge(keep_signature=True)
    refused = reshown()
    assert isinstance(refused, SignatureInvalid) and refused.code == "signature_invalid" and "r-forged" in str(refused)
    forge(keep_signature=False)
    assert reshown() == {"text/plain": "42", "image/png": "iVBORw0KGgo="}
    monkeypatch.setenv("CARAVANSERAI_TRUSTED_STORES", f"file://{store_dir}")
    assert reshown() == FORGED_BUNDLE  # trusted explicitly: the user vouched for everything in it


def test_a_completed_cell_reshows_its_signed_rich_output_in_full(session, monkeypatch):
    monkeypatch.setattr(ip.display_formatter, "active_types", [*ip.display_formatter.active_types, "text/html"])
    cell = "%%resumable r-rich\nclass Rich:\n    def _repr_html_(self):\n        return '<b>bold</b>'\nRich()\n"
    first, _ = run(cell)
    assert first.success, first.error_in_exec
    done = next(e for e in events("r-rich") if e["type"] == "run_completed")
    assert done["result"]["display"]["text/html"] == "<b>bold</b>" and done["result"]["display_signed"]["key"]
    again, _ = run(cell)
    assert ip.display_formatter.format(again.result)[0]["text/html"] == "<b>bold</b>"


def test_a_completed_cell_signed_by_someone_else_reshows_inert(session, monkeypatch, person):
    monkeypatch.setattr(ip.display_formatter, "active_types", [*ip.display_formatter.active_types, "text/html"])
    cell = "%%resumable r-theirs\nclass Rich:\n    def _repr_html_(self):\n        return '<b>bold</b>'\nRich()\n"
    person.use(person("alice"))
    first, _ = run(cell)
    assert first.success, first.error_in_exec
    person.use(person("bob"))  # a valid signature, by a key bob does not trust
    again, _ = run(cell)
    assert "text/html" not in ip.display_formatter.format(again.result)[0]


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
    assert result.success and trust.store_trusted(f"file://{other}")
    assert not trust.store_trusted(f"file://{project / '.caravanserai'}")

    result, out = run("%caravanserai clean m-two\n")
    assert result.success and "deleted" in out and events("m-two", other) == []
    result, out = run("%caravanserai list\n")
    assert "m-two" not in out

"""Timelines compared, forks resumed, the fork tree and the offline export — the core under the fork panels.

``CheckpointLog.resume`` runs a head's pending steps and commits them with per-step usage (a
stop or an error commits what was computed); ``timeline`` carries each step's tokens and seconds,
a fork's reused steps keeping the figures of the run that computed them; ``compare`` finds the
shared prefix and the first divergence of two or more timelines; ``word_diff`` marks changed
words; ``lineage`` is the fork tree of runs and of branches inside one log; ``caravanserai diff``
and ``caravanserai export`` print and write them. The panels' sources (``caravanserai.panels``)
fold the shared prefix, jump to the divergence and refuse bad forks writing nothing.
"""

from __future__ import annotations

import json
import re
import threading
from pathlib import Path

import pytest
from agent_helpers import logged_run, store_bytes
from hypothesis import given
from hypothesis import strategies as st

import caravanserai
from caravanserai import DurableAgent, durable, open_store
from caravanserai.calls import pricing
from caravanserai.calls.pricing import register_price
from caravanserai.checkpoints import CheckpointLog
from caravanserai.checkpoints.lineage import lineage
from caravanserai.checkpoints.timelines import compare, step_text, timeline, word_diff
from caravanserai.cli import main
from caravanserai.errors import CheckpointCorruptionError, NoSuchWaypoint, RunExists, RunNotFound, UsageError
from caravanserai.panels import CompareSource, LineageSource, StepsSource, TimelineSource
from caravanserai.panels.export import render_html, source_data, write_html
from caravanserai.panels.steps import ForkJob, fork_step
from caravanserai.testing import ScriptedModel

PROMPTS = ["pull the ticket", "reproduce the bug", "draft a fix", "open the PR", "write the changelog"]




@pytest.fixture
def store(project):
    return open_store()


# ---- resume: commits with usage; a stop or an error keeps what was computed -------------------------
def test_resume_commits_every_step_with_its_usage(store):
    log = CheckpointLog(store, "r")
    head = log.commit(DurableAgent().begin(PROMPTS).checkpoint())
    progress = log.resume(head, commit_every=0)
    assert progress.done and progress.computed == 5 and progress.reused == 0 and progress.commits == 5
    committed = [e for e in store.events("r") if e["type"] == "checkpoint_committed"]
    assert [e["usage"][0]["index"] for e in committed[1:]] == [0, 1, 2, 3, 4]
    assert sum(e["usage"][0]["tokens"] for e in committed[1:]) == progress.tokens > 0
    steps = timeline("r", store)
    assert [s.tokens for s in steps] == [e["usage"][0]["tokens"] for e in committed[1:]]
    assert all(s.latency_s is not None and s.latency_s >= 0 for s in steps)
    assert log.resume().computed == 0  # nothing pending: nothing recomputed


def test_a_stop_or_an_error_commits_what_was_computed(store):
    log = CheckpointLog(store, "s")
    head = log.commit(DurableAgent().begin(PROMPTS).checkpoint())
    stop = threading.Event()

    def stop_after_two(progress):
        if progress.computed == 2:
            stop.set()

    stopped = log.resume(head, stop=stop, on_progress=stop_after_two, commit_every=3600)
    assert stopped.stopped and stopped.steps_done == 2 and stopped.commits == 1

    def fail_at_three(progress):
        if progress.steps_done == 3:
            raise RuntimeError("the kernel was interrupted")

    with pytest.raises(RuntimeError):
        log.resume(stopped.head, on_progress=fail_at_three, commit_every=3600)
    rest = log.resume()  # the newest head: step 3 was committed before the error propagated
    assert rest.reused == 3 and rest.computed == 2 and rest.done
    assert DurableAgent.outputs_of(log.load(rest.head)) == DurableAgent().begin(PROMPTS).resume_from(
        DurableAgent().begin(PROMPTS).checkpoint())


# ---- timelines and compare ------------------------------------------------------------------------
def test_a_fork_reuses_the_parents_steps_and_figures(store):
    log = logged_run(store, "ticket", PROMPTS)
    parent_steps = timeline("ticket", store)
    source = StepsSource(log)
    source.poll()
    forked = fork_step(source, 3, "draft two fixes")
    assert forked.run_id == "ticket-fork-3" and forked.reused == 2
    assert forked.tokens_reused == sum(s.tokens for s in parent_steps[:2])
    job = ForkJob(store, forked).start()
    job.thread.join(30)
    assert job.status["state"] == "done" and job.status["computed"] == 3 and job.status["steps_done"] == 5
    child = timeline("ticket-fork-3", store)
    assert [s.value for s in child[:2]] == [s.value for s in parent_steps[:2]]
    assert [(s.tokens, s.latency_s) for s in child[:2]] == [(s.tokens, s.latency_s) for s in parent_steps[:2]]
    assert child[2].prompt == "draft two fixes" and child[2].value != parent_steps[2].value
    result = compare(("ticket", parent_steps), ("ticket-fork-3", child))
    assert (result.shared_prefix, result.first_divergence) == (2, 3)
    assert [s["same"] for s in result.steps] == [True, True, False, False, False]
    cell = result.steps[2]["cells"][1]
    assert cell["d_tokens"] == cell["tokens"] - result.steps[2]["cells"][0]["tokens"]


def test_waypoint_timelines_carry_calls_cost_and_compare_three_ways(store, monkeypatch):
    monkeypatch.setattr(pricing, "_PRICES", dict(pricing._PRICES))  # the price below stays in this test
    register_price("scripted", 1.0, 2.0)
    for run_id, answers in (("a", ["x", "y", "z"]), ("b", ["x", "y", "w"]), ("c", ["x", "q", "z"])):
        with durable(run_id) as run:
            for step, answer in enumerate(answers):
                run.call_model(ScriptedModel([answer]), [{"role": "user", "content": f"q{step}"}])
                run.checkpoint({"answer": answer}, f"step {step}")
    steps = timeline("a", store)
    assert [s.step for s in steps] == [1, 2, 3] and steps[0].value == {"answer": "x"} and steps[0].note == "step 0"
    assert all(s.tokens and s.usd and s.usd > 0 for s in steps)
    result = compare(*((r, timeline(r, store)) for r in ("a", "b", "c")))
    assert (result.shared_prefix, result.first_divergence) == (1, 2)
    assert [s["same"] for s in result.steps] == [True, False, False]
    assert result.totals()[0]["usd"] == pytest.approx(sum(s.usd for s in steps))


def test_compare_of_timelines_of_different_lengths():
    from caravanserai.checkpoints.timelines import Step

    short = [Step(1, "s", "a"), Step(2, "s", "b")]
    long = [*short, Step(3, "s", "c")]
    result = compare(("short", short), ("long", long))
    assert (result.shared_prefix, result.first_divergence) == (2, 3)
    assert result.steps[2]["cells"][0] is None and result.steps[2]["values"] == [None, "c"]
    same = compare(("x", short), ("y", list(short)))
    assert (same.shared_prefix, same.first_divergence) == (2, None)


@given(st.text(max_size=60), st.text(max_size=60))
def test_word_diff_rebuilds_both_texts(old, new):
    ops = word_diff(old, new)
    assert "".join(t for op, t in ops if op != "+") == old
    assert "".join(t for op, t in ops if op != "-") == new
    assert all(text for _, text in ops)


def test_word_diff_marks_words_and_step_text_shows_tokens():
    assert word_diff("draft a fix", "draft two fixes") == [("=", "draft "), ("-", "a"), ("+", "two"), ("=", " "),
                                                            ("-", "fix"), ("+", "fixes")]
    assert step_text([1, 2, 3]) == "1 2 3" and step_text({"b": 1, "a": 2}) == '{"a": 2, "b": 1}' and step_text(None) == ""


# ---- lineage --------------------------------------------------------------------------------------
def test_lineage_of_run_forks_log_forks_and_branches_inside_a_log(store):
    log = logged_run(store, "ticket", PROMPTS)
    head = log.newest_head()
    log.fork(head, "prompt-2", "draft two fixes", new_run_id="alt")
    branch = log.fork(head, "prompt-3", "open a draft PR")  # a branch inside ticket's own log
    CheckpointLog(store, "alt").fork(CheckpointLog(store, "alt").newest_head(), "prompt-4", "no changelog",
                                     new_run_id="alt-2")
    with durable("plain") as run:
        run.checkpoint({"n": 1}, "one")
        run.checkpoint({"n": 2}, "two")
    caravanserai.fork("plain", at=1, new_run_id="plain-what-if", state={"n": 10})
    nodes = lineage("alt-2", store)  # from any member: the whole family, root first
    assert [(n.id, n.depth, n.parent) for n in nodes] == [
        ("ticket", 0, None), ("alt", 1, "ticket"), ("alt-2", 2, "alt"), (f"ticket@{branch[:12]}", 1, "ticket")]
    alt = nodes[1]
    assert (alt.point, alt.point_kind, alt.edit) == (3, "step", "step 3 prompt → draft two fixes")
    assert nodes[3].kind == "branch" and nodes[3].edit == "step 4 prompt → open a draft PR" and nodes[3].head == branch
    plain = lineage("plain", store)
    assert [(n.id, n.point, n.edit) for n in plain] == [("plain", None, ""),
                                                        ("plain-what-if", 1, "state edited at waypoint 1")]
    source = LineageSource(log)
    assert source.poll() and not source.poll()  # nothing new: nothing rebuilt
    refs = {row["id"]: row["ref"] for row in source.rows(0, source.count())}
    assert refs["ticket"] == f"ticket@{head[:12]}" and refs["alt"] == "alt"  # the main line named where a log branched


# ---- the panels' sources ---------------------------------------------------------------------------
def test_compare_source_folds_the_prefix_and_jumps_to_the_divergence(store):
    prompts = [f"step {i}" for i in range(40)]
    log = logged_run(store, "long", prompts)
    log.fork(log.newest_head(), "prompt-29", "step 29, differently", new_run_id="long-alt")
    CheckpointLog(store, "long-alt").resume()
    source = CompareSource(["long", "long-alt"], store)
    assert source.poll()
    assert source.summary()["first_divergence"] == 30 and source.summary()["shared_prefix"] == 29
    rows = source.rows(0, source.count())
    assert rows[0] == {"kind": "shared", "first": 1, "last": 29, "count": 29}
    jump = source.traits()["jump"]
    assert jump == 1 and rows[jump]["step"] == 30 and rows[jump]["first"] and not rows[jump]["same"]
    assert any(op == "+" for op, _ in rows[jump]["cells"][1]["text"]) and rows[jump]["cells"][1]["prompt_changed"]
    detail = source.detail(jump)
    assert "first divergence" in detail["title"]
    assert ["+", ", differently"] in detail["columns"][1]["prompt"]
    source.set_option("fold", False)
    assert source.count() == 40 and source.traits()["jump"] == 29
    source.set_option("only_diff", True)
    assert source.count() == 11 and source.traits()["jump"] == 0
    with pytest.raises(UsageError):
        CompareSource(["long"], store)


def test_timeline_source_shows_checkpoint_commits_and_the_fork(store):
    log = logged_run(store, "ticket", PROMPTS)
    log.fork(log.newest_head(), "prompt-1", "reproduce it twice", new_run_id="again")
    CheckpointLog(store, "again").resume()
    source = TimelineSource("again", store)
    source.poll()
    rows = source.rows(0, source.count())
    assert [r["kind"] for r in rows] == ["attempt", "commit", "commit"]
    assert rows[0]["end"] == "log" and rows[1]["fork"] == "step 2 prompt edited" and rows[1]["fork_step"] == 2
    assert rows[2]["steps_done"] == 5 and rows[2]["computed"] == 4 and rows[2]["tokens"] > 0
    assert source.summary()["parent"] == "ticket" and source.summary()["steps"] == 5


@pytest.mark.parametrize("case", ["no such step", "existing run", "bad json", "corrupt log", "no such waypoint"])
def test_bad_forks_from_the_panel_write_nothing(project, store, case):
    log = logged_run(store, "ticket", PROMPTS)
    with durable("plain") as run:
        run.checkpoint({"n": 1}, "one")
    if case == "corrupt log":
        record = next((project / ".caravanserai" / ".objects").rglob("records/*.json"))
        record.write_bytes(record.read_bytes().replace(b'"kind":', b'"kinds":'))
    source = StepsSource("plain" if case in ("bad json", "no such waypoint") else log)
    if case != "corrupt log":
        source.poll()
    before = store_bytes(project / ".caravanserai")
    calls = {"no such step": (lambda: fork_step(source, 9, "x"), NoSuchWaypoint),
             "existing run": (lambda: fork_step(source, 2, "x", new_run_id="plain"), RunExists),
             "bad json": (lambda: fork_step(source, 1, "{not json"), UsageError),
             "corrupt log": (lambda: source.poll() and fork_step(source, 2, "x"), CheckpointCorruptionError),
             "no such waypoint": (lambda: fork_step(source, 5, "{}"), NoSuchWaypoint)}
    call, error = calls[case]
    with pytest.raises(error) as info:
        call()
    assert "\n" not in info.value.message and info.value.code
    assert store_bytes(project / ".caravanserai") == before


# ---- CLI: diff and export -------------------------------------------------------------------------
def test_cli_diff_folds_the_prefix_and_word_diffs_the_first_divergence(store, capsys):
    log = logged_run(store, "ticket", PROMPTS)
    tip = log.newest_head()
    branch = log.fork(tip, "prompt-2", "draft two fixes")
    CheckpointLog(store, "ticket").resume(branch)
    log.fork(log.newest_head(), "prompt-3", "open a draft PR", new_run_id="other")
    assert main(["diff", "ticket@" + tip[:12], "ticket@" + log.newest_head()[:12]]) == 0
    out = capsys.readouterr().out
    assert "shared prefix 2 step(s), first divergence at step 3" in out
    assert "= steps 1-2 identical (folded; --all shows them)" in out
    assert "prompt: draft [-a-]{+two+} [-fix-]{+fixes+}" in out
    assert re.search(r"≠ step +3 .*<- first divergence", out)
    assert main(["diff", "ticket", "other", "--only-diff", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    # "ticket" is its main line's head; "other" was forked from the in-log branch, whose step 3 prompt differs
    assert report["first_divergence"] == 3 and report["totals"][1]["run"] == "other"
    assert main(["diff", "ticket"]) == 2 and "two timelines" in capsys.readouterr().err


def test_cli_export_writes_one_offline_file(project, store, capsys):
    log = logged_run(store, "ticket", PROMPTS)
    log.fork(log.newest_head(), "prompt-2", "draft two fixes", new_run_id="alt")
    CheckpointLog(store, "alt").resume()
    assert main(["export", "ticket", "alt", "--html", "out/report.html"]) == 0
    text = (project / "out" / "report.html").read_text(encoding="utf-8")
    payload = json.loads(re.search(r'<script type="application/json" id="cvs-data">(.*?)</script>', text, re.S).group(1))
    assert [p["panel"] for p in payload["panels"]] == ["timeline", "timeline", "lineage", "compare"]
    compare_panel = payload["panels"][3]
    assert compare_panel["summary"]["first_divergence"] == 3 and set(compare_panel["variants"]) == {
        "[false,true]", "[false,false]", "[true,true]", "[true,false]"}
    assert "export default" in payload["js"] and "<" not in text.split('id="cvs-data">')[1].split("</script>")[0]
    assert not re.search(r'(src|href)="https?:', text) and "default-src 'none'" in text
    assert main(["export", "nobody", "--html", "out/nobody.html"]) == 1
    assert "run 'nobody'" in capsys.readouterr().err and not (project / "out" / "nobody.html").exists()


def test_export_shares_rows_between_settings_and_escapes_markup(store):
    with durable("markup") as run:
        for i in range(3):
            run.checkpoint({"i": i}, "</script><img src=x onerror=alert(1)> **bold**")
    source = TimelineSource("markup", store)
    source.poll()
    data = source_data(source)
    assert set(data["variants"]) == {"[true]", "[false]"} and len(data["row_pool"]) < 2 * source.count()
    page = render_html([source])
    embedded = page.split('id="cvs-data">', 1)[1].split("</script>", 1)[0]
    assert "<" not in embedded  # every < of the data is \\u003c: the data cannot close its script
    assert json.loads(embedded)["panels"][0]["row_pool"][1]["note"].startswith("</script>")
    with pytest.raises(RunNotFound):
        TimelineSource("nobody", store).poll()
    assert write_html("page/markup.html", [source]) == "page/markup.html" and Path("page/markup.html").stat().st_size

"""DurableAgent outputs a person can read, and a log's main line.

The ``text`` backend (``model_id="text"``): deterministic readable English from the step's prompt
and the previous output, with the fake backend's per-token KV cache, so checkpoints, deltas, forks
and reuse work as they do there. ``caravanserai list``/``show``/the read model report a log's
main line (not a branch forked inside it, even one committed last) with its branches counted;
``timeline``/``diff`` compare the main line's head and say which checkpoint; a fork made with
``caravanserai fork ... --new-run NEW`` runs to the end with ``caravanserai resume NEW``.
"""

from __future__ import annotations

import json
import re
import subprocess
import uuid

import pytest
from conftest import PYTHON

import caravanserai
from caravanserai import DurableAgent
from caravanserai.checkpoints import CheckpointLog, log_status
from caravanserai.checkpoints.agent import FakeBackend, decode_checkpoint
from caravanserai.checkpoints.format import CheckpointCorruptionError, CheckpointData, encode
from caravanserai.checkpoints.text_backend import TextBackend
from caravanserai.checkpoints.timelines import compare, timeline
from caravanserai.runs import read_events
from caravanserai.runs.view import inspect_run

PROMPTS = ["pull the ticket", "reproduce the bug", "draft a fix", "open the PR"]
TOKEN_IDS = re.compile(r"(?<![\w.])\d+(?:[ ,]+\d+){4,}(?![\w.])")  # five or more bare integers in a row


def text_run(prompts=PROMPTS) -> DurableAgent:
    agent = DurableAgent().begin(prompts, model_id="text")
    agent.run_until_step(len(prompts) - 1)
    return agent


def readable(output) -> bool:
    return isinstance(output, str) and 20 <= len(output.split()) <= 60 and not TOKEN_IDS.search(output) \
        and re.search(r"[A-Za-z]{3,} [a-z]{2,} [a-z]{2,}", output) is not None


def test_text_backend_writes_readable_deterministic_text(monkeypatch):
    monkeypatch.setenv("VLLM_BASE_URL", "http://127.0.0.1:9")  # an explicit "text" wins over the server default
    agent = text_run()
    outputs = agent.step_outputs()
    assert agent.backend == "text" and DurableAgent.inspect(agent.checkpoint())["model_id"] == "text"
    assert all(readable(o) for o in outputs), outputs
    assert "pull the ticket" in outputs[0] and "reproduce the bug" in outputs[1]  # each note names its step
    assert len(set(outputs)) == 4
    again = text_run()
    assert again.step_outputs() == outputs and again.checkpoint() == agent.checkpoint()  # a function of the inputs
    # KV: one fixed-size entry per context and output token, as on the fake backend
    words = sum(len(TextBackend.words(p)) + len(TextBackend.words(o)) for p, o in zip(PROMPTS, outputs))
    previous = sum(len(TextBackend.words(o)) for o in outputs[:-1])
    assert agent.cache_size() == agent.tokens_computed == words + previous
    assert DurableAgent.inspect(agent.checkpoint())["kv_tokens"] == words + previous


def test_the_default_backend_is_still_fake():
    agent = DurableAgent().begin(PROMPTS)
    agent.run_until_step(0)
    assert agent.backend == "fake" and all(isinstance(t, int) for t in agent.step_outputs()[0])


def test_a_fork_diverges_at_the_edited_step_and_after_it():
    agent = text_run()
    outputs = agent.step_outputs()
    ckpt = agent.run_until_step(1)
    for node, value in (("prompt-2", "write a haiku about the bug instead"), ("step-1", "the test passes now")):
        resumed = DurableAgent()
        forked_outputs = resumed.resume_from(DurableAgent.fork(ckpt, node, value))
        edited = int(node[-1])
        assert forked_outputs[:edited] == outputs[:edited]
        assert resumed.computed_steps == list(range(2, 4))  # steps 1-2 reused, never recomputed
        assert all(a != b for a, b in zip(forked_outputs[2:], outputs[2:]))
        assert all(readable(o) for o in forked_outputs[2:])
    assert "write a haiku about the bug instead" in DurableAgent().resume_from(
        DurableAgent.fork(ckpt, "prompt-2", "write a haiku about the bug instead"))[2]
    numbers = DurableAgent().resume_from(DurableAgent.fork(ckpt, "step-1", [1, 2, 3]))  # any JSON value as an output
    assert numbers[1] == [1, 2, 3] and readable(numbers[2])


def test_checkpoint_round_trip_and_log_fork_reuse(project):
    store = caravanserai.open_store()
    agent = DurableAgent().begin(PROMPTS, model_id="text")
    half = agent.run_until_step(1)
    whole = text_run().checkpoint()
    resumed = DurableAgent()
    assert resumed.resume_from(half) == text_run().step_outputs() and resumed.computed_steps == [2, 3]
    assert resumed.checkpoint() == whole  # another process continues byte for byte

    log = CheckpointLog(store, "text-log")
    head = log.commit(half, step=1)
    assert log.load(head) == half
    progress = log.resume()
    assert (progress.reused, progress.computed, progress.done) == (2, 2, True)
    assert log.load(progress.head) == whole  # committed as deltas, rebuilt exactly
    fork = log.fork(head, "prompt-2", "draft two fixes", new_run_id="text-alt")
    rest = CheckpointLog(store, "text-alt").resume(fork)
    assert (rest.reused, rest.computed) == (2, 2)
    steps = timeline("text-alt", store)
    assert all(s.tokens and s.tokens > 0 for s in steps)  # token counts from usage and the KV entries
    assert [s.value for s in steps[:2]] == DurableAgent.outputs_of(whole)[:2]


def test_text_checkpoints_are_validated_like_fake_ones():
    data = decode_checkpoint(text_run().checkpoint())
    bad_backend = CheckpointData({**data.header, "backend": "text2"}, data.kv)
    with pytest.raises(CheckpointCorruptionError, match="backend"):
        DurableAgent.inspect(encode(bad_backend))
    torn = CheckpointData(data.header, {**data.kv, "step-0": data.kv["step-0"][:-1]})
    with pytest.raises(CheckpointCorruptionError, match="whole number of cache entries"):
        DurableAgent.inspect(encode(torn))
    assert len(data.kv["step-0"]) % FakeBackend.ENTRY_BYTES == 0


# ---- the main line ----------------------------------------------------------------------------
def committed_log(store, run_id: str = "ticket-42", backend: str = "text") -> tuple[CheckpointLog, list[str]]:
    agent = DurableAgent().begin(PROMPTS, model_id=backend)
    log, ids = CheckpointLog(store, run_id), []
    for step in range(4):
        ids.append(log.commit(agent.run_until_step(step), parent=ids[-1] if ids else None, step=step))
    return log, ids


def test_list_says_completed_when_the_main_line_ran_every_step_with_branches_counted(project, child_env):
    store = caravanserai.open_store()
    log, ids = committed_log(store)
    branch = log.fork(ids[1], "prompt-2", "write a haiku instead")  # committed last, inside the log
    deeper = log.resume(branch).head                                # a branch's own commits stay off the main line
    second = log.fork(ids[2], "prompt-3", "open a draft PR")
    view = inspect_run("ticket-42", store)
    assert view.status == "completed"
    assert view.checkpoints.latest == ids[3] and view.checkpoints.steps_done == 4 and view.checkpoints.branches == 2
    assert view.checkpoints.checkpoints == 7 and deeper != ids[3] and second != ids[3]
    assert view.checkpoints.to_dict() == log_status(read_events("ticket-42", store))
    assert log.main_head() == ids[3] and log.newest_head() == second  # newest: the last commit, a branch too
    listed = json.loads(subprocess.run([PYTHON, "-m", "caravanserai", "list", "--json"], capture_output=True,
                                       text=True, check=True, timeout=60, env=child_env).stdout)
    row = next(r for r in listed if r["run_id"] == "ticket-42")
    assert row["status"] == "completed" and row["checkpoints"]["branches"] == 2 and row["checkpoints"]["latest"] == ids[3]

    half = CheckpointLog(store, "half-way")  # a main line not done stays pending, even when a branch inside it finished
    start = half.commit(DurableAgent().begin(PROMPTS, model_id="text").run_until_step(1), step=1)
    assert half.resume(half.fork(start, "step-1", "done")).done
    view = inspect_run("half-way", store)
    assert (view.status, view.checkpoints.steps_done, view.checkpoints.latest, view.checkpoints.branches) == \
        ("pending", 2, start, 1)
    assert half.resume(half.main_head()).computed == 2 and inspect_run("half-way", store).status == "completed"


def test_diff_compares_the_main_line_head_and_names_it(project, child_env):
    store = caravanserai.open_store()
    log, ids = committed_log(store)
    branch = log.resume(log.fork(ids[1], "prompt-2", "write a haiku instead")).head  # the newest commit
    main = timeline("ticket-42", store)
    assert main.checkpoint == ids[3] and main.main_line and main.label == f"ticket-42@{ids[3][:12]} (main line)"
    other = timeline(f"ticket-42@{branch[:12]}", store)
    assert other.checkpoint == branch and not other.main_line and other.label == f"ticket-42@{branch[:12]}"
    result = compare(("ticket-42", main), ("branch", other))
    assert (result.shared_prefix, result.first_divergence) == (2, 3)
    assert all(readable(v) for step in result.steps for v in step["values"])
    out = subprocess.run([PYTHON, "-m", "caravanserai", "diff", "ticket-42", f"ticket-42@{branch[:12]}"],
                         capture_output=True, text=True, check=True, timeout=60, env=child_env).stdout
    assert "first divergence at step 3" in out and "haiku" in out and not TOKEN_IDS.search(out)


# ---- the CLI: fork --new-run, then resume ----------------------------------------------------
def cli(*args: str, env: dict, ok: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run([PYTHON, "-m", "caravanserai", *args], capture_output=True, text=True, env=env, timeout=120)
    assert (proc.returncode == 0) == ok, proc.stdout + proc.stderr
    return proc


@pytest.mark.parametrize("backend", ["text", "fake"])
def test_cli_fork_new_run_then_resume_runs_it_to_the_end(tmp_path, child_env, backend):
    url = f"sqlite:///{tmp_path}/runs-{uuid.uuid4().hex[:6]}.db"
    env = {**child_env, "CARAVANSERAI_STORE": url}
    store = caravanserai.open_store(url)
    log, ids = committed_log(store, "ticket", backend)
    store.close()

    forked = cli("fork", "ticket", ids[1][:12], "prompt-2", "draft two fixes", "--new-run", "ticket-alt", env=env)
    lines = forked.stdout.splitlines()
    assert re.fullmatch(r"[0-9a-f]{64}", lines[0])  # the id alone on the first line, for scripts
    assert "caravanserai resume ticket-alt" in forked.stdout
    assert re.search(r"^ticket-alt\t1 checkpoint\(s\), step 2/4\t.*\tpending$", cli("list", env=env).stdout, re.M)

    resumed = cli("resume", "ticket-alt", env=env).stdout
    assert "steps 1-2 of 4 done, reused" in resumed and "step 3/4 computed" in resumed and "step 4/4 computed" in resumed
    assert "2 step(s) reused, 2 computed" in resumed and "4/4 steps done" in resumed
    listed = cli("list", env=env).stdout
    assert re.search(r"^ticket-alt\t\d+ checkpoint\(s\), step 4/4\t.*\tcompleted$", listed, re.M), listed
    again = cli("resume", "ticket-alt", env=env, ok=False)
    assert "already completed" in again.stderr  # nothing left: as for any completed run

    store = caravanserai.open_store(url)
    steps = timeline("ticket-alt", store)
    assert steps[2].prompt == "draft two fixes" and None not in [s.value for s in steps]
    assert [s.value for s in steps[:2]] == [s.value for s in timeline("ticket", store)[:2]]
    if backend == "text":
        assert all(readable(s.value) for s in steps)


def test_cli_resume_of_a_main_line_left_half_way_and_of_branches_with_force(tmp_path, child_env):
    url = f"sqlite:///{tmp_path}/runs.db"
    env = {**child_env, "CARAVANSERAI_STORE": url}
    store = caravanserai.open_store(url)
    log = CheckpointLog(store, "half")
    head = log.commit(DurableAgent().begin(PROMPTS, model_id="text").run_until_step(0), step=0)
    store.close()
    out = cli("resume", "half", env=env).stdout
    assert "(main line)" in out and "1 step(s) reused, 3 computed" in out
    assert cli("list", env=env).stdout.rstrip().endswith("completed")

    store = caravanserai.open_store(url)
    branch = CheckpointLog(store, "half").fork(head, "prompt-1", "reproduce it twice")
    store.close()
    assert "already completed" in cli("resume", "half", env=env, ok=False).stderr
    forced = cli("resume", "half", "--force", env=env).stdout  # the main line is done: the pending branch runs
    assert f"(branch) at {branch[:12]}" in forced and "3 computed" in forced
    assert "nothing to resume" in cli("resume", "half", "--force", env=env).stdout

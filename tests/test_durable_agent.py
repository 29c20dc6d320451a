"""DurableAgent checkpoints and CheckpointLog (seed 004 "Durable execution").

1. The seed's samples (``continuum`` -> ``caravanserai``), verbatim, each run as a script in its
   own process (children ``tests/children/agent_seed_*.py``, checked against the seed text when
   the seed is present), with the test's checks appended after the verbatim code.
2. Determinism: byte-identical checkpoints in fresh processes, identical resumes, ``inspect``
   without a backend, the KV cache restored and grown.
3. Format errors: not bytes, bad magic, a future version, any flipped byte; no partial state.
4. CheckpointLog: delta chains bounded by ``max_chain``, integrity of every load, no-op
   re-commits, lineage, heads, tampered objects and records.
5. Many worker processes committing into one log at once.
6. The run journal: ``checkpoint_committed`` / ``forked`` events, forks into a new run.
7. The same round trip on every checkpoint store.
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import re
import subprocess
from pathlib import Path

import pytest
from agent_helpers import (
    CHILDREN,
    FORK_PROMPTS,
    PROMPTS,
    PYTHON,
    REPO,
    closed_port_url,
    files_under,
    flip,
    full_run,
    last_json,
    reencoded,
    run_script,
    seed_script,
    verbatim,
    with_version,
)
from conftest import need

import caravanserai
from caravanserai import DurableAgent, ckpt_format
from caravanserai import durable_agent as durable_agent_module
from caravanserai.checkpoints import (
    CheckpointLog,
    MemoryCheckpointStore,
)
from caravanserai.errors import CaravanseraiError, CheckpointCorruptionError, CheckpointFormatError, ModelError


# ---- 1. the seed's samples, verbatim --------------------------------------------------------
def seed_samples() -> list[str] | None:
    """The seed's Python samples (``continuum`` -> ``caravanserai``), or None without the seed file.

    The seed is plain text: paragraphs separated by blank lines. A paragraph that compiles as
    Python and has a call, an assignment, an import or a comment is code (prose, bullets and
    shell lines do not compile; a title such as "Checkpoint and resume" compiles but has none of
    those); consecutive code paragraphs form one sample.
    """
    folder = Path(os.environ.get("CARAVANSERAI_SEEDS", REPO / "tests" / "fixtures" / "seeds"))  # copies of shared/seeds
    found = sorted(folder.glob("004_*.txt"))
    if not found:
        return None
    text = found[0].read_text(encoding="utf-8").replace("continuum", "caravanserai")
    samples: list[list[str]] = []
    previous_was_code = False
    for paragraph in re.split(r"\n[ \t]*\n", text):
        paragraph = paragraph.strip("\n")
        try:
            compile(paragraph, "<seed>", "exec")
            is_code = bool(re.search(r"[(=#]|^(from|import) ", paragraph, re.M))
        except SyntaxError:
            is_code = False
        if is_code and previous_was_code:
            samples[-1].append(paragraph)
        elif is_code:
            samples.append([paragraph])
        previous_was_code = is_code
    return ["\n\n".join(parts) + "\n" for parts in samples]


def test_seed_samples_are_the_children_verbatim():
    samples = seed_samples()
    need(samples is not None, "the seed text (tests/fixtures/seeds/004_*.txt) is missing")
    assert len(samples) == 5, f"expected the seed's 5 Python samples, found {len(samples)}: {samples}"
    resume, processes, stores, log, fork = samples
    assert verbatim("agent_seed_resume.py") == resume
    parts = re.split(r"(?m)^(?=# (?:plan|work|audit)\.py :)", processes)
    assert [p[:10] for p in parts if p] == ["# plan.py ", "# work.py ", "# audit.py"]
    plan, work, audit = (p.rstrip("\n") + "\n" for p in parts if p)
    assert verbatim("agent_seed_plan.py") == plan
    assert verbatim("agent_seed_work.py") == work
    assert verbatim("agent_seed_audit.py") == audit
    assert verbatim("agent_seed_stores.py") == stores + "\n" + log
    assert verbatim("agent_seed_fork.py") == fork
    # the cloud stores stay commented out, as in the seed
    assert '# store = S3Store("my-bucket", prefix="caravanserai")' in stores
    assert '# store = GCSStore("my-bucket", prefix="caravanserai")' in stores


RESUME_CHECKS = """
import json as _json
print(_json.dumps({"outputs": outputs, "computed": revived.computed_steps, "cache": revived.cache_size(),
                   "inspect": DurableAgent.inspect(ckpt), "ckpt_len": len(ckpt), "ckpt": ckpt.hex(),
                   "agent_gone": "agent" not in globals()}))
"""


def test_seed_checkpoint_and_resume(project, child_env):
    out = last_json(run_script(seed_script("agent_seed_resume.py", project, RESUME_CHECKS), project, child_env))
    whole = full_run(PROMPTS)
    assert out["agent_gone"]
    assert out["computed"] == [2, 3], "resume must run steps 3 and 4 only (nothing re-run)"
    assert out["outputs"] == whole.step_outputs()
    info = out["inspect"]
    assert info["executed_nodes"] == ["step-0", "step-1"]
    assert info["checkpoint_bytes"] == out["ckpt_len"]
    # the KV cache came back with the checkpoint: the resumed cache is the uninterrupted one
    assert info["kv_tokens"] > 0
    assert out["cache"] == whole.cache_size() > info["kv_tokens"]
    assert bytes.fromhex(out["ckpt"]) == DurableAgent().begin(PROMPTS).run_until_step(1)


def test_seed_across_three_processes(project, child_env):
    scripts = {name: seed_script(f"agent_seed_{name}.py", project, "") for name in ("plan", "work", "audit")}
    run_script(scripts["plan"], project, child_env)
    ckpt = (project / "job.ckpt").read_bytes()
    assert DurableAgent.inspect(ckpt)["executed_nodes"] == ["step-0", "step-1"]
    assert not (project / "job.result").exists()
    run_script(scripts["work"], project, child_env)
    assert (project / "job.result").read_text() == repr(full_run(PROMPTS).step_outputs())
    run_script(scripts["audit"], project, child_env)  # its assert compares two resumes
    assert (project / "job.ckpt").read_bytes() == ckpt, "resuming must not change the parked checkpoint"


def test_seed_audit_fails_when_the_checkpoint_is_damaged(project, child_env):
    """audit.py is a real check: on damaged bytes it exits non-zero (CheckpointCorruptionError)."""
    ckpt = DurableAgent().begin(PROMPTS).run_until_step(1)
    (project / "job.ckpt").write_bytes(flip(ckpt, len(ckpt) // 2))
    script = seed_script("agent_seed_audit.py", project, "")
    proc = subprocess.run([PYTHON, str(script)], cwd=project, env=child_env, capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0 and "CheckpointCorruptionError" in proc.stderr


STORES_CHECKS = """
import dataclasses as _dc, json as _json
print(_json.dumps({
    "records": [_dc.asdict(r) for r in log.manifest()],
    "prev": prev, "alt": alt, "heads": log.heads(), "lineage": [r.id for r in log.lineage(alt)],
    "original": DurableAgent().resume_from(log.load(prev)),
    "forked": DurableAgent().resume_from(log.load(alt)),
    "from_store": DurableAgent().resume_from(store=store, key="ticket-42/step-2"),
    "keys": store.list(), "agent": agent.step_outputs(), "prompt_3": agent.prompt_node_ids[3],
}))
"""


def test_seed_checkpoint_stores_and_log(project, child_env):
    root = project / "shared-ckpt"
    script = seed_script("agent_seed_stores.py", project, STORES_CHECKS, {"/mnt/shared/ckpt": str(root)})
    out = last_json(run_script(script, project, child_env))
    whole = full_run(PROMPTS).step_outputs()
    edited = full_run(PROMPTS[:3] + ["open a draft PR instead"]).step_outputs()

    # the store sample: a real file under the directory, resumable by any process
    parked = (root / "ticket-42" / "step-2").read_bytes()
    assert "ticket-42/step-2" in out["keys"]
    assert parked == DurableAgent().begin(PROMPTS).run_until_step(1)
    assert out["from_store"] == whole == out["agent"] == out["original"]
    assert not [f for f in files_under(root) if f.endswith(".tmp")]

    # the log sample: first record full, then deltas against their parents
    records = out["records"]
    main = [r for r in records if r["fork"] is None]
    assert main[0]["kind"] == "full" and main[0]["base"] is None and main[0]["parent"] is None
    assert main[0]["depth"] == 0
    for before, record in zip(main, main[1:]):
        assert record["kind"] == "delta" and record["base"] == record["parent"] == before["id"]
        assert record["depth"] == before["depth"] + 1
        assert record["stored_bytes"] < record["checkpoint_bytes"]
    assert main[-1]["id"] == out["prev"] and main[-1]["step"] == 3
    # run_until_step(0) after steps 0-1 already ran returns the same checkpoint as step 1: one record
    assert [r["step"] for r in main] == [0, 2, 3]

    (fork_record,) = [r for r in records if r["fork"] is not None]
    assert fork_record["id"] == out["alt"] and fork_record["parent"] == out["prev"]
    assert fork_record["fork"]["node_id"] == out["prompt_3"] == "prompt-3"
    assert fork_record["fork"]["value"] == "open a draft PR instead"
    assert fork_record["kind"] == "delta"
    # the fork changes only step 4, and equals a run that had the edited prompt from the start
    assert out["forked"][:3] == out["original"][:3] and out["forked"][3] != out["original"][3]
    assert out["forked"] == edited
    assert out["heads"] == [out["alt"]]
    assert out["lineage"] == [r["id"] for r in main] + [out["alt"]]


FORK_CHECKS = """
import json as _json
print(_json.dumps({"real": real.step_outputs(), "what_if": what_if.step_outputs(), "rec": rec.step_outputs(),
                   "real_computed": real.computed_steps, "what_if_computed": what_if.computed_steps,
                   "step_3": step_3, "prompts": rec.prompt_node_ids, "steps": rec.step_node_ids,
                   "real_backend": real.backend}))
"""


def test_seed_fork_a_timeline(project, child_env):
    out = last_json(run_script(seed_script("agent_seed_fork.py", project, FORK_CHECKS), project, child_env))
    assert out["prompts"] == ["prompt-0", "prompt-1", "prompt-2", "prompt-3"]
    assert out["steps"] == ["step-0", "step-1", "step-2", "step-3"]
    assert out["step_3"] == "prompt-2"
    assert out["real_backend"] == "fake"
    rec, real, what_if = out["rec"], out["real"], out["what_if"]
    # step_outputs(): None for the steps that have not run
    assert rec[2:] == [None, None] and None not in rec[:2]
    assert real[:2] == what_if[:2] == rec[:2]
    assert real[2] != what_if[2] and real[3] != what_if[3]
    assert out["real_computed"] == out["what_if_computed"] == [2, 3], "completed steps replay, never recompute"
    assert real == full_run(FORK_PROMPTS).step_outputs()
    assert what_if == full_run(FORK_PROMPTS[:2] + ["write a haiku instead", FORK_PROMPTS[3]]).step_outputs()


# ---- 2. determinism -------------------------------------------------------------------------
def test_checkpoints_are_byte_identical_in_fresh_processes(project, child_env):
    prompts = ["pull the ticket", "café ☕ — naïve ünïcode", "draft a fix", "open the PR", "x" * 300]
    blobs = []
    for n, hash_seed in enumerate(("0", "12345", "random")):
        env = dict(child_env, PYTHONHASHSEED=hash_seed)
        run_script(CHILDREN / "agent_run.py", project, env, "run", json.dumps(prompts), "2", f"c{n}.ckpt")
        blobs.append((project / f"c{n}.ckpt").read_bytes())
    here = DurableAgent().begin(prompts).run_until_step(2)
    assert blobs[0] == blobs[1] == blobs[2] == here
    assert DurableAgent.inspect(here)["checkpoint_id"] == hashlib.sha256(here).hexdigest()


def test_two_resumes_are_identical_and_equal_an_uninterrupted_run(project, child_env):
    ckpt = DurableAgent().begin(PROMPTS).run_until_step(0)
    (project / "job.ckpt").write_bytes(ckpt)
    results = []
    for n in range(2):
        run_script(CHILDREN / "agent_run.py", project, dict(child_env, PYTHONHASHSEED=str(n + 7)),
                   "resume", "job.ckpt", f"r{n}.ckpt")
        results.append(((project / f"r{n}.ckpt").read_bytes(), json.loads((project / f"r{n}.ckpt.json").read_text())))
    (final_a, meta_a), (final_b, meta_b) = results
    whole = full_run(PROMPTS)
    assert final_a == final_b == whole.checkpoint()
    assert meta_a == meta_b
    assert meta_a["outputs"] == whole.step_outputs() and meta_a["computed"] == [1, 2, 3]
    # and in one process, twice
    a, b = DurableAgent(), DurableAgent()
    assert a.resume_from(ckpt) == b.resume_from(ckpt) == whole.step_outputs()
    assert a.checkpoint() == b.checkpoint() == whole.checkpoint()


def test_inspect_needs_no_backend(monkeypatch):
    fake_ckpt = DurableAgent().begin(PROMPTS).run_until_step(1)
    monkeypatch.setenv("VLLM_BASE_URL", closed_port_url())
    server_agent = DurableAgent().begin(PROMPTS)  # nothing is sent until a step runs
    assert server_agent.backend == "vllm"
    server_ckpt = server_agent.checkpoint()

    def no_backend(*_args, **_kwargs):
        raise AssertionError("inspect/fork must not build a backend")

    monkeypatch.setattr(durable_agent_module.FakeBackend, "__init__", no_backend)
    monkeypatch.setattr(durable_agent_module.OpenAICompletionsBackend, "__init__", no_backend)
    monkeypatch.setattr(durable_agent_module, "_backend", no_backend)

    info = DurableAgent.inspect(fake_ckpt)
    assert info["executed_nodes"] == ["step-0", "step-1"]
    assert info["pending_nodes"] == ["step-2", "step-3"]
    assert info["checkpoint_bytes"] == len(fake_ckpt)
    assert info["backend"] == "fake" and info["steps"] == 4
    info = DurableAgent.inspect(server_ckpt)
    assert info["executed_nodes"] == [] and info["checkpoint_bytes"] == len(server_ckpt)
    assert info["backend"] == "vllm" and info["model_id"] == "vllm/gemma4"
    # fork is backend-free too
    forked = DurableAgent.fork(fake_ckpt, "prompt-1", "reproduce it twice")
    assert DurableAgent.inspect(forked)["executed_nodes"] == ["step-0"]


def test_cache_is_restored_with_the_checkpoint_and_grows_per_step():
    agent = DurableAgent().begin(PROMPTS)
    assert agent.cache_size() == 0
    sizes, ckpts = [], []
    for step, prompt in enumerate(PROMPTS):
        ckpts.append(agent.run_until_step(step))
        sizes.append(agent.cache_size())
        grown = sizes[-1] - (sizes[-2] if step else 0)
        assert grown >= len(prompt.encode()), f"step {step} grew the cache by {grown} tokens only"
    for ckpt, size in zip(ckpts, sizes):
        assert DurableAgent.inspect(ckpt)["kv_tokens"] == size
    # resuming a finished checkpoint computes nothing and restores its cache exactly
    revived = DurableAgent()
    revived.resume_from(ckpts[-1])
    assert revived.computed_steps == [] and revived.cache_size() == sizes[-1]
    # resuming a partial one restores its cache, then grows it by each computed step
    revived = DurableAgent()
    revived.resume_from(ckpts[1])
    assert revived.computed_steps == [2, 3] and revived.cache_size() == sizes[-1]


def test_step_outputs_and_node_ids():
    agent = DurableAgent().begin(PROMPTS)
    assert agent.step_outputs() == [None] * 4
    agent.run_until_step(0)
    outputs = agent.step_outputs()
    assert outputs[0] is not None and outputs[1:] == [None, None, None]
    assert agent.prompt_node_ids == [f"prompt-{i}" for i in range(4)]
    assert agent.step_node_ids == [f"step-{i}" for i in range(4)]
    with pytest.raises(IndexError):
        agent.run_until_step(4)
    with pytest.raises(CaravanseraiError):
        DurableAgent().step_outputs()


# ---- 3. format errors -----------------------------------------------------------------------
def test_errors_are_caravanserai_errors_with_stable_codes():
    assert CheckpointFormatError.code == "checkpoint_format"
    assert CheckpointCorruptionError.code == "checkpoint_corruption"
    assert issubclass(CheckpointFormatError, CaravanseraiError)
    assert issubclass(CheckpointCorruptionError, CaravanseraiError)
    from caravanserai import checkpoints

    assert checkpoints.CheckpointFormatError is caravanserai.CheckpointFormatError is CheckpointFormatError
    assert checkpoints.CheckpointCorruptionError is caravanserai.CheckpointCorruptionError is CheckpointCorruptionError
    ckpt = DurableAgent().begin(PROMPTS).run_until_step(0)
    for bad, cls in ((b"nope", CheckpointFormatError), (flip(ckpt, 40), CheckpointCorruptionError)):
        with pytest.raises(cls) as caught:
            DurableAgent.inspect(bad)
        again = pickle.loads(pickle.dumps(caught.value))
        assert type(again) is cls and again.code == cls.code and str(again) == str(caught.value)
        assert caught.value.to_dict()["code"] == cls.code
        assert "\n" not in str(caught.value)


@pytest.mark.parametrize("bad", ["a string", 12345, None, ["list"], b"", b"CVSR", b"garbage" * 20,
                                 pickle.dumps({"values": {}})], ids=repr)
def test_not_bytes_or_bad_magic_is_a_format_error(bad):
    with pytest.raises(CheckpointFormatError):
        DurableAgent.inspect(bad)
    if bad is not None:  # resume_from(None) asks for store= and key= instead
        with pytest.raises(CheckpointFormatError):
            DurableAgent().resume_from(bad)
    with pytest.raises(CheckpointFormatError):
        DurableAgent.fork(bad, "prompt-0", "x")


def test_another_magic_with_a_valid_digest_is_a_format_error():
    ckpt = DurableAgent().begin(PROMPTS).run_until_step(0)
    body = b"CVSRCKPX" + ckpt[8:-32]
    with pytest.raises(CheckpointFormatError, match="magic"):
        DurableAgent.inspect(body + hashlib.sha256(body).digest())


def test_a_future_version_is_a_format_error_asking_to_upgrade():
    ckpt = DurableAgent().begin(PROMPTS).run_until_step(0)
    future = with_version(ckpt, ckpt_format.FORMAT_VERSION + 1)
    for action in (lambda: DurableAgent.inspect(future), lambda: DurableAgent().resume_from(future),
                   lambda: CheckpointLog(MemoryCheckpointStore(), "r").commit(future)):
        with pytest.raises(CheckpointFormatError, match="(?i)upgrade"):
            action()
    assert DurableAgent.inspect(with_version(ckpt, ckpt_format.FORMAT_VERSION))["checkpoint_bytes"] == len(ckpt)


def test_a_flipped_byte_anywhere_is_corruption():
    """Every position, three masks. The magic (bytes 0-7) may also read as 'not a checkpoint'; from
    the version on, the digest proves damage, so a flipped version byte must not ask for an upgrade."""
    ckpt = DurableAgent().begin(PROMPTS).run_until_step(1)
    wrong = []
    for position in range(len(ckpt)):
        allowed = (CheckpointFormatError, CheckpointCorruptionError) if position < 8 else CheckpointCorruptionError
        for mask in (0x01, 0x80, 0xFF):
            try:
                DurableAgent.inspect(flip(ckpt, position, mask))
            except allowed:
                continue
            except Exception as exc:  # noqa: BLE001 - collected and reported below
                wrong.append(f"byte {position} ^ {mask:#x}: {type(exc).__name__}: {exc}")
            else:
                wrong.append(f"byte {position} ^ {mask:#x}: accepted")
    assert not wrong, f"{len(wrong)} of {3 * len(ckpt)} flips misreported, e.g. {wrong[:5]}"
    for position in range(8, len(ckpt), 97):
        with pytest.raises(CheckpointCorruptionError):
            DurableAgent().resume_from(flip(ckpt, position))


@pytest.mark.parametrize("cut", [1, 31, 32, 33, 500])
def test_truncated_or_extended_checkpoints_are_rejected(cut):
    ckpt = DurableAgent().begin(PROMPTS).run_until_step(1)
    for bad in (ckpt[:-cut], ckpt + b"\x00" * cut, ckpt[:cut]):
        with pytest.raises((CheckpointFormatError, CheckpointCorruptionError)):
            DurableAgent.inspect(bad)


def test_a_failed_resume_leaves_the_agent_as_it_was():
    agent = DurableAgent().begin(PROMPTS)
    agent.run_until_step(0)
    before = agent.checkpoint()
    good = DurableAgent().begin(FORK_PROMPTS).run_until_step(1)
    damaged = [b"junk", "text", flip(good, 20), flip(good, len(good) - 1), good[:-10],
               with_version(good, 99)]
    for bad in damaged:
        with pytest.raises((CheckpointFormatError, CheckpointCorruptionError)):
            agent.resume_from(bad)
        assert agent.checkpoint() == before
        assert agent.computed_steps == [0]
    assert agent.resume_from(agent.checkpoint()) == full_run(PROMPTS).step_outputs()
    assert agent.checkpoint() == full_run(PROMPTS).checkpoint()


def _unknown_backend_checkpoint(monkeypatch) -> tuple[bytes, type]:
    # a v1 checkpoint names one of the v1 backends: any other is a malformed header (corruption)
    return reencoded(DurableAgent().begin(FORK_PROMPTS).run_until_step(0), backend="tpu"), CheckpointCorruptionError


def _server_checkpoint_without_server(monkeypatch) -> tuple[bytes, type]:
    monkeypatch.setenv("VLLM_BASE_URL", closed_port_url())
    ckpt = DurableAgent().begin(FORK_PROMPTS).checkpoint()
    monkeypatch.delenv("VLLM_BASE_URL")
    return ckpt, ModelError


@pytest.mark.parametrize("make", [_unknown_backend_checkpoint, _server_checkpoint_without_server],
                         ids=["unknown-backend", "vllm-without-VLLM_BASE_URL"])
def test_a_resume_whose_backend_cannot_be_built_leaves_the_agent_as_it_was(monkeypatch, make):
    """A well-formed checkpoint this process cannot run must not half-replace the agent's run."""
    monkeypatch.delenv("VLLM_BASE_URL", raising=False)
    agent = DurableAgent().begin(PROMPTS)
    agent.run_until_step(0)
    before = agent.checkpoint()
    bad, error = make(monkeypatch)
    with pytest.raises(error):
        agent.resume_from(bad)
    assert agent.checkpoint() == before, "the failed resume left the other checkpoint's run in the agent"
    assert agent.run_until_step(3) == full_run(PROMPTS).checkpoint()


def test_a_begin_whose_backend_cannot_be_built_leaves_the_agent_as_it_was(monkeypatch):
    monkeypatch.delenv("VLLM_BASE_URL", raising=False)
    agent = DurableAgent().begin(PROMPTS)
    agent.run_until_step(0)
    before = agent.checkpoint()
    with pytest.raises(ModelError):
        agent.begin(FORK_PROMPTS, model_id="vllm/gemma4")  # a server model, but no VLLM_BASE_URL
    assert agent.checkpoint() == before
    assert agent.run_until_step(3) == full_run(PROMPTS).checkpoint()

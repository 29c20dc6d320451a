"""Helpers shared by the durable-run tests (seed 002): children, journals, stores."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from conftest import load_child_module

from caravanserai import (
    DiskDurableStore,
    journal,
)
from caravanserai.runs import read_events
from caravanserai.testing import ScriptedModel

PYTHON = sys.executable
CHILD = Path(__file__).resolve().parent / "children" / "durable_agents.py"
kids = load_child_module(CHILD)
QUESTION, ANSWER = kids.QUESTION, kids.ANSWER


# ---- helpers ------------------------------------------------------------------------------------
class InterruptingModel(ScriptedModel):
    """Same provider/name as ScriptedModel (same definition digest); Ctrl-C inside the call."""

    def complete(self, messages, *, tools=None, **params):
        self.requests.append([dict(m) for m in messages])
        raise KeyboardInterrupt


def store_of(project: Path) -> DiskDurableStore:
    return DiskDurableStore(str(project / ".caveman" / "runs" / "durable"))


def opts(project: Path, run_id: str) -> dict:
    return {"run_id": run_id, "store": store_of(project)}


def journal_path(project: Path, run_id: str) -> Path:
    return project / ".caveman" / "runs" / "durable" / run_id / "journal.jsonl"


def events_of(project: Path, run_id: str) -> list[dict]:
    return read_events(run_id, store_of(project))


def types_of(project: Path, run_id: str) -> list[str]:
    return [e["type"] for e in events_of(project, run_id)]


def spawn(scenario: str, run_id: str, project: Path, child_env: dict, **env: str) -> subprocess.Popen:
    full = dict(child_env, PYTHONUNBUFFERED="1", **env)
    stderr = open(project / f"child-{scenario}-{run_id}.err", "ab")
    try:
        return subprocess.Popen([PYTHON, str(CHILD), scenario, run_id], cwd=project, env=full,
                                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=stderr)
    finally:
        stderr.close()


def child_stderr(project: Path) -> str:
    return "\n".join(p.read_text(errors="replace") for p in sorted(project.glob("child-*.err")))


def wait_until(condition: Callable[[], bool], proc: subprocess.Popen, project: Path, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if proc.poll() is not None:
            raise AssertionError(f"child exited ({proc.returncode}) before the crash point:\n{child_stderr(project)}")
        if time.monotonic() > deadline:
            proc.kill()
            raise AssertionError(f"crash point not reached in {timeout}s:\n{child_stderr(project)}")
        time.sleep(0.02)


def journal_has(project: Path, run_id: str, etype: str) -> Callable[[], bool]:
    path = journal_path(project, run_id)

    def check() -> bool:
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return False
        return any(json.loads(line).get("type") == etype for line in data.split(b"\n")[:-1] if line.strip())

    return check


def crash_by_itself(scenario: str, run_id: str, project: Path, child_env: dict, **env: str) -> None:
    """Run a child that SIGKILLs itself at its crash point."""
    proc = spawn(scenario, run_id, project, child_env, **env)
    proc.wait(timeout=120)
    assert proc.returncode == -signal.SIGKILL, f"child did not crash ({proc.returncode}):\n{child_stderr(project)}"


def rewrite_journal(path: Path, events: list[dict], *, allow_nan: bool = False) -> None:
    """Write ``events`` as a valid hash-chained journal, as a tampering store could."""
    bare = [{k: v for k, v in e.items() if k not in ("v", "seq", "prev")} for e in events]
    if not allow_nan:
        lines = journal.encode(bare, journal.Tail())[0]
    else:  # journal.encode refuses NaN; a store is not bound by that
        lines, prev = [], None
        for seq, event in enumerate(bare):
            record = {"v": journal.FORMAT_VERSION, "seq": seq, "at": event["at"], "type": event["type"]}
            record.update({k: v for k, v in event.items() if k not in ("at", "type")})
            if prev is not None:
                record["prev"] = prev
            line = json.dumps(record, ensure_ascii=False, separators=(",", ":"))
            lines.append(line)
            prev = journal.line_digest(line)
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def tool_messages(request: list[dict]) -> list[dict]:
    return [m for m in request if m.get("role") == "tool"]


SEED_FIELDS = {
    "run_started": {"v", "at", "type", "run_id", "agent_id", "definition_sha256", "input", "session_id",
                    "denomination", "budget_sha256", "pid"},
    "call_started": {"v", "at", "type", "path", "kind", "provider", "model"},
    "call_settled": {"v", "at", "type", "path", "kind", "call"},
    "turn": {"v", "at", "type", "messages"},
    "run_completed": {"v", "at", "type", "result"},
}

"""Real Jupyter kernels for tests: start one with jupyter_client, run cells, SIGKILL and restart it.

The fixtures (``kernel``, ``kernel_env``, ``proxy``) are in conftest.py; these are the helpers.
"""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path

from conftest import REPO


def topic_of(body: dict) -> str:
    return body["messages"][0]["content"].removeprefix("Name one fact about ").removesuffix(".")


def child_env(project: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CARAVANSERAI_")}
    env["PYTHONPATH"] = str(REPO)
    env["PYTHONUTF8"] = "1"
    env["IPYTHONDIR"] = str(project / ".ipython")  # no user profile or startup files
    return env


@dataclass
class Reply:
    status: str
    stdout: str = ""
    result: str | None = None  # execute_result text/plain
    ename: str | None = None
    evalue: str = ""
    displays: list[str] = field(default_factory=list)  # display_data / update_display_data text (the status line)

    def steps(self, label: str = "step") -> list[int]:
        return [int(line.split()[1]) for line in self.stdout.splitlines() if line.startswith(label + " ")]


class Kernel:
    """One ipykernel started with jupyter_client, killed/restarted/interrupted like Jupyter does."""

    def __init__(self, cwd: Path, env: dict[str, str]) -> None:
        from jupyter_client import KernelManager

        self.cwd, self.env = cwd, env
        self.km = KernelManager(kernel_name="python3")  # argv "python" resolves to this interpreter
        self.km.start_kernel(cwd=str(cwd), env=env)
        self._connect()

    def _connect(self) -> None:
        self.kc = self.km.client()
        self.kc.start_channels()
        self.kc.wait_for_ready(timeout=60)

    def run(self, code: str, timeout: float = 120) -> Reply:
        got = Reply("?")
        out: list[str] = []

        def hook(msg: dict) -> None:
            kind, content = msg["msg_type"], msg["content"]
            if kind == "stream" and content["name"] == "stdout":
                out.append(content["text"])
            elif kind == "execute_result":
                got.result = content["data"].get("text/plain")
            elif kind in ("display_data", "update_display_data"):
                got.displays.append(content["data"].get("text/plain", ""))
            elif kind == "error":
                got.ename, got.evalue = content["ename"], content["evalue"]

        reply = self.kc.execute_interactive(code, output_hook=hook, timeout=timeout)
        got.status = reply["content"]["status"]
        got.stdout = "".join(out)
        return got

    def ok(self, code: str) -> Reply:
        got = self.run(code)
        assert got.status == "ok", f"{got.ename}: {got.evalue}\n{got.stdout}"
        return got

    def submit(self, code: str) -> str:
        return self.kc.execute(code)

    def reply_to(self, msg_id: str, timeout: float = 60) -> dict:
        deadline = time.monotonic() + timeout
        while True:
            msg = self.kc.get_shell_msg(timeout=max(0.1, deadline - time.monotonic()))
            if msg["parent_header"].get("msg_id") == msg_id:
                return msg["content"]

    def kill_and_restart(self) -> int:
        """SIGKILL the kernel process (an OOM kill), then Kernel > Restart; returns the dead pid."""
        pid = self.km.provisioner.pid
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 30
        while self.km.is_alive():
            assert time.monotonic() < deadline, "the killed kernel is still alive"
            time.sleep(0.02)
        self.kc.stop_channels()
        self.km.restart_kernel(now=True)
        self._connect()
        assert self.km.provisioner.pid != pid
        return pid

    def close(self) -> None:
        try:
            self.kc.stop_channels()
        finally:
            self.km.shutdown_kernel(now=True)


def events(tmp_path: Path, run_id: str) -> list[dict]:
    from caravanserai.runs import read_events

    return read_events(run_id, str(tmp_path / ".caravanserai"))


def count(tmp_path: Path, run_id: str, etype: str) -> int:
    return sum(e["type"] == etype for e in events(tmp_path, run_id))


def wait_for_waypoints(tmp_path: Path, run_id: str, n: int, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while count(tmp_path, run_id, "waypoint") < n:
        assert time.monotonic() < deadline, f"run {run_id!r} never reached {n} waypoints"
        time.sleep(0.01)

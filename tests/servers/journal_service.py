"""``caravanserai serve`` in a child process on 127.0.0.1 (the HTTP store's tests): started, waited
for on ``/health``, stopped or SIGKILLed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ._proc import free_port

REPO = Path(__file__).resolve().parents[2]


class JournalServiceProcess:
    """The journal service backed by ``store_url``, answering at ``url`` with ``token``."""

    def __init__(self, store_url: str, token: str, port: int | None = None) -> None:
        import httpx

        self.store_url = store_url
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
        env.pop("CARAVANSERAI_HTTP_TOKEN", None)
        code = f"from caravanserai.service import serve; serve({store_url!r}, port={self.port}, token={token!r})"
        self.log = tempfile.TemporaryFile(mode="w+")  # not a pipe: a chatty server never blocks on it
        self.proc = subprocess.Popen([sys.executable, "-c", code], env=env, stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 20
        while True:
            if self.proc.poll() is not None:
                self.log.seek(0)
                raise RuntimeError(f"the service exited ({self.proc.returncode}): {self.log.read()}")
            try:
                if httpx.get(self.url + "/health", timeout=1).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError("the service did not answer /health within 20 s")
            time.sleep(0.05)

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.kill()
        self.log.close()

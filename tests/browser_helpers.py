"""A real browser on real notebook servers: JupyterLab / Notebook 7 / marimo on loopback, driven by
Playwright through Debian's Chromium (never `playwright install`: no browser downloads here).

Facts this relies on (shared/recipes/notebooks): start Jupyter with ``--allow-root`` as root, an
isolated config dir with the announcements popup off, wait for the status bar's "| Idle" (not the
toolbar indicator) before running cells, call app commands fire-and-forget, and shut the server
down through its REST API so its kernels stop too.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from conftest import has_module  # noqa: F401 - re-exported to the browser tests

REPO = Path(__file__).resolve().parent.parent
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
ARTIFACTS = REPO / "tests" / "artifacts"


def browser_missing() -> str | None:
    """Why a browser test cannot run here (None when it can)."""
    if not Path(CHROMIUM).exists():
        return "Debian's chromium is not installed (apt-get install chromium; .ci/run does it)"
    try:
        import playwright  # noqa: F401
    except ImportError:
        return "playwright (Python) is not installed (the [test] extra)"
    return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_http(url: str, timeout: float, proc: subprocess.Popen | None = None) -> None:
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"the server exited early (rc {proc.returncode})")
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                if response.status == 200:
                    return
        except Exception as exc:  # noqa: BLE001 - any failure means "not up yet"
            last = exc
        time.sleep(0.2)
    raise TimeoutError(f"{url} not up after {timeout} s: {last}")


def kernel_env(root: Path) -> dict[str, str]:
    """Environment of the servers and their kernels: this repo importable, no user profile."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CARAVANSERAI_")}
    env["PYTHONPATH"] = str(REPO)
    env["IPYTHONDIR"] = str(root / ".ipython")
    env["PYTHONUNBUFFERED"] = "1"
    bindir = Path(sys.executable).parent
    env["PATH"] = f"{bindir}:{env.get('PATH', '')}"
    return env


class JupyterServer:
    """``jupyter lab`` or ``jupyter notebook`` on 127.0.0.1 with a random token, in its own session."""

    def __init__(self, root: Path, app: str = "lab") -> None:
        self.root, self.app = root, app
        self.port, self.token = free_port(), secrets.token_hex(16)
        self.base = f"http://127.0.0.1:{self.port}"
        work = root / f".jupyter-{app}"
        config, runtime = work / "config", work / "runtime"
        (config / "labconfig").mkdir(parents=True, exist_ok=True)
        runtime.mkdir(parents=True, exist_ok=True)
        (config / "labconfig" / "page_config.json").write_text(json.dumps(
            {"disabledExtensions": {"@jupyterlab/apputils-extension:announcements": True}}))
        env = kernel_env(root)
        env.update(JUPYTER_CONFIG_DIR=str(config), JUPYTER_RUNTIME_DIR=str(runtime), JUPYTER_PLATFORM_DIRS="1")
        app_class = "LabApp" if app == "lab" else "JupyterNotebookApp"
        cmd = [str(Path(sys.executable).parent / "jupyter"), app, "--no-browser", "--ip=127.0.0.1",
               f"--port={self.port}", "--ServerApp.port_retries=0", f"--IdentityProvider.token={self.token}",
               f"--ServerApp.root_dir={root}", f"--{app_class}.news_url=None",
               f"--{app_class}.check_for_updates_class=jupyterlab.NeverCheckForUpdate", "--allow-root"]
        if app == "lab":
            cmd.append("--LabApp.expose_app_in_browser=True")
        self.log = open(work / "server.log", "w")
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        wait_http(f"{self.base}/api/status?token={self.token}", 90, self.proc)

    def url(self, path: str) -> str:
        return f"{self.base}/{path}?token={self.token}"

    def kernels(self) -> list[dict]:
        with urllib.request.urlopen(self.url("api/kernels"), timeout=10) as response:
            return json.loads(response.read())

    def delete(self, path: str) -> None:
        """``DELETE`` an API path (a kernel, a session)."""
        urllib.request.urlopen(urllib.request.Request(self.url(path), method="DELETE"), timeout=30).read()

    def stop(self) -> None:
        try:
            request = urllib.request.Request(self.url("api/shutdown"), method="POST")
            urllib.request.urlopen(request, timeout=10).read()
            self.proc.wait(20)
        except Exception:  # noqa: BLE001 - fall back to killing the session
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.log.close()


@contextmanager
def chromium(profile: Path, *, width: int = 1280, height: int = 1400) -> Iterator:
    """A Playwright page in Debian's Chromium (a fresh profile); console errors collected in ``page.errors``."""
    from playwright.sync_api import sync_playwright

    if profile.exists():
        shutil.rmtree(profile)
    with sync_playwright() as pw:
        context = pw.chromium.launch_persistent_context(
            user_data_dir=str(profile), executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS,
            viewport={"width": width, "height": height})
        page = context.pages[0] if context.pages else context.new_page()
        page.set_default_timeout(90_000)
        page.errors = []  # type: ignore[attr-defined]
        page.on("pageerror", lambda error: page.errors.append(str(error)))  # type: ignore[attr-defined]
        try:
            yield page
        except BaseException:
            ARTIFACTS.mkdir(parents=True, exist_ok=True)
            try:  # what the page showed when the test failed
                page.screenshot(path=str(ARTIFACTS / f"failed-{profile.parent.name}.png"))
            except Exception:  # noqa: BLE001 - the failure itself matters more
                pass
            raise
        finally:
            context.close()


def open_notebook(page, server: JupyterServer, name: str) -> None:
    """Open ``name`` in JupyterLab and wait until its kernel is idle."""
    page.goto(server.url(f"lab/tree/{name}"))
    page.wait_for_selector(".jp-Notebook .jp-Cell", state="visible")
    page.wait_for_function("() => /\\| Idle/.test(document.querySelector('.jp-StatusBar-Widget')?.innerText || '')")


def lab_command(page, command: str, args: dict | None = None) -> None:
    """Run a JupyterLab command, fire and forget (some wait for a dialog: awaiting would deadlock)."""
    page.evaluate("([c, a]) => { window.jupyterapp.commands.execute(c, a || {}); }", [command, args])


def run_all(page) -> None:
    lab_command(page, "notebook:run-all-cells")
    try:
        page.locator(".jp-Dialog .jp-mod-accept").click(timeout=1500)  # a stray "Select Kernel" dialog
    except Exception:  # noqa: BLE001 - usually there is none
        pass


def wait_idle(page, timeout_ms: int = 120_000) -> None:
    page.wait_for_function("() => /\\| Idle/.test(document.querySelector('.jp-StatusBar-Widget')?.innerText || '')",
                           timeout=timeout_ms)


def screenshot(page_or_locator, name: str) -> Path:
    """A PNG in tests/artifacts/ (ignored by git), named for the closing note."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    path = ARTIFACTS / name
    page_or_locator.screenshot(path=str(path))
    return path


def need_browser(*modules: str) -> None:
    """Skip (fail under CI=true) without Chromium, Playwright, the kernel packages or ``modules``."""
    from conftest import need, need_kernel_packages

    reason = browser_missing()
    need(reason is None, reason or "")
    need_kernel_packages()
    for module in modules:
        need(has_module(module), f"{module} is not installed (the [test] extra)")


def notebook(path: Path, cells: list[str]) -> None:
    """Write a notebook of code ``cells`` (Python 3 kernel) to ``path``."""
    import nbformat

    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.cells = [nbformat.v4.new_code_cell(source) for source in cells]
    nbformat.write(nb, path)


def run_cell(page, index: int) -> float:
    """Select code cell ``index`` of the open notebook and run it; returns the page time when it was sent."""
    return page.evaluate("""(i) => {
      const nb = window.jupyterapp.shell.currentWidget.content;
      nb.activeCellIndex = i;
      const t = performance.now();
      window.jupyterapp.commands.execute('notebook:run-cell');
      return t;
    }""", index)

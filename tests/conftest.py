"""Shared fixtures: every test runs in its own project directory with the default store there;
the real servers (moto S3, PostgreSQL, the local model server) some tests need; child-process helpers."""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from types import ModuleType
from typing import NamedTuple

import pytest

REPO = Path(__file__).resolve().parent.parent
# One signing identity for the whole test session (every worker, child process and kernel inherits it),
# not the developer's own key; tests of several people switch it with the `person` fixture.
os.environ.setdefault("CARAVANSERAI_KEY_FILE",
                      str(Path(tempfile.gettempdir()) / f"caravanserai-tests-{os.getuid()}" / "signing_key"))


def need(condition: bool, reason: str, *, whole_module: bool = False) -> None:
    """Skip when a real part (server, browser, kernel) is missing locally; fail under CI=true.

    The one place a test skips (tests/test_package.py checks that no other file does);
    ``whole_module=True`` at a module's top level skips (or fails) the whole module."""
    if condition:
        return
    if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
        pytest.fail(f"required for CI but missing: {reason}")
    pytest.skip(reason, allow_module_level=whole_module)


def has_module(module: str) -> bool:
    """True if ``module`` can be imported (without importing it)."""
    return importlib.util.find_spec(module) is not None


def need_module(name: str, extra: str = "test", *, whole_module: bool = False) -> ModuleType:
    """Import ``name``, or skip (locally) / fail (under CI=true) naming the extra that installs it."""
    try:
        return importlib.import_module(name)
    except ImportError:
        need(False, f"{name} is not installed: pip install 'caravanserai[{extra}]'", whole_module=whole_module)
        raise


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fresh working directory; the default store is ./.caravanserai inside it."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("CARAVANSERAI_STORE", raising=False)
    return tmp_path


class Person(NamedTuple):
    """Someone with their own data directory and signing key (``use`` makes them the one acting)."""

    name: str
    home: Path
    env: dict[str, str]


@pytest.fixture
def person(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """``person("alice")``: a Person of their own (the same OS user); ``person.use(p)`` acts as them in
    this process (environment of caravanserai's key and trust files)."""
    made: dict[str, Person] = {}

    def make(name: str) -> Person:
        if name not in made:
            home = tmp_path / "people" / name
            env = {"XDG_DATA_HOME": str(home), "CARAVANSERAI_KEY_FILE": str(home / "caravanserai" / "signing_key")}
            made[name] = Person(name, home, env)
        return made[name]

    def use(who: Person) -> Person:
        for key, value in who.env.items():
            monkeypatch.setenv(key, value)
        return who

    make.use = use  # type: ignore[attr-defined]
    return make


@pytest.fixture
def child_env() -> dict[str, str]:
    """Environment for child Python processes (the same interpreter, UTF-8, no inherited store)."""
    env = {k: v for k, v in os.environ.items() if k != "CARAVANSERAI_STORE"}
    env["PYTHONUTF8"] = "1"
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    return env


PYTHON = sys.executable


def http_handler_transport(handler):
    """The HTTP store's ``transport`` seam (no network) driven by an httpx-style ``handler(request) ->
    httpx.Response``: for retry and error tests that need answers no real service gives."""
    httpx = need_module("httpx", "http")

    def send(method: str, url: str, headers: dict, body: bytes):
        response = handler(httpx.Request(method, url, headers=headers, content=body))
        return response.status_code, dict(response.headers), response.read()

    return send


def load_child_module(path: Path) -> ModuleType:
    """A child script (tests/children/...) imported by path: it defines functions only, main() runs under __main__."""
    spec = importlib.util.spec_from_file_location(f"_child_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def kill9(proc: subprocess.Popen) -> int:
    """SIGKILL ``proc`` (unless it is already gone) and reap it; returns its exit status."""
    try:
        os.kill(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    return proc.wait(timeout=30)


# ---- real servers on loopback (tests/servers) ---------------------------------------------------
@pytest.fixture(scope="session")
def s3():
    """A moto S3 server for the session (``S3Server``): make a fresh bucket per test with ``create_bucket``."""
    from servers import s3_server

    need(s3_server.available(), "moto server not installed: pip install 'moto[server]'")
    server = s3_server.S3Server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def pg():
    """A PostgreSQL server for the session (``PgServer``: ``.dsn``), or the one TEST_PG_DSN names."""
    from servers import pg_server

    need(pg_server.available(), "no PostgreSQL server binaries (apt-get install postgresql) and no TEST_PG_DSN")
    try:
        import psycopg  # noqa: F401
    except ImportError:
        need(False, "psycopg not installed: pip install 'caravanserai[postgres]'")
    server = pg_server.PgServer.start()
    try:
        yield server
    finally:
        server.stop()


class ModelServer(NamedTuple):
    url: str  # http://127.0.0.1:PORT, without /v1
    model: str  # the model name requests must use


@pytest.fixture(scope="module")
def model_server():
    """The local OpenAI-compatible model server (SmolLM2 via ``transformers serve``), one per test module."""
    from servers import model_server as ms

    built = (ms.DEFAULT_VENV / "bin" / "transformers").exists() and ms.DEFAULT_MODEL_DIR.exists()
    need(built, "the local model server is not set up: python tests/servers/model_server.py setup")
    proc, base_url = ms.start_server()
    try:
        yield ModelServer(base_url.rstrip("/").removesuffix("/v1"), ms.MODEL_NAME)
    finally:
        ms.stop_server(proc)


# ---- real Jupyter kernels (tests/kernel_helpers.py) --------------------------------------------
KERNEL_PACKAGES = ("jupyter_client", "ipykernel", "nbclient", "nbformat", "openai")


def need_kernel_packages() -> None:
    for module in KERNEL_PACKAGES:
        need(importlib.util.find_spec(module) is not None, f"{module} is not installed (the [test] extra)")


@pytest.fixture
def api():
    """The counting model API server (tests/servers/model_api.py) in a thread, fresh for each test."""
    from servers.model_api import start

    with start() as server:
        yield server


@pytest.fixture
def proxy(model_server):
    """A CountingProxy in front of the local model server: records what the server really received."""
    from servers.counting_proxy import CountingProxy

    counting = CountingProxy(model_server.url)
    yield counting
    counting.close()


@pytest.fixture
def kernel_env(tmp_path: Path) -> dict[str, str]:
    from kernel_helpers import child_env

    return child_env(tmp_path)


@pytest.fixture
def kernel(tmp_path: Path, kernel_env: dict[str, str]):
    """``kernel()`` starts a real ipykernel in tmp_path (its default store is ./.caravanserai there)."""
    from kernel_helpers import Kernel

    need_kernel_packages()
    started: list = []

    def start():
        k = Kernel(tmp_path, kernel_env)
        started.append(k)
        return k

    yield start
    for k in started:
        k.close()

"""What the benchmarks and their workers share: options and outputs, work dirs on the real disk,
peer venvs, worker processes, machine notes, timing, fsync accounting, statistics, formatting,
tables, profiles.

Imported by ``bench_*.py`` (their folder is on ``sys.path``) and by the ``_*_worker.py`` scripts
(which put their own folder on ``sys.path``: they may run under ``python -I``). Standard library
only, and nothing here imports ``caravanserai`` when it is imported: ``bench_checkpoints.py``,
``bench_notebook.py`` and the workers call ``install_fsync_counter()`` before they import it.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import datetime as _dt
import io
import json
import math
import os
import platform
import pstats
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
RESULTS = HERE / "results"
QUICK_RESULTS = Path(tempfile.gettempdir()) / "caravanserai-bench"  # --quick: outputs never land in the repo
VENV_OURS = REPO / ".venv"
VENV_PEERS = HERE / ".venv-peers"
# The peers' versions measured in shared/recipes/peers/durable-peers.md; pinned so runs compare.
PEER_PINS = {"langgraph": "1.2.24", "langgraph-checkpoint": "4.3.2", "langgraph-checkpoint-sqlite": "3.1.2",
             "dbos": "3.4.0"}
# Variables a worker must not inherit: it chooses its own store and import path.
WORKER_ENV_DROP = ("CARAVANSERAI_STORE", "PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "DBOS__APPVERSION")
WORKDIR_ENV = "CARAVANSERAI_BENCH_DIR"  # default parent of the work dirs (the tests point it at their tmp dir)
REAL_FDATASYNC = getattr(os, "fdatasync", os.fsync)  # captured before any counter wraps it


def say(text: str = "") -> None:
    print(text, flush=True)


def say_err(text: str = "") -> None:
    print(text, file=sys.stderr, flush=True)


# ---- options and outputs ------------------------------------------------------------------------
def parse_args(parser: argparse.ArgumentParser, name: str, quick: dict | None = None,
               argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Add the options every benchmark has (--quick, --dir, --keep, --out), apply ``quick`` as the
    defaults under --quick (explicit options still win) and parse. ``args.out`` is the JSON path:
    ``benchmarks/results/<name>.json``, or under the temp dir with --quick."""
    parser.add_argument("--quick", action="store_true",
                        help="a smoke run in a few seconds: tiny sizes, 1 round, no peer installs, JSON in the temp dir")
    parser.add_argument("--dir", help=f"parent of the work dir (default ${WORKDIR_ENV}, else next to the repo: the real disk)")
    parser.add_argument("--keep", action="store_true", help="keep the work dir")
    parser.add_argument("--out", type=Path, help=f"JSON results (default benchmarks/results/{name}.json; "
                                                 f"with --quick {QUICK_RESULTS}/{name}.json)")
    if quick and parser.parse_known_args(argv)[0].quick:
        parser.set_defaults(**quick)
    args = parser.parse_args(argv)
    args.out = args.out or (QUICK_RESULTS if args.quick else RESULTS) / f"{name}.json"
    return args


def save_results(path: Path, data: Any, *, indent: int = 1, out: Callable[[str], None] = say) -> Path:
    """Write the results JSON (values JSON cannot hold as ``str``) and say where."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=indent, default=str) + "\n", encoding="utf-8")
    out(f"\nraw numbers: {path}")
    return path


def say_verdict(passed: bool, target: str, detail: str, *, out: Callable[[str], None] = say) -> None:
    out(f"{'PASS' if passed else 'MISS'}  {target}\n      {detail}")


# ---- interpreters, venvs, workers ---------------------------------------------------------------
def venv_python(venv: Path) -> Path:
    return venv / ("Scripts/python.exe" if os.name == "nt" else "bin/python")


def run_code(python: Path | str, code: str, *, isolated: bool = True,
             env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """``python [-I] -c code`` from outside the repo, output captured as text."""
    return subprocess.run([str(python), *(["-I"] if isolated else []), "-c", code], cwd=tempfile.gettempdir(),
                          capture_output=True, text=True, env=env)


def probe_json(python: Path | str, code: str, **kw: Any) -> dict:
    """The JSON object ``code`` prints under ``python`` (see ``run_code``), or {} when it fails."""
    probe = run_code(python, code, **kw)
    return json.loads(probe.stdout) if probe.returncode == 0 else {}


def versions_of(python: Path | str, names: Sequence[str], *, ours: bool = False) -> dict:
    """Installed version of each distribution under ``python`` (None if absent); with ``ours``, the
    repo on ``PYTHONPATH`` and this caravanserai's ``__version__`` too; {} if the probe fails."""
    code = ("import importlib.metadata as m, json, sqlite3, sys\n"
            "out = {'python': sys.version.split()[0], 'sqlite (library)': sqlite3.sqlite_version}\n"
            f"for name in {list(names)!r}:\n"
            "    try: out[name] = m.version(name)\n"
            "    except m.PackageNotFoundError: out[name] = None\n"
            + ("import caravanserai; out['caravanserai'] = caravanserai.__version__\n" if ours else "")
            + "print(json.dumps(out))")
    if not Path(python).exists():
        return {}
    if ours:
        return probe_json(python, code, isolated=False, env={**os.environ, "PYTHONPATH": str(REPO)})
    return probe_json(python, code)


def peer_python(venv: Path, pins: dict[str, str], imports: str, *, install: bool, extra: Sequence[str] = (),
                out: Callable[[str], None] = say) -> tuple[Path | None, str | None]:
    """(``venv``'s python, None) when ``imports`` run there with the ``pins`` installed; otherwise,
    with ``install``, create the venv and ``pip install`` pins + ``extra`` first; (None, why) if not."""
    python = venv_python(venv)
    check = (f"{imports}\nimport importlib.metadata as m\nfor k, v in {pins!r}.items():\n"
             "    assert m.version(k) == v, f'{k} {m.version(k)} installed, {v} wanted'")

    def why_not() -> str | None:
        if not python.exists():
            return f"{venv} does not exist"
        probe = run_code(python, check)
        return None if probe.returncode == 0 else (probe.stderr.strip().splitlines() or ["?"])[-1]

    why = why_not()
    if why is None:
        return python, None
    if not install:
        return None, f"not installed ({why}); --quick installs nothing, a full run sets it up"
    requirements = [*(f"{k}=={v}" for k, v in pins.items()), *extra]
    out(f"setting up {venv} with {' '.join(requirements)} ...")
    try:
        if not python.exists():
            base = getattr(sys, "_base_executable", None) or sys.executable
            subprocess.run([base, "-m", "venv", str(venv)], check=True, capture_output=True, text=True)
        subprocess.run([str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", *requirements],
                       check=True, cwd=tempfile.gettempdir(), capture_output=True, text=True, timeout=900)
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired, OSError) as exc:
        tail = str(getattr(exc, "stderr", None) or exc).strip().splitlines()
        tail = [line for line in tail if not line.startswith("WARNING")] or ["?"]
        return None, "install failed: " + tail[-1][:240]
    why = why_not()
    return (python, None) if why is None else (None, f"import failed after the install: {why}")


def reexec_in_repo_venv(script: str, flag: str) -> None:
    """Run ``script`` again under the repo's .venv (``os.execv``), whatever ``python`` started it.

    ``flag`` (an environment variable) is set first, so the new process never re-executes again.
    """
    target = venv_python(VENV_OURS)
    if target.exists() and Path(sys.prefix).resolve() != VENV_OURS.resolve() and not os.environ.get(flag):
        os.environ[flag] = "1"
        os.execv(str(target), [str(target), str(Path(script).resolve()), *sys.argv[1:]])


def worker_command(python: Path | str, worker: Path, args: Sequence[str], *, ours: bool) -> tuple[list[str], dict]:
    """(command, environment) for a worker: ours with the repo on ``PYTHONPATH``; a peer under
    ``-I`` (no PYTHONPATH, no user site, no script dir on sys.path). Both get ``--repo``."""
    env = {k: v for k, v in os.environ.items() if k not in WORKER_ENV_DROP}
    if ours:
        env["PYTHONPATH"] = str(REPO)
    return [str(python), *([] if ours else ["-I"]), str(worker), *args, "--repo", str(REPO)], env


def run_result_worker(cmd: list[str], *, cwd: Path, env: dict[str, str], timeout: float, label: str,
                      expect_rc: int = 0, echo: str | None = None) -> dict:
    """Run a worker that prints ``RESULT {json}``; its last such line (+ ``process_wall_s``), or
    {"error": ...}. ``echo``: stderr lines starting with it are printed, indented."""
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(cmd, cwd=str(cwd), env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"{label}: timed out after {timeout:.0f} s"}
    wall = time.perf_counter() - t0
    for line in proc.stderr.splitlines() if echo else ():
        if line.startswith(echo):
            say("   " + line)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    if proc.returncode != expect_rc or not lines:
        tail = " | ".join((proc.stderr or proc.stdout).strip().splitlines()[-4:])
        return {"error": f"{label}: exit status {proc.returncode} (expected {expect_rc}): {tail[-700:]}"}
    result = json.loads(lines[-1][len("RESULT "):])
    result.update(process_wall_s=wall, returncode=proc.returncode)
    return result


def worker_parser(modes: Iterable[str]) -> argparse.ArgumentParser:
    """The options every store worker takes (a mode, or ``serve``; sizes; where; which store and run);
    each worker adds its own."""
    p = argparse.ArgumentParser()
    p.add_argument("mode", choices=[*modes, "serve"])
    p.add_argument("--n", type=int, default=1000)
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--dir", default=".")
    p.add_argument("--url", default="")
    p.add_argument("--dsn", default="")
    p.add_argument("--repo", default="")
    p.add_argument("--backing", default="", help="serve: the store behind the journal service")
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--token", default="")
    return p


def emit_result(result: dict) -> None:
    """A worker's answer: one ``RESULT {json}`` line on stdout."""
    sys.stdout.write("RESULT " + json.dumps(result) + "\n")
    sys.stdout.flush()


def which_caravanserai(repo: str | None, expect: str = "ours") -> dict:
    """Import caravanserai and check it is the expected one: ours from ``repo``, or 0.2.0 from
    anywhere else; exits if not. Returns what it found."""
    import importlib.metadata

    import caravanserai

    where = os.path.realpath(caravanserai.__file__)
    in_repo = bool(repo) and where.startswith(os.path.join(os.path.realpath(repo), "caravanserai") + os.sep)
    try:
        meta = importlib.metadata.version("caravanserai")
    except importlib.metadata.PackageNotFoundError:
        meta = None
    ok = (meta == "0.2.0" and not in_repo) if expect == "0.2.0" else (in_repo or not repo)
    if not ok:
        sys.exit(f"[worker {expect}] imported the wrong caravanserai ({meta} from {where})")
    return {"metadata": meta, "version_attr": getattr(caravanserai, "__version__", None), "file": where}


# ---- the work dir: on the real disk, never tmpfs ------------------------------------------------
def mount_of(path: Path, *, with_options: bool = False) -> dict:
    """The mount point, device and file system type (and mount options) holding ``path`` (Linux /proc/mounts)."""
    real = os.path.realpath(path)
    best = {"mount": "?", "device": "?", "fstype": "?", **({"options": ""} if with_options else {})}
    try:
        with open("/proc/mounts", encoding="utf-8") as mounts:
            for line in mounts:
                device, mount, fstype, options = line.split()[:4]
                mount = mount.replace("\\040", " ")
                inside = real == mount or real.startswith(mount.rstrip("/") + "/")
                if inside and len(mount) >= len(best["mount"].replace("?", "")):
                    best = {"mount": mount, "device": device, "fstype": fstype,
                            **({"options": options} if with_options else {})}
    except OSError:
        pass
    return best


def make_workdir(prefix: str, parent: str | Path | None = None) -> Path:
    """A fresh ``<prefix>XXXX`` folder in ``parent`` (default ``$CARAVANSERAI_BENCH_DIR``, else next to
    the repo: the real disk; /tmp may be tmpfs, which has no fsync cost at all)."""
    parent = parent or os.environ.get(WORKDIR_ENV)
    base = Path(parent).expanduser().resolve() if parent else REPO.parent
    base.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=prefix, dir=base))


@contextlib.contextmanager
def workdir(prefix: str, args: argparse.Namespace, *, out: Callable[[str], None] = say, tmpfs_note: str = "",
            with_options: bool = False) -> Iterator[tuple[Path, dict]]:
    """(a fresh work dir, its mount): announced, with a warning on tmpfs; removed afterwards unless --keep."""
    path = make_workdir(prefix, args.dir)
    mount = mount_of(path, with_options=with_options)
    out(f"work dir {path} on {mount['device']} ({mount['fstype']}, mounted at {mount['mount']})")
    if mount["fstype"] in ("tmpfs", "ramfs"):
        out(f"WARNING: the work dir is on tmpfs: fsync costs nothing there{tmpfs_note}")
    try:
        yield path, mount
    finally:
        if args.keep:
            out(f"work dir kept: {path}")
        else:
            shutil.rmtree(path, ignore_errors=True)


# ---- the machine ------------------------------------------------------------------------------
def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as info:
            return next((line.split(":", 1)[1].strip() for line in info if line.startswith("model name")), "?")
    except OSError:
        return "?"


def loadavg() -> list[float] | None:
    try:
        return [float(x) for x in os.getloadavg()]
    except OSError:
        return None


def machine_notes(python_key: str = "python") -> dict:
    """Date (UTC), Python version, platform, CPU count and model, load average; callers add their own keys."""
    return {"date_utc": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            python_key: platform.python_version(), "platform": platform.platform(), "cpu_count": os.cpu_count(),
            "cpu_model": cpu_model(), "loadavg_start": loadavg()}


def fmt_load(load: Sequence[float] | None) -> str:
    return "n/a" if not load else "/".join(f"{x:.2f}" for x in load)


# ---- timing -----------------------------------------------------------------------------------
def sleep_until(t: float) -> None:
    """Sleep until the wall-clock time ``t`` (``time.time()``): processes meet at a shared start."""
    while True:
        left = t - time.time()
        if left <= 0:
            return
        time.sleep(min(left, 0.05))


def time_each(n: int, fn: Callable[[int], Any], warmup: int = 0) -> list[float]:
    """``fn(-1 - i)`` ``warmup`` times untimed, then ``fn(i)`` for i in range(n), each timed on its own (s)."""
    for i in range(warmup):
        fn(-1 - i)
    perf, samples = time.perf_counter, []
    for i in range(n):
        t0 = perf()
        fn(i)
        samples.append(perf() - t0)
    return samples


def best_of(fn: Callable[[], Any], k: int = 5) -> float:
    """The fastest of ``k`` timed calls of ``fn`` (s)."""
    best = math.inf
    for _ in range(k):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


class Usage:
    """Wall time and this process's CPU (user and system, all threads) over a ``with`` block (s)."""

    def __enter__(self) -> Usage:
        self._ru, self._t = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.wall = time.perf_counter() - self._t
        ru = resource.getrusage(resource.RUSAGE_SELF)
        self.user, self.sys = ru.ru_utime - self._ru.ru_utime, ru.ru_stime - self._ru.ru_stime
        self.cpu = self.user + self.sys


def timed(fn: Callable[..., Any], record: Callable[[float], None]) -> Callable[..., Any]:
    """``fn``, each call's duration (s) handed to ``record`` (also as a method, when set on a class)."""
    def timed_call(*args: Any, **kw: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return fn(*args, **kw)
        finally:
            record(time.perf_counter() - t0)
    return timed_call


def sync_appender(path: str | Path, record: bytes) -> Callable[..., None]:
    """``op()``: append ``record`` to ``path`` (O_APPEND) and ``fdatasync`` it, with the real,
    uncounted fdatasync; ``op.close()`` closes and deletes the file."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)

    def op(*_: Any) -> None:
        os.write(fd, record)
        REAL_FDATASYNC(fd)

    def close() -> None:
        os.close(fd)
        os.unlink(path)

    op.close = close  # type: ignore[attr-defined]
    return op


def fsync_floor(directory: str | Path, n: int, record: bytes = b"x" * 99 + b"\n", warmup: int = 5) -> list[float]:
    """The disk's durable-append floor: ``n`` samples (s) of write + fdatasync of ``record`` in ``directory``."""
    op = sync_appender(Path(directory) / f"fsync-floor-{os.getpid()}.bin", record)
    try:
        return time_each(n, op, warmup)
    finally:
        op.close()  # type: ignore[attr-defined]


# ---- fsync accounting -------------------------------------------------------------------------
class FsyncCounter:
    """Counts and times every ``os.fsync``/``os.fdatasync`` call, from all threads (see ``install_fsync_counter``)."""

    def __init__(self) -> None:
        self.calls, self.seconds, self.by_name = 0, 0.0, {"fsync": 0, "fdatasync": 0}
        self.stubbed = False  # True: counted, not made (nothing durable: the library's CPU without the wait)
        self._lock = threading.Lock()

    def wrap(self, real: Callable[[int], None]) -> Callable[[int], None]:
        def wrapper(fd: int) -> None:
            t0 = time.perf_counter()
            try:
                if not self.stubbed:
                    real(fd)
            finally:
                elapsed = time.perf_counter() - t0
                with self._lock:
                    self.seconds += elapsed
                    self.calls += 1
                    self.by_name[real.__name__] = self.by_name.get(real.__name__, 0) + 1
        wrapper.__name__ = real.__name__
        wrapper.__wrapped__ = real  # type: ignore[attr-defined]
        return wrapper

    def reset(self) -> None:
        with self._lock:
            self.calls, self.seconds, self.by_name = 0, 0.0, {"fsync": 0, "fdatasync": 0}

    @contextlib.contextmanager
    def delta(self) -> Iterator[dict]:
        """A dict that holds, after the block, the calls and seconds made during it."""
        got: dict = {}
        calls, seconds = self.calls, self.seconds
        yield got
        got.update(calls=self.calls - calls, seconds=self.seconds - seconds)


def install_fsync_counter() -> FsyncCounter:
    """Wrap ``os.fsync``/``os.fdatasync`` (before caravanserai is imported: the code under test looks
    them up on ``os`` at call time); every call is then counted and timed. Once per process."""
    if isinstance(getattr(os, "_bench_fsync_counter", None), FsyncCounter):
        return os._bench_fsync_counter  # type: ignore[attr-defined]
    counter = FsyncCounter()
    os.fsync = counter.wrap(os.fsync)
    if hasattr(os, "fdatasync"):
        os.fdatasync = counter.wrap(os.fdatasync)
    os._bench_fsync_counter = counter  # type: ignore[attr-defined]
    return counter


# ---- servers and floors the store benchmarks share ------------------------------------------------
def load_helper(name: str) -> Any:
    """``tests/servers/<name>.py``, the tests' own server helpers (``tests/`` put on ``sys.path`` once)."""
    import importlib

    tests = str(REPO / "tests")
    if tests not in sys.path:
        sys.path.insert(0, tests)
    return importlib.import_module(f"servers.{name}")


class HttpFloor:
    """The journal service's floor operation: a bare POST of ``record`` to ``/health`` on one keep-alive
    connection of the HTTP store's own client (``http_wire.Wire``: httptools where installed), then, with
    ``sync_path``, ``os.write`` + ``os.fdatasync`` of the same bytes in that file (the service's disk).
    Call it as ``floor(i)``: for ``i >= 0`` (a timed call of ``time_each``) the two parts go to ``post``
    and ``fsync`` (s); ``status`` counts the answers."""

    def __init__(self, url: str, record: bytes, sync_path: str | Path | None = None) -> None:
        from urllib.parse import urlsplit

        from caravanserai.stores.http_wire import Wire

        parts = urlsplit(url)
        self.url, self.record = f"{parts.scheme}://{parts.netloc}{parts.path.rstrip('/')}/health", record
        self.client = Wire(self.url, {}, 10.0)
        self.sync = sync_appender(sync_path, record) if sync_path is not None else None
        self.post: list[float] = []
        self.fsync: list[float] = []
        self.status: dict[int, int] = {}

    def request(self, method: str, body: bytes | None) -> int:
        """One request to ``/health`` on the kept-alive connection; its status."""
        answer = self.client.request(method, self.url, content=body, headers={"Content-Type": "application/octet-stream"})
        return answer.status_code

    def __call__(self, i: int = -1) -> None:
        t = time.perf_counter()
        status = self.request("POST", self.record)
        t2 = time.perf_counter()
        if self.sync is not None:
            self.sync()
        self.status[status] = self.status.get(status, 0) + 1
        if i >= 0:
            self.post.append(t2 - t)
            if self.sync is not None:
                self.fsync.append(time.perf_counter() - t2)

    def close(self) -> None:
        if self.sync is not None:
            self.sync.close()  # type: ignore[attr-defined]
        self.client.close()


def floor_http(url: str, n: int, warmup: int, record: bytes, *, sync_path: str | Path | None = None,
               get_n: int = 0) -> dict:
    """``n`` timed ``HttpFloor`` calls (after ``warmup``): a worker's ``floor_http`` result. ``get_n``
    adds that many bare ``GET /health`` (``get_health``)."""
    floor = HttpFloor(url, record, sync_path)
    try:
        samples = time_each(n, floor, warmup)
        get = time_each(get_n, lambda i: floor.request("GET", None)) if get_n else []
    finally:
        floor.close()
    out: dict[str, Any] = {"samples_us": to_us(samples), "post": describe(floor.post), "status_codes": floor.status}
    if sync_path is not None:
        out["fsync"] = describe(floor.fsync)
        out["what"] = f"POST {len(record)} B to /health + os.write + os.fdatasync on the service's disk"
    else:
        out["what"] = f"POST of {len(record)} B to /health (the HTTP store's client, keep-alive)"
    if get_n:
        out["get_health"] = describe(to_us(get), scale=1)
    return out


def floor_pg(dsn: str, n: int, warmup: int, payload: str, table: str) -> dict:
    """``n`` timed single-row ``INSERT`` of ``payload`` + COMMIT (an autocommit psycopg connection) into
    a fresh ``table``, dropped after: PostgreSQL's floor, with the server's durability settings."""
    import psycopg

    conn = psycopg.connect(dsn, autocommit=True)
    try:
        conn.execute(f"DROP TABLE IF EXISTS {table}")
        conn.execute(f"CREATE TABLE {table} (id BIGSERIAL PRIMARY KEY, payload TEXT NOT NULL)")
        query = f"INSERT INTO {table} (payload) VALUES (%s)"
        samples = time_each(n, lambda i: conn.execute(query, (payload,)), warmup)
        settings = {name: conn.execute(f"SHOW {name}").fetchone()[0]
                    for name in ("server_version", "fsync", "synchronous_commit", "wal_sync_method", "full_page_writes")}
        conn.execute(f"DROP TABLE {table}")
    finally:
        conn.close()
    return {"samples_us": to_us(samples), "settings": settings, "psycopg": psycopg.__version__,
            "what": f"INSERT of {len(payload)} B + COMMIT (autocommit psycopg connection)"}


# ---- statistics -------------------------------------------------------------------------------
def median_of(values: Iterable[Any]) -> float | None:
    """Median of the numbers among ``values`` (None and the like skipped); None when there are none."""
    present = [v for v in values if isinstance(v, (int, float))]
    return statistics.median(present) if present else None


def nearest_rank(ordered: Sequence[float], q: float) -> float:
    """Nearest-rank percentile of sorted ``ordered``, ``q`` in 0..1."""
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def describe(samples: Iterable[float], *, scale: float = 1e6, unit: str = "_us") -> dict:
    """n, median, mean, p90, p99, min, max of ``samples`` times ``scale``, keys suffixed by ``unit``
    (default: seconds in, microseconds out); {"n": 0} when empty."""
    s = sorted(x * scale for x in samples)
    if not s:
        return {"n": 0}
    return {"n": len(s), f"median{unit}": statistics.median(s), f"mean{unit}": statistics.fmean(s),
            f"p90{unit}": nearest_rank(s, 0.90), f"p99{unit}": nearest_rank(s, 0.99), f"min{unit}": s[0],
            f"max{unit}": s[-1]}


def to_us(samples_s: Iterable[float]) -> list[float]:
    return [round(s * 1e6, 1) for s in samples_s]


# ---- formatting -------------------------------------------------------------------------------
def fmt_time(seconds: float | None) -> str:
    if seconds is None or (isinstance(seconds, float) and math.isnan(seconds)):
        return "n/a"
    a = abs(seconds)
    if a >= 1:
        return f"{seconds:.2f} s"
    if a >= 10e-3:
        return f"{seconds * 1e3:.1f} ms"
    if a >= 1e-3:
        return f"{seconds * 1e3:.2f} ms"
    if a >= 10e-6:
        return f"{seconds * 1e6:.0f} us"
    return f"{seconds * 1e6:.2f} us"


def fmt_us(us: float | None) -> str:
    return fmt_time(None if us is None else us / 1e6)


def fmt_bytes(n: float | None) -> str:
    if n is None:
        return "n/a"
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(n) >= size:
            return f"{n / size:.2f} {unit}"
    return f"{n:.0f} B"


def fmt_ratio(ratio: float | None) -> str:
    if ratio is None:
        return "-"
    return f"{ratio:.1f}x" if ratio < 1000 else f"{ratio:,.0f}x"


def md_table(header: Sequence[Any], rows: Iterable[Sequence[Any]], *, align: str | None = None,
             header_align: str | None = None, min_widths: Sequence[int] = ()) -> list[str]:
    """A Markdown table's lines. ``align``/``header_align``: "l" or "r" per column (default: the first
    column left, the others right; the header as the rows); a row shorter than the header is padded."""
    n = len(header)
    rows = [[*map(str, r), *[""] * (n - len(r))] for r in rows]
    header = [str(h) for h in header]
    align = align or "l" + "r" * (n - 1)
    header_align = header_align or align
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(n)]
    widths = [max(w, min_widths[i] if i < len(min_widths) else 0) for i, w in enumerate(widths)]

    def line(cells: Sequence[str], how: str) -> str:
        return "| " + " | ".join(c.ljust(w) if a == "l" else c.rjust(w) for c, w, a in zip(cells, widths, how)) + " |"

    return [line(header, header_align), "|" + "|".join("-" * (w + 2) for w in widths) + "|",
            *(line(r, align) for r in rows)]


# ---- profiles ---------------------------------------------------------------------------------
def profile_text(prof: cProfile.Profile | pstats.Stats, sorts: Sequence[tuple[str, int]]) -> str:
    """pstats listings of ``prof``, one per (sort key, how many lines)."""
    text = io.StringIO()
    for key, limit in sorts:
        buf = io.StringIO()
        stats = prof if isinstance(prof, pstats.Stats) else pstats.Stats(prof)
        stats.stream = buf  # type: ignore[attr-defined]
        stats.sort_stats(key).print_stats(limit)
        text.write(f"==== sorted by {key} ====\n{buf.getvalue()}\n")
    return text.getvalue()


def profile_rows(prof: cProfile.Profile | pstats.Stats, per: float = 1.0) -> list[dict]:
    """One row per function: file, line, func, calls, own and cumulative seconds, each divided by ``per``."""
    stats = prof if isinstance(prof, pstats.Stats) else pstats.Stats(prof)
    return [{"file": file, "line": line, "func": func, "where": f"{os.path.basename(file)}:{line}({func})",
             "calls": nc / per, "own_s": tt / per, "cum_s": ct / per}
            for (file, line, func), (_cc, nc, tt, ct, _callers) in stats.stats.items()]  # type: ignore[attr-defined]


# ---- DBOS, for the peer workers ---------------------------------------------------------------
def dbos_launch(name: str, database_url: str, app_version: str) -> float:
    """Configure and launch DBOS on ``database_url``, quietly; returns the launch time (s)."""
    import logging

    from dbos import DBOS

    t = time.perf_counter()
    DBOS(config={"name": name, "system_database_url": database_url, "application_version": app_version,
                 "log_level": "WARNING", "console_log_level": "WARNING"})
    DBOS.launch()
    logging.getLogger("dbos").setLevel(logging.WARNING)
    return time.perf_counter() - t


def dbos_destroy() -> None:
    from dbos import DBOS

    try:
        DBOS.destroy(destroy_registry=True)
    except Exception:  # noqa: BLE001 - shutting down after the measurement
        pass

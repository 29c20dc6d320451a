"""What the benchmarks share: work dirs on the real disk, peer venvs, machine notes, statistics,
tables, results JSON, worker processes.

Imported by ``bench_*.py`` (``from _common import ...``: the script's folder is on ``sys.path``).
Standard library only, and nothing here imports ``caravanserai``: ``bench_checkpoints.py`` and
``bench_notebook.py`` call ``install_fsync_counter()`` before they import it.
"""

from __future__ import annotations

import datetime as _dt
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
RESULTS = HERE / "results"
VENV_OURS = REPO / ".venv"
VENV_PEERS = HERE / ".venv-peers"
# Variables a worker must not inherit: it chooses its own store and import path.
WORKER_ENV_DROP = ("CARAVANSERAI_STORE", "PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP")


def say(text: str = "") -> None:
    print(text, flush=True)


# ---- interpreters and venvs -------------------------------------------------------------------
def venv_python(venv: Path) -> Path:
    return venv / ("Scripts/python.exe" if os.name == "nt" else "bin/python")


def ensure_venv(venv: Path, *, capture: bool = False) -> Path:
    """``venv``'s python, after creating the venv (from the base interpreter) when it is missing."""
    python = venv_python(venv)
    if not python.exists():
        base = getattr(sys, "_base_executable", None) or sys.executable
        subprocess.run([base, "-m", "venv", str(venv)], check=True, capture_output=capture, text=capture)
    return python


def pip_install(python: Path, requirements: Iterable[str], *, capture: bool = False,
                timeout: float | None = None) -> None:
    """``pip install --quiet`` into ``python``'s environment, run outside the repo."""
    subprocess.run([str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", *requirements],
                   check=True, cwd=tempfile.gettempdir(), capture_output=capture, text=capture, timeout=timeout)


def run_code(python: Path | str, code: str, *, isolated: bool = True,
             env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """``python [-I] -c code`` from outside the repo, output captured as text."""
    return subprocess.run([str(python), *(["-I"] if isolated else []), "-c", code], cwd=tempfile.gettempdir(),
                          capture_output=True, text=True, env=env)


def probe_json(python: Path | str, code: str, **kw: Any) -> dict:
    """The JSON object ``code`` prints under ``python`` (see ``run_code``), or {} when it fails."""
    probe = run_code(python, code, **kw)
    return json.loads(probe.stdout) if probe.returncode == 0 else {}


def versions_code(names: Sequence[str]) -> str:
    """Source of a loop that fills ``out`` with the installed version of each distribution (None if absent)."""
    return (f"for name in {list(names)!r}:\n"
            "    try: out[name] = m.version(name)\n"
            "    except m.PackageNotFoundError: out[name] = None\n")


def reexec_in_repo_venv(script: str, flag: str) -> None:
    """Run ``script`` again under the repo's .venv (``os.execv``), whatever ``python`` started it.

    ``flag`` (an environment variable) is set first, so the new process never re-executes again.
    """
    target = venv_python(VENV_OURS)
    if target.exists() and Path(sys.prefix).resolve() != VENV_OURS.resolve() and not os.environ.get(flag):
        os.environ[flag] = "1"
        os.execv(str(target), [str(target), str(Path(script).resolve()), *sys.argv[1:]])


def worker_env(*also_drop: str) -> dict[str, str]:
    """This process's environment without what would steer a worker's store or imports."""
    drop = (*WORKER_ENV_DROP, *also_drop)
    return {k: v for k, v in os.environ.items() if k not in drop}


def run_result_worker(cmd: list[str], *, cwd: Path, env: dict[str, str], timeout: float, label: str,
                      expect_rc: int = 0, show_expected: bool = True, tail_chars: int = 600) -> dict:
    """Run a worker that prints ``RESULT {json}``; its last such line (+ ``process_wall_s``), or {"error": ...}."""
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(cmd, cwd=str(cwd), env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"{label}: timed out after {timeout:.0f} s"}
    wall = time.perf_counter() - t0
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    if proc.returncode != expect_rc or not lines:
        tail = " | ".join((proc.stderr or proc.stdout).strip().splitlines()[-4:])
        expected = f" (expected {expect_rc})" if show_expected else ""
        return {"error": f"{label}: exit status {proc.returncode}{expected}: {tail[-tail_chars:]}"}
    result = json.loads(lines[-1][len("RESULT "):])
    result["process_wall_s"] = wall
    return result


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
    """A fresh ``<prefix>XXXX`` folder in ``parent``, by default next to the repo: the real disk
    (/tmp may be tmpfs, which has no fsync cost at all)."""
    base = Path(parent).expanduser().resolve() if parent else REPO.parent
    base.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=prefix, dir=base))


def announce_workdir(path: Path, *, out: Callable[[str], None] = print, tmpfs_note: str = "",
                     with_options: bool = False) -> dict:
    """Print where the work dir lives, warn when that is tmpfs/ramfs; returns ``mount_of(path)``."""
    mount = mount_of(path, with_options=with_options)
    out(f"work dir {path} on {mount['device']} ({mount['fstype']}, mounted at {mount['mount']})")
    if mount["fstype"] in ("tmpfs", "ramfs"):
        out(f"WARNING: the work dir is on tmpfs: fsync costs nothing there{tmpfs_note}")
    return mount


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
    """Date (UTC), Python version, platform, CPU count and model; callers add their own keys after these."""
    return {"date_utc": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            python_key: platform.python_version(), "platform": platform.platform(), "cpu_count": os.cpu_count(),
            "cpu_model": cpu_model()}


# ---- fsync accounting -------------------------------------------------------------------------
def install_fsync_counter() -> dict:
    """Wrap ``os.fsync``/``os.fdatasync`` (before caravanserai is imported): every call is counted and
    timed into the returned ``{"calls": n, "seconds": s}``."""
    counts = {"calls": 0, "seconds": 0.0}

    def counted(real: Callable[[int], None]) -> Callable[[int], None]:
        def wrapper(fd: int) -> None:
            t0 = time.perf_counter()
            try:
                real(fd)
            finally:
                counts["seconds"] += time.perf_counter() - t0
                counts["calls"] += 1
        wrapper.__name__ = real.__name__
        return wrapper

    os.fsync = counted(os.fsync)
    if hasattr(os, "fdatasync"):
        os.fdatasync = counted(os.fdatasync)
    return counts


# ---- statistics -------------------------------------------------------------------------------
def median_of(values: Iterable[Any]) -> float | None:
    """Median of the numbers among ``values`` (None and the like skipped); None when there are none."""
    present = [v for v in values if isinstance(v, (int, float))]
    return statistics.median(present) if present else None


def nearest_rank(ordered: Sequence[float], q: float) -> float:
    """Nearest-rank percentile of sorted ``ordered``, ``q`` in 0..1."""
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


# ---- tables and results -----------------------------------------------------------------------
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


def write_json(path: str | Path, data: Any, *, indent: int, default: Callable[[Any], Any] | None = None,
               newline: bool = False) -> Path:
    """Write ``data`` as JSON to ``path`` (its folder created); returns the path."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(data, indent=indent, default=default) + ("\n" if newline else ""), encoding="utf-8")
    return out

#!/usr/bin/env python3
"""Separate virtual environments for agent frameworks that cannot share the project's venv (stdlib only).

CrewAI pins ``openai<3`` and ``pydantic<2.13`` (the project's venv has openai 3.x on httpx2), and the
Claude Agent SDK's wheel bundles a ~400 MB native Claude Code CLI. Each gets its own venv at the repo
root, with the framework pinned to a version measured to work and caravanserai installed editable
from this repository (so the venv always runs the current source):

    python tests/servers/framework_venvs.py setup [crewai|claude|all]   # build (cached; ~0.2 s when done)
    python tests/servers/framework_venvs.py check [crewai|claude|all]   # build if needed, print versions

From tests::

    from servers.framework_venvs import framework_env, venv_python
    py = venv_python("crewai")                  # Path to .venv-crewai/bin/python (built on first use)
    env = {**os.environ, **framework_env("crewai"), "HOME": str(tmp_path)}
    subprocess.run([py, child_script, base_url], env=env, check=True)

See tests/servers/FRAMEWORKS.md for versions, sizes, timings and what each framework sends.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

try:  # imported as servers.framework_venvs (tests) or run as a script (sys.path[0] == tests/servers)
    from ._proc import build_lock
except ImportError:
    from _proc import build_lock  # type: ignore[no-redef]

REPO = Path(__file__).resolve().parents[2]
SPEC_VERSION = 1

# Pins measured to work together (Python 3.11; see FRAMEWORKS.md). Changing one rebuilds that venv.
FRAMEWORKS: dict[str, dict] = {
    "crewai": {
        "venv": Path(os.environ.get("CARAVANSERAI_CREWAI_VENV", REPO / ".venv-crewai")),
        "packages": ["crewai==1.15.30", "openai==2.54.0"],
        # printed by `check` and verified after a build: (import name, distribution, required version prefix)
        "verify": [("crewai", "crewai", "1.15.30"), ("openai", "openai", "2."), ("pydantic", "pydantic", "2.12.")],
        # offline and quiet: no telemetry to telemetry.crewai.com (else ~12 s of retries at exit), no
        # trace prompt, no PyPI version check
        "env": {
            "CREWAI_DISABLE_TELEMETRY": "true",
            "OTEL_SDK_DISABLED": "true",
            "CREWAI_TRACING_ENABLED": "false",
            "CREWAI_DISABLE_VERSION_CHECK": "true",
        },
    },
    "claude": {
        "venv": Path(os.environ.get("CARAVANSERAI_CLAUDE_VENV", REPO / ".venv-claude")),
        "packages": ["claude-agent-sdk==0.2.189", "httpx>=0.27"],  # httpx: the run's journaling proxy (caravanserai[openai])
        "verify": [("claude_agent_sdk", "claude-agent-sdk", "0.2.189")],
        # CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC alone already drops the HEAD /api/hello preflight, the
        # session-title request and the DNS lookups of api.anthropic.com; the others are belt and braces.
        "env": {
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
            "DISABLE_TELEMETRY": "1",
            "DISABLE_ERROR_REPORTING": "1",
            "DISABLE_AUTOUPDATER": "1",
        },
    },
}
NAMES = tuple(FRAMEWORKS)


def _log(msg: str) -> None:
    print(f"[framework_venvs] {msg}", file=sys.stderr, flush=True)


def _spec(name: str) -> dict:
    try:
        return FRAMEWORKS[name]
    except KeyError:
        raise ValueError(f"unknown framework venv {name!r}; known: {', '.join(NAMES)}") from None


def venv_dir(name: str) -> Path:
    """Where the venv for ``name`` lives (``.venv-<name>`` at the repo root unless overridden)."""
    return Path(_spec(name)["venv"])


def framework_env(name: str) -> dict[str, str]:
    """Environment variables that keep the framework offline and quiet; add them to a child's env."""
    return dict(_spec(name)["env"])


def _child_env() -> dict[str, str]:
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)  # keep the project's path out of the framework venv
    env.pop("VIRTUAL_ENV", None)
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    return env


def _run(cmd: list, **kw) -> None:
    _log("$ " + " ".join(str(c) for c in cmd))
    subprocess.run([str(c) for c in cmd], check=True, **kw)




def _env_spec(name: str) -> dict:
    return {"v": SPEC_VERSION, "name": name, "python": sys.version.split()[0], "packages": _spec(name)["packages"]}


def _pyproject_hash() -> str:
    """caravanserai is installed editable; a changed pyproject.toml (deps, package list) means reinstall it."""
    try:
        return hashlib.sha256((REPO / "pyproject.toml").read_bytes()).hexdigest()[:16]
    except OSError:
        return ""


def _read_stamp(stamp: Path) -> dict:
    try:
        data = json.loads(stamp.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _stamp_state(py: Path, stamp: Path, name: str) -> str:
    """"ok", "reinstall" (only caravanserai is stale) or "rebuild"."""
    data = _read_stamp(stamp)
    if not py.exists() or data.get("spec") != _env_spec(name):
        return "rebuild"
    return "ok" if data.get("pyproject") == _pyproject_hash() else "reinstall"


def ensure_venv(name: str) -> Path:
    """Create (once) the venv for ``name`` ("crewai" or "claude"); returns its python.

    A stamp file makes repeat calls ~free. When only pyproject.toml changed, caravanserai alone is
    reinstalled (editable, a few seconds) instead of rebuilding the venv.
    """
    d = venv_dir(name)
    py = d / "bin" / "python"
    stamp = d / ".framework-venv-stamp.json"
    if _stamp_state(py, stamp, name) == "ok":
        return py
    with build_lock(d, "fwvenv"):
        state = _stamp_state(py, stamp, name)
        if state == "ok":
            return py
        if state == "reinstall":
            return _reinstall_caravanserai(name, py, stamp)
        return _build(name, d, py, stamp)


def venv_python(name: str) -> Path:
    """The python of the framework venv ``name``, building the venv if it is missing or stale."""
    return ensure_venv(name)


def claude_cli_path() -> Path:
    """The Claude Code CLI bundled in the claude-agent-sdk wheel (what ``query()`` spawns by default)."""
    return Path(info("claude")["claude_cli"])


_VERIFY = r"""
import importlib, importlib.metadata as md, json, sys
checks = json.loads(sys.argv[1])
out = {}
for mod, dist, _ in checks:
    importlib.import_module(mod)
    out[dist] = md.version(dist)
import caravanserai, caravanserai.calls, caravanserai.runs
out["caravanserai"] = md.version("caravanserai")
out["caravanserai_file"] = caravanserai.__file__
for dist in ("openai", "pydantic", "httpx", "httpx2"):
    try:
        out.setdefault(dist, md.version(dist))
    except md.PackageNotFoundError:
        out.setdefault(dist, None)
print(json.dumps(out))
"""


def _verify(name: str, py: Path) -> dict:
    checks = _spec(name)["verify"]
    r = subprocess.run([py, "-c", _VERIFY, json.dumps(checks)], env=_child_env(), capture_output=True, text=True,
                       cwd=tempfile.gettempdir())  # not the repo root: import caravanserai must come from the install
    if r.returncode != 0:
        raise RuntimeError(f"{name} venv does not import: {r.stderr[-3000:]}")
    info = json.loads(r.stdout.strip().splitlines()[-1])
    for _, dist, want in checks:
        if not str(info.get(dist)).startswith(want):
            raise RuntimeError(f"{name} venv has {dist} {info.get(dist)}, expected {want}")
    if Path(info["caravanserai_file"]).resolve().parent != (REPO / "caravanserai").resolve():
        raise RuntimeError(f"{name} venv imports caravanserai from {info['caravanserai_file']}, not from {REPO}")
    if name == "claude":  # the bundled CLI must be there and run
        out = subprocess.run(
            [py, "-c", "import claude_agent_sdk, pathlib, subprocess, sys;"
             "p = pathlib.Path(claude_agent_sdk.__file__).parent / '_bundled' / 'claude';"
             "print(p); print(subprocess.run([str(p), '--version'], capture_output=True, text=True, check=True).stdout.strip())"],
            env=_child_env(), check=True, capture_output=True, text=True,
        ).stdout.strip().splitlines()
        cli = Path(out[0])
        info["claude_cli"] = str(cli)
        info["claude_cli_version"] = out[1]
        info["claude_cli_mb"] = round(cli.stat().st_size / 1e6, 1)
    return info


def _size_mb(path: Path) -> float:
    total = 0
    for root, _dirs, files in os.walk(path):
        for f in files:
            with contextlib.suppress(OSError):
                st = os.lstat(os.path.join(root, f))
                total += st.st_blocks * 512
    return round(total / 1e6, 1)


def _install_caravanserai_cmd(py: Path) -> list:
    return [py, "-m", "pip", "install", "-qq", "-e", REPO]


def _build(name: str, d: Path, py: Path, stamp: Path) -> Path:
    t0 = time.monotonic()
    if d.exists():
        _log(f"rebuilding {d} (stamp missing or different)")
        shutil.rmtree(d)
    _run([sys.executable, "-m", "venv", d])
    # One resolve: the framework pins and caravanserai (editable) together.
    _run([*_install_caravanserai_cmd(py), *_spec(name)["packages"]], env=_child_env())
    info = _verify(name, py)
    info.update(build_s=round(time.monotonic() - t0, 1), size_mb=_size_mb(d))
    stamp.write_text(json.dumps({"spec": _env_spec(name), "pyproject": _pyproject_hash(), "info": info}, indent=1))
    _log(f"{name} venv ready in {info['build_s']}s, {info['size_mb']} MB at {d}: "
         + ", ".join(f"{k} {v}" for k, v in info.items() if k not in ("build_s", "size_mb", "caravanserai_file")))
    return py


def _reinstall_caravanserai(name: str, py: Path, stamp: Path) -> Path:
    t0 = time.monotonic()
    _log(f"pyproject.toml changed: reinstalling caravanserai into {venv_dir(name)}")
    _run(_install_caravanserai_cmd(py), env=_child_env())
    info = _verify(name, py)
    data = _read_stamp(stamp)
    info.update(build_s=data.get("info", {}).get("build_s"), size_mb=data.get("info", {}).get("size_mb"))
    stamp.write_text(json.dumps({"spec": _env_spec(name), "pyproject": _pyproject_hash(), "info": info}, indent=1))
    _log(f"caravanserai reinstalled in {time.monotonic() - t0:.1f}s")
    return py


def info(name: str) -> dict:
    """What the last build recorded (versions, build_s, size_mb); builds the venv if needed."""
    ensure_venv(name)
    return _read_stamp(venv_dir(name) / ".framework-venv-stamp.json").get("info", {})


# ---------------------------------------------------------------- CLI


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("command", choices=["setup", "check"])
    ap.add_argument("which", nargs="?", default="all", choices=[*NAMES, "all"])
    a = ap.parse_args(argv)
    names = NAMES if a.which == "all" else (a.which,)
    report = {}
    for name in names:
        t0 = time.monotonic()
        py = ensure_venv(name)
        report[name] = {"python": str(py), "setup_s": round(time.monotonic() - t0, 1)}
        if a.command == "check":
            report[name]["verified"] = _verify(name, py)
            report[name]["recorded"] = info(name)
    print(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The benchmarks keep running: each ``benchmarks/bench_*.py`` in its ``--quick`` mode exits 0,
prints its report (a Markdown table) and writes its JSON where ``--out`` says.

The figures are not checked: the benchmarks are reports, not tests. Peers that are not installed
(LangGraph, DBOS, the caravanserai 0.2.0 venv) and servers (PostgreSQL, S3) are skipped by the
benchmark itself in quick mode, with a printed line; nothing is installed.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from caravanserai._moved import MOVED

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"
SCRIPTS = sorted(BENCHMARKS.glob("bench_*.py"))


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda path: path.stem)
def test_quick_run_prints_its_report(script: Path, tmp_path: Path) -> None:
    out = tmp_path / "results" / f"{script.stem}.json"
    env = {**os.environ, "CARAVANSERAI_BENCH_DIR": str(tmp_path / "work")}  # the work dirs' parent
    env.pop("CARAVANSERAI_STORE", None)
    proc = subprocess.run([sys.executable, str(script), "--quick", "--out", str(out)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-4000:]
    lines = output.splitlines()
    assert any(line.startswith("|--") for line in lines), f"no report table in the output:\n{output[-4000:]}"
    assert isinstance(json.loads(out.read_text(encoding="utf-8")), dict)
    work = tmp_path / "work"
    assert not work.exists() or not any(work.iterdir()), "the work dir was not removed"


def test_quick_results_go_to_the_temp_dir() -> None:
    sys.path.insert(0, str(BENCHMARKS))
    try:
        from _common import RESULTS, parse_args
    finally:
        sys.path.remove(str(BENCHMARKS))
    quick = parse_args(argparse.ArgumentParser(), "x", argv=["--quick"])
    assert quick.out.is_relative_to(tempfile.gettempdir()) and not quick.out.is_relative_to(BENCHMARKS.parent)
    assert parse_args(argparse.ArgumentParser(), "x", argv=[]).out == RESULTS / "x.json"


@pytest.mark.parametrize("source", sorted(BENCHMARKS.glob("*.py")), ids=lambda path: path.name)
def test_benchmarks_use_public_new_paths(source: Path) -> None:
    """No private name imported from caravanserai, no module imported by its old (moved) path."""
    tree = ast.parse(source.read_text(encoding="utf-8"))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("caravanserai"):
            modules = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            found += [f"{node.module}.{a.name}" for a in node.names if a.name.startswith("_")]
        elif isinstance(node, ast.Import):
            modules = [a.name for a in node.names]
        else:
            continue
        found += [m for m in modules if m in MOVED or any(part.startswith("_") for part in m.split(".")[1:])]
    assert not found, f"{source.name} imports {found}"

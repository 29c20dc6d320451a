"""Shared fixtures: every test runs in its own project directory with the default store there."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def need(condition: bool, reason: str) -> None:
    """Skip when a real part (server, browser, kernel) is missing locally; fail under CI=true."""
    if condition:
        return
    if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
        pytest.fail(f"required for CI but missing: {reason}")
    pytest.skip(reason)


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fresh working directory; the default store is ./.caravanserai inside it."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("CARAVANSERAI_STORE", raising=False)
    return tmp_path


@pytest.fixture
def child_env() -> dict[str, str]:
    """Environment for child Python processes (the same interpreter, UTF-8, no inherited store)."""
    env = {k: v for k, v in os.environ.items() if k != "CARAVANSERAI_STORE"}
    env["PYTHONUTF8"] = "1"
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    return env


PYTHON = sys.executable

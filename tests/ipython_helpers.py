"""What the in-process IPython extension tests share (test_ipython_ext.py, test_ipython_values.py):
IPython's own test shell (``globalipapp``), the extension loaded per module, a fresh project and
``user_ns`` per test, and helpers to run a cell and simulate a kernel restart."""

from __future__ import annotations

import dataclasses
import textwrap
from pathlib import Path

import pytest
from conftest import has_module, need

# the notebook layer is optional (the package imports without it): skip locally, fail under CI=true
need(has_module("IPython"), "IPython is not installed (the [test] extra installs it with ipykernel)", whole_module=True)

from IPython.testing.globalipapp import get_ipython  # noqa: E402
from IPython.utils.capture import capture_output  # noqa: E402

import caravanserai.runs.trust as trust  # noqa: E402
from caravanserai import open_store  # noqa: E402
from caravanserai.runs import read_events  # noqa: E402

ip = get_ipython()


class Tag:
    """A custom (non-JSON, non-dataclass) object: a set of these is saved with pickle."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Tag) and other.name == self.name

    def __hash__(self) -> int:
        return hash(self.name)


@dataclasses.dataclass
class Box:  # importable dataclass, used to show the codec is not pickle
    label: str
    sizes: list


def load_extension():
    """The extension loaded for a test module (``extension = pytest.fixture(scope="module", autouse=True)(...)``)."""
    ip.run_line_magic("load_ext", "caravanserai")
    yield
    ip.run_line_magic("unload_ext", "caravanserai")


def fresh_session(project: Path, monkeypatch: pytest.MonkeyPatch):
    """A fresh project dir, no trusted stores or keys; the test's user_ns names removed after."""
    for var in ("CARAVANSERAI_SIGNING_KEY", "CARAVANSERAI_TRUSTED_STORES", "CARAVANSERAI_TRUSTED_KEYS"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("XDG_DATA_HOME", str(project / ".people"))  # no lasting trust from another test
    monkeypatch.setattr(trust, "_TRUSTED", set())
    before = set(ip.user_ns)
    log: list = []
    ip.user_ns["log"] = log
    ip.user_ns["crash_at"] = -1
    yield log
    for name in set(ip.user_ns) - before:
        ip.user_ns.pop(name, None)


def run(code: str):
    """Run one cell as typed; (ExecutionResult, captured stdout)."""
    with capture_output() as captured:
        result = ip.run_cell(textwrap.dedent(code), store_history=True)
    return result, captured.stdout


def forget(*names: str) -> None:
    """What a kernel restart does to the cell's variables."""
    for name in names:
        ip.user_ns.pop(name, None)


def events(run_id: str, store: str | Path | None = None) -> list[dict]:
    return read_events(run_id, open_store(str(store) if store is not None else None))


def types(run_id: str, store: str | Path | None = None) -> list[str]:
    return [e["type"] for e in events(run_id, store)]

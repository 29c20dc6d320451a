"""The public surface and the installed layout (DESIGN §2)."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import caravanserai

REPO = Path(__file__).resolve().parent.parent


def test_all_is_sorted_and_exported():
    names = [n for n in caravanserai.__all__ if n != "__version__"]
    assert names == sorted(names)
    for name in caravanserai.__all__:
        assert hasattr(caravanserai, name), name


def test_every_error_has_a_distinct_stable_code():
    from caravanserai import errors

    classes = [getattr(errors, n) for n in errors.__all__]
    codes = [c.code for c in classes]
    assert len(set(codes)) == len(codes)
    assert all(issubclass(c, caravanserai.CaravanseraiError) for c in classes)


def test_core_import_does_not_pull_notebook_libraries():
    code = ("import sys, caravanserai, caravanserai.cli; "
            "print(sorted(m for m in ('IPython','ipywidgets','anywidget','pandas','matplotlib') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_wheel_installs_only_the_caravanserai_package(tmp_path):
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path), str(REPO)],
                   check=True, capture_output=True)
    wheel = next(tmp_path.glob("caravanserai-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    top = {n.split("/")[0] for n in names if not n.split("/")[0].endswith((".dist-info", ".data"))}
    assert top == {"caravanserai"}
    # the one data file: JupyterLab saves widget state with notebooks (panels reopen as pictures)
    data = [n.split(".data/data/", 1)[1] for n in names if ".data/" in n]
    assert data == ["share/jupyter/lab/settings/overrides.d/caravanserai.json"]
    assert "caravanserai/ipython_ext/__init__.py" in names and "caravanserai/widgets/__init__.py" in names
    assert "caravanserai/__main__.py" in names and "caravanserai/testing/conformance.py" in names


def test_load_ipython_extension_is_importable_lazily():
    assert callable(caravanserai.load_ipython_extension)
    import caravanserai.ipython_ext as ext

    assert callable(ext.load_ipython_extension)


def test_the_wheel_holds_every_module_of_the_source_tree(tmp_path):
    """The explicit package list in pyproject.toml misses no subpackage (nor py.typed)."""
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path), str(REPO)],
                   check=True, capture_output=True)
    names = set(zipfile.ZipFile(next(tmp_path.glob("caravanserai-*.whl"))).namelist())
    expected = {f"caravanserai/{p.relative_to(REPO / 'caravanserai').as_posix()}" for p in (REPO / "caravanserai").rglob("*.py")}
    for folder in ("ipython_ext", "widgets"):
        expected |= {f"caravanserai/{folder}/{p.relative_to(REPO / folder).as_posix()}" for p in (REPO / folder).rglob("*.py")}
    assert expected - names == set()
    assert "caravanserai/py.typed" in names
    static = {f"caravanserai/widgets/static/{p.name}" for p in (REPO / "widgets" / "static").iterdir()}
    assert static and static - names == set()  # the panels' JS and CSS ship in the wheel (no CDN)


def _skips_outside_the_ci_rule(root: Path) -> list[str]:
    """``file:line`` of every ``importorskip(...)`` and bare ``pytest.skip(...)`` under ``root``, but
    in conftest.py, whose ``need()`` / ``need_module()`` skip locally and fail under CI=true."""
    import ast

    found = []
    for path in sorted(root.rglob("*.py")):
        if path.name == "conftest.py" and path.parent == root:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.Call):
                continue
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
            owner = func.value.id if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) else ""
            if name == "importorskip" or (name == "skip" and owner == "pytest"):
                found.append(f"{path.relative_to(root.parent).as_posix()}:{node.lineno}")
    return found


def test_every_skip_goes_through_the_ci_rule():
    """A missing dependency skips locally and fails under CI=true: tests use conftest's ``need`` /
    ``need_module``, never ``pytest.importorskip`` or a bare ``pytest.skip``."""
    assert _skips_outside_the_ci_rule(REPO / "tests") == []


def test_the_skip_scan_names_file_and_line(tmp_path):
    root = tmp_path / "tests"
    root.mkdir()
    (root / "conftest.py").write_text("import pytest\n\ndef need():\n    pytest.skip('x')\n")
    (root / "test_x.py").write_text("import pytest\n\nnp = pytest.importorskip('numpy')\n\n\n"
                                    "def test_a():\n    pytest.skip('no')\n    text = 'pytest.skip(in a string)'\n")
    assert _skips_outside_the_ci_rule(root) == ["tests/test_x.py:3", "tests/test_x.py:7"]


def test_migrating_names_every_moved_module_path():
    """docs/migrating.md lists each old module path with its new one, and says where settle went."""
    from caravanserai._moved import MOVED

    text = (REPO / "docs" / "migrating.md").read_text(encoding="utf-8")
    assert [old for old, new in MOVED.items() if f"| `{old}` | `{new}` |" not in text] == []
    assert "`caravanserai.runs.settle`" in text

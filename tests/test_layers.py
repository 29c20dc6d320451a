"""The package's layers, read from the code: no import circle, no upward import (lazy ones included).

Bottom up: ``errors``, ``ids``, ``journal`` → ``stores`` → ``calls`` → ``runs`` → ``agents`` →
``checkpoints`` → the CLI, the notebook layer (``ipython_ext``, ``widgets``) and ``testing``. Every
``import`` statement of every module counts, at any depth (a function-level import is still an
import). The figures the architecture note quotes (modules, largest file, longest function) come
from ``layer_report()``.
"""

from __future__ import annotations

import ast
from pathlib import Path

from conftest import REPO

LAYERS = {
    "caravanserai._version": 0, "caravanserai.errors": 0, "caravanserai.ids": 0, "caravanserai.journal": 0,
    "caravanserai.signing": 0, "caravanserai._moved": 0, "caravanserai._html": 0, "caravanserai.events": 0,
    "caravanserai.stores": 1, "caravanserai.calls": 2, "caravanserai.runs": 3, "caravanserai.agents": 4,
    "caravanserai.checkpoints": 5,
    "caravanserai.panels": 6, "caravanserai.cli": 6, "caravanserai.cli_checkpoints": 6, "caravanserai.cli_proxy": 6,
    "caravanserai.cli_trust": 6, "caravanserai.testing": 6,
    "caravanserai.ipython_ext": 7, "caravanserai.widgets": 7, "caravanserai.__main__": 8, "caravanserai": 8,
}
FOLDERS = {"caravanserai": REPO / "caravanserai", "caravanserai.ipython_ext": REPO / "ipython_ext",
           "caravanserai.widgets": REPO / "widgets"}


def modules() -> dict[str, Path]:
    found = {}
    for package, folder in FOLDERS.items():
        for path in folder.rglob("*.py"):
            parts = path.relative_to(folder).with_suffix("").parts
            if package == "caravanserai" and parts[0] in ("ipython_ext", "widgets"):
                continue
            name = ".".join((package, *parts)).removesuffix(".__init__")
            found[name] = path
    return found


def layer_of(module: str) -> int:
    best = max((prefix for prefix in LAYERS if module == prefix or module.startswith(prefix + ".")), key=len)
    return LAYERS[best]


def imports(module: str, path: Path, known: set[str]) -> set[str]:
    """Internal modules ``module`` imports (resolved, at any depth of its code)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                stem = ".".join(base + ([node.module] if node.module else []))
            else:
                stem = node.module or ""
            # `from pkg import sub` imports the submodule; `from pkg import name` the package (its __init__)
            targets = [f"{stem}.{alias.name}" if f"{stem}.{alias.name}" in known else stem for alias in node.names]
        else:
            continue
        out |= {t for t in targets if t in known}
    return out - {module}


def graph() -> dict[str, set[str]]:
    found = modules()
    known = set(found)
    return {name: imports(name, path, known) for name, path in found.items()}


def test_no_module_imports_a_higher_layer():
    upward = [(m, t) for m, targets in graph().items() for t in targets if layer_of(t) > layer_of(m)]
    assert upward == []


def test_the_import_graph_has_no_circle():
    edges = graph()
    # a package's __init__ re-exporting its own modules is not a circle of behaviour: ignore edges
    # from a package into its own submodules
    edges = {m: {t for t in ts if not t.startswith(m + ".")} for m, ts in edges.items()}
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for target in sorted(edges.get(node, ())):
            if state.get(target) == 1:
                raise AssertionError("import circle: " + " -> ".join(stack[stack.index(target):] + [target]))
            if target not in state:
                visit(target)
        stack.pop()
        state[node] = 2

    for node in sorted(edges):
        if node not in state:
            visit(node)


def layer_report() -> dict:
    """Modules, the largest file and the longest function (for the architecture note)."""
    found = modules()
    sizes = {name: len(path.read_text(encoding="utf-8").splitlines()) for name, path in found.items()}
    longest = ("", 0)
    for name, path in found.items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = (node.end_lineno or node.lineno) - node.lineno + 1
                if length > longest[1]:
                    longest = (f"{name}.{node.name}", length)
    largest = max(sizes.items(), key=lambda item: item[1])
    return {"modules": len(found), "largest": largest, "longest_function": longest}


def test_files_and_functions_stay_readable():
    report = layer_report()
    assert report["largest"][1] <= 800, report
    assert report["longest_function"][1] <= 120, report


if __name__ == "__main__":
    print(layer_report())

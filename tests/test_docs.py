"""Every Python block of README.md and docs/*.md runs exactly as printed.

Plain blocks run as scripts in a fresh directory (one process each, the default store there);
blocks that use a model get ``OPENAI_BASE_URL``/``OPENAI_MODEL`` pointing at the local model
server. Notebook blocks (those using ``%`` magics) run in order, per document, in a REAL kernel
through nbclient; run a second time in a new kernel, the README's send no request (the journal
answers). Skips locally without the model server; fails under CI=true.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
from conftest import PYTHON, REPO, need_kernel_packages

FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)


def blocks(path: Path) -> list[tuple[int, str]]:
    """(line number, source) of each ```python block."""
    text = path.read_text(encoding="utf-8")
    return [(text[: m.start()].count("\n") + 1, m.group(2)) for m in FENCE.finditer(text) if m.group(1) == "python"]


def is_notebook(source: str) -> bool:
    return any(line.startswith("%") for line in source.splitlines())


README = REPO / "README.md"
# docs/frameworks.md needs the frameworks and a counting server: tests/test_frameworks_docs.py runs it
DOCUMENTS = [README, *sorted(p for p in (REPO / "docs").glob("*.md") if p.name != "frameworks.md")]
SCRIPTS = [(path, line, source) for path in DOCUMENTS for line, source in blocks(path) if not is_notebook(source)]
NOTEBOOKS = {path: [source for _, source in blocks(path) if is_notebook(source)] for path in DOCUMENTS}
NOTEBOOKS = {path: cells for path, cells in NOTEBOOKS.items() if cells}
NOTEBOOK = NOTEBOOKS[README]
USES_A_MODEL = ("openai", "auto()")

# What each script block must leave behind, beyond exiting 0 (keyed by a line of the block).
EXPECT = {
    'for name in resumable_iterate(["a.txt", "b.txt", "c.txt"], run_id="convert-files"):':
        ("convert-files", "3 waypoint(s)", "completed"),
    'do_the_task("five-steps", {"step": 0})': ("five-steps", "5 waypoint(s)", "completed"),
    'with caravanserai.durable("nightly-report") as run:': ("nightly-report", "5 waypoint(s)", "completed"),
    'print(len(log.heads()), "heads")': ("ticket-42", "2 heads", "completed"),  # the main line is done; the fork is a branch
}


def test_the_readme_has_script_and_notebook_blocks():
    assert sum(path == README for path, _, _ in SCRIPTS) >= 5 and len(NOTEBOOK) == 2


@pytest.mark.parametrize("path,line,source", SCRIPTS, ids=[f"{p.name}:{line}" for p, line, _ in SCRIPTS])
def test_block_runs_as_printed(request, tmp_path, child_env, path, line, source):
    env = dict(child_env)
    if any(word in source for word in USES_A_MODEL):
        server = request.getfixturevalue("model_server")
        env.update(OPENAI_BASE_URL=server.url + "/v1", OPENAI_API_KEY="local", OPENAI_MODEL=server.model)
    proc = subprocess.run([PYTHON, "-c", source], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=180)
    assert proc.returncode == 0, proc.stderr
    for key, (run_id, shown, status) in EXPECT.items():
        if key in source:
            listed = subprocess.run([PYTHON, "-m", "caravanserai", "list"], cwd=tmp_path, env=env,
                                    capture_output=True, text=True, timeout=60).stdout
            assert run_id in listed and (shown in listed or shown in proc.stdout), (listed, proc.stdout)
            assert next(row for row in listed.splitlines() if row.startswith(run_id)).endswith(status)


def test_the_readme_checkpoint_log_block_labels_each_step_once(tmp_path, child_env):
    """The DurableAgent block's log: lineage, list and show agree on steps (no checkpoint committed
    twice under two step numbers, each lineage counts 1, 2, ... up to the steps it ran)."""
    source = next(s for _, s in blocks(README) if 'print(len(log.heads()), "heads")' in s)
    subprocess.run([PYTHON, "-c", source], cwd=tmp_path, env=child_env, check=True, capture_output=True, timeout=180)

    def cli(*argv: str) -> str:
        return subprocess.run([PYTHON, "-m", "caravanserai", *argv], cwd=tmp_path, env=child_env, check=True,
                              capture_output=True, text=True, timeout=60).stdout

    lineages = [[int(row.split()[2]) for row in part.splitlines()[1:] if row.strip()]
                for part in cli("lineage", "ticket-42").split("lineage of ")[1:]]
    assert sorted(lineages) == [[1, 2, 2], [1, 2, 3, 4]]  # the fork at step 2, and the main line's 4 steps
    assert "5 checkpoint(s), step 4/4" in cli("list") and "steps done 4/4" in cli("show", "ticket-42")


def test_readme_notebook_cells_run_and_a_rerun_sends_nothing(tmp_path, model_server, proxy):
    need_kernel_packages()
    import nbformat
    from kernel_helpers import child_env
    from nbclient import NotebookClient

    env = child_env(tmp_path)
    env.update(OPENAI_BASE_URL=proxy.url + "/v1", OPENAI_API_KEY="local", OPENAI_MODEL=model_server.model)
    check = ("print(sorted(summaries), {type(r).__name__ for r in summaries.values()}, "
             "all(r.choices[0].message.content for r in summaries.values()))")

    def execute() -> str:
        nb = nbformat.v4.new_notebook()
        nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
        nb.cells = [nbformat.v4.new_code_cell(source) for source in [*NOTEBOOK, check]]
        NotebookClient(nb, timeout=180, kernel_name="python3",
                       resources={"metadata": {"path": str(tmp_path)}}).execute(env=env)
        return "".join(o.get("text", "") for o in nb.cells[-1].outputs if o.output_type == "stream")

    assert execute().strip() == "['deserts', 'glaciers', 'rivers'] {'ChatCompletion'} True"
    sent = len(proxy.posts("/chat/completions"))
    assert sent == 3
    assert execute().strip() == "['deserts', 'glaciers', 'rivers'] {'ChatCompletion'} True"  # re-shown from the journal
    assert len(proxy.posts("/chat/completions")) == sent


@pytest.mark.parametrize("path", [p for p in NOTEBOOKS if p != README], ids=lambda p: p.name)
def test_doc_notebook_cells_run(tmp_path, model_server, path):
    need_kernel_packages()
    import nbformat
    from kernel_helpers import child_env
    from nbclient import NotebookClient

    env = child_env(tmp_path)
    env.update(OPENAI_BASE_URL=model_server.url + "/v1", OPENAI_API_KEY="local", OPENAI_MODEL=model_server.model)
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.cells = [nbformat.v4.new_code_cell(source) for source in NOTEBOOKS[path]]
    NotebookClient(nb, timeout=180, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}).execute(env=env)
    errors = [o for cell in nb.cells for o in cell.outputs if o.output_type == "error"]
    assert errors == []

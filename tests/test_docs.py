"""Every Python block of README.md and docs/*.md runs exactly as printed.

Plain blocks run as scripts in a fresh directory (one process each, the default store there);
blocks that use a model get ``OPENAI_BASE_URL``/``OPENAI_MODEL`` pointing at the local model
server. Notebook blocks (those using ``%`` magics) run in order, per document, in a REAL kernel
through nbclient; run a second time in a new kernel, the README's send no request (the journal
answers). Skips locally without the model server; fails under CI=true.
"""

from __future__ import annotations

import ast
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
# the README's notebook: the real cells (the local model server in the tests), and the offline variant (a ScriptedModel)
OFFLINE = [cell for cell in NOTEBOOKS[README] if "ScriptedModel" in cell or "current_run()" in cell]
NOTEBOOK = [cell for cell in NOTEBOOKS[README] if cell not in OFFLINE]
USES_A_MODEL = ("openai", "auto()")

# What each script block must leave behind, beyond exiting 0 (keyed by a line of the block).
EXPECT = {
    'for name in resumable_iterate(["a.txt", "b.txt", "c.txt"], run_id="convert-files"):':
        ("convert-files", "3 waypoint(s)", "completed"),
    'do_the_task("five-steps", {"step": 0})': ("five-steps", "5 waypoint(s)", "completed"),
    'with caravanserai.durable("nightly-report") as run:': ("nightly-report", "5 waypoint(s)", "completed"),
    'print(len(log.heads()), "heads")': ("ticket-42", "2 heads", "completed"),  # the main line is done; the fork is a branch
}


# What a block prints, where its prose says so (keyed by document and a line of the block): a pattern per line.
PRINTS = {
    ("tutorial.md", 'done = [name for name in resumable_iterate(files, run_id="convert")]'): [re.escape("['c.txt', 'd.txt']")],
    ("tutorial.md", 'print(caravanserai.load_latest("tutorial-steps"))'):
        [re.escape("({'step': 5}, 'finished step 5, next is step 6', 5)")],
    ("tutorial.md", 'print(first.text, len(first.receipt.calls), "model calls on the receipt")'):
        [re.escape("Order A-1 was delivered. 2 model calls on the receipt")],
    ("tutorial.md", 'print(diff.summary["first_divergence"], diff.summary["shared_prefix"])'):
        [r"Step goal: draft two fixes\. .*", "3 2"],
    # §6: a SECOND PROCESS is refused with RunLocked naming this one (its pid), and writes nothing (checked below)
    ("tutorial.md", 'subprocess.run([sys.executable, "-c", second_writer], check=True)'):
        [r"refused: RunLocked - run 'mine' is being written by pid {pid} on \S+ since \S+; .+",
         re.escape("['from-another-process', 'mine']")],
}


def test_the_readme_has_script_and_notebook_blocks():
    assert sum(path == README for path, _, _ in SCRIPTS) >= 5 and len(NOTEBOOK) == 2 and len(OFFLINE) == 2
    assert all(any(path.name == doc and key in source for path, _, source in SCRIPTS)
               for doc, key in PRINTS)  # no expectation outlives its block


@pytest.mark.parametrize("path,line,source", SCRIPTS, ids=[f"{p.name}:{line}" for p, line, _ in SCRIPTS])
def test_block_runs_as_printed(request, tmp_path, child_env, path, line, source):
    env = dict(child_env)
    if any(word in source for word in USES_A_MODEL):
        server = request.getfixturevalue("model_server")
        env.update(OPENAI_BASE_URL=server.url + "/v1", OPENAI_API_KEY="local", OPENAI_MODEL=server.model)
    proc = subprocess.Popen([PYTHON, "-c", source], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        stdout, stderr = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, stderr
    for (doc, key), patterns in PRINTS.items():
        if path.name == doc and key in source:
            lines = stdout.splitlines()
            assert len(lines) == len(patterns), stdout
            for pattern, printed in zip(patterns, lines):
                assert re.fullmatch(pattern.replace("{pid}", str(proc.pid)), printed), (pattern, printed)
    if path.name == "tutorial.md" and "second_writer" in source:  # the refused writer appended nothing
        from caravanserai.runs import read_events

        events = read_events("mine", f"sqlite:///{tmp_path / 'runs.db'}")
        assert [e["type"] for e in events] == ["run_started", "waypoint", "run_completed"]
        assert events[0]["pid"] == proc.pid
    for key, (run_id, shown, status) in EXPECT.items():
        if key in source:
            listed = subprocess.run([PYTHON, "-m", "caravanserai", "list"], cwd=tmp_path, env=env,
                                    capture_output=True, text=True, timeout=60).stdout
            assert run_id in listed and (shown in listed or shown in stdout), (listed, stdout)
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


def test_readme_offline_notebook_cells_need_no_key_and_a_rerun_asks_nothing(tmp_path):
    """The offline variant next to the real cells: no OPENAI_* anywhere, the loop runs, and run again
    in a new kernel the completed cell is re-shown from the journal without asking the model."""
    need_kernel_packages()
    import nbformat
    from kernel_helpers import child_env
    from nbclient import NotebookClient

    env = {k: v for k, v in child_env(tmp_path).items() if not k.startswith("OPENAI_")}
    check = "print(summaries == {d: '(offline) a one-sentence summary' for d in docs}, len(model.requests))"

    def execute() -> str:
        nb = nbformat.v4.new_notebook()
        nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
        nb.cells = [nbformat.v4.new_code_cell(source) for source in [*OFFLINE, check]]
        NotebookClient(nb, timeout=180, kernel_name="python3",
                       resources={"metadata": {"path": str(tmp_path)}}).execute(env=env)
        assert [o for cell in nb.cells for o in cell.outputs if o.output_type == "error"] == []
        return "".join(o.get("text", "") for o in nb.cells[-1].outputs if o.output_type == "stream")

    assert execute().strip() == "True 3"
    assert execute().strip() == "True 0"  # a new kernel: values back from the journal, the model not asked


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


# ---- run ids: each document writes its own ---------------------------------------------------------
WRITERS = {"durable": 0, "checkpoint": 0, "complete": 0, "resumable_iterate": 1, "CheckpointLog": 1}  # where the id goes


def _called(func: ast.expr) -> str | None:
    return func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else None


def _id_args(call: ast.Call, takers: set[str]) -> list[ast.expr]:
    """The arguments of ``call`` that name a run it writes: ``durable("x")``, ``checkpoint("x", ...)``,
    ``resumable_iterate(items, "x")``, ``CheckpointLog(store, "x")``, ``run_id=``/``new_run_id=``, and the
    first argument of a function of the block that takes a run id (``@resumable``, or passes it on)."""
    name = _called(call.func)
    found = [kw.value for kw in call.keywords if kw.arg in ("run_id", "new_run_id")]
    position = WRITERS.get(name or "", 0 if name in takers else None)
    if position is not None and len(call.args) > position and not any(kw.arg == "run_id" for kw in call.keywords):
        found.append(call.args[position])
    return found


def run_ids(source: str) -> set[str]:
    """The literal run ids a Python block (or notebook cell) writes."""
    ids = set(re.findall(r"^%%resumable[ \t]+([^\s-]\S*)", source, re.M)) | set(re.findall(r"--fork[ \t]+(\S+)", source))
    tree = ast.parse("\n".join("" if line.startswith("%") else line for line in source.splitlines()))
    functions = [f for f in ast.walk(tree) if isinstance(f, ast.FunctionDef) and f.args.args]
    takers = {f.name for f in functions if any(_called(d) == "resumable" for d in f.decorator_list)}
    for f in functions:  # a helper whose first parameter becomes a run id: its callers name runs
        first = f.args.args[0].arg
        if any(isinstance(a, ast.Name) and a.id == first
               for c in ast.walk(f) if isinstance(c, ast.Call) for a in _id_args(c, set())):
            takers.add(f.name)
    for node in ast.walk(tree):
        values = (_id_args(node, takers) if isinstance(node, ast.Call)
                  else [v for k, v in zip(node.keys, node.values) if isinstance(k, ast.Constant) and k.value == "run_id"]
                  if isinstance(node, ast.Dict) else [])
        ids |= {v.value for v in values if isinstance(v, ast.Constant) and isinstance(v.value, str)}
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and any(f"{w}(" in node.value for w in WRITERS):
            try:  # code another process runs (python -c "..."): its runs count too
                ids |= run_ids(node.value)
            except SyntaxError:
                pass
    return ids


def test_run_ids_are_found_in_every_form_a_block_writes_one():
    source = """%%resumable cell-run
import caravanserai
from caravanserai import resumable

@resumable
def task(run_id, state): ...

def helper(name, model):
    with caravanserai.durable(name) as run:
        return run

task("decorated", {})
helper("helped", None)
caravanserai.checkpoint("checkpointed", {}, "note")
for x in resumable_iterate([1], "positional"): pass
for x in resumable_iterate([1], run_id="keyword"): pass
run(agent, "hi", durable={"run_id": "agent-run", "store": store})
CheckpointLog(open_store(), "log-run").fork(head, "p", "q", new_run_id="forked-run")
caravanserai.load_latest("only-read"); Timeline("only-read-too"); checkpoint(run_id, {})
subprocess.run([sys.executable, "-c", "import caravanserai; caravanserai.durable('in-a-child')"])
"""
    assert run_ids(source) == {"cell-run", "decorated", "helped", "checkpointed", "positional", "keyword", "agent-run",
                               "log-run", "forked-run", "in-a-child"}


def test_no_two_documents_write_the_same_run_id():
    """Run in order in one directory, README and docs examples never meet a run another page wrote (the
    README quickstart and tutorial §2 once shared `five-steps`: the tutorial's assertion failed)."""
    owner: dict[str, str] = {}
    clashes = []
    for path in [README, *sorted((REPO / "docs").glob("*.md"))]:
        for run_id in sorted({i for _, source in blocks(path) for i in run_ids(source)}):
            if owner.setdefault(run_id, path.name) != path.name:
                clashes.append(f"{run_id!r} in {owner[run_id]} and {path.name}")
    assert clashes == []
    assert {"convert-files", "five-steps", "nightly-report", "refund-A-123", "one-question", "nightly-summaries",
            "offline-summaries", "ticket-42"} <= {i for _, s in blocks(README) for i in run_ids(s)}
    assert {"convert", "tutorial-steps", "tutorial-squares", "ticket-A-1", "ticket-9", "ticket-9-two-fixes", "mine",
            "from-another-process"} == {i for _, s in blocks(REPO / "docs" / "tutorial.md") for i in run_ids(s)}

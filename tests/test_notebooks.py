"""The teaching notebooks (notebooks/*.ipynb) run top to bottom in a REAL Jupyter kernel (nbclient).

Each notebook is executed as stored, in a fresh directory (its runs go to the default store there),
and the outputs a reader is told to expect are checked. Notebook 02 is also run the way it tells a
person to: the loop cell is started, the kernel is restarted while the loop runs (Kernel > Restart),
the setup cell and the loop cell are run again, and the loop continues where it stopped. Notebook 05
runs its PostgreSQL and S3 cells against real servers (the ``pg`` and ``s3`` fixtures). Skips locally
without the kernel packages; fails under CI=true.
"""

from __future__ import annotations

import json
import re
import time
import uuid
from pathlib import Path

import pytest
from conftest import REPO, need_kernel_packages
from servers._proc import free_port

NOTEBOOK_DIR = REPO / "notebooks"
NOTEBOOKS = sorted(NOTEBOOK_DIR.glob("*.ipynb"))
EXPECTED = ["01-quickstart", "02-survive-a-kernel-restart", "03-durable-llm-calls", "04-forks-and-time-travel",
            "05-shared-store", "06-durable-execution-explained"]


def notebook_env(project: Path, **extra: str) -> dict[str, str]:
    from kernel_helpers import child_env

    env = child_env(project)
    env["NB02_SECONDS_PER_ITEM"] = "0.5"  # 02's loop: 1.5 s an item gives a person time to restart by hand (it says so)
    # 05's servers: unreachable unless a test passes real ones, so the cells say how to start one
    env.setdefault("DEMO_POSTGRES_URL", f"postgresql://postgres@127.0.0.1:{free_port()}/postgres")
    env.setdefault("DEMO_S3_URL", f"s3://runs/team?endpoint=http://127.0.0.1:{free_port()}&region=us-east-1")
    env.update(extra)
    return env


def execute(path: Path, project: Path, env: dict[str, str]):
    """Run the notebook top to bottom in a new kernel whose working directory is ``project``."""
    import nbformat
    from nbclient import NotebookClient

    nb = nbformat.read(path, as_version=4)
    NotebookClient(nb, timeout=180, kernel_name="python3", resources={"metadata": {"path": str(project)}}).execute(env=env)
    return nb


def text_of(cell) -> str:
    """What a code cell showed: streams, results, displays and errors, as text."""
    parts = []
    for out in cell.get("outputs", []):
        if out["output_type"] == "stream":
            parts.append(out["text"])
        elif out["output_type"] == "error":
            parts.append(f"{out['ename']}: {out['evalue']}")
        else:
            parts.append(str(out.get("data", {}).get("text/plain", "")))
    return "\n".join(parts)


def unexpected_errors(nb) -> list[str]:
    return [text_of(c) for c in nb.cells if c.cell_type == "code"
            and "raises-exception" not in c.metadata.get("tags", [])
            and any(o["output_type"] == "error" for o in c.get("outputs", []))]


def cell_with(nb, snippet: str) -> int:
    """Index of the first code cell whose source contains ``snippet``."""
    return next(i for i, c in enumerate(nb.cells) if c.cell_type == "code" and snippet in c.source)


def test_the_notebooks_are_the_six_and_stored_without_outputs():
    assert [p.stem for p in NOTEBOOKS] == EXPECTED
    for path in NOTEBOOKS:
        nb = json.loads(path.read_text(encoding="utf-8"))
        first = "".join(nb["cells"][0]["source"])
        assert nb["cells"][0]["cell_type"] == "markdown" and "What this teaches" in first and "Time:" in first, path
        for cell in nb["cells"]:
            if cell["cell_type"] == "code":
                assert cell["outputs"] == [] and cell["execution_count"] is None, (path.name, cell["source"])
        assert nb["metadata"]["kernelspec"]["name"] == "python3"


def check_01(nb) -> None:
    text = [text_of(c) for c in nb.cells]
    assert "crash while converting report-2.csv" in text[cell_with(nb, 'crash = True')]
    assert text[cell_with(nb, "    converted.append(name)\nconverted")] == "['report-2.csv', 'report-3.csv', 'report-4.csv']"
    assert "ItemsChanged" in text[cell_with(nb, "reversed(files)")]
    assert text[cell_with(nb, 'five_steps("qs-steps", {"step": 0})   #')] == "5"
    assert "attempt 1 starting after step 0" in text[cell_with(nb, 'durable("qs-report")')]
    assert "waypoint 3: 'finished **step 3**, next is step 4'" in text[cell_with(nb, "for waypoint in")]
    assert "qs-steps\t5 waypoint(s)" in text[cell_with(nb, "%caravanserai list")]
    assert "run_completed" in text[cell_with(nb, "journal qs-steps")]


def check_02(nb) -> None:
    loops = [i for i, c in enumerate(nb.cells) if c.cell_type == "code" and c.source.startswith("%%resumable squares\n")]
    first, again, shown, edited = (text_of(nb.cells[i]) for i in loops)
    assert "KeyboardInterrupt" in first and "added 5" in first and "added 6" not in first
    assert "resumed (attempt 2" in again and "added 4" not in again and "added 5" in again and again.endswith("140")
    assert "completed earlier" in shown and shown.endswith("140")
    assert "CellChanged" in edited and "--fork NEW_ID" in edited
    assert text_of(nb.cells[cell_with(nb, "--restart")]).endswith("784")
    assert "2 attempts, status completed" in text_of(nb.cells[cell_with(nb, "Timeline(")])


def check_03(nb) -> None:
    text = [text_of(c) for c in nb.cells]
    assert "2 model requests sent" in text[cell_with(nb, "result = run(support")]
    assert "replayed: True | 2 model requests in total" in text[cell_with(nb, "again = run(support")]
    assert "call_settled" in text[cell_with(nb, "table.df[")]
    assert re.search(r"^total: \$0\.0\d*[1-9]$", text[cell_with(nb, "receipt = result.receipt")], re.M)  # plain dollars
    budget = text[cell_with(nb, "budget=")]
    assert "BudgetExceeded" in budget and "3 requests were sent" in budget
    assert "('C-9', 30.0)" in text[cell_with(nb, "payments = {}")]
    assert "ToolEffectUncertain" in text[cell_with(nb, "interrupt = False")]
    assert "Refunded 5.00. | attempts: 3" in text[cell_with(nb, "caravanserai.settle(")]
    assert "Figure" in text[cell_with(nb, "cost_chart(")]


def check_04(nb) -> None:
    text = [text_of(c) for c in nb.cells]
    assert "steps_done=4" in text[cell_with(nb, "progress = log.resume")]
    assert "done - 2 steps reused" in text[cell_with(nb, "panel.wait(")]
    assert "first divergence at step 3 | shared prefix: 2" in text[cell_with(nb, 'Compare("ticket-7"')]
    assert "first divergence at step 3" in text[cell_with(nb, "caravanserai diff")]
    assert "Compare" in text[cell_with(nb, 'caravanserai.fork("walk"')]


def check_05(nb, servers: bool = False) -> None:
    text = [text_of(c) for c in nb.cells]
    stderr = [o["text"] for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
              if o["output_type"] == "stream" and o["name"] == "stderr"]
    assert not any("without encryption" in s for s in stderr), stderr  # kernel 2 over IPC: no red TCP warning box
    assert "[kernel 2] pid" in text[cell_with(nb, "KernelManager(")] and stderr == [], stderr
    assert "[kernel 2] done" in text[cell_with(nb, 'durable("from-kernel-2"')]
    assert "RunLocked" in text[cell_with(nb, "in_kernel_2(JOB")]
    takeover = text[cell_with(nb, "def finish_job")]
    assert "kernel 2 died after step" in takeover and "attempt 2 resumes after step" in takeover
    for cell in (cell_with(nb, "PG = "), cell_with(nb, "S3 = ")):
        if servers:
            assert "'step 2 on a shared store'" in text[cell] and "Runs" in text[cell], text[cell]
        else:
            assert "start one as shown above" in text[cell]


def check_06(nb) -> None:
    text = [text_of(c) for c in nb.cells]
    assert text[cell_with(nb, 'worker("emails")')].count("hello cy") == 2
    assert text[cell_with(nb, 'worker("keyed")')].count("keyed-emails:cy") == 1
    payout = text[cell_with(nb, 'worker("payout")      # the bank')]
    assert "ToolEffectUncertain" in payout and payout.count("paid 10 to ana") == 1
    assert text[cell_with(nb, "caravanserai.settle(")].count("paid 10 to ana") == 2  # the result, and one payment
    fencing = text[cell_with(nb, "SIGSTOP")]
    assert "LeaseLost" in fencing and "['writer A, step 1', 'writer A, step 2', 'writer B', 'writer B again']" in fencing
    assert "['step 1', 'step 2', 'step 3']" in text[cell_with(nb, "the torn record")]
    assert "torn\tok" in text[cell_with(nb, "the torn record")]
    collapsed = [c for c in nb.cells if c.cell_type == "markdown" and c.source.startswith("<details>")]
    exercises = [c for c in nb.cells if c.cell_type == "markdown" and "**Exercise" in c.source]
    assert len(collapsed) == len(exercises) == 5


CHECKS = {"01": check_01, "02": check_02, "03": check_03, "04": check_04, "05": check_05, "06": check_06}


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_runs_top_to_bottom(path: Path, tmp_path: Path):
    need_kernel_packages()
    nb = execute(path, tmp_path, notebook_env(tmp_path))
    assert unexpected_errors(nb) == []
    CHECKS[path.name[:2]](nb)


def test_shared_store_notebook_on_postgresql_and_s3(tmp_path: Path, pg, s3):
    need_kernel_packages()
    bucket = f"nb-{uuid.uuid4().hex[:10]}"
    s3.create_bucket(bucket)
    env = notebook_env(
        tmp_path,
        DEMO_POSTGRES_URL=f"{pg.dsn}?table=nb_{uuid.uuid4().hex[:8]}&create_schema=true",
        DEMO_S3_URL=(f"s3://{bucket}/team?endpoint={s3.endpoint}&region=us-east-1&access_key_id=testing"
                     "&secret_access_key=testing"))
    nb = execute(NOTEBOOK_DIR / "05-shared-store.ipynb", tmp_path, env)
    assert unexpected_errors(nb) == []
    check_05(nb, servers=True)


def test_notebook_02_as_a_person_does_it_kernel_restarted_mid_loop(tmp_path: Path):
    """Run the loop cell, restart the kernel while it runs, re-run the setup cell and the loop cell."""
    need_kernel_packages()
    import nbformat
    from kernel_helpers import Kernel, count

    nb = nbformat.read(NOTEBOOK_DIR / "02-survive-a-kernel-restart.ipynb", as_version=4)
    setup = nb.cells[cell_with(nb, "%load_ext caravanserai")].source
    loop = nb.cells[cell_with(nb, "%%resumable squares\n")].source
    timeline = nb.cells[cell_with(nb, "Timeline(")].source
    instructions = "\n".join(c.source for c in nb.cells if c.cell_type == "markdown")
    assert "Kernel ▸ Restart Kernel" in instructions and "run the **setup cell** above again" in instructions

    kernel = Kernel(tmp_path, notebook_env(tmp_path))
    try:
        kernel.ok(setup)
        started = kernel.submit(loop)                      # 8 items, 0.5 s each here (NB02_SECONDS_PER_ITEM)
        deadline = time.monotonic() + 60
        while count(tmp_path, "squares", "waypoint") < 2:  # two items committed: restart now
            assert time.monotonic() < deadline, "the loop never committed two items"
            time.sleep(0.02)
        old_pid = kernel.km.provisioner.pid
        kernel.kc.stop_channels()
        kernel.km.restart_kernel(now=True)                 # Kernel > Restart Kernel…
        kernel._connect()
        assert kernel.km.provisioner.pid != old_pid and started

        assert kernel.ok("print('total' in dir())").stdout.strip() == "False"  # the variables went with the kernel
        kernel.ok(setup)                                   # 1. the setup cell again
        again = kernel.ok(loop)                            # 2. the loop cell again
        done_before = [int(line.split()[1]) for line in again.stdout.splitlines() if line.startswith("added")]
        assert done_before and done_before[0] >= 2 and done_before[-1] == 7, again.stdout  # resumed, not restarted
        assert again.result == "140"                       # same total as an uninterrupted run
        assert any("resumed (attempt 2" in d for d in again.displays), again.displays
        shown = kernel.ok(timeline)
        assert "2 attempts, status completed" in shown.stdout
    finally:
        kernel.close()

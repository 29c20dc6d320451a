"""Teaching notebooks 02 and 04 in a REAL JupyterLab, driven through Debian's Chromium by Playwright.

02: the steps the notebook gives a person, in the browser: run the setup and loop cells, choose
Kernel > Restart Kernel while the loop runs (confirming the dialog), run the setup cell and the loop
cell again; the loop continues, and the Timeline shows two attempts, the first one ended by the restart. 04: Run
All; the ForkPanel, the Lineage tree with both forks and the Compare panel with the first divergence
render. Screenshots: tests/artifacts/notebook-02.png and notebook-04.png. Skips locally without
Chromium/Playwright; fails under CI=true.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import pytest
from browser_helpers import (
    JupyterServer,
    chromium,
    lab_command,
    need_browser,
    open_notebook,
    run_all,
    run_cell,
    screenshot,
    wait_idle,
)
from conftest import REPO

NOTEBOOKS = REPO / "notebooks"


@pytest.fixture(scope="module", autouse=True)
def browser_parts():
    need_browser("jupyterlab", "anywidget", "matplotlib")


def index_of(path: Path, snippet: str) -> int:
    """Index (among all cells, as JupyterLab counts them) of the first code cell containing ``snippet``."""
    import nbformat

    nb = nbformat.read(path, as_version=4)
    return next(i for i, c in enumerate(nb.cells) if c.cell_type == "code" and snippet in c.source)


def waypoints(project: Path, run_id: str) -> int:
    from caravanserai.runs import read_events

    try:
        return sum(e["type"] == "waypoint" for e in read_events(run_id, str(project / ".caravanserai")))
    except Exception:  # noqa: BLE001 - not there yet
        return 0


def run_and_wait(page, index: int, timeout_ms: int = 120_000) -> None:
    """Run cell ``index`` and wait until it has finished (a new execution count, the kernel idle)."""
    before = page.evaluate("(i) => window.jupyterapp.shell.currentWidget.content.widgets[i].model.executionCount", index)
    run_cell(page, index)
    page.wait_for_function("""([i, before]) => {
      const cell = window.jupyterapp.shell.currentWidget.content.widgets[i];
      const n = cell.model.executionCount;
      return n !== null && n !== before && !/\\[\\*\\]/.test(cell.node.querySelector('.jp-InputPrompt')?.innerText || '');
    }""", arg=[index, before], timeout=timeout_ms)
    wait_idle(page, timeout_ms)


def output_of(page, index: int) -> str:
    return page.evaluate("""(i) => {
      const nb = window.jupyterapp.shell.currentWidget.content;
      return nb.widgets[i].node.querySelector('.jp-OutputArea')?.innerText || '';
    }""", index)


def test_notebook_02_restart_by_hand_in_jupyterlab(tmp_path):
    name = "02-survive-a-kernel-restart.ipynb"
    shutil.copy(NOTEBOOKS / name, tmp_path / name)
    start_over, setup = index_of(tmp_path / name, "caravanserai.clean"), index_of(tmp_path / name, "%load_ext caravanserai")
    loop, timeline = index_of(tmp_path / name, "%%resumable squares\n"), index_of(tmp_path / name, "Timeline(")
    server = JupyterServer(tmp_path)
    try:
        with chromium(tmp_path / ".chrome", height=1500) as page:
            open_notebook(page, server, name)
            for index in (start_over, setup):
                run_and_wait(page, index)
            run_cell(page, loop)                                  # the loop cell: 1.5 s an item, as a person gets it
            deadline = time.monotonic() + 60
            while waypoints(tmp_path, "squares") < 2:
                assert time.monotonic() < deadline, "the loop never committed two items"
                time.sleep(0.05)
            lab_command(page, "kernelmenu:restart")               # Kernel > Restart Kernel…
            page.locator(".jp-Dialog .jp-mod-accept").click()     # … and confirm
            page.wait_for_function("() => /Restarting|Idle/.test(document.querySelector("
                                   "'.jp-StatusBar-Widget')?.innerText || '')")
            wait_idle(page)
            assert 2 <= waypoints(tmp_path, "squares") < 5        # stopped by the restart, not by the loop's own interrupt at 5
            for index in (setup, loop):                           # as the notebook says: setup cell, then loop cell
                run_and_wait(page, index)
            resumed = output_of(page, loop)
            assert "resumed (attempt 2" in resumed and "140" in resumed and "added 0" not in resumed, resumed
            run_and_wait(page, timeline)
            panel = page.locator(".cvs-panel").first
            panel.locator(".cvs-attempt >> nth=1").wait_for()
            wait_idle(page)
            attempts = panel.locator(".cvs-attempt")
            assert attempts.count() == 2
            first = attempts.nth(0).inner_text()  # Restart stops the running cell first: "interrupted"
            assert ("interrupted" in first or "killed" in first) and "completed" in attempts.nth(1).inner_text()
            assert "2 attempts, status completed" in output_of(page, timeline)
            page.evaluate("(i) => window.jupyterapp.shell.currentWidget.content.widgets[i].node.scrollIntoView()",
                          timeline - 1)                           # section 3's text, then the Timeline
            page.wait_for_timeout(500)
            screenshot(page, "notebook-02.png")
            assert page.errors == []  # type: ignore[attr-defined]
    finally:
        server.stop()


def test_notebook_04_forks_lineage_and_compare_in_jupyterlab(tmp_path):
    name = "04-forks-and-time-travel.ipynb"
    shutil.copy(NOTEBOOKS / name, tmp_path / name)
    server = JupyterServer(tmp_path)
    try:
        with chromium(tmp_path / ".chrome", height=1500) as page:
            open_notebook(page, server, name)
            run_all(page)
            tree = page.locator(".cvs-panel.cvs-lineage").first
            tree.locator(".cvs-node[data-id='ticket-7-haiku']").wait_for(timeout=180_000)
            wait_idle(page, 180_000)
            assert {n.get_attribute("data-id") for n in tree.locator(".cvs-node").all()} >= {
                "ticket-7", "ticket-7-fork-3", "ticket-7-haiku"}
            compare = page.locator(".cvs-panel[data-jumped]").first
            compare.locator(".cvs-row.cvs-divergence").first.wait_for()
            assert "first divergence: step 3" in compare.locator(".cvs-header").inner_text()
            fork_panel = page.locator(".cvs-panel[data-total='4']").first   # the ForkPanel's four steps
            fork_panel.locator(".cvs-job .cvs-badge", has_text="done").wait_for()
            index = index_of(tmp_path / name, "tree = Lineage(log)")
            page.evaluate("(i) => window.jupyterapp.shell.currentWidget.content.widgets[i].node.scrollIntoView()",
                          index - 1)
            page.wait_for_timeout(500)
            screenshot(page, "notebook-04.png")
            assert page.errors == []  # type: ignore[attr-defined]
    finally:
        server.stop()

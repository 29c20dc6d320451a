"""A notebook what-if in a REAL browser: Chromium driven by Playwright against JupyterLab.

The ``research-loop`` story of test_notebook_forks.py, clicked: a ``%%resumable`` loop fills
``results`` and ``seen``; in its ForkPanel the test clicks waypoint 5, whose editor shows the cell's
variables as ``name = value`` lines (never IPython's ``_i``), edits ``results[4]`` to -1, names the
fork ``what-if`` and clicks Fork: the job line says the fork was created and names
``%%resumable what-if``. A bad edit (``results = open('x')``) shows the one-line typed error and
writes nothing. The fork is continued by a cell with EDITED code (``i * 100``); a Compare of the
two runs shows "first divergence: step 5", the divergence row scrolled into view with
``results[4]: 16 → -1`` struck/inserted, its detail the "variables that differ", and step 6 the
"cell code changed" badge with the code diff in its detail. Screenshots (light and dark theme) go
to tests/artifacts/. Skips locally without Chromium/Playwright; fails under CI=true.
"""

from __future__ import annotations

import re

import pytest
from agent_helpers import store_bytes
from browser_helpers import (
    JupyterServer,
    chromium,
    lab_command,
    need_browser,
    notebook,
    open_notebook,
    run_cell,
    screenshot,
    wait_idle,
)
from research_loop import research_loop


@pytest.fixture(scope="module", autouse=True)
def browser_parts():
    need_browser("jupyterlab", "anywidget")


CELLS = [
    "%load_ext caravanserai",
    research_loop("research-loop", "i * i"),
    'from caravanserai.widgets import ForkPanel, Compare\nfp = ForkPanel("research-loop")\nfp',
    research_loop("what-if", "i * 100"),  # the fork, continued with an edited cell
    'print("what-if results:", results[4], results[5])\nCompare("research-loop", "what-if")',
]


def open_waypoint(panel, n: int):
    """Click waypoint ``n``'s row in the ForkPanel; its variables editor."""
    panel.locator(f".cvs-row:has(.cvs-label:text-is('waypoint {n}'))").click()
    editor = panel.locator("textarea.cvs-edit")
    editor.wait_for()
    return editor


def fork(panel, text: str, new_run_id: str) -> None:
    panel.locator("textarea.cvs-edit").fill(text)
    panel.locator("input.cvs-new-id").fill(new_run_id)
    panel.locator("button.cvs-fork").click()


def wait_output(page, cell: int, text: str, timeout: int = 120_000) -> None:
    page.locator(".jp-Notebook .jp-Cell").nth(cell).locator(".jp-OutputArea-output", has_text=text).first.wait_for(
        timeout=timeout)


def in_view(locator, scroller) -> bool:
    row, box = locator.bounding_box(), scroller.bounding_box()
    return row is not None and box is not None and row["y"] >= box["y"] - 1 and \
        row["y"] + row["height"] <= box["y"] + box["height"] + 1


def dark_theme(page) -> None:
    lab_command(page, "apputils:change-theme", {"theme": "JupyterLab Dark"})
    page.wait_for_function("() => document.body.dataset.jpThemeLight === 'false'")
    page.wait_for_selector("#jupyterlab-splash", state="detached")  # the theme change's splash
    page.wait_for_timeout(500)


def test_a_notebook_what_if_forked_edited_and_compared_in_jupyterlab(tmp_path):
    notebook(tmp_path / "what-if.ipynb", CELLS)
    server = JupyterServer(tmp_path)
    root = tmp_path / ".caravanserai"
    try:
        with chromium(tmp_path / ".chrome") as page:
            open_notebook(page, server, "what-if.ipynb")
            for index in range(3):
                run_cell(page, index)
                wait_idle(page)
            cells = page.locator(".jp-Notebook .jp-Cell")
            wait_output(page, 1, "20")
            cells.nth(2).locator(".cvs-panel[data-total='20']").wait_for()  # the ForkPanel's 20 waypoints
            fork_panel = cells.nth(2).locator(".cvs-panel").first

            # the editor: the cell's variables as name = value lines, IPython's own names left out
            editor = open_waypoint(fork_panel, 5)
            editable = editor.input_value()
            assert "results = {0: 0, 1: 1, 2: 4, 3: 9, 4: 16}" in editable, editable
            assert "seen = {0, 1, 2, 3, 4}" in editable and "i = 4" in editable, editable
            assert "_i" not in editable, editable

            # a bad edit: the one-line typed error in the panel, nothing written
            before = store_bytes(root)
            fork(fork_panel, re.sub(r"(?m)^results = .*$", "results = open('x')", editable), "bad")
            error = fork_panel.locator(".cvs-error").first
            error.wait_for(state="visible")
            message = error.inner_text()
            assert message.startswith("UsageError: ") and "not a value" in message and "\n" not in message.strip(), message
            assert store_bytes(root) == before and not (root / "bad").exists()

            # the what-if: results[4] = -1, forked as what-if
            edited = editable.replace("4: 16}", "4: -1}")
            assert edited != editable
            fork_panel.locator("textarea.cvs-edit").fill(edited)
            fork_panel.locator("input.cvs-new-id").fill("what-if")
            screenshot(fork_panel, "notebook-forks-editor.png")
            fork_panel.locator("button.cvs-fork").click()
            job = fork_panel.locator(".cvs-job")
            job.locator(".cvs-badge", has_text="forked").wait_for()
            job_text = job.inner_text()
            assert "what-if starts at waypoint 5 of research-loop" in job_text, job_text
            assert "%%resumable what-if" in job_text, job_text
            assert not error.is_visible()
            assert (root / "what-if").exists()
            cells.nth(2).locator(".cvs-panel", has_text="forked from research-loop").first.wait_for()  # its Timeline
            screenshot(cells.nth(2), "notebook-forks-forked.png")

            # continue the fork with an EDITED cell, then compare the two runs
            run_cell(page, 3)
            wait_idle(page)
            wait_output(page, 3, "20")
            run_cell(page, 4)
            wait_idle(page)
            wait_output(page, 4, "what-if results: -1 500")
            errors = page.locator(".jp-OutputArea-output[data-mime-type='application/vnd.jupyter.stderr']")
            assert errors.count() == 0, errors.all_inner_texts()

            compare = cells.nth(4).locator(".cvs-panel[data-jumped]")
            compare.wait_for()
            assert "first divergence: step 5" in compare.locator(".cvs-header").inner_text()
            divergent = compare.locator(".cvs-row.cvs-divergence")
            assert divergent.count() == 1 and divergent.locator(".cvs-cmp-step").inner_text() == "▶ 5"
            assert "cvs-selected" in divergent.get_attribute("class")
            assert in_view(divergent, compare.locator(".cvs-scroller"))  # scrolled into view
            fork_cell = divergent.locator(".cvs-cmp-cell").nth(1)
            assert "results[4]: 16 → -1" in fork_cell.inner_text(), fork_cell.inner_text()
            assert "16" in fork_cell.locator("del.cvs-del").all_inner_texts()
            assert "-1" in fork_cell.locator("ins.cvs-ins").all_inner_texts()

            divergent.click()
            detail = compare.locator(".cvs-detail")
            detail.locator(".cvs-block-title", has_text="variables that differ").wait_for()
            change = detail.locator(".cvs-var-change", has_text="results[4]:")
            assert change.locator("del.cvs-del").inner_text() == "16" and change.locator("ins.cvs-ins").inner_text() == "-1"
            assert "step 5" in detail.locator(".cvs-block-title").first.inner_text()
            screenshot(compare, "notebook-forks-compare-divergence.png")

            later = compare.locator(".cvs-row.cvs-cmp:has(.cvs-cmp-step:text-is('6'))")
            assert later.locator(".cvs-badge", has_text="cell code changed").count() >= 1
            later.click()
            detail.locator(".cvs-block-title", has_text=re.compile("^step 6")).wait_for()
            code = detail.locator(".cvs-block:has(.cvs-block-title:text-is('cell code changed')) pre")
            code.first.wait_for()
            code_text = code.first.inner_text()
            assert "i * 100" in code_text and "i * i" in code_text, code_text
            screenshot(compare, "notebook-forks-compare-code.png")
            assert page.errors == []  # type: ignore[attr-defined]

            dark_theme(page)
            screenshot(cells.nth(2), "notebook-forks-forked-dark.png")
            screenshot(compare, "notebook-forks-compare-code-dark.png")
            assert page.errors == []  # type: ignore[attr-defined]
    finally:
        server.stop()

"""A saved notebook reopened in a REAL JupyterLab (Chromium driven by Playwright): every panel is a picture.

A notebook displays every panel (Timeline, JournalTable, Runs, Compare, Lineage, ForkPanel, the
``%caravanserai show`` dashboard) and a ``%%resumable`` cell's ``timeline ▸`` button; JupyterLab
saves it (the ``[notebook]`` extra turns on "Save Widget State Automatically", so the widget state
goes into the file), the kernel is shut down, the tab closed and the notebook opened again: no
output reads "model not found", each former panel draws its last rows with a "saved" badge instead
of "live" (no kernel behind it), and the button is there. The same file with its widget state
stripped, exported by nbconvert (what nbviewer and GitHub show), shows each panel's HTML fallback:
the call that reopens it. Screenshots go to tests/artifacts/. Skips locally without Chromium/
Playwright; fails under CI=true.
"""

from __future__ import annotations

import json
import time

import pytest
from browser_helpers import (
    JupyterServer,
    chromium,
    lab_command,
    need_browser,
    notebook,
    open_notebook,
    run_all,
    screenshot,
    wait_idle,
)
from research_loop import research_loop

WIDGET_STATE = "application/vnd.jupyter.widget-state+json"


@pytest.fixture(scope="module", autouse=True)
def browser_parts():
    need_browser("jupyterlab", "anywidget", "nbconvert")


CELLS = [
    "%load_ext caravanserai",
    "import caravanserai\nfor i in range(6):\n    caravanserai.checkpoint('reopen-run', {'i': i}, f'step **{i}**')\n"
    "caravanserai.fork('reopen-run', at=3, new_run_id='reopen-fork', state={'i': 30})\n"
    "caravanserai.checkpoint('reopen-fork', {'i': 40}, 'the fork goes on')",
    "from caravanserai.widgets import Timeline, JournalTable, Runs, Compare, Lineage, ForkPanel\nTimeline('reopen-run')",
    "JournalTable('reopen-run')",
    "Runs()",
    "Compare('reopen-run', 'reopen-fork')",
    "Lineage('reopen-run')",
    "ForkPanel('reopen-run')",
    "%caravanserai show reopen-run",
    research_loop("reopen-loop", "i * 2"),
]
PANELS = 8  # Timeline, JournalTable, Runs, Compare, Lineage, ForkPanel, and the dashboard's Timeline and Journal


def test_a_saved_notebook_reopens_with_every_panel_as_a_picture(tmp_path):
    path = tmp_path / "reopen.ipynb"
    notebook(path, CELLS)
    server = JupyterServer(tmp_path)
    try:
        with chromium(tmp_path / ".chrome") as page:
            console: list[str] = []
            page.on("console", lambda msg: console.append(msg.text) if msg.type == "error" else None)
            open_notebook(page, server, path.name)
            run_all(page)
            page.locator("button:has-text('timeline ▸')").wait_for()
            wait_idle(page)
            page.wait_for_function(f"() => document.querySelectorAll('.cvs-panel[data-painted]').length >= {PANELS}")
            lab_command(page, "docmanager:save")
            deadline = time.monotonic() + 30
            while WIDGET_STATE not in json.loads(path.read_text()).get("metadata", {}).get("widgets", {}):
                assert time.monotonic() < deadline, "JupyterLab saved no widget state with the notebook"
                time.sleep(0.3)
            lab_command(page, "application:close-all")
            for kernel in server.kernels():  # nothing in any kernel: only the file remains
                server.delete(f"api/kernels/{kernel['id']}")
            console.clear()
            open_notebook(page, server, path.name)
            page.locator("button:has-text('timeline ▸')").wait_for()
            page.wait_for_function(f"() => document.querySelectorAll('.cvs-panel[data-painted]').length >= {PANELS}")
            page.wait_for_function(f"() => document.querySelectorAll('.cvs-badge.cvs-saved').length >= {PANELS - 1}")
            time.sleep(1.0)  # a renderer that gives up does so within a second of the restore
            screenshot(page, "reopened-notebook.png")
            text = page.locator(".jp-Notebook").inner_text()
            assert "model not found" not in text and "Error displaying widget" not in text
            assert not [line for line in console if "model not found" in line], console
            panels = page.locator(".cvs-panel")
            assert panels.count() >= PANELS
            assert page.locator(".cvs-badge.cvs-live").count() == 0  # nothing claims a kernel polls it
            # every former panel shows something: its rows (a list) or its tree (Lineage), none empty
            totals = page.evaluate("() => [...document.querySelectorAll('.cvs-panel')].map((p) => "
                                   "Number(p.dataset.total || 0))")
            assert len(totals) >= PANELS and min(totals) > 0, totals
            assert page.locator(".cvs-badge.cvs-saved").count() >= PANELS - 1  # the hidden Journal tab's may lag
            timeline = page.locator(".cvs-panel:has(.cvs-title:text-is('reopen-run'))").first
            assert "step 5" in timeline.inner_text()  # the last rows, as saved
            assert page.locator(".cvs-panel .cvs-node-id:text-is('reopen-fork')").count() == 1  # the Lineage tree
            assert page.errors == []  # type: ignore[attr-defined]
    finally:
        server.stop()
    export_without_state(path, tmp_path)


def export_without_state(path, tmp_path) -> None:
    """nbconvert (nbviewer, GitHub's kind of renderer) on the file without its widget state: the fallbacks."""
    import nbformat
    from nbconvert import HTMLExporter

    nb = nbformat.read(path, as_version=4)
    nb.metadata.pop("widgets", None)
    body, _ = HTMLExporter().from_notebook_node(nb)
    for call in ("Timeline('reopen-run')", "JournalTable('reopen-run')", "Runs()", "Compare('reopen-run', 'reopen-fork')",
                 "Lineage('reopen-run')", "ForkPanel('reopen-run')", "%caravanserai show reopen-run",
                 "%caravanserai show reopen-loop"):
        assert call in body, call
    assert "a caravanserai panel saved without its live view" in body
    assert "model not found" not in body

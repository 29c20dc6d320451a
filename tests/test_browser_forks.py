"""Fork buttons, the lineage tree and Compare in a REAL browser: Chromium driven by Playwright against JupyterLab.

Fake backend: a finished DurableAgent run; in its ForkPanel the test clicks step 3, edits the
prompt and clicks Fork; the new run's Timeline appears under the panel, the Lineage in the next
cell grows a branch, ticking both nodes and clicking Compare shows the first divergence at step 3
highlighted and scrolled to, steps 1–2 folded. A Fork into a run id that exists shows the typed
error and writes nothing. The same runs exported to HTML open in Chromium with the network
disabled and show the same rows. Local model server (SmolLM2 via ``transformers serve``): the fork
resumes in the background while the notebook runs another cell, its Timeline fills in commit by
commit, and the server receives only the steps after the fork. Screenshots go to tests/artifacts/.
Skips locally without Chromium/Playwright/the model server; fails under CI=true.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
from agent_helpers import store_bytes
from browser_helpers import JupyterServer, chromium, need_browser, notebook, open_notebook, run_all, screenshot, wait_idle

PROMPTS = ["pull the ticket", "reproduce the bug", "draft a fix", "open the PR", "write the changelog"]


@pytest.fixture(scope="module", autouse=True)
def browser_parts():
    need_browser("jupyterlab", "anywidget")


FAKE_SETUP = """\
from caravanserai import DurableAgent, open_store
from caravanserai.checkpoints import CheckpointLog
from caravanserai.widgets import ForkPanel, Lineage
store = open_store("./.caravanserai")
log = CheckpointLog(store, "ticket")
log.resume(log.commit(DurableAgent().begin({prompts!r}).checkpoint())).steps_done
"""


def fork_from_panel(page, panel, step: int, text: str, new_run_id: str = "") -> None:
    """Click the step's row, put ``text`` in the prompt editor, click Fork."""
    panel.locator(".cvs-row", has_text=f"step {step}").first.click()
    editor = panel.locator("textarea.cvs-edit")
    editor.wait_for()
    editor.fill(text)
    panel.locator("input.cvs-new-id").fill(new_run_id)
    panel.locator("button.cvs-fork").click()


def test_fork_lineage_compare_and_export_in_jupyterlab(tmp_path):
    notebook(tmp_path / "forks.ipynb", [FAKE_SETUP.format(prompts=PROMPTS), "fp = ForkPanel(log)\nfp",
                                        "tree = Lineage(log)\ntree"])
    server = JupyterServer(tmp_path)
    root = tmp_path / ".caravanserai"
    try:
        with chromium(tmp_path / ".chrome") as page:
            open_notebook(page, server, "forks.ipynb")
            run_all(page)
            page.wait_for_selector(".cvs-panel[data-total='5']")  # the ForkPanel's five steps
            wait_idle(page)
            fork_panel, tree = page.locator(".cvs-panel").nth(0), page.locator(".cvs-panel.cvs-lineage")
            tree.locator(".cvs-node").first.wait_for()
            assert tree.locator(".cvs-node").count() == 1

            # bad input: into a run id that exists -> the typed error in the panel, nothing written
            before = store_bytes(root)
            fork_from_panel(page, fork_panel, 3, "draft two fixes", new_run_id="ticket")
            error = fork_panel.locator(".cvs-error")
            error.wait_for(state="visible")
            assert error.inner_text().startswith("RunExists: run 'ticket' already exists")
            assert store_bytes(root) == before

            fork_from_panel(page, fork_panel, 3, "draft two fixes")
            fork_panel.locator(".cvs-job .cvs-badge", has_text="done").wait_for()
            job = fork_panel.locator(".cvs-job").inner_text()
            assert "ticket-fork-3" in job and "reused 2 step(s)" in job and "tokens saved" in job
            assert not error.is_visible()
            child = page.locator(".cvs-panel", has_text="forked from ticket").first  # the new run's Timeline
            child.locator(".cvs-row", has_text="fork at step 3").wait_for()
            child.locator(".cvs-row", has_text="5/5 steps done").wait_for()
            screenshot(page, "forks-fork-panel.png")

            # Lineage grew a branch; it may first draw the new run before its first commit lands (the fork writes
            # its run_started, then commits), so wait for the node to say what the fork edited
            tree.locator(".cvs-node[data-id='ticket-fork-3']").wait_for(timeout=15_000)
            tree.locator(".cvs-node[data-id='ticket-fork-3']", has_text="step 3 prompt → draft two fixes").wait_for(
                timeout=15_000)
            for node in ("ticket", "ticket-fork-3"):
                tree.locator(f".cvs-node[data-id='{node}'] .cvs-pick").click()
            tree.locator("button.cvs-compare", has_text="Compare picked (2)").click()
            compare = page.locator(".cvs-panel[data-jumped]")
            compare.wait_for()
            divergent = compare.locator(".cvs-row.cvs-divergence")
            assert divergent.inner_text().startswith("▶ 3")
            assert "cvs-selected" in divergent.get_attribute("class")  # scrolled to and selected
            assert compare.locator(".cvs-row.cvs-shared").inner_text().strip().startswith(
                "≡\nsteps 1–2 are identical in every timeline")
            assert "first divergence: step 3" in compare.locator(".cvs-header").inner_text()
            compare.locator(".cvs-detail ins").first.wait_for()  # the divergent step's word diff, from the kernel
            prompt = compare.locator(".cvs-cmp-col").nth(1).locator(".cvs-diff-text").first  # the fork's edited prompt
            assert prompt.locator("ins").all_inner_texts() == ["two", "fixes"]
            assert prompt.locator("del").all_inner_texts() == ["a", "fix"]
            lab_rows = compare.locator(".cvs-row").all_inner_texts()
            lab_tree = [n.get_attribute("data-id") for n in tree.locator(".cvs-node").all()]
            tree.scroll_into_view_if_needed()
            screenshot(page, "forks-lineage-compare.png")
            assert page.errors == []  # type: ignore[attr-defined]

        export = tmp_path / "export.html"
        subprocess.run([sys.executable, "-m", "caravanserai", "export", "ticket", "ticket-fork-3", "--html", str(export),
                        "--store", str(root)], check=True, timeout=60)
        with chromium(tmp_path / ".chrome-offline") as page:
            page.context.set_offline(True)
            asked = []
            page.context.on("request", lambda r: asked.append(r.url))
            page.goto(export.as_uri())
            page.wait_for_selector("body[data-mounted='4']")
            offline_compare = page.locator("section[data-panel=compare] .cvs-panel[data-jumped]")
            offline_compare.wait_for()
            assert offline_compare.locator(".cvs-row").all_inner_texts() == lab_rows  # the same rows as in JupyterLab
            nodes = page.locator("section[data-panel=lineage] .cvs-node")
            assert [n.get_attribute("data-id") for n in nodes.all()] == lab_tree
            timeline = page.locator("section[data-panel=timeline]").nth(1)
            assert "fork at step 3" in timeline.inner_text()
            offline_compare.locator("input[type=checkbox]").first.check()  # differences only, answered from the file
            offline_compare.locator(".cvs-row.cvs-shared").wait_for(state="detached")
            assert offline_compare.locator(".cvs-row").count() == 3 and offline_compare.get_attribute("data-jumped") == "0"
            assert [u for u in asked if not u.startswith(("file:", "blob:", "data:"))] == []
            page.screenshot(path=str(Path(__file__).parent / "artifacts" / "forks-export-offline.png"), full_page=True)
            assert page.errors == []  # type: ignore[attr-defined]
    finally:
        server.stop()


MODEL_SETUP = """\
import os
os.environ["VLLM_BASE_URL"] = {base!r}
from caravanserai import DurableAgent, open_store
from caravanserai.checkpoints import CheckpointLog
from caravanserai.widgets import ForkPanel
store = open_store("./.caravanserai")
log = CheckpointLog(store, "story")
log.resume(log.commit(DurableAgent().begin({prompts!r}, model_id={model!r}).checkpoint())).steps_done
"""

STORY = ["Say one word about rivers.", "Say one word about mountains.", "Say one word about deserts.",
         "Say one word about forests.", "Say one word about oceans.", "Say one word about glaciers."]


def test_fork_resumes_on_the_local_model_while_the_notebook_runs(tmp_path, model_server, proxy):
    notebook(tmp_path / "model.ipynb", [MODEL_SETUP.format(base=proxy.url + "/v1", prompts=STORY,
                                                           model=f"vllm/{model_server.model}"),
                                        "fp = ForkPanel(log)\nfp", "print('the kernel answered', 6 * 7)"])
    server = JupyterServer(tmp_path)
    try:
        with chromium(tmp_path / ".chrome") as page:
            open_notebook(page, server, "model.ipynb")
            run_all(page)
            page.wait_for_selector(".cvs-panel[data-total='6']", timeout=300_000)
            wait_idle(page, 300_000)
            sent_before = len(proxy.posts("/v1/completions"))
            assert sent_before == len(STORY)
            fork_panel = page.locator(".cvs-panel").first
            fork_from_panel(page, fork_panel, 3, "Say one word about volcanoes.")
            fork_panel.locator(".cvs-job .cvs-badge", has_text="running").wait_for()
            # the notebook stays free: another cell runs and answers while the fork is still running
            page.locator(".jp-Cell").nth(2).click()
            page.keyboard.press("Shift+Enter")
            page.locator(".jp-OutputArea-output", has_text="the kernel answered 42").wait_for(timeout=30_000)
            assert fork_panel.locator(".cvs-job .cvs-badge").inner_text() == "running"
            child = page.locator(".cvs-panel", has_text="forked from story").first
            child.locator(".cvs-row", has_text="fork at step 3").wait_for()
            counts = set()
            deadline = time.monotonic() + 300
            while "done" not in fork_panel.locator(".cvs-job .cvs-badge").inner_text():
                counts.add(child.locator(".cvs-row", has_text="committed").count())
                assert time.monotonic() < deadline, "the fork never finished"
                time.sleep(0.1)
            child.locator(".cvs-row", has_text="6/6 steps done").wait_for()
            counts.add(child.locator(".cvs-row", has_text="committed").count())
            assert len(counts) >= 3 and max(counts) == 4, counts  # commit rows appeared one by one: steps 3-6
            assert len(proxy.posts("/v1/completions")) - sent_before == 4  # steps 1-2 reused, never sent again
            assert "reused 2 step(s)" in fork_panel.locator(".cvs-job").inner_text()
            screenshot(page, "forks-model-server.png")
            assert page.errors == []  # type: ignore[attr-defined]
    finally:
        server.stop()

"""The panels in a REAL browser: Debian's Chromium driven by Playwright against JupyterLab,
Jupyter Notebook 7 and marimo, all on loopback, offline.

JupyterLab: a notebook built with nbformat runs a ``%%resumable`` loop whose model calls go to the
local model server (SmolLM2, ``transformers serve``) through a CountingProxy; the kernel is
SIGKILLed between a call's result and its waypoint, restarts, and the notebook runs again. The
Timeline then shows two attempts with the boundary (the first "killed"), the call answered from
the journal marked "replayed · free", and a clicked waypoint's exact state; a second kernel appends
to the same run on the SQLite store and the open panel shows the new rows live; the dark theme
renders. The dashboard (``%caravanserai show``) shows the Journal and Charts tabs and the Runs
panel opens a run. The Timeline also renders in Notebook 7 and in marimo. PNG screenshots go to
tests/artifacts/. Skips locally without Chromium/Playwright/the model server; fails under CI=true.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from browser_helpers import (
    JupyterServer,
    chromium,
    free_port,
    has_module,
    kernel_env,
    lab_command,
    need_browser,
    notebook,
    open_notebook,
    run_all,
    screenshot,
    wait_http,
    wait_idle,
)
from conftest import need

TOPICS = ["rivers", "deserts", "glaciers", "volcanoes"]


@pytest.fixture(scope="module", autouse=True)
def browser_parts():
    need_browser("jupyterlab", "anywidget", "matplotlib")


def events(store: str, run_id: str) -> list[dict]:
    from caravanserai.runs import read_events

    return read_events(run_id, store)


SETUP = """\
%load_ext caravanserai
import os, time, openai
import caravanserai
from caravanserai import checkpoint, resumable_iterate
client = caravanserai.durable_client(openai.OpenAI(base_url={base!r}, api_key="local", max_retries=0))
MODEL, TOPICS, STORE = {model!r}, {topics!r}, {store!r}
SLOW = 0 if os.path.exists("resumed.flag") else 3.0
open("kernel.pid", "w").write(str(os.getpid()))
"""

LOOP = """\
%%resumable browser-loop --store {store}
answers = {{}}
for topic in resumable_iterate(TOPICS):
    reply = client.chat.completions.create(model=MODEL, temperature=0, max_tokens=6,
                                           messages=[{{"role": "user", "content": f"Name one fact about {{topic}}."}}])
    time.sleep(SLOW)  # between the paid call and its waypoint: a kill here leaves a settled call to replay
    answers[topic] = reply.choices[0].message.content
    checkpoint({{"answered": len(answers), "last": topic}}, f"answered **{{topic}}**")
"""

TIMELINE = """\
from caravanserai.widgets import Timeline
tl = Timeline("browser-loop", store=STORE)
tl
"""


def test_timeline_in_jupyterlab_after_a_kernel_kill(tmp_path, model_server, proxy):
    store = f"sqlite:///{tmp_path / 'runs.db'}"
    notebook(tmp_path / "loop.ipynb", [SETUP.format(base=proxy.url + "/v1", model=model_server.model, topics=TOPICS,
                                                    store=store), LOOP.format(store=store), TIMELINE])
    server = JupyterServer(tmp_path)
    try:
        with chromium(tmp_path / ".chrome") as page:
            open_notebook(page, server, "loop.ipynb")
            run_all(page)
            deadline = time.monotonic() + 120
            while True:  # kill inside the sleep after a settled call, before its waypoint
                found = events(store, "browser-loop") if (tmp_path / "runs.db").exists() else []
                settled = sum(e["type"] == "call_settled" for e in found)
                marks = sum(e["type"] == "waypoint" and "loop" not in e for e in found)
                if settled >= 2 and settled == marks + 1:
                    break
                assert time.monotonic() < deadline, "the loop never reached its second call"
                time.sleep(0.05)
            os.kill(int((tmp_path / "kernel.pid").read_text()), signal.SIGKILL)
            (tmp_path / "resumed.flag").write_text("1")
            page.wait_for_function("() => /Restarting|restarting|Idle/.test(document.querySelector("
                                   "'.jp-StatusBar-Widget')?.innerText || '')")
            _dismiss_dialogs(page)
            wait_idle(page)
            sent_at_kill = len(proxy.posts("/chat/completions"))
            run_all(page)
            page.wait_for_selector(".cvs-panel .cvs-attempt >> nth=1")
            wait_idle(page)
            panel = page.locator(".cvs-panel").first
            attempts = panel.locator(".cvs-attempt")
            assert attempts.count() == 2
            assert "cvs-end-killed" in attempts.nth(0).get_attribute("class")
            assert "killed" in attempts.nth(0).inner_text() and "completed" in attempts.nth(1).inner_text()
            assert panel.locator(".cvs-badge.cvs-replayed").count() >= 1  # answered from the journal, free
            replay = panel.locator(".cvs-replay").first  # the free replay sits in attempt 2; the call is paid in 1
            assert "paid in attempt 1" in replay.inner_text()
            assert int(replay.get_attribute("data-index")) > int(attempts.nth(1).get_attribute("data-index"))
            assert panel.locator(".cvs-later").first.inner_text() == "↺ attempt 2"
            assert len(proxy.posts("/chat/completions")) - sent_at_kill == len(TOPICS) - settled
            panel.locator(".cvs-waypoint").first.click()
            detail = panel.locator(".cvs-detail")
            detail.locator("pre").first.wait_for()
            assert json.loads(detail.locator("pre").first.inner_text()) == {"answered": 1, "last": TOPICS[0]}
            assert "answered" in detail.locator(".cvs-note").inner_text()
            screenshot(page, "panels-timeline-after-kill.png")

            _append_from_a_second_kernel(tmp_path, store, panel, page)
            screenshot(page, "panels-timeline-live.png")

            lab_command(page, "apputils:change-theme", {"theme": "JupyterLab Dark"})
            page.wait_for_function("() => document.body.dataset.jpThemeLight === 'false'")
            page.wait_for_selector("#jupyterlab-splash", state="detached")  # the theme change's splash
            page.wait_for_timeout(500)
            background = panel.evaluate("el => getComputedStyle(el).backgroundColor")
            assert _luminance(background) < 0.35, background
            screenshot(page, "panels-timeline-dark.png")

            loop_cell = page.locator(".jp-Notebook .jp-Cell").nth(1)  # the status line's link opens the dashboard
            loop_cell.locator(".caravanserai-open").click()
            loop_cell.locator(".cvs-panel .cvs-attempt", has_text="attempt 3").wait_for()
            loop_cell.scroll_into_view_if_needed()
            width = loop_cell.locator(".cvs-panel").first.bounding_box()["width"]
            assert width > 600, width  # the dashboard takes the cell's width, not the button's
            screenshot(page, "panels-status-link.png")
            assert page.errors == []  # type: ignore[attr-defined]
    finally:
        server.stop()


def _append_from_a_second_kernel(tmp_path: Path, store: str, panel, page) -> None:
    """Another kernel (another process) appends to the run on the shared SQLite store: the rows appear."""
    from jupyter_client import KernelManager

    km = KernelManager(kernel_name="python3")
    km.start_kernel(cwd=str(tmp_path), env=kernel_env(tmp_path))
    kc = km.client()
    kc.start_channels()
    try:
        kc.wait_for_ready(timeout=60)
        panel.locator("button", has_text="end").click()
        code = ("import caravanserai\n"
                "for i in range(3):\n"
                f"    caravanserai.checkpoint('browser-loop', {{'extra': i}}, f'from kernel 2 #{{i}}', store={store!r})")
        reply = kc.execute_interactive(code, timeout=60)
        assert reply["content"]["status"] == "ok"
        panel.locator(".cvs-row", has_text="from kernel 2 #2").wait_for(timeout=10_000)
        panel.locator(".cvs-attempt", has_text="attempt 3").wait_for()  # the other kernel's attempt, with its boundary
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)


def _dismiss_dialogs(page) -> None:
    for _ in range(3):
        try:
            page.locator(".jp-Dialog .jp-mod-accept, .jp-Dialog .jp-mod-reject").first.click(timeout=1500)
        except Exception:  # noqa: BLE001 - no dialog
            return


def _luminance(css: str) -> float:
    numbers = [float(x) for x in css[css.index("(") + 1: css.index(")")].split(",")[:3]]
    return sum(n * w for n, w in zip(numbers, (0.2126, 0.7152, 0.0722), strict=True)) / 255


DASHBOARD = """\
import caravanserai
from caravanserai.testing import ScriptedModel
with caravanserai.durable("dash-run") as run:
    for i in range(12):
        run.call_model(ScriptedModel([f"answer {i}"]), [{"role": "user", "content": f"question {i}"}])
        run.checkpoint({"i": i}, f"step {i}")
    for _ in caravanserai.resumable_iterate(range(40)):
        pass
caravanserai.checkpoint("other-run", {"x": 1}, "another run")
%load_ext caravanserai
"""


def test_dashboard_journal_charts_and_runs_in_jupyterlab(tmp_path):
    notebook(tmp_path / "dash.ipynb", [DASHBOARD, "%caravanserai show dash-run",
                                       "from caravanserai.widgets import Runs\nRuns()"])
    server = JupyterServer(tmp_path)
    try:
        with chromium(tmp_path / ".chrome") as page:
            open_notebook(page, server, "dash.ipynb")
            run_all(page)
            page.wait_for_selector(".lm-TabBar-tab >> text=Journal")
            wait_idle(page)
            page.locator(".lm-TabBar-tab", has_text="Journal").first.click()
            journal = page.locator(".cvs-panel:has(.cvs-columns .cvs-col-summary)").first
            journal.locator(".cvs-row").first.wait_for()
            before = journal.locator(".cvs-header").inner_text()
            journal.locator("select.cvs-input").first.select_option("call_settled")
            page.wait_for_function("([el, b]) => el.innerText !== b",
                                   arg=[journal.locator(".cvs-header").element_handle(), before])
            assert "12 of" in journal.locator(".cvs-header").inner_text()
            journal.locator(".cvs-row").nth(1).click()
            assert "1 selected" in journal.locator(".cvs-header").inner_text()
            screenshot(page, "panels-journal.png")
            page.locator(".lm-TabBar-tab", has_text="Charts").first.click()
            page.wait_for_selector(".cvs-chart svg >> nth=1")  # the cost and latency charts, inline SVG
            screenshot(page, "panels-charts.png")
            runs = page.locator(".cvs-panel:has(.cvs-col-run_id)").first
            runs.locator(".cvs-row", has_text="other-run").click()
            runs.locator("xpath=../..").locator(".cvs-waypoint", has_text="another run").wait_for()
            screenshot(page, "panels-runs.png")
            assert page.errors == []  # type: ignore[attr-defined]
    finally:
        server.stop()


SMALL_RUN = """\
import caravanserai
for i in range(5):
    caravanserai.checkpoint("small-run", {"i": i}, f"small **step {i}**")
"""


def test_timeline_in_jupyter_notebook_7(tmp_path):
    need(has_module("notebook"), "notebook (Jupyter Notebook 7) is not installed (the [test] extra)")
    notebook(tmp_path / "nb7.ipynb", [SMALL_RUN, "from caravanserai.widgets import Timeline\nTimeline('small-run')",
                                      "Timeline('no-such-run', live=False)", WATCHERS])
    server = JupyterServer(tmp_path, app="notebook")
    try:
        with chromium(tmp_path / ".chrome") as page:
            page.goto(server.url("notebooks/nb7.ipynb"))
            page.wait_for_selector(".jp-Notebook .jp-Cell")
            page.wait_for_selector(".jp-Notebook-ExecutionIndicator[data-status='idle']")
            page.wait_for_timeout(1000)  # the indicator says idle a moment before the kernel is connected
            page.get_by_role("menuitem", name="Run", exact=True).click()
            page.get_by_role("menuitem", name="Run All Cells", exact=True).click()
            try:
                page.locator(".jp-Dialog .jp-mod-accept").click(timeout=1500)  # a stray "Select Kernel" dialog
            except Exception:  # noqa: BLE001 - usually there is none
                pass
            panel = page.locator(".cvs-panel").first
            panel.locator(".cvs-waypoint", has_text="small step 4").wait_for()
            assert panel.locator(".cvs-waypoint").count() == 5
            error = page.locator(".cvs-panel").nth(1).locator(".cvs-error")
            error.wait_for()  # a missing run: the typed error's one line, not a blank cell
            assert error.inner_text().startswith("RunNotFound: no run 'no-such-run'")
            screenshot(page, "panels-notebook7.png")
            cells = page.locator(".jp-Notebook .jp-Cell")
            cells.nth(3).locator(".jp-OutputArea-output", has_text="watchers:").wait_for()
            for _ in range(2):  # re-run the Timeline cell: each old view is removed and its panel stops polling
                cells.nth(1).locator(".jp-InputArea-editor").click()
                page.keyboard.press("Control+Enter")
                page.wait_for_timeout(1000)
                cells.nth(1).locator(".cvs-waypoint", has_text="small step 4").wait_for()
            cells.nth(3).locator(".jp-InputArea-editor").click()
            page.keyboard.press("Control+Enter")
            page.wait_for_timeout(1500)
            counted = cells.nth(3).locator(".jp-OutputArea-output").inner_text()
            assert counted.strip() == "watchers: 1", counted  # three Timelines built, one shown, one polling
    finally:
        server.stop()


WATCHERS = """\
import threading, time
time.sleep(0.5)
print("watchers:", sum(t.name == "caravanserai-panel" and t.is_alive() for t in threading.enumerate()))
"""


MARIMO_APP = '''\
import marimo

app = marimo.App()


@app.cell
def _():
    import marimo as mo
    from caravanserai.widgets import Timeline
    panel = mo.ui.anywidget(Timeline("small-run", store={store!r}, live=False))
    panel
    return


if __name__ == "__main__":
    app.run()
'''


def test_timeline_in_marimo(tmp_path, child_env):
    need(has_module("marimo"), "marimo is not installed (the [test] extra)")
    store = str(tmp_path / ".caravanserai")
    subprocess.run([sys.executable, "-c", SMALL_RUN], cwd=tmp_path, env=child_env, check=True)
    (tmp_path / "app.py").write_text(MARIMO_APP.format(store=store))
    port = free_port()
    env = kernel_env(tmp_path)
    proc = subprocess.Popen([str(Path(sys.executable).parent / "marimo"), "run", "app.py", "--headless", "--no-token",
                             "--port", str(port), "--host", "127.0.0.1"], cwd=tmp_path, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_http(f"http://127.0.0.1:{port}/", 60, proc)
        with chromium(tmp_path / ".chrome") as page:
            page.goto(f"http://127.0.0.1:{port}/")
            panel = page.locator(".cvs-panel").first
            panel.locator(".cvs-waypoint", has_text="small step 4").wait_for(timeout=60_000)
            assert panel.locator(".cvs-waypoint").count() == 5
            screenshot(page, "panels-marimo.png")
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(20)

"""Every panel as a researcher sees it, in a REAL JupyterLab (Chromium driven by Playwright).

One notebook shows each panel on runs with priced model calls, a crash and a resume (replays), a
fork and a notebook loop; the test checks what a designer would (one status badge and no controls
in an error state, the journal's sort indicator, lists as tall as their rows up to a maximum,
unfolding a Compare's shared steps keeps the clicked row in view) and writes a screenshot of every
panel in the light and dark themes at 1280×800 and in a narrow (about 700 px) cell to
tests/artifacts/looks-*.png. Skips locally without Chromium/Playwright; fails under CI=true.
"""

from __future__ import annotations

import pytest
from browser_helpers import (
    REPO,
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

ROW = 26  # px per row (panels.js)


@pytest.fixture(scope="module", autouse=True)
def browser_parts():
    need_browser("jupyterlab", "anywidget")


RUNS = """\
import caravanserai
from caravanserai import durable
from caravanserai.calls.pricing import register_price
from caravanserai.testing import ScriptedModel
register_price("scripted", 2.5, 10.0)  # priced like a small hosted model, so the costs read as dollars

def answer_all(run_id, model, fail_at=None):
    with durable(run_id) as run:
        state = run.state or {"step": 0, "answers": []}
        for step in range(state["step"], 4):
            reply = run.call_model(model, [{"role": "user", "content": f"question {step}: " + "why? " * 40}])
            if step == fail_at:
                raise RuntimeError("the grader crashed")
            state = {"step": step + 1, "answers": [*state["answers"], reply.text]}
            run.checkpoint(state, f"answered **question {step}**")
    return state["answers"]

try:
    answer_all("looks-run", ScriptedModel(["an answer of some length " * 12], repeat_last=True), fail_at=2)
except RuntimeError:
    pass
answer_all("looks-run", ScriptedModel(["a second answer " * 10], repeat_last=True))
caravanserai.fork("looks-run", at=2, new_run_id="looks-fork", state={"step": 2, "answers": ["a0", "edited"]})
answer_all("looks-fork", ScriptedModel(["the fork's answer " * 8], repeat_last=True))
"""

CELLS = [
    "%load_ext caravanserai",
    RUNS,
    research_loop("looks-loop", "i * i"),
    "from caravanserai.widgets import Timeline, JournalTable, Runs, Compare, Lineage, ForkPanel\nTimeline('looks-run')",
    "JournalTable('looks-run')",
    "Runs()",
    "Compare('looks-run', 'looks-fork')",
    "Lineage('looks-run')",
    "ForkPanel('looks-run')",
    "import caravanserai\ncaravanserai.fork('looks-loop', at=16, new_run_id='looks-loop-b',\n"
    "                  variables={'results': {i: -i for i in range(16)}})\n"
    "Compare('looks-loop', 'looks-loop-b')",
    "Runs('http://127.0.0.1:9/?token=t')  # nothing listens there: the error state",
    "%caravanserai show looks-run",
    "Timeline('looks-loop')",
]
# output index (code cell) -> screenshot name
SHOTS = {3: "timeline", 4: "journal", 5: "runs", 6: "compare", 7: "lineage", 8: "fork", 9: "compare-loop",
         10: "runs-error", 11: "dashboard"}


def output(page, cell: int):
    return page.locator(".jp-Notebook .jp-Cell").nth(cell).locator(".jp-OutputArea")


def shoot_all(page, theme: str) -> None:
    for cell, name in SHOTS.items():
        area = output(page, cell)
        area.scroll_into_view_if_needed()
        screenshot(area, f"looks-{name}-{theme}.png")


def test_every_panel_light_dark_and_narrow(tmp_path):
    notebook(tmp_path / "looks.ipynb", CELLS)
    server = JupyterServer(tmp_path)
    try:
        with chromium(tmp_path / ".chrome", width=1280, height=800) as page:
            open_notebook(page, server, "looks.ipynb")
            run_all(page)
            output(page, 11).locator(".lm-TabBar-tab").first.wait_for()
            wait_idle(page)
            page.wait_for_function("() => document.querySelectorAll('.cvs-panel[data-painted]').length >= 10")
            check_money_as_python_writes_it(page)
            check_error_state(output(page, 10))
            check_heights(page)
            check_journal_sort(output(page, 4))
            check_unfold_keeps_the_row(output(page, 9))
            check_unfolding_loop_progress_keeps_attempt_1(output(page, 12))
            output(page, 5).locator("button.cvs-chart-button").click()  # the Runs chart, inside the panel
            output(page, 5).locator(".cvs-chart svg").wait_for()
            output(page, 11).locator(".lm-TabBar-tab", has_text="Charts").click()
            output(page, 11).locator(".cvs-chart svg, svg").first.wait_for()
            shoot_all(page, "light")
            lab_command(page, "apputils:change-theme", {"theme": "JupyterLab Dark"})
            page.wait_for_function("() => document.body.dataset.jpThemeName === 'JupyterLab Dark'")
            page.wait_for_timeout(500)
            shoot_all(page, "dark")
            background = page.evaluate("() => getComputedStyle(document.querySelector('.cvs-panel')).backgroundColor")
            assert background != "rgb(255, 255, 255)", background  # the panels follow the dark theme
            lab_command(page, "apputils:change-theme", {"theme": "JupyterLab Light"})
            lab_command(page, "application:toggle-left-area")
            page.set_viewport_size({"width": 760, "height": 800})
            page.wait_for_timeout(500)
            width = output(page, 3).locator(".cvs-panel").bounding_box()["width"]
            assert width <= 720, width  # a narrow cell indeed
            for cell, name in SHOTS.items():
                panel = output(page, cell)
                panel.scroll_into_view_if_needed()
                overflow = panel.evaluate("el => el.scrollWidth - el.clientWidth")
                assert overflow <= 1, f"{name} overflows a narrow cell by {overflow}px"
                screenshot(panel, f"looks-{name}-narrow.png")
            assert page.errors == []  # type: ignore[attr-defined]
    finally:
        server.stop()


def check_money_as_python_writes_it(page) -> None:
    """shell.js's dollars() (headers, deltas) writes every figure as ``calls.pricing.usd_text`` does."""
    from caravanserai.calls.pricing import usd_text

    source = (REPO / "widgets" / "static" / "shell.js").read_text()
    function = source[source.index("function dollars("):]
    function = function[:function.index("\n}\n") + 2]
    values = [0, 1e-9, 0.000123, 0.00042, 0.0015, 0.015, 0.1, 0.9996, 0.99999, 1, 12.345, 1234.5]
    shown = page.evaluate(f"(values) => {{ {function}; return values.map(dollars); }}", values)
    assert shown == [usd_text(v) for v in values]


def check_error_state(area) -> None:
    """Runs on a store nobody serves: the one-line error alone; no live badge, no dead chart button."""
    area.scroll_into_view_if_needed()  # JupyterLab draws cells out of view lazily
    panel = area.locator(".cvs-panel").first
    error = panel.locator(".cvs-error")
    error.wait_for()
    text = error.text_content() or ""
    assert text.strip() and "\n" not in text.strip(), text
    assert panel.locator(".cvs-badge.cvs-live").count() == 0
    assert area.locator("button:visible").count() == 0  # nothing to click that cannot work
    assert panel.locator(".cvs-toolbar").is_hidden() and panel.locator(".cvs-columns").is_hidden()


def check_heights(page) -> None:
    """Each list is as tall as its rows (up to the maximum): no blank space under one row."""
    gaps = page.evaluate(f"""() => [...document.querySelectorAll('.cvs-panel')].filter((p) => p.offsetParent).map((p) => {{
        const s = p.querySelector('.cvs-scroller');
        if (!s || !s.offsetParent) return 0;
        const total = Number(p.dataset.total || 0);
        return s.clientHeight - Math.min(s.clientHeight, total * {ROW} + 2);
    }})""")
    assert max(gaps) <= 1, gaps


def check_journal_sort(area) -> None:
    area.scroll_into_view_if_needed()  # JupyterLab draws cells out of view lazily
    header = area.locator(".cvs-columns")
    assert header.locator(".cvs-sorted").text_content() == "seq ▲"
    header.locator(".cvs-col-type").click()
    header.locator(".cvs-sorted:text-is('type ▲')").wait_for()
    header.locator(".cvs-col-type").click()
    header.locator(".cvs-sorted:text-is('type ▼')").wait_for()
    assert header.locator(".cvs-sorted").get_attribute("aria-sort") == "descending"
    header.locator(".cvs-col-seq").click()
    header.locator(".cvs-sorted:text-is('seq ▲')").wait_for()


def check_unfold_keeps_the_row(area) -> None:
    """Clicking "steps 1–15 are identical" unfolds them and keeps step 1 where the click was."""
    area.scroll_into_view_if_needed()  # JupyterLab draws cells out of view lazily
    panel = area.locator(".cvs-panel").first
    shared = panel.locator(".cvs-row.cvs-shared")
    shared.wait_for()
    shared.click()
    panel.locator(".cvs-row.cvs-cmp:has(.cvs-cmp-step:text-is('1'))").wait_for()
    page_box = panel.locator(".cvs-scroller").bounding_box()
    row_box = panel.locator(".cvs-row.cvs-cmp:has(.cvs-cmp-step:text-is('1'))").bounding_box()
    assert page_box["y"] <= row_box["y"] <= page_box["y"] + page_box["height"] - ROW, (page_box, row_box)


def check_unfolding_loop_progress_keeps_attempt_1(area) -> None:
    """Unticking "fold loop progress" adds a row per loop commit; the row at the top (attempt 1) stays there."""
    area.scroll_into_view_if_needed()
    panel = area.locator(".cvs-panel").first
    scroller = panel.locator(".cvs-scroller")
    scroller.evaluate("(el) => { el.scrollTop = 0; }")
    first = panel.locator(".cvs-row.cvs-attempt").first
    first.wait_for()
    before = int(panel.get_attribute("data-total"))
    panel.locator(".cvs-check input").uncheck()
    area.page.wait_for_function("([el, n]) => Number(el.dataset.total) > n", arg=[panel.element_handle(), before])
    box, row = scroller.bounding_box(), panel.locator(".cvs-row.cvs-attempt").first.bounding_box()
    assert box["y"] <= row["y"] <= box["y"] + ROW, (box, row)  # still the top row, not scrolled to the end

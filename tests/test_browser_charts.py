"""The charts in a REAL browser: JupyterLab in Debian's Chromium (Playwright), on loopback, offline.

A JupyterLab notebook with no ``%matplotlib`` anywhere ends three cells with ``cost_chart``, ``latency_chart``
and ``runs_chart``: each shows as an ``<img>`` of a PNG. The dashboard's Charts tab shows the
cost and latency charts as inline SVG whose text takes the theme's colour: dark text in the light
theme; after switching JupyterLab to its dark theme, light text and no white box around it.
In Jupyter Notebook 7 the cost chart is an ``<img>`` as well. Screenshots go to tests/artifacts/
(charts-light.png, charts-dark.png, charts-inline.png, charts-notebook7.png).
Skips locally without Chromium/Playwright; fails under CI=true.
"""

from __future__ import annotations

import pytest
from browser_helpers import (
    JupyterServer,
    chromium,
    has_module,
    lab_command,
    need_browser,
    notebook,
    open_notebook,
    run_all,
    screenshot,
    wait_idle,
)
from conftest import need


@pytest.fixture(scope="module", autouse=True)
def browser_parts():
    need_browser("jupyterlab", "ipywidgets", "anywidget", "matplotlib")


RUNS = """\
import caravanserai
from caravanserai import durable
from caravanserai.calls.models import Model, ModelResponse, Usage
from caravanserai.calls.pricing import register_price

class Priced(Model):
    provider, name = "test", "chart-model"

    def complete(self, messages, *, tools=None, **params):
        return ModelResponse(f"answer {len(messages)}", Usage(1000, 200), (), self.name, None)

register_price("chart-model", 1.0, 2.0)
for attempt in (1, 2):  # attempt 1 fails after its third call; attempt 2 replays it and pays two more
    try:
        with durable("chart-run") as run:
            for i in range((run.state or {"i": -1})["i"] + 1, 5):
                run.call_model(Priced(), [{"role": "user", "content": f"step {i}"}], path="story")
                if attempt == 1 and i == 2:
                    raise RuntimeError("boom")
                run.checkpoint({"i": i}, f"step {i}")
    except RuntimeError:
        pass
caravanserai.checkpoint("no-calls", {"x": 1}, "one waypoint, no calls")
from caravanserai.widgets import cost_chart, latency_chart, runs_chart, show
"""

# The computed colour of each chart's title (its first <text>), and the first opaque background behind the chart.
COLOURS = """(svgs) => svgs.map((svg) => {
  const rgb = (c) => (c.match(/[\\d.]+/g) || []).map(Number);
  let el = svg, bg = null;
  while (el && bg === null) {
    const c = getComputedStyle(el).backgroundColor, parts = rgb(c);
    if (parts.length === 3 || (parts.length === 4 && parts[3] > 0)) bg = parts;
    el = el.parentElement;
  }
  return {text: rgb(getComputedStyle(svg.querySelector('text')).fill), svg: getComputedStyle(svg).backgroundColor, bg};
})"""


def luminance(rgb: list[float]) -> float:
    return (0.2126 * rgb[0] + 0.7152 * rgb[1] + 0.0722 * rgb[2]) / 255


def test_charts_show_without_matplotlib_magic_and_follow_the_theme(tmp_path):
    notebook(tmp_path / "charts.ipynb", [RUNS, "cost_chart('chart-run')", "latency_chart('chart-run')", "runs_chart()",
                                         "dashboard = show('chart-run', live=False)"])
    server = JupyterServer(tmp_path)
    try:
        with chromium(tmp_path / ".chrome") as page:
            open_notebook(page, server, "charts.ipynb")
            run_all(page)
            page.wait_for_selector(".lm-TabBar-tab >> text=Charts")
            wait_idle(page)
            cells = page.locator(".jp-Notebook .jp-CodeCell")
            for index in (1, 2, 3):  # an <img> of a PNG, drawn at its width: no %matplotlib ran
                img = cells.nth(index).locator(".jp-OutputArea-output img")
                img.wait_for()
                assert img.get_attribute("src").startswith("data:image/png;base64,")
                assert img.evaluate("(el) => el.naturalWidth") == 1500 and img.get_attribute("width") == "750"
                assert "ChartFigure size" not in cells.nth(index).locator(".jp-OutputArea").inner_text()
            screenshot(cells.nth(1).locator(".jp-OutputArea"), "charts-inline.png")

            dashboard = cells.nth(4).locator(".jp-OutputArea-output").first
            dashboard.locator(".lm-TabBar-tab", has_text="Charts").click()
            dashboard.locator(".cvs-chart svg >> nth=1").wait_for()
            svgs = dashboard.locator(".cvs-chart svg")
            assert svgs.count() == 2
            light = svgs.evaluate_all(COLOURS)
            assert all(luminance(c["text"]) < 0.35 and luminance(c["bg"]) > 0.9 for c in light), light
            screenshot(dashboard, "charts-light.png")

            lab_command(page, "apputils:change-theme", {"theme": "JupyterLab Dark"})
            page.wait_for_function("() => document.body.dataset.jpThemeLight === 'false'")
            page.wait_for_timeout(500)  # the theme's stylesheet applies
            dark = svgs.evaluate_all(COLOURS)
            for chart in dark:  # light text on the theme's dark background, nothing white behind the chart
                assert chart["svg"] == "rgba(0, 0, 0, 0)", dark
                assert luminance(chart["text"]) > 0.7 and luminance(chart["bg"]) < 0.2, dark
            screenshot(dashboard, "charts-dark.png")
            assert page.errors == []  # type: ignore[attr-defined]
    finally:
        server.stop()


def test_a_chart_shows_without_matplotlib_magic_in_notebook_7(tmp_path):
    need(has_module("notebook"), "notebook (Jupyter Notebook 7) is not installed (the [test] extra)")
    notebook(tmp_path / "nb7.ipynb", [RUNS, "cost_chart('chart-run')"])
    server = JupyterServer(tmp_path, app="notebook")
    try:
        with chromium(tmp_path / ".chrome") as page:
            page.goto(server.url("notebooks/nb7.ipynb"))
            page.wait_for_selector(".jp-Notebook-ExecutionIndicator[data-status='idle']")
            page.wait_for_timeout(1000)  # the indicator says idle a moment before the kernel is connected
            page.get_by_role("menuitem", name="Run", exact=True).click()
            page.get_by_role("menuitem", name="Run All Cells", exact=True).click()
            try:
                page.locator(".jp-Dialog .jp-mod-accept").click(timeout=1500)  # a stray "Select Kernel" dialog
            except Exception:  # noqa: BLE001 - usually there is none
                pass
            img = page.locator(".jp-Notebook .jp-CodeCell").nth(1).locator(".jp-OutputArea-output img")
            img.wait_for(timeout=120_000)
            assert img.get_attribute("src").startswith("data:image/png;base64,") and img.get_attribute("width") == "750"
            screenshot(img, "charts-notebook7.png")
    finally:
        server.stop()

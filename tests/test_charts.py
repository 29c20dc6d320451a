"""The charts by their data, not their pixels: the plotted series, the tick locators and the dollar
ticks, the sentence an empty chart says, the image a chart shows as a cell's value (IPython's
display protocol, a real kernel through nbclient, marimo's formatter) and the themed SVG the panels
show (colours as the theme's CSS variables, no white background).

The runs are written in-process through the public API: attempt 1 pays three model calls and fails
before its third waypoint, attempt 2 answers that call from the journal and pays two more.
"""

from __future__ import annotations

import base64
import json
import re
import subprocess
import textwrap
from pathlib import Path

import pytest
from conftest import PYTHON, need_kernel_packages, need_module

need_module("matplotlib", "notebook")
need_module("ipywidgets", "notebook")

from caravanserai.widgets import Dashboard, cost_chart, latency_chart, runs_chart  # noqa: E402
from caravanserai.widgets.charts import THEMED, call_points, themed_svg, usd_tick  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.ticker import FuncFormatter, MaxNLocator  # noqa: E402

import caravanserai  # noqa: E402
from caravanserai import durable  # noqa: E402
from caravanserai.calls.models import Model, ModelResponse, Usage  # noqa: E402
from caravanserai.calls.pricing import register_price  # noqa: E402
from caravanserai.runs.view import inspect_run  # noqa: E402

PNG = b"\x89PNG\r\n\x1a\n"


class Priced(Model):
    provider, name = "test", "chart-model"

    def complete(self, messages, *, tools=None, **params):
        return ModelResponse(f"answer {len(messages)}", Usage(1000, 200), (), self.name, None)


class Free(Priced):
    name = "chart-free-model"  # listed at $0: priced, and every figure is zero


def write_run(run_id: str, model: Model, steps: int = 5, fail_at: int | None = 2) -> None:
    """One call and one waypoint per step; attempt 1 fails after step ``fail_at``'s call, attempt 2 resumes."""
    for attempt in (1, 2) if fail_at is not None else (1,):
        try:
            with durable(run_id) as run:
                for i in range((run.state or {"i": -1})["i"] + 1, steps):
                    run.call_model(model, [{"role": "user", "content": f"step {i}"}], path="story")
                    if attempt == 1 and i == fail_at:
                        raise RuntimeError("boom")
                    run.checkpoint({"i": i}, f"step {i}")
        except RuntimeError:
            pass


@pytest.fixture
def runs(project: Path) -> Path:
    register_price("chart-model", 1.0, 2.0)  # $0.0014 a call: 1000 + 200 tokens
    register_price("chart-free-model", 0.0, 0.0)
    write_run("cost-run", Priced())
    write_run("free-run", Free(), steps=2, fail_at=None)
    caravanserai.checkpoint("no-calls", {"x": 1}, "one waypoint, no calls")
    caravanserai.runs.close_all()
    return project


def test_usd_tick_reads_plain_dollars():
    assert [usd_tick(v) for v in (0, 1e-18, 12.344, 1.0, 1234.5)] == ["$0", "$0", "$12.34", "$1.00", "$1234.50"]
    assert [usd_tick(v) for v in (0.015, 0.00042, 0.5, 0.12345, 1e-5, 2.5e-7)] == \
        ["$0.015", "$0.00042", "$0.5", "$0.123", "$0.00001", "$0.00000025"]
    assert usd_tick(0.9996) == "$1.00" and usd_tick(-0.015) == "-$0.015"


def test_cost_chart_plots_the_cumulative_figures_with_whole_number_calls_and_dollars(runs):
    view = inspect_run("cost-run")
    points = call_points(view)
    assert [(p.attempt, p.replayed) for p in points] == [(1, False)] * 3 + [(2, True), (2, False), (2, False)]
    fig = cost_chart(view)
    assert isinstance(fig, Figure)
    usd_ax, tok_ax = fig.axes
    assert list(usd_ax.lines[0].get_xdata()) == [1, 2, 3, 4, 5, 6]
    assert list(usd_ax.lines[0].get_ydata()) == pytest.approx([0.0014, 0.0028, 0.0042, 0.0042, 0.0056, 0.007])
    assert usd_ax.lines[0].get_ydata()[-1] == pytest.approx(view.receipt.estimated_usd)
    assert list(tok_ax.lines[0].get_ydata()) == [1200, 2400, 3600, 3600, 4800, 6000]  # the replay adds no tokens
    replayed = [c for c in usd_ax.collections if "replayed" in str(c.get_label())]
    assert [list(xy) for xy in replayed[0].get_offsets()] == [[4, pytest.approx(0.0042)]]
    for axis in (tok_ax.xaxis, tok_ax.yaxis):
        assert isinstance(axis.get_major_locator(), MaxNLocator) and axis.get_major_locator()._integer
    assert isinstance(usd_ax.yaxis.get_major_formatter(), FuncFormatter)
    fig.draw_without_rendering()
    assert all(float(t).is_integer() for t in tok_ax.get_xticks())
    assert tok_ax.get_xlim() == (0.5, 6.5)
    labels = [t.get_text() for t in usd_ax.get_yticklabels()]
    assert labels[0] == "$0" and "$0.004" in labels and all(re.fullmatch(r"\$[0-9.]+", label) for label in labels)
    assert usd_ax.yaxis.get_offset_text().get_text() == "" == tok_ax.yaxis.get_offset_text().get_text()


def test_calls_at_zero_dollars_get_one_0_tick_not_minus_004(runs):
    usd_ax, _ = cost_chart("free-run").axes
    assert list(usd_ax.lines[0].get_ydata()) == [0.0, 0.0]
    usd_ax.figure.draw_without_rendering()
    assert [t.get_text() for t in usd_ax.get_yticklabels()] == ["$0"] and usd_ax.get_ylim()[0] == 0


def test_latency_chart_plots_durations_and_waypoint_gaps_on_whole_numbers(runs):
    view = inspect_run("cost-run")
    call_ax, way_ax = latency_chart(view).axes
    assert [bar.get_height() for bar in call_ax.patches] == [c.duration_s for c in view.calls if c.duration_s is not None]
    assert [bar.get_x() + bar.get_width() / 2 for bar in way_ax.patches] == [w.n for w in view.waypoints[1:]]
    assert len(way_ax.patches) == len(view.waypoints) - 1 and all(bar.get_height() >= 0 for bar in way_ax.patches)
    for axis in (call_ax.xaxis, way_ax.xaxis):
        assert isinstance(axis.get_major_locator(), MaxNLocator) and axis.get_major_locator()._integer


def test_runs_chart_plots_attempts_and_dollars_per_run(runs):
    fig = runs_chart()
    att_ax, usd_ax = fig.axes
    names = [label.get_text() for label in att_ax.get_yticklabels()]
    assert dict(zip(names, [bar.get_width() for bar in att_ax.patches])) == {"cost-run": 2, "free-run": 1, "no-calls": 1}
    usd = dict(zip(names, [bar.get_width() for bar in usd_ax.patches]))
    assert usd == {"cost-run": pytest.approx(0.007), "free-run": 0.0, "no-calls": 0.0}
    assert att_ax.xaxis.get_major_locator()._integer and isinstance(usd_ax.xaxis.get_major_formatter(), FuncFormatter)
    fig.draw_without_rendering()
    assert all(t.get_text().startswith("$") for t in usd_ax.get_xticklabels()) and usd_ax.xaxis.get_offset_text().get_text() == ""


def test_empty_charts_say_what_is_missing_instead_of_drawing_empty_axes(runs, tmp_path):
    for fig, sentence in ((cost_chart("no-calls"), "no-calls: no settled model calls yet, so no cost to chart"),
                          (latency_chart("no-calls"), "no-calls: no timed calls and fewer than two waypoints yet"),
                          (runs_chart(str(tmp_path / "empty-store")), "no runs in")):
        assert fig.axes == [] and len(fig.texts) == 1 and sentence in fig.texts[0].get_text()  # a sentence, no axes
    with durable("one-call") as run:  # a call, and a time between waypoints only once a second waypoint comes
        run.call_model(Priced(), [{"role": "user", "content": "hi"}], path="p")
        run.checkpoint({"x": 1}, "one")
    call_ax, way_ax = latency_chart("one-call").axes
    assert call_ax.axison and len(call_ax.patches) == 1
    assert not way_ax.axison and len(way_ax.patches) == 0 and "fewer than two waypoints" in way_ax.texts[0].get_text()
    _, usd_ax = runs_chart(rows=[{"run_id": "a", "attempts": 1, "usd": 0.0}]).axes  # no run has a priced call
    assert not usd_ax.axison and "no priced model calls" in usd_ax.texts[0].get_text()


def test_a_chart_is_an_image_as_a_cells_value(runs):
    from IPython.core.formatters import DisplayFormatter

    fig = cost_chart("cost-run")
    data, metadata = DisplayFormatter().format(fig)  # what IPython sends for a cell's last expression
    assert base64.b64decode(data["image/png"]).startswith(PNG)
    assert metadata["image/png"] == {"width": 750, "height": 420}  # drawn at 2x, shown at the figure's size
    assert data["text/plain"] == "<ChartFigure size 750x420 with 2 Axes>" and "image/svg+xml" not in data
    empty, _ = DisplayFormatter().format(cost_chart("no-calls"))
    assert base64.b64decode(empty["image/png"]).startswith(PNG)


def test_marimo_draws_the_chart_as_a_figure(runs):
    need_module("marimo")
    script = textwrap.dedent("""\
        import json
        from marimo._output.formatting import try_format
        from caravanserai.widgets import cost_chart
        out = try_format(cost_chart("cost-run"))
        print(json.dumps([out.mimetype, out.data[:200], out.traceback]))
    """)
    done = subprocess.run([PYTHON, "-c", script], capture_output=True, text=True, timeout=120, check=True)
    mimetype, data, traceback = json.loads(done.stdout.strip().splitlines()[-1])
    assert traceback is None and mimetype in ("application/vnd.marimo+mimebundle", "image/png")
    assert "data:image/png;base64," in data


def test_themed_svg_takes_the_themes_colours_and_has_no_background(runs):
    svg = themed_svg(cost_chart("cost-run"))
    assert svg.startswith("<svg") and 'width="750" height="420"' in svg and "max-width: 100%" in svg
    bare = re.sub("|".join(re.escape(v) for v in THEMED.values()), "var()", svg)
    assert not re.search("|".join(THEMED), bare)  # every light-theme colour became its variable (the fallback in it)
    assert "#fff" not in bare and "white" not in bare  # no white but the theme's own background colour (legend)
    figure_patch = re.search(r'<g id="patch_1">\s*<path [^>]*style="([^"]*)"', svg)
    assert figure_patch and figure_patch.group(1) == "fill: none"
    texts = re.findall(r'<text style="[^"]*fill: ([^;"]+)[^>]*>([^<]*)</text>', svg)
    assert ("var(--cvs-fg, var(--jp-ui-font-color1, #1f2328))", "cost-run: cost per call") in texts
    assert ("var(--cvs-fg2, var(--jp-ui-font-color2, #59636e))", "$0.004") in texts  # a tick, in dollars
    assert "#2e7be6" in svg  # attempt 1's points keep their colour (readable on white and on #111)
    assert themed_svg(cost_chart("no-calls")).count("<text") == 1


def test_the_dashboards_charts_tab_shows_themed_svgs(runs):
    dashboard = Dashboard("cost-run", live=False)
    try:
        dashboard.selected_index = 2
        cost, latency = dashboard.charts.children
        for widget, title in ((cost, "cost-run: cost per call"), (latency, "cost-run: latency per call")):
            assert widget.value.startswith("<svg") and title in widget.value and "var(--jp-ui-font-color1" in widget.value
            assert "cvs-chart" in widget._dom_classes
    finally:
        dashboard.close()


def test_a_notebook_run_by_nbclient_shows_the_chart_as_an_image(runs):
    need_kernel_packages()
    import nbformat
    from kernel_helpers import child_env
    from nbclient import NotebookClient

    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("from caravanserai.widgets import cost_chart\ncost_chart('cost-run')"),
                nbformat.v4.new_code_cell("%matplotlib inline\nimport matplotlib.pyplot\ncost_chart('cost-run')")]
    NotebookClient(nb, timeout=120, kernel_name="python3", resources={"metadata": {"path": str(runs)}}).execute(
        env=child_env(runs))
    plain, inline = ([o for o in cell.outputs if o["output_type"] in ("execute_result", "display_data")] for cell in nb.cells)
    assert len(plain) == 1 and base64.b64decode(plain[0]["data"]["image/png"]).startswith(PNG)
    assert plain[0]["metadata"]["image/png"]["width"] == 750  # our bundle, no %matplotlib needed
    assert len(inline) == 1 and base64.b64decode(inline[0]["data"]["image/png"]).startswith(PNG)  # with it: once

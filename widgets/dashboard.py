"""``show(run_id)``: one dashboard with a run's Timeline, JournalTable and charts as tabs."""

from __future__ import annotations

import ipywidgets

from caravanserai.stores import Store

from .charts import cost_chart, latency_chart, png
from .journal import JournalTable
from .timeline import Timeline


class Dashboard(ipywidgets.Tab):
    """Tabs: Timeline, Journal, Charts (cost and latency; redrawn by ``refresh_charts()``)."""

    def __init__(self, run_id: str, store: Store | str | None = None, *, live: bool = True) -> None:
        self.timeline = Timeline(run_id, store, live=live)
        self.journal = JournalTable(run_id, store, live=live)
        self.charts = ipywidgets.VBox([])
        super().__init__([self.timeline, self.journal, self.charts])
        for index, title in enumerate(("Timeline", "Journal", "Charts")):
            self.set_title(index, title)
        self.observe(self._on_tab, names=["selected_index"])

    def _on_tab(self, change: dict) -> None:
        if change["new"] == 2:
            self.refresh_charts()

    def refresh_charts(self) -> None:
        """Draw the charts of what the Timeline shows now."""
        view = self.timeline.view
        if view is None:
            self.charts.children = (ipywidgets.HTML(f"<code>{self.timeline.error}</code>"),)
            return
        self.charts.children = tuple(ipywidgets.Image(value=png(fig), format="png")
                                     for fig in (cost_chart(view), latency_chart(view)))

    def close(self) -> None:
        self.timeline.close()
        self.journal.close()
        super().close()


def show(run_id: str, store: Store | str | None = None, *, live: bool = True) -> Dashboard:
    """Display (and return) the dashboard of ``run_id``: Timeline, Journal and Charts tabs."""
    from IPython.display import display

    dashboard = Dashboard(run_id, store, live=live)
    display(dashboard)
    return dashboard

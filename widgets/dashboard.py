"""``show(run_id)``: one dashboard with a run's Timeline, JournalTable and charts as tabs; and the
``%%resumable`` status line's link to it (``DashboardLink``)."""

from __future__ import annotations

import ipywidgets

from caravanserai.stores import Store

from .charts import cost_chart, latency_chart, themed_svg
from .journal import JournalTable
from .saved import SavedFallback, store_text
from .timeline import Timeline


def show_command(run_id: str, store: Store | str | None) -> str:
    """The magic that opens the dashboard again (the store's URL, secrets redacted, when not the default)."""
    where = store_text(store)
    return f"%caravanserai show {run_id}" + (f" --store {where}" if where else "")


class Dashboard(SavedFallback, ipywidgets.Tab):
    """Tabs: Timeline, Journal, Charts (cost and latency as inline SVG in the notebook theme's colours;
    redrawn by ``refresh_charts()``)."""

    def __init__(self, run_id: str, store: Store | str | None = None, *, live: bool = True) -> None:
        self.timeline = Timeline(run_id, store, live=live)
        self.journal = JournalTable(run_id, store, live=live)
        self.charts = ipywidgets.VBox([])
        super().__init__([self.timeline, self.journal, self.charts])
        self._reopen = show_command(run_id, store)
        for index, title in enumerate(("Timeline", "Journal", "Charts")):
            self.set_title(index, title)
        self.observe(self._on_tab, names=["selected_index"])

    def _saved_summary(self) -> dict:
        return self.timeline._saved_summary()

    def _on_tab(self, change: dict) -> None:
        if change["new"] == 2:
            self.refresh_charts()

    def refresh_charts(self) -> None:
        """Draw the charts of what the Timeline shows now."""
        view = self.timeline.view
        if view is None:
            self.charts.children = (ipywidgets.HTML(f"<code>{self.timeline.error}</code>"),)
            return
        self.charts.children = tuple(ipywidgets.HTML(themed_svg(fig)).add_class("cvs-chart")
                                     for fig in (cost_chart(view), latency_chart(view)))

    def close(self) -> None:
        self.timeline.close()
        self.journal.close()
        super().close()


class DashboardLink(SavedFallback, ipywidgets.VBox):
    """A "timeline ▸" button under a ``%%resumable`` status line: a click opens the run's dashboard
    in its place (nothing is read before). Without a widget front end it reads as the magic to type."""

    def __init__(self, run_id: str, store: Store | str | None = None) -> None:
        self.run_id, self.store = run_id, store
        self.dashboard: Dashboard | None = None
        button = ipywidgets.Button(description="timeline ▸", tooltip=f"open {run_id}: Timeline, Journal and Charts",
                                   layout=ipywidgets.Layout(width="auto"))
        button.add_class("caravanserai-open")
        button.on_click(lambda _: self.open_dashboard())
        super().__init__([button], layout=ipywidgets.Layout(align_items="flex-start"))
        self._reopen = show_command(run_id, store)

    def open_dashboard(self) -> Dashboard:
        """Open (once) the run's dashboard in place of the button."""
        if self.dashboard is None:
            self.dashboard = Dashboard(self.run_id, self.store)
            self.layout.align_items = "stretch"  # the dashboard takes the cell's width (the button did not)
            self.children = (self.dashboard,)
        return self.dashboard

    def close(self) -> None:
        if self.dashboard is not None:
            self.dashboard.close()
        super().close()


def show(run_id: str, store: Store | str | None = None, *, live: bool = True) -> Dashboard:
    """Display (and return) the dashboard of ``run_id``: Timeline, Journal and Charts tabs."""
    from IPython.display import display

    dashboard = Dashboard(run_id, store, live=live)
    display(dashboard)
    return dashboard

"""Notebook panels (anywidget), installed as ``caravanserai.widgets``.

``Timeline(run_id)``, ``JournalTable(run_id)``, ``Runs(store)``, ``ForkPanel(log_or_run)``,
``Lineage(run_or_log)``, ``Compare(a, b, ...)``, the charts (``cost_chart``, ``latency_chart``,
``runs_chart``, each a matplotlib ``Figure``) and ``show(run_id)``, a dashboard with them as tabs.
Their JavaScript and CSS ship as files of this package (no CDN): they work offline, in
JupyterLab, Jupyter Notebook 7 and other anywidget hosts; ``to_html(path)`` writes Timeline,
Lineage and Compare into one self-contained file. Needs the ``[notebook]`` extra; the core never
imports this package.
"""

from __future__ import annotations

from .charts import cost_chart, latency_chart, runs_chart
from .compare import Compare
from .dashboard import Dashboard, DashboardLink, show
from .fork import ForkPanel, ForkSteps
from .journal import JournalTable
from .lineage import Lineage, LineageTree
from .panel import Panel
from .runs import Runs, RunsList
from .timeline import Timeline

__all__ = ["Compare", "Dashboard", "DashboardLink", "ForkPanel", "ForkSteps", "JournalTable", "Lineage", "LineageTree",
           "Panel", "Runs", "RunsList", "Timeline", "cost_chart", "latency_chart", "runs_chart", "show"]

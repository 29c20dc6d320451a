"""What the notebook panels show, computed in the kernel (layer 6, no widget library needed).

Each panel has a *source* here: its rows by window, the detail of a row, a summary, and a
``poll()`` for live updates. The anywidget shells in ``caravanserai.widgets`` draw a source in a
notebook; ``export`` writes the same sources into one self-contained HTML file (the CLI's
``caravanserai export``), so a run can be read with no kernel and no network.
"""

from .compare import CompareSource
from .lineage import LineageSource
from .source import Source
from .steps import StepsSource
from .timeline import TimelineSource

__all__ = ["CompareSource", "LineageSource", "Source", "StepsSource", "TimelineSource"]

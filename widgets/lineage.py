"""``Lineage(run_or_log)``: the tree of forks as an interactive SVG; click a node for its Timeline, pick two to Compare.

Nodes are timelines (runs, or branches inside one run's CheckpointLog), edges the forks, each
labelled with where it left its parent and what it changed. Live: a fork made anywhere (this
kernel, a ForkPanel, the CLI, another machine on a shared store) grows a branch.
"""

from __future__ import annotations

from typing import Any

import ipywidgets
import traitlets

from caravanserai.errors import UsageError
from caravanserai.panels.lineage import LineageSource
from caravanserai.stores import Store

from .compare import Compare
from .panel import Panel
from .saved import SavedFallback, reopen_call
from .timeline import Timeline

LINEAGE_POLL_SECONDS = 1.0


class LineageTree(Panel):
    """The SVG part of ``Lineage``; ``picked`` holds the node ids ticked for Compare."""

    picked: traitlets.List[str] = traitlets.List().tag(sync=True)

    def __init__(self, run_or_log: Any, store: Store | str | None = None, *, live: bool = True) -> None:
        super().__init__(LineageSource(run_or_log, store), view_count=2000)
        self.opener: Any = None
        self.comparer: Any = None
        if not self.tick():
            self.send_window()
        if live:
            self.watch(LINEAGE_POLL_SECONDS)

    @property
    def nodes(self) -> list[Any]:
        assert isinstance(self.source, LineageSource)
        return self.source.nodes

    def on_open(self, content: dict) -> None:
        if self.opener is not None:
            self.opener(str(content.get("id", "")))

    def on_compare(self, content: dict) -> None:
        ids = content.get("ids") or self.picked
        if self.comparer is not None:
            self.comparer(list(ids))


class Lineage(SavedFallback, ipywidgets.VBox):
    """``Lineage(run_or_log, store=None, live=True)``: the fork tree, and under it the Timeline or Compare opened from it."""

    def __init__(self, run_or_log: Any, store: Store | str | None = None, *, live: bool = True) -> None:
        self.tree = LineageTree(run_or_log, store, live=live)
        self.shown: Timeline | Compare | None = None
        self._live = live
        self.tree.opener = self.open_timeline
        self.tree.comparer = self.compare
        super().__init__([self.tree])
        self._reopen = reopen_call("Lineage", run_or_log, store=store)

    def _saved_summary(self) -> dict:
        return self.tree._saved_summary()

    @property
    def source(self) -> LineageSource:
        assert isinstance(self.tree.source, LineageSource)
        return self.tree.source

    def open_timeline(self, node_id: str) -> Timeline:
        """Show the Timeline of node ``node_id`` under the tree."""
        node = self.source.node(node_id)
        return self._show(Timeline(node.run_id, self.source.store, live=self._live))

    def compare(self, node_ids: list[str]) -> Compare:
        """Show a Compare of two or more nodes (the first is the baseline) under the tree."""
        if len(node_ids) < 2:
            raise UsageError("pick two timelines (or more) to compare: tick their boxes in the tree")
        refs = [self.source.ref_of(self.source.node(node_id)) for node_id in node_ids]
        return self._show(Compare(*refs, store=self.source.store, live=self._live))

    def _show(self, panel: Timeline | Compare) -> Any:
        if self.shown is not None:
            self.shown.close()
        self.shown = panel
        self.children = (self.tree, panel)
        return panel

    def to_html(self, path: str, title: str | None = None) -> str:
        """Write the tree (read-only, self-contained) to ``path``."""
        return self.tree.to_html(path, title)

    def close(self) -> None:
        self.tree.close()
        if self.shown is not None:
            self.shown.close()
        super().close()

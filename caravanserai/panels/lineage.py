"""Lineage's rows: the fork tree of a run (or of a CheckpointLog) laid out for an SVG, one row per timeline."""

from __future__ import annotations

from typing import Any

from ..checkpoints.lineage import LineageNode, family, lineage
from ..errors import UsageError
from ..stores import Store, open_store
from .source import Source

__all__ = ["LineageSource", "log_ref"]


def log_ref(run_or_log: Any, store: Store | str | None) -> tuple[str, Store]:
    """(run id, store) of a run id or a CheckpointLog on a caravanserai store."""
    from ..checkpoints.log import CheckpointLog

    if isinstance(run_or_log, CheckpointLog):
        if run_or_log.store is None:
            raise UsageError("this panel needs a CheckpointLog on a caravanserai store (CheckpointLog(open_store(), RUN)): "
                             "a bare object store keeps no journal to show")
        return run_or_log.run_id, run_or_log.store
    if not isinstance(run_or_log, str):
        raise UsageError(f"give a run id or a CheckpointLog, got {type(run_or_log).__name__}")
    return run_or_log, open_store(store)


class LineageSource(Source):
    """Every timeline of the fork family around ``run``; live: new forks appear as they are made."""

    panel = "lineage"

    def __init__(self, run_or_log: Any, store: Store | str | None = None) -> None:
        self.ref, self.store = log_ref(run_or_log, store)
        self.nodes: list[LineageNode] = []
        self._cache: dict[str, tuple[str | None, str]] = {}
        self._stamps: dict[str, Any] = {}

    def poll(self) -> bool:
        members = family(self.ref.partition("@")[0], self.store, self._cache)
        stamps = {run: self.store.last_updated(run) for run in members}
        if stamps == self._stamps and self.nodes:
            return False
        self.nodes = lineage(self.ref, self.store, cache=self._cache)
        self._stamps = stamps
        return True

    def count(self) -> int:
        return len(self.nodes)

    def rows(self, start: int, stop: int) -> list[dict]:
        return [{**node.to_dict(), "row": start + i, "ref": self.ref_of(node)}
                for i, node in enumerate(self.nodes[start:stop], start=0)]

    def ref_of(self, node: LineageNode) -> str:
        """The timeline ref of a node: its run id, or RUN@CHECKPOINT where the run's log has branches."""
        if node.kind == "branch" or node.head is None:
            return node.id
        branched = any(n.kind == "branch" and n.run_id == node.run_id for n in self.nodes)
        return f"{node.run_id}@{node.head[:12]}" if branched else node.id

    def node(self, node_id: str) -> LineageNode:
        """The node named ``node_id`` (UsageError if the tree has none)."""
        for node in self.nodes:
            if node.id == node_id:
                return node
        raise UsageError(f"no timeline {node_id!r} in this lineage; pick one of its nodes")

    def detail(self, index: int) -> dict:
        node = self.nodes[index]
        where = f" at {node.point_kind} {node.point}" if node.point else ""
        origin = f"forked from {node.parent}{where}" if node.parent else "the root"
        return {"title": f"{node.id}: {origin}{' · ' + node.edit if node.edit else ''} · {node.status}"}

    def summary(self) -> dict:
        roots = [n.id for n in self.nodes if n.depth == 0]
        return {"run_id": self.ref, "root": roots[0] if roots else self.ref, "timelines": len(self.nodes),
                "forks": sum(1 for n in self.nodes if n.parent)}

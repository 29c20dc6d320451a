"""``Compare(a, b, ...)``: timelines aligned step by step, the first divergence highlighted and scrolled to.

The shared prefix is one folded row; each later step shows every timeline's output word-diffed
against the first, with tokens, seconds and USD and their deltas; "differences only" hides the
steps that agree. Rows come from ``caravanserai.panels.compare`` (the alignment ``caravanserai
diff`` prints); only the visible window goes to the browser. Live while a timeline is written.
"""

from __future__ import annotations

from typing import Any

import traitlets

from caravanserai.panels.compare import CompareSource
from caravanserai.stores import Store

from .panel import Panel
from .saved import reopen_call

COMPARE_POLL_SECONDS = 0.5


def _refs_and_store(refs: tuple[Any, ...], store: Store | str | None) -> tuple[list[Any], Store | str | None]:
    """Run ids, RUN@CHECKPOINT refs or CheckpointLogs (whose store is used when none is given)."""
    if len(refs) == 1 and isinstance(refs[0], (list, tuple)):
        refs = tuple(refs[0])
    out = []
    for ref in refs:
        log_store = getattr(ref, "store", None)
        if hasattr(ref, "run_id") and isinstance(log_store, Store):
            store = store if store is not None else log_store
            ref = ref.run_id
        out.append(ref)
    return out, store


class Compare(Panel):
    """``Compare("run-a", "run-a-fork-3", store=None, only_diff=False, fold=True, live=True)``: the first is the baseline."""

    only_diff = traitlets.Bool(False).tag(sync=True)
    fold = traitlets.Bool(True).tag(sync=True)

    def __init__(self, *refs: Any, store: Store | str | None = None, only_diff: bool = False, fold: bool = True,
                 live: bool = True) -> None:
        names, store = _refs_and_store(refs, store)
        super().__init__(CompareSource(names, store, only_diff=only_diff, fold=fold), only_diff=only_diff, fold=fold)
        self._reopen = reopen_call("Compare", *names, store=store)
        if not self.tick():
            self.send_window()
        if live:
            self.watch(COMPARE_POLL_SECONDS)

    @property
    def result(self) -> Any:
        """The ``Comparison`` shown (``checkpoints.timelines.compare``)."""
        assert isinstance(self.source, CompareSource)
        return self.source.result

"""``ForkPanel(log_or_run)``: pick a step, edit it, click Fork — a new timeline, resumed in the background.

For a DurableAgent run (its CheckpointLog, or its run id) the rows are its steps: prompt, output,
tokens. Edit a step's prompt and click **Fork**: a new run is committed (``CheckpointLog.fork``)
and resumed in a background thread, so the notebook stays free for other cells; the panel shows
its progress, how many steps were reused and the tokens that saved, and a **Stop** button. For
any other run the rows are its waypoints: edit one's state (JSON) and fork with
``caravanserai.fork``; continue the new run with ``%%resumable NEW``. Under the panel: the new
run's live Timeline, or a Compare with the parent.
"""

from __future__ import annotations

import time
from typing import Any

import ipywidgets
import traitlets

from caravanserai.errors import UsageError
from caravanserai.panels.steps import Forked, ForkJob, StepsSource, fork_step
from caravanserai.stores import Store

from .compare import Compare
from .panel import Panel
from .saved import SavedFallback, reopen_call
from .timeline import Timeline

JOB_PUSH_SECONDS = 0.1  # the progress shown in the browser is at most this old


class ForkSteps(Panel):
    """The step list of ``ForkPanel``; ``job`` is the fork in progress (or done) as the browser shows it."""

    job = traitlets.Dict().tag(sync=True)

    def __init__(self, run_or_log: Any, store: Store | str | None = None, *, live: bool = True) -> None:
        super().__init__(StepsSource(run_or_log, store))
        self.owner: ForkPanel | None = None
        if not self.tick():
            self.send_window()
        if live:
            self.watch(1.0)

    def on_fork(self, content: dict) -> None:
        if self.owner is not None:
            step, text = content.get("step"), content.get("text")
            new_run_id = (content.get("new_run_id") or "").strip() or None
            self.owner.fork(step, text, new_run_id)  # type: ignore[arg-type]

    def on_stop(self, content: dict) -> None:
        if self.owner is not None:
            self.owner.stop()

    def on_open(self, content: dict) -> None:
        if self.owner is not None:
            self.owner.open_timeline()

    def on_compare(self, content: dict) -> None:
        if self.owner is not None:
            self.owner.compare()


class ForkPanel(SavedFallback, ipywidgets.VBox):
    """``ForkPanel(log_or_run, store=None, live=True)``; ``fork(step, text)`` does what the Fork button does."""

    def __init__(self, log_or_run: Any, store: Store | str | None = None, *, live: bool = True) -> None:
        self.steps = ForkSteps(log_or_run, store, live=live)
        self.steps.owner = self
        self.forked: Forked | None = None
        self.job: ForkJob | None = None
        self.shown: Timeline | Compare | None = None
        self._live = live
        self._pushed = 0.0
        super().__init__([self.steps])
        self._reopen = reopen_call("ForkPanel", log_or_run, store=store)

    def _saved_summary(self) -> dict:
        return self.steps._saved_summary()

    @property
    def source(self) -> StepsSource:
        assert isinstance(self.steps.source, StepsSource)
        return self.steps.source

    def fork(self, step: int, text: str, new_run_id: str | None = None) -> Forked:
        """Fork at ``step`` (counted from 1) with ``text`` as its prompt (or, for a plain run, its state as JSON).

        A DurableAgent fork is resumed in the background (``wait()`` waits for it). Bad input
        raises the typed error, shows it in the panel, and writes nothing.
        """
        if self.job is not None and self.job.thread.is_alive():
            raise UsageError(f"a fork is still running ({self.job.forked.run_id}): stop it or wait for it first")
        try:
            self.steps.refresh()  # fork from what the store holds now (a damaged log raises here)
            forked = fork_step(self.source, step, text, new_run_id)
        except Exception as exc:
            self.steps.show_error(exc)
            raise
        self.steps.show_error(None)
        self.forked = forked
        if forked.checkpoint is not None:
            self.job = ForkJob(self.source.store, forked, on_change=self._on_job)
            self.steps.job = dict(self.job.status)
            self.job.start()
        else:
            hint = f"continue it: run its cell as %%resumable {forked.run_id} (edit the cell first for a what-if on the code)"
            self.steps.job = {"state": "created", "run": forked.run_id, "parent": forked.parent, "step": step,
                              "reused": forked.reused, "hint": hint}
        self.open_timeline()
        return forked

    def _on_job(self, status: dict) -> None:
        now = time.monotonic()
        if status["state"] != "running" or now - self._pushed >= JOB_PUSH_SECONDS:
            self._pushed = now
            self.steps.job = dict(status)

    def stop(self) -> None:
        """Stop the background resume after the step in progress (what it computed is kept)."""
        if self.job is not None:
            self.job.stop()

    def wait(self, timeout: float | None = None) -> dict:
        """Wait for the background resume to end; its final status."""
        if self.job is not None:
            self.job.thread.join(timeout)
            return dict(self.job.status)
        return dict(self.steps.job)

    def open_timeline(self) -> Timeline:
        """Show the new run's Timeline (live) under the steps."""
        if self.forked is None:
            raise UsageError("fork first: pick a step, edit it and click Fork")
        return self._show(Timeline(self.forked.run_id, self.source.store, live=self._live))

    def compare(self) -> Compare:
        """Show a Compare of the parent and the new run under the steps."""
        if self.forked is None:
            raise UsageError("fork first: pick a step, edit it and click Fork")
        return self._show(Compare(self.forked.parent, self.forked.run_id, store=self.source.store, live=self._live))

    def _show(self, panel: Any) -> Any:
        if self.shown is not None:
            self.shown.close()
        self.shown = panel
        self.children = (self.steps, panel)
        return panel

    def close(self) -> None:
        self.stop()
        self.steps.close()
        if self.shown is not None:
            self.shown.close()
        super().close()

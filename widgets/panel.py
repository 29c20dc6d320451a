"""The base of every panel: an anywidget whose rows stay in the kernel, windowed to the browser.

A panel computes its rows in Python (``_row_count``/``_rows``); the browser draws a virtual list
of ``total`` rows and asks for the window it shows (``view_start``/``view_count``), so what is sent
does not grow with the run. A background watcher (``watch()``) polls for changes and pushes only
what changed; ``close()`` stops it. Errors become the panel's one-line ``error``, never a blank
cell or a JavaScript error. The JavaScript and CSS are files of this package (no CDN).
"""

from __future__ import annotations

import threading
import weakref
from pathlib import Path
from typing import Any

import anywidget
import traitlets

from caravanserai.errors import CaravanseraiError

STATIC = Path(__file__).parent / "static"
POLL_SECONDS = 0.2  # a live panel shows new events within this plus one round trip
WINDOW = 200  # rows sent when the browser has not asked yet


def one_line(error: BaseException) -> str:
    """The panel's error line: the typed error's one-line message, or the exception's first line."""
    message = error.message if isinstance(error, CaravanseraiError) else (str(error).strip().splitlines() or [""])[0]
    return f"{type(error).__name__}: {message}"


class Panel(anywidget.AnyWidget):
    """Shared traits and windowing; subclasses give the rows and the detail of a clicked row."""

    _esm = STATIC / "panels.js"
    _css = STATIC / "panels.css"

    panel = traitlets.Unicode("").tag(sync=True)
    error = traitlets.Unicode("").tag(sync=True)
    summary = traitlets.Dict().tag(sync=True)
    total = traitlets.Int(0).tag(sync=True)
    row_start = traitlets.Int(0).tag(sync=True)
    rows = traitlets.List().tag(sync=True)
    view_start = traitlets.Int(0).tag(sync=True)
    view_count = traitlets.Int(WINDOW).tag(sync=True)
    cursor = traitlets.Int(-1).tag(sync=True)
    detail = traitlets.Dict().tag(sync=True)
    live = traitlets.Bool(False).tag(sync=True)
    follow = traitlets.Bool(True).tag(sync=True)
    start_at_end = traitlets.Bool(False).tag(sync=True)

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._lock = threading.RLock()
        self._stop: threading.Event | None = None
        self.observe(lambda _: self.send_window(), names=["view_start", "view_count"])
        self.observe(self._on_cursor, names=["cursor"])

    # ---- what subclasses give ----------------------------------------------------------------
    def _row_count(self) -> int:
        raise NotImplementedError

    def _rows(self, start: int, stop: int) -> list[dict]:
        raise NotImplementedError

    def _detail(self, index: int) -> dict:
        return {}

    def _poll(self) -> bool:
        """Read what changed since the last poll; True if the rows changed (the watcher then pushes)."""
        return False

    # ---- windowing ---------------------------------------------------------------------------
    def send_window(self) -> None:
        """Send the rows the browser asked for (and the row count); nothing else."""
        with self._lock:
            total = self._row_count()
            start = max(0, min(self.view_start, max(0, total - 1)))
            stop = min(total, start + max(1, self.view_count))
            rows = self._rows(start, stop) if total else []
            with self.hold_sync():
                self.total = total
                self.row_start = start
                self.rows = rows

    def _on_cursor(self, change: dict) -> None:
        try:
            self.detail = self._detail(change["new"]) if change["new"] >= 0 else {}
        except Exception as exc:  # a detail that cannot be shown must not break the panel
            self.detail = {"title": one_line(exc)}

    def show_error(self, error: BaseException | None) -> None:
        self.error = "" if error is None else one_line(error)

    # ---- live --------------------------------------------------------------------------------
    def watch(self, interval: float = POLL_SECONDS) -> None:
        """Poll in a daemon thread until ``close()`` (or until this panel is garbage)."""
        if self._stop is not None:
            return
        self._stop = threading.Event()
        self.live = True
        thread = threading.Thread(target=_watch, args=(weakref.ref(self), self._stop, interval),
                                  name="caravanserai-panel", daemon=True)
        thread.start()
        self._thread = thread

    def unwatch(self) -> None:
        """Stop watching (the panel keeps what it shows)."""
        if self._stop is not None:
            self._stop.set()
            self._stop = None
            self.live = False

    def close(self) -> None:
        """Close the panel: stop its watcher thread and its comm (nothing left behind)."""
        self.unwatch()
        super().close()

    def tick(self) -> bool:
        """One poll: read changes and, when rows changed, push the browser's window; True if changed."""
        with self._lock:
            try:
                changed = self._poll()
            except Exception as exc:
                self.show_error(exc)
                return False
            if changed:
                self.send_window()
            return changed


def _watch(ref: weakref.ref, stop: threading.Event, interval: float) -> None:
    while not stop.wait(interval):
        panel = ref()
        if panel is None or panel.comm is None:
            return  # closed or collected
        panel.tick()
        del panel

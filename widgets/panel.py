"""The base of every panel: an anywidget whose rows stay in the kernel, windowed to the browser.

A panel draws a *source* (``caravanserai.panels``): its rows, computed in Python; the browser
draws a virtual list of ``total`` rows and asks for the window it shows (``view_start``/
``view_count``), so what is sent does not grow with the run. A background watcher (``watch()``)
polls for changes and pushes only what changed while a browser view shows the panel: each view
says when it is drawn and removed (and that it is still there, every 30 s: panels.js), so a
re-run cell or a closed tab leaves no polling thread; ``close()`` stops it for good. Errors become the panel's
one-line ``error``, never a blank cell or a JavaScript error. Buttons send messages
(``{"action": ...}``) handled by ``on_<action>`` methods. ``to_html(path)`` writes the panel into
one self-contained HTML file. The JavaScript and CSS are files of this package (no CDN).
"""

from __future__ import annotations

import threading
import time
import weakref
from pathlib import Path
from typing import Any

import anywidget
import traitlets

from caravanserai.errors import UsageError
from caravanserai.panels.export import panels_module
from caravanserai.panels.source import Source, one_line

from .saved import SavedFallback

STATIC = Path(__file__).parent / "static"
POLL_SECONDS = 0.2  # a live panel shows new events within this plus one round trip
WINDOW = 200  # rows sent when the browser has not asked yet
STALE_SECONDS = 150.0  # no word from any view for this long (a closed tab): stop polling until one speaks


class Panel(SavedFallback, anywidget.AnyWidget):
    """Shared traits and windowing; subclasses give the rows and the detail of a clicked row."""

    _esm = panels_module(STATIC)  # shell.js + panels.js, one module
    _css = STATIC / "panels.css"

    panel = traitlets.Unicode("").tag(sync=True)
    error = traitlets.Unicode("").tag(sync=True)
    summary = traitlets.Dict().tag(sync=True)
    total = traitlets.Int(0).tag(sync=True)
    row_start = traitlets.Int(0).tag(sync=True)
    rows: traitlets.List[dict] = traitlets.List().tag(sync=True)
    view_start = traitlets.Int(0).tag(sync=True)
    view_count = traitlets.Int(WINDOW).tag(sync=True)
    cursor = traitlets.Int(-1).tag(sync=True)
    detail = traitlets.Dict().tag(sync=True)
    live = traitlets.Bool(False).tag(sync=True)
    follow = traitlets.Bool(True).tag(sync=True)
    start_at_end = traitlets.Bool(False).tag(sync=True)
    jump = traitlets.Int(-1).tag(sync=True)  # a row to scroll to and select on first paint
    # this widget's model id: the browser asks its widget manager whether that model still has a
    # kernel behind it (a view drawn from state saved with the notebook has none: shell.js)
    self_id = traitlets.Unicode("").tag(sync=True)

    def __init__(self, source: Source | None = None, **kwargs: Any) -> None:
        super().__init__(**({"panel": source.panel} if source is not None else {}), **kwargs)
        self.source = source
        self._read_error = False
        self._lock = threading.RLock()
        self._stop: threading.Event | None = None
        self._interval = POLL_SECONDS
        self._wanted = False  # watch() was asked for and not undone by unwatch()/close()
        self._views = 0  # browser views drawn now (attach/detach messages)
        self._viewed = False  # a view has attached at least once: from then on, polling follows the views
        self._heard = time.monotonic()
        self.observe(lambda _: self.send_window(), names=["view_start", "view_count"])
        self.observe(self._on_cursor, names=["cursor"])
        if source is not None and source.options:
            self.observe(self._on_option, names=list(source.options))
        self.on_msg(self._on_message)
        self.self_id = self.model_id or ""

    def _saved_summary(self) -> dict:
        return dict(self.summary or {})

    # ---- what a source (or a subclass) gives ---------------------------------------------------
    def _row_count(self) -> int:
        assert self.source is not None
        return self.source.count()

    def _rows(self, start: int, stop: int) -> list[dict]:
        assert self.source is not None
        return self.source.rows(start, stop)

    def _detail(self, index: int) -> dict:
        return self.source.detail(index) if self.source is not None else {}

    def _poll(self) -> bool:
        """Read what changed since the last poll; True if the rows changed (the watcher then pushes)."""
        if self.source is None or not self.source.poll():
            return False
        self._sync()
        self.show_error(None, reading=True)
        return True

    def _sync(self) -> None:
        """Copy the source's summary and traits to the browser."""
        assert self.source is not None
        with self.hold_sync():
            self.summary = self.source.summary()
            for name, value in self.source.traits().items():
                setattr(self, name, value)

    def _on_option(self, change: Any) -> None:
        assert self.source is not None
        with self._lock:
            self.source.set_option(change["name"], change["new"])
            self.cursor = -1
            self._sync()
            self.send_window()

    def _on_message(self, _widget: Any, content: Any, _buffers: Any) -> None:
        """A button in the browser: ``{"action": NAME, ...}`` calls ``on_NAME(content)``; errors go to the error line."""
        action = content.get("action") if isinstance(content, dict) else None
        handler = getattr(self, f"on_{action}", None) if isinstance(action, str) and action.isidentifier() else None
        if handler is None:
            return
        try:
            handler(content)
        except Exception as exc:  # a click must never leave a traceback in the log instead of an answer
            self.show_error(exc)

    def to_html(self, path: str, title: str | None = None) -> str:
        """Write this panel (read-only, data embedded, JS and CSS inlined, no network) to ``path``; returns it."""
        from caravanserai.panels.export import write_html

        if self.source is None:
            raise UsageError(f"{type(self).__name__} cannot be exported; Timeline, Lineage and Compare can")
        with self._lock:
            return write_html(path, [self.source], title=title)

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

    def show_error(self, error: BaseException | None, *, reading: bool = False) -> None:
        """Show ``error`` as the one-line error (None clears it). An error from reading the store
        (``reading``) clears when a later read succeeds; one from a click stays until the next click."""
        if error is None and reading and not self._read_error:
            return
        self.error = "" if error is None else one_line(error)
        self._read_error = reading and error is not None

    # ---- live --------------------------------------------------------------------------------
    def watch(self, interval: float = POLL_SECONDS) -> None:
        """Poll in a daemon thread while a view shows the panel, until ``close()`` or ``unwatch()``."""
        self._wanted, self._interval = True, interval
        self._start_watcher()

    def unwatch(self) -> None:
        """Stop watching (the panel keeps what it shows)."""
        self._wanted = False
        self._stop_watcher()

    def _start_watcher(self) -> None:
        if self._stop is not None or not self._wanted:
            return
        self._stop = threading.Event()
        self.live = True
        thread = threading.Thread(target=_watch, args=(weakref.ref(self), self._stop, self._interval),
                                  name="caravanserai-panel", daemon=True)
        thread.start()
        self._thread = thread

    def _stop_watcher(self) -> None:
        if self._stop is not None:
            self._stop.set()
            self._stop = None
            self.live = False

    def _seen(self) -> bool:
        """Whether polling is worth it: no view has ever attached (Python-only use), or one is there now."""
        return not self._viewed or (self._views > 0 and time.monotonic() - self._heard < STALE_SECONDS)

    # messages each browser view sends (panels.js): drawn, removed, still there
    def on_attach(self, _content: dict) -> None:
        with self._lock:
            self._views += 1
            self._viewed, self._heard = True, time.monotonic()
            self._start_watcher()
        self.tick()  # what changed while nobody watched

    def on_detach(self, _content: dict) -> None:
        with self._lock:
            self._views = max(0, self._views - 1)
            if not self._seen():
                self._stop_watcher()

    def on_alive(self, _content: dict) -> None:
        with self._lock:
            self._heard = time.monotonic()
            resumed = self._stop is None and self._wanted
            self._start_watcher()
        if resumed:
            self.tick()

    def close(self) -> None:
        """Close the panel: stop its watcher thread and its comm (nothing left behind)."""
        self.unwatch()
        super().close()

    def refresh(self) -> None:
        """Read changes now and push them; unlike ``tick`` it raises what reading raises."""
        with self._lock:
            if self._poll():
                self.send_window()

    def tick(self) -> bool:
        """One poll: read changes and, when rows changed, push the browser's window; True if changed."""
        with self._lock:
            try:
                changed = self._poll()
            except Exception as exc:
                self.show_error(exc, reading=True)
                return False
            if changed:
                self.send_window()
            return changed


def _watch(ref: weakref.ref, stop: threading.Event, interval: float) -> None:
    while not stop.wait(interval):
        panel = ref()
        if panel is None or panel.comm is None:
            return  # closed or collected
        with panel._lock:
            if not panel._seen() and panel._stop is stop:
                panel._stop_watcher()  # no view left: on_attach/on_alive start a new watcher
                return
        panel.tick()
        del panel

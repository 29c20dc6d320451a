"""A one-line progress display for loops: done/total, rate, ETA, and where a resume started."""

from __future__ import annotations

import sys
import time
from typing import TextIO


class ProgressLine:
    """Rewrites one stderr line (``\\r``) at most every ``interval`` seconds; a newline at close."""

    def __init__(self, label: str, total: int | None, *, resumed_at: int = 0, stream: TextIO | None = None,
                 interval: float = 0.2) -> None:
        self.label = label
        self.total = total
        self.resumed_at = resumed_at
        self.stream = stream or sys.stderr
        self.interval = interval
        self.started = time.monotonic()
        self.shown_at = 0.0
        self.done = resumed_at
        self.width = 0

    def update(self, done: int, *, force: bool = False) -> None:
        self.done = done
        now = time.monotonic()
        if force or now - self.shown_at >= self.interval:
            self.shown_at = now
            self._write(self.render(now))

    def render(self, now: float | None = None) -> str:
        now = time.monotonic() if now is None else now
        fresh = self.done - self.resumed_at
        elapsed = max(now - self.started, 1e-9)
        rate = fresh / elapsed
        total = "?" if self.total is None else str(self.total)
        text = f"[{self.label}] {self.done}/{total}"
        if self.resumed_at:
            text += f" (resumed at {self.resumed_at})"
        text += f" {rate:,.1f} items/s"
        if self.total is not None and rate > 0 and self.done < self.total:
            text += f" ETA {_duration((self.total - self.done) / rate)}"
        return text

    def close(self) -> None:
        self._write(self.render())
        self.stream.write("\n")
        self.stream.flush()

    def _write(self, text: str) -> None:
        pad = max(self.width - len(text), 0)
        self.width = len(text)
        self.stream.write("\r" + text + " " * pad)
        self.stream.flush()


def _duration(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.0f}s"
    if seconds < 3600:
        return f"{seconds // 60:.0f}m{seconds % 60:02.0f}s"
    return f"{seconds // 3600:.0f}h{seconds % 3600 // 60:02.0f}m"

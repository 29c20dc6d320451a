"""The journal service's replay cache: answers to mutating requests by ``Idempotency-Key``.

A client that lost a response retries with the same key; the service answers the retry with the
recorded answer instead of applying it twice (an append, a created object). A retry that arrives
while the first request still runs waits for its answer.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict

REPLAY_SECONDS = 600.0
REPLAY_ENTRIES = 10_000
REPLAY_MAX_BODY = 4096  # mutating answers are tiny; at most ~40 MB of memory


class Replay:
    """Answers to mutating requests by Idempotency-Key, so a client's retry is applied once."""

    def __init__(self, seconds: float = REPLAY_SECONDS, entries: int = REPLAY_ENTRIES) -> None:
        self.seconds, self.entries = seconds, entries
        self._lock = threading.Lock()
        self._done: OrderedDict[tuple, tuple[float, int, bytes, str]] = OrderedDict()
        self._running: dict[tuple, threading.Event] = {}

    def begin(self, key: tuple) -> tuple[int, bytes, str] | None:
        """The recorded answer for ``key``, or None once the caller owns ``key`` (call ``finish``)."""
        while True:
            found = self.try_begin(key)
            if found is not False:
                return found  # type: ignore[return-value]  # a recorded answer, or None: ours now
            with self._lock:
                running = self._running.get(key)
            if running is not None:
                running.wait(30)  # the same request still running: wait for its answer

    def try_begin(self, key: tuple) -> tuple[int, bytes, str] | None | bool:
        """``begin`` that never waits: the answer, None once the caller owns ``key``, False while it still runs."""
        with self._lock:
            now = time.monotonic()
            while self._done and next(iter(self._done.values()))[0] < now:
                self._done.popitem(last=False)
            if key in self._done:
                return self._done[key][1:]
            if key in self._running:
                return False
            self._running[key] = threading.Event()
            return None

    def finish(self, key: tuple, answer: tuple[int, bytes, str] | None) -> None:
        with self._lock:
            if answer is not None:
                self._done[key] = (time.monotonic() + self.seconds, *answer)
                while len(self._done) > self.entries:
                    self._done.popitem(last=False)
            event = self._running.pop(key, None)
        if event is not None:
            event.set()

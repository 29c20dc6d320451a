"""Ctrl-C held back while a journal append and the writer's record of it happen together.

Kernel > Interrupt and Ctrl-C raise ``KeyboardInterrupt`` in the main thread between any two
bytecodes. Landing after the store wrote a line but before the writer (and the lease) counted it,
the next append (the ``interrupted`` record itself) would reuse that line's ``seq``: a journal that
no longer verifies. Inside ``interrupts_deferred()`` a SIGINT is only noted; it is delivered, to the
handler that was in place, as soon as the block ends — the append is then whole on disk and in
memory. A second Ctrl-C while the block still runs (a store that hangs) interrupts at once, as the
person pressing it wants. Elsewhere than the main thread (where no signal handler runs) it does nothing.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

__all__ = ["interrupts_deferred"]


@contextmanager
def interrupts_deferred() -> Iterator[None]:
    """Run the block with SIGINT noted, not raised; deliver it to the previous handler afterwards."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.getsignal(signal.SIGINT)
    if not callable(previous):  # SIG_IGN (nothing to defer), SIG_DFL (the process ends: as a kill -9), None
        yield
        return
    caught: list[tuple[int, Any]] = []

    def note(signum: int, frame: Any) -> None:
        caught.append((signum, frame))
        signal.signal(signal.SIGINT, previous)  # a second Ctrl-C (a store I/O that hangs) interrupts at once

    signal.signal(signal.SIGINT, note)
    try:
        yield
    except BaseException:
        signal.signal(signal.SIGINT, previous)
        raise
    signal.signal(signal.SIGINT, previous)
    if caught:
        previous(*caught[0])

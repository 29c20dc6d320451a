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

import _signal  # signal.signal's C function: the Python wrapper's enum conversions cost more than the swap
import threading
from types import TracebackType
from typing import Any

__all__ = ["interrupts_deferred"]

_MAIN = threading.main_thread().ident
_SIGINT = int(_signal.SIGINT)
_swap = _signal.signal
_get_ident = threading.get_ident


class interrupts_deferred:  # noqa: N801 - used as a context manager, like contextlib's
    """``with interrupts_deferred():`` runs the block with SIGINT noted, not raised, and delivers it to the
    previous handler afterwards (a class, not a generator: it is on the path of every journal append)."""

    __slots__ = ("caught", "previous")

    def __enter__(self) -> interrupts_deferred:
        self.caught: tuple[int, Any] | None = None
        self.previous: Any = _swap(_SIGINT, self._note) if _get_ident() == _MAIN else None  # handlers run only there
        return self

    def _note(self, signum: int, frame: Any) -> None:
        self.caught = (signum, frame)
        _swap(_SIGINT, self.previous)  # a second Ctrl-C (a store I/O that hangs) interrupts at once

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None) -> None:
        previous = self.previous
        if previous is None:
            return
        _swap(_SIGINT, previous)
        if self.caught is not None and kind is None:
            if callable(previous):
                previous(*self.caught)
            elif previous == _signal.SIG_DFL:  # no Python handler: the default action, now
                _signal.raise_signal(_SIGINT)

"""Which run journals the model requests made in this context, and where the transport journal is paused.

Kept apart from ``http_journal`` so that ``journaled.model_call`` (which journals a call itself)
can pause the transport journal around its own request without importing the transport hooks.
"""

from __future__ import annotations

import contextvars
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

__all__ = ["paused"]

RUN: contextvars.ContextVar[Any] = contextvars.ContextVar("caravanserai_http_run", default=None)
PAUSED: contextvars.ContextVar[bool] = contextvars.ContextVar("caravanserai_http_paused", default=False)


@contextmanager
def paused() -> Iterator[None]:
    """Model requests inside this block go out unjournaled by the transport (paid again on every resume)."""
    token = PAUSED.set(True)
    try:
        yield
    finally:
        PAUSED.reset(token)

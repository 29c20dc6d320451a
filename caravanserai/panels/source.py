"""``Source``: the contract between what a panel shows (computed here) and who draws it (a widget, an HTML export)."""

from __future__ import annotations

import json
from typing import Any, ClassVar

from ..errors import CaravanseraiError

__all__ = ["DETAIL_LIMIT", "Source", "one_line", "pretty"]

DETAIL_LIMIT = 200_000  # characters of an event or state shown in a detail pane


def one_line(error: BaseException) -> str:
    """A panel's error line: the typed error's one-line message, or the exception's first line."""
    message = error.message if isinstance(error, CaravanseraiError) else (str(error).strip().splitlines() or [""])[0]
    return f"{type(error).__name__}: {message}"


def pretty(value: Any) -> str:
    """``value`` as indented JSON for a detail pane (cut at ``DETAIL_LIMIT`` characters)."""
    text = json.dumps(value, indent=2, ensure_ascii=False, default=repr)
    return text if len(text) <= DETAIL_LIMIT else text[:DETAIL_LIMIT] + f"\n... ({len(text):,} characters in all)"


class Source:
    """Rows of one panel. ``poll()`` reads changes (True when rows changed); ``rows(start, stop)``
    builds only the window asked for; ``options`` are the switches a reader may flip (an export
    precomputes every combination)."""

    panel: ClassVar[str] = ""
    options: ClassVar[dict[str, tuple]] = {}

    def poll(self) -> bool:
        return False

    def count(self) -> int:
        raise NotImplementedError

    def rows(self, start: int, stop: int) -> list[dict]:
        raise NotImplementedError

    def detail(self, index: int) -> dict:
        return {}

    def summary(self) -> dict:
        return {}

    def traits(self) -> dict:
        """Other values the panel's browser side reads (a row to jump to, tree nodes...)."""
        return {}

    def option(self, name: str) -> Any:
        return getattr(self, name)

    def set_option(self, name: str, value: Any) -> None:
        """Flip one of ``options`` (rows are rebuilt on the next ``rows`` call)."""
        if name not in self.options:
            raise KeyError(name)
        setattr(self, name, value)
        self.rebuild()

    def rebuild(self) -> None:
        """Recompute the rows from what was read (after an option changed)."""

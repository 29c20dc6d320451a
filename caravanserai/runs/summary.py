"""Reading a journal without resuming it: ``run_summary`` and ``input_is_replayable``.

Both only read and return, so a status endpoint or a recovery sweep can call them freely.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import Any

from ..errors import JournalCorruptionError
from .view import RunView

__all__ = ["input_is_replayable", "journal_input", "run_summary"]

_TEXT_PARTS = ("text", "input_text")


def journal_input(value: Any) -> Any:
    """The form of a run's input kept in the journal: text as is, other parts as their digest.

    A multimodal input (images, audio, files) journals ``{"type": ..., "sha256": ...}`` instead
    of the content, so resuming such a run needs the caller's original input.
    """
    from ..journal import digest

    if isinstance(value, list):
        return [journal_input(item) for item in value]
    if isinstance(value, dict):
        if value.get("type") not in (None, *_TEXT_PARTS) and "sha256" not in value:
            return {"type": value.get("type"), "sha256": digest(value)}
        return {k: journal_input(v) for k, v in value.items()}
    return value


def input_is_replayable(value: Any) -> bool:
    """True when the journaled input is the whole input (no part kept only as a digest)."""
    if isinstance(value, list):
        return all(input_is_replayable(item) for item in value)
    if isinstance(value, dict):
        if "sha256" in value and value.get("type") not in _TEXT_PARTS:
            return False
        return all(input_is_replayable(v) for v in value.values())
    return True


def _events(lines: Iterable[Any]) -> list[dict]:
    events: list[dict] = []
    for line in lines:
        event = json.loads(line) if isinstance(line, (str, bytes)) else line
        if not isinstance(event, dict) or "type" not in event:
            raise JournalCorruptionError(f"journal line {len(events) + 1} is not an event", line=len(events) + 1)
        events.append(event)
    return events


def run_summary(lines: Sequence[Any]) -> dict[str, Any]:
    """Classify a journal (lines or events) as ``missing``, ``pending``, ``completed`` or ``failed``.

    The whole journal is searched, not only its tail: a run that completed reads as completed
    whatever was appended after it. ``pending`` carries run_id, agent_id, input, started_at and
    attempts; ``completed`` the result; ``failed`` code, message and receipt. The rules live in
    the read model (``caravanserai.runs.view``), the one place that reads a journal for people.
    """
    events = _events(lines)
    if not events:
        return {"status": "missing"}
    return dict(RunView.from_events(events[0].get("run_id", ""), events).summary)

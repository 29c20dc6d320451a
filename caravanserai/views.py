"""Human-readable views of a journal, in caravanserai 0.2.0's byte format.

A run directory keeps ``waypoint-N.md``, ``state.json``, ``latest`` and ``meta.json`` so people,
other agents and 0.2.0 itself can read it. They are *rendered from* the journal, never read
back by this package when a journal exists: the journal is the source of truth.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from .journal import RawJSON

# Above this size state.json is written compactly, reusing the journal's encoding, so a large
# state is not pretty-printed again on every checkpoint.
PRETTY_STATE_LIMIT = 256 * 1024


def waypoint_markdown(n: int, at: str, note: str) -> str:
    """``# Waypoint N - <ts>``, a blank line, the note verbatim, one newline (0.2.0's format)."""
    stamp = datetime.fromisoformat(at).isoformat(timespec="seconds")
    return f"# Waypoint {n} - {stamp}\n\n{note}\n"


def state_text(state: Any) -> str:
    """``state.json`` as 0.2.0 wrote it (``json.dumps(state, indent=2)``); a large state already
    encoded (``RawJSON``) is written as that compact text instead of being encoded again."""
    if isinstance(state, RawJSON):
        if len(state.text) > PRETTY_STATE_LIMIT:
            return state.text
        state = state.value
    return json.dumps(state, indent=2)


def meta_text(started: dict[str, Any]) -> str:
    """``meta.json``: 0.2.0's ``command`` plus where and how the run was launched."""
    meta = {
        "command": started.get("command") or [],
        "cwd": started.get("cwd"),
        "orig_argv": started.get("orig_argv"),
        "journal": "journal.jsonl",
    }
    return json.dumps(meta, indent=2)

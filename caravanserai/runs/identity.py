"""Identity before spend: a resume must be the same run, or it stops before spending anything.

The run id is the idempotency key: the same id always means the same logical run. When a run
is resumed, the identity it started with (agent, definition digest, input, budget digest,
session, conversation digest) is compared with the caller's; a difference raises the matching
``IdentityMismatch`` subclass and nothing is appended. A new task needs a new id.
"""

from __future__ import annotations

from typing import Any

from ..errors import (
    AgentMismatch,
    BudgetChanged,
    ConversationMismatch,
    DefinitionChanged,
    IdentityMismatch,
    InputMismatch,
    SessionMismatch,
)

# (field in run_started, error, what a person calls it)
FIELDS: tuple[tuple[str, type[IdentityMismatch], str], ...] = (
    ("agent_id", AgentMismatch, "agent"),
    ("definition_sha256", DefinitionChanged, "definition digest"),
    ("input", InputMismatch, "input"),
    ("budget_sha256", BudgetChanged, "budget digest"),
    ("session_id", SessionMismatch, "session"),
    ("conversation_sha256", ConversationMismatch, "conversation digest"),
)


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def check_identity(run_id: str, started: dict | None, expected: dict[str, Any]) -> None:
    """Raise the first mismatch between ``started`` (the run's first event) and ``expected``."""
    if started is None:
        return
    for field, error, what in FIELDS:
        if field not in expected:
            continue
        have, want = started.get(field), expected[field]
        if have != want:
            raise error(
                f"run {run_id!r} was started with {what} {_short(have)}, not {_short(want)}: a resume must be the same run, "
                "so nothing was spent or written; use a new run id for a new task",
                run_id=run_id, field=field,
            )

"""Run ids: the idempotency key of a run, checked before anything is written."""

from __future__ import annotations

import re

from .errors import InvalidRunId

RUN_ID_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")

_REMEDY = "use 1-128 characters from A-Z a-z 0-9 . _ - starting with a letter or digit"


def validate_run_id(run_id: object) -> str:
    """Return ``run_id`` if it matches ``[A-Za-z0-9][A-Za-z0-9._-]{0,127}``, else raise InvalidRunId."""
    if not isinstance(run_id, str):
        raise InvalidRunId(
            f"run id must be a str, got {type(run_id).__name__} {run_id!r}: {_REMEDY}",
            run_id=repr(run_id),
        )
    if RUN_ID_PATTERN.fullmatch(run_id) is None:
        shown = run_id if len(run_id) <= 40 else run_id[:37] + "..."
        raise InvalidRunId(f"invalid run id {shown!r}: {_REMEDY}", run_id=run_id)
    return run_id


def is_legacy_readable(name: str) -> bool:
    """True for directory names 0.2.0 accepted as run ids; we read them but never create them."""
    return bool(name) and name not in (".", "..") and "/" not in name and "\\" not in name and "\x00" not in name

"""Run ids: the idempotency key of a run, checked before anything is written.

One rule, checked by ``validate_run_id`` wherever a run id enters the library (the public API,
every store's journal face, the HTTP client and the journal service):

- ``[A-Za-z0-9][A-Za-z0-9._-]{0,127}``: safe as one path segment, URL segment and SQL value;
- and not a name Windows reserves (``CON``, ``PRN``, ``AUX``, ``NUL``, ``COM1``-``COM9``,
  ``LPT1``-``LPT9``, any case, with or without an extension such as ``nul.txt``) nor one ending
  in ``.`` (Windows drops it), so a run directory can be copied to any operating system.

Read-only faces also accept a name 0.2.0 accepted (``is_legacy_readable``) when the store says an
existing 0.2.0 directory has that name (``Store.is_legacy_name``); nothing is ever written
under such a name.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable

from .errors import InvalidRunId

__all__ = ["RUN_ID_PATTERN", "is_legacy_readable", "validate_run_id"]

RUN_ID_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
_WINDOWS_RESERVED = re.compile(r"(?:CON|PRN|AUX|NUL|COM[1-9]|LPT[1-9])(?:\..*)?", re.IGNORECASE)
_LEGACY_MAX_BYTES = 255  # NAME_MAX: a longer name cannot be a directory 0.2.0 wrote

_REMEDY = "use 1-128 characters from A-Z a-z 0-9 . _ - starting with a letter or digit"


def _shown(run_id: str) -> str:
    return repr(run_id if len(run_id) <= 40 else run_id[:37] + "...")


_VALID: set[str] = set()  # ids found valid (validity depends on the text alone)


def validate_run_id(run_id: object, *, legacy: Callable[[str], bool] | None = None) -> str:
    """Return ``run_id`` if it is a valid run id, else raise InvalidRunId (one line, nothing written).

    ``legacy`` (read-only callers only) is a predicate naming existing 0.2.0 directories whose
    names this rule rejects but that stay readable, e.g. ``store.is_legacy_name``.
    """
    if type(run_id) is str and run_id in _VALID:  # the ids a process uses again and again (every append's hooks)
        return run_id
    if not isinstance(run_id, str):
        raise InvalidRunId(
            f"run id must be a str, got {type(run_id).__name__} {repr(run_id)[:60]}: {_REMEDY}",
            run_id=repr(run_id),
        )
    if RUN_ID_PATTERN.fullmatch(run_id) is not None:
        if _WINDOWS_RESERVED.fullmatch(run_id) is not None:
            problem = (f"invalid run id {_shown(run_id)}: {run_id.split('.', 1)[0].upper()} is a device name on "
                       "Windows (CON, PRN, AUX, NUL, COM1-9, LPT1-9, with or without an extension); choose another name")
        elif run_id.endswith("."):
            problem = f"invalid run id {_shown(run_id)}: it ends with '.', which Windows drops from names; remove the dot"
        else:
            if type(run_id) is str:  # a subclass's str() or == could name other text than was checked
                if len(_VALID) >= 4096:  # bounded: a process that lists many runs keeps only the latest few thousand
                    _VALID.clear()
                _VALID.add(run_id)
            return run_id
    else:
        problem = f"invalid run id {_shown(run_id)}: {_REMEDY}"
    if legacy is not None and is_legacy_readable(run_id) and legacy(run_id):
        return run_id
    raise InvalidRunId(problem, run_id=run_id)


def is_legacy_readable(name: str) -> bool:
    """True for directory names 0.2.0 accepted as run ids; we read them but never create them.

    One path segment the file system can name: not empty, ``.`` or ``..``, no ``/``, ``\\`` or
    NUL, encodable, at most 255 bytes (so probing it never raises ENAMETOOLONG).
    """
    if not isinstance(name, str) or not name or name in (".", "..") or "/" in name or "\\" in name or "\x00" in name:
        return False
    try:
        return len(os.fsencode(name)) <= _LEGACY_MAX_BYTES
    except UnicodeError:
        return False

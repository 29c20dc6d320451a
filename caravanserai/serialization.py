"""State must be JSON: encode it strictly, and say exactly which value is not and what to do.

Accepted: dict (str keys), list, tuple (stored as a list, as JSON has only arrays), str, int,
finite float, bool, None. Refused with ``SerializationError`` before anything is written: sets,
bytes, objects, NaN/Infinity (not JSON; 0.2.0 wrote them as invalid tokens), non-str keys
(0.2.0 silently turned ``{1: "a"}`` into ``{"1": "a"}``) and circular references.
"""

from __future__ import annotations

import math
from typing import Any

from .errors import SerializationError
from .journal import check_text, dumps


def to_json(state: Any, *, what: str = "state") -> str:
    """Compact JSON text for ``state``, or SerializationError naming the offending path."""
    try:
        text = dumps(state)
    except (TypeError, ValueError, RecursionError) as exc:
        raise _explain(state, what, exc) from None
    if _has_non_str_key(state):
        raise _explain(state, what, None)
    check_text(text, what)
    return text


_CONTAINERS = (dict, list, tuple)


def _has_non_str_key(value: Any) -> bool:
    # json.dumps silently turns {1: "a"} into {"1": "a"}; find such keys (iteratively: cheap per MB).
    stack = [value]
    pop, push = stack.pop, stack.append
    while stack:
        node = pop()
        if isinstance(node, dict):
            for key, item in node.items():
                if not isinstance(key, str):
                    return True
                if isinstance(item, _CONTAINERS):
                    push(item)
        elif isinstance(node, _CONTAINERS):
            for item in node:
                if isinstance(item, _CONTAINERS):
                    push(item)
    return False


def _explain(state: Any, what: str, exc: BaseException | None) -> SerializationError:
    try:
        found = _find_problem(state, what, set())
    except RecursionError:
        found = (what, "is nested too deeply to encode (hundreds of levels)")
    if found is None:
        path, problem = what, f"cannot be encoded as JSON ({exc})"
    else:
        path, problem = found
    return SerializationError(
        f"{path} {problem}; checkpoint state must be JSON (dict with str keys, list, str, int, float, bool, None): "
        "convert it (e.g. list(a_set), str(obj), None for NaN) before checkpointing - nothing was written",
        path=path,
    )


def _find_problem(value: Any, path: str, seen: set[int]) -> tuple[str, str] | None:
    if value is None or isinstance(value, (str, bool, int)):
        return None
    if isinstance(value, float):
        return None if math.isfinite(value) else (path, f"is {value!r}, which JSON cannot represent")
    if isinstance(value, (dict, list, tuple)):
        if id(value) in seen:
            return (path, "refers back to itself (a circular reference)")
        seen = seen | {id(value)}
        items = value.items() if isinstance(value, dict) else enumerate(value)
        for key, item in items:
            if isinstance(value, dict) and not isinstance(key, str):
                return (f"{path}[{key!r}]", f"has a {type(key).__name__} key; JSON keys are strings (use str(key))")
            found = _find_problem(item, f"{path}[{key!r}]", seen)
            if found:
                return found
        return None
    return (path, f"is a {type(value).__module__}.{type(value).__qualname__}, which is not JSON")

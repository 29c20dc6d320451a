"""Settling a tool call by hand: ``caravanserai settle RUN CALL_ID --result JSON`` and ``settle()``."""

from __future__ import annotations

from typing import Any

from ..errors import NoSuchCall
from ..ids import validate_run_id
from ..journal import RawJSON, to_json
from ..stores import open_store
from .lifecycle import registry

__all__ = ["settle"]


def settle(run_id: str, call_id: str, result: Any = None, *, error: str | None = None, store: Any = None) -> dict:
    """Record by hand the outcome of a tool call whose effect is uncertain (``ToolEffectUncertain``).

    Check what the tool really did, then settle it with its ``result`` (JSON) or ``error`` text;
    the next attempt of the run gets that outcome instead of stopping. Returns the event.
    """
    run_id = validate_run_id(run_id)
    resolved = open_store(store)
    owner = registry.get(run_id, resolved) is None
    run = registry.open(run_id, resolved, attempt=False)  # settling by hand is not an attempt of the run
    try:
        intent = run.ledger.unsettled_intents.get(call_id)
        if intent is None:
            known = ", ".join(sorted(run.ledger.unsettled_intents)) or "none"
            raise NoSuchCall(f"run {run_id!r} has no unsettled tool call {call_id!r} (unsettled: {known})",
                             run_id=run_id, call_id=call_id)
        event: dict[str, Any] = {"type": "tool_settled", "path": intent["path"], "tool": intent["tool"], "call_id": call_id,
                                 "settled_by": "hand"}
        if error is not None:
            event["error"] = str(error)
        else:
            event["result"] = RawJSON(to_json(result, what="result"), result)
        stored = run.append(event)[0]
        run.ledger.unsettled_intents.pop(call_id, None)
        return stored
    finally:
        if owner:
            run.close()

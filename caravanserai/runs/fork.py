"""``fork(run_id, at=N)``: a new run that starts where another stood at waypoint N — time travel for any run.

The child's journal is the parent's history up to waypoint N (its waypoints, loop progress, saved
notebook variables, journaled calls), plus the calls the parent had already settled for the next
step (so re-running that step with the same inputs replays them from the journal, free), then a
``forked`` event naming the parent and the point. Its ``run_started`` carries
``forked_from = {run_id, seq, waypoint}``. The parent is only read, never modified; a fork of a fork
works the same way. ``state=`` replaces waypoint N's state in the child (an edited what-if).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..calls.ledger import BOUNDARIES, CALL_EVENTS
from ..errors import NoSuchWaypoint, RunExists
from ..ids import validate_run_id
from ..journal import RESERVED_FIELDS, RawJSON, to_json
from ..stores import Store, open_store
from .api import readable_run_id
from .lifecycle import registry, require_events

__all__ = ["fork", "fork_point"]

_UNSET: Any = object()
IDENTITY_FIELDS = ("agent_id", "definition_sha256", "input", "budget_sha256", "session_id", "conversation_sha256",
                   "cell_source")


def fork_point(events: Sequence[dict], at: int | None) -> int:
    """Index of waypoint ``at`` in ``events`` (its last occurrence: numbering restarts after --restart);
    ``at=None``: the last waypoint with a state. NoSuchWaypoint when there is none."""
    candidates = [i for i, e in enumerate(events) if e["type"] == "waypoint" and (at is None and "state" in e or
                                                                                  at is not None and e.get("n") == at)]
    if not candidates:
        run_id = events[0].get("run_id") if events else "?"
        numbers = sorted({e["n"] for e in events if e["type"] == "waypoint" and isinstance(e.get("n"), int)})
        shown = f"{numbers[0]}..{numbers[-1]}" if numbers else "none"
        what = "has no waypoint with a state" if at is None else f"has no waypoint {at}"
        raise NoSuchWaypoint(f"run {run_id!r} {what} (its waypoints: {shown}); pick one with `caravanserai show RUN --all`",
                             run_id=run_id, at=at)
    return candidates[-1]


def fork(run_id: str, at: int | None = None, new_run_id: str | None = None, store: Store | str | None = None, *,
         state: Any = _UNSET, started: dict | None = None) -> str:
    """Create a new run from waypoint ``at`` of ``run_id`` (default: its last one); returns the new id.

    ``new_run_id`` defaults to ``<run_id>-fork-<at>`` (``-2``, ``-3``... if taken); an existing id
    raises RunExists and nothing is written. ``state`` replaces that waypoint's state in the child
    (JSON; checked before anything is written). ``started`` adds identity fields to the child's
    ``run_started`` (a notebook cell forks under its own source).
    """
    resolved = open_store(store)
    run_id = readable_run_id(run_id, resolved)
    events = require_events(run_id, resolved)
    cut = fork_point(events, at)
    point = events[cut]
    edited = None if state is _UNSET else RawJSON(to_json(state), state)  # refused before anything is written
    child = _child_id(resolved, run_id, point.get("n"), new_run_id)
    identity = {k: v for k, v in events[0].items() if k in IDENTITY_FIELDS or k == "denomination"}
    header = {**identity, **(started or {}),
              "forked_from": {"run_id": run_id, "seq": point["seq"], "waypoint": point.get("n")}}
    copied = [_body(e) for e in events[1:cut + 1]] + [_body(e) for e in _pending_calls(events, cut)]
    if edited is not None:
        copied[cut - 1] = {**copied[cut - 1], "state": edited,
                           "note": f"{point.get('note', '')} (state edited in this fork)"}
    marker = {"type": "forked", "parent_run": run_id, "at_waypoint": point.get("n"), "parent_seq": point["seq"],
              "edited": edited is not None, **{k: v for k, v in (started or {}).items() if k in IDENTITY_FIELDS}}
    _copy_values(resolved, run_id, child, copied)
    run = registry.open(child, resolved, attempt=False, started=header)
    try:
        run.append(*copied, marker)
    finally:
        run.close()
    return child


def _body(event: dict) -> dict:
    """An event without its envelope (``seq``/``prev`` are renumbered in the child; ``at`` is kept)."""
    return {k: v for k, v in event.items() if k not in RESERVED_FIELDS or k in ("type", "at")}


def _pending_calls(events: Sequence[dict], cut: int) -> list[dict]:
    """The parent's journaled calls after the fork point, up to its next boundary: they replay in the child."""
    out = []
    for event in events[cut + 1:]:
        if event["type"] in BOUNDARIES or event["type"] in ("run_completed", "run_failed", "restarted"):
            break
        if event["type"] in CALL_EVENTS:
            out.append(event)
    return out


def _child_id(store: Store, run_id: str, n: Any, wanted: str | None) -> str:
    if wanted is not None:
        validate_run_id(wanted)
        if store.load(wanted):
            raise RunExists(f"run {wanted!r} already exists in {store.url}: fork into a new run id (nothing was written)",
                            run_id=wanted)
        return wanted
    base = f"{run_id}-fork-{n}"[:120]
    candidate, k = base, 1
    while store.load(candidate):
        k += 1
        candidate = f"{base}-{k}"
    return validate_run_id(candidate)


def _copy_values(store: Store, parent: str, child: str, events: list[dict]) -> None:
    """Saved notebook values larger than the inline limit live under the run's key: copy them (write-once)."""
    for event in events:
        names = event.get("names")
        values = names.get("values") if isinstance(names, dict) else None
        for entry in (values or {}).values():
            if isinstance(entry, dict) and isinstance(entry.get("object"), str):
                payload = store.objects.get(f"values/{parent}/{entry['object']}")
                store.objects.put_if_absent(f"values/{child}/{entry['object']}", payload)

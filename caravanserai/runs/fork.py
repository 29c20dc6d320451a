"""``fork(run_id, at=N)``: a new run that starts where another stood at waypoint N — time travel for any run.

The child's journal is the parent's history up to waypoint N (its waypoints, loop progress, saved
notebook variables, journaled calls), plus the calls the parent had already settled for the next
step (so re-running that step with the same inputs replays them from the journal, free), then a
``forked`` event naming the parent and the point. Its ``run_started`` carries
``forked_from = {run_id, seq, waypoint, started_at}`` and the parent's identity; the ``forked``
event carries the child's own (a notebook cell's new source) and, where the code changed, the
diff. That copied prefix is the parent's work: the child's own attempts count from 1 after it
(``caravanserai.events.Segments``). The parent is only read, never modified; a fork of a fork
works the same way. ``state=`` replaces waypoint N's state, ``variables=`` some of its saved
notebook variables; the ``forked`` event names what was edited (``edited``), and only when
something differs from the parent.
"""

from __future__ import annotations

import difflib
import json
import re
from collections.abc import Sequence
from typing import Any

from .. import journal
from ..errors import NoSuchWaypoint, RunExists, UsageError
from ..events import BOUNDARIES, CALL_EVENTS, IDENTITY_FIELDS, Segments, fork_origin
from ..ids import validate_run_id
from ..journal import RESERVED_FIELDS, RawJSON, to_json
from ..stores import Store, open_store
from .api import readable_run_id
from .lifecycle import registry, require_events

__all__ = ["fork", "fork_point"]

_UNSET: Any = object()


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
         state: Any = _UNSET, variables: dict[str, Any] | None = None, started: dict | None = None) -> str:
    """Create a new run from waypoint ``at`` of ``run_id`` (default: its last one); returns the new id.

    ``new_run_id`` defaults to ``<run_id>-fork-<at>`` (``-2``, ``-3``... if taken); an existing id
    raises RunExists and nothing is written. ``state`` replaces that waypoint's state in the child
    (JSON); ``variables`` replaces saved notebook variables by name (Python values, saved as the
    cell saves them). Both are checked before anything is written. ``started`` gives the child its
    own identity fields (a notebook cell forks under its own source; the code diff is recorded).
    """
    resolved = open_store(store)
    run_id = readable_run_id(run_id, resolved)
    events = _events_to_fork(run_id, resolved, at)
    cut = fork_point(events, at)
    point = events[cut]
    edits: list[str] = []
    new_state = None
    if state is not _UNSET:
        new_state = RawJSON(to_json(state), state)  # refused before anything is written
        if point.get("state") != state or to_json(point.get("state")) != new_state.text:
            edits.append("state")
    saved = saved_names(events, cut)
    if variables is not None and not (isinstance(variables, dict) and all(isinstance(k, str) for k in variables)):
        raise UsageError(f"variables= maps variable names to values, got {type(variables).__name__}; "
                         "e.g. variables={'results': {0: 0}} (nothing was written)")
    if variables:
        saved, changed = edit_names(saved, variables, run_id)
        edits.extend(changed)
    child = _child_id(resolved, run_id, point.get("n"), new_run_id)
    parent = identity_at(events, cut)
    origin = fork_origin(events[0])
    copied = [_body(e) for e in events[1:cut + 1]] + [_body(e) for e in _pending_calls(events, cut)]
    copied += _signatures_of_copied(resolved, run_id, copied)
    header = {**{k: v for k, v in events[0].items() if k in IDENTITY_FIELDS or k == "denomination"},
              "forked_from": {"run_id": run_id, "seq": point["seq"], "waypoint": point.get("n"), "copied": len(copied),
                              "started_at": origin.get("started_at") if origin else events[0].get("at")}}
    if edits:
        last = {**copied[cut - 1], "note": f"{point.get('note', '')} (edited in this fork: {', '.join(edits)})"}
        if new_state is not None:
            last["state"] = new_state
        if variables:
            last["names"] = saved
        copied[cut - 1] = last
    own = {k: v for k, v in (started or {}).items() if k in IDENTITY_FIELDS}
    marker: dict[str, Any] = {"type": "forked", "parent_run": run_id, "at_waypoint": point.get("n"),
                              "parent_seq": point["seq"], **own}
    if edits:
        marker["edited"] = edits
    code = code_diff(parent.get("cell_source"), own.get("cell_source"))
    if code:
        marker["code_changed"] = code
    _copy_values(resolved, run_id, child, copied)
    run = registry.open(child, resolved, attempt=False, started=header)
    try:
        run.append(*copied, marker)
    finally:
        run.close()
    return child


def _signatures_of_copied(store: Store, run_id: str, copied: list[dict]) -> list[dict]:
    """A ``signed`` event with the signatures ``caravanserai sign`` added to the parent (anywhere in its
    journal, after the fork point too) on the items the fork copies, so they stay signed in the fork.
    Each is still verified where it is used (runs.trust.judge): copying can add no trust."""
    from .signed_items import items
    from .trust import resigned

    lines = [line for line in store.load(run_id) if '"type":"signed"' in line]
    if not lines:
        return []
    found = resigned(json.loads(line) for line in lines)
    wanted = [record for item in items(copied) for record in found.get((item.kind, item.name, item.sha256), [])]
    return [{"type": "signed", "items": wanted, "copied_from": run_id}] if wanted else []


def _events_to_fork(run_id: str, store: Store, at: int | None) -> list[dict]:
    """The parent's events a fork at waypoint ``at`` needs, verified: the journal up to the first
    boundary after that waypoint when it is found early and no ``restarted`` follows it (numbering
    would start again), so forking at step 10 of a 10,000-step run does not decode the other 9,990;
    otherwise the whole journal."""
    lines = store.load(run_id)
    if at is not None and lines:
        needle = f'"type":"waypoint","n":{at},'
        index = next((i for i, line in enumerate(lines) if needle in line), None)
        if index is not None and not any('"type":"restarted"' in line for line in lines[index:]):
            stop = next((i for i in range(index + 1, len(lines)) if _BOUNDARY_TEXT.search(lines[i])), len(lines))
            events = journal.decode(run_id, lines[: stop + 1])[0]
            if events[index].get("type") == "waypoint" and events[index].get("n") == at:
                return events
    events = journal.decode(run_id, lines)[0]
    if not events:
        return require_events(run_id, store)  # RunNotFound naming the store
    return events


_BOUNDARY_TEXT = re.compile(r'"type":"(?:waypoint|turn|run_completed|run_failed|restarted)"')


def identity_at(events: Sequence[dict], cut: int) -> dict[str, Any]:
    """The identity in force at ``events[cut]`` (a restart or an earlier fork's cell may have changed it)."""
    return Segments.of(events[: cut + 1]).identity


def saved_names(events: Sequence[dict], cut: int) -> dict:
    """The notebook variables in force at ``events[cut]``: the last ``names`` saved at or before it."""
    for event in reversed(events[: cut + 1]):
        if event["type"] == "restarted":
            break
        names = event.get("names")
        if isinstance(names, dict) and isinstance(names.get("values"), dict):
            return names
    return {}


def edit_names(saved: dict, variables: dict[str, Any], run_id: str) -> tuple[dict, list[str]]:
    """``saved`` with ``variables`` (name -> Python value) saved in their place; the names that changed.
    A name the waypoint did not save, or a value that cannot be saved as data, is a UsageError."""
    from .snapshots import entry_for
    from .view import saved_value

    values = dict(saved.get("values") or {})
    changed = []
    for name, value in variables.items():
        if name not in values:
            known = ", ".join(sorted(values)) or "none"
            raise UsageError(f"run {run_id!r} saved no variable {name!r} at this waypoint (its variables: {known}); "
                             "edit one of those (nothing was written)")
        entry = entry_for(name, value)
        old = values[name]
        if entry.get("codec") != (old.get("codec") if isinstance(old, dict) else None) \
                or to_json(entry["value"]) != to_json(saved_value(old)):
            values[name] = entry
            changed.append(name)
    return {**saved, "values": values}, changed


def code_diff(old: Any, new: Any) -> str | None:
    """The unified diff from the parent's cell source to the fork's; None when the code is the same (or unknown)."""
    if not isinstance(old, str) or not isinstance(new, str) or old == new:
        return None
    lines = difflib.unified_diff(old.splitlines(), new.splitlines(), "parent", "fork", lineterm="", n=1)
    return "\n".join(lines)


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

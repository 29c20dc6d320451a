"""caravanserai 0.2.0's API, same names and signatures, on top of the journal.

``checkpoint(run_id, state, note)`` returns once state and note are durable *together*;
``load_latest`` reads the journal (or a 0.2.0 directory), never the rendered views. Every
function also takes an optional keyword-only ``store=`` (URL, path or Store; default
``$CARAVANSERAI_STORE`` or ``./.caravanserai`` in the current directory, as 0.2.0).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

from ..errors import InvalidRunId, NoCurrentRun
from ..ids import validate_run_id
from ..journal import RawJSON, check_text, to_json
from ..stores import Store, open_store
from .lifecycle import current_run, durable, open_run, read_events, registry
from .run import Waypoint

__all__ = ["checkpoint", "clean", "complete", "history", "last_updated", "load_command", "load_latest", "resumable"]

F = TypeVar("F", bound=Callable[..., Any])


def readable_run_id(run_id: object, store: Store) -> str:
    """Validate an id for reading: our pattern, or the name of an existing 0.2.0 directory."""
    try:
        return validate_run_id(run_id)
    except InvalidRunId:
        is_legacy = getattr(store, "is_legacy_name", None)
        if isinstance(run_id, str) and is_legacy is not None and is_legacy(run_id):
            return run_id
        raise


_NO_NOTE = object()


def checkpoint(run_id: Any, state: Any = _NO_NOTE, note: Any = _NO_NOTE, *, store: Store | str | None = None) -> int:
    """Save ``state`` (JSON) with a human-readable ``note`` as the run's next waypoint; returns N.

    ``checkpoint(run_id, state, note)`` as in 0.2.0; inside ``durable()`` or a ``%%resumable``
    cell, ``checkpoint(state, note)`` (or ``checkpoint(state)``) uses that run. Durable when it
    returns: a ``kill -9`` after this cannot lose it or separate note from state. Non-JSON state
    raises SerializationError and writes nothing.
    """
    if note is _NO_NOTE:  # the current-run forms: checkpoint(state[, note])
        run = current_run()
        if run is None:
            raise NoCurrentRun("checkpoint(state, note) without a run id needs a current run (inside durable() or a "
                            "%%resumable cell); otherwise call checkpoint(run_id, state, note)")
        state, note = run_id, ("" if state is _NO_NOTE else state)
        return run.checkpoint(RawJSON(to_json(state), state), note)
    validate_run_id(run_id)
    encoded = RawJSON(to_json(state), state)  # fail before the store is touched: no empty run directory
    check_text(str(note), "the note")
    return open_run(run_id, store).checkpoint(encoded, note)


def _events(run_id: str, store: Store | str | None) -> tuple[str, Store, list[dict]]:
    resolved = open_store(store)
    run_id = readable_run_id(run_id, resolved)
    return run_id, resolved, read_events(run_id, resolved)


def load_latest(run_id: str, *, store: Store | str | None = None) -> tuple[Any, str, int] | None:
    """``(state, note, n)`` of the last waypoint, or None if the run has none."""
    run_id, resolved, events = _events(run_id, store)
    last = next((e for e in reversed(events) if e["type"] == "waypoint" and "state" in e), None)
    if last is None:
        return None
    if registry.get(run_id, resolved) is None:
        resolved.refresh_views(run_id, events)  # repair views a killed writer left behind
    return last["state"], last.get("note", ""), last["n"]


def history(run_id: str, *, store: Store | str | None = None) -> list[Waypoint]:
    """Every waypoint of the run, oldest first."""
    return [Waypoint.from_event(e) for e in _events(run_id, store)[2] if e["type"] == "waypoint"]


def load_command(run_id: str, *, store: Store | str | None = None) -> list[str] | None:
    """The command (``[python, *argv]``) that first checkpointed the run, or None."""
    events = _events(run_id, store)[2]
    return events[0].get("command") if events else None


def last_updated(run_id: str, *, store: Store | str | None = None) -> float | None:
    """POSIX time of the run's last change, or None if it does not exist."""
    resolved = open_store(store)
    return resolved.last_updated(readable_run_id(run_id, resolved))


def clean(run_id: str, *, store: Store | str | None = None) -> bool:
    """Delete a run's checkpoints; False if there were none. RunLocked if another process writes it."""
    resolved = open_store(store)
    run_id = readable_run_id(run_id, resolved)
    mine = registry.get(run_id, resolved)
    if mine is not None:
        mine.close()
    return resolved.remove(run_id)


def complete(run_id: str, result: Any = None, *, store: Store | str | None = None) -> None:
    """Mark a run finished, so ``caravanserai resume`` leaves it alone."""
    open_run(run_id, store).complete(result)


def resumable(fn: F) -> F:
    """``fn(run_id, state, ...)`` gets the last checkpointed state instead of ``state`` if there is one.

    The call is one attempt of a durable run: it completes the run when ``fn`` returns, records
    the failure when it raises, and leaves the run pending on Ctrl-C or a kill.
    """

    @functools.wraps(fn)
    def wrapper(run_id: str, state: Any, *args: Any, **kwargs: Any) -> Any:
        saved = load_latest(run_id)
        if saved is not None:
            state = saved[0]
        with durable(run_id) as run:
            result = fn(run_id, state, *args, **kwargs)
            if not run.completed:  # a completed run re-entered that wrote nothing stays as it was
                run.complete(result)
        return result

    return wrapper  # type: ignore[return-value]

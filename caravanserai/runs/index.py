"""The run index: one small summary per run kept in the store, so listing thousands of runs reads
the index instead of every journal.

An entry is stored with ``store.index_put`` (the object face's ``runs-index/<run_id>.json``; on the
local store ``index.json`` in the run's directory)::

    {"index": 1, "run_id": ..., "version": <the journal's change token it was computed at>,
     "updated": <POSIX time of the last event>, "summary": <RunView.as_summary() without "latest">,
     "row": <the Runs panel's row: RunView.as_row(); a damaged run's is run_id, status "damaged" and error>}

The journal stays the source of truth. ``Store.journal_versions()`` gives each run's change token
cheaply (a file size, a row count); an entry whose token differs — the run changed, or its writer
was killed before updating the index — or that is missing or unreadable is recomputed from the
journal and written back (best effort: a read-only reader still gets the right rows). Writers
refresh their run's entry when an attempt ends. ``check_index`` compares every entry with its
journal (``caravanserai verify``). Entries are data shown to people, never code to run.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable, Sequence
from datetime import datetime
from typing import Any

from ..errors import CaravanseraiError
from ..journal import ORJSON_LOADS
from ..stores.base import Store
from .lifecycle import attempt_end_hooks
from .run import HELD_EVENTS_MAX
from .view import RunView, gc_paused, inspect_run

# entries are written by json.dumps (integers within 64 bits): orjson reads them ~3x faster
_loads: Callable[[bytes], Any] = ORJSON_LOADS or json.loads

__all__ = ["IndexedRun", "age_seconds", "check_index", "compute_entry", "drop_entry", "entry_of_view", "indexed",
           "list_runs", "refresh_entry"]

INDEX_FORMAT = 3  # 2: forks' own attempts, CheckpointLog main lines and branches; 3: call counts, usd_text, error


class IndexedRun(dict):
    """One run as the index knows it: ``run_id``, ``version``, ``updated``, ``summary``, ``row``."""

    @property
    def run_id(self) -> str:
        return str(self["run_id"])

    @property
    def summary(self) -> dict[str, Any]:
        return self["summary"]

    @property
    def row(self) -> dict[str, Any]:
        return self["row"]


def _timestamp(iso: Any) -> float | None:
    try:
        return datetime.fromisoformat(iso).timestamp() if isinstance(iso, str) else None
    except ValueError:
        return None


def compute_entry(run_id: str, store: Store, version: str | None, events: Sequence[dict] | None = None) -> IndexedRun:
    """The entry of ``run_id`` read from its journal now (a damaged run gets a ``damaged`` entry).

    ``events``: the journal already in hand (its writer's, verified as it was written), so it is
    not read and decoded again.
    """
    try:
        view = RunView.from_events(run_id, events) if events else inspect_run(run_id, store)
    except CaravanseraiError as exc:  # one damaged run must not hide the others
        error = {"code": exc.code, "message": exc.message}
        return IndexedRun(index=INDEX_FORMAT, run_id=run_id, version=version, updated=store.last_updated(run_id),
                          summary={"run_id": run_id, "status": "damaged", "error": error},
                          row={"run_id": run_id, "status": "damaged", "parent": None,
                               "error": f"{type(exc).__name__}: {exc.message}"})
    return entry_of_view(view, version)


def entry_of_view(view: RunView, version: str | None) -> IndexedRun:
    summary = view.as_summary()
    summary.pop("latest", None)
    return IndexedRun(index=INDEX_FORMAT, run_id=view.run_id, version=version, updated=_timestamp(view.updated_at),
                      summary=summary, row=view.as_row())


def _parse(raw: bytes, run_id: str) -> IndexedRun | None:
    """A stored entry if it is well formed and names ``run_id``; None otherwise (then recomputed)."""
    try:
        doc = _loads(raw)
    except (ValueError, UnicodeDecodeError):  # orjson.JSONDecodeError is a ValueError
        return None
    if (not isinstance(doc, dict) or doc.get("index") != INDEX_FORMAT or doc.get("run_id") != run_id
            or not isinstance(doc.get("summary"), dict) or not isinstance(doc.get("row"), dict)
            or not isinstance(doc.get("version"), (str, type(None)))
            or not isinstance(doc.get("updated"), (int, float, type(None)))):
        return None
    return IndexedRun(doc)


def _write(store: Store, entry: IndexedRun) -> None:
    """Store ``entry``; an index we cannot write (read-only media, permissions) is only slower."""
    try:
        store.index_put(entry.run_id, json.dumps(entry, sort_keys=True, default=str).encode())
    except (CaravanseraiError, OSError):
        pass


def refresh_entry(store: Store, run_id: str, view: RunView | None = None, *,
                  events: Sequence[dict] | None = None) -> IndexedRun:
    """Recompute ``run_id``'s entry from its journal and store it (what a writer does when an attempt ends).

    The version is read before the journal, so an append that lands in between leaves a stale
    version behind, which the next reader notices and recomputes. ``events`` is the journal as
    its writer holds it while it still holds the lease (nothing can land in between): the entry
    is computed from them, without reading the journal back.
    """
    version = store.journal_versions([run_id]).get(run_id)
    raw = store.index_get_many([run_id]).get(run_id)
    current = _parse(raw, run_id) if raw is not None else None
    if current is not None and version is not None and current.get("version") == version:
        return current  # nothing changed since it was computed (a re-run that replayed everything)
    entry = entry_of_view(view, version) if view is not None else compute_entry(run_id, store, version, events)
    _write(store, entry)
    return entry


def drop_entry(store: Store, run_id: str) -> None:
    try:
        store.index_delete(run_id)
    except (CaravanseraiError, OSError):
        pass


def list_runs(store: Store, *, write_back: bool = True) -> list[IndexedRun]:
    """Every run of ``store`` with its summary and panel row, sorted by run id.

    Reads the change tokens and the index entries (one pass each); only runs whose entry is
    missing or stale are read from their journals (and their entries written back).
    """
    entries = indexed(store, store.journal_versions(), write_back=write_back)
    return [entries[run_id] for run_id in sorted(entries)]


def indexed(store: Store, versions: dict[str, str], *, write_back: bool = True) -> dict[str, IndexedRun]:
    """The entries of the runs in ``versions`` (run id -> its current change token), recomputing stale ones."""
    stored = store.index_get_many(list(versions))
    out = {}
    with gc_paused():  # thousands of small acyclic dicts: collections would cost as much as parsing
        for run_id, version in versions.items():
            out[run_id] = _current(store, run_id, version, stored.get(run_id), write_back)
    return out


def _current(store: Store, run_id: str, version: str, raw: bytes | None, write_back: bool) -> IndexedRun:
    """The stored entry if it is current, else one recomputed from the journal (and written back)."""
    entry = _parse(raw, run_id) if raw is not None else None
    if entry is None or entry.get("version") != version:
        entry = compute_entry(run_id, store, version)
        if write_back:
            _write(store, entry)
    return entry


def check_index(store: Store, run_ids: Iterable[str] | None = None) -> list[str]:
    """Problems of the index against the journals: one line per entry that is current by its
    version but disagrees with what the journal says (stale or missing entries are not problems:
    readers recompute them)."""
    versions = store.journal_versions(None if run_ids is None else list(run_ids))
    stored = store.index_get_many(list(versions))
    problems = []
    for run_id, version in sorted(versions.items()):
        raw = stored.get(run_id)
        if raw is None:
            continue
        entry = _parse(raw, run_id)
        if entry is None:
            problems.append(f"{run_id}: the index entry is malformed (it will be recomputed)")
            continue
        if entry.get("version") != version:
            continue
        fresh = compute_entry(run_id, store, version)
        for part in ("summary", "row"):
            if _comparable(entry[part]) != _comparable(fresh[part]):
                problems.append(f"{run_id}: the index entry's {part} differs from the journal")
                break
    return problems


def _comparable(value: Any) -> Any:
    return json.loads(json.dumps(value, sort_keys=True, default=str))


def age_seconds(entry: IndexedRun, now: float | None = None) -> float | None:
    updated = entry.get("updated")
    return None if updated is None else round((time.time() if now is None else now) - updated, 3)


#: A writer refreshes its run's entry when an attempt ends for journals up to this long, from the
#: events it holds; a longer one is left to its next reader (the writer does not keep it in memory).
INDEX_AT_CLOSE_MAX_EVENTS = HELD_EVENTS_MAX


def _attempt_ended(run: Any) -> None:
    """The attempt-end hook: called while ``run`` still holds its lease (``runs.lifecycle``)."""
    events = run.held_events()
    if events:  # a journal this writer holds in full: no read, no decode
        refresh_entry(run.store, run.run_id, events=events)
    elif events is None and run.journal_length() <= INDEX_AT_CLOSE_MAX_EVENTS:
        refresh_entry(run.store, run.run_id)  # its lease was lost: the journal as the store has it now


attempt_end_hooks.append(_attempt_ended)

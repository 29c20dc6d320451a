"""caravanserai: durable, human-readable AI-agent runs for Python and Jupyter.

Checkpoint at natural stopping points (``checkpoint``, ``@resumable``, ``resumable_iterate``,
``with durable(run_id) as run``); a ``kill -9`` loses nothing acknowledged; every run leaves a
journal and waypoint notes a person can read (``caravanserai show RUN``).
"""

from __future__ import annotations

from ._version import __version__
from .errors import (
    CaravanseraiError,
    InvalidRunId,
    ItemsChanged,
    JournalCorruptionError,
    LeaseLost,
    MissingExtra,
    ObjectNotFound,
    ResumeError,
    RunLocked,
    RunNotFound,
    SerializationError,
    StoreUnavailable,
    UnknownStoreScheme,
)
from .iterate import resumable_iterate
from .run import Run, Waypoint, current_run, durable
from .stores import LocalDirectoryStore, LocalStore, MemoryStore, ObjectStore, Store, open_store
from .waypoints import checkpoint, clean, complete, history, last_updated, load_command, load_latest, resumable

__all__ = [
    "CaravanseraiError",
    "InvalidRunId",
    "ItemsChanged",
    "JournalCorruptionError",
    "LeaseLost",
    "LocalDirectoryStore",
    "LocalStore",
    "MemoryStore",
    "MissingExtra",
    "ObjectNotFound",
    "ObjectStore",
    "ResumeError",
    "Run",
    "RunLocked",
    "RunNotFound",
    "SerializationError",
    "Store",
    "StoreUnavailable",
    "UnknownStoreScheme",
    "Waypoint",
    "__version__",
    "checkpoint",
    "clean",
    "complete",
    "current_run",
    "durable",
    "history",
    "last_updated",
    "load_command",
    "load_ipython_extension",
    "load_latest",
    "open_store",
    "resumable",
    "resumable_iterate",
    "unload_ipython_extension",
]


def load_ipython_extension(ipython):  # pragma: no cover - exercised through IPython
    """``%load_ext caravanserai``: imports the notebook layer only now (IPython stays optional)."""
    from .ipython_ext import load_ipython_extension as load

    load(ipython)


def unload_ipython_extension(ipython):  # pragma: no cover - exercised through IPython
    from .ipython_ext import unload_ipython_extension as unload

    unload(ipython)

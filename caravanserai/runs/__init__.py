"""Durable runs (layer 4): the one run lifecycle, identity, variable snapshots, the 0.2.0 API, loops.

``run`` is the journal writer of one run; ``lifecycle`` opens it (one writer per run in a process)
and scopes one attempt (``RunScope``, ``durable()``); ``identity`` checks a resume is the same run;
``api`` is caravanserai 0.2.0's function API; ``iterate`` is ``resumable_iterate``; ``snapshots``
and ``values`` save a namespace's variables; ``summary`` classifies a journal; ``settle`` records
an uncertain tool call by hand; ``openai_client`` journals an OpenAI client's calls.
"""

from .index import list_runs  # importing the index also installs its attempt-end hook
from .lifecycle import (
    RunScope,
    append_event,
    close_all,
    current_run,
    durable,
    identity_fields,
    open_checked,
    open_run,
    read_events,
    registry,
    require_events,
)
from .run import Run, Waypoint, launch_info
from .view import RunView, inspect_run

__all__ = [
    "Run",
    "RunScope",
    "RunView",
    "Waypoint",
    "append_event",
    "close_all",
    "current_run",
    "durable",
    "identity_fields",
    "inspect_run",
    "launch_info",
    "list_runs",
    "open_checked",
    "open_run",
    "read_events",
    "registry",
    "require_events",
]

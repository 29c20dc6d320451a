"""The journal's event vocabulary in one place: the event names, the identity fields, and how a
run's history divides into attempts.

Every reader of a journal (the writer opening its run, the ledger, the read model, a notebook
cell's source check, the checkpoint status) walks the same events; what an event *means* for
attempts, identity and a fork's copied prefix is decided here, by ``Segments``, so the readers
cannot disagree. The full list of events and their fields is in ``docs/journal-format.md``.

A fork (``caravanserai.fork``) starts with a ``run_started`` carrying ``forked_from`` and copies
the parent's history up to the fork point, ending the copy with a ``forked`` event naming the
parent (``parent_run``). That copied prefix is the parent's work, not an attempt of the fork: its
``attempt`` events are the parent's attempts, and the fork's own attempts count from 1 after it.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

__all__ = ["ATTEMPT_STARTS", "BOUNDARIES", "CALL_EVENTS", "ENDINGS", "IDENTITY_FIELDS", "Segments", "fork_origin"]

#: Events that start an attempt of a run (a process running it): the first, and each resume.
ATTEMPT_STARTS = ("run_started", "attempt")
#: How an attempt ends, when it ends by itself (no end: killed, or still running).
ENDINGS = {"run_completed": "completed", "run_failed": "failed", "interrupted": "interrupted"}
#: The points a resumed attempt continues from: journaled calls before the last one are not replayed.
BOUNDARIES = ("waypoint", "turn")
#: Journaled model and tool calls (intent and outcome).
CALL_EVENTS = ("call_started", "call_settled", "call_failed", "tool_intent", "tool_settled")
#: What a caller asserts about a run (``run_started``; a ``restarted`` or a fork's ``forked`` event
#: replaces them from that point on): opening it with other values is refused.
IDENTITY_FIELDS = ("agent_id", "definition_sha256", "input", "budget_sha256", "session_id", "conversation_sha256",
                   "cell_source")


def fork_origin(event: dict) -> dict | None:
    """The ``forked_from`` of a ``run_started`` made by ``caravanserai.fork`` (``copied`` events of the
    parent follow it), else None (a plain run, a checkpoint-log fork, or a fork made before
    1.0, whose copied prefix still reads as its first attempt)."""
    origin = event.get("forked_from")
    if isinstance(origin, dict) and isinstance(origin.get("run_id"), str) and type(origin.get("copied")) is int:
        return origin
    return None


#: The events ``Segments.feed`` acts on: every other event leaves it as it was.
SEGMENT_EVENTS = frozenset({"run_started", "attempt", "restarted", "cell_edited", "forked"})


class Segments:
    """The attempt bookkeeping of a journal, fed one event at a time (``feed``).

    ``number``: the attempt the last event belongs to (0 inside a fork's copied prefix, or before
    any attempt); ``copying``: inside a fork's copied prefix; ``identity``: the identity fields in
    force; ``started_at``: when the current segment (attempt, or a copied parent attempt) began,
    so a step's duration never spans a kill or the gap between a parent and its fork.
    ``restarted``: the current attempt ran ``--restart``. ``parent``: the run this one was forked from.
    """

    __slots__ = ("copying", "identity", "number", "parent", "restarted", "started_at")

    def __init__(self) -> None:
        self.number = 0
        self.copying = False
        self.parent: str | None = None
        self.identity: dict[str, Any] = {}
        self.started_at: str | None = None
        self.restarted = False

    @classmethod
    def of(cls, events: Iterable[dict]) -> Segments:
        """The bookkeeping after every one of ``events``."""
        segments = cls()
        for event in events:
            segments.feed(event)
        return segments

    def feed(self, event: dict) -> str | None:
        """Take one event; returns ``"attempt"`` when it starts an attempt of this run, ``"copy"`` when
        it starts a fork's copied prefix, ``"forked"`` when it ends that prefix, else None."""
        etype = event["type"]
        if etype == "run_started":
            self.identity = _identity(event)
            self.started_at = event.get("at")
            origin = fork_origin(event)
            if origin is not None:
                self.copying, self.parent = True, origin["run_id"]
                self.started_at = origin.get("started_at") if isinstance(origin.get("started_at"), str) else None
                return "copy"
            self.number += 1
            return "attempt"
        if etype == "attempt":
            self.started_at = event.get("at")
            if self.copying:
                return None  # one of the parent's attempts, copied
            self.number += 1
            self.restarted = False
            return "attempt"
        if etype == "restarted":
            self.identity = {**self.identity, **_identity(event)}
            self.restarted = not self.copying
        elif etype == "cell_edited":  # a fork's cell edited before the fork's first attempt ran
            self.identity = {**self.identity, **_identity(event)}
        elif etype == "forked" and "parent_run" in event:
            self.identity = {**self.identity, **_identity(event)}
            if self.copying and event["parent_run"] == self.parent:
                self.copying = False
                self.started_at = event.get("at")
                return "forked"
        return None

    def walk(self, events: Iterable[dict]) -> Segments:
        for event in events:
            self.feed(event)
        return self


def _identity(event: dict) -> dict[str, Any]:
    return {k: event[k] for k in IDENTITY_FIELDS if k in event}

"""The family tree of forks: which timeline was forked from which, where, and with what edit.

A node is a timeline: a run (forked with ``caravanserai.fork``, ``%%resumable --from``, a
CheckpointLog fork into a new run, or ForkPanel), or a branch inside one run's CheckpointLog
(``log.fork`` without a new run id), named ``RUN@CHECKPOINT`` (12 hex characters). The tree is
read from the journals alone: ``run_started.forked_from`` links runs, the ``checkpoint_committed``
events' parent links and ``fork`` edits give the branches inside a log.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Any

from ..errors import CaravanseraiError
from ..runs.api import readable_run_id
from ..runs.lifecycle import require_events
from ..runs.view import RunView
from ..stores import Store, open_store
from .timelines import parse_ref

__all__ = ["LineageNode", "family", "lineage"]

PREVIEW = 48  # characters of an edited value shown on the tree


@dataclass(frozen=True)
class LineageNode:
    """One timeline of the tree; ``point`` counts from 1 like the CLI (waypoint N, or step N)."""

    id: str  # the timeline's ref: a run id, or RUN@CHECKPOINT for a branch inside a run's log
    run_id: str
    parent: str | None  # the parent node's id
    depth: int
    kind: str  # "run" or "branch"
    point: int | None
    point_kind: str | None  # "waypoint" or "step"
    edit: str  # what the fork changed, for people ("" for a fork that changed nothing, or a root)
    status: str
    steps_done: int | None
    steps: int | None
    created_at: str | None
    head: str | None  # the checkpoint a DurableAgent timeline ends at
    code_changed: str | None = None  # a notebook fork's cell code diff against its parent (unified diff)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def family(run_id: str, store: Store, cache: dict[str, tuple[str | None, str]] | None = None) -> list[str]:
    """``run_id``'s fork family: its root run first, then every run forked from one of them (creation order).

    ``cache`` keeps each run's (parent, creation time) between calls: a run's first event never
    changes, so a live panel reads only the runs that are new.
    """
    cache = {} if cache is None else cache
    runs = store.list()
    for run in runs:
        if run not in cache:
            first = _first_event(store, run)
            origin = first.get("forked_from")
            parent = origin.get("run_id") if isinstance(origin, dict) and isinstance(origin.get("run_id"), str) else None
            cache[run] = (parent, str(first.get("at", "")))
    present = set(runs)
    parents = {run: cache[run][0] for run in runs}
    created = {run: cache[run][1] for run in runs}
    for gone in set(cache) - present:
        cache.pop(gone)
    root, seen = run_id, {run_id}
    while parents.get(root) and parents[root] not in seen and parents[root] in parents:
        root = parents[root]  # type: ignore[assignment]
        seen.add(root)
    members, frontier = [root], [root]
    while frontier:
        current = frontier.pop()
        for child in sorted((r for r, p in parents.items() if p == current and r not in members), key=lambda r: created[r]):
            members.append(child)
            frontier.append(child)
    return members


def _first_event(store: Store, run_id: str) -> dict:
    try:
        lines = store.load(run_id)
        first = json.loads(lines[0]) if lines else {}
    except (CaravanseraiError, ValueError, IndexError):
        return {}
    return first if isinstance(first, dict) else {}


def lineage(ref: str, store: Store | str | None = None, *,
            cache: dict[str, tuple[str | None, str]] | None = None) -> list[LineageNode]:
    """The fork tree around ``ref`` (a run id, or ``RUN@CHECKPOINT``), root first, depth-first."""
    store = open_store(store)
    run_id = readable_run_id(parse_ref(ref)[0], store)
    require_events(run_id, store)
    nodes: list[LineageNode] = []
    for run in family(run_id, store, cache):
        nodes.extend(_run_nodes(run, store))
    return _depth_first(nodes)


def _run_nodes(run: str, store: Store) -> list[LineageNode]:
    events = store.events(run)
    view = RunView.from_events(run, events)
    origin = view.parent.run_id if view.parent else None
    forked = next((e for e in events if e["type"] == "forked" and e.get("parent_run") == origin), None) if origin else None
    commits = [e for e in events if e["type"] == "checkpoint_committed" and isinstance(e.get("checkpoint_id"), str)]
    created = view.started_at  # a fork's: when it was forked
    if not commits:
        point = forked.get("at_waypoint") if forked else None
        copied = view.copied
        edits = [f"{', '.join(copied.edited)} edited at waypoint {point}"] if copied and copied.edited else []
        if copied and copied.code_changed:
            edits.append("cell code changed")
        waypoints = len({w.n for w in view.waypoints})
        return [LineageNode(run, run, origin, 0, "run", point if origin else None, "waypoint" if origin else None,
                            "; ".join(edits), view.status, waypoints, None, created, None,
                            copied.code_changed if copied else None)]
    by_id = {e["checkpoint_id"]: e for e in commits}
    # a line's tip: no commit continues it (a fork inside the log starts a new line, its source stays a tip)
    named = {e.get("parent") for e in commits if not (isinstance(e.get("fork"), dict) and e.get("parent") in by_id)}
    heads = [e for e in commits if e["checkpoint_id"] not in named]
    branch_of = {h["checkpoint_id"]: _in_log_fork(h, by_id) for h in heads}
    mains = [h for h in heads if branch_of[h["checkpoint_id"]] is None] or heads[:1]
    main = mains[-1]
    origin_fork = _first_fork(main, by_id) if origin else None
    point, edit = _fork_point(origin_fork)
    nodes = [LineageNode(run, run, origin, 0, "run", point, "step" if point else None, edit, view.status,
                         main.get("steps_done"), main.get("steps"), created, main["checkpoint_id"])]
    for head in heads:
        if head is main:
            continue
        fork = branch_of[head["checkpoint_id"]]
        point, edit = _fork_point(fork)
        done, steps = head.get("steps_done"), head.get("steps")
        status = "completed" if isinstance(done, int) and done == steps else "pending"
        nodes.append(LineageNode(f"{run}@{head['checkpoint_id'][:12]}", run, run, 0, "branch", point, "step", edit,
                                 status, done, steps, head.get("at"), head["checkpoint_id"]))
    return nodes


def _chain(head: dict, by_id: dict[str, dict]) -> list[dict]:
    """Commit events from ``head`` back along parent links inside one run's journal."""
    out: list[dict] = []
    seen: set[str] = set()
    event: dict | None = head
    while event is not None and event["checkpoint_id"] not in seen:
        seen.add(event["checkpoint_id"])
        out.append(event)
        event = by_id.get(event.get("parent"))  # type: ignore[arg-type]
    return out


def _in_log_fork(head: dict, by_id: dict[str, dict]) -> dict | None:
    """The newest fork edit on ``head``'s chain whose source is in this same log (a branch), else None."""
    for event in _chain(head, by_id):
        fork = event.get("fork")
        if isinstance(fork, dict) and event.get("parent") in by_id:
            return fork
    return None


def _first_fork(head: dict, by_id: dict[str, dict]) -> dict | None:
    """The fork edit a forked run's log starts with (its oldest commit)."""
    chain = _chain(head, by_id)
    fork = chain[-1].get("fork") if chain else None
    return fork if isinstance(fork, dict) else None


def _fork_point(fork: dict | None) -> tuple[int | None, str]:
    """(step counted from 1, the edit for people) of a commit's ``fork`` field."""
    if not isinstance(fork, dict) or not isinstance(fork.get("node_id"), str):
        return None, ""
    kind, _, number = fork["node_id"].partition("-")
    if not number.isdigit():
        return None, ""
    step = int(number) + 1
    value = fork.get("value")
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    text = text if len(text) <= PREVIEW else text[: PREVIEW - 1] + "…"
    what = "prompt" if kind == "prompt" else "output"
    return step, f"step {step} {what} → {text}"


def _depth_first(nodes: list[LineageNode]) -> list[LineageNode]:
    """Nodes in depth-first order (children in creation order), each with its depth."""
    children: dict[str | None, list[LineageNode]] = {}
    ids = {n.id for n in nodes}
    for node in nodes:
        children.setdefault(node.parent if node.parent in ids else None, []).append(node)
    out: list[LineageNode] = []

    def visit(node: LineageNode, depth: int) -> None:
        out.append(LineageNode(**{**node.to_dict(), "depth": depth}))
        for child in sorted(children.get(node.id, []), key=lambda n: n.created_at or ""):
            visit(child, depth + 1)

    for root in children.get(None, []):
        visit(root, 0)
    return out

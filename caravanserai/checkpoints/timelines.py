"""Timelines: a run as a sequence of steps, and the comparison of two of them.

A run's timeline is its DurableAgent step outputs (from the checkpoint its journal committed
last) or, for a plain run, its waypoints (note and state). ``compare`` finds the shared prefix,
the first divergence and a per-step verdict; the CLI's ``diff`` and the notebook's Compare panel
both use it.

Steps here are for people, so they count from 1: ``Step.step`` 1 is the first step (DurableAgent
node ``step-0``, or waypoint 1), and ``compare`` reports ``step``, ``shared_prefix`` and
``first_divergence`` in the same numbering (see docs/checkpoint-format.md, "Step numbers").
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from ..runs.lifecycle import require_events
from ..stores import Store, open_store

__all__ = ["Comparison", "Step", "compare", "timeline"]


@dataclass(frozen=True)
class Step:
    """One step of a timeline: its number (from 1, as people count steps and waypoints), label, value."""

    step: int
    label: str
    value: Any


@dataclass
class Comparison:
    runs: tuple[str, ...]
    steps: list[dict] = field(default_factory=list)
    shared_prefix: int = 0
    first_divergence: int | None = None

    def to_dict(self) -> dict:
        return {"runs": list(self.runs), "shared_prefix": self.shared_prefix,
                "first_divergence": self.first_divergence, "steps": self.steps}


def timeline(run_id: str, store: Store | str | None = None) -> list[Step]:
    """The steps of ``run_id``: checkpointed step outputs if it has a checkpoint log, else waypoints."""
    store = open_store(store)
    events = require_events(run_id, store)
    committed = [e for e in events if e["type"] == "checkpoint_committed"]
    if committed:
        from .agent import DurableAgent
        from .log import CheckpointLog

        ckpt = CheckpointLog(store, run_id).load(committed[-1]["checkpoint_id"])
        return [Step(i + 1, f"step {i + 1}", out) for i, out in enumerate(DurableAgent.outputs_of(ckpt))]
    waypoints = [e for e in events if e["type"] == "waypoint"]
    return [Step(e["n"], e.get("note", ""), e.get("state")) for e in waypoints]


def compare(*timelines: tuple[str, list[Step]]) -> Comparison:
    """Step-by-step comparison of two or more named timelines."""
    names = tuple(name for name, _ in timelines)
    length = max((len(steps) for _, steps in timelines), default=0)
    result = Comparison(names)
    for i in range(length):
        cells = [steps[i] if i < len(steps) else None for _, steps in timelines]
        values = [json.dumps(c.value, sort_keys=True, ensure_ascii=False) if c else None for c in cells]
        same = all(v is not None and v == values[0] for v in values)
        result.steps.append({"step": i + 1, "same": same,  # numbered from 1, like Step.step
                             "values": [c.value if c else None for c in cells],
                             "labels": [c.label if c else None for c in cells]})
        if same and result.first_divergence is None:
            result.shared_prefix = i + 1
        elif not same and result.first_divergence is None:
            result.first_divergence = i + 1
    return result

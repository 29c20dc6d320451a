"""Resume a CheckpointLog head step by step, committing as it goes: the engine of ``log.resume`` and ForkPanel.

A step's figures (tokens computed, seconds, tokens the server answered from its prefix cache)
go into the ``usage`` of the checkpoint that first holds it, so Compare and ``caravanserai diff``
show per-step cost without recomputing anything.

A commit sends the log only what the steps since the last commit added (their outputs and KV
entries: ``CheckpointLog.commit_change``), so it costs the size of the change plus one SHA-256,
not an encode and a decode of the whole run; the bytes and ids are those of
``commit(agent.checkpoint())``. A backend that may rewrite the KV cache it loaded (the local
transformers backend) commits the whole checkpoint instead.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Any

from .agent import DurableAgent, step_id

__all__ = ["Progress", "resume_log"]


@dataclass
class Progress:
    """Where a resume stands: ``head`` is the newest committed checkpoint (ids are full SHA-256)."""

    run_id: str
    head: str
    steps: int
    steps_done: int
    reused: int  # steps already done when the resume started: never recomputed
    computed: int = 0
    tokens: int = 0
    tokens_saved: int = 0  # tokens the server answered from its prefix cache during this resume
    commits: int = 0
    stopped: bool = False
    usage: list[dict] = field(default_factory=list, repr=False)  # per computed step, not yet committed

    @property
    def done(self) -> bool:
        return self.steps_done >= self.steps

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out.pop("usage")
        return {**out, "done": self.done}


def resume_log(log: Any, checkpoint: str, *, stop: Any = None, on_progress: Any = None,
               commit_every: float = 0.25) -> Progress:
    """Run ``checkpoint``'s pending steps in order, committing into ``log`` (see ``CheckpointLog.resume``)."""
    agent = DurableAgent().load(log.load(checkpoint))
    pending = agent.pending_steps()
    total = len(agent.step_node_ids)
    progress = Progress(log.run_id, checkpoint, total, total - len(pending), total - len(pending))
    last_commit = time.monotonic()
    try:
        for index in pending:
            if stop is not None and stop.is_set():
                progress.stopped = True
                break
            started, tokens, saved = time.perf_counter(), agent.tokens_computed, agent.tokens_saved
            agent.run_step(index)
            step_tokens, step_saved = agent.tokens_computed - tokens, agent.tokens_saved - saved
            progress.usage.append({"index": index, "tokens": step_tokens, "tokens_saved": step_saved,
                                   "latency_s": round(time.perf_counter() - started, 6)})
            progress.computed += 1
            progress.steps_done += 1
            progress.tokens += step_tokens
            progress.tokens_saved += step_saved
            if time.monotonic() - last_commit >= commit_every or progress.done:
                _commit(log, agent, progress, index)
                last_commit = time.monotonic()
            if on_progress is not None:
                on_progress(progress)
    finally:  # an error or a stop: what was computed is committed, never lost
        if progress.usage:
            _commit(log, agent, progress, progress.usage[-1]["index"])
            if on_progress is not None:
                on_progress(progress)
    return progress


CHANGE_BACKENDS = ("fake", "text", "vllm")  # a step adds its output and its KV entry, and changes nothing else


def _commit(log: Any, agent: DurableAgent, progress: Progress, index: int) -> None:
    if agent.backend in CHANGE_BACKENDS and hasattr(log, "commit_change"):
        values, kv = agent._require()["values"], agent._kv  # read only: what the steps since the last commit added
        added = [step_id(row["index"]) for row in progress.usage]
        progress.head = log.commit_change(progress.head, {k: values[k] for k in added},
                                          {k: kv[k] for k in added if k in kv}, step=index, usage=progress.usage)
    else:
        progress.head = log.commit(agent.checkpoint(), parent=progress.head, step=index, usage=progress.usage)
    progress.usage = []
    progress.commits += 1

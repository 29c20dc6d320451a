"""Agents (layer 5): ``agent(...)``, ``tool(...)`` and ``run(agent, input, durable={...})``.

A durable run journals every model and tool call before it goes out and its result after; the
run id is the idempotency key. See ``agent.py`` and ``docs/durable-runs.md``.
"""

from .agent import Agent, DiskDurableStore, Durable, RunResult, Tool, agent, run, tool

__all__ = ["Agent", "DiskDurableStore", "Durable", "RunResult", "Tool", "agent", "run", "tool"]

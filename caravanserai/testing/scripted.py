"""``ScriptedModel``: a model that answers from a script, for tests and examples.

Each reply is a string (the answer) or ``ScriptedModel.tool("name", arg=...)`` (a tool call);
usage is counted deterministically from the text, priced at $0 ("scripted" list price), and
every request it receives is kept in ``requests`` so a test can assert what was (not) sent.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from typing import Any

from ..calls.models import Model, ModelResponse, Usage
from ..errors import ModelError
from ..journal import canonical


class ScriptedModel(Model):
    provider = "scripted"
    name = "scripted"

    def __init__(self, replies: Sequence[Any], *, delay: float = 0.0, repeat_last: bool = False) -> None:
        self.replies = list(replies)
        self.delay = delay
        self.repeat_last = repeat_last
        self.requests: list[list[dict]] = []

    @staticmethod
    def tool(name: str, **arguments: Any) -> dict:
        """A scripted reply that calls tool ``name`` with ``arguments``."""
        return {"tool_calls": [{"name": name, "arguments": arguments}]}

    def complete(self, messages: Sequence[dict], *, tools: Sequence[dict] | None = None, **params: Any) -> ModelResponse:
        index = len(self.requests)
        self.requests.append([dict(m) for m in messages])
        if index >= len(self.replies) and not (self.repeat_last and self.replies):
            raise ModelError(f"scripted model has no reply #{index + 1} (it has {len(self.replies)})", kind="script")
        reply = self.replies[min(index, len(self.replies) - 1)]
        if self.delay:
            time.sleep(self.delay)
        calls: tuple[dict, ...] = ()
        text = reply if isinstance(reply, str) else ""
        if isinstance(reply, dict):
            calls = tuple({"id": f"call_{index}_{i}", "type": "function",
                           "function": {"name": c["name"], "arguments": json.dumps(c.get("arguments", {}), sort_keys=True)}}
                          for i, c in enumerate(reply.get("tool_calls", ())))
            text = reply.get("text", "")
        usage = Usage(max(1, len(canonical(list(messages))) // 4), max(1, len(text) // 4 + 4 * len(calls)))
        return ModelResponse(text, usage, calls, self.name, None)

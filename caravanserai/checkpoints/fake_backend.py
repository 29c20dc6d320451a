"""The ``fake`` DurableAgent backend: a deterministic stand-in for a model with a real per-token KV
cache (the seed's default; outputs are token ids). The ``text`` backend builds on it."""

from __future__ import annotations

import hashlib
from typing import Any

__all__ = ["FakeBackend", "previous_tokens"]


class FakeBackend:
    """Deterministic stand-in for a model: byte tokens, a per-token KV cache, greedy 'generation'.

    Each context token gets a KV entry (``LAYERS`` × K,V × ``DIM`` float32, derived from the token
    and its position); the next token is read from a digest of the KV so far, so the output
    depends on every context token and the cache grows by one entry per token.
    """

    name = "fake"
    LAYERS, DIM, NEW_TOKENS = 2, 4, 8
    ENTRY_BYTES = LAYERS * 2 * DIM * 4

    def __init__(self, model_id: str = "fake") -> None:
        self.model_id = model_id
        self.tokens_computed = 0
        self.tokens_saved = 0

    @staticmethod
    def tokenize(text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def kv_entry(self, token: int | str, position: int) -> bytes:
        self.tokens_computed += 1
        return hashlib.blake2b(f"{token}:{position}".encode(), digest_size=self.ENTRY_BYTES).digest()

    def generate(self, prompt: str, previous: Any) -> tuple[Any, bytes]:
        context = self.tokenize(prompt) + previous_tokens(previous)
        kv = b"".join(self.kv_entry(t, i) for i, t in enumerate(context))
        state = hashlib.sha256(kv).digest()
        output: list[int] = []
        for k in range(self.NEW_TOKENS):
            token = state[0]
            output.append(token)
            entry = self.kv_entry(token, len(context) + k)
            kv += entry
            state = hashlib.sha256(state + entry).digest()
        return output, kv


def previous_tokens(previous: Any) -> list[Any]:
    """The previous step's output as context tokens: a list (token ids) as is, a str or dict by item,
    any other scalar (a forked-in number) as one token, nothing for an empty or missing output."""
    if not previous:
        return []
    return list(previous) if isinstance(previous, (list, str, dict)) else [previous]

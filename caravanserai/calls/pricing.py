"""Estimated cost of a model call from public list prices (USD per million tokens).

Every figure is an *inferred* public-catalogue subtotal, never a bill: it ignores discounts,
cached-input rates, batch pricing and taxes. A model not in the table is **unpriced**: its
calls are counted (tokens, calls) but never given a guessed price. Prices as published by each
provider on its pricing page (as of 2026); extend or override with ``register_price``.
"""

from __future__ import annotations

import math

PRICE_LABEL = "inferred from public list prices"

# model-name prefix -> (USD per 1M input tokens, USD per 1M output tokens)
_PRICES: dict[str, tuple[float, float]] = {
    "gpt-4o-mini": (0.15, 0.60),
    "gpt-4o": (2.50, 10.00),
    "gpt-4.1-nano": (0.10, 0.40),
    "gpt-4.1-mini": (0.40, 1.60),
    "gpt-4.1": (2.00, 8.00),
    "o4-mini": (1.10, 4.40),
    "o3-mini": (1.10, 4.40),
    "o3": (2.00, 8.00),
    "claude-3-5-haiku": (0.80, 4.00),
    "claude-3-5-sonnet": (3.00, 15.00),
    "claude-3-7-sonnet": (3.00, 15.00),
    "claude-sonnet-4": (3.00, 15.00),
    "claude-opus-4": (15.00, 75.00),
    "gemini-2.0-flash": (0.10, 0.40),
    "gemini-1.5-flash": (0.075, 0.30),
    "gemini-1.5-pro": (1.25, 5.00),
    "scripted": (0.0, 0.0),  # caravanserai.testing.ScriptedModel: priced, and free
}


def register_price(model_prefix: str, input_per_million: float, output_per_million: float) -> None:
    """Add or replace a list price (for a model the table does not know)."""
    for value in (input_per_million, output_per_million):
        if not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
            raise ValueError(f"price must be a finite number >= 0, got {value!r}")
    _PRICES[model_prefix] = (float(input_per_million), float(output_per_million))


def price_for(model: str | None) -> tuple[float, float] | None:
    """The list price of ``model`` (longest matching name prefix, provider prefix ignored), or None."""
    if not model:
        return None
    name = model.split("/")[-1].lower()
    best = max((p for p in _PRICES if name.startswith(p)), key=len, default=None)
    return _PRICES[best] if best is not None else None


def estimate_usd(model: str | None, prompt_tokens: int, completion_tokens: int) -> float | None:
    """Inferred USD for one call, or None when the model is unpriced."""
    price = price_for(model)
    if price is None:
        return None
    return round((prompt_tokens * price[0] + completion_tokens * price[1]) / 1_000_000, 10)

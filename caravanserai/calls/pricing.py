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


def usd_text(usd: float | None, priced: bool = True) -> str:
    """Money as people read it, the one formatter every panel, receipt and command uses.

    ``unpriced`` when the figure is unknown (None, or ``priced=False``); ``$0`` for nothing spent;
    two decimals from a dollar up (``$12.34``); below a dollar three significant digits with
    trailing zeros stripped (``$0.015``, ``$0.00042``, ``$0.000123``), never exponent notation.
    Budgets and revalidation compare exact figures; this is only for showing one.
    """
    if usd is None or not priced or isinstance(usd, bool) or not isinstance(usd, (int, float)):
        return "unpriced"
    if not math.isfinite(usd):
        return f"${usd}"
    sign, amount = ("-" if usd < 0 else ""), abs(float(usd))
    if amount == 0:
        return "$0"
    if amount < 1:
        decimals = 2 - math.floor(math.log10(amount))
        text = f"{amount:.{decimals}f}"
        if float(text) < 1:  # 0.9996 rounds up to a dollar: then two decimals, as any dollar figure
            return f"{sign}${text.rstrip('0').rstrip('.')}"
    return f"{sign}${amount:.2f}"

"""Small, dependency-free HTML for rich reprs (``_repr_mimebundle_``): escaped text, one table style.

The reprs show in Jupyter, on GitHub's notebook viewer and in exported pages alike, so they use
plain tables with inline styles (no classes, no scripts) and always come with a text/plain twin.
"""

from __future__ import annotations

import html
import json
from collections.abc import Iterable, Sequence
from typing import Any

__all__ = ["bundle", "escape", "json_block", "table"]

_CELL = "padding:2px 8px;text-align:left;border-bottom:1px solid #d0d7de;font-size:12px"


def escape(value: Any) -> str:
    return html.escape("" if value is None else str(value))


def table(header: Sequence[str], rows: Iterable[Sequence[Any]], *, caption: str = "") -> str:
    """An HTML table of escaped cells (a caption above it, if given)."""
    head = "".join(f'<th style="{_CELL}">{escape(h)}</th>' for h in header)
    body = "".join("<tr>" + "".join(f'<td style="{_CELL}">{escape(c)}</td>' for c in row) + "</tr>" for row in rows)
    title = f'<div style="font-weight:600;margin:4px 0">{escape(caption)}</div>' if caption else ""
    return f'{title}<table style="border-collapse:collapse"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


def json_block(value: Any, limit: int = 20_000) -> str:
    """Pretty JSON in a <pre>, cut at ``limit`` characters."""
    text = json.dumps(value, indent=2, ensure_ascii=False, default=repr)
    if len(text) > limit:
        text = text[:limit] + f"\n... ({len(text):,} characters in all)"
    return f'<pre style="margin:2px 0;font-size:11px;white-space:pre-wrap">{escape(text)}</pre>'


def bundle(text: str, body: str) -> dict[str, str]:
    """A mime bundle: the text for terminals and GitHub, the HTML for notebooks."""
    return {"text/plain": text, "text/html": f'<div style="font-family:system-ui,sans-serif">{body}</div>'}

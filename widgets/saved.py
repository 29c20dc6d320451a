"""What a notebook shows of a panel where no live widget can be drawn.

A panel's output holds the widget view and, beside it, ``text/html`` and ``text/plain`` that name
the panel, what it showed when it was displayed and the call that reopens it. JupyterLab draws the
widget (from the kernel, or from the widget state saved with the notebook: installing caravanserai
turns on "Save Widget State Automatically" by default); nbconvert's HTML export, nbviewer and GitHub fall back
to the HTML when no state was saved, and a terminal to the text. Nothing here reads the store again.
"""

from __future__ import annotations

import html
from typing import Any

from caravanserai.stores.urls import redact

__all__ = ["SavedFallback", "reopen_call"]

# summary entries worth a word in the fallback, in the order they are read
_FIELDS = (("status", "{}"), ("attempts", "{} attempt(s)"), ("waypoints", "{} waypoint(s)"), ("calls_text", "{}"),
           ("steps", "{} step(s)"), ("timelines", "{} timeline(s)"), ("forks", "{} fork(s)"),
           ("events", "{} event(s)"), ("runs", "{} run(s)"))


def reopen_call(name: str, *refs: Any, store: Any = None) -> str:
    """The Python call that opens the same panel again, e.g. ``Timeline('five-steps')``; a store is named by
    its URL with passwords, tokens and keys redacted (this text is saved in the notebook)."""
    args = [repr(ref) if isinstance(ref, str) else repr(str(getattr(ref, "run_id", None) or type(ref).__name__))
            for ref in refs]
    where = store_text(store)
    if where:
        args.append(f"store={where!r}")
    return f"{name}({', '.join(args)})"


def store_text(store: Any) -> str:
    """A store (URL or ``Store``) as a notebook may keep it: its URL, secrets redacted; "" for the default."""
    url = store if isinstance(store, str) else getattr(store, "url", None)
    return redact(url) if isinstance(url, str) and url else ""


class SavedFallback:
    """Mixin for a displayed panel: ``_reopen`` (the call) and ``_saved_summary`` (what it showed) feed
    the ``text/html`` and ``text/plain`` kept next to the widget view."""

    _reopen: str = ""

    def _saved_summary(self) -> dict:
        return {}

    def _saved_words(self) -> str:
        summary = self._saved_summary()
        words = [fmt.format(summary[key]) for key, fmt in _FIELDS
                 if isinstance(summary.get(key), (int, str)) and summary[key] != ""]  # Compare's "runs" is a list
        return " · ".join(words)

    def _repr_mimebundle_(self, **kwargs: Any) -> Any:
        shown = super()._repr_mimebundle_(**kwargs)  # type: ignore[misc]
        if shown is None:
            return None
        bundle: dict = shown[0] if isinstance(shown, tuple) else shown  # anywidget: (data, metadata)
        call = self._reopen or type(self).__name__
        words = self._saved_words()
        bundle["text/plain"] = f"{call}" + (f"  # {words}" if words else "") + "  (a caravanserai panel: run this to open it)"
        bundle["text/html"] = (
            '<div class="cvs-saved" style="font:13px/1.45 system-ui,sans-serif;border:1px solid #d0d7de;'
            'border-radius:6px;padding:6px 10px;max-width:56em">'
            f"<code>{html.escape(call)}</code>" + (f" — {html.escape(words)}" if words else "")
            + '<br><span style="opacity:.75">a caravanserai panel saved without its live view: '
            "run the call above in a notebook to open it</span></div>")
        return shown

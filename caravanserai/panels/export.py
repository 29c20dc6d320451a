"""Offline export: panels written into one self-contained HTML file (read-only, no kernel, no network).

The file holds the panels' own JavaScript and CSS (the files the notebook widgets load), the data
of every row and detail for each setting of the panel's switches (rows shared between settings
are stored once), and a small model that answers the panel's window requests from that data. It
opens from disk in any browser: for a paper's appendix, an audit, or a class handout.
"""

from __future__ import annotations

import html
import importlib.util
import itertools
import json
import os
import tempfile
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from .._version import __version__
from ..checkpoints.timelines import parse_ref, resolve_ref
from ..errors import UsageError
from ..runs.lifecycle import require_events
from ..stores import Store, open_store
from .compare import CompareSource
from .lineage import LineageSource
from .source import Source
from .timeline import TimelineSource

__all__ = ["default_title", "export_runs", "render_html", "source_data", "write_html"]

# no network at all: inline scripts and styles, the panels' module from a blob: URL, data: images
CSP = "default-src 'none'; script-src 'unsafe-inline' blob:; style-src 'unsafe-inline'; img-src data:"
TITLES = {"timeline": "Timeline", "compare": "Compare", "lineage": "Lineage"}


def static_dir() -> Path:
    """The widgets' ``static`` folder (found without importing the widget package, which needs anywidget)."""
    spec = importlib.util.find_spec("caravanserai.widgets")
    if spec is None or not spec.submodule_search_locations:
        raise UsageError("the panels' JavaScript is missing from this install; reinstall caravanserai")
    return Path(next(iter(spec.submodule_search_locations))) / "static"


MODULE_PARTS = ("shell.js", "panels.js")  # the panels' one ES module, in two files by responsibility


def panels_module(folder: Path | None = None) -> str:
    """The panels' JavaScript module (what a widget loads and an export inlines): its parts joined in order."""
    folder = folder or static_dir()
    return "\n".join((folder / part).read_text(encoding="utf-8") for part in MODULE_PARTS)


def source_data(source: Source) -> dict[str, Any]:
    """A polled source's rows and details for every combination of its switches (each row stored once)."""
    names = list(source.options)
    saved = {name: source.option(name) for name in names}
    row_pool: list[dict] = []
    detail_pool: list[dict] = []
    row_ids: dict[str, int] = {}
    detail_ids: dict[str, int] = {}
    variants: dict[str, dict] = {}

    def pooled(value: dict, pool: list[dict], ids: dict[str, int]) -> int:
        key = json.dumps(value, sort_keys=True, ensure_ascii=False, default=repr)
        if key not in ids:
            ids[key] = len(pool)
            pool.append(value)
        return ids[key]

    try:
        for combo in itertools.product(*(source.options[name] for name in names)):
            for name, value in zip(names, combo, strict=True):
                source.set_option(name, value)
            total = source.count()
            variants[json.dumps(list(combo), separators=(",", ":"))] = {  # the key JSON.stringify makes
                "rows": [pooled(row, row_pool, row_ids) for row in source.rows(0, total)],
                "details": [pooled(source.detail(i), detail_pool, detail_ids) for i in range(total)],
                "traits": source.traits(),
            }
    finally:
        for name, value in saved.items():
            source.set_option(name, value)
    return {"panel": source.panel, "summary": source.summary(), "options": names, "state": saved,
            "variants": variants, "row_pool": row_pool, "detail_pool": detail_pool}


def render_html(sources: list[Source], title: str | None = None, headings: list[str] | None = None) -> str:
    """The HTML text of ``sources`` (each already polled), one section each.

    ``title`` is the page's one ``<h1>`` (default: the run(s) shown, ``default_title``); each
    section is headed by its panel (``headings``, default ``Timeline: RUN`` ...).
    """
    folder = static_dir()
    css = (folder / "panels.css").read_text(encoding="utf-8")
    boot = (folder / "export.js").read_text(encoding="utf-8")
    panels = [source_data(source) for source in sources]
    for i, panel in enumerate(panels):
        panel["heading"] = headings[i] if headings else _heading(sources[i], panel)
        panel["anchor"] = f"cvs-section-{i}"
    payload = {"js": panels_module(folder), "panels": panels}
    data = json.dumps(payload, ensure_ascii=False, separators=(",", ":"), default=repr).replace("<", "\\u003c")
    title = title or default_title(panels)
    when = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    sections = "\n".join(f'<section class="cvs-export-section" id="{p["anchor"]}" data-panel="{p["panel"]}">'
                         + ("" if p["heading"] == title else f'<h2>{html.escape(p["heading"])}</h2>')  # the title once
                         + f'<div class="cvs-mount" data-index="{i}"></div></section>'
                         for i, p in enumerate(panels))
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">
<meta http-equiv="Content-Security-Policy" content="{CSP}">
<title>{html.escape(title)}</title>
<style>{css}</style>
<style>body.cvs-export{{font-family:system-ui,-apple-system,"Segoe UI",sans-serif;margin:24px auto;max-width:1200px;
padding:0 16px;color:#1f2328}}
.cvs-export h1{{font-size:20px;margin:0 0 4px}}.cvs-export h2{{font-size:16px;margin:28px 0 8px}}
.cvs-export .cvs-export-note{{color:#59636e;font-size:12px;margin:0 0 12px}}</style>
</head><body class="cvs-export">
<h1>{html.escape(title)}</h1>
<p class="cvs-export-note">Exported by caravanserai {__version__} on {when}. Read-only: everything is in this file;
it needs no network.</p>
{sections}
<script type="application/json" id="cvs-data">{data}</script>
<script type="module">{boot}</script>
</body></html>
"""


def default_title(panels: list[dict]) -> str:
    """The page's one title when none is given: the run(s) it shows (``Run a``, ``Runs a and b``)."""
    names: list[str] = []
    for panel in panels:
        summary = panel["summary"]
        for ref in [summary.get("run_id"), *summary.get("runs", [])]:
            name = str(ref).split("@", 1)[0] if ref else ""
            if name and name not in names:
                names.append(name)
    if not names:
        return "caravanserai export"
    if len(names) == 1:
        return f"Run {names[0]}"
    shown = names if len(names) <= 4 else [*names[:3], f"{len(names) - 3} more"]
    return f"Runs {', '.join(shown[:-1])} and {shown[-1]}"


def _heading(source: Source, panel: dict) -> str:
    summary = panel["summary"]
    what = summary.get("run_id") or " vs ".join(summary.get("runs", []))
    return f"{TITLES.get(source.panel, source.panel)}: {what}"


def write_html(path: str | os.PathLike[str], sources: list[Source], title: str | None = None,
               headings: list[str] | None = None) -> str:
    """Write ``sources`` to ``path`` atomically (a reader never sees half a file); returns the path."""
    text = render_html(sources, title, headings)
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, temp = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
        os.replace(temp, target)
    except BaseException:
        Path(temp).unlink(missing_ok=True)
        raise
    return str(target)


def export_runs(refs: list[str], path: str | os.PathLike[str], store: Store | str | None = None, *,
                lineage: bool = True, compare: bool = True) -> str:
    """``caravanserai export``: each run's Timeline, the Lineage of the first, and a Compare of them all (2+)."""
    if not refs:
        raise UsageError("export needs at least one run id, e.g. caravanserai export RUN --html run.html")
    resolved = open_store(store)
    refs = [resolve_ref(ref, resolved) for ref in refs]
    for ref in refs:
        require_events(parse_ref(ref)[0], resolved)  # a missing run: RunNotFound, and nothing is written
    sources: list[Source] = []
    for ref in refs:
        sources.append(TimelineSource(parse_ref(ref)[0], resolved))
    if lineage:
        sources.append(LineageSource(refs[0], resolved))
    if compare and len(refs) > 1:
        sources.append(CompareSource(refs, resolved))
    for source in sources:
        source.poll()
    return write_html(path, sources)

"""Compare's rows: two or more timelines aligned step by step, the shared prefix folded, the first divergence marked.

One row per aligned step (the shared prefix is one row until unfolded); each timeline is a
column with the step's output word-diffed against the first timeline, and its tokens, seconds and
USD with their deltas. ``jump`` is the row of the first divergence: the panel scrolls there on
first paint. Word diffs are made only for the rows a reader shows; the alignment is
``checkpoints.timelines.compare``, the same as ``caravanserai diff``.
"""

from __future__ import annotations

from typing import Any, ClassVar

from ..checkpoints.log import CheckpointLog
from ..checkpoints.timelines import Comparison, compare, parse_ref, resolve_ref, timeline, word_diff
from ..errors import UsageError
from ..stores import Store, open_store
from .source import Source

__all__ = ["CompareSource", "clip_diff"]

ROW_CHARS = 240  # characters of a diffed value shown in a row (the detail pane shows it all)


def clip_diff(ops: list[tuple[str, str]], limit: int = ROW_CHARS) -> list[list[str]]:
    """A word diff cut to about ``limit`` characters, starting a little before the first change."""
    first_change = next((i for i, (op, _) in enumerate(ops) if op != "="), None)
    out: list[list[str]] = []
    used = 0
    for i, (op, text) in enumerate(ops):
        if first_change is not None and i < first_change and i == first_change - 1 and len(text) > 40:
            text = "…" + text[-40:]
        elif first_change is not None and i < first_change - 1:
            continue
        if used + len(text) > limit:
            out.append([op, text[: max(0, limit - used)] + "…"])
            break
        out.append([op, text])
        used += len(text)
    return out


class CompareSource(Source):
    """``CompareSource(["run-a", "run-b@3fa9c1..."], store)``: the first ref is the baseline."""

    panel = "compare"
    options: ClassVar[dict[str, tuple]] = {"only_diff": (False, True), "fold": (True, False)}

    def __init__(self, refs: list[str] | tuple[str, ...], store: Store | str | None = None, *,
                 only_diff: bool = False, fold: bool = True) -> None:
        if len(refs) < 2:
            raise UsageError("Compare needs two timelines or more, e.g. Compare('run-a', 'run-a-fork-3')")
        self.store = open_store(store)
        self.refs = [resolve_ref(r, self.store) for r in refs]
        self.only_diff = only_diff
        self.fold = fold
        self.result = Comparison(tuple(self.refs))
        self._stamps: list[Any] = []
        self._order: list[tuple[str, int]] = []  # ("shared", 0) | ("step", index into result.steps)
        self._logs: dict[str, CheckpointLog] = {}
        self._labels: list[str] = list(self.refs)

    def poll(self) -> bool:
        stamps = [self.store.last_updated(parse_ref(r)[0]) for r in self.refs]
        if stamps == self._stamps and self._order:
            return False
        lines = [(r, timeline(r, self.store, log=self._log(r))) for r in self.refs]
        self._labels = [getattr(steps, "label", ref) for ref, steps in lines]  # which checkpoint each run stands for
        self.result = compare(*lines)
        self._stamps = stamps
        self.rebuild()
        return True

    def _log(self, ref: str) -> CheckpointLog:
        """One CheckpointLog per run, kept: a live refresh reuses the checkpoints it rebuilt."""
        run = parse_ref(ref)[0]
        if run not in self._logs:
            self._logs[run] = CheckpointLog(self.store, run)
        return self._logs[run]

    def rebuild(self) -> None:
        result, order = self.result, []
        folded = self.fold and not self.only_diff and result.shared_prefix > 1  # "differences only" hides it too
        if folded:
            order.append(("shared", 0))
        for index, step in enumerate(result.steps):
            if folded and index < result.shared_prefix:
                continue
            if self.only_diff and step["same"]:
                continue
            order.append(("step", index))
        self._order = order

    def count(self) -> int:
        return len(self._order)

    def rows(self, start: int, stop: int) -> list[dict]:
        return [self._row(kind, index) for kind, index in self._order[start:stop]]

    def _row(self, kind: str, index: int) -> dict:
        result = self.result
        if kind == "shared":
            first = result.steps[0]["step"]
            return {"kind": "shared", "first": first, "last": first + result.shared_prefix - 1,
                    "count": result.shared_prefix}
        step = result.steps[index]
        texts, changes = result.texts(index), result.changes(index)
        base = texts[0] or ""
        cells: list[dict[str, Any]] = []
        for i, cell in enumerate(step["cells"]):
            if cell is None:
                cells.append({"missing": True})
                continue
            text = texts[i] or ""
            changed = [c for c in changes[i] if "path" in c]
            if changed and not step["same"]:  # a notebook step: the variables that changed, old → new
                ops = [op for c in changed for op in (("=", f"{c['path']}: "), ("-", c["old"]), ("+", c["new"]), ("=", "  "))]
            else:
                ops = [("=", text)] if i == 0 or step["same"] else word_diff(base, text)
            first = step["cells"][0]
            cells.append({**{k: cell[k] for k in ("tokens", "usd", "latency_s", "d_tokens", "d_usd", "d_latency_s")},
                          "text": clip_diff(ops), "prompt_changed": cell["prompt"] != first["prompt"] if first else False,
                          "code_changed": cell["code"] != first["code"] if first else False,
                          "changed": [c["path"] for c in changed][:5], "note": cell["note"]})
        return {"kind": "step", "step": step["step"], "same": step["same"],
                "first": step["step"] == result.first_divergence, "cells": cells}

    def detail(self, index: int) -> dict:
        kind, position = self._order[index]
        result = self.result
        if kind == "shared":
            return {"title": f"steps {result.steps[0]['step']}–{result.steps[0]['step'] + result.shared_prefix - 1} "
                             "are the same in every timeline (untick “fold shared steps” to see them)"}
        step = result.steps[position]
        texts, changes = result.texts(position), result.changes(position)
        base = step["cells"][0] or {}
        columns = []
        for i, ref in enumerate(self.refs):
            cell = step["cells"][i]
            if cell is None:
                columns.append({"run": ref, "missing": True})
                continue
            parts: dict[str, Any] = {}
            for name, old, new in (("prompt", base.get("prompt"), cell["prompt"]), ("note", base.get("note"), cell["note"]),
                                   ("output", texts[0], texts[i])):
                if new is None and old is None:
                    continue
                parts[name] = [list(op) for op in (word_diff(old or "", new or "") if i else [("=", new or "")])]
            if changes[i]:  # a notebook step: which variables changed, old → new, and the cell's code diff
                parts["changes"] = [c for c in changes[i] if "path" in c]
                parts["code_diff"] = next((c["diff"] for c in changes[i] if "diff" in c), None)
            columns.append({"run": ref, **parts, **{k: cell[k] for k in ("tokens", "usd", "latency_s", "d_tokens",
                                                                         "d_usd", "d_latency_s")}})
        verdict = "the same in every timeline" if step["same"] else "different"
        first = " — the first divergence" if step["step"] == result.first_divergence else ""
        return {"title": f"step {step['step']}: {verdict}{first}", "columns": columns}

    def summary(self) -> dict:
        result = self.result
        totals = result.totals()
        base = totals[0] if totals else {}
        for total in totals[1:]:
            for key in ("tokens", "usd", "latency_s"):
                mine, theirs = total[key], base.get(key)
                total[f"d_{key}"] = None if mine is None or theirs is None else round(mine - theirs, 9)
        return {"runs": list(self.refs), "labels": list(self._labels), "shared_prefix": result.shared_prefix,
                "first_divergence": result.first_divergence, "steps": len(result.steps),
                "different": sum(1 for s in result.steps if not s["same"]), "totals": totals}

    def traits(self) -> dict:
        """``jump``: the row of the first divergence (-1 if the timelines never diverge)."""
        first = self.result.first_divergence
        jump = next((row for row, (kind, index) in enumerate(self._order)
                     if kind == "step" and self.result.steps[index]["step"] == first), -1)
        return {"jump": jump}


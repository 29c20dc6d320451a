"""The ``research-loop`` cell the notebook-fork tests share (in-process, real kernel, browser): a
``%%resumable`` loop over 20 items filling ``results[i] = EXPR`` and ``seen.add(i % 7)``."""

from __future__ import annotations


def research_loop(head: str, expr: str, *, pace: float = 0.0) -> str:
    """The cell ``%%resumable HEAD`` computing ``EXPR`` per item; ``pace``: seconds per item, each item
    printed first (a real kernel is SIGKILLed mid-loop)."""
    paced = f'    print(f"item {{i}}", flush=True)\n    time.sleep({pace})\n' if pace else ""
    return (f"%%resumable {head}\n" + ("import time\n" if pace else "") + "from caravanserai import resumable_iterate\n"
            "results = {}\nseen = set()\nfor i in resumable_iterate(range(20)):\n" + paced +
            f"    results[i] = {expr}\n    seen.add(i % 7)\nlen(results)\n")

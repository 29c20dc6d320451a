"""Notebook forks at scale: Compare and diff two 10,000-step notebook forks on their variables, and fork a 10,000-waypoint run.

    python benchmarks/bench_notebook_forks.py [--steps 10000] [--dir PATH] [--quick] [--no-browser]

1. Builds, in a local store inside a fresh ``bench-nbforks-XXXX`` next to the repo, a
   ``--steps``-waypoint notebook run whose every waypoint saves 5 variables the way a
   ``%%resumable`` cell does (``Snapshotter``: an int, a float, a short string, a set, a list),
   and two forks of it at the middle waypoint, each continued to ``--steps`` waypoints by
   different code (its own cell source), so the first divergence is the step after the fork.
2. Measures, in this process: **a fork of the ``--steps``-waypoint run** (``caravanserai.fork``
   at its last waypoint: the copied journal, the saved variables, the lease); **Compare built**
   (``CompareSource`` reading and aligning both forks, ``poll``), its first window of rows (what
   the panel paints first) and **the jump** (the row of the first divergence and the window around
   it, as the panel scrolls there); **``caravanserai diff``** of the two forks (in-process, output
   discarded; and as a fresh process, interpreter start included). Each is printed as a ratio to
   its floor measured in the same run: copying the parent's journal file with an fsync (a fork),
   reading the two forks' journals and parsing every line with orjson (Compare, diff).
3. In Debian's Chromium against JupyterLab (skipped with ``--no-browser`` or without Chromium):
   ``Compare`` of the two forks built in a cell and displayed in the next, page clock from the
   display cell sent to the first rows drawn and to the divergence row drawn selected.
Targets (issue 21): build + first paint < 1 s, jump < 200 ms, diff < 1 s, fork < 100 ms.
Prints tables and PASS/MISS lines (a report: exit status 0 either way) and writes
``benchmarks/results/notebook_forks.json``. ``--quick``: 1,000 steps.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from _common import REPO, fmt_ratio, fmt_time, machine_notes, md_table, parse_args, save_results, say, say_verdict, workdir

sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))

import caravanserai  # noqa: E402
from caravanserai.cli import main as cli_main  # noqa: E402
from caravanserai.panels.compare import CompareSource  # noqa: E402
from caravanserai.runs.lifecycle import RunScope  # noqa: E402
from caravanserai.runs.snapshots import Snapshotter  # noqa: E402
from caravanserai.stores import LocalStore  # noqa: E402

TARGETS = {"build_and_first_paint_s": 1.0, "jump_s": 0.2, "diff_s": 1.0, "fork_s": 0.1}
WINDOW = 60  # rows a panel asks for at first paint
CELL = "%%resumable {run}\nfor i in range(len(seen), {steps}):\n    total += i * {k}\n    checkpoint({{}}, f'item {{i}}')\n"


def write_steps(store: LocalStore, run_id: str, start: int, stop: int, k: float, cell: str) -> None:
    """Waypoints ``start``..``stop - 1`` of a notebook run, each saving its 5 variables as a cell does."""
    namespace: dict[str, Any] = {"i": 0, "total": 0.0, "label": "", "seen": set(), "recent": []}
    with RunScope(run_id, store) as run:
        run.describe(cell_source=cell, definition_sha256=caravanserai.journal.digest({"cell": cell}))
        saved = run.notebook.saved.get("values")
        snapshot = Snapshotter(namespace, list(namespace), objects=store.objects, run_id=run_id, store_url=store.url)
        if saved:
            snapshot.restore(saved)
        run.notebook.capture = lambda: {"values": snapshot.capture(), "at": 1}
        for i in range(start, stop):
            namespace["i"], namespace["label"] = i, f"item {i}"
            namespace["total"] += i * k
            namespace["seen"].add(i % 7)
            namespace["recent"] = (namespace["recent"] + [i * k])[-5:]
            run.checkpoint({"i": i}, f"processed item {i + 1}/{stop}")
        run.notebook.capture = None


def build(store: LocalStore, steps: int) -> dict:
    half = steps // 2
    t0 = time.perf_counter()
    write_steps(store, "nb", 0, steps, 1, CELL.format(run="nb", steps=steps, k=1))
    built = time.perf_counter() - t0
    for name, k in (("nb-cubes", 3), ("nb-halves", 0.5)):
        cell = CELL.format(run=name, steps=steps, k=k)
        caravanserai.fork("nb", at=half, new_run_id=name, store=store, started={"cell_source": cell})
        write_steps(store, name, half, steps, k, cell)
    caravanserai.runs.close_all()
    return {"build_parent_s": built, "half": half}


def measure_fork(store: LocalStore, at: int, rounds: int) -> list[float]:
    """Seconds per ``caravanserai.fork`` of the big run at waypoint ``at`` (its journal read and verified,
    the prefix copied with its saved variables, the lease taken and released, the views written)."""
    times = []
    for r in range(rounds):
        t0 = time.perf_counter()
        caravanserai.fork("nb", at=at, new_run_id=f"nb-at-{at}-{r}", store=store)
        times.append(time.perf_counter() - t0)
    return times


def measure_floors(store_path: Path, steps: int, rounds: int) -> dict:
    """What the same work costs at the bottom, in this process: for a fork, copying the parent's journal
    file and fsyncing it (no parsing, no re-hashing, no views); for Compare and diff, reading the two
    forks' journal files and parsing every line with orjson (no verification, no alignment)."""
    import orjson

    parent = store_path / "nb" / "journal.jsonl"
    copies, reads = [], []
    for r in range(rounds):
        target = store_path.parent / f"floor-copy-{r}.jsonl"
        t0 = time.perf_counter()
        with open(parent, "rb") as src, open(target, "wb") as dst:
            dst.write(src.read())
            dst.flush()
            os.fsync(dst.fileno())
        copies.append(time.perf_counter() - t0)
        target.unlink()
        t0 = time.perf_counter()
        for run in ("nb-cubes", "nb-halves"):
            for line in (store_path / run / "journal.jsonl").read_bytes().splitlines():
                orjson.loads(line)
        reads.append(time.perf_counter() - t0)
    return {"copy_journal_s": copies, "parse_two_journals_s": reads}


def measure_compare(store: LocalStore, rounds: int) -> dict:
    build_s, paint_s, jump_s = [], [], []
    first = None
    for _ in range(rounds):
        t0 = time.perf_counter()
        source = CompareSource(["nb-cubes", "nb-halves"], store)
        source.poll()
        t1 = time.perf_counter()
        source.rows(0, WINDOW)
        t2 = time.perf_counter()
        jump = source.traits()["jump"]
        rows = source.rows(max(0, jump - WINDOW // 2), jump + WINDOW // 2)
        source.detail(jump)
        t3 = time.perf_counter()
        build_s.append(t1 - t0)
        paint_s.append(t2 - t1)
        jump_s.append(t3 - t2)
        first = source.summary()["first_divergence"], rows[0]
    return {"build_s": build_s, "first_window_s": paint_s, "jump_s": jump_s, "first_divergence": first[0] if first else None}


def measure_diff(store_path: Path, rounds: int) -> dict:
    inproc = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        with contextlib.redirect_stdout(io.StringIO()) as out:
            cli_main(["--store", str(store_path), "diff", "nb-cubes", "nb-halves"])
        inproc.append(time.perf_counter() - t0)
    text = out.getvalue()
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "caravanserai", "--store", str(store_path), "diff", "nb-cubes", "nb-halves"],
                   check=True, capture_output=True)
    return {"in_process_s": inproc, "process_s": time.perf_counter() - t0, "head": text.splitlines()[:1],
            "names_results": "recent[" in text or "total:" in text}


def measure_browser(root: Path, store_path: Path) -> dict | str:
    from bench_forks import PAGE_PROBE  # the same page clock as the agent-run Compare
    from browser_helpers import JupyterServer, browser_missing, chromium, notebook, open_notebook, run_cell, wait_idle

    missing = browser_missing()
    if missing:
        return missing
    notebook(root / "bench.ipynb", [
        f"import time\nfrom caravanserai.widgets import Compare\nSTORE = {str(store_path)!r}",
        "t0 = time.perf_counter(); cmp = Compare('nb-cubes', 'nb-halves', store=STORE); built = time.perf_counter() - t0; "
        "open('built.txt', 'w').write(str(built))",
        "cmp"])
    server = JupyterServer(root)
    try:
        with chromium(root / ".chrome", height=1400) as page:
            open_notebook(page, server, "bench.ipynb")
            run_cell(page, 0)
            wait_idle(page)
            page.evaluate(PAGE_PROBE)
            run_cell(page, 1)
            deadline = time.monotonic() + 300
            while not (root / "built.txt").exists():
                assert time.monotonic() < deadline, "building the Compare never finished"
                time.sleep(0.01)
            wait_idle(page, 300_000)
            sent = run_cell(page, 2)
            page.wait_for_function("() => window.__cvs.jumped.length > 0", timeout=60_000)
            painted, jumped = page.evaluate("() => [window.__cvs.painted[0], window.__cvs.jumped[0]]")
            built = float((root / "built.txt").read_text())
            return {"built_s": built, "first_paint_s": (painted - sent) / 1000, "jump_s": (jumped - sent) / 1000}
    finally:
        server.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--no-browser", action="store_true", help="skip the Chromium measurement")
    args = parse_args(parser, "notebook_forks", quick={"steps": 1_000, "rounds": 1})
    steps = args.steps
    results: dict[str, Any] = {}
    with workdir("bench-nbforks-", args) as (root, mount):
        root = Path(root)
        notes = machine_notes() | {"workdir": str(root), "mount": mount, "quick": args.quick, "steps": steps}
        store_path = root / ".caravanserai"
        store = LocalStore(store_path)
        results |= build(store, steps)
        results["fork_s"] = {10: measure_fork(store, 10, args.rounds), steps: measure_fork(store, steps, args.rounds)}
        results["compare"] = measure_compare(store, args.rounds)
        results["diff"] = measure_diff(store_path, args.rounds)
        results["floors"] = measure_floors(store_path, steps, args.rounds)
        results["browser"] = "skipped (--no-browser)" if args.no_browser else measure_browser(root, store_path)
        store.close()
    report(results, steps)
    save_results(args.out, {"notes": notes, "targets": TARGETS, "results": results})
    return 0


def report(results: dict, steps: int) -> None:
    med = statistics.median
    compare, diff = results["compare"], results["diff"]
    say(f"\n{steps:,}-waypoint notebook run (5 variables saved per waypoint) built in {fmt_time(results['build_parent_s'])}; "
        f"two forks at waypoint {results['half']:,}, first divergence found at step {compare['first_divergence']}\n")
    forks = results["fork_s"]
    rows = [(f"fork of the {steps:,}-waypoint run at waypoint 10", fmt_time(med(forks[10]))),
            (f"fork of the {steps:,}-waypoint run at its last waypoint (every waypoint copied)", fmt_time(med(forks[steps]))),
            ("Compare of the two forks: built (read, verified, aligned)", fmt_time(med(compare["build_s"]))),
            (f"  its first window ({WINDOW} rows)", fmt_time(med(compare["first_window_s"]))),
            ("  jump: the divergence row, its window and its detail", fmt_time(med(compare["jump_s"]))),
            ("caravanserai diff, in-process", fmt_time(med(diff["in_process_s"]))),
            ("caravanserai diff, a fresh process", fmt_time(diff["process_s"]))]
    floors = results["floors"]
    copy, parse = med(floors["copy_journal_s"]), med(floors["parse_two_journals_s"])
    ratios = [fmt_ratio(med(forks[10]) / copy), fmt_ratio(med(forks[steps]) / copy), fmt_ratio(med(compare["build_s"]) / parse),
              "", "", fmt_ratio(med(diff["in_process_s"]) / parse), ""]
    rows = [(*row, ratio) for row, ratio in zip(rows, ratios, strict=True)]
    say("\n".join(md_table(("in this process (median)", "time", "× its floor"), rows)))
    say(f"floors: copying the parent's journal file + fsync {fmt_time(copy)} (a fork); reading the two forks' "
        f"journals and parsing every line with orjson {fmt_time(parse)} (Compare, diff)")
    browser = results["browser"]
    if isinstance(browser, dict):
        say("\n" + "\n".join(md_table(("Compare in Chromium (JupyterLab)", "time"), [
            ("built in the kernel", fmt_time(browser["built_s"])),
            ("display cell sent → first rows drawn", fmt_time(browser["first_paint_s"])),
            ("display cell sent → divergence drawn, selected", fmt_time(browser["jump_s"]))])))
        build_paint = browser["built_s"] + browser["first_paint_s"]
        jump = browser["jump_s"] - browser["first_paint_s"]
    else:
        say(f"\nChromium: NOT RUN ({browser})")
        build_paint = med(compare["build_s"]) + med(compare["first_window_s"])
        jump = med(compare["jump_s"])
    say("")
    say_verdict(build_paint < TARGETS["build_and_first_paint_s"], "Compare build + first paint < 1 s", fmt_time(build_paint))
    say_verdict(jump < TARGETS["jump_s"], "Compare jump to the divergence < 200 ms (after first paint)", fmt_time(jump))
    say_verdict(med(diff["in_process_s"]) < TARGETS["diff_s"], "diff < 1 s (in-process)", fmt_time(med(diff["in_process_s"])))
    say_verdict(med(forks[10]) < TARGETS["fork_s"], f"fork of a {steps:,}-waypoint notebook run at waypoint 10 < 100 ms",
                fmt_time(med(forks[10])))
    say_verdict(med(forks[steps]) < TARGETS["fork_s"], f"fork of a {steps:,}-waypoint notebook run at its last waypoint "
                "< 100 ms", fmt_time(med(forks[steps])))


if __name__ == "__main__":
    raise SystemExit(main())

"""The panels in Chromium: first paint, scrolling, live latency and bytes sent, on big runs.

    python benchmarks/bench_panels.py [--waypoints 10000] [--events 100000] [--live 20] [--dir PATH] [--quick]

1. Builds two runs in a local store inside a fresh ``bench-panels-XXXX`` next to the repo: one of
   ``--waypoints`` waypoints (``checkpoint`` in a loop) and one of ``--events`` events (the read
   model benchmark's builder: calls, tool calls, waypoints, loop progress, 10 attempts).
2. Starts JupyterLab on loopback and opens, in Debian's Chromium (Playwright), a notebook that
   builds a ``Timeline`` of each run in one cell (kernel side, timed in the kernel) and displays it
   in the next. Measured in the page's own clock:
   - **first paint**: from the display cell's execution to the panel's first drawn rows (target < 1 s);
   - **scroll to the end**: from setting the scroll position to the last rows drawn with data
     (target < 200 ms);
   - **live latency**: a checkpoint appended by this process to a third run whose Timeline is
     open and scrolled to its end, until its row is drawn (``--live`` samples; target p50 < 250 ms);
   - **bytes sent** to the browser over the kernel's websocket for each Timeline (display + first
     window + the scroll), which should not grow with the run's length;
   and ``RunView.journal_df()`` of the big run in this process (target < 0.5 s).
3. Prints a table and PASS/MISS lines (a report: exit status 0 either way) and writes
   ``benchmarks/results/panels.json``. ``--quick``: 500 waypoints, 5,000 events, 3 live samples;
   without Chromium or Playwright it says so and exits 0.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from _common import REPO, fmt_bytes, fmt_time, machine_notes, md_table, parse_args, save_results, say, say_verdict, workdir

sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))
from bench_read_model import build  # noqa: E402

import caravanserai  # noqa: E402
from caravanserai import inspect_run  # noqa: E402
from caravanserai.stores import LocalStore  # noqa: E402

BIG_RUN = "bench-read-model"  # the name bench_read_model.build writes
TARGETS = {"first_paint_s": 1.0, "scroll_s": 0.2, "live_p50_s": 0.25, "journal_df_s": 0.5}

PAGE_PROBE = """() => {
  window.__cvs = {painted: []};  // the page time each panel first drew rows with data, in display order
  const seen = new WeakSet();
  new MutationObserver(() => {
    for (const panel of document.querySelectorAll('.cvs-panel')) {
      if (!seen.has(panel) && panel.querySelector('.cvs-rows .cvs-row:not(.cvs-loading)')) {
        seen.add(panel);
        window.__cvs.painted.push(performance.now());
      }
    }
  }).observe(document.body, {subtree: true, childList: true});
}"""

SCROLL = """async (index) => {
  const panel = document.querySelectorAll('.cvs-panel')[index];
  const scroller = panel.querySelector('.cvs-scroller');
  const t0 = performance.now();
  scroller.scrollTop = scroller.scrollHeight;
  scroller.dispatchEvent(new Event('scroll'));
  while (performance.now() - t0 < 10000) {
    await new Promise(r => requestAnimationFrame(r));
    const rows = panel.querySelectorAll('.cvs-rows .cvs-row');
    const last = rows[rows.length - 1];
    if (last && !last.classList.contains('cvs-loading') && Number(last.dataset.index) >= 0 &&
        Number(last.dataset.index) >= Number(panel.dataset.total || 0) - 1) return performance.now() - t0;
  }
  return null;
}"""


def bench_cells(panels: list[tuple[str, str, str]]) -> list[str]:
    """Per panel: a cell that builds it (timed in the kernel, then a marker file) and one that displays it."""
    cells = ["%load_ext caravanserai\nimport json, time\nfrom caravanserai.widgets import Timeline\nbuilt = {}"]
    for i, (label, run_id, store) in enumerate(panels):
        cells.append(f"t0 = time.perf_counter(); p{i} = Timeline({run_id!r}, store={store!r}, live={label == 'live'}); "
                     f"built[{label!r}] = time.perf_counter() - t0; open('built-{i}', 'w').write('1')")
        cells.append(f"p{i}")
    cells.append("open('construct.json', 'w').write(json.dumps(built))")
    return cells


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--waypoints", type=int, default=10_000)
    parser.add_argument("--events", type=int, default=100_000)
    parser.add_argument("--live", type=int, default=20, help="live-latency samples")
    args = parse_args(parser, "panels", quick={"waypoints": 500, "events": 5_000, "live": 3})
    from browser_helpers import JupyterServer, browser_missing, chromium, notebook, open_notebook, run_cell, wait_idle

    missing = browser_missing()
    if missing:
        say(f"NOT RUN: {missing}")
        return 0
    results: dict[str, Any] = {}
    with workdir("bench-panels-", args) as (root, mount):
        root = Path(root)
        notes = machine_notes() | {"workdir": str(root), "mount": mount, "quick": args.quick}
        store_path = root / ".caravanserai"
        store = LocalStore(store_path)
        with caravanserai.durable("waypoints-run", store=store) as run:
            for i in range(args.waypoints):
                run.checkpoint({"i": i}, f"waypoint **{i}** of {args.waypoints}")
        built = build(store, args.events)
        small_path = root / "small" / ".caravanserai"  # the same kind of run, a tenth as long
        small = LocalStore(small_path)
        small_built = build(small, args.events // 10)
        caravanserai.checkpoint("live-run", {"i": -1}, "start", store=store)
        caravanserai.runs.close_all()
        view = inspect_run(BIG_RUN, store)
        view.journal_df()
        samples = []
        for _ in range(3):
            t0 = time.perf_counter()
            view.journal_df()
            samples.append(time.perf_counter() - t0)
        results["journal_df_s"] = statistics.median(samples)
        panels = [("waypoints", "waypoints-run", str(store_path)), ("events-small", BIG_RUN, str(small_path)),
                  ("events", BIG_RUN, str(store_path)), ("live", "live-run", str(store_path))]
        notebook(root / "bench.ipynb", bench_cells(panels))
        server = JupyterServer(root)
        try:
            with chromium(root / ".chrome", height=1600) as page:
                frames: list[int] = []
                page.on("websocket", lambda ws: ws.on("framereceived", lambda payload: frames.append(len(payload))))
                open_notebook(page, server, "bench.ipynb")
                page.evaluate(PAGE_PROBE)
                run_cell(page, 0)
                wait_idle(page)
                for i, (label, _, _) in enumerate(panels):
                    run_cell(page, 1 + 2 * i)
                    deadline = time.monotonic() + 120
                    while not (root / f"built-{i}").exists():
                        assert time.monotonic() < deadline, f"building the {label} panel never finished"
                        time.sleep(0.01)
                    wait_idle(page)
                    before = sum(frames)
                    sent = run_cell(page, 2 + 2 * i)
                    page.wait_for_function("(n) => window.__cvs.painted.length > n", arg=i, timeout=60_000)
                    painted = page.evaluate("(n) => window.__cvs.painted[n]", i)
                    wait_idle(page)
                    scroll = page.evaluate(SCROLL, i)
                    page.wait_for_timeout(300)
                    results[label] = {"first_paint_s": (painted - sent) / 1000,
                                      "scroll_s": None if scroll is None else scroll / 1000, "bytes_sent": sum(frames) - before}
                latencies = []
                panel = page.locator(".cvs-panel").nth(len(panels) - 1)
                for k in range(args.live):
                    panel.locator("button", has_text="end").click()
                    note = f"live sample {k}"
                    t_append = time.time()
                    caravanserai.checkpoint("live-run", {"k": k}, note, store=store)
                    caravanserai.runs.close_all()
                    panel.locator(".cvs-row", has_text=note).wait_for(timeout=10_000)
                    latencies.append(time.time() - t_append)
                results["live_s"] = latencies
                run_cell(page, 1 + 2 * len(panels))
                wait_idle(page)
                page.wait_for_timeout(300)
                results["construct_s"] = json.loads((root / "construct.json").read_text())
        finally:
            server.stop()
        small.close()
        store.close()
    live_p50 = statistics.median(results["live_s"]) if results["live_s"] else None
    rows = []
    names = {"waypoints": f"{args.waypoints:,} waypoints", "events-small": f"{small_built:,} events",
             "events": f"{built:,} events"}
    for label, name in names.items():
        r = results[label]
        rows.append((name, fmt_time(results["construct_s"][label]), fmt_time(r["first_paint_s"]), fmt_time(r["scroll_s"]),
                     fmt_bytes(r["bytes_sent"])))
    say("\n".join(md_table(("Timeline of", "built in the kernel", "display to first paint", "scroll to the end",
                             "bytes sent"), rows)))
    say(f"\nlive: append to row drawn, {len(results['live_s'])} samples: p50 {fmt_time(live_p50)}, "
        f"max {fmt_time(max(results['live_s']) if results['live_s'] else None)}")
    say(f"journal_df() of {built:,} events: {fmt_time(results['journal_df_s'])}\n")
    worst_paint = max(results[r]["first_paint_s"] for r in names)
    worst_scroll = max(results[r]["scroll_s"] or 99 for r in names)
    say_verdict(worst_paint < TARGETS["first_paint_s"], "display to first paint < 1 s", fmt_time(worst_paint))
    say_verdict(worst_scroll < TARGETS["scroll_s"], "scroll to the end < 200 ms", fmt_time(worst_scroll))
    say_verdict(live_p50 is not None and live_p50 < TARGETS["live_p50_s"], "live p50 < 250 ms", fmt_time(live_p50))
    say_verdict(results["journal_df_s"] < TARGETS["journal_df_s"], "journal_df() < 0.5 s", fmt_time(results["journal_df_s"]))
    ratio = results["events"]["bytes_sent"] / max(1, results["events-small"]["bytes_sent"])
    say(f"bytes sent for the {built:,}-event run / the {small_built:,}-event run of the same kind: {ratio:.2f}x "
        "(independent of length: ~1x)")
    save_results(args.out, {"notes": notes, "targets": TARGETS, "results": results})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

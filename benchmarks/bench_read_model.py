"""The read model on a big journal: ``inspect_run`` and ``RunView.journal_df()`` on 100,000 events.

    python benchmarks/bench_read_model.py [--events 100000] [--repeats 5] [--dir PATH] [--keep] [--quick]

1. Builds one run of ``--events`` events in a ``LocalStore`` (the default local directory store) inside a fresh
   ``bench-view-XXXX`` next to the repo (the real disk; ``--dir`` moves it), through the run's
   own writer (``durable()`` + ``run.append`` in batches of 1,000, so building costs ~100 fsyncs,
   not 100,000): 10 attempts (9 cut short, the last completed), and per step of 10 events a priced
   model call (``call_started`` + ``call_settled``), a read tool call (``tool_intent`` +
   ``tool_settled``), a waypoint with state, a loop's ``progress`` + its note-only waypoint, an
   unpriced model call and a ``turn``; the figures are what the ledger revalidates.
2. Times, each ``--repeats`` times (median reported, every sample in the JSON):
   - ``inspect_run(run_id, store)``: read + verify (hash chain) + the one pass + revalidation;
   - ``RunView.from_events(run_id, events)``: the pass alone, on events already decoded;
   - ``view.journal_df()`` (target: < 0.5 s for 100,000 events) and ``view.calls_df()``, after one
     untimed ``journal_df()`` (the first call imports pandas; its time is reported on its own).
3. Prints a table, PASS/MISS against the target (a report: exit status 0 either way) and writes
   ``benchmarks/results/read_model.json``. ``--quick``: 2,000 events, 2 repeats, JSON in the temp dir.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from _common import REPO, fmt_time, machine_notes, md_table, parse_args, save_results, say, say_verdict, workdir

sys.path.insert(0, str(REPO))
from caravanserai import durable, inspect_run  # noqa: E402
from caravanserai.calls.pricing import estimate_usd, price_for  # noqa: E402
from caravanserai.journal import digest  # noqa: E402
from caravanserai.runs import RunView, read_events  # noqa: E402
from caravanserai.stores import LocalStore  # noqa: E402

RUN_ID = "bench-read-model"
TARGET_S = 0.5  # journal_df() of 100,000 events
STEP_EVENTS = 10
BATCH = 1000
ATTEMPTS = 10


def settled(call_id: str, model: str, prompt: int, completion: int) -> dict:
    """A ``call_settled`` event whose figures pass the ledger's revalidation."""
    return {"type": "call_settled", "path": "bench", "kind": "model", "call": {
        "call_id": call_id, "request_sha256": digest(call_id), "provider": "bench", "model": model,
        "usage": {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
                  "cached_tokens": 0},
        "estimated_usd": estimate_usd(model, prompt, completion), "price_per_million": price_for(model),
        "response": {"text": f"answer {call_id}"}}}


def step_events(i: int) -> list[dict]:
    """The 10 events of step ``i``."""
    priced, unpriced, tool = f"bench#{3 * i + 1}", f"bench#{3 * i + 2}", f"bench/lookup#{3 * i + 3}"
    return [
        {"type": "call_started", "path": "bench", "kind": "model", "provider": "bench", "model": "gpt-4o-mini",
         "call_id": priced, "request_sha256": digest(priced)},
        settled(priced, "gpt-4o-mini", 40 + i % 17, 8 + i % 5),
        {"type": "tool_intent", "path": "bench/lookup", "tool": "lookup", "call_id": tool, "effect": "read",
         "args_sha256": digest({"i": i}), "args": {"i": i}},
        {"type": "tool_settled", "path": "bench/lookup", "tool": "lookup", "call_id": tool, "result": {"row": i}},
        {"type": "waypoint", "n": 2 * i + 1, "note": f"step {i}: looked up row {i}", "state": {"step": i}},
        {"type": "progress", "loop": 0, "done": i + 1, "items": [f"{i:016x}"], "note": f"processed item {i + 1}/?"},
        {"type": "waypoint", "n": 2 * i + 2, "note": f"processed item {i + 1}/?", "loop": 0},
        {"type": "call_started", "path": "bench", "kind": "model", "provider": "bench", "model": "mystery-llm",
         "call_id": unpriced, "request_sha256": digest(unpriced)},
        settled(unpriced, "mystery-llm", 30, 6),
        {"type": "turn", "messages": [{"role": "assistant", "content": f"step {i} done"}]},
    ]


def build(store: LocalStore, events: int) -> int:
    """Write the run: ``ATTEMPTS`` durable() blocks sharing the steps; returns the events written."""
    steps = max(1, events // STEP_EVENTS)
    per_attempt = -(-steps // ATTEMPTS)
    for attempt in range(ATTEMPTS):
        todo = range(attempt * per_attempt, min(steps, (attempt + 1) * per_attempt))
        last = attempt == ATTEMPTS - 1
        try:
            with durable(RUN_ID, store=store) as run:
                batch: list[dict] = []
                for i in todo:
                    batch += step_events(i)
                    if len(batch) >= BATCH:
                        run.append(*batch)
                        batch = []
                if batch:
                    run.append(*batch)
                if not last:
                    raise KeyboardInterrupt  # this attempt ends with no end recorded: "killed" in the view
        except KeyboardInterrupt:
            pass
    return len(read_events(RUN_ID, store))


def timed(repeats: int, fn: Callable[[], Any]) -> tuple[list[float], Any]:
    samples, value = [], None
    for _ in range(repeats):
        t0 = time.perf_counter()
        value = fn()
        samples.append(time.perf_counter() - t0)
    return samples, value


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=100_000, help="events in the journal (default 100,000)")
    parser.add_argument("--repeats", type=int, default=5, help="timed runs of each operation (default 5)")
    args = parse_args(parser, "read_model", quick={"events": 2_000, "repeats": 2})
    results: dict[str, Any] = {}
    with workdir("bench-view-", args, tmpfs_note=" (only the build's fsyncs; the timed reads are CPU-bound)") as (root, mount):
        notes = machine_notes() | {"workdir": str(root), "mount": mount, "quick": args.quick, "repeats": args.repeats}
        store = LocalStore(Path(root) / ".caravanserai")
        t0 = time.perf_counter()
        count = build(store, args.events)
        notes["build_s"] = time.perf_counter() - t0
        notes["journal_bytes"] = sum(len(line) + 1 for line in store.load(RUN_ID))
        say(f"built {count:,} events ({notes['journal_bytes'] / 1e6:.1f} MB journal) in {notes['build_s']:.1f} s\n")
        events = read_events(RUN_ID, store)
        samples, view = timed(args.repeats, lambda: inspect_run(RUN_ID, store))
        results["inspect_run"] = samples
        results["from_events"], _ = timed(args.repeats, lambda: RunView.from_events(RUN_ID, events))
        results["first_df_incl_import"], _ = timed(1, view.journal_df)  # pandas is imported on first use
        results["journal_df"], frame = timed(args.repeats, view.journal_df)
        results["calls_df"], calls = timed(args.repeats, view.calls_df)
        store.close()
    medians = {name: statistics.median(values) for name, values in results.items()}
    shape = {"events": view.events, "attempts": len(view.attempts), "waypoints": len(view.waypoints),
             "calls": len(view.calls), "journal_df_rows": len(frame), "calls_df_rows": len(calls),
             "status": view.status, "usd": view.receipt.estimated_usd}
    say(f"{shape['events']:,} events: {shape['attempts']} attempts, {shape['waypoints']:,} waypoints, "
        f"{shape['calls']:,} calls, status {shape['status']}; median of {args.repeats} runs each\n")
    rows = [
        ("inspect_run (read + verify + pass)", fmt_time(medians["inspect_run"]), f"{medians['inspect_run'] / count * 1e6:.2f}"),
        ("RunView.from_events (the pass)", fmt_time(medians["from_events"]), f"{medians['from_events'] / count * 1e6:.2f}"),
        ("view.journal_df()", fmt_time(medians["journal_df"]), f"{medians['journal_df'] / count * 1e6:.2f}"),
        ("first journal_df() (imports pandas)", fmt_time(medians["first_df_incl_import"]), "-"),
        ("view.calls_df()", fmt_time(medians["calls_df"]), f"{medians['calls_df'] / max(1, len(calls)) * 1e6:.2f} per call"),
    ]
    table = md_table(("operation", "median", "us per event"), rows, header_align="lrr")
    say("\n".join(table))
    scaled = medians["journal_df"] * 100_000 / count
    passed = scaled < TARGET_S
    detail = f"{fmt_time(medians['journal_df'])} for {count:,} events" + (
        "" if count == 100_000 else f" (scaled to 100,000: {fmt_time(scaled)})")
    say("")
    say_verdict(passed, f"journal_df() of 100,000 events < {TARGET_S} s", detail)
    save_results(args.out, {"notes": notes, "shape": shape, "medians_s": medians, "samples_s": results,
                            "target": {"journal_df_100k_s": TARGET_S, "scaled_s": scaled, "pass": passed},
                            "table": table}, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""One benchmark pass over whichever ``caravanserai`` this interpreter imports.

Run by ``bench_foundation.py`` under both the real 0.2.0 (its own venv, cwd outside the repo,
``python -I``, a copy of this file and ``_common.py`` outside the repo) and this repo's package.
The same code measures both; only ``every=`` is skipped on 0.2.0, which does not have it. Prints
one ``RESULT {json}`` line.

Usage: python _bench_worker.py --expect {0.2.0|ours} --workdir DIR [--n 2000] [--big-reps 40]
       [--items 10000] [--repo /work/main]
"""

from __future__ import annotations

import argparse
import gc
import inspect
import json
import os
import platform
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # _common, also under python -I
from _common import best_of, describe, emit_result, install_fsync_counter, nearest_rank, time_each, which_caravanserai  # noqa: E402

FSYNC = install_fsync_counter()  # before caravanserai is imported: every fsync/fdatasync, all threads


def big_state(step: int) -> dict:
    """~1 MB of JSON: 5,000 small dicts. Deterministic, identical on both sides."""
    return {"step": step, "rows": [{"id": i, "name": f"record-{i:05d}", "ok": i % 3 == 0, "score": round(i * 0.37, 2),
                                    "tags": ["alpha", "beta", "gamma"], "text": "lorem ipsum dolor sit amet " * 4}
                                   for i in range(5000)]}


def drain_views() -> float | None:
    """Ours renders 0.2.0-style view files on a background thread; time waiting for it (ours only)."""
    try:
        from caravanserai import open_store
    except ImportError:  # 0.2.0
        return None
    store = open_store()
    if not hasattr(store, "flush_views"):
        return None
    t0 = time.perf_counter()
    store.flush_views()
    return time.perf_counter() - t0


def time_checkpoints(n: int, call) -> dict:
    """``call(i)`` for i in range(n), each timed on its own, after a gc.collect(): the latency summary,
    fsyncs per call, loop total and the views drain after it."""
    gc.collect()
    with FSYNC.delta() as syncs:
        t0 = time.perf_counter()
        samples = time_each(n, call)
        loop_s = time.perf_counter() - t0
    return describe(samples) | {"fsyncs_per_checkpoint": syncs["calls"] / n, "loop_total_s": loop_s,
                                "views_drain_s": drain_views()}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--expect", choices=["0.2.0", "ours"], required=True)
    parser.add_argument("--workdir", required=True)
    parser.add_argument("--n", type=int, default=2000)
    parser.add_argument("--big-reps", type=int, default=40)
    parser.add_argument("--items", type=int, default=10000)
    parser.add_argument("--repo", default=None, help="repo root: ours must import REPO/caravanserai, 0.2.0 must not")
    args = parser.parse_args()

    found = which_caravanserai(args.repo, args.expect)
    from caravanserai import checkpoint, resumable_iterate

    tag = f"[worker {args.expect}]"
    print(f"{tag} python {platform.python_version()} {sys.executable}\n{tag} caravanserai: metadata "
          f"{found['metadata']}, __version__ {found['version_attr']}, file {found['file']}", file=sys.stderr)
    os.makedirs(args.workdir, exist_ok=True)
    os.chdir(args.workdir)  # both default to ./.caravanserai in the cwd
    os.environ.pop("CARAVANSERAI_STORE", None)
    try:
        has_every = "every" in inspect.signature(resumable_iterate).parameters
    except (TypeError, ValueError):
        has_every = False
    result: dict = {"impl": args.expect, "version_metadata": found["metadata"], "version_attr": found["version_attr"],
                    "module_file": found["file"], "python": platform.python_version(), "executable": sys.executable,
                    "workdir": os.getcwd(), "params": {"n": args.n, "big_reps": args.big_reps, "items": args.items}}

    # ---- (a) small checkpoint latency -----------------------------------------------------
    for i in range(10):  # warm-up: directory creation, first-write costs, lock
        checkpoint("bench-small", {"step": -i}, f"warmup {i}")
    result["small"] = time_checkpoints(args.n, lambda i: checkpoint("bench-small", {"step": i}, f"note {i}"))

    # ---- (b) ~1 MB checkpoint ---------------------------------------------------------------
    states = [big_state(i) for i in range(args.big_reps + 2)]
    for i in range(2):
        checkpoint("bench-big", states[i], f"warmup {i}")
    drain_views()
    result["big"] = time_checkpoints(args.big_reps, lambda i: checkpoint("bench-big", states[i + 2], f"big note {i}")) | {
        "state_bytes_compact_json": len(json.dumps(states[0], separators=(",", ":")).encode()),
        "state_bytes_indent2_json": len(json.dumps(states[0], indent=2).encode())}
    states.clear()  # the ~1 MB states: not needed by the iterate measurement
    gc.collect()

    # ---- (c) resumable_iterate per-item overhead -------------------------------------------
    items = list(range(args.items))

    def plain_loop() -> None:
        acc = 0
        for x in items:
            acc += x

    baseline = best_of(plain_loop) / len(items)
    result["plain_loop_per_item_us"] = baseline * 1e6
    modes: list[tuple[str, dict]] = [("default", {})]
    if has_every:
        modes += [("every=100", {"every": 100}), ("every='50ms'", {"every": "50ms"})]
    result["iterate"] = {}
    perf = time.perf_counter
    for label, kwargs in modes:
        run_id = "".join(c if c.isalnum() or c in "-_." else "-" for c in "bench-iter-" + label.replace("'", ""))
        gaps: list[float] = []
        gc.collect()
        acc, last = 0, None
        with FSYNC.delta() as syncs:
            t0 = perf()
            for x in resumable_iterate(items, run_id, **kwargs):
                now = perf()
                if last is not None:
                    gaps.append(now - last)
                last = now
                acc += x
            total = perf() - t0
        per_item = total / len(items)
        gaps.sort()
        result["iterate"][label] = {
            "total_s": total, "per_item_us": (per_item - baseline) * 1e6,
            "median_gap_us": statistics.median(gaps) * 1e6 if gaps else None,
            "p99_gap_us": nearest_rank(gaps, 0.99) * 1e6 if gaps else None,
            "fsyncs_per_item": syncs["calls"] / len(items), "fsyncs_total": syncs["calls"],
            "views_drain_s": drain_views()}
        print(f"{tag} iterate {label}: {total:.2f}s, {per_item * 1e6:.1f} us/item, {syncs['calls']} syncs", file=sys.stderr)
    result["fsync_counts_total"] = dict(FSYNC.by_name)
    emit_result(result)


if __name__ == "__main__":
    main()

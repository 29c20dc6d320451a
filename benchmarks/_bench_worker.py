"""One benchmark pass over whichever ``caravanserai`` this interpreter imports.

Run by ``bench_foundation.py`` under both the real 0.2.0 (its own venv, cwd outside the repo,
``python -I``) and this repo's package. The same code measures both; only ``every=`` is skipped
on 0.2.0, which does not have it. Prints one JSON object on the last line of stdout.

Usage: python _bench_worker.py --expect {0.2.0|ours} --workdir DIR [--n 2000] [--big-reps 40]
       [--items 10000] [--repo /work/main]
"""

from __future__ import annotations

import argparse
import gc
import importlib.metadata
import inspect
import json
import os
import platform
import statistics
import sys
import threading
import time

# ---- fsync/fdatasync counters (installed before caravanserai is imported; both look the
# functions up on the ``os`` module at call time, so wrapping them here catches every call) ----
_SYNC_COUNTS = {"fsync": 0, "fdatasync": 0}
_SYNC_LOCK = threading.Lock()


def _wrap(name: str):
    real = getattr(os, name, None)
    if real is None:
        return

    def counted(fd):
        with _SYNC_LOCK:
            _SYNC_COUNTS[name] += 1
        return real(fd)

    counted.__wrapped__ = real
    setattr(os, name, counted)


_wrap("fsync")
_wrap("fdatasync")


def sync_total() -> int:
    with _SYNC_LOCK:
        return _SYNC_COUNTS["fsync"] + _SYNC_COUNTS["fdatasync"]


def pct(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100)."""
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, int(round(q / 100 * len(ordered) + 0.5)) - 1))
    return ordered[index]


def summary_us(samples_ns: list[int]) -> dict:
    us = [s / 1000 for s in samples_ns]
    return {
        "n": len(us),
        "median_us": statistics.median(us),
        "p90_us": pct(us, 90),
        "p99_us": pct(us, 99),
        "mean_us": statistics.fmean(us),
        "min_us": min(us),
        "max_us": max(us),
    }


def big_state(step: int) -> dict:
    """~1 MB of JSON: 5,000 small dicts. Deterministic, identical on both sides."""
    return {
        "step": step,
        "rows": [
            {
                "id": i,
                "name": f"record-{i:05d}",
                "ok": i % 3 == 0,
                "score": round(i * 0.37, 2),
                "tags": ["alpha", "beta", "gamma"],
                "text": "lorem ipsum dolor sit amet " * 4,
            }
            for i in range(5000)
        ],
    }


def drain_views() -> float | None:
    """Ours renders 0.2.0-style view files on a background thread; time waiting for it (ours only)."""
    try:
        from caravanserai import open_store  # type: ignore
    except Exception:
        return None
    store = open_store()
    if not hasattr(store, "flush_views"):
        return None
    t0 = time.perf_counter()
    store.flush_views()
    return time.perf_counter() - t0


def time_checkpoints(n: int, call) -> tuple[list[int], float, int, float | None]:
    """``call(i)`` for i in range(n), each call timed on its own (ns), after a gc.collect().

    Returns (samples, loop total in s, fsyncs + fdatasyncs during the loop, views drain after it).
    """
    perf = time.perf_counter_ns
    gc.collect()
    samples: list[int] = []
    s0 = sync_total()
    t_all = perf()
    for i in range(n):
        t0 = perf()
        call(i)
        samples.append(perf() - t0)
    loop_s = (perf() - t_all) / 1e9
    syncs = sync_total() - s0
    return samples, loop_s, syncs, drain_views()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--expect", choices=["0.2.0", "ours"], required=True)
    parser.add_argument("--workdir", required=True)
    parser.add_argument("--n", type=int, default=2000)
    parser.add_argument("--big-reps", type=int, default=40)
    parser.add_argument("--items", type=int, default=10000)
    parser.add_argument("--repo", default=None, help="repo root: ours must import REPO/caravanserai, 0.2.0 must not")
    args = parser.parse_args()

    import caravanserai
    from caravanserai import checkpoint, resumable_iterate

    # ---- which caravanserai is this? -------------------------------------------------------
    dist_version = importlib.metadata.version("caravanserai")
    attr_version = getattr(caravanserai, "__version__", None)
    where = os.path.realpath(caravanserai.__file__)
    # the repo's own package dir (the 0.2.0 venv also lives under the repo, in benchmarks/)
    in_repo = bool(args.repo) and where.startswith(os.path.join(os.path.realpath(args.repo), "caravanserai") + os.sep)
    if args.expect == "0.2.0":
        ok = dist_version == "0.2.0" and not in_repo
    else:
        ok = in_repo or not args.repo
    print(
        f"[worker {args.expect}] python {platform.python_version()} {sys.executable}\n"
        f"[worker {args.expect}] caravanserai: metadata {dist_version}, __version__ {attr_version}, file {where}",
        file=sys.stderr,
    )
    if not ok:
        sys.exit(f"[worker {args.expect}] imported the wrong caravanserai ({dist_version} from {where})")

    os.makedirs(args.workdir, exist_ok=True)
    os.chdir(args.workdir)  # both default to ./.caravanserai in the cwd
    os.environ.pop("CARAVANSERAI_STORE", None)
    try:
        has_every = "every" in inspect.signature(resumable_iterate).parameters
    except (TypeError, ValueError):
        has_every = False
    result: dict = {
        "impl": args.expect,
        "version_metadata": dist_version,
        "version_attr": attr_version,
        "module_file": where,
        "python": platform.python_version(),
        "executable": sys.executable,
        "workdir": os.getcwd(),
        "params": {"n": args.n, "big_reps": args.big_reps, "items": args.items},
    }
    perf = time.perf_counter_ns

    # ---- (a) small checkpoint latency -----------------------------------------------------
    run_id = "bench-small"
    for i in range(10):  # warm-up: directory creation, first-write costs, lock
        checkpoint(run_id, {"step": -i}, f"warmup {i}")
    samples, loop_s, syncs, drain = time_checkpoints(args.n, lambda i: checkpoint(run_id, {"step": i}, f"note {i}"))
    result["small"] = summary_us(samples) | {
        "fsyncs_per_checkpoint": syncs / args.n,
        "loop_total_s": loop_s,
        "views_drain_s": drain,
    }

    # ---- (b) ~1 MB checkpoint ---------------------------------------------------------------
    run_id = "bench-big"
    states = [big_state(i) for i in range(args.big_reps + 2)]
    compact = len(json.dumps(states[0], separators=(",", ":")).encode())
    pretty = len(json.dumps(states[0], indent=2).encode())
    for i in range(2):
        checkpoint(run_id, states[i], f"warmup {i}")
    drain_views()
    samples, loop_s, syncs, drain = time_checkpoints(args.big_reps,
                                                     lambda i: checkpoint(run_id, states[i + 2], f"big note {i}"))
    result["big"] = summary_us(samples) | {
        "fsyncs_per_checkpoint": syncs / args.big_reps,
        "state_bytes_compact_json": compact,
        "state_bytes_indent2_json": pretty,
        "loop_total_s": loop_s,
        "views_drain_s": drain,
    }
    states.clear()  # the ~1 MB states: not needed by the iterate measurement
    gc.collect()

    # ---- (c) resumable_iterate per-item overhead -------------------------------------------
    items = list(range(args.items))

    def plain_loop() -> float:
        acc = 0
        t0 = perf()
        for x in items:
            acc += x
        return (perf() - t0) / 1e9 / len(items)

    baseline = min(plain_loop() for _ in range(5))
    result["plain_loop_per_item_us"] = baseline * 1e6

    modes: list[tuple[str, dict]] = [("default", {})]
    if has_every:
        modes += [("every=100", {"every": 100}), ("every='50ms'", {"every": "50ms"})]
    result["iterate"] = {}
    for label, kwargs in modes:
        run_id = "bench-iter-" + label.replace("=", "-").replace("'", "")
        run_id = "".join(c if c.isalnum() or c in "-_." else "-" for c in run_id)
        gaps: list[int] = []
        gc.collect()
        s0 = sync_total()
        acc = 0
        last = None
        t0 = perf()
        for x in resumable_iterate(items, run_id, **kwargs):
            now = perf()
            if last is not None:
                gaps.append(now - last)
            last = now
            acc += x
        total = (perf() - t0) / 1e9
        syncs = sync_total() - s0
        drain = drain_views()
        per_item = total / len(items)
        result["iterate"][label] = {
            "total_s": total,
            "per_item_us": (per_item - baseline) * 1e6,
            "median_gap_us": statistics.median(gaps) / 1000 if gaps else None,
            "p99_gap_us": pct([g / 1000 for g in gaps], 99) if gaps else None,
            "fsyncs_per_item": syncs / len(items),
            "fsyncs_total": syncs,
            "views_drain_s": drain,
        }
        print(f"[worker {args.expect}] iterate {label}: {total:.2f}s, {per_item * 1e6:.1f} us/item, {syncs} syncs", file=sys.stderr)

    result["fsync_counts_total"] = dict(_SYNC_COUNTS)
    print(json.dumps(result))


if __name__ == "__main__":
    main()

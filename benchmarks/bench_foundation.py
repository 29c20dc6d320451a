"""Side-by-side benchmark: the real caravanserai 0.2.0 (PyPI) against this repo's package.

    python benchmarks/bench_foundation.py [--dir PATH] [--quick] [--rounds 3] [--keep] [--out FILE]

1. Creates once (cached) ``benchmarks/.venv-cvs020`` with ``pip install caravanserai==0.2.0``
   (not with ``--quick``: then 0.2.0 runs only if that venv is already there).
2. Runs the same worker (``benchmarks/_bench_worker.py``) under 0.2.0's python (``-I``, cwd
   outside the repo, a copy of the worker outside the repo: it cannot import ours) and under
   this interpreter with the repo on ``PYTHONPATH``; each worker checks and prints which
   ``caravanserai`` it imported.
3. Interleaves 0.2.0, ours, 0.2.0, ours... for ``--rounds`` rounds (disk fsync latency is
   noisy) and reports, per metric, the median across rounds.
4. Work directories live on the real disk: by default a fresh ``bench-tmp-XXXX`` next to the
   repo (never tmpfs), removed afterwards.

Prints a table (metric | 0.2.0 | ours | ratio = 0.2.0/ours, >1 means ours is faster), PASS/MISS
for the issue's targets (a report, exit status 0 either way) and writes the raw numbers to
``benchmarks/results/foundation.json``.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

from _common import (
    HERE,
    REPO,
    fmt_ratio,
    fmt_time,
    fmt_us,
    machine_notes,
    md_table,
    median_of,
    parse_args,
    peer_python,
    run_result_worker,
    save_results,
    say,
    say_verdict,
    workdir,
    worker_command,
)

VENV_020 = HERE / ".venv-cvs020"
WORKER = HERE / "_bench_worker.py"
TARGET_CHECKPOINT_RATIO = 2.0  # ours at least 2x faster per checkpoint, while fsyncing
TARGET_GROUP_COMMIT_RATIO = 100.0  # iterate every=100 per-item overhead vs 0.2.0's per item

# (key, label, path into a worker result, unit); values are "lower is better".
METRICS = [
    ("ckpt_median", "checkpoint {step} median", ("small", "median_us"), "us"),
    ("ckpt_p90", "checkpoint {step} p90", ("small", "p90_us"), "us"),
    ("ckpt_p99", "checkpoint {step} p99", ("small", "p99_us"), "us"),
    ("ckpt_mean", "checkpoint {step} mean", ("small", "mean_us"), "us"),
    ("big_median", "checkpoint ~1 MB median", ("big", "median_us"), "us"),
    ("big_p90", "checkpoint ~1 MB p90", ("big", "p90_us"), "us"),
    ("iter_default", "iterate per item, default", ("iterate", "default", "per_item_us"), "us"),
    ("iter_every100", "iterate per item, every=100", ("iterate", "every=100", "per_item_us"), "us"),
    ("iter_every50ms", "iterate per item, every='50ms'", ("iterate", "every='50ms'", "per_item_us"), "us"),
    ("iter_default_gap", "iterate median gap, default", ("iterate", "default", "median_gap_us"), "us"),
    ("fsync_small", "fsyncs per checkpoint {step}", ("small", "fsyncs_per_checkpoint"), "count"),
    ("fsync_big", "fsyncs per checkpoint ~1 MB", ("big", "fsyncs_per_checkpoint"), "count"),
    ("fsync_iter_default", "fsyncs per item, default", ("iterate", "default", "fsyncs_per_item"), "count"),
    ("fsync_iter_every100", "fsyncs per item, every=100", ("iterate", "every=100", "fsyncs_per_item"), "count"),
    ("fsync_iter_every50ms", "fsyncs per item, every='50ms'", ("iterate", "every='50ms'", "fsyncs_per_item"), "count"),
    ("views_drain_small", "views drain after {n} ckpts", ("small", "views_drain_s"), "s"),
    ("views_drain_big", "views drain after {big} x ~1 MB", ("big", "views_drain_s"), "s"),
    ("big_loop", "{big} x ~1 MB loop total", ("big", "loop_total_s"), "s"),
    ("iter_default_total", "iterate default, loop total", ("iterate", "default", "total_s"), "s"),
]


def run_worker(impl: str, python: Path, scratch: Path, args: argparse.Namespace) -> dict:
    worker = WORKER
    if impl == "0.2.0":
        # A copy of the worker (and _common) outside the repo, -I, cwd outside the repo: only the
        # venv's caravanserai 0.2.0 can be imported.
        for path in (WORKER, HERE / "_common.py"):
            shutil.copyfile(path, scratch / path.name)
        worker = scratch / WORKER.name
    cmd, env = worker_command(python, worker, ["--expect", impl, "--workdir", str(scratch / "work"), "--n", str(args.n),
                                               "--big-reps", str(args.big_reps), "--items", str(args.items)],
                              ours=impl == "ours")
    result = run_result_worker(cmd, cwd=scratch, env=env, timeout=3600, label=f"worker {impl}", echo="[worker")
    if "error" in result:
        sys.exit(result["error"])
    return result


def dig(result: dict, path: tuple) -> float | None:
    value = result
    for key in path:
        if not isinstance(value, dict) or key not in value:
            return None
        value = value[key]
    return value if isinstance(value, (int, float)) else None


def fmt(value: float | None, unit: str) -> str:
    if unit == "count":
        return "n/a" if value is None else f"{value:.2f}"
    return fmt_time(value) if unit == "s" else fmt_us(value)


def build_table(rounds: list[dict], args: argparse.Namespace) -> tuple[list[tuple[str, ...]], dict]:
    medians: dict = {}
    rows = []
    for key, label, path, unit in METRICS:
        old = median_of(dig(r.get("0.2.0", {}), path) for r in rounds)
        new = median_of(dig(r["ours"], path) for r in rounds)
        # 0.2.0 has no every=: its only mode is one checkpoint per item, compare against that.
        if old is None and path[0] == "iterate" and path[1] != "default" and path[-1] == "per_item_us":
            old = median_of(dig(r.get("0.2.0", {}), ("iterate", "default", "per_item_us")) for r in rounds)
            label += " (0.2.0: per item)"
        medians[key] = {"0.2.0": old, "ours": new, "unit": unit}
        ratio = None
        if unit != "count" and old is not None and new:
            ratio = medians[key]["ratio"] = old / new
        label = label.format(step='{"step": i}', n=args.n, big=args.big_reps)
        rows.append((label, fmt(old, unit), fmt(new, unit), fmt_ratio(ratio)))
    return rows, medians


def targets(medians: dict) -> list[dict]:
    ck, fs, g = medians["ckpt_median"], medians["fsync_small"], medians["iter_every100"]
    ratio, gratio = ck.get("ratio"), g.get("ratio")
    return [
        {"target": "ours at least 2x faster per checkpoint than 0.2.0 while actually fsyncing",
         "measured": f"checkpoint median ratio {ratio:.2f}x; fsyncs/checkpoint 0.2.0={fs['0.2.0']:.2f}, ours={fs['ours']:.2f}"
         if ratio is not None else "n/a",
         "pass": ratio is not None and ratio >= TARGET_CHECKPOINT_RATIO and (fs["ours"] or 0) >= 1 and (fs["0.2.0"] or 0) == 0},
        {"target": "with group commit at least 100x lower per-item overhead (resumable_iterate every=100 vs 0.2.0 per item)",
         "measured": f"per-item ratio {gratio:,.0f}x ({fmt_us(g['0.2.0'])} vs {fmt_us(g['ours'])})"
         if gratio is not None else "n/a",
         "pass": gratio is not None and gratio >= TARGET_GROUP_COMMIT_RATIO},
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds per implementation (default 3)")
    parser.add_argument("--n", type=int, default=2000, help="small checkpoints per worker (default 2,000)")
    parser.add_argument("--big-reps", type=int, default=40, help="~1 MB checkpoints per worker (default 40)")
    parser.add_argument("--items", type=int, default=10_000, help="resumable_iterate items per mode (default 10,000)")
    args = parse_args(parser, "foundation", quick={"rounds": 1, "n": 100, "big_reps": 4, "items": 1000})

    py020, why = peer_python(VENV_020, {"caravanserai": "0.2.0"}, "import caravanserai", install=not args.quick)
    impls = [("0.2.0", py020)] if py020 else []
    impls.append(("ours", Path(sys.executable)))
    say(f"0.2.0: {py020 or f'NOT RUN: {why}'}\nours:  {sys.executable} (PYTHONPATH={REPO})")
    rounds: list[dict] = []
    with workdir("bench-tmp-", args, tmpfs_note=", these are CPU-only numbers", with_options=True) as (root, mount):
        notes = machine_notes("host_python") | {"workdir": str(root), "mount": mount, "quick": args.quick,
                                                "rounds": args.rounds, "not_run": {} if py020 else {"0.2.0": why}}
        say(f"N={args.n} checkpoints, {args.big_reps} x ~1 MB, {args.items} iterate items, {args.rounds} interleaved rounds\n")
        for index in range(args.rounds):
            current: dict = {}
            for impl, python in impls:
                say(f"round {index + 1}/{args.rounds}: {impl} ...")
                scratch = root / f"r{index + 1}-{impl}"
                scratch.mkdir()
                current[impl] = run_worker(impl, python, scratch, args)
                say(f"   done in {current[impl]['process_wall_s']:.1f} s")
                if not args.keep:
                    shutil.rmtree(scratch, ignore_errors=True)
            rounds.append(current)

    rows, medians = build_table(rounds, args)
    say(f"\nmedians across {args.rounds} rounds ({notes['date_utc']}, {mount['fstype']} {mount['device']}, "
        f"{notes['cpu_count']} CPUs, Python {notes['host_python']}):\n")
    table = md_table(("metric", "0.2.0", "ours", "ratio (0.2.0/ours)"), rows, header_align="llll")
    say("\n".join(table))
    big = rounds[0]["ours"]["big"]
    say(f"\n~1 MB state: {big['state_bytes_compact_json']:,} B compact JSON (ours' journal line), "
        f"{big['state_bytes_indent2_json']:,} B indent=2 (0.2.0's state.json)")
    say("ratio = 0.2.0 / ours: >1 means ours is faster. Iterate per-item = loop time / items - plain loop.")
    say("views drain = time ours' background thread still needed to write the 0.2.0-style view files after the loop.\n")
    verdicts = targets(medians)
    for v in verdicts:
        if py020:
            say_verdict(v["pass"], v["target"], v["measured"])
        else:
            say(f"NOT JUDGED  {v['target']}: 0.2.0 not run")
    save_results(args.out, {"notes": notes, "medians": medians, "targets": verdicts, "table": table, "rounds": rounds},
                 indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())

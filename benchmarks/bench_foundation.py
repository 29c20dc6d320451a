"""Side-by-side benchmark: the real caravanserai 0.2.0 (PyPI) against this repo's package.

    python benchmarks/bench_foundation.py [--dir PATH] [--quick] [--rounds 3]

1. Creates once (cached) ``benchmarks/.venv-cvs020`` with ``pip install caravanserai==0.2.0``.
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
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

from _common import (HERE, REPO, announce_workdir, ensure_venv, machine_notes, make_workdir, md_table, median_of,
                     pip_install, run_code, venv_python, worker_env, write_json)

VENV_020 = HERE / ".venv-cvs020"
WORKER = HERE / "_bench_worker.py"
RESULTS = HERE / "results" / "foundation.json"

TARGET_CHECKPOINT_RATIO = 2.0  # ours at least 2x faster per checkpoint, while fsyncing
TARGET_GROUP_COMMIT_RATIO = 100.0  # iterate every=100 per-item overhead vs 0.2.0's per item


# ---- environment ------------------------------------------------------------------------------
def installed_020_version(python: Path) -> str | None:
    if not python.exists():
        return None
    probe = run_code(python, "import importlib.metadata as m; print(m.version('caravanserai'))")
    return probe.stdout.strip() if probe.returncode == 0 else None


def ensure_020_venv() -> Path:
    python = venv_python(VENV_020)
    if installed_020_version(python) == "0.2.0":
        return python
    print(f"creating {VENV_020} with caravanserai==0.2.0 ...", flush=True)
    ensure_venv(VENV_020)
    pip_install(python, ["caravanserai==0.2.0"])
    version = installed_020_version(python)
    if version != "0.2.0":
        sys.exit(f"{VENV_020}: expected caravanserai 0.2.0, found {version!r}")
    return python


# ---- running the workers ----------------------------------------------------------------------
def run_worker(impl: str, python: Path, workdir: Path, args: argparse.Namespace, scratch: Path) -> dict:
    cmd_args = ["--expect", impl, "--workdir", str(workdir), "--n", str(args.n), "--big-reps", str(args.big_reps),
                "--items", str(args.items), "--repo", str(REPO)]
    env = worker_env()
    if impl == "0.2.0":
        # A copy of the worker outside the repo, -I (no PYTHONPATH, no user site, no script dir on
        # sys.path), cwd outside the repo: only the venv's caravanserai 0.2.0 can be imported.
        worker = scratch / WORKER.name
        shutil.copyfile(WORKER, worker)
        cmd = [str(python), "-I", str(worker), *cmd_args]
    else:
        env["PYTHONPATH"] = str(REPO)
        cmd = [str(python), str(WORKER), *cmd_args]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=str(scratch), env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    for line in proc.stderr.splitlines():
        if line.startswith("[worker"):
            print("   " + line, flush=True)
    if proc.returncode != 0:
        sys.stderr.write(proc.stdout[-4000:] + proc.stderr[-4000:])
        sys.exit(f"worker {impl} failed with exit status {proc.returncode}")
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    result["worker_wall_s"] = wall
    return result


# ---- reporting --------------------------------------------------------------------------------
# (key, label, path into a worker result, unit); values are "lower is better" unless noted.
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
    ("views_drain_small", "views drain after 2000 ckpts (s)", ("small", "views_drain_s"), "s"),
    ("views_drain_big", "views drain after 40 x ~1 MB (s)", ("big", "views_drain_s"), "s"),
    ("big_loop", "40 x ~1 MB loop total (s)", ("big", "loop_total_s"), "s"),
    ("iter_default_total", "iterate default, loop total (s)", ("iterate", "default", "total_s"), "s"),
]


def dig(result: dict, path: tuple) -> float | None:
    value = result
    for key in path:
        if not isinstance(value, dict) or key not in value:
            return None
        value = value[key]
    return value if isinstance(value, (int, float)) else None


def fmt(value: float | None, unit: str) -> str:
    if value is None:
        return "n/a"
    if unit == "count":
        return f"{value:.2f}"
    if unit == "s":
        return f"{value:.3f} s"
    if value >= 1000:
        return f"{value / 1000:.2f} ms"
    if value >= 10:
        return f"{value:.0f} us"
    return f"{value:.2f} us"


def build_table(rounds: list[dict], args: argparse.Namespace) -> tuple[list[tuple[str, str, str, str]], dict]:
    medians: dict = {}
    rows = []
    for key, label, path, unit in METRICS:
        old = median_of([dig(r["0.2.0"], path) for r in rounds])
        new = median_of([dig(r["ours"], path) for r in rounds])
        # 0.2.0 has no every=: its only mode is one checkpoint per item, compare against that.
        if old is None and path[0] == "iterate" and path[-1] == "per_item_us":
            old = median_of([dig(r["0.2.0"], ("iterate", "default", "per_item_us")) for r in rounds])
            label += " (0.2.0: per item)"
        medians[key] = {"0.2.0": old, "ours": new, "unit": unit}
        if unit == "count" or old is None or new is None or new <= 0:
            ratio = "-"
        else:
            ratio = f"{old / new:.1f}x" if old / new < 1000 else f"{old / new:,.0f}x"
            medians[key]["ratio"] = old / new
        rows.append((label.replace("{step}", "{\"step\": i}").replace("2000", str(args.n)), fmt(old, unit), fmt(new, unit), ratio))
    return rows, medians


def print_table(rows: list[tuple[str, str, str, str]]) -> list[str]:
    lines = md_table(("metric", "0.2.0", "ours", "ratio (0.2.0/ours)"), rows, header_align="llll")
    print("\n".join(lines))
    return lines


def targets(medians: dict) -> list[dict]:
    ck = medians["ckpt_median"]
    fs = medians["fsync_small"]
    ratio = ck.get("ratio")
    ok1 = ratio is not None and ratio >= TARGET_CHECKPOINT_RATIO and (fs["ours"] or 0) >= 1 and (fs["0.2.0"] or 0) == 0
    g = medians["iter_every100"]
    gratio = g.get("ratio")
    ok2 = gratio is not None and gratio >= TARGET_GROUP_COMMIT_RATIO
    return [
        {
            "target": "ours at least 2x faster per checkpoint than 0.2.0 while actually fsyncing",
            "measured": f"checkpoint median ratio {ratio:.2f}x; fsyncs/checkpoint 0.2.0={fs['0.2.0']:.2f}, ours={fs['ours']:.2f}"
            if ratio is not None else "n/a",
            "pass": ok1,
        },
        {
            "target": "with group commit at least 100x lower per-item overhead (resumable_iterate every=100 vs 0.2.0 per item)",
            "measured": f"per-item ratio {gratio:,.0f}x ({fmt(g['0.2.0'], 'us')} vs {fmt(g['ours'], 'us')})"
            if gratio is not None else "n/a",
            "pass": ok2,
        },
    ]


# ---- main -------------------------------------------------------------------------------------
def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dir", help="parent directory for the work dirs (default: next to the repo, on the real disk)")
    parser.add_argument("--quick", action="store_true", help="N=500 checkpoints, 2,000 iterate items")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds per implementation (default 3)")
    parser.add_argument("--keep", action="store_true", help="keep the work directories")
    parser.add_argument("--out", default=str(RESULTS), help=f"JSON results file (default {RESULTS.relative_to(REPO)})")
    args = parser.parse_args()
    args.n = 500 if args.quick else 2000
    args.items = 2000 if args.quick else 10000
    args.big_reps = 40

    py020 = ensure_020_venv()
    ours_python = Path(sys.executable)
    workroot = make_workdir("bench-tmp-", args.dir)
    mount = announce_workdir(workroot, tmpfs_note=", these are CPU-only numbers", with_options=True)
    notes = machine_notes("host_python") | {"workdir": str(workroot), "mount": mount, "quick": args.quick,
                                            "rounds": args.rounds}
    print(f"0.2.0: {py020}\nours:  {ours_python} (PYTHONPATH={REPO})")
    print(f"N={args.n} checkpoints, {args.big_reps} x ~1 MB, {args.items} iterate items, {args.rounds} interleaved rounds\n")

    rounds: list[dict] = []
    try:
        for index in range(args.rounds):
            current: dict = {}
            for impl, python in (("0.2.0", py020), ("ours", ours_python)):
                print(f"round {index + 1}/{args.rounds}: {impl} ...", flush=True)
                scratch = workroot / f"r{index + 1}-{impl}"
                scratch.mkdir()
                current[impl] = run_worker(impl, python, scratch / "work", args, scratch)
                print(f"   done in {current[impl]['worker_wall_s']:.1f} s", flush=True)
                if not args.keep:
                    shutil.rmtree(scratch, ignore_errors=True)
            rounds.append(current)
    finally:
        if not args.keep:
            shutil.rmtree(workroot, ignore_errors=True)

    rows, medians = build_table(rounds, args)
    print(f"\nmedians across {args.rounds} rounds ({notes['date_utc']}, {mount['fstype']} {mount['device']}, "
          f"{notes['cpu_count']} CPUs, Python {notes['host_python']}):\n")
    table = print_table(rows)
    big = rounds[0]["ours"]["big"]
    print(f"\n~1 MB state: {big['state_bytes_compact_json']:,} B compact JSON (ours' journal line), "
          f"{big['state_bytes_indent2_json']:,} B indent=2 (0.2.0's state.json)")
    print("ratio = 0.2.0 / ours: >1 means ours is faster. Iterate per-item = loop time / items - plain loop.")
    print("views drain = time ours' background thread still needed to write the 0.2.0-style view files after the loop.\n")
    verdicts = targets(medians)
    for verdict in verdicts:
        print(f"{'PASS' if verdict['pass'] else 'MISS'}  {verdict['target']}\n      {verdict['measured']}")

    out = write_json(args.out, {"notes": notes, "medians": medians, "targets": verdicts, "table": table, "rounds": rounds},
                     indent=2, newline=True)
    print(f"\nraw numbers: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Journaled calls, side by side: ours against LangGraph (functional API) and DBOS, on the real disk.

    python benchmarks/bench_durable_calls.py [--dir PATH] [--quick] [--keep] [--profile] [--out FILE]

Peers (created once, cached, gitignored): ``benchmarks/.venv-peers`` with pinned
``langgraph``, ``langgraph-checkpoint-sqlite`` and ``dbos``. Implementations:

- ours: ``with caravanserai.durable(run_id, store=DIR) as run: run.call_tool(fn, args, name="step")``
  and ``caravanserai.run(agent, input, durable={...})`` with ``ScriptedModel``;
- LangGraph: ``@entrypoint(checkpointer=SqliteSaver(...))`` calling ``@task``s, invoked with
  ``durability="sync"``;
- DBOS: a ``@DBOS.workflow`` calling ``@DBOS.step``s on a SQLite system database.

Scenarios, each in a fresh subprocess (``benchmarks/_durable_calls_worker.py``):

1. overhead per journaled call: N=500 trivial calls returning ~80 B in one run/entrypoint/
   workflow, median over 5 interleaved rounds, next to the fsync floor (write+fdatasync of a
   100 B record) measured in each round;
2. resume of a killed run: a writer makes 10,000 journaled calls and dies with ``os._exit(137)``;
   a fresh process finishes it, timed from after its imports to done, counting re-executed calls;
3. re-run of a finished run id: ours ``run(agent, same input, durable=same id)`` (must not call the
   model), DBOS re-call of a finished workflow id, LangGraph re-invoke of the same thread.

Prints a table (ratio = peer / ours, >1 means ours is faster), PASS/MISS against the targets (a
report: exit status 0 either way) and writes ``benchmarks/results/durable_calls.json``. A peer that
fails to install or run is reported and skipped.
"""

from __future__ import annotations

import argparse
import shutil
import sqlite3
import sys
import time
from pathlib import Path

from _common import (
    HERE,
    PEER_PINS,
    REPO,
    VENV_PEERS,
    loadavg,
    machine_notes,
    md_table,
    parse_args,
    peer_python,
    run_result_worker,
    save_results,
    say,
    say_verdict,
    versions_of,
    workdir,
    worker_command,
)
from _common import fmt_time as fmt_s
from _common import median_of as med

WORKER = HERE / "_durable_calls_worker.py"
PEER_REPORT = [*PEER_PINS, "langchain-core", "ormsgpack", "SQLAlchemy"]
PEERS = ("langgraph", "dbos")
LABEL = {"ours": "ours", "langgraph": "LangGraph @task", "dbos": "DBOS @step"}

TARGET_RESUME_S = 0.100  # resume a killed 10k-call run, 0 calls re-executed
TARGET_RERUN_S = 0.001  # re-run a finished run id, 0 model calls
DOC_CPU_US = 50.0  # durable-peers.md §2.4 target 1 and issue 13: library (user) CPU per call
TARGET_CALL_FLOORS = 1.5  # issue 13: per journaled call <= 1.5x write + fdatasync measured in the same process
DOC_OVER_FLOOR_US = 100.0  # durable-peers.md §2.4 target 1: per-call fsync floor + 100 us


class Runner:
    """``run(impl, scenario, workdir, *args)``: one worker process, its RESULT or {"error": ...}."""

    def __init__(self, peers_python: Path | None, workroot: Path, timeout: float) -> None:
        self.peers_python, self.workroot, self.timeout = peers_python, workroot, timeout

    def __call__(self, impl: str, scenario: str, workdir: Path, *extra: str, expect_rc: int = 0) -> dict:
        workdir.mkdir(parents=True, exist_ok=True)
        ours = impl in ("ours", "floor")
        cmd, env = worker_command(sys.executable if ours else self.peers_python, WORKER,
                                  ["--impl", impl, "--scenario", scenario, "--dir", str(workdir), *extra], ours=ours)
        return run_result_worker(cmd, cwd=workdir, env=env, timeout=self.timeout, label=f"{impl} {scenario}",
                                 expect_rc=expect_rc)


def fmt_n(value: float | None, digits: int = 0) -> str:
    return "n/a" if value is None else f"{value:,.{digits}f}"


def ok(result: dict | None) -> bool:
    return bool(result) and "error" not in result


# ---- the scenarios ----------------------------------------------------------------------------
def scenario_overhead(run: Runner, impls: list[str], args: argparse.Namespace, raw: dict) -> None:
    raw["floor"], raw["overhead"] = [], {impl: [] for impl in impls}
    for r in range(args.repeats):
        floor = run("floor", "floor", run.workroot / f"floor-{r}", "--floor-n", str(args.floor_n))
        raw["floor"].append(floor)
        line = [f"round {r + 1}/{args.repeats}: fsync floor {fmt_s(floor.get('median_us', 0) / 1e6) if ok(floor) else floor}"]
        for impl in impls:
            res = run(impl, "overhead", run.workroot / f"ovh-{impl}-{r}", "--n", str(args.n), "--round", str(r))
            raw["overhead"][impl].append(res)
            if ok(res):
                line.append(f"{LABEL[impl]} {fmt_s(res['total_s'] / res['n'])}/call")
            else:
                line.append(f"{LABEL[impl]} FAILED")
                say(f"   {res['error']}")
        say("   " + "; ".join(line))


def scenario_resume(run: Runner, impls: list[str], args: argparse.Namespace, raw: dict) -> None:
    raw["resume"] = {impl: [] for impl in impls}
    for impl in impls:
        reps = args.resume_repeats if impl == "ours" else args.peer_resume_repeats
        for k in range(reps):
            workdir = run.workroot / f"resume-{impl}-{k}"
            writer = run(impl, "resume_write", workdir, "--big", str(args.big), "--id", "big", expect_rc=137)
            if not ok(writer):
                say(f"   {LABEL[impl]} writer FAILED: {writer['error']}")
                raw["resume"][impl].append({"writer": writer, "error": writer["error"]})
                break
            res = run(impl, "resume", workdir, "--big", str(args.big), "--id", "big")
            res["writer"] = writer
            raw["resume"][impl].append(res)
            if ok(res):
                say(f"   {LABEL[impl]} #{k + 1}: writer {writer['calls']:,} calls then exit 137 "
                    f"({fmt_s(writer['process_wall_s'])}); resume {fmt_s(res['total_s'])}, "
                    f"re-executed {res['re_executed']}, completed={res['completed']}")
            else:
                say(f"   {LABEL[impl]} resume FAILED: {res['error']}")
                break
            if not args.keep:
                shutil.rmtree(workdir, ignore_errors=True)


def scenario_rerun(run: Runner, impls: list[str], args: argparse.Namespace, raw: dict) -> None:
    raw["rerun"] = {}
    for impl in impls:
        workdir = run.workroot / f"rerun-{impl}"
        setup = run(impl, "rerun_setup", workdir, "--id", "fin")
        if not ok(setup):
            say(f"   {LABEL[impl]} setup FAILED: {setup['error']}")
            raw["rerun"][impl] = {"setup": setup, "error": setup["error"]}
            continue
        res = run(impl, "rerun", workdir, "--id", "fin", "--reps", str(args.rerun_reps))
        res["setup"] = setup
        raw["rerun"][impl] = res
        if ok(res):
            executed = res.get("model_requests", res.get("executed_total"))
            say(f"   {LABEL[impl]}: first {fmt_s(res['first_s'])}, warm median {fmt_s(res['warm_median_s'])} "
                f"over {res['reps'] - 1}; executed {executed} in {res['reps']} re-runs")
        else:
            say(f"   {LABEL[impl]} FAILED: {res['error']}")


def scenario_profile(run: Runner, args: argparse.Namespace, raw: dict) -> None:
    """Ours only, under cProfile: the resume and the overhead scenarios (stats next to the JSON)."""
    raw["profiles"] = {}
    workdir = run.workroot / "profile"
    writer = run("ours", "resume_write", workdir, "--big", str(args.big), "--id", "big", expect_rc=137)
    if ok(writer):
        path = args.out.parent / "durable_calls_profile_resume.txt"
        res = run("ours", "resume", workdir, "--big", str(args.big), "--id", "big", "--profile", str(path))
        raw["profiles"]["resume"] = {"file": str(path), "total_s_under_profile": res.get("total_s")}
        say(f"   resume under cProfile: {fmt_s(res.get('total_s'))} -> {path}")
    path = args.out.parent / "durable_calls_profile_overhead.txt"
    res = run("ours", "overhead", workdir / "ovh", "--n", str(args.n), "--profile", str(path))
    raw["profiles"]["overhead"] = {"file": str(path), "total_s_under_profile": res.get("total_s")}
    say(f"   overhead under cProfile: {fmt_s((res.get('total_s') or 0) / args.n)}/call -> {path}")


# ---- the report -------------------------------------------------------------------------------
def summarize(impls: list[str], raw: dict) -> dict:
    s: dict = {"floor_us": med([f.get("median_us") for f in raw.get("floor", []) if ok(f)]),
               "floor_rounds_us": [f.get("median_us") for f in raw.get("floor", []) if ok(f)]}
    for impl in impls:
        rounds = [r for r in raw.get("overhead", {}).get(impl, []) if ok(r)]
        per = {}
        if rounds:
            per["call_s"] = med([r["total_s"] / r["n"] for r in rounds])
            per["overhead_s"] = med([(r["total_s"] - r["plain_loop_us"] / 1e6) / r["n"] for r in rounds])
            per["loop_s"] = med([r["loop_s"] / r["n"] for r in rounds])
            per["cpu_s"] = med([r["cpu_s"] / r["n"] for r in rounds])
            per["user_s"] = med([r["user_s"] / r["n"] for r in rounds])
            per["sys_s"] = med([r["sys_s"] / r["n"] for r in rounds])
            per["repeats"] = len(rounds)
            per["per_round_call_s"] = [r["total_s"] / r["n"] for r in rounds]
            # against the floor the same process measured just before (the disk's latency swings)
            per["call_floors"] = med([r["total_s"] / r["n"] * 1e6 / r["floor_here_us"] for r in rounds
                                      if r.get("floor_here_us")])
            per["floor_here_us"] = med([r.get("floor_here_us") for r in rounds])
            per["loop_floors"] = med([r["loop_s"] / r["n"] * 1e6 / r["floor_here_us"] for r in rounds
                                      if r.get("floor_here_us")])
            if "loop_user_s" in rounds[0]:  # ours: the loop alone, and the run's open and end once per run
                per["loop_user_s"] = med([r["loop_user_s"] / r["n"] for r in rounds])
                if "loop_user_nosync_s" in rounds[0]:
                    per["loop_user_nosync_s"] = med([r["loop_user_nosync_s"] / r["n"] for r in rounds])
                per["run_open_s"] = med([r["open_s"] for r in rounds])
                per["run_close_s"] = med([r["close_s"] for r in rounds])
                per["fsync_wait_s"] = med([r["fsync_wait_s"] / r["n"] for r in rounds])
            per["import_s"] = med([r.get("import_s") for r in rounds])
            if "fsyncs_per_call" in rounds[0]:
                per["fsyncs_per_call"] = med([r["fsyncs_per_call"] for r in rounds])
        resumes = [r for r in raw.get("resume", {}).get(impl, []) if ok(r)]
        if resumes:
            per["resume_s"] = med([r["total_s"] for r in resumes])
            per["resume_open_s"] = med([r.get("open_s") for r in resumes])
            per["resume_loop_s"] = med([r.get("replay_loop_s") for r in resumes])
            per["resume_reexecuted"] = max(r["re_executed"] for r in resumes)
            per["resume_parse_floor_s"] = med([r.get("parse_floor_s") for r in resumes])
            per["resume_journal"] = (resumes[0].get("journal_lines"), resumes[0].get("journal_bytes"))
            per["resume_reexecuted_all"] = [r["re_executed"] for r in resumes]
            per["resume_completed"] = all(r.get("completed") for r in resumes)
            per["resume_runs"] = [r["total_s"] for r in resumes]
            per["writer_s"] = med([r["writer"]["process_wall_s"] for r in resumes])
        rerun = raw.get("rerun", {}).get(impl)
        if ok(rerun):
            per["rerun_first_s"] = rerun["first_s"]
            per["rerun_warm_s"] = rerun["warm_median_s"]
            per["rerun_executed"] = rerun.get("model_requests", rerun.get("executed_total"))
            per["rerun_executed_per_rerun"] = (rerun.get("executed_per_rerun") if impl == "langgraph"
                                               else (per["rerun_executed"] or 0) / rerun["reps"])
            per["rerun_reps"] = rerun["reps"]
        s[impl] = per
    return s


def build_table(impls: list[str], s: dict, args: argparse.Namespace) -> list[str]:
    peers = [p for p in impls if p != "ours"]
    rows: list[tuple] = []

    def row(label: str, key: str, kind: str = "time", ratio: bool = True) -> None:
        values = [s.get(impl, {}).get(key) for impl in impls]
        if kind == "time":
            cells = [fmt_s(v) for v in values]
        elif kind == "floors":
            cells = [f"{v:.1f}x" if v is not None else "n/a" for v in values]
        else:
            cells = [fmt_n(v, 2 if kind == "count2" else 0) for v in values]
        ours = s.get("ours", {}).get(key)
        ratios = []
        for peer in peers:
            peer_value = s.get(peer, {}).get(key)
            if ratio and kind == "time" and ours and peer_value:
                ratios.append(f"{peer_value / ours:,.1f}x")
            else:
                ratios.append("-")
        rows.append((label, *cells, *ratios))

    n, big = args.n, args.big
    row(f"1. per journaled call, whole run / N (N={n})", "call_s")
    row("   overhead per call (minus a plain call)", "overhead_s")
    row("   per call, inside the loop only", "loop_s")
    row("   per call / fsync floor measured by the same process", "call_floors", kind="floors", ratio=False)
    row("   per call inside the loop / fsync floor", "loop_floors", kind="floors", ratio=False)
    row("   CPU per call, user (all threads)", "user_s")
    row("   CPU per call, user, inside the loop only", "loop_user_s", ratio=False)
    row("   the same loop with fdatasync stubbed out (not durable)", "loop_user_nosync_s", ratio=False)
    row("   CPU per call, system (write, fsync...)", "sys_s")
    row("   fsync+fdatasync per call (Python-level)", "fsyncs_per_call", kind="count2", ratio=False)
    row("   waiting in fsync+fdatasync, per call", "fsync_wait_s", ratio=False)
    row("   once per run: open", "run_open_s", ratio=False)
    row("   once per run: end (complete, release, run index)", "run_close_s", ratio=False)
    row(f"2. resume killed {big:,}-call run (after imports)", "resume_s")
    row("   phase: open (ours) / connect (LG) / launch (DBOS)", "resume_open_s", ratio=False)
    row(f"   phase: the loop of {big:,} calls, replayed", "resume_loop_s", ratio=False)
    row("   ours' journal read alone: orjson + SHA-256 per line, kept", "resume_parse_floor_s", ratio=False)
    row(f"   calls re-executed (of {big:,})", "resume_reexecuted", kind="count", ratio=False)
    row(f"   writer: {big:,} calls + exit 137 (process)", "writer_s")
    row("3. re-run finished id: first, fresh process", "rerun_first_s")
    row(f"   re-run finished id: median of {args.rerun_reps - 1} more", "rerun_warm_s")
    row("   model/step calls executed per re-run", "rerun_executed_per_rerun", kind="count2", ratio=False)
    row("import time of the worker (s)", "import_s")
    header = ("metric", *(LABEL[i] for i in impls), *(f"{LABEL[p].split()[0]}/ours" for p in peers))
    return md_table(header, rows, header_align="l" * len(header))


def _x(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}x"


def verdicts(s: dict, args: argparse.Namespace) -> list[dict]:
    ours = s.get("ours", {})
    out = []
    resume, reexec = ours.get("resume_s"), ours.get("resume_reexecuted")
    out.append({"target": f"resume a killed {args.big:,}-call run in <= {TARGET_RESUME_S * 1e3:.0f} ms with 0 calls re-executed",
                "measured": f"median {fmt_s(resume)} over {len(ours.get('resume_runs', []))} "
                            f"({', '.join(fmt_s(v) for v in ours.get('resume_runs', []))}); re-executed "
                            f"{ours.get('resume_reexecuted_all')}; completed={ours.get('resume_completed')}; "
                            f"reading its journal ({fmt_n((ours.get('resume_journal') or (None, None))[0])} lines, "
                            f"{fmt_n((ours.get('resume_journal') or (None, None))[1])} B), parsing each line with orjson, "
                            f"keeping it and its SHA-256, alone takes {fmt_s(ours.get('resume_parse_floor_s'))} here",
                "pass": resume is not None and resume <= TARGET_RESUME_S and reexec == 0 and bool(ours.get("resume_completed"))})
    warm, first, calls = ours.get("rerun_warm_s"), ours.get("rerun_first_s"), ours.get("rerun_executed")
    out.append({"target": f"re-run a finished run id in <= {TARGET_RERUN_S * 1e3:.0f} ms without calling the model",
                "measured": f"median {fmt_s(warm)} over {ours.get('rerun_reps', 1) - 1} re-runs in one process; "
                            f"model requests {calls}",
                "pass": warm is not None and warm <= TARGET_RERUN_S and calls == 0})
    out.append({"target": f"  ... the first re-run in a fresh process (store not yet open) in <= {TARGET_RERUN_S * 1e3:.0f} ms",
                "measured": f"{fmt_s(first)}; model requests {calls}",
                "pass": first is not None and first <= TARGET_RERUN_S and calls == 0})
    floor, call, cpu = ours.get("floor_here_us") or s.get("floor_us"), ours.get("call_s"), ours.get("user_s")
    floors = ours.get("call_floors")
    if floors is not None:
        out.append({"target": f"(issue 13) per journaled call <= {TARGET_CALL_FLOORS:.1f}x the fsync floor of the same process",
                    "measured": f"{floors:.2f}x: {fmt_s(call)} per call (whole run / N), floor (write + fdatasync of "
                                f"100 B) {fmt_s(ours.get('floor_here_us', 0) / 1e6)}; median of per-round ratios over "
                                f"{ours.get('repeats')} round(s); inside the loop only {_x(ours.get('loop_floors'))}, "
                                f"the run's end {fmt_s(ours.get('run_close_s'))} once per run",
                    "pass": floors <= TARGET_CALL_FLOORS})
    if floor and call is not None:
        out.append({"target": f"(peers doc §2.4 target 1) per journaled call <= fsync floor + {DOC_OVER_FLOOR_US:.0f} us",
                    "measured": f"{fmt_s(call)} per call vs floor {fmt_s(floor / 1e6)} (measured by ours' processes) + 100 us = "
                                f"{fmt_s((floor + DOC_OVER_FLOOR_US) / 1e6)}; ours makes {fmt_n(ours.get('fsyncs_per_call'), 2)} "
                                "fdatasyncs per read-tool call (its intent rides on the result's fdatasync)",
                    "pass": call * 1e6 <= floor + DOC_OVER_FLOOR_US})
    if cpu is not None:
        out.append({"target": f"(issue 13, peers doc §2.4 target 1) library CPU <= {DOC_CPU_US:.0f} us per call",
                    "measured": f"{fmt_s(cpu)} user CPU per call (getrusage over the whole run / N: all threads, incl. "
                                f"the views renderer; system CPU {fmt_s(ours.get('sys_s'))} more); inside the loop only "
                                f"{fmt_s(ours.get('loop_user_s'))}; the same loop with fdatasync stubbed out (nothing "
                                f"blocks, not durable) {fmt_s(ours.get('loop_user_nosync_s'))}",
                    "pass": cpu * 1e6 <= DOC_CPU_US})
    return out


def notes_for_peers(s: dict, raw: dict) -> list[str]:
    lines = []
    lg = raw.get("rerun", {}).get("langgraph")
    if ok(lg):
        lines.append(f"LangGraph re-run: re-invoking the finished thread re-executed {lg['executed_first']}/3 tasks on the "
                     f"first re-run and {fmt_n(lg['executed_per_rerun'])}/3 on each later one ({lg['executed_total']} "
                     f"executions in {lg['reps']} re-runs); checkpoints of the thread grew {lg['checkpoints_before']} -> "
                     f"{lg['checkpoints_after']}. It has no run-level idempotency: every re-run is a new run.")
    db = raw.get("rerun", {}).get("dbos")
    if ok(db):
        lines.append(f"DBOS re-run: calling the workflow again with the finished id returned the recorded output; "
                     f"{db['executed_total']} steps executed in {db['reps']} re-runs (launch {fmt_s(db['launch_s'])}, untimed).")
    for impl in ("langgraph", "dbos"):
        res = [r for r in raw.get("resume", {}).get(impl, []) if ok(r)]
        if res:
            r = res[0]
            extra = (f"launch {fmt_s(r.get('launch_s'))}, recovery thread + internal queue to done "
                     f"{fmt_s(r.get('recover_to_done_s'))}" if impl == "dbos"
                     else f"invoke(None, thread) {fmt_s(r.get('invoke_s'))}")
            lost = " (recorded results lost at the kill)" if r["re_executed"] else ""
            lines.append(f"{LABEL[impl]} resume: {extra}; re-executed {r['re_executed']} of the writer's "
                         f"{r['writer']['calls']:,} calls{lost}.")
    return lines


# ---- main -------------------------------------------------------------------------------------
def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=500, help="calls per run in scenario 1 (default 500)")
    parser.add_argument("--repeats", type=int, default=5, help="interleaved rounds of scenario 1 (default 5)")
    parser.add_argument("--big", type=int, default=10_000, help="calls before the kill in scenario 2 (default 10,000)")
    parser.add_argument("--resume-repeats", type=int, default=3, help="kill+resume pairs for ours (default 3)")
    parser.add_argument("--peer-resume-repeats", type=int, default=1, help="kill+resume pairs per peer (default 1)")
    parser.add_argument("--rerun-reps", type=int, default=51, help="re-runs of the finished id per process (default 51)")
    parser.add_argument("--floor-n", type=int, default=200, help="fsync floor samples per round (default 200)")
    parser.add_argument("--only", help="comma list of implementations: ours,langgraph,dbos")
    parser.add_argument("--no-peers", action="store_true", help="ours only; do not create or use the peers' venv")
    parser.add_argument("--profile", action="store_true", help="also run ours' resume and overhead under cProfile")
    parser.add_argument("--timeout", type=float, default=900, help="seconds per worker process (default 900)")
    args = parse_args(parser, "durable_calls", quick={"n": 50, "repeats": 1, "big": 200, "resume_repeats": 1,
                                                      "rerun_reps": 3, "floor_n": 20})
    wanted = [i.strip() for i in (args.only or "ours,langgraph,dbos").split(",") if i.strip()]
    unknown = set(wanted) - {"ours", *PEERS}
    if unknown:
        parser.error(f"unknown implementation(s) {sorted(unknown)}")
    peers_python, versions, broken = None, {}, {}
    if args.no_peers or not set(wanted) & set(PEERS):
        broken = {p: "skipped (--no-peers)" for p in PEERS}
    else:
        peers_python, why = peer_python(VENV_PEERS, PEER_PINS, "import langgraph.func, langgraph.checkpoint.sqlite, dbos",
                                        install=not args.quick)
        broken = {p: why for p in PEERS} if why else {}
        versions = versions_of(peers_python, PEER_REPORT) if peers_python else {}
    impls = [i for i in ("ours", *PEERS) if i in wanted and i not in broken]
    for peer, why in broken.items():
        if peer in wanted:
            say(f"{LABEL[peer]}: NOT RUN: {why}")

    raw: dict = {}
    with workdir("bench3-", args, tmpfs_note=", these are CPU-only numbers") as (workroot, mount):
        notes = machine_notes() | {"sqlite_library": sqlite3.sqlite_version, "workdir": str(workroot), "mount": mount,
                                   "args": vars(args), "impls": impls, "not_run": broken, "peer_versions": versions}
        say(f"ours:  {sys.executable} (PYTHONPATH={REPO})")
        if peers_python:
            say(f"peers: {peers_python} (-I): " + ", ".join(f"{k} {v}" for k, v in versions.items() if v))
        say(f"implementations: {', '.join(LABEL[i] for i in impls)}; N={args.n} x {args.repeats} rounds, "
            f"resume of {args.big:,} calls, {args.rerun_reps} re-runs\n")
        run = Runner(peers_python, workroot, args.timeout)
        started = time.perf_counter()
        say("1. overhead per journaled call (interleaved rounds, one fresh process each) ...")
        scenario_overhead(run, impls, args, raw)
        say(f"2. resume a run killed after {args.big:,} journaled calls ...")
        scenario_resume(run, impls, args, raw)
        say("3. re-run a finished run id ...")
        scenario_rerun(run, impls, args, raw)
        raw["floor_end"] = run("floor", "floor", workroot / "floor-end", "--floor-n", str(args.floor_n))
        if args.profile:
            say("profiling ours (cProfile) ...")
            scenario_profile(run, args, raw)
    notes["elapsed_s"] = time.perf_counter() - started
    notes["loadavg_end"] = loadavg()

    s = summarize(impls, raw)
    table = build_table(impls, s, args)
    floor_end = raw["floor_end"].get("median_us") if ok(raw.get("floor_end")) else None
    say(f"\n{notes['date_utc']}, {mount['fstype']} on {mount['device']}, {notes['cpu_count']} CPUs, Python "
        f"{notes['python']}, SQLite {notes['sqlite_library']}; medians (scenario 1 over {args.repeats} rounds)\n")
    say(f"fsync floor (write + fdatasync of a 100 B record): median {fmt_s((s['floor_us'] or 0) / 1e6)} over the "
        f"rounds ({', '.join(fmt_s(v / 1e6) for v in s['floor_rounds_us'])}); after everything "
        f"{fmt_s(floor_end / 1e6) if floor_end else 'n/a'}\n")
    say("\n".join(table))
    say("\nratio = peer / ours: >1 means ours is faster. Scenario 1 times the whole run (open, N calls, close) / N.")
    if versions:
        say("peers: " + ", ".join(f"{k} {v}" for k, v in versions.items() if v and k != "python"))
    for line in notes_for_peers(s, raw):
        say(line)
    say("")
    checks = verdicts(s, args)
    for v in checks:
        say_verdict(v["pass"], v["target"], v["measured"])
    for peer, why in broken.items():
        if peer in wanted:
            say(f"NOT RUN  {LABEL[peer]}: {why}")
    save_results(args.out, {"notes": notes, "summary": s, "targets": checks, "table": table, "raw": raw}, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())

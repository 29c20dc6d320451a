"""The transport journal under real SDKs, side by side: the openai SDK bare and journaled, and the same
pydantic-ai agent inside ``caravanserai.durable()`` against pydantic-ai's DBOS durability.

    python benchmarks/bench_frameworks.py [--quick] [--n N] [--rounds K] [--agent-n N] [--kill-calls N]
                                          [--kill-at K] [--no-dbos] [--dir PATH] [--keep] [--out FILE]

One command. It starts the counting model server (``tests/servers/model_api.py``) in this process on
127.0.0.1, with TCP_NODELAY on its sockets (see below), and runs every measurement in a fresh worker
process (``benchmarks/_frameworks_worker.py``), on a work dir on the real disk:

1. **Transport-journal overhead per call.** ``client.chat.completions.create(...)`` (openai SDK, sync,
   non-streamed), N calls per block with distinct prompts (nothing replays): bare, outside any run;
   inside ``caravanserai.durable(id)`` on the default local directory store, on SQLite, and on
   ``memory://`` (no fsync: the journal's CPU alone). Blocks are interleaved with the floors, round by
   round: write + fdatasync of a 1 KB line in the work dir, and a 1 KB SQLite INSERT commit (WAL,
   synchronous=FULL). A journaled model call needs two durable appends (``call_started`` fsynced
   before the request goes out, ``call_settled`` fsynced before the SDK sees the answer), so the added
   median per call is compared with 2x the floor: target added <= 1.5 x 2 floors.
2. **First-token latency of a stream** (``stream=True``): from ``create()`` to the first content chunk,
   bare and journaled. The intent's fsync happens before the request goes out, so it is inside this
   latency: reported as is, then without it (the memory store, and the local store minus the fsync
   time measured inside the same window). Target: <= 1 ms added at p50.
3. **pydantic-ai: caravanserai against DBOS.** One ``Agent(OpenAIChatModel(... OpenAIProvider(
   base_url=<server>/v1)))``: ``agent.run_sync(prompt)`` bare; inside ``with caravanserai.durable(id)``;
   through pydantic-ai's ``DBOSAgent`` (deprecated, what the issue names) and through its successor,
   the ``DBOSDurability`` capability, both called inside a ``@DBOS.workflow`` on a SQLite system
   database. Per-call overhead against the bare call, then **resume after a kill**: a run of 200
   sequential calls is SIGKILLed when the server receives the 190th request (the server's request
   hook kills the writer before answering, so one call is in flight), and a fresh process finishes
   it: time to done (after imports) and calls the server saw again. Target: caravanserai ahead on both.

``--quick``: N=10, 1 round, agents 5 calls per block, a 20-call run killed at the 15th request; DBOS is
skipped (printed) if it is not importable, pydantic-ai likewise. Nothing is ever installed. Prints the
tables (ratios: ours / bare, DBOS / ours), PASS/MISS lines (a report: exit status 0 either way) and
writes ``benchmarks/results/bench_frameworks.json``.

TCP_NODELAY: the test server writes a response's headers and body in two ``send``s; with Nagle on, the
body waits for the client's delayed ACK (~40 ms per call on Linux loopback), which would swamp every
figure here. ``disable_nagle_algorithm`` is set on its handler class, in this process only.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

from _common import (
    HERE,
    describe,
    fmt_load,
    load_helper,
    loadavg,
    machine_notes,
    md_table,
    parse_args,
    reexec_in_repo_venv,
    run_result_worker,
    save_results,
    say,
    say_verdict,
    workdir,
    worker_command,
)
from _common import fmt_time as fmt_s

WORKER = HERE / "_frameworks_worker.py"
NAME = "bench_frameworks"
TARGET_FLOORS = 1.5  # added cost per journaled call <= 1.5x the floor of the appends it needs
APPENDS_PER_CALL = 2  # call_started (fsynced before the request) + call_settled (fsynced before the SDK sees it)
TARGET_TTFT_US = 1000.0  # first-token latency added at p50
CALL_IMPLS = ("bare", "local", "sqlite", "memory")
CALL_LABEL = {"bare": "bare (no run)", "local": "ours, local dir (default)", "sqlite": "ours, SQLite",
              "memory": "ours, memory:// (no fsync)"}
AGENT_IMPLS = ("bare", "ours", "dbos_agent", "dbos_cap")
AGENT_LABEL = {"bare": "bare", "ours": "caravanserai", "dbos_agent": "DBOSAgent", "dbos_cap": "DBOSDurability"}
PEER_RATIO_KEYS = ("median_s", "p99_s", "overhead_median_s", "overhead_p99_s", "resume_s", "resume_process_s")
VERSIONS = ("openai", "httpx", "httpx2", "pydantic-ai-slim", "dbos", "SQLAlchemy")


def ok(result: dict | None) -> bool:
    return bool(result) and "error" not in result


def stat(samples_us: list[float], key: str) -> float | None:
    """``key`` (median, p99, ...) of microsecond samples, in seconds; None when there are none."""
    d = describe(samples_us, scale=1e-6, unit="_s")
    return d.get(f"{key}_s") if d["n"] else None


def diff(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else a - b


def ratio(a: float | None, b: float | None) -> str:
    return "-" if a is None or b is None or b <= 0 else f"{a / b:,.2f}x"


# ---- the server, its kill hook ----------------------------------------------------------------------------------------
class Server:
    """The counting model server in this process; ``arm(pid, at)`` SIGKILLs ``pid`` when the server
    records its ``at``-th request (before answering it)."""

    def __init__(self) -> None:
        self.mod = load_helper("model_api")
        self.api = self.mod.start()
        self.api.server.RequestHandlerClass.disable_nagle_algorithm = True  # see the module docstring
        self.url = self.api.url
        self._target: tuple[int, int] | None = None
        self.killed_at: float | None = None
        self._lock = threading.Lock()
        record = self.api._record

        def recording(path: str, body: dict, headers: dict):
            answer = record(path, body, headers)
            with self._lock:
                target = self._target
                if target is not None and len(self.api.requests) >= target[1]:
                    os.kill(target[0], signal.SIGKILL)
                    self._target, self.killed_at = None, time.perf_counter()
            return answer

        self.api._record = recording  # the handler looks it up per request

    def arm(self, pid: int, at: int) -> None:
        with self._lock:
            self._target, self.killed_at = (pid, at), None

    def disarm(self) -> None:
        with self._lock:
            self._target = None

    def mark(self) -> int:
        return len(self.api.requests)

    def prompts(self, start: int, end: int | None = None) -> list[str]:
        return [self.mod.last_user_text(r["body"]) or "" for r in self.api.requests[start:end]]

    def stop(self) -> None:
        self.api.stop()


# ---- running workers -------------------------------------------------------------------------------------------------
def worker(mode: str, root: Path, server: Server, timeout: float, *extra: str) -> dict:
    root.mkdir(parents=True, exist_ok=True)
    cmd, env = worker_command(sys.executable, WORKER, [mode, "--url", server.url, "--dir", str(root), *extra], ours=True)
    return run_result_worker(cmd, cwd=root, env=env, timeout=timeout, label=mode)


def kill_and_resume(impl: str, root: Path, server: Server, args: argparse.Namespace) -> dict:
    """A run of ``--kill-calls`` agent calls, SIGKILLed at the ``--kill-at``-th request, then resumed."""
    root.mkdir(parents=True, exist_ok=True)
    common = ["--impl", impl, "--calls", str(args.kill_calls), "--id", f"resume-{impl}"]
    cmd, env = worker_command(sys.executable, WORKER, ["agent_write", "--url", server.url, "--dir", str(root), *common],
                              ours=True)
    start = server.mark()
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=str(root), env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    server.arm(proc.pid, start + args.kill_at)
    try:
        stdout, stderr = proc.communicate(timeout=args.timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        server.disarm()
        return {"error": f"{impl} writer: not killed within {args.timeout:.0f} s"}
    server.disarm()
    writer_wall = time.perf_counter() - t0
    if proc.returncode != -signal.SIGKILL:
        tail = " | ".join((stderr or stdout).strip().splitlines()[-4:])
        return {"error": f"{impl} writer: exit status {proc.returncode}, not killed: {tail[-600:]}"}
    at_kill = server.mark()
    before = server.prompts(start, at_kill)
    resumed = worker("agent_resume", root, server, args.timeout, *common)
    after = server.prompts(at_kill)
    seen = set(before)
    resent = [p for p in after if p in seen]
    distinct = len(set(before) | set(after))
    return {"writer": {"requests": len(before), "wall_s": writer_wall,
                       "started_after_s": next((float(line.split()[1]) for line in stdout.splitlines()
                                                if line.startswith("STARTED ")), None)},
            "resume": resumed, "sent_during_resume": len(after), "resent": len(resent), "resent_prompts": resent[:5],
            "distinct_prompts": distinct, "all_answered": distinct == args.kill_calls}


# ---- summaries and tables --------------------------------------------------------------------------------------------
def summarize_calls(res: dict, n: int) -> dict:
    """Per block: ours against the bare calls paired with it in the same block, and the floors sampled there."""
    impls = res["impls"]
    s: dict = {}
    floors_all = [x for got in impls.values() for x in got["floor_us"]]
    sqlite_all = [x for got in impls.values() for x in got["sqlite_floor_us"]]
    s["floor_fsync"] = {"median_s": stat(floors_all, "median"), "p99_s": stat(floors_all, "p99"), "n": len(floors_all)}
    s["floor_sqlite"] = {"median_s": stat(sqlite_all, "median"), "p99_s": stat(sqlite_all, "p99"), "n": len(sqlite_all)}
    for name, got in impls.items():
        row: dict = {"bare_median_s": stat(got["bare_us"], "median"), "bare_p99_s": stat(got["bare_us"], "p99"),
                     "bare_ttft_p50_s": stat(got["bare_ttft_us"], "median"),
                     "bare_ttft_p99_s": stat(got["bare_ttft_us"], "p99"),
                     "bare_stream_p50_s": stat(got["bare_stream_us"], "median"), "n": len(got["bare_us"]),
                     "floor_median_s": stat(got["floor_us"], "median")}
        if name == "bare":
            s[name] = row
            continue
        ours, fs = got["ours_us"], got["ours_fsync_us"]
        row.update(median_s=stat(ours, "median"), p99_s=stat(ours, "p99"),
                   paired_diff_median_s=stat([a - b for a, b in zip(ours, got["bare_us"])], "median"),
                   fsyncs_per_call=got["fsyncs"] / got["calls"] if got["calls"] else None,
                   fsync_wait_median_s=stat(fs, "median"),
                   minus_fsync_median_s=stat([a - b for a, b in zip(ours, fs)], "median"),
                   ttft_p50_s=stat(got["ttft_us"], "median"), ttft_p99_s=stat(got["ttft_us"], "p99"),
                   ttft_fsync_p50_s=stat(got["ttft_fsync_us"], "median"),
                   ttft_minus_fsync_p50_s=stat([a - b for a, b in zip(got["ttft_us"], got["ttft_fsync_us"])], "median"),
                   stream_p50_s=stat(got["stream_us"], "median"),
                   fsyncs_per_stream=got["stream_fsyncs"] / got["streams"] if got["streams"] else None,
                   sqlite_floor_median_s=stat(got["sqlite_floor_us"], "median"))
        # added: the median of the per-pair differences (each journaled call against the bare one next to it,
        # so a change of the disk's or the machine's state between the two halves of a block cancels out)
        row["added_median_s"] = row["paired_diff_median_s"]
        row["added_p99_s"] = diff(row["p99_s"], row["bare_p99_s"])
        row["added_minus_fsync_s"] = stat([a - f - b for a, f, b in zip(ours, fs, got["bare_us"])], "median")
        row["median_diff_s"] = diff(row["median_s"], row["bare_median_s"])
        one = {"local": row["floor_median_s"], "sqlite": row["sqlite_floor_median_s"]}.get(name)
        row["one_floor_s"] = one
        row["needed_floor_s"] = APPENDS_PER_CALL * one if one else None
        if row["added_median_s"] is not None and row["needed_floor_s"]:
            row["added_over_needed_pooled"] = row["added_median_s"] / row["needed_floor_s"]
            # per round: the pairs' added cost against the floor sampled in the same round (the disk's latency
            # swings between rounds); the verdict takes the median of the rounds, as bench_durable_calls does
            floor_key = "sqlite_floor_us" if name == "sqlite" else "floor_us"
            rounds = []
            for r in range(len(ours) // n):
                cut = slice(r * n, (r + 1) * n)
                added = stat([a - b for a, b in zip(ours[cut], got["bare_us"][cut])], "median")
                floor_r = stat(got[floor_key][cut], "median")
                if added is not None and floor_r:
                    rounds.append(added / (APPENDS_PER_CALL * floor_r))
            row["round_ratios"] = rounds
            row["added_over_needed"] = statistics.median(rounds) if rounds else row["added_over_needed_pooled"]
        if row["fsyncs_per_call"] and row["fsync_wait_median_s"] is not None and row["floor_median_s"]:
            row["fsync_in_call_over_floor"] = row["fsync_wait_median_s"] / row["fsyncs_per_call"] / row["floor_median_s"]
        row["ttft_added_p50_s"] = stat([a - b for a, b in zip(got["ttft_us"], got["bare_ttft_us"])], "median")
        row["ttft_added_p99_s"] = diff(row["ttft_p99_s"], row["bare_ttft_p99_s"])
        row["ttft_added_minus_fsync_p50_s"] = stat(
            [a - f - b for a, f, b in zip(got["ttft_us"], got["ttft_fsync_us"], got["bare_ttft_us"])], "median")
        row["ttft_p50_diff_s"] = diff(row["ttft_p50_s"], row["bare_ttft_p50_s"])
        row["stream_added_p50_s"] = stat([a - b for a, b in zip(got["stream_us"], got["bare_stream_us"])], "median")
        s[name] = row
    return s


def calls_tables(s: dict) -> tuple[list[str], list[str]]:
    rows = []
    ref = s.get("bare")
    if ref:
        rows.append(("bare, no run (reference block)", fmt_s(ref["bare_median_s"]), fmt_s(ref["bare_p99_s"]),
                     "-", "-", "-", "-", "-", "-", "-", "-", "-"))
    for name in CALL_IMPLS[1:]:
        row = s.get(name)
        if not row:
            continue
        rows.append((CALL_LABEL[name], fmt_s(row["median_s"]), fmt_s(row["p99_s"]), fmt_s(row["bare_median_s"]),
                     fmt_s(row["added_median_s"]), fmt_s(row["added_p99_s"]),
                     f"{row['fsyncs_per_call']:.2f}" if row.get("fsyncs_per_call") is not None else "-",
                     fmt_s(row["fsync_wait_median_s"]) if row.get("fsyncs_per_call") else "-",
                     fmt_s(row["added_minus_fsync_s"]),
                     fmt_s(row["needed_floor_s"]) if row.get("needed_floor_s") else "-",
                     f"{row['added_over_needed']:.2f}x" if row.get("added_over_needed") is not None else "-",
                     ratio(row["median_s"], row["bare_median_s"])))
    for key, label in (("floor_fsync", "floor: write + fdatasync, 1 KB line"),
                       ("floor_sqlite", "floor: SQLite INSERT 1 KB, WAL FULL")):
        row = s[key]
        if row["n"]:
            rows.append((label, fmt_s(row["median_s"]), fmt_s(row["p99_s"]), "-", "-", "-", "-", "-", "-", "-", "-", "-"))
    t1 = md_table(("openai chat.completions.create, per call", "median", "p99", "paired bare", "added (median of pairs)",
                   "added (p99)", "fsyncs/call", "fsync wait/call", "added w/o fsync wait", "2 appends' floor",
                   "added / 2 floors (median of rounds)", "ours/bare"), rows)
    rows = []
    if ref:
        rows.append(("bare, no run (reference block)", fmt_s(ref["bare_ttft_p50_s"]), fmt_s(ref["bare_ttft_p99_s"]),
                     "-", "-", "-", "-", "-", "-", fmt_s(ref["bare_stream_p50_s"]), "-", "-"))
    for name in CALL_IMPLS[1:]:
        row = s.get(name)
        if not row or row.get("ttft_p50_s") is None:
            continue
        rows.append((CALL_LABEL[name], fmt_s(row["ttft_p50_s"]), fmt_s(row["ttft_p99_s"]), fmt_s(row["bare_ttft_p50_s"]),
                     fmt_s(row["ttft_added_p50_s"]), fmt_s(row["ttft_added_p99_s"]), fmt_s(row["ttft_fsync_p50_s"]),
                     fmt_s(row["ttft_added_minus_fsync_p50_s"]),
                     f"{row['fsyncs_per_stream']:.2f}" if row.get("fsyncs_per_stream") is not None else "-",
                     fmt_s(row["stream_p50_s"]), fmt_s(row["stream_added_p50_s"]),
                     ratio(row["ttft_p50_s"], row["bare_ttft_p50_s"])))
    t2 = md_table(("stream=True, create() to 1st content chunk", "p50", "p99", "paired bare p50", "added p50",
                   "added p99", "fsync inside (p50)", "added p50 w/o that fsync", "fsyncs/stream", "whole stream p50",
                   "whole stream added p50", "ours/bare p50"), rows)
    return t1, t2


def summarize_agents(res: dict | None, resumes: dict) -> dict:
    s: dict = {}
    impls = (res or {}).get("impls", {})
    for impl in AGENT_IMPLS:
        row: dict = {}
        got = impls.get(impl)
        if got:
            calls = got["bare_us"] if impl == "bare" else got["call_us"]
            row["median_s"], row["p99_s"], row["n"] = stat(calls, "median"), stat(calls, "p99"), len(calls)
            if impl != "bare":
                row["bare_median_s"], row["bare_p99_s"] = stat(got["bare_us"], "median"), stat(got["bare_us"], "p99")
                row["overhead_median_s"] = stat([a - b for a, b in zip(got["call_us"], got["bare_us"])], "median")
                row["overhead_p99_s"] = diff(row["p99_s"], row["bare_p99_s"])
                row["median_diff_s"] = diff(row["median_s"], row["bare_median_s"])
                row["floor_median_s"], row["floor_p99_s"] = stat(got["floor_us"], "median"), stat(got["floor_us"], "p99")
            if impl == "ours":
                row["fsyncs_per_call"] = got["fsyncs"] / got["calls"] if got["calls"] else None
                row["fsync_wait_median_s"] = stat(got["fsync_us"], "median")
                row["overhead_minus_fsync_s"] = stat(
                    [a - f - b for a, f, b in zip(got["call_us"], got["fsync_us"], got["bare_us"])], "median")
        kr = resumes.get(impl)
        if ok(kr) and ok(kr.get("resume")):
            r = kr["resume"]
            row.update(resume_s=r["total_s"], resume_open_s=r["open_s"], resume_process_s=r["process_wall_s"],
                       resume_import_s=r.get("import_s"), resume_sent=kr["sent_during_resume"], resent=kr["resent"],
                       resume_completed=bool(r.get("completed")) and kr["all_answered"],
                       writer_requests=kr["writer"]["requests"])
        elif kr:
            error = kr.get("error") or (kr.get("resume") or {}).get("error") or "?"
            row["resume_error"] = error.rsplit(" | ", 1)[-1].strip()
            row["resume_completed"] = False
        if row:
            s[impl] = row
    return s


def agents_table(s: dict, args: argparse.Namespace) -> list[str]:
    impls = [i for i in AGENT_IMPLS if i in s]
    peers = [i for i in impls if i.startswith("dbos")]
    ours = s.get("ours", {})
    rows = []

    def row(label: str, key: str, kind: str = "time") -> None:
        cells = []
        for impl in impls:
            v = s[impl].get(key)
            if kind == "time":
                cells.append(fmt_s(v) if v is not None else "-")
            elif kind == "bool":
                cells.append("-" if v is None else ("yes" if v else "NO"))
            else:
                cells.append("-" if v is None else f"{v:,.0f}" if kind == "count" else f"{v:.2f}")
        extra = [ratio(ours.get(key), ours.get("bare_" + key)) if key in ("median_s", "p99_s") else "-"]
        for peer in peers:
            extra.append(ratio(s[peer].get(key), ours.get(key)) if key in PEER_RATIO_KEYS else "-")
        rows.append((label, *cells, *extra))

    row("agent.run_sync, per call: median", "median_s")
    row("   p99", "p99_s")
    row("   the bare agent's calls paired with them: median", "bare_median_s")
    row("   overhead vs the paired bare calls (median of pair differences)", "overhead_median_s")
    row("   overhead vs the paired bare calls (p99)", "overhead_p99_s")
    row("   fsyncs per call (Python-level)", "fsyncs_per_call", kind="float")
    row("   waiting in fsync per call (median)", "fsync_wait_median_s")
    row("   overhead without that wait (median)", "overhead_minus_fsync_s")
    row("   fsync floor (1 KB) sampled between the calls: median", "floor_median_s")
    row("   fsync floor: p99", "floor_p99_s")
    row(f"resume after SIGKILL at request {args.kill_at} of {args.kill_calls}: to done, after imports", "resume_s")
    row("   of which open (ours) / DBOS.launch + recovery start", "resume_open_s")
    row("   the resuming process, wall (imports included)", "resume_process_s")
    row("   requests the server got before the kill", "writer_requests", kind="count")
    row("   requests sent during the resume", "resume_sent", kind="count")
    row("   of which re-sent (prompt already sent before the kill)", "resent", kind="count")
    row("   all calls answered, run done", "resume_completed", kind="bool")
    header = ("pydantic-ai Agent, same server", *(AGENT_LABEL[i] for i in impls), "caravanserai/bare",
              *(f"{AGENT_LABEL[p]}/caravanserai" for p in peers))
    return md_table(header, rows)


# ---- verdicts --------------------------------------------------------------------------------------------------------
def verdicts(calls: dict | None, agents: dict, args: argparse.Namespace) -> list[dict]:
    out = []
    if calls:
        for name, what in (("local", "the default local store"), ("sqlite", "SQLite")):
            row = calls.get(name)
            if not row or row.get("added_over_needed") is None:
                continue
            which = ("write + fdatasync of a 1 KB line in the work dir" if name == "local"
                     else "a 1 KB SQLite INSERT commit, WAL synchronous=FULL")
            out.append({
                "target": f"transport journal on {what}: added cost per call <= {TARGET_FLOORS}x the floor of the "
                          f"{APPENDS_PER_CALL} durable appends it needs",
                "measured": f"added {fmt_s(row['added_median_s'])} per call (median of the differences to the bare call "
                            f"paired with each; medians {fmt_s(row['median_s'])} vs {fmt_s(row['bare_median_s'])}) = "
                            f"{row['added_over_needed_pooled']:.2f}x of {APPENDS_PER_CALL} x "
                            f"{fmt_s(row['one_floor_s'])} ({which}, median, sampled between the calls); per round "
                            f"{', '.join(f'{x:.2f}x' for x in row['round_ratios'])}: median "
                            f"{row['added_over_needed']:.2f}x; "
                            + (f"{row['fsyncs_per_call']:.2f} fsyncs per call waiting {fmt_s(row['fsync_wait_median_s'])} "
                               f"({row.get('fsync_in_call_over_floor', 0):.2f}x the floor per fsync), the rest "
                               f"{fmt_s(row['added_minus_fsync_s'])}" if name == "local" else
                               "SQLite's own syncs are not visible to the fsync counter"),
                "pass": row["added_over_needed"] <= TARGET_FLOORS})
        mem = calls.get("memory")
        loc = calls.get("local", {})
        if loc.get("ttft_added_p50_s") is not None:
            out.append({"target": f"stream first-token latency: <= {TARGET_TTFT_US / 1e3:.0f} ms added at p50 "
                                  "(default local store, the intent's fsync included)",
                        "measured": f"added {fmt_s(loc['ttft_added_p50_s'])} at p50 (median of the differences to the "
                                    f"paired bare streams; p50s {fmt_s(loc['ttft_p50_s'])} vs "
                                    f"{fmt_s(loc['bare_ttft_p50_s'])}); the fsync inside that window "
                                    f"{fmt_s(loc.get('ttft_fsync_p50_s'))} at p50",
                        "pass": loc["ttft_added_p50_s"] * 1e6 <= TARGET_TTFT_US})
            parts = [f"local store minus its fsync time: {fmt_s(loc.get('ttft_added_minus_fsync_p50_s'))}"]
            if mem and mem.get("ttft_added_p50_s") is not None:
                parts.insert(0, f"memory:// store: {fmt_s(mem['ttft_added_p50_s'])}")
            worst = max(v for v in (loc.get("ttft_added_minus_fsync_p50_s"), (mem or {}).get("ttft_added_p50_s"))
                        if v is not None)
            out.append({"target": f"   ... excluding the intent's fsync: <= {TARGET_TTFT_US / 1e3:.0f} ms added at p50",
                        "measured": "; ".join(parts), "pass": worst * 1e6 <= TARGET_TTFT_US})
    ours = agents.get("ours", {})
    for peer in ("dbos_agent", "dbos_cap"):
        theirs = agents.get(peer)
        if not theirs:
            continue
        a, b = ours.get("overhead_median_s"), theirs.get("overhead_median_s")
        if a is not None and b is not None:
            out.append({"target": f"pydantic-ai: caravanserai's per-call overhead below {AGENT_LABEL[peer]}'s",
                        "measured": f"caravanserai +{fmt_s(a)}, {AGENT_LABEL[peer]} +{fmt_s(b)} per agent.run_sync "
                                    f"(median, each against the bare calls paired with it): {ratio(b, a)}",
                        "pass": a < b})
        ra, rb = ours.get("resume_s"), theirs.get("resume_s")
        if ra is not None and rb is None and theirs.get("resume_error"):
            out.append({"target": f"pydantic-ai: resume after SIGKILL faster than {AGENT_LABEL[peer]}, "
                                  "no more calls re-sent, run done",
                        "measured": f"caravanserai {fmt_s(ra)}, re-sent {ours.get('resent')}, done "
                                    f"{ours.get('resume_completed')}; {AGENT_LABEL[peer]} did not recover the run: "
                                    f"{theirs['resume_error'][-300:]}",
                        "pass": bool(ours.get("resume_completed"))})
        if ra is not None and rb is not None:
            out.append({"target": f"pydantic-ai: resume after SIGKILL faster than {AGENT_LABEL[peer]}, "
                                  "no more calls re-sent, run done",
                        "measured": f"caravanserai {fmt_s(ra)}, {AGENT_LABEL[peer]} {fmt_s(rb)} (after imports; "
                                    f"{ratio(rb, ra)}); re-sent {ours.get('resent')} vs {theirs.get('resent')}; "
                                    f"done {ours.get('resume_completed')} / {theirs.get('resume_completed')}",
                        "pass": ra < rb and ours.get("resent", 1e9) <= theirs.get("resent", -1)
                        and bool(ours.get("resume_completed"))})
    return out


def cost_notes(calls: dict | None, agents: dict) -> list[str]:
    """What the journal costs apart from the fsyncs: the memory:// store, and the local store minus its fsync waits."""
    if not calls:
        return []
    mem, loc = calls.get("memory") or {}, calls.get("local") or {}
    lines = [f"note: the journal's own cost (memory:// store, no fsync; median of pair differences): "
             f"{fmt_s(mem.get('added_median_s'))} per non-streamed call, {fmt_s(mem.get('ttft_added_p50_s'))} to the "
             f"first token, {fmt_s(mem.get('stream_added_p50_s'))} per whole stream; local store minus its fsync "
             f"waits: {fmt_s(loc.get('added_minus_fsync_s'))} per call"]
    ours = agents.get("ours") or {}
    if ours.get("overhead_minus_fsync_s") is not None:
        lines.append(f"note: pydantic-ai inside durable(): {fmt_s(ours.get('overhead_median_s'))} added per "
                     f"agent.run_sync, of which {fmt_s(ours.get('fsync_wait_median_s'))} waiting in its 2 fsyncs")
    return lines


# ---- main ------------------------------------------------------------------------------------------------------------
def io_pressure() -> str:
    """The kernel's I/O pressure line ("some avg10=.. avg60=.."), the share of time tasks waited on I/O."""
    try:
        with open("/proc/pressure/io", encoding="utf-8") as f:
            return " ".join(f.readline().split()[1:3])
    except OSError:
        return "n/a"


def versions() -> dict:
    out = {}
    for name in VERSIONS:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = None
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=200, help="openai calls (and streams) per block (default 200)")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds (default 3)")
    parser.add_argument("--warmup", type=int, default=5, help="untimed calls before each block (default 5)")
    parser.add_argument("--agent-n", type=int, default=50, help="agent.run_sync calls per block (default 50)")
    parser.add_argument("--kill-calls", type=int, default=200, help="calls in the killed run (default 200)")
    parser.add_argument("--kill-at", type=int, default=190, help="SIGKILL at this request of the run (default 190)")
    parser.add_argument("--no-dbos", action="store_true", help="leave DBOS out")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per worker process")
    args = parse_args(parser, NAME, quick={"n": 10, "rounds": 1, "warmup": 2, "agent_n": 5, "kill_calls": 20,
                                           "kill_at": 15, "timeout": 90.0})
    notes = {**machine_notes(), "io_pressure_start": io_pressure(), "versions": versions(), "argv": sys.argv[1:],
             "quick": args.quick,
             "server": "tests/servers/model_api.py in the bench process, TCP_NODELAY on its sockets"}
    have_agents = importlib.util.find_spec("pydantic_ai") is not None
    have_dbos = have_agents and not args.no_dbos and importlib.util.find_spec("dbos") is not None
    skipped = []
    if not have_agents:
        skipped.append("pydantic-ai is not importable in this interpreter: section 3 skipped "
                       "(pip install 'pydantic-ai-slim[openai]' dbos into .venv to run it)")
    elif not have_dbos:
        skipped.append("DBOS left out (--no-dbos)" if args.no_dbos else
                       "dbos is not importable in this interpreter: the DBOS side of section 3 skipped "
                       "(pip install dbos into .venv to run it)")
    raw: dict = {}
    started = time.perf_counter()
    server = Server()
    try:
        with workdir("bench-frameworks-", args) as (root, mount):
            notes["workdir"], notes["mount"] = str(root), mount
            say(f"python {sys.executable}; openai {notes['versions']['openai']}, pydantic-ai "
                f"{notes['versions']['pydantic-ai-slim']}, dbos {notes['versions']['dbos']}; server {server.url}")
            for line in skipped:
                say(f"SKIP  {line}")
            say(f"1+2. openai SDK: {args.rounds} round(s) x {args.n} calls and {args.n} streams per implementation, "
                "interleaved with the floors ...")
            raw["calls"] = worker("calls", root / "calls", server, args.timeout, "--n", str(args.n), "--rounds",
                                  str(args.rounds), "--warmup", str(args.warmup), "--impls", ",".join(CALL_IMPLS))
            if not ok(raw["calls"]):
                say(f"   FAILED: {raw['calls']['error']}")
            agent_impls = ["bare", "ours", *(["dbos_agent", "dbos_cap"] if have_dbos else [])]
            raw["resume"] = {}
            if have_agents:
                say(f"3. pydantic-ai: {args.rounds} round(s) x {args.agent_n} agent.run_sync per implementation "
                    f"({', '.join(AGENT_LABEL[i] for i in agent_impls)}) ...")
                raw["agents"] = worker("agents", root / "agents", server, args.timeout, "--n", str(args.agent_n),
                                       "--rounds", str(args.rounds), "--warmup", str(args.warmup),
                                       "--impls", ",".join(agent_impls))
                if not ok(raw["agents"]):
                    say(f"   FAILED: {raw['agents']['error']}")
                for impl in agent_impls[1:]:
                    if args.quick and impl == "dbos_agent":  # ~10 s more; the full run has it
                        skipped.append("DBOSAgent's kill and resume (--quick: the full run has it)")
                        say(f"   SKIP  {skipped[-1]}")
                        continue
                    say(f"   {AGENT_LABEL[impl]}: run of {args.kill_calls} calls, SIGKILL at request {args.kill_at}, "
                        "resume ...")
                    kr = kill_and_resume(impl, root / f"resume-{impl}", server, args)
                    raw["resume"][impl] = kr
                    if not ok(kr) or not ok(kr.get("resume")):
                        say(f"   FAILED: {kr.get('error') or kr['resume'].get('error')}")
                    else:
                        r = kr["resume"]
                        say(f"      killed after {kr['writer']['requests']} requests; resumed in {fmt_s(r['total_s'])} "
                            f"(process {fmt_s(r['process_wall_s'])}), {kr['sent_during_resume']} sent, "
                            f"{kr['resent']} re-sent, completed={r.get('completed')}")
    finally:
        server.stop()
    notes["elapsed_s"] = time.perf_counter() - started
    notes["loadavg_end"], notes["io_pressure_end"] = loadavg(), io_pressure()

    calls = summarize_calls(raw["calls"], args.n) if ok(raw.get("calls")) else None
    agents = summarize_agents(raw.get("agents") if ok(raw.get("agents")) else None, raw.get("resume", {}))
    tables: list[list[str]] = []
    say(f"\n{notes['date_utc']}, {notes['mount']['fstype']} on {notes['mount']['device']}, {notes['cpu_count']} CPUs "
        f"({notes['cpu_model']}), Python {notes['python']}, load {fmt_load(notes['loadavg_start'])} -> "
        f"{fmt_load(notes['loadavg_end'])}, I/O pressure {notes['io_pressure_start']} -> {notes['io_pressure_end']}; "
        f"{args.rounds} round(s), elapsed {fmt_s(notes['elapsed_s'])}")
    if calls:
        t1, t2 = calls_tables(calls)
        say(f"\n1. Transport journal, per call (openai SDK, sync, non-streamed; {calls['bare']['n']} calls each; "
            "ratio ours/bare)\n")
        say("\n".join(t1))
        say(f"\n2. First-token latency, stream=True ({calls['bare']['n']} streams each)\n")
        say("\n".join(t2))
        tables += [t1, t2]
    if agents:
        t3 = agents_table(agents, args)
        say(f"\n3. pydantic-ai agent.run_sync ({args.rounds} x {args.agent_n} calls each; ratios: caravanserai/bare, "
            "DBOS/caravanserai: >1 means caravanserai is faster)\n")
        say("\n".join(t3))
        tables.append(t3)
        for impl, row in agents.items():
            if row.get("resume_error"):
                say(f"{AGENT_LABEL[impl]}: the resume failed: {row['resume_error']}")
    if not tables:  # every worker failed: still a report
        t0 = md_table(("section", "result"), [("all", "failed: see above")])
        say("\n".join(t0))
        tables.append(t0)
    say("\nfloors, fsync counts and waits are measured by the worker process itself (Python-level os.fsync/fdatasync; "
        "SQLite's own syncs are not counted).")
    say("")
    checks = verdicts(calls, agents, args)
    for v in checks:
        say_verdict(v["pass"], v["target"], v["measured"])
    notes["cost_notes"] = cost_notes(calls, agents)
    for line in notes["cost_notes"]:
        say(line)
    for line in skipped:
        say(f"NOT RUN  {line}")
    save_results(args.out, {"notes": notes, "calls": calls, "agents": agents, "targets": checks, "tables": tables,
                            "raw": raw}, indent=1)
    return 0


if __name__ == "__main__":
    reexec_in_repo_venv(__file__, "_BENCH_FRAMEWORKS_REEXEC")
    sys.exit(main())

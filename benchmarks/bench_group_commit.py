"""Group commit: journal-service appends from 1 and from K clients, and PostgreSQL appends, each next
to its floor measured in the same run.

    python benchmarks/bench_group_commit.py [--quick] [--rounds R] [--n N] [--clients K]
                                            [--backing local,sqlite] [--pg | --no-pg] [--dir PATH]

One command: it starts the journal service (``caravanserai.stores.http_service.serve``) once per
backing store (a local directory and a SQLite file in the work dir, on the real disk) and, unless
``--no-pg``, its own PostgreSQL (``tests/servers/pg_server.py``), and stops them at the end.
Each measurement is a fresh process (``benchmarks/_group_commit_worker.py``); rounds interleave
floor and ours.

- **HTTP append, 1 client**: ``HttpStore.append`` of one 151 B line (durable on return), N times;
  floor: a bare POST of the same bytes to the same service (``/health``) plus ``os.write`` +
  ``os.fdatasync`` of them on the service's disk. Target: median ≤ 1.5x. The verdict uses the
  paired run (one floor operation next to each append in the same client process, the order
  alternating), because this shared disk's fsync latency is bimodal and drifts between processes;
  the ratio against the floor measured in its own process is printed too.
- **HTTP append, K clients on K runs** (K processes started together): appends per second over the
  window where all K run, against one client's appends per second. Target: ≥ 2x.
- **PostgreSQL append**: ``PostgresStore.append`` of the same line against a bare single-row
  ``INSERT`` + COMMIT on the same server (autocommit psycopg), paired in one process as above.
  Target: median ≤ 1.3x. The same
  store shared by K threads on K runs is reported too (group commit: one COMMIT per batch).

A report, not a test: exit status 0 either way. ``--quick`` (N=30, 1 round, no PostgreSQL unless
``--pg``) exercises every path in seconds; its figures mean nothing. Raw numbers:
``benchmarks/results/group_commit.json``.
"""

from __future__ import annotations

import argparse
import importlib
import os
import secrets
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from _common import (
    HERE,
    REPO,
    describe,
    fmt_load,
    fmt_us,
    loadavg,
    machine_notes,
    md_table,
    parse_args,
    reexec_in_repo_venv,
    run_result_worker,
    save_results,
    say,
    workdir,
    worker_command,
)

sys.path.insert(0, str(REPO / "tests"))  # the tests' own server helpers: tests/servers
from servers._proc import free_port, stop_process_group  # noqa: E402

WORKER = HERE / "_group_commit_worker.py"
HTTP_TARGET = 1.5
THROUGHPUT_TARGET = 2.0
PG_TARGET = 1.3


class Service:
    """The journal service in its own process, backed by ``backing``."""

    def __init__(self, work: Path, backing: str, name: str) -> None:
        port, token = free_port(), secrets.token_hex(16)
        self.log = work / f"service-{name}.log"
        cmd, env = worker_command(sys.executable, WORKER, ["serve", "--backing", backing, "--port", str(port),
                                                           "--token", token], ours=True)
        with open(self.log, "w") as log:
            self.proc = subprocess.Popen(cmd, env=env, cwd=str(work), stdout=log, stderr=subprocess.STDOUT,
                                         start_new_session=True)
        base = f"http://127.0.0.1:{port}"
        self.url = f"{base}/?token={token}"
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and self.proc.poll() is None:
            try:
                urllib.request.urlopen(base + "/health", timeout=1).read()
                return
            except OSError:
                time.sleep(0.1)
        self.stop()
        raise RuntimeError("the journal service did not start: " + " | ".join(self.log.read_text().splitlines()[-3:]))

    def stop(self) -> None:
        stop_process_group(self.proc, grace=10)


def worker(work: Path, mode: str, *args: str, timeout: float = 600) -> dict:
    cmd, env = worker_command(sys.executable, WORKER, [mode, *args], ours=True)
    return run_result_worker(cmd, cwd=work, env=env, timeout=timeout, label=mode)


def clients(work: Path, k: int, url: str, common: list[str], timeout: float = 600) -> list[dict]:
    """K ``http`` workers started together (each sleeps until a common start time after its imports)."""
    start_at = time.time() + 2.0 + 0.4 * k
    cmd, env = worker_command(sys.executable, WORKER, ["http", "--url", url, "--start-at", f"{start_at:.3f}", *common],
                              ours=True)
    procs = [subprocess.Popen(cmd, cwd=str(work), env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(k)]
    out = []
    for proc in procs:
        stdout, stderr = proc.communicate(timeout=timeout)
        lines = [line for line in stdout.splitlines() if line.startswith("RESULT ")]
        if proc.returncode or not lines:
            out.append({"error": f"http client: exit {proc.returncode}: {stderr.strip()[-500:]}"})
        else:
            import json

            out.append({**json.loads(lines[-1][len("RESULT "):]), "start_at": start_at})
    return out


def throughput(results: list[dict]) -> dict:
    """Appends per second over the window where every client was running."""
    start = max(max(r["start_at"], r["started"]) for r in results)
    end = min(r["done"][-1] for r in results)
    count = sum(1 for r in results for t in r["done"] if start < t <= end)
    return {"per_s": count / (end - start) if end > start else None, "window_s": end - start, "appends": count,
            "late_start_s": max(r["started"] - r["start_at"] for r in results)}


def one_throughput(result: dict) -> float:
    return len(result["done"]) / (result["done"][-1] - result["started"])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=1000, help="timed appends per client (default 1,000)")
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--clients", type=int, default=8, help="concurrent clients on as many runs (default 8)")
    parser.add_argument("--backing", default="local,sqlite", help="stores behind the service: local,sqlite")
    parser.add_argument("--pg", dest="pg", action="store_true", default=None, help="measure PostgreSQL (default: "
                        "yes, but not under --quick)")
    parser.add_argument("--no-pg", dest="pg", action="store_false")
    parser.add_argument("--timeout", type=float, default=600)
    args = parse_args(parser, "group_commit", quick={"n": 30, "warmup": 5, "rounds": 1})
    if args.pg is None:
        args.pg = not args.quick
        if args.quick:
            say("postgres: skipped in --quick (pass --pg to include it)")
    with workdir("bench-group-commit-", args) as (work, mount):
        os.chmod(work, 0o755)  # the postgres user must reach its data dir inside
        return measure(args, work, mount)


def measure(args: argparse.Namespace, work: Path, mount: dict) -> int:
    notes = {**machine_notes(), "workdir": str(work), "mount": mount, "args": vars(args)}
    common = ["--n", str(args.n), "--warmup", str(args.warmup), "--dir", str(work)]
    raw: dict[str, list] = {}
    rows, verdicts = [], {}
    started = time.perf_counter()
    for backing in [b.strip() for b in args.backing.split(",") if b.strip()]:
        url = {"local": str(work / "service-local"), "sqlite": f"sqlite:///{work / 'service.db'}"}[backing]
        try:
            service = Service(work, url, backing)
        except RuntimeError as exc:
            rows.append([f"HTTP append ({backing})", "-", "-", "-", f"not run: {exc}"[:80]])
            continue
        try:
            for k in range(args.rounds):
                jobs = [("floor", ["floor_http", "--url", service.url, *common]),
                        ("one", ["http", "--url", service.url, *common]),
                        ("paired", ["http", "--url", service.url, "--paired", *common])]
                for name, job in (jobs if k % 2 == 0 else jobs[::-1]):
                    raw.setdefault(f"{backing}:{name}", []).append(worker(work, *job))
                raw.setdefault(f"{backing}:many", []).append(clients(work, args.clients, service.url, common))
                one, floor = raw[f"{backing}:one"][-1], raw[f"{backing}:floor"][-1]
                many = raw[f"{backing}:many"][-1]
                pair = raw[f"{backing}:paired"][-1]
                say(f"  {backing} round {k + 1}: 1 client {fmt_us(one.get('stats', {}).get('median_us'))}, "
                    f"floor {fmt_us(floor.get('stats', {}).get('median_us'))}"
                    + ("" if "error" in pair else f", paired {fmt_us(pair['stats']['median_us'])} / "
                       f"{fmt_us(describe(pair['paired_floor_us'], scale=1)['median_us'])}")
                    + ("" if any("error" in r for r in many) else
                       f", {args.clients} clients {throughput(many)['per_s'] or 0:.0f}/s")
                    + "".join(f"  ERROR {r['error']}" for r in [one, floor, pair, *many] if "error" in r))
        finally:
            service.stop()
        ones = [r for r in raw[f"{backing}:one"] if "error" not in r]
        floors = [r for r in raw[f"{backing}:floor"] if "error" not in r]
        pairs = [r for r in raw[f"{backing}:paired"] if "error" not in r]
        manys = [m for m in raw[f"{backing}:many"] if not any("error" in r for r in m)]
        if not ones or not floors or not manys or not pairs:
            rows.append([f"HTTP append ({backing})", "-", "-", "-", "ERROR (see JSON)"])
            continue
        o = describe([s for r in pairs for s in r["samples_us"]], scale=1)
        f = describe([s for r in pairs for s in r["paired_floor_us"]], scale=1)
        ratio = o["median_us"] / f["median_us"]
        apart = describe([s for r in ones for s in r["samples_us"]], scale=1)["median_us"] / \
            describe([s for r in floors for s in r["samples_us"]], scale=1)["median_us"]
        one_tp = statistics.median(one_throughput(r) for r in ones)
        many_tp = statistics.median(throughput(m)["per_s"] or 0 for m in manys)
        many_lat = describe([s for m in manys for r in m for s in r["samples_us"]], scale=1)
        verdicts[f"http_{backing}"] = {"ratio": ratio, "pass": ratio <= HTTP_TARGET, "ours": o, "floor": f,
                                       "ratio_separate_processes": apart, "post": floors[0]["post"],
                                       "fsync": floors[0]["fsync"]}
        verdicts[f"http_{backing}_clients"] = {"ratio": many_tp / one_tp, "pass": many_tp / one_tp >= THROUGHPUT_TARGET,
                                               "one_per_s": one_tp, "many_per_s": many_tp, "latency": many_lat,
                                               "windows": [throughput(m) for m in manys]}
        rows.append([f"HTTP append, 1 client ({backing} behind the service)", fmt_us(o["median_us"]),
                     f"{fmt_us(f['median_us'])} (POST + fdatasync, paired)",
                     f"{ratio:.2f}x (<= {HTTP_TARGET}x; {apart:.2f}x apart)", "PASS" if ratio <= HTTP_TARGET else "MISS"])
        rows.append([f"HTTP append, {args.clients} clients on {args.clients} runs ({backing})",
                     f"{many_tp:.0f}/s (median latency {fmt_us(many_lat['median_us'])})", f"{one_tp:.0f}/s (1 client)",
                     f"{many_tp / one_tp:.2f}x (>= {THROUGHPUT_TARGET}x)",
                     "PASS" if many_tp / one_tp >= THROUGHPUT_TARGET else "MISS"])
    if args.pg:
        pg_rows(args, work, common, raw, rows, verdicts, notes)
    say("")
    say("\n".join(md_table(["measure", "ours", "floor (same run)", "ratio (target)", "verdict"], rows)))
    for key, v in verdicts.items():
        if key.startswith("http_") and "post" in v:
            say(f"floor parts ({key[5:]}): POST median {fmt_us(v['post']['median_us'])}, fdatasync median "
                f"{fmt_us(v['fsync']['median_us'])}; ours p99 {fmt_us(v['ours']['p99_us'])}")
    notes["loadavg_end"] = loadavg()
    notes["wall_s"] = time.perf_counter() - started
    say(f"\nwall time {notes['wall_s']:.0f} s; load average {fmt_load(notes['loadavg_start'])} at start, "
        f"{fmt_load(notes['loadavg_end'])} at end (other processes on this machine make the figures noisy)")
    save_results(args.out, {"notes": notes, "verdicts": verdicts, "raw": raw})
    return 0


def pg_rows(args: argparse.Namespace, work: Path, common: list[str], raw: dict, rows: list, verdicts: dict,
            notes: dict) -> None:
    import tempfile

    pg_server = importlib.import_module("servers.pg_server")
    os.environ.pop("TEST_PG_DSN", None)  # always our own, on this disk
    old, tempfile.tempdir = tempfile.tempdir, str(work)
    try:
        server = pg_server.PgServer.start()
    except Exception as exc:  # noqa: BLE001
        rows.append(["PostgreSQL append", "-", "-", "-", f"not run: PostgreSQL did not start: {exc}"[:80]])
        return
    finally:
        tempfile.tempdir = old
    try:
        for k in range(args.rounds):
            jobs = [("floor", ["floor_pg", "--dsn", server.dsn, *common]), ("one", ["pg", "--dsn", server.dsn, *common]),
                    ("paired", ["pg", "--dsn", server.dsn, "--paired", *common])]
            for name, job in (jobs if k % 2 == 0 else jobs[::-1]):
                raw.setdefault(f"pg:{name}", []).append(worker(work, *job))
            raw.setdefault("pg:many", []).append(worker(work, "pg", "--dsn", server.dsn, "--threads",
                                                        str(args.clients), *common))
            say(f"  postgres round {k + 1}: " + ", ".join(
                f"{name} {fmt_us(raw[f'pg:{name}'][-1].get('stats', {}).get('median_us'))}"
                if "error" not in raw[f"pg:{name}"][-1] else f"{name} ERROR {raw[f'pg:{name}'][-1]['error']}"
                for name in ("floor", "one", "paired", "many")))
    finally:
        server.stop()
    ones, floors = [r for r in raw["pg:one"] if "error" not in r], [r for r in raw["pg:floor"] if "error" not in r]
    pairs, manys = [r for r in raw["pg:paired"] if "error" not in r], [r for r in raw["pg:many"] if "error" not in r]
    if not ones or not floors or not pairs:
        rows.append(["PostgreSQL append", "-", "-", "-", "ERROR (see JSON)"])
        return
    o = describe([s for r in pairs for s in r["samples_us"]], scale=1)
    f = describe([s for r in pairs for s in r["paired_floor_us"]], scale=1)
    ratio = o["median_us"] / f["median_us"]
    apart = describe([s for r in ones for s in r["samples_us"]], scale=1)["median_us"] / \
        describe([s for r in floors for s in r["samples_us"]], scale=1)["median_us"]
    verdicts["pg"] = {"ratio": ratio, "pass": ratio <= PG_TARGET, "ours": o, "floor": f, "ratio_separate_processes": apart}
    rows.append(["PostgreSQL append (1 writer)", fmt_us(o["median_us"]), f"{fmt_us(f['median_us'])} (INSERT + COMMIT, paired)",
                 f"{ratio:.2f}x (<= {PG_TARGET}x; {apart:.2f}x apart)", "PASS" if ratio <= PG_TARGET else "MISS"])
    if manys:
        one_tp = statistics.median(len(r["done"]) / (r["done"][-1] - r["started"]) for r in ones)
        many_tp = statistics.median(len(r["done"]) / (r["done"][-1] - r["started"]) for r in manys)
        verdicts["pg_threads"] = {"ratio": many_tp / one_tp, "one_per_s": one_tp, "many_per_s": many_tp,
                                  "batches": [r.get("batches") for r in manys]}
        rows.append([f"PostgreSQL append, {args.clients} threads on {args.clients} runs, one store",
                     f"{many_tp:.0f}/s", f"{one_tp:.0f}/s (1 writer)", f"{many_tp / one_tp:.2f}x", "(info)"])


if __name__ == "__main__":
    reexec_in_repo_venv(__file__, "_BENCH_GROUP_COMMIT_REEXEC")
    sys.exit(main())

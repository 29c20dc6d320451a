"""Listing many runs through the run index, against reading the index alone.

    python benchmarks/bench_run_index.py [--runs 10000] [--only local,sqlite,postgres,s3] [--quick]

Per store (local, SQLite, and PostgreSQL / S3 (moto) started from ``tests/servers`` when their
binaries are installed), in a fresh work dir next to the repo (the real disk):

1. writes ``--runs`` small completed runs (run_started, 3 waypoints, run_completed) straight
   through the journal face, so no index entry exists yet;
2. **cold list**: ``list_runs(store)`` with no index: every journal read once, entries written
   (what the old ``caravanserai list`` paid on every call);
3. **floor**: reading the index alone (``store.index_get_many`` of every entry + parsing each);
4. **warm list**: ``list_runs(store)`` again (change tokens + the index; no journal read), and
   **``caravanserai list --json``** in-process (output discarded);
5. **one run changed**: a waypoint appended to one run, then ``list_runs``: that journal alone is read.

Prints a table with ratios to the floor and PASS/MISS for the target "list of 10,000 runs < 1 s
on local and SQLite" (a report: exit 0 either way); JSON in ``benchmarks/results/run_index.json``.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import sys
import time
import uuid
from typing import Any

from _common import (
    REPO,
    fmt_ratio,
    fmt_time,
    load_helper,
    machine_notes,
    md_table,
    parse_args,
    save_results,
    say,
    say_verdict,
    workdir,
)

sys.path.insert(0, str(REPO))
from caravanserai import journal, open_store  # noqa: E402
from caravanserai.cli import main as cli_main  # noqa: E402
from caravanserai.runs.index import list_runs  # noqa: E402

try:  # the floor parses as the index does
    from orjson import loads
except ImportError:  # pragma: no cover
    loads = json.loads

KINDS = ("local", "sqlite", "postgres", "s3")
TARGET_S = 1.0


def template_events(i: int) -> list[dict]:
    return [{"type": "run_started", "agent_id": "bench", "input": {"i": i}},
            *({"type": "waypoint", "n": n, "note": f"step {n}", "state": {"i": i, "n": n}} for n in (1, 2, 3)),
            {"type": "run_completed", "result": {"i": i}}]


def write_runs(store: Any, n: int) -> float:
    t = time.perf_counter()
    for i in range(n):
        run_id = f"run-{i:05d}"
        lines = journal.encode([{**e, "run_id": run_id} if e["type"] == "run_started" else e
                                for e in template_events(i)], journal.Tail())[0]
        lease = store.acquire(run_id)
        try:
            store.append(run_id, lines, lease=lease, seq=0, sync=False)
        finally:
            lease.release()
    return time.perf_counter() - t


def best(fn: Any, k: int) -> float:
    times = []
    for _ in range(k):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def measure(kind: str, url: str, runs: int, repeats: int) -> dict:
    store = open_store(url)
    try:
        built = write_runs(store, runs)
        t = time.perf_counter()
        rows = list_runs(store)
        cold = time.perf_counter() - t
        assert len(rows) == runs, (kind, len(rows))
        run_ids = store.list()

        def floor() -> None:
            found = store.index_get_many(run_ids)
            assert len(found) == runs
            for raw in found.values():
                loads(raw)

        def cli() -> None:
            with contextlib.redirect_stdout(io.StringIO()):
                assert cli_main(["--store", url, "list", "--json"]) == 0

        floor_s = best(floor, repeats)
        warm_s = best(lambda: list_runs(store), repeats)
        cli_s = best(cli, repeats)
        lease = store.acquire("run-00000")
        try:
            tail = journal.decode("run-00000", store.load_held(lease))[1]
            store.append("run-00000", journal.encode([{"type": "waypoint", "n": 4, "note": "more"}], tail)[0],
                         lease=lease, seq=tail.seq)
        finally:
            lease.release()
        t = time.perf_counter()
        after = list_runs(store)
        changed_s = time.perf_counter() - t
        assert after[0].summary["waypoints"] == 4
        return {"store": kind, "runs": runs, "write_s": built, "cold_s": cold, "floor_s": floor_s, "warm_s": warm_s,
                "cli_s": cli_s, "one_changed_s": changed_s}
    finally:
        store.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=10_000)
    parser.add_argument("--s3-runs", type=int, default=1_000,
                        help="runs on S3 (moto on loopback writes ~20 runs/s: 10,000 would take ~10 minutes)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--only", default=",".join(KINDS), help="comma-separated: " + ", ".join(KINDS))
    args = parse_args(parser, "run_index", quick={"runs": 200, "repeats": 1, "only": "local,sqlite"})
    wanted = [k.strip() for k in args.only.split(",") if k.strip()]
    results: list[dict] = []
    skipped: dict[str, str] = {}
    with workdir("bench-index-", args) as (work, mount):
        servers: list[Any] = []
        try:
            for kind in wanted:
                if kind == "local":
                    url = str(work / "local")
                elif kind == "sqlite":
                    url = f"sqlite:///{work / 'runs.db'}"
                elif kind == "postgres":
                    pg_server = load_helper("pg_server")
                    if not pg_server.available():
                        skipped[kind] = "no PostgreSQL server binaries"
                        continue
                    pg = pg_server.PgServer.start()
                    servers.append(pg)
                    url = f"{pg.dsn}?create_schema=1"
                elif kind == "s3":
                    s3_server = load_helper("s3_server")
                    if not s3_server.available():
                        skipped[kind] = "moto server not installed"
                        continue
                    s3 = s3_server.S3Server.start()
                    servers.append(s3)
                    bucket = f"index-{uuid.uuid4().hex[:8]}"
                    s3.create_bucket(bucket)
                    url = (f"s3://{bucket}/runs?endpoint={s3.endpoint}&region=us-east-1&access_key_id=testing"
                           "&secret_access_key=testing&allow_http=true")
                else:
                    skipped[kind] = "unknown store kind"
                    continue
                runs = min(args.runs, args.s3_runs) if kind == "s3" else args.runs
                say(f"{kind}: writing {runs:,} runs ...")
                results.append(measure(kind, url, runs, args.repeats))
        finally:
            for server in servers:
                server.stop()
    rows = [[r["store"], f"{r['runs']:,}", fmt_time(r["cold_s"]), fmt_time(r["floor_s"]), fmt_time(r["warm_s"]),
             fmt_ratio(r["warm_s"] / r["floor_s"]), fmt_time(r["cli_s"]), fmt_time(r["one_changed_s"])] for r in results]
    say()
    say("\n".join(md_table(["store", "runs", "cold list (no index)", "floor: read the index", "list_runs", "÷ floor",
                            "caravanserai list --json", "list after 1 run changed"], rows)))
    for kind, why in skipped.items():
        say(f"skipped {kind}: {why}")
    for r in results:
        if r["store"] in ("local", "sqlite"):
            say_verdict(r["cli_s"] < TARGET_S, f"{r['store']}: caravanserai list --json of {r['runs']:,} runs < 1 s",
                        f"{fmt_time(r['cli_s'])} (list_runs {fmt_time(r['warm_s'])}, floor {fmt_time(r['floor_s'])})")
    save_results(args.out, {"machine": machine_notes(), "mount": mount, "results": results, "skipped": skipped,
                            "quick": args.quick})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

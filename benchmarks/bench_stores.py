"""Durable append latency per store backend, next to the physical floor measured in the same run.

    python benchmarks/bench_stores.py [--quick] [--rounds K] [--n N] [--only local,sqlite,...] [--dir PATH] [--out FILE]

One command: it starts its own PostgreSQL (``tests/servers/pg_server.py``: initdb + pg_ctl, through
``runuser -u postgres`` as root, data directory inside the work dir) and moto S3 server
(``tests/servers/s3_server.py``), both on 127.0.0.1, plus the journal service
(``caravanserai.stores.http_service.serve``), and stops them all at the end. The work dir is a fresh
``bench-stores-XXXX`` next to the repo (the real disk, ext4 here; ``--dir`` moves it), deleted
afterwards (``--keep``). ``--quick`` (N=30, 1 round) runs local, sqlite and http only, and says so:
PostgreSQL, S3 and the peers need servers (name them in ``--only`` to include them).

Per backend, each in a fresh process (``benchmarks/_stores_worker.py``):

- ours: ``with caravanserai.durable(run_id, store=URL) as run: run.checkpoint({"i": i}, "note")``:
  20 untimed checkpoints, then N=1,000 timed one at a time (one journal append each, durable on
  return); the store's ``append`` and the I/O call under it are timed on the side;
- the floor, on the same disk / server: local and sqlite: ``os.write`` of a 152 B record +
  ``os.fdatasync`` (and, for sqlite, a bare SQLite WAL ``synchronous=FULL`` INSERT commit);
  postgres: a bare single-row INSERT + COMMIT (autocommit); s3: a bare ``obstore.put`` of 152 B;
  http: a bare POST round trip to the same service;
- the peers, on the same PostgreSQL, from ``benchmarks/.venv-peers``: LangGraph's
  ``PostgresSaver`` with ``durability="sync"`` (a 1-node graph looping N super-steps, one
  checkpoint each) and DBOS (one workflow of N ``@DBOS.step``s), as in
  ``shared/recipes/peers/durable-peers.md``.

Rounds are interleaved (floor, ours, ...; the order of each pair flips every round) because this
disk's fsync latency is bimodal. Medians and p99 are over the pooled samples of all rounds; the
ratio is ours' median / the floor's median. Target: ours <= 1.5x its floor. A report, not a test:
exit status 0 either way. On a MISS, one more run of that backend under cProfile shows where the
time goes (``benchmarks/results/stores_profile_<backend>.txt``). Raw numbers, every sample
included: ``benchmarks/results/stores.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from _common import (
    HERE,
    PEER_PINS,
    REPO,
    VENV_PEERS,
    describe,
    fmt_load,
    fmt_us,
    load_helper,
    loadavg,
    machine_notes,
    md_table,
    parse_args,
    peer_python,
    reexec_in_repo_venv,
    run_result_worker,
    save_results,
    say,
    versions_of,
    workdir,
    worker_command,
)

sys.path.insert(0, str(REPO / "tests"))  # the tests' own server helpers: tests/servers
from servers._proc import free_port, stop_process_group  # noqa: E402

WORKER = HERE / "_stores_worker.py"
TARGET = 1.5
BACKENDS = ("local", "sqlite", "postgres", "s3", "http")
PEERS = ("langgraph", "dbos")
NEEDS_SERVER = {"postgres": "a PostgreSQL server", "s3": "a moto S3 server", "langgraph": "PostgreSQL and the peers' venv",
                "dbos": "PostgreSQL and the peers' venv"}
PEER_BASE = {k: v for k, v in PEER_PINS.items() if k != "langgraph-checkpoint-sqlite"}
PEER_EXTRA = ["langgraph-checkpoint-postgres", "psycopg[binary]", "psycopg-pool"]


# ---- servers ------------------------------------------------------------------------------------
class Servers:
    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.pg = None
        self.s3 = None
        self.http_proc: subprocess.Popen | None = None
        self.notes: dict = {}

    def start_pg(self) -> str:
        pg_server = load_helper("pg_server")
        os.environ.pop("TEST_PG_DSN", None)  # always our own, on this disk
        old = tempfile.tempdir
        tempfile.tempdir = str(self.workdir)  # the helper's mkdtemp: data dir on the bench disk
        try:
            t = time.perf_counter()
            self.pg = pg_server.PgServer.start()
            self.notes["pg_start_s"] = time.perf_counter() - t
        finally:
            tempfile.tempdir = old
        self.notes["pg_data_dir"] = self.pg.data_dir
        return self.pg.dsn

    def start_s3(self, bucket: str) -> str:
        s3_server = load_helper("s3_server")
        t = time.perf_counter()
        self.s3 = s3_server.S3Server.start()
        self.s3.create_bucket(bucket)
        self.notes["s3_start_s"] = time.perf_counter() - t
        return self.s3.endpoint

    def start_http(self, backing: str) -> tuple[str | None, str]:
        """(url with token, note); url None when the service did not start."""
        port, token = free_port(), secrets.token_hex(16)
        log = open(self.workdir / "http-service.log", "w")
        self.http_stats = self.workdir / "http-service-stats.json"
        cmd, env = worker_command(sys.executable, WORKER, ["serve", "--backing", backing, "--port", str(port), "--token",
                                                           token, "--stats", str(self.http_stats)], ours=True)
        self.http_proc = subprocess.Popen(cmd, env=env, cwd=str(self.workdir), stdout=log, stderr=subprocess.STDOUT,
                                          start_new_session=True)
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.http_proc.poll() is not None:
                break
            try:
                urllib.request.urlopen(base + "/health", timeout=1).read()
                return f"{base}/?token={token}", f"caravanserai.stores.http_service.serve on {base}, backed by {backing}"
            except OSError:
                time.sleep(0.1)
        log.flush()
        tail = (self.workdir / "http-service.log").read_text(errors="replace").strip().splitlines()[-3:]
        self.stop_http()
        return None, "service did not start: " + " | ".join(tail)

    def stop_http(self) -> None:
        if self.http_proc is None:
            return
        stop_process_group(self.http_proc, grace=10)
        self.http_proc = None
        try:
            self.notes["http_service_timings"] = json.loads(self.http_stats.read_text())
        except (OSError, ValueError, AttributeError):
            pass

    def stop(self) -> None:
        self.stop_http()
        if self.s3 is not None:
            self.s3.stop()
            self.s3 = None
        if self.pg is not None:
            self.pg.stop()
            self.pg = None


def create_database(dsn: str, name: str) -> str:
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}"')
        conn.execute(f'CREATE DATABASE "{name}"')
    return dsn.rsplit("/", 1)[0] + "/" + name


# ---- running workers ----------------------------------------------------------------------------
class Runner:
    def __init__(self, peers_python: Path | None, workdir: Path, timeout: float) -> None:
        self.peers_python, self.workdir, self.timeout = peers_python, workdir, timeout

    def __call__(self, mode: str, *args: str, peer: bool = False) -> dict:
        cmd, env = worker_command(self.peers_python if peer else sys.executable, WORKER, [mode, *args], ours=not peer)
        return run_result_worker(cmd, cwd=self.workdir, env=env, timeout=self.timeout, label=mode)


def pooled(results: list[dict]) -> list[float]:
    return [s for r in results if "samples_us" in r for s in r["samples_us"]]


def summary(samples_us: list[float]) -> dict | None:
    return describe(samples_us, scale=1) if samples_us else None


def table(header: list[str], rows: list[list[str]]) -> str:
    return "\n".join(md_table(header, rows))


# ---- main ---------------------------------------------------------------------------------------
def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=1000, help="timed checkpoints / appends per process (default 1,000)")
    parser.add_argument("--warmup", type=int, default=20, help="untimed ones before them (default 20)")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds (default 3)")
    parser.add_argument("--only", help="comma list of local,sqlite,postgres,s3,http,langgraph,dbos")
    parser.add_argument("--no-peers", action="store_true", help="skip LangGraph and DBOS")
    parser.add_argument("--http-backing", choices=("local", "sqlite"), default="local",
                        help="the store behind the journal service (default: a local directory on the bench disk)")
    parser.add_argument("--no-paired", action="store_true", help="skip the runs with the floor op in ours' process")
    parser.add_argument("--no-profile", action="store_true", help="do not profile a backend that misses the target")
    parser.add_argument("--timeout", type=float, default=600, help="seconds per worker process (default 600)")
    args = parse_args(parser, "stores", quick={"n": 30, "warmup": 5, "rounds": 1})
    wanted = [w.strip() for w in (args.only or ",".join((*BACKENDS, *PEERS))).split(",") if w.strip()]
    unknown = set(wanted) - {*BACKENDS, *PEERS}
    if unknown:
        parser.error(f"unknown backend(s) {sorted(unknown)}")
    if args.no_peers:
        wanted = [w for w in wanted if w not in PEERS]
    if args.quick and not args.only:
        for name in NEEDS_SERVER:
            say(f"{name}: skipped in --quick (needs {NEEDS_SERVER[name]}; name it in --only to include it)")
        wanted = [w for w in wanted if w not in NEEDS_SERVER]
    with workdir("bench-stores-", args) as (work, mount):
        os.chmod(work, 0o755)  # the postgres user must reach its data dir inside
        return measure(args, wanted, work, mount)


def measure(args: argparse.Namespace, wanted: list[str], work: Path, mount: dict) -> int:
    notes = {**machine_notes(), "workdir": str(work), "mount": mount, "args": vars(args), "interpreter": sys.executable}
    notes["versions_ours"] = versions_of(sys.executable, ("psycopg", "psycopg-binary", "obstore", "moto", "httpx",
                                                          "starlette", "uvicorn"), ours=True)
    say(f"ours: {sys.executable} (PYTHONPATH={REPO}); " + ", ".join(f"{k} {v}" for k, v in notes["versions_ours"].items() if v))

    peers_python, peers_why = (None, "not requested")
    if set(wanted) & set(PEERS):
        peers_python, peers_why = peer_python(VENV_PEERS, PEER_BASE, "import langgraph.checkpoint.postgres, psycopg, "
                                              "psycopg_pool, dbos", install=not args.quick, extra=PEER_EXTRA)
        if peers_python:
            notes["versions_peers"] = versions_of(peers_python, (*PEER_BASE, "langgraph-checkpoint-postgres",
                                                                 "SQLAlchemy", "psycopg", "psycopg-binary", "psycopg-pool"))
            say(f"peers: {peers_python} (-I): " + ", ".join(f"{k} {v}" for k, v in notes["versions_peers"].items() if v))
        else:
            say(f"peers: NOT RUN: {peers_why}")
            wanted = [w for w in wanted if w not in PEERS]

    servers = Servers(work)
    runner = Runner(peers_python, work, args.timeout)
    raw: dict[str, list[dict]] = {}
    unavailable: dict[str, str] = {}
    profiles: dict[str, dict] = {}

    def on_term(signum, frame):  # noqa: ANN001
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_term)
    started = time.perf_counter()
    try:
        dsn = endpoint = http_url = lg_dsn = None
        if set(wanted) & {"postgres", "langgraph", "dbos"}:
            try:
                dsn = servers.start_pg()
                say(f"postgres: {dsn} (data {servers.notes['pg_data_dir']}, started in {servers.notes['pg_start_s']:.2f} s)")
            except Exception as exc:  # noqa: BLE001
                for w in ("postgres", "langgraph", "dbos"):
                    unavailable[w] = f"PostgreSQL did not start: {exc}"
        if "s3" in wanted:
            try:
                endpoint = servers.start_s3("bench")
                say(f"s3: moto server {endpoint} (started in {servers.notes['s3_start_s']:.2f} s)")
            except Exception as exc:  # noqa: BLE001
                unavailable["s3"] = f"moto did not start: {exc}"
        if "http" in wanted:
            backing = str(work / "http-backing") if args.http_backing == "local" else \
                f"sqlite:///{work / 'http-backing.db'}"
            http_url, why = servers.start_http(backing)
            say(f"http: {why}")
            if http_url is None:
                unavailable["http"] = why
        if dsn and "langgraph" in wanted:
            lg_dsn = create_database(dsn, "bench_langgraph")
        wanted = [w for w in wanted if w not in unavailable]
        say(f"measuring {', '.join(wanted)}: N={args.n} (+{args.warmup} warm-up) per process x {args.rounds} rounds\n")

        s3_opts = f"endpoint={endpoint}&region=us-east-1&access_key_id=testing&secret_access_key=testing"
        common = ["--n", str(args.n), "--warmup", str(args.warmup), "--dir", str(work)]

        def ours_url(backend: str, k: int) -> str:
            return {"local": str(work / "local-store"),
                    "sqlite": f"sqlite:///{work / 'sqlite-store' / 'journal.db'}",
                    "postgres": f"{dsn}?table=bench_journal&create_schema=1&lease_ttl_ms=30000",
                    "s3": f"s3://bench/ours?{s3_opts}",
                    "http": http_url or ""}[backend]

        def job(name: str, *a: str, peer: bool = False) -> None:
            result = runner(name.split(":")[0], *a, peer=peer)
            result["round"] = k
            raw.setdefault(name.split(":", 1)[1] if ":" in name else name, []).append(result)
            st = result.get("stats") or {}
            label = name.split(":", 1)[1] if ":" in name else name
            pf = result.get("paired_floor")
            load = result.get("loadavg_end")
            say(f"  round {k + 1} {label:<15} " + (f"[load {load[0]:4.1f}] " if load else "")
                + (f"median {fmt_us(st.get('median_us')):>8}  p99 {fmt_us(st.get('p99_us')):>8}"
                   + (f"   (floor in the same process: median {fmt_us(pf['median_us'])}, "
                      f"p99 {fmt_us(pf['p99_us'])})" if pf else "")
                   if "error" not in result else f"ERROR {result['error']}"))

        for k in range(args.rounds):
            flip = k % 2 == 1
            pairs = []
            if {"local", "sqlite"} & set(wanted):
                pairs.append([("floor_fsync:floor_fsync", ["--tag", f"a{k}"], False)])
            peers_only = "postgres" not in wanted and bool({"langgraph", "dbos"} & set(wanted))
            for backend in ("local", "sqlite", "postgres", "s3", "http"):
                if backend not in wanted and not (backend == "postgres" and peers_only):
                    continue
                floor = {"local": None, "sqlite": ("floor_sqlite", ["--tag", f"{k}"]),
                         "postgres": ("floor_pg", ["--dsn", dsn or "", "--tag", f"r{k}"]),
                         "s3": ("floor_s3", ["--url", f"s3://bench?{s3_opts}", "--tag", f"r{k}"]),
                         "http": ("floor_http", ["--url", http_url or ""])}[backend]
                ours_job = (f"ours:ours_{backend}", ["--url", ours_url(backend, k), "--run-id", f"bench-{backend}-r{k}"], False)
                paired_job = (f"ours:paired_{backend}", ["--url", ours_url(backend, k), "--run-id", f"bench-{backend}-p{k}",
                                                          "--paired", "--dsn", dsn or ""], False)
                pair = [ours_job] if floor is None else [(f"{floor[0]}:{floor[0]}", floor[1], False), ours_job]
                if backend not in wanted:  # the peers' floor only
                    pair = pair[:1]
                if backend == "postgres":
                    if "langgraph" in wanted:
                        pair.append(("lg_pg:lg_pg", ["--dsn", lg_dsn, "--tag", f"r{k}"], True))
                    if "dbos" in wanted:
                        pair.append(("dbos_pg:dbos_pg", ["--dsn", create_database(dsn, f"bench_dbos_r{k}"), "--tag", f"r{k}"],
                                     True))
                pairs.append(list(reversed(pair)) if flip and len(pair) > 1 else pair)
                if not args.no_paired and backend in wanted:
                    pairs.append([paired_job])
                if backend == "sqlite":
                    pairs.append([("floor_fsync:floor_fsync", ["--tag", f"b{k}"], False)])
            for pair in pairs:
                for name, a, peer in pair:
                    job(name, *a, *common, peer=peer)

        # ---- assemble ----------------------------------------------------------------------------
        def summ(key: str) -> dict | None:
            return summary(pooled(raw.get(key, [])))

        floors = {"local": "floor_fsync", "sqlite": "floor_fsync", "postgres": "floor_pg", "s3": "floor_s3",
                  "http": "floor_http"}
        floor_label = {"floor_fsync": "write+fdatasync 152 B, same disk",
                       "floor_sqlite": "bare SQLite WAL synchronous=FULL INSERT commit",
                       "floor_pg": "bare 1-row INSERT + COMMIT (autocommit), same server",
                       "floor_s3": "bare obstore PUT 152 B, same moto server",
                       "floor_http": "bare POST round trip, same service"}
        rows, verdicts = [], {}
        summary_out: dict = {}
        for backend in BACKENDS:
            if backend in unavailable and backend in (args.only or ",".join(BACKENDS)).split(","):
                rows.append([backend, "-", "-", "-", "-", f"not run: {unavailable[backend]}"[:60], "-", "-"])
                continue
            if backend not in wanted:
                continue
            o, f = summ(f"ours_{backend}"), summ(floors[backend])
            if not o or not f:
                rows.append([backend, "-", "-", "-", "-", "ERROR (see JSON)", "-", "-"])
                continue
            ratio = o["median_us"] / f["median_us"]
            ok = ratio <= TARGET
            verdicts[backend] = {"ratio": ratio, "pass": ok}
            per_round = []
            for r in range(args.rounds):
                orr = [x for x in raw.get(f"ours_{backend}", []) if x.get("round") == r and "stats" in x]
                frr = [x for x in raw.get(floors[backend], []) if x.get("round") == r and "stats" in x]
                if orr and frr:
                    per_round.append(orr[0]["stats"]["median_us"] / statistics.median(x["stats"]["median_us"] for x in frr))
            verdicts[backend]["per_round_ratios"] = per_round
            summary_out[backend] = {"ours": o, "floor": f, "floor_kind": floors[backend], "ratio": ratio, "pass": ok,
                                    "per_round_ratios": per_round}
            pr = [r for r in raw.get(f"paired_{backend}", []) if "paired_floor_us" in r]
            paired = None
            if pr:
                po, pf = summary(pooled(pr)), summary([x for r in pr for x in r["paired_floor_us"]])
                paired = {"ours": po, "floor": pf, "ratio": po["median_us"] / pf["median_us"],
                          "floor_what": pr[0]["paired_floor"]["what"],
                          "per_round_ratios": [r["stats"]["median_us"] / r["paired_floor"]["median_us"] for r in pr]}
                summary_out[backend]["paired"] = paired
            if paired:
                verdicts[backend]["paired_ratio"] = paired["ratio"]
                verdicts[backend]["paired_pass"] = paired["ratio"] <= TARGET
            rows.append([backend, fmt_us(o["median_us"]), fmt_us(o["p99_us"]), fmt_us(f["median_us"]), f"{ratio:.2f}x",
                         "PASS" if ok else "MISS",
                         f"{fmt_us(paired['ours']['median_us'])} / {fmt_us(paired['floor']['median_us'])} "
                         f"= {paired['ratio']:.2f}x" if paired else "-",
                         ("PASS" if paired["ratio"] <= TARGET else "MISS") if paired else "-"])
            if backend == "sqlite" and summ("floor_sqlite"):
                fs = summ("floor_sqlite")
                summary_out["sqlite"]["vs_bare_sqlite"] = {"floor": fs, "ratio": o["median_us"] / fs["median_us"]}
                rows.append(["  sqlite vs bare SQLite WAL FULL commit", fmt_us(o["median_us"]), fmt_us(o["p99_us"]),
                             fmt_us(fs["median_us"]), f"{o['median_us'] / fs['median_us']:.2f}x", "(info)", "-", "-"])
        for peer, key, label in (("langgraph", "lg_pg", "LangGraph PostgresSaver sync (peer)"),
                                 ("dbos", "dbos_pg", "DBOS step on Postgres (peer)")):
            if peer in unavailable:
                rows.append([label, "-", "-", "-", "-", f"not run: {unavailable[peer]}"[:60], "-", "-"])
                continue
            if peer not in wanted:
                continue
            p, f = summ(key), summ("floor_pg")
            if not p or not f:
                rows.append([label, "-", "-", "-", "-", "ERROR (see JSON)", "-", "-"])
                continue
            summary_out[peer] = {"peer": p, "floor": f, "ratio": p["median_us"] / f["median_us"]}
            rows.append([label, fmt_us(p["median_us"]), fmt_us(p["p99_us"]), fmt_us(f["median_us"]),
                         f"{p['median_us'] / f['median_us']:.2f}x", "-", "-", "-"])

        # ---- profile the misses --------------------------------------------------------------------
        misses = [b for b, v in verdicts.items() if not v["pass"] or not v.get("paired_pass", True)]
        if misses and not args.no_profile:
            say("\nprofiling the backends that missed (one more process each, under cProfile) ...")
            for backend in misses:
                path = args.out.parent / f"stores_profile_{backend}.txt"
                path.parent.mkdir(parents=True, exist_ok=True)
                k = args.rounds
                result = runner("ours", "--url", ours_url(backend, k), "--run-id", f"bench-{backend}-profile",
                                "--profile", str(path), *common)
                profiles[backend] = result
                if "error" in result:
                    say(f"  {backend}: ERROR {result['error']}")

        servers.stop_http()  # its own timings are written when it stops
        # ---- print ---------------------------------------------------------------------------------
        say("")
        say(table(["backend", "ours median", "ours p99", "floor median", "ratio ours/floor", f"target (<= {TARGET}x)",
                   "paired: ours / floor, one process", "paired target"], rows))
        say("")
        for backend in BACKENDS:
            if backend in summary_out:
                say(f"floor for {backend:<8}: {floor_label[floors[backend]]}; "
                    f"p99 {fmt_us(summary_out[backend]['floor']['p99_us'])}; "
                    f"ratio per round: {', '.join(f'{x:.2f}x' for x in summary_out[backend]['per_round_ratios'])}")
        if "sqlite" in summary_out and "vs_bare_sqlite" in summary_out["sqlite"]:
            say(f"bare SQLite commit: {floor_label['floor_sqlite']}; p99 "
                f"{fmt_us(summary_out['sqlite']['vs_bare_sqlite']['floor']['p99_us'])}")
        for s3r in raw.get("floor_s3", [])[:1]:
            if "create" in s3r:
                say(f"s3 floor with mode='create' (If-None-Match), round 1: median {fmt_us(s3r['create']['median_us'])}")
        for backend in ("http",):
            if backend in unavailable:
                say(f"http: {unavailable[backend]}")
        peer_lines = []
        for key, label in (("lg_pg", "LangGraph"), ("dbos_pg", "DBOS")):
            ok = [r for r in raw.get(key, []) if "stats" in r]
            if ok:
                peer_lines.append(f"{label}: whole run / N = {fmt_us(statistics.median(r['total_per_step_us'] for r in ok))} "
                                  f"per step, CPU {fmt_us(statistics.median(r['cpu_us_per_step'] for r in ok))} per step")
        if peer_lines:
            say("peers (sample = gap between consecutive node/step entries): " + "; ".join(peer_lines))

        # where ours' time goes
        say("\nwhere ours' time goes (medians over all rounds' processes; us per checkpoint):")
        prow = []
        for backend in BACKENDS:
            ok = [r for r in raw.get(f"ours_{backend}", []) if "stats" in r]
            if not ok:
                continue
            med = lambda f, ok=ok: statistics.median(f(r) for r in ok)  # noqa: E731
            part = lambda name, med=med: med(lambda rec: rec["parts"].get(name, {}).get("median_us") or 0.0)  # noqa: E731
            prow.append([backend, fmt_us(summary_out.get(backend, {}).get("ours", {}).get("median_us")),
                         fmt_us(part("store.append")), f"{fmt_us(part('io'))} ({ok[0]['io_name']})",
                         fmt_us(part("append - io")), fmt_us(part("outside store.append")),
                         f"{fmt_us(med(lambda r: r['cpu_user_us_per_ckpt']))} + "
                         f"{fmt_us(med(lambda r: r['cpu_sys_us_per_ckpt']))}",
                         f"{med(lambda r: r['durable_open_s']) * 1e3:.1f} ms", f"{med(lambda r: r['close_s']) * 1e3:.1f} ms"])
        if prow:
            say(table(["backend", "checkpoint", "store.append", "I/O inside it (what)", "append - I/O", "outside append",
                       "CPU user + sys", "durable() open", "close"], prow))
            say("(each column is the median of its own samples, so they need not add up; CPU is per checkpoint, all "
                "threads of ours' process)")
        plines = []
        for backend in BACKENDS:
            pr = [r for r in raw.get(f"paired_{backend}", []) if "paired_floors" in r]
            if not pr:
                continue
            o = summary(pooled(pr))
            parts = [f"ours {fmt_us(o['median_us'])} (p99 {fmt_us(o['p99_us'])})"]
            for name, first in pr[0]["paired_floors"].items():
                f = summary([x for r in pr for x in r["paired_floors"][name]["samples_us"]])
                parts.append(f"{first['what']}: {fmt_us(f['median_us'])} (p99 {fmt_us(f['p99_us'])}) -> "
                             f"ours/this {o['median_us'] / f['median_us']:.2f}x")
            parts.append("per round (ours / floor): " + ", ".join(
                f"{fmt_us(r['stats']['median_us'])} / {fmt_us(r['paired_floor']['median_us'])} = "
                f"{r['stats']['median_us'] / r['paired_floor']['median_us']:.2f}x" for r in pr))
            plines.append(f"  {backend}: " + "\n      ".join(parts))
        if plines:
            say("\nfloors measured in ours' own process, one of each next to every checkpoint (order alternating), "
                "pooled over rounds:")
            say("\n".join(plines))
        timings = servers.notes.get("http_service_timings")
        if timings:
            say("\nthe journal service's own time (all requests of the run, inside the service process):")
            for name, st in sorted(timings.items()):
                if st.get("n"):
                    say(f"  {name}: median {fmt_us(st['median_us'])}, p99 {fmt_us(st['p99_us'])} (n={st['n']})")
        for backend, result in profiles.items():
            if "profile_top_tottime" not in result:
                continue
            top = result["profile_top_tottime"]
            per_ckpt = result["loop_s"] / args.n * 1e6
            waits = [e for e in top if e["tottime_us_per_ckpt"] > 0.3 * per_ckpt]
            say(f"\ncProfile of ours on {backend} (a MISS above): {per_ckpt:.0f} us per checkpoint under the profiler "
                f"(mean); full listing: {args.out.parent / f'stores_profile_{backend}.txt'}")
            for e in waits:
                say(f"  waiting: {e['tottime_us_per_ckpt']:8.1f} us  {e['function']}")
            say("  the rest, by own time (us per checkpoint, inflated by the profiler):")
            for e in [e for e in top if e not in waits][:8]:
                say(f"  {e['tottime_us_per_ckpt']:8.1f} own  {e['cumtime_us_per_ckpt']:8.1f} cum  "
                    f"{e['calls_per_ckpt']:5.2f} calls  {e['function']}")
        notes["servers"] = servers.notes
        notes["unavailable"] = unavailable
        notes["loadavg_end"] = loadavg()
        notes["wall_s"] = time.perf_counter() - started
        for r in raw.get("floor_pg", [])[:1]:
            notes["postgres_settings"] = r.get("settings")
            say("\npostgres: " + ", ".join(f"{k}={v}" for k, v in (r.get("settings") or {}).items()))
        say(f"\nwall time {notes['wall_s']:.0f} s; load average {fmt_load(notes['loadavg_start'])} at start, "
            f"{fmt_load(notes['loadavg_end'])} at end")
        save_results(args.out, {"notes": notes, "target_ratio": TARGET, "summary": summary_out, "verdicts": verdicts,
                                "profiles": profiles, "raw": raw})
    except KeyboardInterrupt:
        say("interrupted: stopping servers")
    finally:
        servers.stop()
    return 0


if __name__ == "__main__":
    # Under the repo's .venv (psycopg, obstore, moto live there), whatever ``python`` was.
    reexec_in_repo_venv(__file__, "_BENCH_STORES_REEXEC")
    sys.exit(main())

"""A fleet of writers on one store: N writer processes against one shared store, next to N processes
doing the store's bare operation, measured in the same run; then faults, with every journal checked.

    python benchmarks/bench_fleet.py [--quick] [--backends postgres,http,s3] [--writers 1,8,32,64]
                                     [--seconds S] [--fault-writers K] [--no-faults]
                                     [--pg-url DSN] [--s3-url s3://bucket/prefix?endpoint=...] [--out FILE]

One command. It starts its own PostgreSQL (``tests/servers/pg_server.py``, a private cluster with its
data directory in the work dir, on the real disk), moto's S3 server (``tests/servers/s3_server.py``)
and the journal service (``benchmarks/_stores_worker.py serve``, backed by that PostgreSQL), all on
127.0.0.1, and stops them at the end. ``--pg-url`` / ``--s3-url`` use servers of yours instead (a
bigger machine; the PostgreSQL restart and the servers' CPU are then not measured). Every lease is
``lease_ttl_ms=3000``, the minimum.

Backends and fleet sizes (``--writers`` overrides them all):

- ``postgres``  ``postgresql://…?table=fleet_journal``: 1, 8, 32, 64 writers;
- ``http``      the journal service backed by the same PostgreSQL: 1, 8, 32, 64 clients;
- ``s3``        ``s3://…`` on moto: 1, 8, 16 writers.

Per backend and N: N writer processes (``benchmarks/_fleet_worker.py writer``), each on its own run,
``with caravanserai.durable(run_id, store=URL) as run: run.checkpoint({"i": i}, f"step {i} …")`` in a
loop, all started on one wall-clock window once every process has imported, connected and made one
untimed checkpoint; then N ``floor`` processes doing the backend's bare operation (PostgreSQL a
single-row INSERT + COMMIT, autocommit; S3 one ``obstore.put`` of 152 B; HTTP a bare POST of 152 B to
the service's ``/health``) for the same window. Reported: acknowledged appends/s over the window,
p50/p99 of every append's latency, the scaling curve (appends/s against one writer's), CPU per
append on the client side (``time.process_time`` of every writer, all threads) and on the server
side (``/proc`` of the postmaster and its backends, of the service process, of moto), and the ratio
to the floor of the same N.

Faults, per backend (bounded, loopback only; ``--fault-writers`` writers each: by default 64, the
issue's fleet, and 16 on S3, its largest fleet there):

(a) SIGKILL a quarter of the writers at random moments; a standby process per victim (already
    imported and connected) is told at once and takes the run over: takeover = the kill to the first
    append the standby has acknowledged;
(b) SIGSTOP one holder past the lease TTL while a standby takes its run over, then SIGCONT it: its
    late append must fail with a typed ``LeaseLost`` and be absent from the journal;
(c) PostgreSQL: ``pg_ctl restart -m fast`` mid-run: the time from the server accepting connections
    again to each writer's next acknowledged append;
(d) the journal service: SIGKILL it mid-run and start it again on the same port: the same measure.

After everything, every run's journal is read back (``_fleet_worker.py check``): every acknowledged
``i`` (from the writers' ack files, which survive a SIGKILL) present, waypoint states contiguous
from 0 with no duplicate and in order, no refused append visible. Targets (PASS/MISS): PostgreSQL
with 64 writers >= 0.5x the floor of 64 processes and p99 <= 10x p50; no writer loses its own
lease without another holder; takeover after SIGKILL <= TTL + 1 s on every backend; after a
PostgreSQL restart every writer appends again within 5 s; 0 acknowledged appends lost, 0
duplicates, 0 fenced appends visible; journal service: 8 clients >= 4x one client's throughput and
client CPU per append <= 200 us.

``--quick``: PostgreSQL and the journal service, 1 and 4 writers for 2 s each, and one small fault
scenario (SIGKILL 1 of 2 writers on PostgreSQL); S3 only when named in ``--backends``. Its figures
mean nothing. A report, not a test: exit status 0 either way. Raw numbers, every sample included:
``benchmarks/results/fleet.json``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import secrets
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from _common import (
    HERE,
    REPO,
    describe,
    fmt_load,
    fmt_us,
    fsync_floor,
    load_helper,
    loadavg,
    machine_notes,
    parse_args,
    reexec_in_repo_venv,
    run_result_worker,
    save_results,
    say,
    sleep_until,
    versions_of,
    workdir,
    worker_command,
)
from _fleet_report import LABEL, TTL_MS, fault_line, print_setup, report  # noqa: E402

FAULT_WRITERS, FAULT_WRITERS_S3 = 64, 16  # the fleet; S3 (moto) tops out at 16 writers here

sys.path.insert(0, str(REPO / "tests"))  # the tests' own server helpers: tests/servers
from servers._proc import free_port, stop_process_group  # noqa: E402

WORKER = HERE / "_fleet_worker.py"
STORES_WORKER = HERE / "_stores_worker.py"  # its ``serve`` mode runs the journal service
FLEETS = {"postgres": [1, 8, 32, 64], "http": [1, 8, 32, 64], "s3": [1, 8, 16]}
BACKENDS = tuple(FLEETS)
FLOOR_TABLE = "fleet_floor"
CLK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def with_options(url: str, **options: object) -> str:
    """``url`` with these query options set (replacing any of the same name)."""
    parts = urlsplit(url)
    query = [(k, v) for k, v in parse_qsl(parts.query, keep_blank_values=True) if k not in options]
    query += [(k, str(v)) for k, v in options.items()]
    return urlunsplit((parts.scheme, parts.netloc, parts.path, urlencode(query), parts.fragment))


def without_query(url: str) -> str:
    parts = urlsplit(url)
    return urlunsplit((parts.scheme, parts.netloc, parts.path, "", ""))


# ---- the servers' CPU, from /proc ------------------------------------------------------------------
def proc_stats() -> dict[int, tuple[int, int, int]]:
    """pid -> (ppid, own utime + stime, reaped children's cutime + cstime), in clock ticks."""
    table = {}
    for name in os.listdir("/proc") if os.path.isdir("/proc") else ():
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", encoding="ascii", errors="replace") as handle:
                text = handle.read()
        except OSError:
            continue
        fields = text[text.rindex(")") + 2:].split()
        table[int(name)] = (int(fields[1]), int(fields[11]) + int(fields[12]), int(fields[13]) + int(fields[14]))
    return table


def tree_ticks(roots: list[int]) -> dict:
    """Per process of the trees under ``roots``: own ticks; plus the roots' reaped children's ticks."""
    table = proc_stats()
    children: dict[int, list[int]] = {}
    for pid, (ppid, _, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    own, reaped, todo = {}, 0, [r for r in roots if r in table]
    for root in todo:
        reaped += table[root][2]
    while todo:
        pid = todo.pop()
        own[pid] = table[pid][1]
        todo.extend(children.get(pid, []))
    return {"own": own, "reaped": reaped}


def cpu_between(before: dict, after: dict) -> float:
    """Seconds of CPU the trees used between two ``tree_ticks`` (processes that exited meanwhile and
    were not reaped by a root are missed)."""
    ticks = sum(t - before["own"].get(pid, 0) for pid, t in after["own"].items()) + after["reaped"] - before["reaped"]
    return max(0, ticks) / CLK


def reachable_by_all(path: Path) -> bool:
    """Whether every folder above ``path`` lets other users through (the postgres user runs the server)."""
    return all(os.stat(p).st_mode & 0o001 for p in [path, *path.parents])


# ---- servers --------------------------------------------------------------------------------------
class Servers:
    def __init__(self, work: Path) -> None:
        self.work = work
        self.pg = None
        self.s3 = None
        self.service: subprocess.Popen | None = None
        self.service_args: tuple[str, int, str] | None = None
        self.notes: dict = {}

    def start_pg(self) -> str:
        pg_server = load_helper("pg_server")
        old = tempfile.tempdir
        if reachable_by_all(self.work):
            tempfile.tempdir = str(self.work)  # the helper's mkdtemp: the data dir on the bench disk
        else:  # a private parent (pytest's tmp dir): the postgres user could not reach a data dir there
            self.notes["pg_data_dir_why"] = f"{self.work} is not reachable by the postgres user: data dir in the temp dir"
        try:
            t = time.perf_counter()
            self.pg = pg_server.PgServer.start(private=True)  # private: scenario (c) restarts it
            self.notes["pg_start_s"] = time.perf_counter() - t
        finally:
            tempfile.tempdir = old
        self.notes["pg_data_dir"] = self.pg.data_dir
        return self.pg.dsn

    def pg_pids(self) -> list[int]:
        if self.pg is None or not self.pg.data_dir:
            return []
        try:
            return [int(Path(self.pg.data_dir, "postmaster.pid").read_text().split()[0])]
        except (OSError, ValueError, IndexError):
            return []

    def start_s3(self, bucket: str) -> str:
        s3_server = load_helper("s3_server")
        t = time.perf_counter()
        self.s3 = s3_server.S3Server.start()
        self.s3.create_bucket(bucket)
        self.notes["s3_start_s"] = time.perf_counter() - t
        return self.s3.endpoint

    def start_service(self, backing: str, port: int | None = None, token: str | None = None) -> str:
        """The journal service (``_stores_worker.py serve``) backed by ``backing``; its client URL."""
        port, token = port or free_port(), token or secrets.token_hex(16)
        self.service_args = (backing, port, token)
        log = open(self.work / "service.log", "a")
        cmd, env = worker_command(sys.executable, STORES_WORKER, ["serve", "--backing", backing, "--port", str(port),
                                                                  "--token", token], ours=True)
        self.service = subprocess.Popen(cmd, env=env, cwd=str(self.work), stdout=log, stderr=subprocess.STDOUT,
                                        start_new_session=True)
        log.close()
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and self.service.poll() is None:
            try:
                urllib.request.urlopen(base + "/health", timeout=1).read()
                return f"{base}/?token={token}&lease_ttl_ms={TTL_MS}"
            except OSError:
                time.sleep(0.02)
        tail = (self.work / "service.log").read_text(errors="replace").strip().splitlines()[-3:]
        self.stop_service()
        raise RuntimeError("the journal service did not start: " + " | ".join(tail))

    def kill_service(self) -> None:
        """SIGKILL, no shutdown: its in-memory lease table is gone, its backing leases stay behind."""
        if self.service is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.service.pid, signal.SIGKILL)
            self.service.wait(10)
            self.service = None

    def restart_service(self) -> str:
        assert self.service_args is not None
        backing, port, token = self.service_args
        return self.start_service(backing, port, token)

    def service_pids(self) -> list[int]:
        return [self.service.pid] if self.service is not None else []

    def s3_pids(self) -> list[int]:
        return [self.s3.proc.pid] if self.s3 is not None else []

    def stop_service(self) -> None:
        if self.service is not None:
            stop_process_group(self.service, grace=10)
            self.service = None

    def stop(self) -> None:
        self.stop_service()
        if self.s3 is not None:
            self.s3.stop()
            self.s3 = None
        if self.pg is not None:
            self.pg.stop()
            self.pg = None


# ---- a fleet of worker processes on one start line ---------------------------------------------------
class Fleet:
    """Worker processes that start together: each says it is ready; ``go`` writes the shared window."""

    def __init__(self, work: Path, name: str) -> None:
        self.dir = work / "fleets" / name
        (self.dir / "acks").mkdir(parents=True, exist_ok=True)
        self.procs: dict[str, subprocess.Popen] = {}
        self.name = name

    def ack(self, label: str) -> str:
        return str(self.dir / "acks" / f"{label}.txt")

    def spawn(self, label: str, mode: str, *args: str) -> subprocess.Popen:
        cmd, env = worker_command(sys.executable, WORKER, [mode, "--label", label, "--sync", str(self.dir), *args],
                                  ours=True)
        with open(self.dir / f"{label}.out", "w") as out, open(self.dir / f"{label}.err", "w") as err:
            proc = subprocess.Popen(cmd, env=env, cwd=str(self.dir), stdout=out, stderr=err, start_new_session=True)
        self.procs[label] = proc
        return proc

    def wait_ready(self, timeout: float) -> str | None:
        """None once every process is ready; else why not."""
        deadline = time.monotonic() + timeout
        ready = self.dir / "ready"
        while time.monotonic() < deadline:
            done = set(os.listdir(ready)) if ready.is_dir() else set()
            if len(done) >= len(self.procs):
                return None
            dead = [label for label, p in self.procs.items() if p.poll() is not None and label not in done]
            if dead:
                return f"{dead[0]} exited before it was ready: {self.tail(dead[0])}"
            time.sleep(0.02)
        return f"not every process was ready within {timeout:.0f} s"

    def go(self, seconds: float, delay: float = 0.4) -> tuple[float, float]:
        start = time.time() + delay
        tmp = self.dir / "go.tmp"
        tmp.write_text(json.dumps({"start": start, "end": start + seconds}))
        os.replace(tmp, self.dir / "go")
        return start, start + seconds

    def tail(self, label: str) -> str:
        text = (self.dir / f"{label}.err").read_text(errors="replace").strip().splitlines()
        return " | ".join(text[-3:])[-600:]

    def collect(self, timeout: float) -> dict[str, dict]:
        """Each process's RESULT (or {"error": ...}); stragglers are killed after ``timeout``."""
        deadline = time.monotonic() + timeout
        out = {}
        for label, proc in self.procs.items():
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                stop_process_group(proc, grace=2)
            text = (self.dir / f"{label}.out").read_text(errors="replace")
            lines = [line for line in text.splitlines() if line.startswith("RESULT ")]
            if lines and proc.returncode == 0:
                out[label] = json.loads(lines[-1][len("RESULT "):])
            else:
                out[label] = {"error": f"exit status {proc.returncode}: {self.tail(label)}", "returncode": proc.returncode}
        return out

    def kill_all(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                stop_process_group(proc, grace=1)


# ---- the benchmark --------------------------------------------------------------------------------
class Bench:
    def __init__(self, args: argparse.Namespace, work: Path, servers: Servers) -> None:
        self.args, self.work, self.servers = args, work, servers
        self.tag = secrets.token_hex(3)
        self.urls: dict[str, dict[str, str]] = {}
        self.runs: dict[str, list[dict]] = {b: [] for b in BACKENDS}  # what the journal check reads back
        self.rows: dict[str, list[dict]] = {}
        self.pairs: dict[str, list[dict]] = {}  # 1 and 8 writers again, back to back (scale_pairs)
        self.client_cpu: dict = {}  # the HTTP store's client alone, with and without waiting (client_cpu_alone)
        self.faults: dict[str, dict] = {}
        self.checks: dict[str, dict] = {}
        self.raw: dict[str, dict] = {}
        self.rng = random.Random(args.seed)

    # ---- helpers ----
    def server_roots(self, backend: str) -> dict[str, list[int]]:
        """The server processes whose CPU is measured, by name (none for a server given by URL)."""
        roots = {"postgres": {"postgres": self.servers.pg_pids()},
                 "http": {"service": self.servers.service_pids(), "postgres": self.servers.pg_pids()},
                 "s3": {"moto": self.servers.s3_pids()}}[backend]
        return {name: pids for name, pids in roots.items() if pids}

    def worker(self, mode: str, *args: str, timeout: float = 300) -> dict:
        cmd, env = worker_command(sys.executable, WORKER, [mode, *args], ours=True)
        return run_result_worker(cmd, cwd=self.work, env=env, timeout=timeout, label=mode)

    def writer_args(self, backend: str, run_id: str, fleet: Fleet, label: str, *extra: str) -> list[str]:
        self.register(backend, run_id, fleet.ack(label))
        return ["--url", self.urls[backend]["writer"], "--run-id", run_id, "--ack", fleet.ack(label), *extra]

    def register(self, backend: str, run_id: str, ack: str, fenced: list | None = None) -> None:
        for entry in self.runs[backend]:
            if entry["run_id"] == run_id:
                entry["acks"].append(ack)
                return
        self.runs[backend].append({"run_id": run_id, "acks": [ack], "fenced": fenced or []})

    def window(self, fleet: Fleet, seconds: float, roots: dict[str, list[int]]) -> dict:
        """Start the fleet, measure the servers' CPU over the window, collect. {"error"} if it never started."""
        why = fleet.wait_ready(60 + 2.0 * len(fleet.procs))
        if why:
            fleet.kill_all()
            return {"error": why, "results": fleet.collect(10)}
        start, end = fleet.go(seconds)
        sleep_until(start)
        before = {name: tree_ticks(pids) for name, pids in roots.items()}
        sleep_until(end)
        after = {name: tree_ticks(pids) for name, pids in roots.items()}
        results = fleet.collect(60 + len(fleet.procs))
        parts = {name: cpu_between(before[name], after[name]) for name in roots}
        return {"start": start, "end": end, "results": results, "server_cpu_parts_s": parts,
                "server_cpu_s": sum(parts.values()) if parts else None}

    # ---- scaling ----
    def scale(self, backend: str, n: int, kind: str, again: int = 0) -> dict:
        name = f"{backend}-{kind}-n{n}" + (f"-again{again}" if again else "")
        fleet = Fleet(self.work, name)
        for k in range(n):
            label = f"w{k:02d}"
            if kind == "ours":
                fleet.spawn(label, "writer", *self.writer_args(backend, f"fleet-{name}-w{k}-{self.tag}", fleet, label))
            else:
                fleet.spawn(label, "floor", "--backend", backend, "--url", self.urls[backend]["floor"],
                            "--table", FLOOR_TABLE)
        got = self.window(fleet, self.args.seconds, self.server_roots(backend))
        return summarise(got)

    def scaling(self, backend: str, counts: list[int]) -> None:
        rows = self.rows.setdefault(backend, [])
        for n in counts:
            pair = {}
            order = ("floor", "ours") if n % 2 == 0 else ("ours", "floor")  # alternate which goes first
            for kind in order:
                t = time.perf_counter()
                pair[kind] = self.scale(backend, n, kind)
                pair[kind]["wall_s"] = time.perf_counter() - t
            o, f = pair["ours"], pair["floor"]
            row = {"n": n, "ours": o, "floor": f,
                   "ratio": o["per_s"] / f["per_s"] if o.get("per_s") and f.get("per_s") else None}
            rows.append(row)
            say(f"  {backend:<8} {n:>3} writers: " + (
                f"{o['per_s']:8.0f} appends/s, p50 {fmt_us(o['stats'].get('median_us'))}, p99 "
                f"{fmt_us(o['stats'].get('p99_us'))}; floor {f['per_s']:8.0f}/s -> "
                f"{row['ratio']:.2f}x" if row["ratio"] is not None else
                f"ERROR ours: {o.get('error', '-')}; floor: {f.get('error', '-')}"))
        one = next((r["ours"]["per_s"] for r in rows if r["n"] == 1 and r["ours"].get("per_s")), None)
        for row in rows:
            row["scaling"] = row["ours"]["per_s"] / one if one and row["ours"].get("per_s") else None

    def scale_pairs(self, backend: str, k: int) -> None:
        """Ours with 1 and with 8 writers ``k`` more times, each pair back to back (in turn 1 then 8, 8 then 1):
        this VM's speed drifts by 2x between windows a minute apart, which one pair alone cannot tell from scaling."""
        pairs = self.pairs.setdefault(backend, [])
        for i in range(k):
            got = {n: self.scale(backend, n, "ours", again=i + 1) for n in ((1, 8) if i % 2 == 0 else (8, 1))}
            one, eight = got[1].get("per_s"), got[8].get("per_s")
            pairs.append({"one": one, "eight": eight, "ratio": eight / one if one and eight else None})
            measured = f"1 writer {one:,.0f}/s, 8 writers {eight:,.0f}/s -> {eight / one:.2f}x" if one and eight else \
                f"ERROR: {got[1].get('error') or got[8].get('error')}"
            say(f"  {backend:<8} again, back to back: {measured}")

    def client_cpu_alone(self) -> None:
        """The HTTP store's client in one process with an in-process transport: CPU per append when the
        answer comes at once and when it comes after one writer's p50 round trip (``_fleet_worker client_cpu``)."""
        one = next((r for r in self.rows.get("http", []) if r["n"] == 1 and r["ours"].get("stats")), None)
        wait_us = one["ours"]["stats"]["median_us"] if one else 1500.0
        count = 300 if self.args.quick else 2000
        self.client_cpu = self.worker("client_cpu", "--count", str(count), "--wait-us", f"{wait_us:.0f}")
        c = self.client_cpu
        if "at_once_us" in c:
            say(f"  http     client alone (in-process transport, {count:,} checkpoints each): {fmt_us(c['at_once_us'])} "
                f"of CPU per append answered at once, {fmt_us(c['after_wait_us'])} answered after {fmt_us(wait_us)}")
        else:
            say(f"  http     client alone: ERROR {c.get('error')}")

    # ---- faults ----
    def fault_kill(self, backend: str, n: int, seconds: float) -> dict:
        """(a) SIGKILL a quarter of the writers at random moments; their standbys take the runs over."""
        fleet = Fleet(self.work, f"{backend}-fault-kill")
        victims = sorted(self.rng.sample(range(n), max(1, n // 4)))
        for k in range(n):
            run_id = f"fleet-{backend}-kill-w{k}-{self.tag}"
            fleet.spawn(f"w{k}", "writer", *self.writer_args(backend, run_id, fleet, f"w{k}"))
            if k in victims:
                fleet.spawn(f"s{k}", "writer", *self.writer_args(backend, run_id, fleet, f"s{k}", "--standby",
                                                                 str(fleet.dir / f"trigger-{k}")))
        why = fleet.wait_ready(60 + 2.0 * len(fleet.procs))
        if why:
            fleet.kill_all()
            return {"error": why}
        start, end = fleet.go(seconds)
        moments = sorted(start + self.rng.uniform(0.15, 0.35) * seconds for _ in victims)
        kills = {}
        for k, moment in zip(victims, moments):
            sleep_until(moment)
            os.kill(fleet.procs[f"w{k}"].pid, signal.SIGKILL)
            kills[k] = time.time()
            (fleet.dir / f"trigger-{k}").touch()
            fleet.procs[f"w{k}"].wait(10)  # reaped at once, as a supervisor would: no zombie holds the pid
        results = fleet.collect(60 + end - time.time() + len(fleet.procs))
        takeovers = {}
        for k in victims:
            standby = results.get(f"s{k}", {})
            first = standby.get("first_ack_t")
            takeovers[f"w{k}"] = {"killed_at": kills[k], "takeover_s": first - kills[k] if first else None,
                                  "trigger_seen_s": (standby.get("t_trigger_seen") or kills[k]) - kills[k],
                                  "run_locked_retries": standby.get("run_locked"), "error": standby.get("error")}
        survivors = {label: r for label, r in results.items() if label.startswith("w") and int(label[1:]) not in victims}
        return {"scenario": "kill", "writers": n, "victims": len(victims), "takeovers": takeovers,
                "survivor_lease_lost": lease_lost(survivors.values()),
                "survivor_errors": error_codes(survivors.values()), "worker_errors": worker_errors(survivors.values()),
                "results": results}

    def fault_stop(self, backend: str, n: int, seconds: float) -> dict:
        """(b) SIGSTOP a holder past the TTL while a standby takes its run over, then SIGCONT it."""
        fleet = Fleet(self.work, f"{backend}-fault-stop")
        victim_run = f"fleet-{backend}-stop-w0-{self.tag}"
        for k in range(n):
            run_id = f"fleet-{backend}-stop-w{k}-{self.tag}"
            extra = ("--on-lease-lost", "exit") if k == 0 else ()
            fleet.spawn(f"w{k}", "writer", *self.writer_args(backend, run_id, fleet, f"w{k}", *extra))
        fleet.spawn("s0", "writer", *self.writer_args(backend, victim_run, fleet, "s0", "--standby",
                                                      str(fleet.dir / "trigger-0")))
        why = fleet.wait_ready(60 + 2.0 * len(fleet.procs))
        if why:
            fleet.kill_all()
            return {"error": why}
        ttl = TTL_MS / 1000
        start, end = fleet.go(max(seconds, 1.0 + ttl + 5.0))
        sleep_until(start + 1.0)
        victim = fleet.procs["w0"]
        os.kill(victim.pid, signal.SIGSTOP)
        stopped = time.time()
        (fleet.dir / "trigger-0").touch()
        ack = Path(fleet.ack("s0"))
        while time.time() < stopped + ttl + 6 and not (time.time() >= stopped + ttl + 0.5 and ack.exists()
                                                        and ack.stat().st_size > 0):
            time.sleep(0.02)
        os.kill(victim.pid, signal.SIGCONT)
        resumed = time.time()
        results = fleet.collect(60 + end - time.time() + len(fleet.procs))
        v, s = results.get("w0", {}), results.get("s0", {})
        for entry in self.runs[backend]:
            if entry["run_id"] == victim_run:
                entry["fenced"] = v.get("fenced", [])
        others = [r for label, r in results.items() if label not in ("w0", "s0")]
        return {"scenario": "stop", "writers": n, "stopped_s": resumed - stopped,
                "standby_takeover_s": s["first_ack_t"] - stopped if s.get("first_ack_t") else None,
                "standby_acked_before_cont": bool(s.get("first_ack_t") and s["first_ack_t"] < resumed),
                "victim_fenced": v.get("fenced", []), "victim_errors": error_codes([v]),
                "victim_error": v.get("error"), "others_lease_lost": lease_lost(others),
                "worker_errors": worker_errors([*others, s]), "results": results}

    def fault_restart(self, backend: str, n: int, seconds: float) -> dict:
        """(c) restart PostgreSQL, (d) SIGKILL and restart the journal service, mid-run."""
        fleet = Fleet(self.work, f"{backend}-fault-restart")
        for k in range(n):
            fleet.spawn(f"w{k}", "writer", *self.writer_args(backend, f"fleet-{backend}-restart-w{k}-{self.tag}",
                                                             fleet, f"w{k}"))
        why = fleet.wait_ready(60 + 2.0 * len(fleet.procs))
        if why:
            fleet.kill_all()
            return {"error": why}
        start, end = fleet.go(max(seconds, 10.0))
        sleep_until(start + 2.0)
        began = time.time()
        if backend == "postgres":
            self.servers.pg.restart()  # returns once the server accepts connections again
        else:
            self.servers.kill_service()
            self.servers.restart_service()  # returns once /health answers
        accepting = time.time()
        results = fleet.collect(60 + end - time.time() + len(fleet.procs))
        per_writer = {}
        for label, r in results.items():
            after = [e for e in r.get("resumed", []) if e["t_resumed"] >= began]
            per_writer[label] = ({"from_accepting_s": after[0]["t_resumed"] - accepting,
                                  "outage_s": after[0]["t_resumed"] - after[0]["t_error"], "code": after[0]["code"]}
                                 if after else {"from_accepting_s": None, "error": r.get("error"),
                                                "unresolved": r.get("unresolved_error")})
        return {"scenario": "restart", "writers": n, "down_s": accepting - began, "per_writer": per_writer,
                "lease_lost": lease_lost(results.values()), "error_codes": error_codes(results.values()),
                "worker_errors": worker_errors(results.values()), "results": results}

    def check(self, backend: str) -> dict:
        spec = self.work / f"check-{backend}.json"
        spec.write_text(json.dumps({"url": self.urls[backend]["check"], "runs": self.runs[backend]}))
        return self.worker("check", "--spec", str(spec), timeout=600)


def summarise(got: dict) -> dict:
    """One fleet's window: appends (operations) per second, latency, CPU per append."""
    if "error" in got:
        return {"error": got["error"], "per_s": None, "stats": {}}
    results = list(got["results"].values())
    ok = [r for r in results if "error" not in r]
    seconds = got["end"] - got["start"]
    count = sum(r["count"] for r in ok)
    samples = [s for r in ok for s in r["samples_us"]]
    out = {"processes": len(results), "failed": len(results) - len(ok), "count": count, "seconds": seconds,
           "per_s": count / seconds if seconds > 0 else None, "stats": describe(samples, scale=1),
           "client_cpu_us": sum(r["cpu_s"] for r in ok) / count * 1e6 if count else None,
           "server_cpu_us": got["server_cpu_s"] / count * 1e6 if count and got["server_cpu_s"] is not None else None,
           "server_cpu_s": got["server_cpu_s"], "lease_lost": lease_lost(ok), "errors": error_codes(ok),
           "lease_lost_before_window": sum(1 for r in ok for e in r.get("errors", [])
                                           if e.get("code") == "lease_lost" and e["t"] < got["start"]),
           "server_cpu_parts_us": {name: cpu / count * 1e6 for name, cpu in got["server_cpu_parts_s"].items()}
           if count else {},
           "worker_errors": worker_errors(results),
           "per_process_per_s": sorted(r["count"] / seconds for r in ok) if seconds > 0 else [],
           "results": got["results"]}
    if ok and "status_codes" in ok[0]:
        codes: dict = {}
        for r in ok:
            for code, c in r["status_codes"].items():
                codes[code] = codes.get(code, 0) + c
        out["status_codes"] = codes
    return out


def lease_lost(results) -> int:
    return sum(1 for r in results for e in r.get("errors", []) if e.get("code") == "lease_lost")


def error_codes(results) -> dict:
    codes: dict = {}
    for r in results:
        for e in r.get("errors", []):
            codes[e["code"]] = codes.get(e["code"], 0) + 1
    return codes


def worker_errors(results) -> list[str]:
    return [r["error"] for r in results if "error" in r]


# ---- main ----------------------------------------------------------------------------------------
def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backends", help="comma list of postgres,http,s3 (default all; --quick: postgres,http)")
    parser.add_argument("--writers", help="comma list of fleet sizes for every backend (default: per backend, "
                                          "postgres and http 1,8,32,64, s3 1,8,16)")
    parser.add_argument("--seconds", type=float, default=5.0, help="each fleet's window (default 5 s)")
    parser.add_argument("--scale-pairs", type=int, default=2, help="the journal service's 1 and 8 writers this many times "
                        "more, back to back, for its scaling verdict (default 2; 0 with --quick)")
    parser.add_argument("--fault-writers", type=int, default=None,
                        help="writers in each fault scenario (default 64; 16 on S3, its largest fleet)")
    parser.add_argument("--no-faults", action="store_true", help="skip the fault scenarios")
    parser.add_argument("--pg-url", help="an existing PostgreSQL (libpq URL) instead of a private one "
                                         "(then no restart scenario, no server CPU)")
    parser.add_argument("--s3-url", help="an existing bucket: s3://bucket/prefix?endpoint=...&region=...&"
                                         "access_key_id=...&secret_access_key=... instead of moto")
    parser.add_argument("--seed", type=int, default=24, help="seed of the kill moments and victims")
    args = parse_args(parser, "fleet", quick={"writers": "1,4", "seconds": 2.0, "fault_writers": 2, "scale_pairs": 0})
    wanted = [w.strip() for w in (args.backends or ("postgres,http" if args.quick else ",".join(BACKENDS))).split(",")
              if w.strip()]
    unknown = set(wanted) - set(BACKENDS)
    if unknown:
        parser.error(f"unknown backend(s) {sorted(unknown)}")
    if args.quick and not args.backends:
        say("s3: skipped in --quick (name it in --backends to include it)")
    with workdir("bench-fleet-", args) as (work, mount):
        os.chmod(work, 0o755)  # the postgres user must reach its data dir inside
        return measure(args, wanted, work, mount)


def measure(args: argparse.Namespace, wanted: list[str], work: Path, mount: dict) -> int:
    started = time.perf_counter()
    notes = {**machine_notes(), "workdir": str(work), "mount": mount, "args": vars(args), "lease_ttl_ms": TTL_MS}
    notes["versions"] = versions_of(sys.executable, ("psycopg", "psycopg-binary", "obstore", "moto", "httpx",
                                                     "starlette", "uvicorn"), ours=True)
    fsync = describe(fsync_floor(work, 20 if args.quick else 100))
    notes["disk_fsync"] = fsync
    servers = Servers(work)
    bench = Bench(args, work, servers)

    def on_term(signum, frame):  # noqa: ANN001
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_term)
    try:
        unavailable = setup(args, wanted, bench, servers, notes)
        wanted = [w for w in wanted if w not in unavailable]
        print_setup(notes, fsync, mount, wanted, unavailable)
        for backend in wanted:
            counts = [int(x) for x in args.writers.split(",")] if args.writers else FLEETS[backend]
            say(f"\n{LABEL[backend]}: fleets of {', '.join(map(str, counts))} for {args.seconds:g} s each, "
                "floor and ours alternating")
            bench.scaling(backend, counts)
            if backend == "http" and {1, 8} <= set(counts) and args.scale_pairs:
                bench.scale_pairs(backend, args.scale_pairs)
            if backend == "http":
                bench.client_cpu_alone()
            if not args.no_faults and not (args.quick and backend != "postgres"):
                run_faults(bench, backend, args)
            bench.checks[backend] = bench.check(backend)
            totals = bench.checks[backend].get("totals", {})
            say(f"  journal check: {totals or bench.checks[backend].get('error')}")
        report(bench, wanted, unavailable, notes, args)
        notes["loadavg_end"] = loadavg()
        notes["wall_s"] = time.perf_counter() - started
        notes["servers"] = servers.notes
        say(f"\nwall time {notes['wall_s']:.0f} s; load average {fmt_load(notes['loadavg_start'])} at start, "
            f"{fmt_load(notes['loadavg_end'])} at end")
        save_results(args.out, {"notes": notes, "rows": bench.rows, "pairs": bench.pairs, "client_cpu": bench.client_cpu,
                                "faults": strip(bench.faults),
                                "checks": bench.checks, "verdicts": notes.get("verdicts"), "unavailable": unavailable,
                                "raw_faults": bench.faults})
    except KeyboardInterrupt:
        say("interrupted: stopping servers")
    finally:
        servers.stop()
    return 0


def strip(faults: dict) -> dict:
    """The fault results without the per-process raw results (kept under raw_faults)."""
    return {b: {name: {k: v for k, v in f.items() if k != "results"} for name, f in by.items()} for b, by in faults.items()}


def setup(args: argparse.Namespace, wanted: list[str], bench: Bench, servers: Servers, notes: dict) -> dict:
    """Start (or name) the servers; the URLs of each backend; {backend: why} for those that cannot run."""
    unavailable: dict[str, str] = {}
    dsn = None
    if {"postgres", "http"} & set(wanted):
        try:
            if args.pg_url:
                dsn = without_query(args.pg_url) if "?" in args.pg_url else args.pg_url
                notes["pg"] = "given (--pg-url)"
            else:
                dsn = servers.start_pg()
                notes["pg"] = f"private cluster, data {servers.notes['pg_data_dir']}" + (
                    f" ({servers.notes['pg_data_dir_why']})" if "pg_data_dir_why" in servers.notes else "")
            notes["pg_settings"] = pg_settings(dsn)
        except Exception as exc:  # noqa: BLE001 - reported, the backends skipped
            for b in ("postgres", "http"):
                unavailable[b] = f"PostgreSQL did not start: {exc}"
    if dsn and "postgres" in wanted:
        table = "fleet_journal"
        url = with_options(dsn, table=table, lease_ttl_ms=TTL_MS)
        bench.urls["postgres"] = {"writer": url, "check": url, "floor": dsn}
        ready = bench.worker("prepare", "--url", with_options(url, create_schema=1), "--dsn", dsn, "--table", FLOOR_TABLE)
        if "error" in ready:
            unavailable["postgres"] = f"prepare failed: {ready['error']}"
    if dsn and "http" in wanted:
        backing = with_options(dsn, table="fleet_service", create_schema=1, lease_ttl_ms=TTL_MS)
        try:
            url = servers.start_service(backing)
            bench.urls["http"] = {"writer": url, "floor": without_query(url), "check": with_options(
                dsn, table="fleet_service", lease_ttl_ms=TTL_MS)}
            notes["service"] = f"benchmarks/_stores_worker.py serve on {without_query(url)}, backed by table fleet_service"
        except Exception as exc:  # noqa: BLE001
            unavailable["http"] = str(exc)
    if "s3" in wanted:
        try:
            if args.s3_url:
                url = with_options(args.s3_url, lease_ttl_ms=TTL_MS)
                notes["s3"] = "given (--s3-url)"
            else:
                bucket = "fleet"
                endpoint = servers.start_s3(bucket)
                url = (f"s3://{bucket}/fleet?endpoint={endpoint}&region=us-east-1&access_key_id=testing"
                       f"&secret_access_key=testing&lease_ttl_ms={TTL_MS}")
                notes["s3"] = f"moto server {endpoint} (started in {servers.notes['s3_start_s']:.1f} s)"
            parts = urlsplit(url)
            floor = urlunsplit(("s3", parts.netloc, "", parts.query, ""))
            bench.urls["s3"] = {"writer": url, "check": url, "floor": floor}
        except Exception as exc:  # noqa: BLE001
            unavailable["s3"] = f"S3 did not start: {exc}"
    return unavailable


def pg_settings(dsn: str) -> dict:
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        return {name: conn.execute(f"SHOW {name}").fetchone()[0]
                for name in ("server_version", "fsync", "synchronous_commit", "wal_sync_method", "full_page_writes",
                             "max_connections", "shared_buffers")}


def run_faults(bench: Bench, backend: str, args: argparse.Namespace) -> None:
    n = args.fault_writers or (FAULT_WRITERS_S3 if backend == "s3" else FAULT_WRITERS)
    faults = bench.faults.setdefault(backend, {})
    plans = [("kill", lambda: bench.fault_kill(backend, n, max(args.seconds, 8.0)))]  # the last kill + TTL + 2 s
    if not args.quick:
        plans.append(("stop", lambda: bench.fault_stop(backend, max(2, n // 2), 9.0)))
        if backend == "postgres" and bench.servers.pg is not None:
            plans.append(("restart", lambda: bench.fault_restart(backend, n, 10.0)))
        if backend == "http":
            plans.append(("restart", lambda: bench.fault_restart(backend, n, 10.0)))
    for name, plan in plans:
        t = time.perf_counter()
        try:
            faults[name] = plan()
        except Exception as exc:  # noqa: BLE001 - a server that did not come back: reported, the rest goes on
            faults[name] = {"error": f"{type(exc).__name__}: {exc}"}
        faults[name]["wall_s"] = time.perf_counter() - t
        say(f"  fault {name}: {fault_line(faults[name])}")


if __name__ == "__main__":
    # Under the repo's .venv (psycopg, obstore, moto live there), whatever ``python`` was.
    reexec_in_repo_venv(__file__, "_BENCH_FLEET_REEXEC")
    sys.exit(main())

"""Worker for ``bench_stores.py``: one measurement per process, one ``RESULT {json}`` line on stdout.

    python _stores_worker.py MODE --n N --warmup W [--dir D] [--url URL] [--dsn DSN] [...]

Modes (``RECORD`` is a 152 B record, the size of ours' journal line for ``{"i": i}``):

- ``floor_fsync``   ``os.write`` of RECORD to a file opened ``O_APPEND`` + ``os.fdatasync``;
- ``floor_sqlite``  a bare ``INSERT`` of RECORD, autocommit, SQLite WAL ``synchronous=FULL``;
- ``floor_pg``      a bare single-row ``INSERT`` + COMMIT (autocommit psycopg connection);
- ``floor_s3``      a bare ``obstore.put`` of RECORD to a new key on the same S3 server (plus
                    ``mode="create"`` on a quarter as many keys, reported apart);
- ``floor_http``    a bare POST of RECORD to the journal service (``/health``), httpx keep-alive;
- ``ours``          ``with caravanserai.durable(id, store=URL) as run: run.checkpoint({"i": i}, "note")``,
                    ``--warmup`` untimed checkpoints, then ``--n`` timed ones; the store's ``append``
                    and the I/O call under it (fdatasync / the SQL driver / ``obstore.put`` /
                    ``httpx.Client.request``) are timed on the side (main thread only);
- ``lg_pg``         LangGraph ``PostgresSaver``, ``durability="sync"``: a 1-node ``StateGraph``
                    looping ``--n`` super-steps (one checkpoint each); a sample is the gap between
                    consecutive node entries;
- ``dbos_pg``       DBOS on Postgres: one workflow of ``--n`` ``@DBOS.step``s; a sample is the gap
                    between consecutive step entries;
- ``serve``         start ``caravanserai.service.serve`` (when it exists) and serve until killed.

``ours`` runs under the repo's interpreter with the repo on ``PYTHONPATH``; the peers under
``benchmarks/.venv-peers`` with ``-I``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import statistics
import sys
import threading
import time
from typing import TypedDict

T_PROCESS = time.perf_counter()
RECORD = (b"x" * 151) + b"\n"  # ours' journal line for {"i": i} with note "note" is ~151 B + "\n"
MAIN = threading.get_ident()
REAL_FDATASYNC = os.fdatasync


def emit(result: dict) -> None:
    sys.stdout.write("RESULT " + json.dumps(result) + "\n")
    sys.stdout.flush()


def us(samples_s: list[float]) -> list[float]:
    return [round(s * 1e6, 1) for s in samples_s]


def stats(samples_us: list[float]) -> dict:
    if not samples_us:
        return {"n": 0}
    s = sorted(samples_us)
    rank = lambda q: s[min(len(s) - 1, max(0, math.ceil(q * len(s)) - 1))]  # nearest rank  # noqa: E731
    return {"n": len(s), "median_us": statistics.median(s), "mean_us": statistics.fmean(s), "p90_us": rank(0.90),
            "p99_us": rank(0.99), "min_us": s[0], "max_us": s[-1]}


def timed_loop(n: int, warmup: int, body) -> list[float]:
    for i in range(warmup):
        body(-1 - i)
    out = []
    for i in range(n):
        t = time.perf_counter()
        body(i)
        out.append(time.perf_counter() - t)
    return out


# ---- floors -------------------------------------------------------------------------------------
def floor_fsync(a: argparse.Namespace) -> dict:
    path = os.path.join(a.dir, f"floor-{os.getpid()}.bin")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        samples = timed_loop(a.n, a.warmup, lambda i: (os.write(fd, RECORD), os.fdatasync(fd)))
    finally:
        os.close(fd)
        os.unlink(path)
    return {"samples_us": us(samples), "what": f"os.write {len(RECORD)} B (O_APPEND) + os.fdatasync"}


def floor_sqlite(a: argparse.Namespace) -> dict:
    import sqlite3

    path = os.path.join(a.dir, f"floor-{os.getpid()}.db")
    conn = sqlite3.connect(path, isolation_level=None)
    mode = conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
    conn.execute("PRAGMA synchronous=FULL")
    conn.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, payload TEXT NOT NULL)")
    text = RECORD.decode()
    samples = timed_loop(a.n, a.warmup, lambda i: conn.execute("INSERT INTO t (payload) VALUES (?)", (text,)))
    conn.close()
    for suffix in ("", "-wal", "-shm"):
        try:
            os.unlink(path + suffix)
        except FileNotFoundError:
            pass
    return {"samples_us": us(samples), "journal_mode": mode, "sqlite": sqlite3.sqlite_version,
            "what": f"INSERT of {len(RECORD)} B, autocommit, WAL synchronous=FULL"}


def floor_pg(a: argparse.Namespace) -> dict:
    import psycopg

    conn = psycopg.connect(a.dsn, autocommit=True)
    table = f"bench_floor_{a.tag}"
    conn.execute(f"DROP TABLE IF EXISTS {table}")
    conn.execute(f"CREATE TABLE {table} (id BIGSERIAL PRIMARY KEY, payload TEXT NOT NULL)")
    text = RECORD.decode()
    query = f"INSERT INTO {table} (payload) VALUES (%s)"
    samples = timed_loop(a.n, a.warmup, lambda i: conn.execute(query, (text,)))
    settings = {name: conn.execute(f"SHOW {name}").fetchone()[0]
                for name in ("server_version", "fsync", "synchronous_commit", "wal_sync_method", "full_page_writes")}
    conn.execute(f"DROP TABLE {table}")
    conn.close()
    return {"samples_us": us(samples), "settings": settings, "psycopg": psycopg.__version__,
            "what": f"INSERT of {len(RECORD)} B + COMMIT (autocommit psycopg connection)"}


def floor_s3(a: argparse.Namespace) -> dict:
    import obstore
    from obstore.store import from_url

    from urllib.parse import parse_qsl, urlsplit

    parts = urlsplit(a.url)
    options = dict(parse_qsl(parts.query))
    store = from_url(f"s3://{parts.netloc}", client_options={"allow_http": True}, **options)
    run = f"floor/{os.getpid()}-{a.tag}"
    counter = iter(range(10**9))
    plain = timed_loop(a.n, a.warmup, lambda i: obstore.put(store, f"{run}/p{next(counter):08d}", RECORD))
    create = timed_loop(max(1, a.n // 4), 0, lambda i: obstore.put(store, f"{run}/c{next(counter):08d}", RECORD,
                                                                  mode="create"))
    return {"samples_us": us(plain), "create": stats(us(create)), "obstore": getattr(obstore, "__version__", None),
            "what": f"obstore.put of {len(RECORD)} B to a new key (plain PUT), keep-alive"}


def floor_http(a: argparse.Namespace) -> dict:
    import httpx

    base = a.url.split("?", 1)[0].rstrip("/")
    client = httpx.Client(timeout=10)
    status = {}

    def post(i: int) -> None:
        r = client.post(base + "/health", content=RECORD, headers={"Content-Type": "application/octet-stream"})
        status[r.status_code] = status.get(r.status_code, 0) + 1

    samples = timed_loop(a.n, a.warmup, post)
    get = timed_loop(max(1, a.n // 4), 0, lambda i: client.get(base + "/health"))
    client.close()
    return {"samples_us": us(samples), "status_codes": status, "get_health": stats(us(get)),
            "what": f"POST of {len(RECORD)} B to /health (httpx keep-alive)"}


# ---- ours ---------------------------------------------------------------------------------------
class Parts:
    """Times, on the main thread, each ``store.append`` and the I/O calls made inside it."""

    def __init__(self) -> None:
        self.append: list[float] = []  # per store.append
        self.io_in_append: list[float] = []  # per store.append: its I/O calls, summed
        self.io_calls_in_append: list[int] = []
        self.io_outside: list[float] = []  # I/O calls outside store.append (lease renewals, ...)
        self.write: list[float] = []  # LocalStore: write_all per append
        self._io: list | None = None

    def clear(self) -> None:
        for bucket in (self.append, self.io_in_append, self.io_calls_in_append, self.io_outside, self.write):
            bucket.clear()

    def wrap_append(self, store) -> None:
        original = store.append

        def append(*args, **kwargs):
            if threading.get_ident() != MAIN:
                return original(*args, **kwargs)
            self._io = []
            t = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                self.append.append(time.perf_counter() - t)
                self.io_in_append.append(sum(self._io))
                self.io_calls_in_append.append(len(self._io))
                self._io = None

        store.append = append

    def wrap_io(self, obj, name: str, bucket: list | None = None) -> bool:
        try:
            original = getattr(obj, name)
        except AttributeError:
            return False

        def io(*args, **kwargs):
            if threading.get_ident() != MAIN:
                return original(*args, **kwargs)
            t = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                elapsed = time.perf_counter() - t
                if bucket is not None:
                    bucket.append(elapsed)
                elif self._io is not None:
                    self._io.append(elapsed)
                else:
                    self.io_outside.append(elapsed)

        try:
            setattr(obj, name, io)
        except (AttributeError, TypeError):
            return False
        return True

    def report(self, samples: list[float], n: int) -> dict:
        out = {"store.append": stats(us(self.append)), "io": stats(us(self.io_in_append)),
               "append - io": stats(us([a - b for a, b in zip(self.append, self.io_in_append)])),
               "io calls per append": statistics.fmean(self.io_calls_in_append) if self.io_calls_in_append else None,
               "io outside append": {**stats(us(self.io_outside)), "calls_per_ckpt": len(self.io_outside) / n}}
        if self.write:
            out["write"] = stats(us(self.write))
        if len(self.append) == len(samples):
            out["outside store.append"] = stats(us([s - a for s, a in zip(samples, self.append)]))
        else:
            out["outside store.append"] = {"n": 0, "why": f"{len(self.append)} store.append calls for {len(samples)} checkpoints"}
        return out


def ours(a: argparse.Namespace) -> dict:
    import caravanserai
    from caravanserai.errors import UnknownStoreScheme

    if a.repo and not os.path.realpath(caravanserai.__file__).startswith(os.path.realpath(a.repo)):
        sys.exit(f"[worker ours] imported caravanserai from {caravanserai.__file__}, not from {a.repo}")
    import_s = time.perf_counter() - T_PROCESS
    registered = False
    t = time.perf_counter()
    try:
        store = caravanserai.open_store(a.url)
    except UnknownStoreScheme:
        if not a.url.startswith(("http://", "https://")):
            raise
        # The http(s):// client exists but open_store does not route to it yet: register it (public API).
        from caravanserai.stores import register_scheme

        register_scheme("http", "caravanserai.stores.http", "HttpDurableStore", "http")
        register_scheme("https", "caravanserai.stores.http", "HttpDurableStore", "http")
        registered = True
        t = time.perf_counter()
        store = caravanserai.open_store(a.url)
    open_store_s = time.perf_counter() - t
    floor_ops = paired_floor(a, store) if a.paired else []
    kind = type(store).__name__
    parts = Parts()
    io_name = "?"
    parts.wrap_append(store)
    if kind == "LocalStore":
        from caravanserai.stores import local as local_mod

        parts.wrap_io(local_mod, "write_all", parts.write)
        parts.wrap_io(os, "fdatasync")
        io_name = "os.fdatasync"
    elif hasattr(store, "_exec"):  # SqlDurableStore: the driver call (sqlite3 / psycopg execute + fetch)
        parts.wrap_io(store, "_exec")
        io_name = "driver exec (execute + fetchall)"
    elif hasattr(store, "storage"):  # ObjectDurableStore over obstore
        import obstore

        parts.wrap_io(obstore, "put")
        io_name = "obstore.put"
    elif hasattr(store, "_client"):  # HttpDurableStore
        parts.wrap_io(store._client, "request")
        io_name = "httpx.Client.request"

    state_note = "note"
    profiler = None
    t_open = time.perf_counter()
    with caravanserai.durable(a.run_id, store=a.url) as run:
        t_opened = time.perf_counter()
        for i in range(a.warmup):
            run.checkpoint({"i": -1 - i}, state_note)
        parts.clear()
        if a.profile:
            import cProfile

            profiler = cProfile.Profile()
            profiler.enable()
        cpu0, thr0 = resource.getrusage(resource.RUSAGE_SELF), time.thread_time()
        samples, floor_samples = [], {op.name: [] for op in floor_ops}
        t_loop = time.perf_counter()
        if not floor_ops:
            for i in range(a.n):
                t = time.perf_counter()
                run.checkpoint({"i": i}, state_note)
                samples.append(time.perf_counter() - t)
        else:  # the floor ops next to each checkpoint, alternating which goes first
            def floors() -> None:
                for op in floor_ops:
                    t = time.perf_counter()
                    op()
                    floor_samples[op.name].append(time.perf_counter() - t)

            for i in range(a.n):
                if i % 2:
                    floors()
                t = time.perf_counter()
                run.checkpoint({"i": i}, state_note)
                samples.append(time.perf_counter() - t)
                if not i % 2:
                    floors()
        loop_s = time.perf_counter() - t_loop
        cpu1, thr1 = resource.getrusage(resource.RUSAGE_SELF), time.thread_time()
        if profiler is not None:
            profiler.disable()
        parts_report = parts.report(samples, a.n)  # before close() appends run_completed
        t_close = time.perf_counter()
    close_s = time.perf_counter() - t_close
    out = {"samples_us": us(samples), "store_class": kind, "url": getattr(store, "url", a.url),
           "import_s": import_s, "open_store_s": open_store_s, "durable_open_s": t_opened - t_open,
           "loop_s": loop_s, "close_s": close_s, "io_name": io_name,
           "cpu_user_us_per_ckpt": (cpu1.ru_utime - cpu0.ru_utime) / a.n * 1e6,
           "cpu_sys_us_per_ckpt": (cpu1.ru_stime - cpu0.ru_stime) / a.n * 1e6,
           "main_thread_cpu_us_per_ckpt": (thr1 - thr0) / a.n * 1e6,
           "parts": parts_report,
           "caravanserai": getattr(caravanserai, "__version__", None), "registered_scheme_by_bench": registered}
    if floor_ops:
        out["paired_floor_us"] = us(floor_samples[floor_ops[0].name])  # the floor the target is judged against
        out["paired_floor"] = {**stats(out["paired_floor_us"]), "what": floor_ops[0].what, "name": floor_ops[0].name}
        out["paired_floors"] = {op.name: {**stats(us(floor_samples[op.name])), "what": op.what, "samples_us": us(floor_samples[op.name])}
                                for op in floor_ops}
    if profiler is not None:
        import io
        import pstats

        text = io.StringIO()
        ps = pstats.Stats(profiler, stream=text)
        ps.sort_stats("tottime").print_stats(18)
        ps.sort_stats("cumulative").print_stats(25)
        with open(a.profile, "w", encoding="utf-8") as handle:
            handle.write(f"# cProfile of {a.n} checkpoints on {out['url']} ({kind})\n")
            handle.write(text.getvalue())
        top = []
        for (filename, line, func), (cc, nc, tt, ct, callers) in ps.stats.items():
            top.append((tt, ct, nc, f"{os.path.basename(filename)}:{line}({func})"))
        top.sort(reverse=True)
        out["profile_top_tottime"] = [{"tottime_us_per_ckpt": tt / a.n * 1e6, "cumtime_us_per_ckpt": ct / a.n * 1e6,
                                       "calls_per_ckpt": nc / a.n, "function": name} for tt, ct, nc, name in top[:12]]
    return out


def paired_floor(a: argparse.Namespace, store) -> list:
    """The backend's floor operations, run in this process next to each checkpoint (``--paired``).

    The first is the floor the target is judged against; the others split the gap: the same SQL
    statement ours sends, executed bare (no caravanserai code), or the round trip plus an fsync.
    """
    kind = type(store).__name__
    ops = []

    def add(name: str, what: str, fn) -> None:
        fn.name, fn.what = name, what
        ops.append(fn)

    def fsync_op():
        fd = os.open(os.path.join(a.dir, f"paired-floor-{os.getpid()}.bin"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)

        def op() -> None:
            os.write(fd, RECORD)
            REAL_FDATASYNC(fd)
        return op

    line = RECORD.decode().rstrip("\n")
    if kind in ("LocalStore", "SqliteStore"):
        add("fdatasync", f"os.write {len(RECORD)} B + os.fdatasync", fsync_op())
    if kind == "SqliteStore":
        import sqlite3

        from caravanserai.stores.sql import SqlDurableStore, _queries

        conn = sqlite3.connect(os.path.join(a.dir, f"paired-{os.getpid()}.db"), isolation_level=None)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=FULL")
        conn.execute("CREATE TABLE bare (id INTEGER PRIMARY KEY, payload TEXT NOT NULL)")
        conn.executescript(SqlDurableStore.schema("sqlite", "fenced"))
        conn.execute("INSERT INTO fenced_leases VALUES ('r', 'h', 1, 9000000000000000)")
        fenced_sql, chunk = _queries("sqlite", "fenced")["append"], iter(range(10**9))
        add("sqlite_bare_insert", "bare SQLite WAL FULL INSERT commit (rowid table)",
            lambda: conn.execute("INSERT INTO bare (payload) VALUES (?)", (line,)))
        add("sqlite_same_statement", "ours' fenced INSERT ... WHERE EXISTS (lease) RETURNING, bare sqlite3, same schema",
            lambda: conn.execute(fenced_sql, ("r", next(chunk), 0, 1, line, "r", 1)).fetchall())
    elif kind == "PostgresStore":
        import re

        import psycopg

        from caravanserai.stores.sql import SqlDurableStore, _queries

        conn = psycopg.connect(a.dsn, autocommit=True)
        table = f"bench_paired_{os.getpid()}"
        conn.execute(f"CREATE TABLE {table}_bare (id BIGSERIAL PRIMARY KEY, payload TEXT NOT NULL)")
        for statement in SqlDurableStore.schema("postgres", table).split(";\n"):
            if statement.strip():
                conn.execute(statement)
        conn.execute(f"INSERT INTO {table}_leases VALUES ('r', 'h', 1, 9000000000000000)")
        fenced_sql = re.sub(r"\$\d+", "%s", _queries("postgres", table)["append"])
        chunk = iter(range(10**9))
        add("pg_bare_insert", "bare INSERT + COMMIT on a second connection",
            lambda: conn.execute(f"INSERT INTO {table}_bare (payload) VALUES (%s)", (line,)))
        add("pg_same_statement", "ours' fenced INSERT ... WHERE EXISTS (lease) RETURNING, bare psycopg, same schema",
            lambda: conn.execute(fenced_sql, ("r", next(chunk), 0, 1, line, "r", 1)).fetchall())
    elif hasattr(store, "storage"):
        import obstore
        from obstore.store import from_url
        from urllib.parse import parse_qsl, urlsplit

        parts = urlsplit(a.url)
        options = {k: v for k, v in parse_qsl(parts.query) if k != "lease_ttl_ms"}
        s3 = from_url(f"s3://{parts.netloc}", client_options={"allow_http": True}, **options)
        put, counter = obstore.put, iter(range(10**9))
        add("s3_put", "bare obstore.put (plain PUT) on a second client",
            lambda: put(s3, f"paired-floor/{os.getpid()}/p{next(counter):08d}", RECORD))
        add("s3_put_create", "bare obstore.put(mode='create') (If-None-Match: *), what ours sends",
            lambda: put(s3, f"paired-floor/{os.getpid()}/c{next(counter):08d}", RECORD, mode="create"))
    elif hasattr(store, "_client"):
        import httpx

        client, base = httpx.Client(timeout=10), a.url.split("?", 1)[0].rstrip("/")
        add("http_post", "bare POST /health on a second client", lambda: client.post(base + "/health", content=RECORD))
        sync = fsync_op()

        def post_and_sync() -> None:
            client.post(base + "/health", content=RECORD)
            sync()
        add("http_post_plus_fdatasync", "bare POST /health, then write+fdatasync 152 B here (RTT + one fsync)",
            post_and_sync)
    for op in ops:
        for _ in range(5):
            op()
    return ops


# ---- peers --------------------------------------------------------------------------------------
class LgState(TypedDict):
    i: int
    n: int
    payload: str


def lg_pg(a: argparse.Namespace) -> dict:
    from langgraph.checkpoint.postgres import PostgresSaver
    from langgraph.graph import END, START, StateGraph

    import_s = time.perf_counter() - T_PROCESS
    entries: list[float] = []

    def step(state: LgState) -> dict:
        entries.append(time.perf_counter())
        return {"i": state["i"] + 1}

    def more(state: LgState) -> str:
        return END if state["i"] >= state["n"] else "step"

    builder = StateGraph(LgState)
    builder.add_node("step", step)
    builder.add_edge(START, "step")
    builder.add_conditional_edges("step", more)
    with PostgresSaver.from_conn_string(a.dsn) as saver:
        saver.setup()
        graph = builder.compile(checkpointer=saver)
        payload = "p" * 100

        def invoke(n: int, thread: str) -> dict:
            return graph.invoke({"i": 0, "n": n, "payload": payload},
                                {"configurable": {"thread_id": thread}, "recursion_limit": n + 10}, durability="sync")

        invoke(max(2, a.warmup), f"warm-{a.tag}")
        entries.clear()
        cpu0 = resource.getrusage(resource.RUSAGE_SELF)
        t0 = time.perf_counter()
        out = invoke(a.n, f"run-{a.tag}")
        total = time.perf_counter() - t0
        cpu1 = resource.getrusage(resource.RUSAGE_SELF)
        assert out["i"] == a.n and len(entries) == a.n, (out, len(entries))
        with saver.conn.cursor() as cur:
            cur.execute("SELECT count(*) AS c FROM checkpoints WHERE thread_id = %s", (f"run-{a.tag}",))
            checkpoints = cur.fetchone()["c"]
    gaps = [b - e for e, b in zip(entries, entries[1:])]
    import importlib.metadata as md

    return {"samples_us": us(gaps), "total_per_step_us": total / a.n * 1e6, "checkpoints_written": checkpoints,
            "cpu_us_per_step": ((cpu1.ru_utime - cpu0.ru_utime) + (cpu1.ru_stime - cpu0.ru_stime)) / a.n * 1e6,
            "import_s": import_s,
            "versions": {p: md.version(p) for p in ("langgraph", "langgraph-checkpoint", "langgraph-checkpoint-postgres",
                                                   "psycopg", "psycopg-pool")},
            "what": "1-node StateGraph {i, n, payload 100 B}, one super-step per checkpoint, PostgresSaver, "
                    "durability='sync'; sample = gap between consecutive node entries"}


def dbos_pg(a: argparse.Namespace) -> dict:
    import logging

    from dbos import DBOS, SetWorkflowID

    import_s = time.perf_counter() - T_PROCESS
    entries: list[float] = []

    @DBOS.step()
    def step(i: int) -> dict:
        entries.append(time.perf_counter())
        return {"i": i}

    @DBOS.workflow()
    def steps_wf(n: int) -> int:
        for i in range(n):
            step(i)
        return n

    t = time.perf_counter()
    DBOS(config={"name": "bench-stores", "system_database_url": a.dsn, "application_version": "bench-stores",
                 "log_level": "WARNING", "console_log_level": "WARNING"})
    DBOS.launch()
    logging.getLogger("dbos").setLevel(logging.WARNING)
    launch_s = time.perf_counter() - t
    with SetWorkflowID(f"warm-{a.tag}"):
        steps_wf(max(2, a.warmup))
    entries.clear()
    cpu0 = resource.getrusage(resource.RUSAGE_SELF)
    t0 = time.perf_counter()
    with SetWorkflowID(f"run-{a.tag}"):
        out = steps_wf(a.n)
    total = time.perf_counter() - t0
    cpu1 = resource.getrusage(resource.RUSAGE_SELF)
    assert out == a.n and len(entries) == a.n
    try:
        DBOS.destroy(destroy_registry=True)
    except Exception:
        pass
    gaps = [b - e for e, b in zip(entries, entries[1:])]
    import importlib.metadata as md

    return {"samples_us": us(gaps), "total_per_step_us": total / a.n * 1e6, "launch_s": launch_s,
            "cpu_us_per_step": ((cpu1.ru_utime - cpu0.ru_utime) + (cpu1.ru_stime - cpu0.ru_stime)) / a.n * 1e6,
            "import_s": import_s,
            "versions": {p: md.version(p) for p in ("dbos", "SQLAlchemy", "psycopg")},
            "what": "one @DBOS.workflow of n @DBOS.step calls (system DB on the same PostgreSQL); "
                    "sample = gap between consecutive step entries"}


# ---- the journal service --------------------------------------------------------------------------
def serve(a: argparse.Namespace) -> None:
    """Start ``caravanserai.service.serve`` with whatever of (store, host, port, token) it takes.

    With ``--stats FILE`` the service's own time is measured and written there when it stops:
    per request kind, from the ASGI app being called to the last body byte handed back, and the
    backing store's ``append`` / ``os.fdatasync`` under it.
    """
    import inspect

    import caravanserai
    from caravanserai import service

    fn = service.serve
    sig = inspect.signature(fn)
    names = {"store": a.backing, "backing": a.backing, "backend": a.backing, "store_url": a.backing,
             "root": a.backing, "host": "127.0.0.1", "port": a.port, "token": a.token, "tokens": [a.token]}
    kwargs, missing = {}, []
    for name, param in sig.parameters.items():
        if name in names:
            kwargs[name] = names[name]
        elif param.default is inspect.Parameter.empty and param.kind not in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            missing.append(name)
    if missing:
        sys.exit(f"caravanserai.service.serve{sig}: cannot fill {missing}")
    os.environ.setdefault("CARAVANSERAI_HTTP_TOKEN", a.token)
    buckets: dict[str, list] = {}
    if a.stats:
        def record(name: str, seconds: float) -> None:
            buckets.setdefault(name, []).append(seconds)

        def timed(name: str, original):
            """``original``, each call's time recorded under ``name``."""
            def wrapper(*args, **kw):
                t = time.perf_counter()
                try:
                    return original(*args, **kw)
                finally:
                    record(name, time.perf_counter() - t)
            return wrapper

        backing = caravanserai.open_store(a.backing)  # serve() opens the same URL: the cached instance
        backing.append = timed("backing store.append", backing.append)
        os.fdatasync = timed("os.fdatasync (service)", os.fdatasync)
        backing.committed = timed("backing store.committed (views hand-off)", backing.committed)
        service.JournalService.append = timed("JournalService.append (run lock + backing append + views)",
                                              service.JournalService.append)
        import starlette.concurrency as concurrency

        original_run_in_threadpool = concurrency.run_in_threadpool

        async def run_in_threadpool(func, *args, **kw):
            marks = {}

            def inner(*a2, **k2):
                marks["start"] = time.perf_counter()
                try:
                    return func(*a2, **k2)
                finally:
                    marks["end"] = time.perf_counter()

            t = time.perf_counter()
            try:
                return await original_run_in_threadpool(inner, *args, **kw)
            finally:
                back = time.perf_counter()
                if "start" in marks and "end" in marks:
                    record("thread pool: hop to the worker thread", marks["start"] - t)
                    record("thread pool: handler in the worker thread", marks["end"] - marks["start"])
                    record("thread pool: hop back to the event loop", back - marks["end"])

        concurrency.run_in_threadpool = run_in_threadpool
        original_create_app = service.create_app

        def create_app(*args, **kw):
            app = original_create_app(*args, **kw)

            async def timed_app(scope, receive, send):
                if scope.get("type") != "http":
                    return await app(scope, receive, send)
                t = time.perf_counter()
                path = scope.get("path", "")
                kind = "POST .../append" if path.endswith("/append") else "POST /health" if path == "/health" and \
                    scope.get("method") == "POST" else f"{scope.get('method')} other"

                async def timed_send(message):
                    if message.get("type") == "http.response.body" and not message.get("more_body"):
                        record(f"service: {kind} (ASGI app, request to response)", time.perf_counter() - t)
                    await send(message)

                return await app(scope, receive, timed_send)
            return timed_app

        service.create_app = create_app
    print(f"serve{sig} with {sorted(kwargs)}", flush=True)
    import signal

    # uvicorn re-raises the SIGTERM it caught once it has shut down: let that return here instead.
    signal.signal(signal.SIGTERM, lambda *_: None)
    try:
        fn(**kwargs)
    finally:
        if a.stats:
            with open(a.stats, "w", encoding="utf-8") as handle:
                json.dump({name: stats(us(b)) for name, b in buckets.items()}, handle)


MODES = {"floor_fsync": floor_fsync, "floor_sqlite": floor_sqlite, "floor_pg": floor_pg, "floor_s3": floor_s3,
         "floor_http": floor_http, "ours": ours, "lg_pg": lg_pg, "dbos_pg": dbos_pg}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("mode", choices=[*MODES, "serve"])
    p.add_argument("--n", type=int, default=1000)
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--dir", default=".")
    p.add_argument("--url", default="")
    p.add_argument("--dsn", default="")
    p.add_argument("--tag", default="0")
    p.add_argument("--run-id", default="bench")
    p.add_argument("--repo", default="")
    p.add_argument("--profile", default="")
    p.add_argument("--backing", default="")
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--token", default="")
    p.add_argument("--stats", default="", help="serve: write the service's own timings here when it stops")
    p.add_argument("--paired", action="store_true", help="ours: also run the floor op next to each checkpoint")
    a = p.parse_args()
    if a.mode == "serve":
        serve(a)
        return
    result = MODES[a.mode](a)
    result["stats"] = stats(result["samples_us"])
    result["mode"] = a.mode
    result["pid"] = os.getpid()
    result["loadavg_end"] = os.getloadavg()
    emit(result)


if __name__ == "__main__":
    main()

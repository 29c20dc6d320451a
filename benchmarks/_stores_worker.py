"""Worker for ``bench_stores.py``: one measurement per process, one ``RESULT {json}`` line on stdout.

    python _stores_worker.py MODE --n N --warmup W [--dir D] [--url URL] [--dsn DSN] [...]

Modes (``RECORD`` is a 152 B record, the size of ours' journal line for ``{"i": i}``):

- ``floor_fsync``   ``os.write`` of RECORD to a file opened ``O_APPEND`` + ``os.fdatasync``;
- ``floor_sqlite``  a bare ``INSERT`` of RECORD, autocommit, SQLite WAL ``synchronous=FULL``;
- ``floor_pg``      a bare single-row ``INSERT`` + COMMIT (autocommit psycopg connection);
- ``floor_s3``      a bare ``obstore.put`` of RECORD to a new key on the same S3 server (plus
                    ``mode="create"`` on a quarter as many keys, reported apart);
- ``floor_http``    a bare POST of RECORD to the journal service (``/health``), the HTTP store's client, keep-alive;
- ``ours``          ``with caravanserai.durable(id, store=URL) as run: run.checkpoint({"i": i}, "note")``,
                    ``--warmup`` untimed checkpoints, then ``--n`` timed ones; the store's ``append``
                    and the I/O call under it (fdatasync / the SQL driver / ``obstore.put`` /
                    ``http_wire.Wire.request``) are timed on the side (main thread only);
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
import importlib
import json
import os
import re
import statistics
import sys
import threading
import time
from typing import TypedDict
from urllib.parse import parse_qsl, urlsplit

T_PROCESS = time.perf_counter()
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # _common, also under python -I
import _common  # noqa: E402
from _common import (  # noqa: E402
    HttpFloor,
    Usage,
    dbos_destroy,
    dbos_launch,
    describe,
    emit_result,
    profile_rows,
    profile_text,
    sync_appender,
    time_each,
    timed,
    to_us,
    which_caravanserai,
    worker_parser,
)

RECORD = (b"x" * 151) + b"\n"  # ours' journal line for {"i": i} with note "note" is ~151 B + "\n"
MAIN = threading.get_ident()


def stats(samples_us: list[float]) -> dict:
    return describe(samples_us, scale=1)


def s3_client(url: str):
    """An obstore S3 store for ``s3://bucket?options`` (the lease option dropped), plain http allowed."""
    from obstore.store import from_url

    parts = urlsplit(url)
    options = {k: v for k, v in parse_qsl(parts.query) if k != "lease_ttl_ms"}
    return from_url(f"s3://{parts.netloc}", client_options={"allow_http": True}, **options)


# ---- floors -------------------------------------------------------------------------------------
def floor_fsync(a: argparse.Namespace) -> dict:
    op = sync_appender(os.path.join(a.dir, f"floor-{os.getpid()}.bin"), RECORD)
    try:
        samples = time_each(a.n, op, a.warmup)
    finally:
        op.close()
    return {"samples_us": to_us(samples), "what": f"os.write {len(RECORD)} B (O_APPEND) + os.fdatasync"}


def floor_sqlite(a: argparse.Namespace) -> dict:
    import sqlite3

    path = os.path.join(a.dir, f"floor-{os.getpid()}.db")
    conn = sqlite3.connect(path, isolation_level=None)
    mode = conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
    conn.execute("PRAGMA synchronous=FULL")
    conn.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, payload TEXT NOT NULL)")
    text = RECORD.decode()
    samples = time_each(a.n, lambda i: conn.execute("INSERT INTO t (payload) VALUES (?)", (text,)), a.warmup)
    conn.close()
    for suffix in ("", "-wal", "-shm"):
        if os.path.exists(path + suffix):
            os.unlink(path + suffix)
    return {"samples_us": to_us(samples), "journal_mode": mode, "sqlite": sqlite3.sqlite_version,
            "what": f"INSERT of {len(RECORD)} B, autocommit, WAL synchronous=FULL"}


def floor_pg(a: argparse.Namespace) -> dict:
    return _common.floor_pg(a.dsn, a.n, a.warmup, RECORD.decode(), f"bench_floor_{a.tag}")


def floor_s3(a: argparse.Namespace) -> dict:
    import obstore

    store, run, counter = s3_client(a.url), f"floor/{os.getpid()}-{a.tag}", iter(range(10**9))
    plain = time_each(a.n, lambda i: obstore.put(store, f"{run}/p{next(counter):08d}", RECORD), a.warmup)
    create = time_each(max(1, a.n // 4), lambda i: obstore.put(store, f"{run}/c{next(counter):08d}", RECORD, mode="create"))
    return {"samples_us": to_us(plain), "create": stats(to_us(create)), "obstore": getattr(obstore, "__version__", None),
            "what": f"obstore.put of {len(RECORD)} B to a new key (plain PUT), keep-alive"}


def floor_http(a: argparse.Namespace) -> dict:
    return _common.floor_http(a.url, a.n, a.warmup, RECORD, get_n=max(1, a.n // 4))


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

    def wrap_io(self, obj, name: str, bucket: list | None = None) -> None:
        """Time ``obj.name`` on the main thread: into ``bucket``, else the current append's I/O, else outside."""
        def record(elapsed: float) -> None:
            if threading.get_ident() == MAIN:
                (bucket if bucket is not None else self._io if self._io is not None else self.io_outside).append(elapsed)

        if hasattr(obj, name):
            setattr(obj, name, timed(getattr(obj, name), record))

    def report(self, samples: list[float], n: int) -> dict:
        out = {"store.append": describe(self.append), "io": describe(self.io_in_append),
               "append - io": describe([a - b for a, b in zip(self.append, self.io_in_append)]),
               "io calls per append": statistics.fmean(self.io_calls_in_append) if self.io_calls_in_append else None,
               "io outside append": {**describe(self.io_outside), "calls_per_ckpt": len(self.io_outside) / n}}
        if self.write:
            out["write"] = describe(self.write)
        if len(self.append) == len(samples):
            out["outside store.append"] = describe([s - a for s, a in zip(samples, self.append)])
        else:
            out["outside store.append"] = {"n": 0, "why": f"{len(self.append)} store.append calls for {len(samples)} checkpoints"}
        return out


def ours(a: argparse.Namespace) -> dict:
    which_caravanserai(a.repo)
    import caravanserai

    import_s = time.perf_counter() - T_PROCESS
    t = time.perf_counter()
    store = caravanserai.open_store(a.url)
    open_store_s = time.perf_counter() - t
    scheme = a.url.split("://", 1)[0] if "://" in a.url else "file"
    parts, statements = Parts(), []
    parts.wrap_append(store)
    if scheme == "file":  # LocalStore: the write under append, and the fdatasync
        parts.wrap_io(importlib.import_module(type(store).__module__), "write_all", parts.write)
        parts.wrap_io(os, "fdatasync")
        io_name = "os.fdatasync"
    elif hasattr(store, "exec") and hasattr(store, "dialect"):  # the SQL stores: the statements of the warm-up
        exec_ = store.exec
        store.exec = lambda query, params: (statements.append(query), exec_(query, params))[1]
        io_name = "store.exec (driver execute + fetch)"
    elif scheme == "s3":
        import obstore

        parts.wrap_io(obstore, "put")
        io_name = "obstore.put"
    else:  # the journal service's client
        from caravanserai.stores.http_wire import Wire

        parts.wrap_io(Wire, "request")
        io_name = "http_wire.Wire.request"

    profiler = None
    t_open = time.perf_counter()
    with caravanserai.durable(a.run_id, store=a.url) as run:
        t_opened = time.perf_counter()
        for i in range(a.warmup):
            run.checkpoint({"i": -1 - i}, "note")
        floor_ops = paired_floor(a, store, statements) if a.paired else []
        if statements:
            del store.exec  # the recorder: from here on, only timed
            parts.wrap_io(store, "exec")
        parts.clear()
        if a.profile:
            import cProfile

            profiler = cProfile.Profile()
            profiler.enable()
        samples, floor_samples = [], {op.name: [] for op in floor_ops}

        def floors() -> None:
            for op in floor_ops:
                t = time.perf_counter()
                op()
                floor_samples[op.name].append(time.perf_counter() - t)

        with Usage() as usage:
            t_thread = time.thread_time()
            for i in range(a.n):  # the floor ops (if any) next to each checkpoint, alternating which goes first
                if i % 2:
                    floors()
                t = time.perf_counter()
                run.checkpoint({"i": i}, "note")
                samples.append(time.perf_counter() - t)
                if not i % 2:
                    floors()
            thread_s = time.thread_time() - t_thread
        if profiler is not None:
            profiler.disable()
        parts_report = parts.report(samples, a.n)  # before close() appends run_completed
        t_close = time.perf_counter()
    close_s = time.perf_counter() - t_close
    out = {"samples_us": to_us(samples), "store_class": type(store).__name__, "url": getattr(store, "url", a.url),
           "import_s": import_s, "open_store_s": open_store_s, "durable_open_s": t_opened - t_open,
           "loop_s": usage.wall, "close_s": close_s, "io_name": io_name,
           "cpu_user_us_per_ckpt": usage.user / a.n * 1e6, "cpu_sys_us_per_ckpt": usage.sys / a.n * 1e6,
           "main_thread_cpu_us_per_ckpt": thread_s / a.n * 1e6, "parts": parts_report,
           "caravanserai": getattr(caravanserai, "__version__", None)}
    if floor_ops:
        first = floor_ops[0]  # the floor the target is judged against
        out["paired_floor_us"] = to_us(floor_samples[first.name])
        out["paired_floor"] = {**describe(floor_samples[first.name]), "what": first.what, "name": first.name}
        out["paired_floors"] = {op.name: {**describe(floor_samples[op.name]), "what": op.what,
                                          "samples_us": to_us(floor_samples[op.name])} for op in floor_ops}
    if profiler is not None:
        with open(a.profile, "w", encoding="utf-8") as handle:
            handle.write(f"# cProfile of {a.n} checkpoints on {out['url']} ({out['store_class']})\n")
            handle.write(profile_text(profiler, [("tottime", 18), ("cumulative", 25)]))
        top = sorted(profile_rows(profiler, per=a.n), key=lambda r: r["own_s"], reverse=True)[:12]
        out["profile_top_tottime"] = [{"tottime_us_per_ckpt": r["own_s"] * 1e6, "cumtime_us_per_ckpt": r["cum_s"] * 1e6,
                                       "calls_per_ckpt": r["calls"], "function": r["where"]} for r in top]
    return out


def paired_floor(a: argparse.Namespace, store, statements: list[str]) -> list:
    """The backend's floor operations, run in this process next to each checkpoint (``--paired``).

    The first is the floor the target is judged against; the others split the gap: the same SQL
    statement ours sends (as the warm-up checkpoints sent it), executed bare (no caravanserai code)
    on a copy of the schema, or the round trip plus an fsync.
    """
    ops = []

    def add(name: str, what: str, fn) -> None:
        fn.name, fn.what = name, what
        ops.append(fn)

    line = RECORD.decode().rstrip("\n")
    chunk = iter(range(10**9))
    scheme = a.url.split("://", 1)[0] if "://" in a.url else "file"
    if scheme in ("file", "sqlite"):
        add("fdatasync", f"os.write {len(RECORD)} B + os.fdatasync",
            sync_appender(os.path.join(a.dir, f"paired-floor-{os.getpid()}.bin"), RECORD))
    if hasattr(store, "exec") and hasattr(store, "dialect"):
        fenced = next(q for q in reversed(statements) if q.lstrip().upper().startswith("INSERT INTO") and "WHERE EXISTS" in q)
        params = lambda: ("r", next(chunk), 0, 1, line, "r", 1)  # noqa: E731 - run, chunk, seq, token, lines, run, token
        if store.dialect == "sqlite":
            import sqlite3

            conn = sqlite3.connect(os.path.join(a.dir, f"paired-{os.getpid()}.db"), isolation_level=None)
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=FULL")
            table, bare, fenced = "fenced", "INSERT INTO bare (payload) VALUES (?)", fenced.replace(store.table, "fenced")
            conn.execute("CREATE TABLE bare (id INTEGER PRIMARY KEY, payload TEXT NOT NULL)")
            conn.executescript(type(store).schema("sqlite", table))
            what = "bare SQLite WAL FULL INSERT commit (rowid table)"
        else:
            import psycopg

            conn = psycopg.connect(a.dsn, autocommit=True)
            table = f"bench_paired_{os.getpid()}"
            fenced = re.sub(r"\$\d+", "%s", fenced.replace(store.table, table))
            bare = f"INSERT INTO {table}_bare (payload) VALUES (%s)"
            conn.execute(f"CREATE TABLE {table}_bare (id BIGSERIAL PRIMARY KEY, payload TEXT NOT NULL)")
            for statement in type(store).schema("postgres", table).split(";\n"):
                if statement.strip():
                    conn.execute(statement)
            what = "bare INSERT + COMMIT on a second connection"
        conn.execute(f"INSERT INTO {table}_leases VALUES ('r', 'h', 1, 9000000000000000)")
        prefix = "pg" if store.dialect == "postgres" else "sqlite"
        add(f"{prefix}_bare_insert", what, lambda: conn.execute(bare, (line,)))
        add(f"{prefix}_same_statement",
            f"ours' fenced INSERT ... WHERE EXISTS (lease) RETURNING, bare {store.dialect} driver, same schema",
            lambda: conn.execute(fenced, params()).fetchall())
    elif scheme == "s3":
        import obstore

        s3, key = s3_client(a.url), f"paired-floor/{os.getpid()}"
        add("s3_put", "bare obstore.put (plain PUT) on a second client",
            lambda: obstore.put(s3, f"{key}/p{next(chunk):08d}", RECORD))
        add("s3_put_create", "bare obstore.put(mode='create') (If-None-Match: *), what ours sends",
            lambda: obstore.put(s3, f"{key}/c{next(chunk):08d}", RECORD, mode="create"))
    elif scheme in ("http", "https"):
        client = HttpFloor(a.url, RECORD)
        add("http_post", "bare POST /health on a second connection (the HTTP store's client)",
            lambda: client.request("POST", RECORD))
        sync = sync_appender(os.path.join(a.dir, f"paired-floor-{os.getpid()}.bin"), RECORD)
        add("http_post_plus_fdatasync", "bare POST /health, then write+fdatasync 152 B here (RTT + one fsync)",
            lambda: (client.request("POST", RECORD), sync()))
    for op in ops:
        for _ in range(5):
            op()
    return ops


# ---- peers --------------------------------------------------------------------------------------
class LgState(TypedDict):
    i: int
    n: int
    payload: str


def peer_result(entries: list[float], usage: Usage, n: int, dists: tuple, import_s: float, **extra) -> dict:
    """A peer's answer: the gaps between consecutive step entries, whole run and CPU per step."""
    import importlib.metadata as md

    return {"samples_us": to_us(b - e for e, b in zip(entries, entries[1:])), "total_per_step_us": usage.wall / n * 1e6,
            "cpu_us_per_step": usage.cpu / n * 1e6, "import_s": import_s,
            "versions": {p: md.version(p) for p in dists}, **extra}


def lg_pg(a: argparse.Namespace) -> dict:
    from langgraph.checkpoint.postgres import PostgresSaver
    from langgraph.graph import END, START, StateGraph

    import_s = time.perf_counter() - T_PROCESS
    entries: list[float] = []

    def step(state: LgState) -> dict:
        entries.append(time.perf_counter())
        return {"i": state["i"] + 1}

    builder = StateGraph(LgState)
    builder.add_node("step", step)
    builder.add_edge(START, "step")
    builder.add_conditional_edges("step", lambda state: END if state["i"] >= state["n"] else "step")
    with PostgresSaver.from_conn_string(a.dsn) as saver:
        saver.setup()
        graph = builder.compile(checkpointer=saver)

        def invoke(n: int, thread: str) -> dict:
            return graph.invoke({"i": 0, "n": n, "payload": "p" * 100},
                                {"configurable": {"thread_id": thread}, "recursion_limit": n + 10}, durability="sync")

        invoke(max(2, a.warmup), f"warm-{a.tag}")
        entries.clear()
        with Usage() as usage:
            out = invoke(a.n, f"run-{a.tag}")
        assert out["i"] == a.n and len(entries) == a.n, (out, len(entries))
        with saver.conn.cursor() as cur:
            cur.execute("SELECT count(*) AS c FROM checkpoints WHERE thread_id = %s", (f"run-{a.tag}",))
            checkpoints = cur.fetchone()["c"]
    return peer_result(entries, usage, a.n, ("langgraph", "langgraph-checkpoint", "langgraph-checkpoint-postgres",
                                             "psycopg", "psycopg-pool"), import_s, checkpoints_written=checkpoints,
                       what="1-node StateGraph {i, n, payload 100 B}, one super-step per checkpoint, PostgresSaver, "
                            "durability='sync'; sample = gap between consecutive node entries")


def dbos_pg(a: argparse.Namespace) -> dict:
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

    launch_s = dbos_launch("bench-stores", a.dsn, "bench-stores")
    with SetWorkflowID(f"warm-{a.tag}"):
        steps_wf(max(2, a.warmup))
    entries.clear()
    with Usage() as usage:
        with SetWorkflowID(f"run-{a.tag}"):
            out = steps_wf(a.n)
    assert out == a.n and len(entries) == a.n
    dbos_destroy()
    return peer_result(entries, usage, a.n, ("dbos", "SQLAlchemy", "psycopg"), import_s, launch_s=launch_s,
                       what="one @DBOS.workflow of n @DBOS.step calls (system DB on the same PostgreSQL); "
                            "sample = gap between consecutive step entries")


# ---- the journal service --------------------------------------------------------------------------
def serve(a: argparse.Namespace) -> None:
    """Run ``caravanserai.stores.http_service.serve`` until SIGTERM.

    With ``--stats FILE`` the service's own time is measured and written there when it stops:
    per request kind, from the ASGI app being called to the last body byte handed back, and the
    backing store's ``append`` / ``os.fdatasync`` under it.
    """
    import signal

    import caravanserai
    from caravanserai.stores import http_service as service

    buckets: dict[str, list] = {}

    def record(name: str, seconds: float) -> None:
        buckets.setdefault(name, []).append(seconds)

    def timed_as(name: str, original):
        """``original``, each call's time recorded under ``name``."""
        return timed(original, lambda seconds: record(name, seconds))

    if a.stats:
        backing = caravanserai.open_store(a.backing)  # serve() opens the same URL: the cached instance
        backing.append = timed_as("backing store.append", backing.append)
        os.fdatasync = timed_as("os.fdatasync (service)", os.fdatasync)
        backing.committed = timed_as("backing store.committed (views hand-off)", backing.committed)
        service.JournalService.append = timed_as("JournalService.append (run lock + backing append + views)",
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
    # uvicorn re-raises the SIGTERM it caught once it has shut down: let that return here instead.
    signal.signal(signal.SIGTERM, lambda *_: None)
    try:
        service.serve(a.backing, host="127.0.0.1", port=a.port, token=a.token)
    finally:
        if a.stats:
            with open(a.stats, "w", encoding="utf-8") as handle:
                json.dump({name: describe(b) for name, b in buckets.items()}, handle)


MODES = {"floor_fsync": floor_fsync, "floor_sqlite": floor_sqlite, "floor_pg": floor_pg, "floor_s3": floor_s3,
         "floor_http": floor_http, "ours": ours, "lg_pg": lg_pg, "dbos_pg": dbos_pg}


def main() -> None:
    p = worker_parser(MODES)
    p.add_argument("--tag", default="0")
    p.add_argument("--run-id", default="bench")
    p.add_argument("--profile", default="")
    p.add_argument("--stats", default="", help="serve: write the service's own timings here when it stops")
    p.add_argument("--paired", action="store_true", help="ours: also run the floor op next to each checkpoint")
    a = p.parse_args()
    if a.mode == "serve":
        serve(a)
        return
    result = MODES[a.mode](a)
    emit_result({**result, "stats": stats(result["samples_us"]), "mode": a.mode, "pid": os.getpid(),
                 "loadavg_end": os.getloadavg()})


if __name__ == "__main__":
    main()

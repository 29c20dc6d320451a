"""Worker for ``bench_group_commit.py``: one measurement per process, one ``RESULT {json}`` line.

    python _group_commit_worker.py MODE --n N --warmup W [--url URL] [--dsn DSN] [--dir D] [...]

Modes (``LINE`` is a 151-character journal line, RECORD the same bytes plus ``\\n``):

- ``floor_http``  a bare POST of RECORD to the journal service's ``/health`` (the HTTP store's client, keep-alive),
                  then ``os.write`` of RECORD + ``os.fdatasync`` on a file in ``--dir`` (the
                  service's disk); a sample is the two together;
- ``http``        ``HttpStore.append(run, [LINE], lease=..., seq=...)`` to the service; with
                  ``--start-at T`` (``time.time()``) it sleeps until T first, so several client
                  processes start together; the completion time of every append is reported;
                  with ``--paired`` the ``floor_http`` operation runs next to each append, in
                  this process, the order alternating (the disk's slow phases hit both alike);
- ``floor_pg``    a bare single-row ``INSERT`` of LINE + COMMIT (autocommit psycopg connection);
- ``pg``          ``PostgresStore.append`` of LINE, ``--threads K`` threads on K runs sharing
                  the one store (its group commit batches their appends); with ``--paired``
                  (one thread) the ``floor_pg`` INSERT runs next to each append, alternating;
- ``serve``       the journal service (``http_service.serve``) until SIGTERM.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
import time
import uuid

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common  # noqa: E402
from _common import HttpFloor, describe, emit_result, to_us, which_caravanserai, worker_parser  # noqa: E402

LINE = "x" * 151
RECORD = (LINE + "\n").encode()


def wait_until(start_at: float) -> None:
    if start_at:
        time.sleep(max(0.0, start_at - time.time()))


def floor_http(a: argparse.Namespace) -> dict:
    return _common.floor_http(a.url, a.n, a.warmup, RECORD, sync_path=os.path.join(a.dir, f"floor-{os.getpid()}.bin"))


def paired(ours, floor, n: int) -> tuple[list[float], list[float]]:
    """``n`` samples of ``ours()`` and of ``floor()``, one of each per step, which goes first alternating."""
    perf, mine, theirs = time.perf_counter, [], []
    for i in range(n):
        for fn, out in (((floor, theirs), (ours, mine)) if i % 2 else ((ours, mine), (floor, theirs))):
            t = perf()
            fn()
            out.append(perf() - t)
    return mine, theirs


def http(a: argparse.Namespace) -> dict:
    which_caravanserai(a.repo)
    import caravanserai

    store = caravanserai.open_store(a.url)
    run_id = a.run_id or f"gc-{uuid.uuid4().hex[:12]}"
    lease = store.acquire(run_id)
    seq = lease.next_seq
    for _ in range(a.warmup):
        store.append(run_id, [LINE], lease=lease, seq=seq)
        seq += 1
    if a.paired:
        floor = HttpFloor(a.url, RECORD, os.path.join(a.dir, f"paired-{os.getpid()}.bin"))
        state = {"seq": seq}

        def append() -> None:
            store.append(run_id, [LINE], lease=lease, seq=state["seq"])
            state["seq"] += 1

        for _ in range(max(1, a.warmup)):
            floor()
        mine, theirs = paired(append, floor, a.n)
        floor.close()
        lease.release()
        store.close()
        return {"samples_us": to_us(mine), "paired_floor_us": to_us(theirs), "run_id": run_id,
                "floor_what": f"POST {len(RECORD)} B to /health + os.write + os.fdatasync, in the same process"}
    wait_until(a.start_at)
    samples, done = [], []
    perf = time.perf_counter
    t0 = time.time()
    for _ in range(a.n):
        t = perf()
        store.append(run_id, [LINE], lease=lease, seq=seq)
        samples.append(perf() - t)
        done.append(time.time())
        seq += 1
    lease.release()
    store.close()
    return {"samples_us": to_us(samples), "started": t0, "done": done, "run_id": run_id}


def floor_pg(a: argparse.Namespace) -> dict:
    return _common.floor_pg(a.dsn, a.n, a.warmup, LINE, f"gc_floor_{os.getpid()}")


def pg(a: argparse.Namespace) -> dict:
    which_caravanserai(a.repo)
    from caravanserai.stores.postgres import PostgresStore

    store = PostgresStore(a.dsn, table="gc_bench", create_schema=True)
    if a.paired:
        import psycopg

        conn = psycopg.connect(a.dsn, autocommit=True)
        table = f"gc_paired_{os.getpid()}"
        conn.execute(f"CREATE TABLE {table} (run_id TEXT NOT NULL, chunk BIGINT NOT NULL, lines TEXT NOT NULL, "
                     "PRIMARY KEY (run_id, chunk))")
        query, lease = f"INSERT INTO {table} (run_id, chunk, lines) VALUES (%s, %s, %s)", store.acquire("gc-paired")
        state = {"seq": lease.next_seq, "chunk": 0}

        def append() -> None:
            store.append("gc-paired", [LINE], lease=lease, seq=state["seq"])
            state["seq"] += 1

        def floor() -> None:
            conn.execute(query, ("r", state["chunk"], LINE))
            state["chunk"] += 1

        for _ in range(a.warmup):
            append()
            floor()
        mine, theirs = paired(append, floor, a.n)
        conn.execute(f"DROP TABLE {table}")
        conn.close()
        lease.release()
        store.close()
        return {"samples_us": to_us(mine), "paired_floor_us": to_us(theirs),
                "floor_what": f"INSERT of {len(LINE)} B + COMMIT (autocommit psycopg), in the same process"}
    samples: list[list[float]] = [[] for _ in range(a.threads)]
    done: list[float] = []
    barrier = threading.Barrier(a.threads)
    errors: list[str] = []

    def client(k: int) -> None:
        try:
            run_id = f"gc-{uuid.uuid4().hex[:12]}"
            lease = store.acquire(run_id)
            seq = lease.next_seq
            for _ in range(a.warmup):
                store.append(run_id, [LINE], lease=lease, seq=seq)
                seq += 1
            barrier.wait()
            perf = time.perf_counter
            for _ in range(a.n):
                t = perf()
                store.append(run_id, [LINE], lease=lease, seq=seq)
                samples[k].append(perf() - t)
                done.append(time.time())
                seq += 1
            lease.release()
        except Exception as exc:  # noqa: BLE001
            errors.append(f"{type(exc).__name__}: {exc}")
            barrier.abort()

    threads = [threading.Thread(target=client, args=(k,)) for k in range(a.threads)]
    t0 = time.time()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    store.close()
    if errors:
        raise RuntimeError(errors[0])
    return {"samples_us": to_us(s for per in samples for s in per), "started": t0, "done": sorted(done),
            "batches": getattr(store, "commit_stats", None)}


def serve(a: argparse.Namespace) -> None:
    which_caravanserai(a.repo)
    from caravanserai.stores import http_service

    signal.signal(signal.SIGTERM, lambda *_: None)  # uvicorn re-raises it after shutting down: return instead
    http_service.serve(a.backing, host="127.0.0.1", port=a.port, token=a.token)


MODES = {"floor_http": floor_http, "http": http, "floor_pg": floor_pg, "pg": pg}


def main() -> None:
    p = worker_parser(MODES)
    p.add_argument("--run-id", default="")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--start-at", type=float, default=0.0)
    p.add_argument("--paired", action="store_true", help="http, pg: the floor operation next to each append")
    a = p.parse_args()
    if a.mode == "serve":
        serve(a)
        return
    result = MODES[a.mode](a)
    emit_result({**result, "stats": describe(result["samples_us"], scale=1), "mode": a.mode, "pid": os.getpid()})


if __name__ == "__main__":
    main()

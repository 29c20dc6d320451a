"""Worker for ``bench_fleet.py``: one process of a fleet on one shared store, one ``RESULT {json}`` line.

    python _fleet_worker.py MODE --url URL --sync DIR --label NAME [...]

Modes:

- ``writer``   ``with caravanserai.durable(run_id, store=URL) as run: run.checkpoint({"i": i}, f"step {i} …")``
               in a loop. One untimed checkpoint, then it says it is ready (``DIR/ready/NAME``) and
               waits for ``DIR/go`` (the shared wall-clock start and end); it appends until the end.
               After each acknowledged append it writes ``i`` to its ack file (``os.write`` on an
               ``O_APPEND`` fd: no fsync, and a SIGKILLed writer's acks survive in the page cache).
               On ``StoreUnavailable``/``LeaseLost`` (or any other typed error) it records the code
               and opens a fresh ``durable()`` on the same run id, continuing from ``run.state``; on
               ``RunLocked`` it retries every 10 ms. ``--standby TRIGGER``: it only imports and
               connects, then waits for ``TRIGGER`` to exist (the killed or stopped holder's
               successor) before taking the run over. ``--on-lease-lost exit``: after a LeaseLost it
               records the refused append (``fenced``) and stops (the SIGSTOPped holder).
- ``floor``    the backend's bare operation in a loop for the same window: PostgreSQL a single-row
               INSERT + COMMIT (autocommit psycopg), S3 one ``obstore.put`` of a 152 B object to a
               new key, HTTP a bare POST of 152 B to the service's ``/health`` (the HTTP store's client, keep-alive).
- ``client_cpu`` the HTTP store's client alone, in this process: checkpoints through a transport that
               answers at once, then after sleeping ``--wait-us`` (thread CPU per append of each).
- ``prepare``  open the store once with ``create_schema=1`` (the writers must not race on the DDL)
               and create the floor's table.
- ``check``    read every run of ``--spec`` back from the store: every acknowledged ``i`` present,
               waypoint states contiguous from 0 with no duplicate, no refused (fenced) append visible.

Every timed mode reports appends (or operations) started in the window, latency samples (us) and
the process's CPU (``time.process_time``: all threads) over the window.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from urllib.parse import parse_qsl, urlsplit

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # _common, also under python -I
from _common import HttpFloor, emit_result, sleep_until, which_caravanserai  # noqa: E402

RECORD = (b"x" * 151) + b"\n"  # about one journal line of {"i": i} with its note
POLL = 0.005


# ---- the start line every process of a fleet shares -----------------------------------------------
class Sync:
    """``DIR/ready/NAME`` says this process is ready; ``DIR/go`` (JSON ``{"start", "end"}``, POSIX
    seconds) is the shared window, written by the bench once every process is ready."""

    def __init__(self, directory: str, label: str) -> None:
        self.dir, self.label = Path(directory), label

    def ready(self) -> None:
        (self.dir / "ready").mkdir(parents=True, exist_ok=True)
        (self.dir / "ready" / self.label).write_text(str(os.getpid()))

    def wait_go(self, timeout: float = 600) -> tuple[float, float]:
        path, deadline = self.dir / "go", time.monotonic() + timeout
        while not path.exists():
            if time.monotonic() > deadline:
                raise SystemExit(f"{self.label}: no go within {timeout:.0f} s")
            time.sleep(POLL)
        window = json.loads(path.read_text())
        return float(window["start"]), float(window["end"])


# ---- writer ----------------------------------------------------------------------------------------
def writer(a: argparse.Namespace) -> dict:
    which_caravanserai(a.repo)
    import caravanserai
    from caravanserai.errors import CaravanseraiError, LeaseLost, RunLocked, StoreUnavailable

    caravanserai.open_store(a.url)  # connected before the start (the cached store every durable() uses)
    sync = Sync(a.sync, a.label)
    ack = os.open(a.ack, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    tag = f"{a.label} pid {os.getpid()}"
    out: dict = {"label": a.label, "run_id": a.run_id, "pid": os.getpid(), "standby": bool(a.standby),
                 "errors": [], "resumed": [], "fenced": [], "run_locked": 0, "opens": 0}
    samples: list[float] = []
    st = {"count": 0, "acks": 0, "first_ack_t": None, "pending": None, "attempt": None}
    window = [0.0, 0.0]

    def append(run, i: int) -> None:
        note = f"step {i} {tag}"
        st["attempt"] = (i, note)
        started = time.time()
        t0 = time.perf_counter()
        run.checkpoint({"i": i}, note)
        dt = time.perf_counter() - t0
        now = time.time()
        os.write(ack, f"{i}\n".encode())
        st["attempt"] = None
        st["acks"] += 1
        if st["first_ack_t"] is None:
            st["first_ack_t"] = now
        if st["pending"] is not None:  # the first append after an error: when it could append again
            out["resumed"].append({**st["pending"], "t_resumed": now, "i": i})
            sys.stderr.write(f"[{a.label}] appending again at {now:.3f} ({now - st['pending']['t_error']:.3f} s after "
                             f"{st['pending']['code']}), from i={i}\n")
            st["pending"] = None
        if window[0] <= started < window[1]:
            st["count"] += 1
            samples.append(dt)

    def record(exc: BaseException) -> None:
        code = getattr(exc, "code", type(exc).__name__)
        entry = {"t": time.time(), "code": code, "message": str(exc).splitlines()[0][:300] if str(exc) else ""}
        if len(out["errors"]) < 200:
            out["errors"].append(entry)
        if st["pending"] is None:
            st["pending"] = {"t_error": entry["t"], "code": code}

    warm = not a.standby
    if a.standby:
        sync.ready()
        window[:] = sync.wait_go()
        trigger = Path(a.standby)
        while not trigger.exists() and time.time() < window[1]:
            time.sleep(POLL)
        if not trigger.exists():
            out["triggered"] = False
            return finish(out, samples, st, window, 0.0)
        out["triggered"] = True
        out["t_trigger_seen"] = time.time()
    cpu0 = time.process_time() if a.standby else None
    cpu1 = None
    give_up = time.time() + 120  # the warm-up open: a store that never answers ends the worker
    while True:
        if not warm and time.time() >= window[1]:
            break
        if warm and time.time() > give_up:
            raise SystemExit(f"{a.label}: could not open run {a.run_id!r} within 120 s: {out['errors'][-1:]}")
        try:
            out["opens"] += 1
            with caravanserai.durable(a.run_id, store=a.url) as run:
                state = run.state
                i = state["i"] + 1 if isinstance(state, dict) and isinstance(state.get("i"), int) else 0
                if warm:
                    append(run, i)  # untimed: the run exists and the connection is warm
                    i += 1
                    warm = False
                    sync.ready()
                    window[:] = sync.wait_go()
                    sleep_until(window[0])
                    cpu0 = time.process_time()
                while time.time() < window[1]:
                    append(run, i)
                    i += 1
                cpu1 = time.process_time()
            break
        except RunLocked:
            out["run_locked"] += 1
            time.sleep(0.01)
        except LeaseLost as exc:
            record(exc)
            if a.on_lease_lost == "exit":
                if st["attempt"] is not None:
                    i, note = st["attempt"]
                    out["fenced"].append({"i": i, "note": note, "code": exc.code, "t": time.time(),
                                          "type": type(exc).__name__})
                break
            time.sleep(0.05)
        except (StoreUnavailable, CaravanseraiError) as exc:
            record(exc)
            time.sleep(0.05)
        except Exception as exc:  # noqa: BLE001 - an untyped error is a finding: recorded, then go on
            record(exc)
            out["untyped"] = out.get("untyped", 0) + 1
            time.sleep(0.05)
    end_cpu = cpu1 if cpu1 is not None else time.process_time()
    os.close(ack)
    return finish(out, samples, st, window, end_cpu - cpu0 if cpu0 is not None else 0.0)


def finish(out: dict, samples: list[float], st: dict, window: list[float], cpu: float) -> dict:
    out.update(count=st["count"], acks=st["acks"], first_ack_t=st["first_ack_t"], window=list(window),
               cpu_s=cpu, samples_us=[round(s * 1e6) for s in samples])
    if st["pending"] is not None:
        out["unresolved_error"] = st["pending"]
    return out


# ---- floor -----------------------------------------------------------------------------------------
def s3_client(url: str):
    """An obstore S3 store for ``s3://bucket?options`` (the lease option dropped), plain http allowed."""
    from obstore.store import from_url

    parts = urlsplit(url)
    options = {k: v for k, v in parse_qsl(parts.query) if k != "lease_ttl_ms"}
    return from_url(f"s3://{parts.netloc}", client_options={"allow_http": True}, **options)


def floor(a: argparse.Namespace) -> dict:
    sync = Sync(a.sync, a.label)
    close = None
    if a.backend == "postgres":
        import psycopg

        conn = psycopg.connect(a.url, autocommit=True)
        payload = RECORD.decode()
        query = f"INSERT INTO {a.table} (payload) VALUES (%s)"

        def op() -> None:
            conn.execute(query, (payload,))

        close, what = conn.close, f"INSERT of {len(RECORD)} B + COMMIT (autocommit psycopg)"
    elif a.backend == "s3":
        import obstore

        store, counter = s3_client(a.url), iter(range(10**9))
        prefix = f"fleet-floor/{a.label}-{os.getpid()}"

        def op() -> None:
            obstore.put(store, f"{prefix}/{next(counter):08d}", RECORD)

        what = f"obstore.put of {len(RECORD)} B to a new key"
    else:
        http = HttpFloor(a.url, RECORD)

        def op() -> None:
            http(-1)

        close, what = http.close, f"POST of {len(RECORD)} B to /health (the HTTP store's client, keep-alive)"
    for _ in range(5):
        op()
    sync.ready()
    start, end = sync.wait_go()
    sleep_until(start)
    samples: list[float] = []
    cpu0 = time.process_time()
    while time.time() < end:
        t0 = time.perf_counter()
        op()
        samples.append(time.perf_counter() - t0)
    cpu = time.process_time() - cpu0
    out = {"label": a.label, "pid": os.getpid(), "count": len(samples), "cpu_s": cpu, "window": [start, end],
           "samples_us": [round(s * 1e6) for s in samples], "what": what}
    if a.backend == "http":
        out["status_codes"] = http.status
    if close is not None:
        close()
    return out


# ---- the HTTP store's client alone ----------------------------------------------------------------
def client_cpu(a: argparse.Namespace) -> dict:
    """``--count`` checkpoints through the HTTP store with an in-process transport that answers at once,
    then as many answered after sleeping ``--wait-us`` (one round trip): the client thread's CPU per
    append in each. The first is what the client's code costs; the difference is what this machine
    charges a thread that blocks and wakes once per append. The fake answers (a parse of the body with
    orjson) run in the same thread and are counted."""
    which_caravanserai(a.repo)
    import orjson

    import caravanserai
    from caravanserai.stores.http import HttpStore

    json_type = {"content-type": "application/json"}
    state = {"wait": 0.0}

    def transport(method: str, url: str, headers: dict, body: bytes | None) -> tuple[int, dict, bytes]:
        if state["wait"]:
            time.sleep(state["wait"])
        if url.endswith("/append"):
            sent = orjson.loads(body or b"{}")
            return 200, json_type, b'{"next_seq": %d}' % (sent["seq"] + len(sent["lines"]))
        if url.endswith("/acquire"):
            return 200, json_type, b'{"token": 1, "ttl_ms": 30000, "next_seq": 0, "lines": []}'
        if url.endswith("/release"):
            return 200, json_type, b'{"released": true}'
        return 200, json_type, b'{"runs": [], "versions": {}, "keys": []}'

    store = HttpStore("http://127.0.0.1:1", "fleet", transport=transport)
    out: dict = {"count": a.count, "wait_us": a.wait_us}
    with caravanserai.durable(f"client-cpu-{os.getpid()}", store=store) as run:
        run.checkpoint({"i": -1}, "warm-up")
        for key, wait in (("at_once_us", 0.0), ("after_wait_us", a.wait_us / 1e6)):
            state["wait"] = wait
            t = time.thread_time()
            for i in range(a.count):
                run.checkpoint({"i": i}, f"step {i} client-cpu")
            out[key] = (time.thread_time() - t) / a.count * 1e6
    return out


# ---- prepare and check -----------------------------------------------------------------------------
def prepare(a: argparse.Namespace) -> dict:
    which_caravanserai(a.repo)
    import caravanserai

    store = caravanserai.open_store(a.url)
    out = {"store": type(store).__name__}
    if a.dsn and a.table:
        import psycopg

        with psycopg.connect(a.dsn, autocommit=True) as conn:
            conn.execute(f"DROP TABLE IF EXISTS {a.table}")
            conn.execute(f"CREATE TABLE {a.table} (id BIGSERIAL PRIMARY KEY, payload TEXT NOT NULL)")
        out["floor_table"] = a.table
    return out


def check(a: argparse.Namespace) -> dict:
    """Every run of the spec read back: acknowledged ``i`` all present, waypoints 0..n-1 once each, in
    order, and no fenced (refused) append visible."""
    which_caravanserai(a.repo)
    import caravanserai

    spec = json.loads(Path(a.spec).read_text())
    store = caravanserai.open_store(spec["url"])
    runs, totals = {}, {"runs": 0, "acked": 0, "lost": 0, "duplicates": 0, "gaps": 0, "out_of_order": 0,
                        "fenced_checked": 0, "fenced_visible": 0, "waypoints": 0, "unreadable": 0}
    for entry in spec["runs"]:
        run_id = entry["run_id"]
        acked: set[int] = set()
        for path in entry["acks"]:
            try:
                acked.update(int(x) for x in Path(path).read_text().split())
            except FileNotFoundError:
                pass
        try:
            events = store.events(run_id)
        except Exception as exc:  # noqa: BLE001 - reported, counted
            runs[run_id] = {"error": f"{type(exc).__name__}: {str(exc)[:200]}"}
            totals["unreadable"] += 1
            continue
        points = [e for e in events if e.get("type") == "waypoint"]
        states = [e["state"]["i"] for e in points if isinstance(e.get("state"), dict) and "i" in e["state"]]
        notes = {e.get("note") for e in points}
        seen = set(states)
        lost = sorted(acked - seen)
        duplicates = len(states) - len(seen)
        gaps = len(set(range(max(seen) + 1)) - seen) if seen else 0
        out_of_order = sum(1 for x, y in zip(states, states[1:]) if y <= x)
        fenced_visible = [f["note"] for f in entry.get("fenced", []) if f["note"] in notes]
        runs[run_id] = {"acked": len(acked), "waypoints": len(states), "lost": lost[:20], "n_lost": len(lost),
                        "duplicates": duplicates, "gaps": gaps, "out_of_order": out_of_order,
                        "fenced_checked": len(entry.get("fenced", [])), "fenced_visible": fenced_visible,
                        "unacked_in_journal": len(seen - acked),
                        "ends": [e["type"] for e in events if e["type"] in ("run_completed", "run_failed")][-3:]}
        totals["runs"] += 1
        totals["acked"] += len(acked)
        totals["waypoints"] += len(states)
        totals["lost"] += len(lost)
        totals["duplicates"] += duplicates
        totals["gaps"] += gaps
        totals["out_of_order"] += out_of_order
        totals["fenced_checked"] += len(entry.get("fenced", []))
        totals["fenced_visible"] += len(fenced_visible)
    return {"totals": totals, "runs": runs}


MODES = {"writer": writer, "floor": floor, "prepare": prepare, "check": check, "client_cpu": client_cpu}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("mode", choices=list(MODES))
    p.add_argument("--url", default="")
    p.add_argument("--dsn", default="")
    p.add_argument("--table", default="")
    p.add_argument("--backend", default="postgres", choices=("postgres", "s3", "http"))
    p.add_argument("--run-id", default="fleet")
    p.add_argument("--label", default="w0")
    p.add_argument("--sync", default=".")
    p.add_argument("--ack", default="")
    p.add_argument("--standby", default="", help="writer: a trigger file; take the run over once it exists")
    p.add_argument("--on-lease-lost", choices=("reopen", "exit"), default="reopen")
    p.add_argument("--spec", default="")
    p.add_argument("--repo", default="")
    p.add_argument("--count", type=int, default=2000, help="client_cpu: checkpoints per measurement")
    p.add_argument("--wait-us", type=float, default=1500.0, help="client_cpu: the answer's delay in the second one")
    a = p.parse_args()
    emit_result({**MODES[a.mode](a), "mode": a.mode})


if __name__ == "__main__":
    main()

"""An object-storage journal (S3, moto on loopback) in segments: load and takeover of a long run,
against one GET of an object of the same total size measured in the same run, with request counts.

    python benchmarks/bench_object_journal.py [--quick] [--events N] [--load-rounds L] [--rounds K] [--tail M]
                                              [--rtt-ms R]

One command: it starts its own moto S3 server on 127.0.0.1 (``tests/servers/s3_server.py``) and a
counting HTTP proxy in front of it (this file), and stops both at the end. Steps:

1. **Write** a run of ``--events`` (10,000) events, one ``append`` each (one chunk each), with the
   store's default compaction (a segment every 256 chunks and on release, a delta every 16 chunks
   in between), through ``s3://bench/...``; the append latency is reported (not a target).
2. **Load**, ``--load-rounds`` (21) interleaved pairs: the floor — ``obstore.get`` of one object as large as
   the journal (its lines and newlines), on a client to the same server — and ours,
   ``store.load(run_id)`` on a store opened once (nothing cached between loads). One more load
   through the proxy counts its HTTP requests. Target: ours <= 3x the floor, <= 10 requests.
3. **Takeover**, ``--rounds`` times: a child process acquires the run, appends ``--tail`` (250)
   events (fewer than 256: no segment, 15 deltas and 10 chunks after them), says READY and is
   SIGKILLed; ours is then ``store.acquire(run_id)`` + ``store.load_held(lease)`` (the new holder's
   whole read), the floor one GET of an object of the run's size at that moment. The killed
   holder ran on this machine, so its lease is taken over at once; on another machine the new
   holder first waits out the lease TTL (30 s), hence the target: ours <= 3x the floor + the TTL.
   The ratio without the TTL is printed too. One more takeover through the proxy counts requests.
4. **Takeover over a slow link**, ``--rounds`` times each: the same, with the new holder reaching the
   server through a second proxy that waits ``--rtt-ms`` (30) before forwarding each request (an S3
   region away, where round trips, not bytes, set the time), for a run killed after 5 appends (no
   head yet: a new run id per round) and one killed after ``--tail`` more. Time / RTT is about the
   round trips in a row the takeover needed (info, no target).

Medians over the rounds (the ratio of the fastest of each is printed too). A report, not a test:
exit status 0 either way. Numbers are noisy on a shared 2-core machine (the S3 server, the proxy
and the client share it, and other jobs run there).
"""

from __future__ import annotations

import argparse
import http.client
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from _common import (
    REPO,
    fmt_bytes,
    fmt_ratio,
    fmt_time,
    machine_notes,
    md_table,
    parse_args,
    reexec_in_repo_venv,
    save_results,
    say,
    say_verdict,
)

sys.path.insert(0, str(REPO / "tests"))  # the tests' own server helpers: tests/servers

LOAD_TARGET, TAKEOVER_TARGET, MAX_REQUESTS = 3.0, 3.0, 10
TTL_S = 30.0  # the store's default lease
CHILD = r"""
import sys
import caravanserai
from caravanserai import journal
url, run_id, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
store = caravanserai.open_store(url)
lease = store.acquire(run_id)
_, tail = journal.decode(run_id, store.load_held(lease))
for _ in range(count):
    lines, _, new = journal.encode([{"type": "note", "text": "tail event"}], tail)
    store.append(run_id, lines, lease=lease, seq=tail.seq)
    tail = new
print("READY", tail.seq, flush=True)
sys.stdin.read()
"""


# ---- a counting proxy: every HTTP request the client sends, forwarded to the S3 server ---------------------
class CountingProxy:
    """Loopback HTTP/1.1 proxy in front of ``upstream`` (host, port); counts requests by kind."""

    def __init__(self, upstream: tuple[str, int], delay_s: float = 0.0) -> None:
        self.counts: Counter[str] = Counter()
        lock, counts = threading.Lock(), self.counts
        local = threading.local()

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def _forward(self) -> None:
                kind = self.command + (" (list)" if "list-type" in self.path else "")
                with lock:
                    counts[kind] += 1
                if delay_s:
                    time.sleep(delay_s)  # a round trip's worth of distance, per request
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                conn = getattr(local, "conn", None) or http.client.HTTPConnection(*upstream, timeout=60)
                local.conn = conn
                headers = {k: v for k, v in self.headers.items() if k.lower() not in ("connection", "keep-alive")}
                try:
                    conn.request(self.command, self.path, body=body or None, headers=headers)
                    answer = conn.getresponse()
                    data = answer.read()
                except (OSError, http.client.HTTPException):
                    local.conn = None
                    raise
                self.send_response_only(answer.status, answer.reason)
                for key, value in answer.getheaders():
                    if key.lower() not in ("connection", "keep-alive", "transfer-encoding", "content-length"):
                        self.send_header(key, value)
                length = answer.getheader("Content-Length") if self.command == "HEAD" else str(len(data))
                self.send_header("Content-Length", length or "0")
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)

            do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _forward

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def count(self, fn):  # noqa: ANN001, ANN201
        """(what fn returned, requests it sent by kind)."""
        self.counts.clear()
        result = fn()
        return result, dict(self.counts)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


# ---- measurements -----------------------------------------------------------------------------------------
def url_for(endpoint: str, prefix: str) -> str:
    return (f"s3://bench/{prefix}?endpoint={endpoint}&region=us-east-1&access_key_id=testing"
            f"&secret_access_key=testing")


def journal_bytes(lines: list[str]) -> int:
    return sum(len(line.encode()) + 1 for line in lines)


def write_run(store, run_id: str, n: int) -> list[float]:  # noqa: ANN001
    from caravanserai import journal

    samples, tail = [], journal.Tail()
    lease = store.acquire(run_id)
    try:
        for i in range(n):
            lines, _, new = journal.encode([{"type": "note", "i": i, "text": f"event {i}: a line about this size"}], tail)
            started = time.perf_counter()
            store.append(run_id, lines, lease=lease, seq=tail.seq)
            samples.append(time.perf_counter() - started)
            tail = new
    finally:
        lease.release()  # compacts the tail into the last segment
    return samples


def floor_get(s3, size: int) -> float:  # noqa: ANN001
    import obstore

    key = f"floor/{size}"
    obstore.put(s3, key, os.urandom(size))
    started = time.perf_counter()
    data = bytes(obstore.get(s3, key).bytes())
    elapsed = time.perf_counter() - started
    assert len(data) == size
    return elapsed


def takeover_round(url: str, run_id: str, tail: int, store, child_env: dict,  # noqa: ANN001
                   proxy: CountingProxy | None = None) -> tuple[float, int]:
    """Kill a holder that appended ``tail`` events; (seconds for acquire + load_held, lines read). With
    ``proxy`` (in front of ``store``), its counts are the new holder's requests alone."""
    child = subprocess.Popen([sys.executable, "-c", CHILD, url, run_id, str(tail)], env=child_env,
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = child.stdout.readline()
        if not line.startswith("READY"):
            raise RuntimeError(f"the holder did not start: {line!r} {child.stderr.read()[-500:]}")
        expected = int(line.split()[1])
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    if proxy is not None:
        proxy.counts.clear()
    started = time.perf_counter()
    lease = store.acquire(run_id)
    lines = store.load_held(lease)
    elapsed = time.perf_counter() - started
    counts = dict(proxy.counts) if proxy is not None else {}
    lease.release()  # compacts the killed holder's chunks (not timed)
    if len(lines) != expected:
        raise RuntimeError(f"the new holder read {len(lines)} lines, expected {expected}")
    if proxy is not None:
        proxy.counts.clear()
        proxy.counts.update(counts)
    return elapsed, len(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=10_000, help="events in the run, one append each (10,000)")
    parser.add_argument("--load-rounds", type=int, default=21, help="load pairs: floor, ours (21)")
    parser.add_argument("--rounds", type=int, default=5, help="takeovers (5)")
    parser.add_argument("--tail", type=int, default=250, help="events the killed holder appends (250)")
    parser.add_argument("--rtt-ms", type=float, default=30.0, help="the slow link's delay per request (30; 0: skip step 4)")
    args = parse_args(parser, "object_journal", quick={"events": 300, "load_rounds": 3, "rounds": 1, "tail": 20})
    notes = {**machine_notes(), "args": vars(args)}
    results: dict = {"notes": notes}
    rows: list[list[str]] = []
    from servers import s3_server

    if not s3_server.available():
        say("s3: NOT RUN: moto is not installed (pip install 'moto[server]')")
        say("\n".join(md_table(["measure", "ours", "floor", "ratio", "requests", "target"],
                               [["load / takeover", "-", "-", "-", "-", "not run: no moto"]])))
        save_results(args.out, results)
        return 0
    import obstore
    from obstore.store import S3Store

    from caravanserai.stores.objects import from_obstore_url

    server = s3_server.S3Server.start()
    proxy = None
    try:
        server.create_bucket("bench")
        host, port = server.endpoint.rsplit("//", 1)[1].split(":")
        proxy = CountingProxy((host, int(port)))
        s3 = S3Store("bench", endpoint=server.endpoint, region="us-east-1", access_key_id="testing",
                     secret_access_key="testing", client_options={"allow_http": True})
        say(f"s3: moto {server.endpoint}, counting proxy {proxy.endpoint}; obstore {obstore.__version__}")
        url, run_id = url_for(server.endpoint, "journal"), "long-run"
        store = from_obstore_url(url)
        counted = from_obstore_url(url_for(proxy.endpoint, "journal"))  # the same keys, through the proxy

        say(f"writing {args.events:,} events, one append each ...")
        started = time.perf_counter()
        appends = write_run(store, run_id, args.events)
        write_s = time.perf_counter() - started
        lines = store.load(run_id)
        size = journal_bytes(lines)
        segments = [k for k in store.bucket.list(f"{store.prefix}segments/{run_id}/") if not k.endswith("/head")]
        say(f"  {write_s:.1f} s; append median {fmt_time(statistics.median(appends))}, max {fmt_time(max(appends))} "
            f"(the compacting ones); journal {fmt_bytes(size)}, {len(segments)} segment(s) after release")

        load_s, floor_s = [], []
        for k in range(args.load_rounds):
            pair = [("floor", lambda: floor_s.append(floor_get(s3, size))),
                    ("ours", lambda: load_s.append(_timed(lambda: store.load(run_id))))]
            for _, run in (pair if k % 2 == 0 else pair[::-1]):
                run()
        loaded, load_requests = proxy.count(lambda: counted.load(run_id))
        assert loaded == lines
        verify_s = _timed(lambda: store.events(run_id))
        load, floor = statistics.median(load_s), statistics.median(floor_s)
        n_load = sum(load_requests.values())
        best = min(load_s) / min(floor_s)
        rows.append([f"load {args.events:,}-event run ({fmt_bytes(size)})", fmt_time(load), fmt_time(floor),
                     f"{fmt_ratio(load / floor)} (fastest: {fmt_ratio(best)})", f"{n_load} ({_kinds(load_requests)})",
                     f"<= {LOAD_TARGET:.0f}x, <= {MAX_REQUESTS} requests"])
        results["load"] = {"samples_s": load_s, "floor_samples_s": floor_s, "requests": load_requests,
                           "bytes": size, "events_verify_s": verify_s}

        child_env = {**os.environ, "PYTHONPATH": str(REPO)}
        child_env.pop("CARAVANSERAI_STORE", None)
        take_s, take_floor_s = [], []
        for _ in range(args.rounds):
            elapsed, n_lines = takeover_round(url, run_id, args.tail, store, child_env)
            take_s.append(elapsed)
            take_floor_s.append(floor_get(s3, journal_bytes(store.load(run_id))))
        _, n_lines = takeover_round(url, run_id, args.tail, counted, child_env, proxy)
        take_requests = dict(proxy.counts)
        take, take_floor = statistics.median(take_s), statistics.median(take_floor_s)
        n_take = sum(take_requests.values())
        rows.append([f"takeover after SIGKILL ({args.tail} chunks since the segment)", fmt_time(take),
                     fmt_time(take_floor),
                     f"{fmt_ratio(take / take_floor)} (+TTL: {fmt_ratio((take + TTL_S) / take_floor)})",
                     f"{n_take} ({_kinds(take_requests)})", f"<= {TAKEOVER_TARGET:.0f}x the floor + TTL {TTL_S:.0f} s"])
        rows.append([f"append, one event (median of {len(appends):,})", fmt_time(statistics.median(appends)), "-",
                     "-", "1 PUT (+2 per 16: delta, head)", "(info)"])
        rows.append(["events(): load + verify the hash chain", fmt_time(verify_s), "-", "-", "-", "(info)"])
        results["takeover"] = {"samples_s": take_s, "floor_samples_s": take_floor_s, "requests": take_requests,
                               "lines": n_lines}
        results["write"] = {"seconds": write_s, "append_samples_s": appends, "segments_after_release": len(segments)}
        if args.rtt_ms > 0:
            slow_rows, results["slow_takeover"] = slow_takeovers(args, (host, int(port)), url, child_env)
            rows += slow_rows

        say("")
        say("\n".join(md_table(["measure", "ours (median)", "floor: one GET, same bytes", "ratio", "requests",
                                "target"], rows)))
        say(f"\nload: {args.load_rounds} pairs, takeover: {args.rounds} kills; each floor is measured next to ours "
            "(load: order alternating).")
        say_verdict(load <= LOAD_TARGET * floor and n_load <= MAX_REQUESTS,
                    f"load a {args.events:,}-event run <= {LOAD_TARGET:.0f}x one GET of its size, <= {MAX_REQUESTS} "
                    "requests", f"{fmt_time(load)} vs {fmt_time(floor)} ({fmt_ratio(load / floor)}; fastest of each "
                    f"{fmt_time(min(load_s))} vs {fmt_time(min(floor_s))}: {fmt_ratio(best)}), {n_load} requests")
        say_verdict(take <= TAKEOVER_TARGET * take_floor + TTL_S,
                    f"takeover after a SIGKILL <= {TAKEOVER_TARGET:.0f}x the floor + the lease TTL ({TTL_S:.0f} s)",
                    f"{fmt_time(take)} vs {fmt_time(take_floor)}: {fmt_ratio(take / take_floor)} without the TTL "
                    f"(the dead holder was on this machine: taken over at once), {n_take} requests")
        results["verdicts"] = {"load_ratio": load / floor, "load_requests": n_load, "takeover_ratio": take / take_floor,
                               "takeover_requests": n_take}
    finally:
        if proxy is not None:
            proxy.close()
        server.stop()
    save_results(args.out, results)
    return 0


def slow_takeovers(args: argparse.Namespace, upstream: tuple[str, int], url: str, child_env: dict) -> tuple[list, dict]:
    """Step 4: takeovers with every request of the new holder delayed by ``--rtt-ms`` (a far S3)."""
    from caravanserai.stores.objects import from_obstore_url

    rtt = args.rtt_ms / 1000
    slow = CountingProxy(upstream, rtt)
    rows, out = [], {"rtt_s": rtt}
    try:
        store = from_obstore_url(url_for(slow.endpoint, "journal"))
        for label, tail in (("short", 5), ("long", args.tail)):
            samples, requests = [], {}
            for k in range(args.rounds):
                run_id = f"slow-{label}-{k}" if label == "short" else "slow-long"  # short: never a head
                slow.counts.clear()
                elapsed, _ = takeover_round(url, run_id, tail, store, child_env, slow)
                samples.append(elapsed)
                requests = dict(slow.counts)
            median = statistics.median(samples)
            what = "no head yet" if label == "short" else "a delta in the head after the first round"
            rows.append([f"takeover, {args.rtt_ms:.0f} ms per request ({tail} appends killed; {what})", fmt_time(median),
                         "-", f"{median / rtt:.1f} RTTs", f"{sum(requests.values())} ({_kinds(requests)})", "(info)"])
            out[label] = {"samples_s": samples, "requests": requests, "tail": tail}
    finally:
        slow.close()
    return rows, out


def _timed(fn) -> float:  # noqa: ANN001
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def _kinds(counts: dict) -> str:
    return ", ".join(f"{n} {kind}" for kind, n in sorted(counts.items()))


if __name__ == "__main__":
    reexec_in_repo_venv(__file__, "_BENCH_OBJECT_JOURNAL_REEXEC")
    sys.exit(main())

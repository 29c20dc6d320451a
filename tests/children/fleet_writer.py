"""Child for tests/test_fleet_faults.py: one writer of a fleet, checkpointing its own run until told to stop.

    python fleet_writer.py STORE_URL RUN_ID ACK_PATH [exit-on-lease-lost]

Continues the run from its last waypoint (state {"i": N}: the next is N + 1). After each acknowledged
checkpoint it appends "N\\n" to ACK_PATH (flushed, so a SIGKILL keeps what was acknowledged).
- StoreUnavailable (a server restarting): one line on stderr, then a fresh durable() on the same run.
- RunLocked (a predecessor's lease not yet expired): wait and try again.
- LeaseLost: with exit-on-lease-lost (a holder paused past its lease and fenced off), "LEASE LOST" on
  stdout and exit 3; otherwise (the journal service restarted and forgot the lease) a fresh durable().
SIGTERM ends the loop after the current checkpoint and closes the run (exit 0).
"""

import signal
import sys
import time

import caravanserai

url, run_id, ack_path = sys.argv[1], sys.argv[2], sys.argv[3]
exit_on_lease_lost = sys.argv[4:] == ["exit-on-lease-lost"]
stopping = []
signal.signal(signal.SIGTERM, lambda *_: stopping.append(True))
with open(ack_path, "a", encoding="utf-8") as acks:
    while not stopping:
        try:
            with caravanserai.durable(run_id, store=url) as run:
                i = (run.state or {"i": -1})["i"] + 1
                while not stopping:
                    run.checkpoint({"i": i}, f"step {i}")
                    acks.write(f"{i}\n")
                    acks.flush()
                    i += 1
                    time.sleep(0.02)
        except caravanserai.LeaseLost as exc:
            if exit_on_lease_lost:
                print("LEASE LOST", exc.code, flush=True)
                sys.exit(3)
            print(f"{exc.code}: {exc}", file=sys.stderr, flush=True)
        except caravanserai.RunLocked:
            time.sleep(0.1)
        except caravanserai.StoreUnavailable as exc:
            print(f"{exc.code}: {exc}", file=sys.stderr, flush=True)
            time.sleep(0.1)
print("STOPPED", flush=True)
